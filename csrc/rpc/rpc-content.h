// rpc-content: a file's byte ranges written into an RPC peer's buffers by
// content address, so that a peer holding the same bytes loads them from its
// own disk and only their hashes cross the network.
//
// The content index maps (file, offset, size) to the range's hash (ggml RPC's
// FNV-1a; superggml.hashes computes them once per file). A write by address
// is a marker: a SET_TENSOR that ggml's client sends like any other write (so
// it keeps its place among the commands), whose payload starts with this
// process's random key and lists the ranges: file, destination offset, size,
// hash (and place within the hashed range), file offset. The relay (rpc.cpp) never forwards a marker: it asks
// the peer to load the ranges (SG_LOAD, rpc-wire.h) and sends the bytes of
// those the peer lacks, read from the file here, with ggml's cache flag so
// that a peer with a cache directory keeps them. A marker only goes to a
// server that answered SG_HELLO; a plain ggml server gets plain bytes.
#pragma once

#include "remote.h"   // range_write

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

struct ggml_backend_buffer;

namespace superggml {

struct content_range {
    uint64_t offset = 0, size = 0, hash = 0;
};

// Sets the hashes known for ranges of the file at `path` (replacing any set before); an empty list forgets them.
void content_index_set(const std::string & path, const std::vector<content_range> & ranges);

// Ranges smaller than this go as bytes (a hash and a round trip cost more than they save).
constexpr uint64_t ADDRESSED_MIN = 512;

// Writes those of `ranges` (of the file at `path`) whose hash the index has into `buf` by address, when `buf`
// is an RPC buffer whose server speaks superggml's relay protocol; returns the ranges left for the caller to
// write as bytes (all of them otherwise). A range inside a hashed one (a row chunk of a tensor) is named by
// that one's hash and its place in it. Throws Error if a range is outside the buffer. Thread safe: the
// range_writer (remote.h) the bindings hand the core's weight stores, pagers and prefetchers.
std::vector<range_write> content_write(ggml_backend_buffer * buf, const std::string & path,
                                       std::vector<range_write> ranges);

// The relay's side of a marker.
struct marker_entry {
    uint64_t dst_offset, size;
    uint64_t hash, within;            // the bytes are [within, within + size) of the range whose hash this is
    uint64_t file_offset;
};
struct marker {
    std::string path;                 // the file the ranges are of (their bytes, where the peer lacks them)
    std::vector<marker_entry> entries;
};
constexpr size_t MARKER_HEAD = 16 + 4 + 4;     // key, file id, entry count
constexpr size_t MARKER_ENTRY = 40;
// Whether `p` (at least 16 bytes) starts with this process's marker key.
bool marker_keyed(const uint8_t * p);
// Parses a whole marker; false if it is malformed or names no registered file.
bool marker_parse(const uint8_t * p, size_t n, marker & out);

}  // namespace superggml
