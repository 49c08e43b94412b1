#include "graph.h"
#include "remote.h"
#include "tensor-bind.h"

#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml-impl.h"   // ggml_cgraph::uid, ggml_graph_next_uid

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

namespace superggml {

namespace {

// The graphs some backend keeps (compute_backend::kept_), so that a graph freed first is forgotten first.
std::mutex g_kept_mutex;
std::unordered_map<const ggml_cgraph *, compute_backend *> g_kept;

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

// Pairs of backend events around graphs; a watcher thread waits for each and adds up the spans between them.
struct event_timer {
    explicit event_timer(ggml_backend_dev_t dev) : dev_(dev), watcher_([this] { watch(); }) {}
    ~event_timer() {
        { std::lock_guard<std::mutex> lk(mu_); stop_ = true; }
        cv_.notify_all();
        watcher_.join();
        for (auto * e : free_) ggml_backend_event_free(e);
    }
    // An event recorded on the backend's stream now (nullptr where the device has none).
    ggml_backend_event_t record(ggml_backend_t backend) {
        ggml_backend_event_t e = nullptr;
        {
            std::lock_guard<std::mutex> lk(mu_);
            if (!free_.empty()) { e = free_.back(); free_.pop_back(); }
        }
        if (!e) e = ggml_backend_event_new(dev_);
        if (e) ggml_backend_event_record(e, backend);
        return e;
    }
    void watch_span(ggml_backend_event_t a, ggml_backend_event_t b) {
        { std::lock_guard<std::mutex> lk(mu_); pending_.emplace_back(a, b); }
        cv_.notify_all();
    }
    // Waits until every span handed over is counted.
    void drain() {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [this] { return pending_.empty() && !busy_; });
    }
    double seconds() const { return ns_.load() * 1e-9; }
    uint64_t spans() const { return spans_.load(); }

private:
    void watch() {
        std::unique_lock<std::mutex> lk(mu_);
        for (;;) {
            cv_.wait(lk, [this] { return stop_ || !pending_.empty(); });
            if (pending_.empty()) return;
            auto [a, b] = pending_.front();
            pending_.pop_front();
            busy_ = true;
            lk.unlock();
            ggml_backend_event_synchronize(a);
            auto t0 = std::chrono::steady_clock::now();
            ggml_backend_event_synchronize(b);
            ns_ += (uint64_t) std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
            spans_ += 1;
            lk.lock();
            free_.push_back(a);
            free_.push_back(b);
            busy_ = false;
            cv_.notify_all();
        }
    }

