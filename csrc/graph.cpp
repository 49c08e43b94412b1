#include "graph.h"
#include "remote.h"

#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"

namespace superggml {

graph_context::graph_context(size_t max_tensors, size_t graph_size) : graph_size_(graph_size) {
    size_t mem = ggml_tensor_overhead() * max_tensors;
    if (graph_size) mem += ggml_graph_overhead_custom(graph_size, false);
    ggml_init_params p = { mem, nullptr, /*no_alloc*/ true };
    ctx_ = ggml_init(p);
    if (!ctx_) throw Error("ggml_init failed");
}

graph_context::~graph_context() {
    if (ctx_) ggml_free(ctx_);
}

void graph_context::check_room(size_t n_tensors) const {
    if (ggml_used_mem(ctx_) + n_tensors * ggml_tensor_overhead() > ggml_get_mem_size(ctx_)) {
        throw Error("graph context is full (raise max_tensors)");
    }
}

ggml_cgraph * graph_context::new_graph() {
    if (!graph_size_) throw Error("this context was made without room for a graph");
    if (ggml_used_mem(ctx_) + ggml_graph_overhead_custom(graph_size_, false) > ggml_get_mem_size(ctx_)) {
        throw Error("graph context has no room for another graph");
    }
    return ggml_new_graph_custom(ctx_, graph_size_, false);
}

void graph_context::graph_expand(ggml_cgraph * g, ggml_tensor * t) {
    auto & reached = reached_[g];
    std::vector<const ggml_tensor *> fresh;
    std::unordered_set<const ggml_tensor *> here;
    std::vector<const ggml_tensor *> stack{t};
    while (!stack.empty()) {
        const ggml_tensor * x = stack.back();
        stack.pop_back();
        if (!x || reached.count(x) || !here.insert(x).second) continue;
        fresh.push_back(x);
        for (int j = 0; j < GGML_MAX_SRC; ++j) stack.push_back(x->src[j]);
    }
    // nodes and leafs together within the size (each is reached once): what ggml holds, and then some
    if (reached.size() + fresh.size() > graph_size_) throw Error("graph is full (raise graph_size)");
    ggml_build_forward_expand(g, t);
    reached.insert(fresh.begin(), fresh.end());
}

buffer_handle::~buffer_handle() {
    if (buf) ggml_backend_buffer_free(buf);
}

size_t buffer_handle::size() const { return buf ? ggml_backend_buffer_get_size(buf) : 0; }

std::shared_ptr<buffer_handle> alloc_tensors(const graph_context & ctx, ggml_backend_buffer_type * buft) {
    if (!buft) buft = ggml_backend_cpu_buffer_type();
    ggml_backend_buffer * b = ggml_backend_alloc_ctx_tensors_from_buft(ctx.ctx(), buft);
    if (!b) throw Error("cannot allocate the tensors' buffer (out of memory, or nothing to allocate)");
    return std::make_shared<buffer_handle>(b);
}

compute_backend::compute_backend(const backend_params & params) : n_threads_(params.n_threads) {
    ggml_backend_dev_t dev = params.device.empty()
        ? ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU)
        : ggml_backend_dev_by_name(params.device.c_str());
    if (!dev) throw Error("unknown ggml device '" + params.device + "'");
    backend_ = ggml_backend_dev_init(dev, nullptr);
    if (!backend_) throw Error("cannot initialise ggml device '" + std::string(ggml_backend_dev_name(dev)) + "'");
    galloc_ = ggml_gallocr_new(ggml_backend_get_default_buffer_type(backend_));
    set_n_threads(params.n_threads);
}

compute_backend::~compute_backend() {
    if (galloc_) ggml_gallocr_free(galloc_);
    if (backend_) ggml_backend_free(backend_);
    if (threadpool_) ggml_threadpool_free(threadpool_);
}

ggml_backend_device * compute_backend::device() const { return ggml_backend_get_device(backend_); }
ggml_backend_buffer_type * compute_backend::buffer_type() const { return ggml_backend_get_default_buffer_type(backend_); }
std::string compute_backend::name() const {
    std::string ep = remote_device_endpoint(device());  // RPC: "RPC0[server]", not the relay's port
    return ep.empty() ? ggml_backend_name(backend_) : ggml_backend_dev_name(device()) + ("[" + ep + "]");
}

