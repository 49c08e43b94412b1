// gguf-file: a GGUF model file opened read-only.
//
// Parses the header with ggml's gguf API (metadata + tensor table, no data
// read), validates every tensor's byte range against the file size and maps
// the file read-only. The tensors of `meta_ctx()` are no-alloc ggml tensors
// with the file's names, types and shapes; storage is bound later
// (see tensor-bind.h and weight-store.h).
#pragma once

#include "error.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

struct gguf_context;
struct ggml_context;
struct ggml_tensor;

namespace superggml {

struct gguf_tensor_info {
    std::string name;
    int         type;        // enum ggml_type
    int64_t     ne[4];       // ggml order: ne[0] is the row length
    int         n_dims;
    uint64_t    offset;      // absolute byte offset in the file
    uint64_t    nbytes;
};

class gguf_file {
public:
    // Opens and validates `path`.
    // Throws FileError if it cannot be opened, GGUFError if it is not a valid
    // GGUF or a tensor lies (partly) beyond the end of the file.
    explicit gguf_file(const std::string & path);
    ~gguf_file();
    gguf_file(const gguf_file &) = delete;
    gguf_file & operator=(const gguf_file &) = delete;

    const std::string & path() const { return path_; }
    uint64_t file_size() const { return file_size_; }
    uint64_t data_offset() const { return data_offset_; }
    size_t   alignment() const;

    const gguf_context * gguf() const { return gguf_; }
    ggml_context * meta_ctx() const { return meta_; }     // no-alloc tensors of the file
    ggml_tensor * tensor(const std::string & name) const; // nullptr if absent

    const std::vector<gguf_tensor_info> & tensors() const { return tensors_; }

    // Read-only mapping of the whole file (page aligned). Valid until close().
    const uint8_t * map() const { return map_; }

    // Frees the parsed key/value header (tens of MB for big vocabularies) once
    // the caller has read what it needs; tensors and the mapping stay.
    void drop_header();
    bool has_header() const { return gguf_ != nullptr; }

    // Unmaps the file and frees the header; later calls on this object throw.
    void close();
    bool closed() const { return map_ == nullptr; }

private:
    std::string path_;
    gguf_context * gguf_ = nullptr;
    ggml_context * meta_ = nullptr;
    uint8_t * map_ = nullptr;
    uint64_t file_size_ = 0;
    uint64_t data_offset_ = 0;
    size_t alignment_ = 0;
    std::vector<gguf_tensor_info> tensors_;
};

}  // namespace superggml
