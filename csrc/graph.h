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
#include <cstdint>
#include <memory>
#include <mutex>
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
    std::vector<const ggml_cgraph *> graphs_;
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

// What a backend's graphs cost, counted since the backend was made (compute_backend::stats). Host seconds are the
// host's own work; on the CPU the computation itself is `launch_s` (ggml computes as it is called), on a device with
// a stream of its own (a GPU) `launch_s` is the host queuing kernels (or replaying a CUDA graph) and `wait_s` the host
// waiting for the device. `device_s` is the device's span from the start of each graph to its end, from backend
// events (a GPU, with timing on; 0 elsewhere).
struct compute_stats {
    uint64_t graphs = 0;     // graphs computed
    uint64_t reused = 0;     // of them, the same graph again with nothing changed: no checks, no allocation, same uid
    uint64_t nodes = 0;      // operations computed (views and reshapes left out)
    double prepare_s = 0;    // host: leaves checked, views refreshed, intermediates allocated
    double launch_s = 0;     // in ggml's graph compute
    double wait_s = 0;       // in synchronize (and a blocking compute's own wait)
    double device_s = 0;     // device span (events; timing on)
    uint64_t device_graphs = 0;   // graphs device_s covers
};

struct event_timer;

struct backend_params {
    std::string device;   // ggml device name ("" = CPU)
    int n_threads = 4;
    int poll = 0;         // CPU: how long idle workers spin for the next graph before sleeping (0-100, llama.cpp's --poll)
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
    // CPU: the thread pool's poll level (0: workers sleep between graphs; 1-100: they spin that long first).
    void set_poll(int poll);
    int poll() const { return poll_; }
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

    // The counters above; `timing` on records a pair of backend events around each graph (where the device has
    // events) and a watcher thread adds up the spans.
    compute_stats stats() const;
    void set_timing(bool on);
    bool timing() const { return timer_ != nullptr; }
    // Forgets a graph about to be freed (graph_context's destructor): never computed again as it was.
    void forget(const ggml_cgraph * graph);

    // Bytes of the compute buffer (intermediates) allocated so far.
    size_t compute_buffer_size() const;

private:
    void release_kept();   // the kept graph's intermediates forget their addresses (before the allocator runs again)

    ggml_backend * backend_ = nullptr;
    ggml_gallocr * galloc_ = nullptr;
    // The last graph computed keeps its intermediates' addresses (and its uid) while no allocator placed anything
    // and no storage moved since: computing it again then goes straight to the device (llama.cpp's graph reuse).
    // A graph another backend keeps is released there before this one allocates it.
    ggml_cgraph * kept_ = nullptr;
    uint64_t kept_epoch_ = 0;
    int kept_nodes_ = 0;
    int kept_ops_ = 0;
    std::vector<ggml_tensor *> kept_placed_;   // its nodes the allocator placed (found while its buffer was alive)
    // Where the allocator last placed a graph's nodes here: the same graph placed at the same addresses again
    // moves nothing that another backend's kept graph reads (a pass's embedding graph on the CPU beside its
    // device graph would otherwise unsettle each other at every pass).
    const ggml_cgraph * placed_graph_ = nullptr;
    uint64_t placed_uid_ = 0;
    std::vector<std::pair<const ggml_tensor *, void *>> placed_at_;
    compute_stats stats_;
    mutable std::mutex stats_mutex_;   // stats() may be read while another thread computes
    std::unique_ptr<event_timer> timer_;
    ggml_threadpool * threadpool_ = nullptr;   // CPU: kept across graphs (no thread start per graph)
    int n_threads_;
    int poll_ = 0;
    bool use_ref_ = false;
};

}  // namespace superggml