void compute_backend::set_use_ref(bool on) {
    if (!ggml_backend_is_cpu(backend_)) return;
    ggml_backend_cpu_set_use_ref(backend_, on);
    use_ref_ = on;
}

void compute_backend::set_n_threads(int n) {
    if (n < 1) throw Error("n_threads must be >= 1");
    n_threads_ = n;
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(device());
    auto fn = (ggml_backend_set_n_threads_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_set_n_threads");
    if (fn) fn(backend_, n);
    if (ggml_backend_is_cpu(backend_)) {
        ggml_threadpool_params tpp = ggml_threadpool_params_default(n);
        ggml_threadpool * tp = ggml_threadpool_new(&tpp);
        if (!tp) throw Error("cannot start a thread pool of " + std::to_string(n) + " threads");
        ggml_backend_cpu_set_threadpool(backend_, tp);
        if (threadpool_) ggml_threadpool_free(threadpool_);
        threadpool_ = tp;
    }
}

static void check_leaves(ggml_cgraph * g) {
    for (int i = 0; i < ggml_graph_n_nodes(g); ++i) {
        ggml_tensor * node = ggml_graph_node(g, i);
        for (int j = 0; j < GGML_MAX_SRC; ++j) {
            ggml_tensor * s = node->src[j];
            if (s && !s->data && !s->view_src && (s->flags & GGML_TENSOR_FLAG_INPUT) == 0 && s->op == GGML_OP_NONE) {
                throw Error(std::string("tensor '") + s->name + "' has no storage (unbound weight?)");
            }
        }
    }
}

// A cached graph is computed again later, after the graph allocator may have
// grown (freed and replaced) its buffer for another graph. So the nodes it
// placed forget their address right after each compute, while that buffer is
// still alive; outputs keep theirs until the caller has read them and forget
// it before the next compute (without looking at the possibly freed buffer).
static bool placed_by_allocator(const ggml_tensor * t) {
    return t->buffer && ggml_backend_buffer_get_usage(t->buffer) == GGML_BACKEND_BUFFER_USAGE_COMPUTE;
}

// Views of bound tensors (a KV frame, a weight slot) take their address when
// the graph is built; the tensor may be bound elsewhere since, so views of
// storage the allocator does not manage follow their source at each compute.
static void refresh_view(ggml_tensor * t) {
    ggml_tensor * src = t->view_src;
    if (!src || !src->data || placed_by_allocator(src)) return;
    t->buffer = src->buffer;
    t->data = static_cast<char *>(src->data) + t->view_offs;
}

void compute_backend::compute(ggml_cgraph * graph, bool sync) {
    check_leaves(graph);
    const int n = ggml_graph_n_nodes(graph);
    for (int i = 0; i < n; ++i) {
        ggml_tensor * t = ggml_graph_node(graph, i);
        if (t->flags & GGML_TENSOR_FLAG_OUTPUT) { t->buffer = nullptr; t->data = nullptr; }
        refresh_view(t);
        for (int j = 0; j < GGML_MAX_SRC; ++j) if (t->src[j]) refresh_view(t->src[j]);
    }
    if (!ggml_gallocr_alloc_graph(galloc_, graph)) throw Error("cannot allocate the compute buffer");
    const ggml_status st = sync ? ggml_backend_graph_compute(backend_, graph)
                                : ggml_backend_graph_compute_async(backend_, graph);
    for (int i = 0; i < n; ++i) {
        ggml_tensor * t = ggml_graph_node(graph, i);
        if (!(t->flags & GGML_TENSOR_FLAG_OUTPUT) && placed_by_allocator(t)) { t->buffer = nullptr; t->data = nullptr; }
    }
    if (st != GGML_STATUS_SUCCESS) throw Error("graph compute failed");
}

void compute_backend::synchronize() { ggml_backend_synchronize(backend_); }

size_t compute_backend::compute_buffer_size() const { return ggml_gallocr_get_buffer_size(galloc_, 0); }

}  // namespace superggml
