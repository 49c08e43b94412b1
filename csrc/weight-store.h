// weight-store: the weights of one GGUF file as paged tensors (tensor-bind.h),
// bound to the file mapping, to resident buffers, or to ggml-cpu's re-laid
// ("repack") buffers; the layer pager binds them to pool slots.
//
// A store may be given a range_writer (remote.h): load_resident offers the
// tensors' file ranges to it first (content-addressed writes to an RPC peer)
// and copies the bytes of those it leaves. Without one, every tensor's bytes
// are copied.
#pragma once

#include "gguf-file.h"
#include "remote.h"
#include "tensor-bind.h"

#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

struct ggml_backend_buffer;
struct ggml_backend_buffer_type;
struct ggml_backend_device;

namespace superggml {

// Row granularity of add_row_chunks.
constexpr int64_t ROW_CHUNK_ALIGN = 16;

// Where a weight's bytes live.
enum class weight_home { unbound, mmap, resident, repacked };

// The weights of one GGUF file as paged tensors.
class weight_store {
public:
    // Takes shared ownership of `file`; tensors start unbound. `writer`: see
    // above (none: plain copies).
    explicit weight_store(std::shared_ptr<gguf_file> file, range_writer writer = {});
    ~weight_store();

    const gguf_file & file() const { return *file_; }
    std::shared_ptr<gguf_file> file_ptr() const { return file_; }

    // The paged tensor named `name`; throws GGUFError if the file has none.
    ggml_tensor * get(const std::string & name) const;
    bool has(const std::string & name) const;
    weight_home home(const std::string & name) const;

    // Binds `names` (empty: all) to the file mapping: zero copy, CPU only.
    void bind_mmap(const std::vector<std::string> & names = {});

    // Copies `names` into one new buffer of `buft` (nullptr: CPU) and binds
    // them there. Returns the bytes allocated. Throws Error if the
    // allocation fails. I/O comes from the mapping (page faults).
    size_t load_resident(const std::vector<std::string> & names, ggml_backend_buffer_type * buft);

    // Re-lays `names` for the device's faster kernels (ggml-cpu "repack"
    // extra buffer types) where the device supports the matmul with the
    // re-laid weight, copying them from the mapping; others stay as they are.
    // Returns the bytes moved (0 if the device has no such buffer type).
    size_t load_repacked(const std::vector<std::string> & names, ggml_backend_device * dev);

    // The two halves of the loads above. place_*: allocates the buffers and
    // binds the tensors there, without their bytes (computing them before
    // fill() reads garbage); returns the names placed and adds the bytes
    // allocated to *bytes. fill(name): copies a placed tensor's bytes from the
    // mapping (page faults if not in the page cache); safe to call from several
    // threads for different tensors.
    std::vector<std::string> place_resident(const std::vector<std::string> & names, ggml_backend_buffer_type * buft,
                                            size_t * bytes = nullptr);
    std::vector<std::string> place_repacked(const std::vector<std::string> & names, ggml_backend_device * dev,
                                            size_t * bytes = nullptr);
    void fill(const std::string & name) const;

    // Bytes of weights per home.
    size_t bytes(weight_home h) const;

    // Absolute file offset and size of a tensor's bytes.
    std::pair<uint64_t, uint64_t> file_range(const std::string & name) const;

    // Splits a 2-D tensor into row ranges of at most `max_bytes` each, as new
    // paged tensors "<name>.rows<first row>" over the same file bytes (so a
    // tensor bigger than a pool slot can stream). Returns their names. Chunks
    // hold a multiple of ROW_CHUNK_ALIGN rows where a chunk has room for that
    // many: ggml-cpu's F32/F16 sgemm serves only row counts that are multiples
    // of 4 (else another kernel with another summation order runs), so chunks
    // of a multiple of 16 compute the bits the whole tensor would.
    std::vector<std::string> add_row_chunks(const std::string & name, size_t max_bytes);

    // A second paged tensor "<name>@<tag>" over the same file bytes, bound on its own: the copy of a weight
    // that another device's graphs read (a tied lm head, a tensor every block reads). Returns its name;
    // the same one if it exists. Throws GGUFError for an unknown name.
    std::string add_copy(const std::string & name, const std::string & tag);

private:
    struct entry {
        ggml_tensor * t = nullptr;
        uint64_t offset = 0, nbytes = 0;
        weight_home home = weight_home::unbound;
    };
    const entry & at(const std::string & name) const;

    std::shared_ptr<gguf_file> file_;
    range_writer writer_;                              // none: load_resident copies every tensor's bytes
    ggml_context * views_ = nullptr;                   // row-chunk tensors
    ggml_backend_buffer * mmap_buf_ = nullptr;
    std::vector<ggml_backend_buffer *> resident_bufs_;
    std::unordered_map<std::string, entry> entries_;
};

}  // namespace superggml
