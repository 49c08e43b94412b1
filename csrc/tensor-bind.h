// tensor-bind: ggml tensors whose storage is bound at run time.
//
// A paged tensor is a no-alloc ggml tensor (shape and type fixed, from the
// GGUF tensor table) whose `buffer`/`data` point at wherever its bytes are
// now: the read-only mapping of the GGUF file (CPU zero copy), a resident
// backend buffer, a pool slot or a KV frame. Binding is a pointer update,
// never a copy; graphs that reference the tensor read the new address at
// compute.
#pragma once

#include <cstddef>
#include <cstdint>

struct ggml_context;
struct ggml_tensor;
struct ggml_backend_buffer;
struct ggml_backend_buffer_type;

namespace superggml {

// Points `t` at `addr` inside `buffer` (no copy). Rebinding an already bound
// tensor is allowed. Throws Error if addr..addr+nbytes is outside the buffer.
void tensor_bind(ggml_tensor * t, ggml_backend_buffer * buffer, void * addr);
// A byte view for backend copies (ggml_backend_tensor_set/get): a new 1-D I8
// tensor of `n` bytes in `ctx` (a no-alloc context with room for it), bound
// to `addr` inside `buffer`. Throws Error if the context is full or the
// bytes are outside the buffer.
ggml_tensor * tensor_bytes(ggml_context * ctx, ggml_backend_buffer * buffer, void * addr, size_t n);
// Detaches `t` from its storage (data = nullptr); computing it then fails.
void tensor_unbind(ggml_tensor * t);
// Bumped whenever a tensor's storage moves (tensor_bind to another address, tensor_unbind, a new buffer of
// tensors): a graph computed again with the same epoch finds every leaf and view where they were.
uint64_t storage_epoch();
void storage_moved();
// Bytes `t` takes in a buffer of `buft`, padded so the next tensor stays aligned.
size_t tensor_padded_size(ggml_backend_buffer_type * buft, const ggml_tensor * t);

}  // namespace superggml
