#include "layer-pager.h"

#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"

#include <algorithm>
#include <chrono>

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
            out.bytes += tensor_padded_size(buft, store.get(n));
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
    const bool tier = params.host_slots > 0 && (params.staged || !ggml_backend_buft_is_host(buft));
    tier_direct_ = tier && params.direct_io;
    ggml_backend_dev_t dev = ggml_backend_buft_get_device(buft);   // none for ggml-cpu's own buffer type
    ggml_backend_buffer_type * host_buft = dev ? ggml_backend_dev_host_buffer_type(dev) : nullptr;
    if (!host_buft) host_buft = ggml_backend_cpu_buffer_type();
    size_t largest = 0, host_largest = 0;
    int largest_layer = 0;
    for (const auto & names : layers) {
        layer L;
        slot_layout lay = layout_layer(*store_, names, buft, direct_);
        for (const auto & n : names) L.tensors.push_back(store_->get(n));
        L.offsets = std::move(lay.offsets);
        L.ranges = std::move(lay.ranges);
        L.bytes = lay.bytes;
        if (tier_direct_) {
            slot_layout hl = layout_layer(*store_, names, host_buft, true);
            L.host_ranges = std::move(hl.ranges);
            L.host_offsets = std::move(hl.offsets);
            host_largest = std::max(host_largest, hl.bytes);
        }
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
    host_filled_ = std::make_unique<std::atomic<bool>[]>(layers_.size());
    for (size_t i = 0; i < layers_.size(); ++i) host_filled_[i] = false;
    if (tier) {
        pool_params hp;
        hp.slot_size = std::max(p.slot_size, host_largest);
        hp.n_slots = p.host_slots;
        hp.buft = host_buft;
        host_ = std::make_unique<buffer_pool>(hp);
    }
    io_ = std::make_unique<prefetcher>(store_->file().path(), p.n_workers, direct_ || tier_direct_,
                                       ggml_backend_buft_get_device(buft), p.staged, p.writer);
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

int layer_pager::slot_of(int l) const {
    (void) layers_.at(l);   // std::out_of_range for a bad index
    return pool_->slot_of(l);
}

void layer_pager::on_evict(int key) {
    if (key < 0) return;
    layer & E = layers_.at(key);
    if (E.bound) for (auto * t : E.tensors) tensor_unbind(t);
    E.bound = false;
    E.ready = {};
    stats_.evictions++;
}

bool layer_pager::prefetch(int l, int priority) {
    layer & L = layers_.at(l);
    if (slot_of(l) >= 0) return true;
    buffer_pool::acquired a;
    try {
        a = pool_->acquire(l);   // this hold is the load's until acquire(l) takes it over
    } catch (const PoolExhausted &) {
        return false;
    }
    on_evict(a.evicted);
    load_job job;
    job.key = l;
    job.priority = priority;
    job.dst = pool_->buffer(a.slot);
    job.direct = direct_;
    job.ranges = L.ranges;
    const size_t pad = slot_pad(job.dst, direct_);
    for (auto & r : job.ranges) r.dst_offset += pad;
    host_take(l, job);
    uint64_t n = 0;
    for (const auto & r : L.ranges) n += r.size;
    stats_.loads++;
    stats_.bytes_loaded += n;
    if (job.host_filled) {
        stats_.host_hits++;
        stats_.host_bytes += n;
    } else {
        stats_.file_bytes += n;
    }
    L.ready = io_->submit(std::move(job)).done;
    return true;
}

void layer_pager::host_take(int l, load_job & job) {
    if (!host_ || direct_) return;
    buffer_pool::acquired h;
    try {
        h = host_->acquire(l, false);   // held until the job ends; a full tier evicts nothing (a pass reads
    } catch (const PoolExhausted &) {   // the blocks in a cycle: LRU would drop each one before its reuse)
        return;                     // the tier is full or every slot is being loaded through: this load reads the file
    }
    if (h.evicted >= 0) host_filled_[h.evicted] = false;
    job.host = host_->base(h.slot);
    if (tier_direct_) {   // the host slot in the file's layout: read it with O_DIRECT, copy tensor by tensor
        const layer & L = layers_.at(l);
        job.host += slot_pad(host_->buffer(h.slot), true);
        job.direct = true;
        job.host_ranges = L.host_ranges;
        const size_t pad = job.ranges.empty() ? 0 : job.ranges[0].dst_offset - L.ranges[0].dst_offset;
        for (size_t i = 0; i < L.tensors.size(); ++i) {
            job.copies.push_back({L.host_offsets[i], L.ranges[i].dst_offset + pad, L.ranges[i].size});
        }
    }
    job.host_filled = h.hit && host_filled_[l];
    host_filled_[l] = false;        // until this job ends well
    buffer_pool * host = host_.get();
    std::atomic<bool> * filled = &host_filled_[l];
    const int slot = h.slot;
    job.done = [host, filled, slot, l](bool ok) {
        *filled = ok;
        host->release(slot);
        if (!ok) host->drop(l);
    };
}

void layer_pager::acquire(int l) {
    layer & L = layers_.at(l);
    // a load started ahead of time (a prefetch) that failed is retried once, now, before giving up:
    // the fault may have been transient, and a speculative load must not fail a later step
    for (int attempt = 0;; ++attempt) {
        int slot = slot_of(l);
        const bool speculative = slot >= 0;
        if (slot < 0) {
            if (!prefetch(l, 1 << 20)) throw PoolExhausted("no pool slot free for layer " + std::to_string(l));
            slot = slot_of(l);
        } else {
            stats_.hits++;
        }
        if (L.bound) {
            pool_->acquire(l);                // a hit: count the hold
            return;
        }
        auto t0 = std::chrono::steady_clock::now();   // the prefetch's hold is this one now
        try {
            L.ready.get();
        } catch (...) {
            pool_->release(slot);
            pool_->drop(l);
            L.ready = {};
            if (speculative && attempt == 0) continue;
            throw;
        }
        stats_.wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        ggml_backend_buffer * buf = pool_->buffer(slot);
        auto * base = static_cast<uint8_t *>(ggml_backend_buffer_get_base(buf)) + slot_pad(buf, direct_);
        for (size_t i = 0; i < L.tensors.size(); ++i) tensor_bind(L.tensors[i], buf, base + L.offsets[i]);
        L.bound = true;
        return;
    }
}

void layer_pager::release(int l) {
    const int slot = slot_of(l);
    // an unbound layer's one hold is its prefetch's, not a caller's
    if (slot < 0 || !layers_.at(l).bound || pool_->in_use(slot) <= 0) {
        throw Error("release of layer " + std::to_string(l) + " that is not acquired");
    }
    pool_->release(slot);
}

void layer_pager::pin(int l) {
    acquire(l);
    pool_->set_pinned(slot_of(l), true);
    release(l);
    if (host_ && host_->drop(l)) host_filled_[l] = false;   // a full tier evicts nothing: leave room to blocks that stream
}

void layer_pager::unpin(int l) {
    const int slot = slot_of(l);
    if (slot >= 0) pool_->set_pinned(slot, false);
}

bool layer_pager::pinned(int l) const {
    const int slot = slot_of(l);
    return slot >= 0 && pool_->pinned(slot);
}

bool layer_pager::shrink() {
    int evicted = -1;
    if (!pool_->shrink(evicted)) return false;
    on_evict(evicted);
    return true;
}

void layer_pager::grow() { pool_->grow(); }

bool layer_pager::resident(int l) const { return slot_of(l) >= 0; }

pager_stats layer_pager::stats() const { return stats_; }

}  // namespace superggml
