// graph: ggml contexts, graphs and their execution on one backend.
//
// Graph code (python/superggml/arch) builds tensors and ops in a no-alloc
// `graph_context`; a `compute_backend` assigns the intermediate tensors to
// its compute buffer (ggml-alloc) and runs the graph. Tensors that must
// outlive one graph (activations, KV cache, step inputs) live in a
// `graph_context` whose tensors are allocated into a backend buffer
// (`alloc_tensors`).
#pragma once

#include "error.h"

#include <cstddef>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

struct ggml_context;
struct ggml_tensor;
struct ggml_cgraph;
struct ggml_backend;
struct ggml_backend_buffer;
struct ggml_backend_buffer_type;
struct ggml_backend_device;
struct ggml_gallocr;
struct ggml_threadpool;

namespace superggml {

// A no-alloc ggml context that can hold `max_tensors` tensors and graphs of
// up to `graph_size` nodes. Running out of room throws Error (never aborts).
class graph_context {
public:
    explicit graph_context(size_t max_tensors = 1024, size_t graph_size = 0);
    ~graph_context();
    graph_context(const graph_context &) = delete;
    graph_context & operator=(const graph_context &) = delete;

    ggml_context * ctx() const { return ctx_; }
    size_t graph_size() const { return graph_size_; }

    // Throws Error unless one more tensor (or a graph) fits.
    void check_room(size_t n_tensors = 1) const;
    ggml_cgraph * new_graph();
    // ggml_build_forward_expand(g, t), g one of this context's graphs, or Error("graph is full") when what it
    // would add (nodes and leafs not reached before) would not fit: ggml aborts on overflow. Costs the tensors
    // it adds, not the graph's size.
    void graph_expand(ggml_cgraph * g, ggml_tensor * t);

private:
    ggml_context * ctx_ = nullptr;
    size_t graph_size_;
    std::unordered_map<const ggml_cgraph *, std::unordered_set<const ggml_tensor *>> reached_;
};

// RAII owner of a backend buffer.
struct buffer_handle {
    ggml_backend_buffer * buf = nullptr;
    explicit buffer_handle(ggml_backend_buffer * b) : buf(b) {}
    ~buffer_handle();
    size_t size() const;
};

// Allocates every unallocated tensor of `ctx` in one new buffer of `buft`
// (nullptr: CPU). Throws Error if the allocation fails.
std::shared_ptr<buffer_handle> alloc_tensors(const graph_context & ctx, ggml_backend_buffer_type * buft);

struct backend_params {
    std::string device;   // ggml device name ("" = CPU)
    int n_threads = 4;
};

// One ggml backend (device) with a graph allocator for intermediates.
class compute_backend {
public:
    // Throws Error if the device is unknown or cannot be initialised.
    explicit compute_backend(const backend_params & params);
    ~compute_backend();
    compute_backend(const compute_backend &) = delete;
    compute_backend & operator=(const compute_backend &) = delete;

    ggml_backend * backend() const { return backend_; }
    ggml_backend_device * device() const;
    ggml_backend_buffer_type * buffer_type() const;
    std::string name() const;

    void set_n_threads(int n);
    int n_threads() const { return n_threads_; }
    // CPU: ggml-cpu's reference paths (ggml_backend_cpu_set_use_ref): no tiled matmuls, no fusion, so a
    // row's result does not depend on the other rows of the op. Ignored on other devices.
    void set_use_ref(bool on);
    bool use_ref() const { return use_ref_; }

    // Allocates the graph's intermediates and runs it: blocking, or with
    // `sync` false queued on the device's stream (a GPU returns before the
    // graph has run; call synchronize() before the host reads its results or
    // reuses memory it reads). Throws Error if a leaf tensor has no storage
    // or the backend fails.
    void compute(ggml_cgraph * graph, bool sync = true);
    // Waits for every graph and copy queued on this backend.
    void synchronize();

    // Bytes of the compute buffer (intermediates) allocated so far.
    size_t compute_buffer_size() const;

private:
    ggml_backend * backend_ = nullptr;
    ggml_gallocr * galloc_ = nullptr;
    ggml_threadpool * threadpool_ = nullptr;   // CPU: kept across graphs (no thread start per graph)
    int n_threads_;
    bool use_ref_ = false;
};

}  // namespace superggml
