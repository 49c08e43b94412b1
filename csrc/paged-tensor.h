// paged-tensor: ggml tensors whose storage is bound at run time.
//
// A paged tensor is a no-alloc ggml tensor (shape and type fixed, from the
// GGUF tensor table) whose `buffer`/`data` point at wherever its bytes are
// now: the read-only mmap of the GGUF file (CPU zero copy), a resident
// backend buffer, or (later) a pool slot. Binding is a pointer update, never
// a copy; graphs that reference the tensor read the new address at compute.
#pragma once

#include "gguf-file.h"

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

struct ggml_backend_buffer;
struct ggml_backend_buffer_type;
struct ggml_backend_device;

namespace superggml {

// Points `t` at `addr` inside `buffer` (no copy). Rebinding an already bound
// tensor is allowed. Throws Error if addr..addr+nbytes is outside the buffer.
void tensor_bind(ggml_tensor * t, ggml_backend_buffer * buffer, void * addr);
// Detaches `t` from its storage (data = nullptr); computing it then fails.
void tensor_unbind(ggml_tensor * t);

// Where a weight's bytes live.
enum class weight_home { unbound, mmap, resident, repacked };

// The weights of one GGUF file as paged tensors.
class weight_store {
public:
    // Takes shared ownership of `file`; tensors start unbound.
    explicit weight_store(std::shared_ptr<gguf_file> file);
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

    // Bytes of weights per home.
    size_t bytes(weight_home h) const;

private:
    std::shared_ptr<gguf_file> file_;
    ggml_backend_buffer * mmap_buf_ = nullptr;
    std::vector<ggml_backend_buffer *> resident_bufs_;
    std::unordered_map<std::string, weight_home> home_;
};

}  // namespace superggml
