// content-hash: the content addresses of a file's byte ranges, by ggml RPC's own hash (FNV-1a, 64-bit, as
// ggml-rpc.cpp's fnv_hash hashes a tensor's data for RPC_CMD_SET_TENSOR_HASH), so that a peer holding the
// same bytes can be named them by hash.
//
// content_hash_ranges reads each range [offset, offset + size) of the file at `path` with pread, in chunks, on
// up to n_threads threads (one range at a time per thread, ranges taken in order), and returns their hashes in
// the ranges' order. A range past the file's end, or a read error, throws FileError naming the offset.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace superggml {

constexpr uint64_t content_hash_seed = 0xcbf29ce484222325ULL;

// FNV-1a over data, continuing from `hash` (content_hash_seed to start).
uint64_t content_hash(const uint8_t * data, size_t len, uint64_t hash = content_hash_seed);

struct content_hash_params {
    int n_threads = 1;
    size_t chunk = size_t(4) << 20;      // bytes read at once per thread
};

std::vector<uint64_t> content_hash_ranges(const std::string & path,
                                          const std::vector<std::pair<uint64_t, uint64_t>> & ranges,
                                          const content_hash_params & params = {});

}  // namespace superggml