    ggml_backend_dev_t dev_;
    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<std::pair<ggml_backend_event_t, ggml_backend_event_t>> pending_;
    std::vector<ggml_backend_event_t> free_;
    bool stop_ = false, busy_ = false;
    std::atomic<uint64_t> ns_{0}, spans_{0};
    std::thread watcher_;
};

graph_context::graph_context(size_t max_tensors, size_t graph_size) : graph_size_(graph_size) {
    size_t mem = ggml_tensor_overhead() * max_tensors;
    if (graph_size) mem += ggml_graph_overhead_custom(graph_size, false);
    ggml_init_params p = { mem, nullptr, /*no_alloc*/ true };
    ctx_ = ggml_init(p);
    if (!ctx_) throw Error("ggml_init failed");
}

graph_context::~graph_context() {
    {
        std::lock_guard<std::mutex> lk(g_kept_mutex);
        for (const ggml_cgraph * g : graphs_) {
            auto it = g_kept.find(g);
            if (it != g_kept.end()) it->second->forget(g);
        }
    }
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
    ggml_cgraph * g = ggml_new_graph_custom(ctx_, graph_size_, false);
    graphs_.push_back(g);
    return g;
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
    storage_moved();
    return std::make_shared<buffer_handle>(b);
}

compute_backend::compute_backend(const backend_params & params) : n_threads_(params.n_threads), poll_(params.poll) {
    if (params.poll < 0 || params.poll > 100) throw Error("poll must be in [0, 100]");
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
    timer_.reset();
    {
        std::lock_guard<std::mutex> lk(g_kept_mutex);
        if (kept_) g_kept.erase(kept_);
        kept_ = nullptr;
        kept_placed_.clear();
    }
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

void compute_backend::set_poll(int poll) {
    if (poll < 0 || poll > 100) throw Error("poll must be in [0, 100]");
    poll_ = poll;
    set_n_threads(n_threads_);   // a new pool with this level
}

void compute_backend::set_n_threads(int n) {
    if (n < 1) throw Error("n_threads must be >= 1");
    n_threads_ = n;
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(device());
    auto fn = (ggml_backend_set_n_threads_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_set_n_threads");
    if (fn) fn(backend_, n);
    if (ggml_backend_is_cpu(backend_)) {
        ggml_threadpool_params tpp = ggml_threadpool_params_default(n);
        tpp.poll = (uint32_t) poll_;
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

static bool is_op(const ggml_tensor * t) {
    return !ggml_is_empty(t) && t->op != GGML_OP_NONE && t->op != GGML_OP_VIEW && t->op != GGML_OP_RESHAPE &&
           t->op != GGML_OP_PERMUTE && t->op != GGML_OP_TRANSPOSE;
}

// Called with g_kept_mutex held, before the allocator runs for another graph: the kept graph's buffer is alive.
void compute_backend::release_kept() {
    if (!kept_) return;
    for (ggml_tensor * t : kept_placed_) { t->buffer = nullptr; t->data = nullptr; }
    kept_placed_.clear();
    g_kept.erase(kept_);
    kept_ = nullptr;
}

void compute_backend::forget(const ggml_cgraph * graph) {   // g_kept_mutex held (graph_context's destructor)
    if (kept_ != graph) return;
    kept_placed_.clear();
    g_kept.erase(kept_);
    kept_ = nullptr;
}

void compute_backend::compute(ggml_cgraph * graph, bool sync) {
    const auto t0 = std::chrono::steady_clock::now();
    const int n = ggml_graph_n_nodes(graph);
    std::unique_lock<std::mutex> lk(g_kept_mutex);
    const bool reuse = graph == kept_ && kept_epoch_ == storage_epoch() && kept_nodes_ == n;
    if (!reuse) {
        auto other = g_kept.find(graph);   // kept by another backend: its addresses are that backend's
        if (other != g_kept.end() && other->second != this) other->second->release_kept();
        release_kept();
        check_leaves(graph);
        for (int i = 0; i < n; ++i) {
            ggml_tensor * t = ggml_graph_node(graph, i);
            if (t->flags & GGML_TENSOR_FLAG_OUTPUT) { t->buffer = nullptr; t->data = nullptr; }
            refresh_view(t);
            for (int j = 0; j < GGML_MAX_SRC; ++j) if (t->src[j]) refresh_view(t->src[j]);
        }
        if (!ggml_gallocr_alloc_graph(galloc_, graph)) throw Error("cannot allocate the compute buffer");
        kept_ops_ = 0;
        std::vector<std::pair<const ggml_tensor *, void *>> at;
        for (int i = 0; i < n; ++i) {
            ggml_tensor * t = ggml_graph_node(graph, i);
            kept_ops_ += is_op(t);
            if (placed_by_allocator(t)) { kept_placed_.push_back(t); at.emplace_back(t, t->data); }
        }
        // a node another backend's kept graph shares may have moved: that graph is prepared again
        // (the uid tells a graph made since at a freed one's address: this one gave it)
        if (graph != placed_graph_ || graph->uid != placed_uid_ || at != placed_at_) storage_moved();
        graph->uid = ggml_graph_next_uid();   // a new graph to ggml-cuda: it compares the nodes once
        placed_graph_ = graph;
        placed_uid_ = graph->uid;
        placed_at_ = std::move(at);
        kept_ = graph;
        kept_epoch_ = storage_epoch();
        kept_nodes_ = n;
        g_kept[graph] = this;
    }
    const int ops = kept_ops_;
    lk.unlock();
    const auto t1 = std::chrono::steady_clock::now();
    ggml_backend_event_t ev0 = timer_ ? timer_->record(backend_) : nullptr;
    const ggml_status st = ggml_backend_graph_compute_async(backend_, graph);
    ggml_backend_event_t ev1 = ev0 ? timer_->record(backend_) : nullptr;
    if (ev0 && ev1) timer_->watch_span(ev0, ev1);
    else if (ev0) ggml_backend_event_free(ev0);
    const auto t2 = std::chrono::steady_clock::now();
    {
        std::lock_guard<std::mutex> sl(stats_mutex_);
        stats_.graphs += 1;
        stats_.reused += reuse;
        stats_.nodes += ops;
        stats_.prepare_s += std::chrono::duration<double>(t1 - t0).count();
        stats_.launch_s += std::chrono::duration<double>(t2 - t1).count();
    }
    if (st != GGML_STATUS_SUCCESS) {
        lk.lock();
        release_kept();
        throw Error("graph compute failed");
    }
    if (sync) synchronize();
}

void compute_backend::synchronize() {
    const auto t0 = std::chrono::steady_clock::now();
    ggml_backend_synchronize(backend_);
    const double w = seconds_since(t0);
    std::lock_guard<std::mutex> sl(stats_mutex_);
    stats_.wait_s += w;
}

compute_stats compute_backend::stats() const {
    compute_stats s;
    {
        std::lock_guard<std::mutex> sl(stats_mutex_);
        s = stats_;
    }
    if (timer_) {
        timer_->drain();
        s.device_s = timer_->seconds();
        s.device_graphs = timer_->spans();
    }
    return s;
}

void compute_backend::set_timing(bool on) {
    if (!on) { timer_.reset(); return; }
    if (timer_) return;
    ggml_backend_event_t probe = ggml_backend_event_new(device());
    if (!probe) return;   // no events on this device (the CPU): device_s stays 0
    ggml_backend_event_free(probe);
    timer_ = std::make_unique<event_timer>(device());
}

size_t compute_backend::compute_buffer_size() const { return ggml_gallocr_get_buffer_size(galloc_, 0); }

}  // namespace superggml
