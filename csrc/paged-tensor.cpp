#include "paged-tensor.h"

#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"

#include <algorithm>
#include <chrono>

namespace superggml {

// Bytes `t` takes in a buffer of `buft`, padded so the next tensor stays aligned.
static size_t padded_size(ggml_backend_buffer_type * buft, const ggml_tensor * t) {
    return GGML_PAD(ggml_backend_buft_get_alloc_size(buft, t), ggml_backend_buft_get_alignment(buft));
}

void tensor_bind(ggml_tensor * t, ggml_backend_buffer * buffer, void * addr) {
    auto * base = static_cast<uint8_t *>(ggml_backend_buffer_get_base(buffer));
    auto * p = static_cast<uint8_t *>(addr);
    size_t need = ggml_backend_buffer_get_alloc_size(buffer, t);
    if (p < base || p + need > base + ggml_backend_buffer_get_size(buffer)) {
        throw Error(std::string("tensor_bind: '") + t->name + "' does not fit in the buffer at that address");
    }
    t->buffer = nullptr;
    t->data = nullptr;
    if (ggml_backend_tensor_alloc(buffer, t, addr) != GGML_STATUS_SUCCESS) {
        throw Error(std::string("tensor_bind: cannot bind '") + t->name + "'");
    }
}

void tensor_unbind(ggml_tensor * t) {
    t->buffer = nullptr;
    t->data = nullptr;
    t->extra = nullptr;
}

weight_store::weight_store(std::shared_ptr<gguf_file> file) : file_(std::move(file)) {
    for (const auto & ti : file_->tensors()) entries_[ti.name] = {file_->tensor(ti.name), ti.offset, ti.nbytes};
}

weight_store::~weight_store() {
    if (!file_->closed()) {
        for (auto & [name, e] : entries_) tensor_unbind(e.t);
    }
    if (views_) ggml_free(views_);
    if (mmap_buf_) ggml_backend_buffer_free(mmap_buf_);
    for (auto * b : resident_bufs_) ggml_backend_buffer_free(b);
}

const weight_store::entry & weight_store::at(const std::string & name) const {
    if (file_->closed()) throw Error("the GGUF file is closed");
    auto it = entries_.find(name);
    if (it == entries_.end()) throw GGUFError("GGUF has no tensor '" + name + "': " + file_->path());
    return it->second;
}

bool weight_store::has(const std::string & name) const { return entries_.count(name) != 0; }
ggml_tensor * weight_store::get(const std::string & name) const { return at(name).t; }
weight_home weight_store::home(const std::string & name) const { return at(name).home; }

std::pair<uint64_t, uint64_t> weight_store::file_range(const std::string & name) const {
    const entry & e = at(name);
    return {e.offset, e.nbytes};
}

std::vector<std::string> weight_store::add_row_chunks(const std::string & name, size_t max_bytes) {
    const entry & base = at(name);
    ggml_tensor * t = base.t;
    const size_t row = t->nb[1];
    if (ggml_n_dims(t) > 2) throw Error("row chunks need a 2-D tensor: '" + name + "'");
    const int64_t per = (int64_t) (max_bytes / row);
    if (per < 1) throw Error("a row of '" + name + "' (" + std::to_string(row) + " bytes) is bigger than " +
                             std::to_string(max_bytes) + " bytes");
    const int64_t n_chunks = (t->ne[1] + per - 1) / per;
    if (!views_) {
        ggml_init_params p = { 1024 * ggml_tensor_overhead(), nullptr, true };
        views_ = ggml_init(p);
    }
    if (ggml_used_mem(views_) + n_chunks * ggml_tensor_overhead() > ggml_get_mem_size(views_)) {
        throw Error("too many row chunks");
    }
    std::vector<std::string> names;
    for (int64_t c = 0; c < n_chunks; ++c) {
        const int64_t r0 = c * per, nr = std::min(per, t->ne[1] - r0);
        std::string n = name + ".rows" + std::to_string(r0);
        if (!entries_.count(n)) {
            ggml_tensor * v = ggml_new_tensor_2d(views_, t->type, t->ne[0], nr);
            ggml_set_name(v, n.c_str());
            entries_[n] = {v, base.offset + (uint64_t) (r0 * row), (uint64_t) (nr * row)};
        }
        names.push_back(n);
    }
    return names;
}

void weight_store::bind_mmap(const std::vector<std::string> & names) {
    if (!mmap_buf_) {
        mmap_buf_ = ggml_backend_cpu_buffer_from_ptr(const_cast<uint8_t *>(file_->map()), file_->file_size());
        if (!mmap_buf_) throw Error("cannot wrap the GGUF mapping in a CPU buffer");
        ggml_backend_buffer_set_usage(mmap_buf_, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    }
    auto bind_one = [&](entry & e) {
        tensor_bind(e.t, mmap_buf_, const_cast<uint8_t *>(file_->map()) + e.offset);
        e.home = weight_home::mmap;
    };
    if (names.empty()) {
        for (const auto & ti : file_->tensors()) bind_one(entries_.at(ti.name));
        return;
    }
    for (const auto & n : names) {
        at(n);
        bind_one(entries_.at(n));
    }
}

std::vector<std::string> weight_store::place_resident(const std::vector<std::string> & names,
                                                      ggml_backend_buffer_type * buft, size_t * bytes) {
    if (!buft) buft = ggml_backend_cpu_buffer_type();
    size_t total = 0;
    std::vector<entry *> pending;
    for (const auto & n : names) {
        at(n);
        entry & e = entries_.at(n);
        tensor_unbind(e.t);
        e.home = weight_home::unbound;
        total += padded_size(buft, e.t);
        pending.push_back(&e);
    }
    if (pending.empty()) return {};
    ggml_backend_buffer * buf = ggml_backend_buft_alloc_buffer(buft, total);
    if (!buf) throw Error("cannot allocate " + std::to_string(total) + " bytes for resident weights");
    ggml_backend_buffer_set_usage(buf, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    resident_bufs_.push_back(buf);
    auto * p = static_cast<uint8_t *>(ggml_backend_buffer_get_base(buf));
    for (entry * e : pending) {
        tensor_bind(e->t, buf, p);
        e->home = weight_home::resident;
        p += padded_size(buft, e->t);
    }
    if (bytes) *bytes += total;
    return names;
}

void weight_store::fill(const std::string & name) const {
    const entry & e = at(name);
    if (e.home != weight_home::resident && e.home != weight_home::repacked) {
        throw Error("fill: '" + name + "' is not placed in a resident buffer");
    }
    ggml_backend_tensor_set(e.t, file_->map() + e.offset, 0, e.nbytes);
}

size_t weight_store::load_resident(const std::vector<std::string> & names, ggml_backend_buffer_type * buft) {
    size_t total = 0;
    for (const auto & n : place_resident(names, buft, &total)) fill(n);
    return total;
}

// Would `dev` run mul_mat(w, x) with w stored in `buft`? (llama.cpp's test.)
static bool repack_supported(ggml_backend_device * dev, ggml_backend_buffer_type * buft, ggml_tensor * w) {
    if (ggml_n_dims(w) != 2) return false;
    ggml_init_params p = { 2 * ggml_tensor_overhead(), nullptr, true };
    ggml_context * ctx = ggml_init(p);
    ggml_tensor * x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, w->ne[0], 512);
    ggml_tensor * op = ggml_mul_mat(ctx, w, x);
    ggml_backend_buffer * dummy = ggml_backend_buft_alloc_buffer(buft, 0);
    ggml_backend_buffer * saved = w->buffer;
    w->buffer = dummy;
    bool ok = dummy && ggml_backend_dev_supports_op(dev, op);
    w->buffer = saved;
    if (dummy) ggml_backend_buffer_free(dummy);
    ggml_free(ctx);
    return ok;
}

std::vector<std::string> weight_store::place_repacked(const std::vector<std::string> & names,
                                                      ggml_backend_device * dev, size_t * bytes) {
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
    auto get_extra = (ggml_backend_dev_get_extra_bufts_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts");
    std::vector<std::string> placed;
    if (!get_extra) return placed;
    for (ggml_backend_buffer_type_t * b = get_extra(dev); b && *b; ++b) {
        std::vector<std::string> ok;
        for (const auto & n : names) {
            if (home(n) != weight_home::repacked && repack_supported(dev, *b, get(n))) ok.push_back(n);
        }
        for (const auto & n : place_resident(ok, *b, bytes)) {
            entries_.at(n).home = weight_home::repacked;
            placed.push_back(n);
        }
    }
    return placed;
}

size_t weight_store::load_repacked(const std::vector<std::string> & names, ggml_backend_device * dev) {
    size_t total = 0;
    for (const auto & n : place_repacked(names, dev, &total)) fill(n);
    return total;
}

size_t weight_store::bytes(weight_home h) const {
    size_t s = 0;
    for (const auto & [name, e] : entries_) if (e.home == h) s += e.nbytes;
    return s;
}

}  // namespace superggml

namespace superggml {

// Where a layer's tensors sit in a slot and which file reads fill it. Packed:
// back to back at the buffer alignment, one read per tensor. Direct (host
// slots, O_DIRECT): the file's own layout, in runs of tensors that are
// adjacent in the file, each run widened to DIRECT_ALIGN and read whole from
// an aligned address, so the disk writes straight into the slot. Offsets
// are from the slot's aligned start; `bytes` includes the room to align it.
struct slot_layout {
    std::vector<size_t> offsets;
    std::vector<read_range> ranges;
    size_t bytes = 0;
};

static slot_layout layout_layer(const weight_store & store, const std::vector<std::string> & names,
                                ggml_backend_buffer_type * buft, bool direct) {
    slot_layout out;
    if (!direct) {
        for (const auto & n : names) {
            auto [offset, nbytes] = store.file_range(n);
            out.offsets.push_back(out.bytes);
            out.ranges.push_back({offset, (size_t) nbytes, out.bytes, 0});
            out.bytes += padded_size(buft, store.get(n));
        }
        return out;
    }
    const uint64_t A = DIRECT_ALIGN, file_size = store.file().file_size();
    std::vector<size_t> order(names.size());
    std::vector<std::pair<uint64_t, uint64_t>> fr(names.size());
    for (size_t i = 0; i < names.size(); ++i) {
        order[i] = i;
        fr[i] = store.file_range(names[i]);
        // the bytes ggml may touch (alloc size) must stay inside the slot too
        fr[i].second = std::max<uint64_t>(fr[i].second, ggml_backend_buft_get_alloc_size(buft, store.get(names[i])));
    }
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return fr[a].first < fr[b].first; });
    out.offsets.assign(names.size(), 0);
    size_t i = 0;
    while (i < order.size()) {
        const uint64_t start = fr[order[i]].first / A * A;
        uint64_t end = fr[order[i]].first + fr[order[i]].second;
        size_t j = i + 1;
        while (j < order.size() && fr[order[j]].first < (end + A - 1) / A * A + A) {
            end = std::max(end, fr[order[j]].first + fr[order[j]].second);
            ++j;
        }
        const uint64_t stop = (end + A - 1) / A * A;
        for (size_t k = i; k < j; ++k) out.offsets[order[k]] = out.bytes + (fr[order[k]].first - start);
        out.ranges.push_back({start, (size_t) (stop - start), out.bytes, (size_t) (std::min(end, file_size) - start)});
        out.bytes += stop - start;
        i = j;
    }
    out.bytes += A;   // the slot's start is aligned up to A inside its buffer
    return out;
}

size_t layer_slot_bytes(const weight_store & store, const std::vector<std::string> & names,
                        ggml_backend_buffer_type * buft, bool direct) {
    if (!buft) buft = ggml_backend_cpu_buffer_type();
    return layout_layer(store, names, buft, direct && ggml_backend_buft_is_host(buft)).bytes;
}

layer_pager::layer_pager(std::shared_ptr<weight_store> store, const std::vector<std::vector<std::string>> & layers,
                         const pager_params & params) : store_(std::move(store)) {
    ggml_backend_buffer_type * buft = params.buft ? params.buft : ggml_backend_cpu_buffer_type();
    direct_ = params.direct_io && !params.staged && ggml_backend_buft_is_host(buft);
    size_t largest = 0;
    int largest_layer = 0;
    for (const auto & names : layers) {
        layer L;
        slot_layout lay = layout_layer(*store_, names, buft, direct_);
        for (const auto & n : names) L.tensors.push_back(store_->get(n));
        L.offsets = std::move(lay.offsets);
        L.ranges = std::move(lay.ranges);
        L.bytes = lay.bytes;
        if (L.bytes > largest) { largest = L.bytes; largest_layer = (int) layers_.size(); }
        layers_.push_back(std::move(L));
    }
    pager_params p = params;
    if (p.slot_size == 0) p.slot_size = largest;
    if (largest > p.slot_size) {
        throw Error("layer " + std::to_string(largest_layer) + " needs " + std::to_string(largest) +
                    " bytes but a slot has " + std::to_string(p.slot_size));
    }
    pool_params pp;
    pp.slot_size = p.slot_size;
    pp.n_slots = p.n_slots;
    pp.buft = buft;
    pool_ = std::make_unique<buffer_pool>(pp);
    io_ = std::make_unique<prefetcher>(store_->file().path(), p.n_workers, direct_,
                                       ggml_backend_buft_get_device(buft), p.staged);
}

// Bytes from a slot buffer's base to where the layer's layout starts.
static size_t slot_pad(ggml_backend_buffer * buf, bool direct) {
    if (!direct) return 0;
    auto base = (uintptr_t) ggml_backend_buffer_get_base(buf);
    return (DIRECT_ALIGN - base % DIRECT_ALIGN) % DIRECT_ALIGN;
}

layer_pager::~layer_pager() {
    const bool tensors_alive = !store_->file().closed();   // close() frees the tensors
    for (auto & L : layers_) {
        settle(L);
        if (L.bound && tensors_alive) for (auto * t : L.tensors) tensor_unbind(t);
    }
    io_.reset();
}

void layer_pager::settle(layer & L) {
    if (!L.ready.valid()) return;
    try { L.ready.get(); } catch (...) {}
}

void layer_pager::on_evict(int key) {
    if (key < 0) return;
    layer & E = layers_.at(key);
    if (E.bound) for (auto * t : E.tensors) tensor_unbind(t);
    E.bound = false;
    E.pinned = false;
    E.slot = -1;
    E.ready = {};
    stats_.evictions++;
}

bool layer_pager::prefetch(int l, int priority) {
    layer & L = layers_.at(l);
    if (L.slot >= 0) return true;
    buffer_pool::acquired a;
    try {
        a = pool_->acquire(l);
    } catch (const PoolExhausted &) {
        return false;
    }
    on_evict(a.evicted);
    L.slot = a.slot;
    L.prefetch_hold = true;
    load_job job;
    job.key = l;
    job.priority = priority;
    job.dst = pool_->buffer(a.slot);
    job.direct = direct_;
    job.ranges = L.ranges;
    const size_t pad = slot_pad(job.dst, direct_);
    for (auto & r : job.ranges) r.dst_offset += pad;
    L.ready = io_->submit(std::move(job)).done;
    stats_.loads++;
    for (const auto & r : L.ranges) stats_.bytes_loaded += r.size;
    return true;
}

void layer_pager::acquire(int l) {
    layer & L = layers_.at(l);
    // a load started ahead of time (a prefetch) that failed is retried once, now, before giving up:
    // the fault may have been transient, and a speculative load must not fail a later step
    for (int attempt = 0;; ++attempt) {
        const bool speculative = L.slot >= 0;
        if (L.slot < 0) {
            if (!prefetch(l, 1 << 20)) throw PoolExhausted("no pool slot free for layer " + std::to_string(l));
        } else {
            stats_.hits++;
        }
        if (L.prefetch_hold) {
            L.prefetch_hold = false;          // the prefetch's hold becomes this one
        } else {
            pool_->acquire(l);                // a hit: count the hold
        }
        L.holds++;
        if (L.bound) return;
        auto t0 = std::chrono::steady_clock::now();
        try {
            L.ready.get();
        } catch (...) {
            L.holds--;
            pool_->release(L.slot);
            pool_->drop(l);
            L.slot = -1;
            L.ready = {};
            if (speculative && attempt == 0) continue;
            throw;
        }
        stats_.wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        ggml_backend_buffer * buf = pool_->buffer(L.slot);
        auto * base = static_cast<uint8_t *>(ggml_backend_buffer_get_base(buf)) + slot_pad(buf, direct_);
        for (size_t i = 0; i < L.tensors.size(); ++i) tensor_bind(L.tensors[i], buf, base + L.offsets[i]);
        L.bound = true;
        return;
    }
}

void layer_pager::release(int l) {
    layer & L = layers_.at(l);
    if (L.holds <= 0) throw Error("release of layer " + std::to_string(l) + " that is not acquired");
    L.holds--;
    pool_->release(L.slot);
}

void layer_pager::pin(int l) {
    acquire(l);
    pool_->set_pinned(layers_.at(l).slot, true);
    layers_.at(l).pinned = true;
    release(l);
}

void layer_pager::unpin(int l) {
    layer & L = layers_.at(l);
    if (L.pinned && L.slot >= 0) pool_->set_pinned(L.slot, false);
    L.pinned = false;
}

bool layer_pager::pinned(int l) const { return layers_.at(l).pinned; }

bool layer_pager::shrink() {
    int evicted = -1;
    if (!pool_->shrink(evicted)) return false;
    on_evict(evicted);
    return true;
}

void layer_pager::grow() { pool_->grow(); }

bool layer_pager::resident(int l) const { return layers_.at(l).slot >= 0; }

pager_stats layer_pager::stats() const { return stats_; }

}  // namespace superggml
