#include "bindings.h"
#include "lease.h"

PYBIND11_MODULE(native, m) {
    m.doc() = "superggml core: GGUF files, paged tensors and ggml graphs (private; use superggml)";
    superggml::init_errors(m);
    superggml::init_lease(m);
    superggml::init_gguf_file(m);
    superggml::init_graph(m);
    superggml::init_ops(m);
    superggml::init_weight_store(m);
    superggml::init_buffer_pool(m);
    superggml::init_prefetch(m);
    superggml::init_pager(m);
    superggml::init_telemetry(m);
    superggml::init_kv_cache(m);
    superggml::init_io(m);
    superggml::init_content_hash(m);
    superggml::init_weight_loader(m);
    superggml::init_expert_cache(m);
    superggml::init_rpc(m);
    superggml::init_host_reserve(m);
}
