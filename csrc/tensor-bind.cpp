#include "tensor-bind.h"

#include "error.h"

#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"

#include <atomic>
#include <cstdint>
#include <string>

namespace superggml {

static std::atomic<uint64_t> g_storage_epoch{1};

uint64_t storage_epoch() { return g_storage_epoch.load(std::memory_order_acquire); }
void storage_moved() { g_storage_epoch.fetch_add(1, std::memory_order_acq_rel); }

size_t tensor_padded_size(ggml_backend_buffer_type * buft, const ggml_tensor * t) {
    return GGML_PAD(ggml_backend_buft_get_alloc_size(buft, t), ggml_backend_buft_get_alignment(buft));
}

void tensor_bind(ggml_tensor * t, ggml_backend_buffer * buffer, void * addr) {
    auto * base = static_cast<uint8_t *>(ggml_backend_buffer_get_base(buffer));
    auto * p = static_cast<uint8_t *>(addr);
    size_t need = ggml_backend_buffer_get_alloc_size(buffer, t);
    if (p < base || p + need > base + ggml_backend_buffer_get_size(buffer)) {
        throw Error(std::string("tensor_bind: '") + t->name + "' does not fit in the buffer at that address");
    }
    if (t->buffer == buffer && t->data == addr) return;   // bound there already
    storage_moved();
    t->buffer = nullptr;
    t->data = nullptr;
    if (ggml_backend_tensor_alloc(buffer, t, addr) != GGML_STATUS_SUCCESS) {
        throw Error(std::string("tensor_bind: cannot bind '") + t->name + "'");
    }
}

ggml_tensor * tensor_bytes(ggml_context * ctx, ggml_backend_buffer * buffer, void * addr, size_t n) {
    if (ggml_get_mem_size(ctx) - ggml_used_mem(ctx) < ggml_tensor_overhead()) throw Error("tensor_bytes: the context is full");
    ggml_tensor * t = ggml_new_tensor_1d(ctx, GGML_TYPE_I8, (int64_t) n);
    tensor_bind(t, buffer, addr);
    return t;
}

void tensor_unbind(ggml_tensor * t) {
    storage_moved();
    t->buffer = nullptr;
    t->data = nullptr;
    t->extra = nullptr;
}

}  // namespace superggml
