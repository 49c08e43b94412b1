#include "expert-cache.h"

#include "tensor-bind.h"

#include "ggml.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"

#include <algorithm>

#include <sys/mman.h>
#include <unistd.h>

namespace superggml {

expert_cache::expert_cache(const expert_cache_params & params, std::shared_ptr<prefetcher> io)
    : p_(params), io_(std::move(io)) {
    if (p_.n_slots < 1 || p_.slot_size == 0) throw Error("expert cache needs at least one slot of nonzero size");
    if (p_.zero_slots < 0) throw Error("expert cache: zero_slots must not be negative");
    if (!io_) throw Error("expert cache needs a prefetcher");
    if (!p_.buft) p_.buft = ggml_backend_cpu_buffer_type();
    want_direct_ = p_.direct;
    p_.direct = p_.direct && ggml_backend_buft_is_host(p_.buft) && !io_->staged();
    const size_t align = p_.direct ? DIRECT_ALIGN : ggml_backend_buft_get_alignment(p_.buft);
    slot_size_ = (p_.slot_size + align - 1) / align * align;
    const size_t total = slot_size_ * (size_t) (p_.n_slots + p_.zero_slots) + (p_.direct ? DIRECT_ALIGN : 0);
    buf_ = ggml_backend_buft_alloc_buffer(p_.buft, total);
    if (!buf_) {
        throw Error("cannot allocate an expert cache of " + std::to_string(total) + " bytes on " +
                    ggml_backend_buft_name(p_.buft));
    }
    if (p_.direct) {
        const auto base = (uintptr_t) ggml_backend_buffer_get_base(buf_);
        pad_ = (DIRECT_ALIGN - base % DIRECT_ALIGN) % DIRECT_ALIGN;
    }
    ggml_backend_buffer_clear(buf_, 0);   // the zero slots, and slots not loaded yet kept finite
    slots_.resize(p_.n_slots);
    active_ = p_.n_slots;
    if (p_.host_slots > 0 && (io_->staged() || !ggml_backend_buft_is_host(p_.buft))) {
        pool_params hp;
        hp.slot_size = slot_size_;
        hp.n_slots = p_.host_slots;
        ggml_backend_dev_t dev = ggml_backend_buft_get_device(p_.buft);
        hp.buft = dev ? ggml_backend_dev_host_buffer_type(dev) : nullptr;
        if (!hp.buft) hp.buft = ggml_backend_cpu_buffer_type();
        hp.align = DIRECT_ALIGN;
        tier_ = std::make_unique<buffer_pool>(hp);
    }
}

expert_cache::~expert_cache() {
    for (auto & s : slots_) {
        if (s.load.valid()) { try { s.load.get(); } catch (...) {} }
    }
    if (buf_) ggml_backend_buffer_free(buf_);
}

// The read of a part's `size` bytes at file offset `off` to `dst`: with `direct` widened to whole blocks (the
// lead before it lands in front of dst; past the end of the file only `need` bytes must arrive).
static read_range part_read(uint64_t off, size_t size, size_t dst, bool direct) {
    if (!direct) return {off, size, dst, 0};
    const size_t lead = off % DIRECT_ALIGN;
    const size_t span = (lead + size + DIRECT_ALIGN - 1) / DIRECT_ALIGN * DIRECT_ALIGN;
    return {off - lead, span, dst - lead, lead + size};
}

void expert_cache::tier_take(load_job & job, const layer_info & L, uint64_t expert, size_t dst, size_t n) {
    buffer_pool::acquired h;
    try {
        h = tier_->acquire(job.key);   // held until the job ends
    } catch (const PoolExhausted &) {
        st_.file_bytes += n;
        return;                        // every host slot is being loaded through: this load reads the file
    }
    bool filled;
    {
        std::lock_guard<std::mutex> lk(tier_mu_);
        if (h.evicted >= 0) tier_filled_.erase(h.evicted);
        filled = h.hit && tier_filled_.count(job.key);
        tier_filled_.erase(job.key);   // until this job ends well
    }
    job.host = tier_->base(h.slot);
    job.host_filled = filled;
    job.direct = L.aligned;
    job.ranges.clear();
    for (const auto & q : L.parts) {
        const uint64_t off = q.file_offset + expert * q.stride;
        job.host_ranges.push_back(part_read(off, q.size, q.slot_offset, L.aligned));
        job.copies.push_back({q.slot_offset, dst + q.slot_offset, q.size});
        job.ranges.push_back({off, q.size, dst + q.slot_offset, 0});
    }
    if (filled) { st_.tier_hits++; st_.tier_bytes += n; } else { st_.file_bytes += n; }
    buffer_pool * tier = tier_.get();
    std::mutex * mu = &tier_mu_;
    std::unordered_set<int> * set = &tier_filled_;
    const int slot = h.slot, k = job.key;
    job.done = [tier, mu, set, slot, k](bool ok) {
        {
            std::lock_guard<std::mutex> lk(*mu);
            if (ok) set->insert(k); else set->erase(k);
        }
        tier->release(slot);
        if (!ok) tier->drop(k);
    };
}

namespace {
constexpr double ONCE = 1e30;    // expected() of an expert used once: later than any forecast
constexpr double NEVER = 2e30;   // of one never used (a guess)
}

double expert_cache::expected(int k) const {
    const use_history & h = layers_[k / 65536].uses[k % 65536];
    if (h.n == 0) return NEVER;
    if (h.n == 1) return ONCE;
    const double last = (double) h.at[h.n - 1], now = (double) tick_;
    if (now - h.next > 2 * (h.next - last)) return now + (now - last);   // overdue: away as long as it has been
    return h.next;
}

int expert_cache::take_slot(double limit) {
    int best = -1;
    bool best_prefetched = false;
    double best_at = 0;
    for (int i = 0; i < active_; ++i) {
        const slot & s = slots_[i];
        if (s.pins) continue;
        if (s.key < 0) return i;
        if (s.prefetched && limit >= 0) continue;
        const double at = expected(s.key);
        if (limit >= 0 && at < limit) continue;
        // unused prefetches last; then the one expected back farthest; then the latest use
        const bool better = best < 0 || (best_prefetched && !s.prefetched) ||
                            (best_prefetched == s.prefetched &&
                             (at > best_at || (at == best_at && s.last_use > slots_[best].last_use)));
        if (better) { best = i; best_prefetched = s.prefetched; best_at = at; }
    }
    if (best >= 0) {
        slot & s = slots_[best];
        if (s.load.valid()) { try { s.load.get(); } catch (...) {} }   // a read into it may still run
        where_.erase(s.key);
        s = slot{};
        st_.evictions++;
    }
    return best;
}

void expert_cache::count_use(int layer, int expert) {
    use_history & h = layers_[layer].uses[expert];
    if (h.n == HISTORY) {
        std::copy(h.at + 1, h.at + HISTORY, h.at);
        h.n--;
    }
    h.at[h.n++] = tick_;
    if (h.n < 2) return;
    // the intervals; where they repeat with lag p, the next is the one p back, else their mean
    const int m = h.n - 1;
    uint64_t iv[HISTORY - 1];
    for (int i = 0; i < m; ++i) iv[i] = h.at[i + 1] - h.at[i];
    h.next = (double) h.at[m] + (double) (h.at[m] - h.at[0]) / m;
    for (int p = 1; p < m; ++p) {
        bool repeats = true;
        for (int i = p; i < m && repeats; ++i) repeats = iv[i] == iv[i - p];
        if (repeats) { h.next = (double) (h.at[m] + iv[m - p]); break; }
    }
}

void expert_cache::set_layer(int layer, int n_expert, const std::vector<part> & parts) {
    if (layer < 0 || n_expert < 1 || n_expert > 65535) throw Error("expert cache: bad layer or expert count");
    for (const auto & q : parts) {
        if (q.slot_offset + q.size > slot_size_) throw Error("expert cache: an expert part does not fit the slot");
    }
    // O_DIRECT reads each part from its file offset rounded down to whole blocks: the lead before it lands
    // in front of it in the slot, so the part's region [slot_offset - lead, + rounded size) must be aligned,
    // inside the slot and apart from the other parts', for every expert (a stride of whole blocks)
    bool direct = true;
    std::vector<std::pair<size_t, size_t>> regions;
    for (const auto & q : parts) {
        const size_t lead = q.file_offset % DIRECT_ALIGN;
        const size_t span = (lead + q.size + DIRECT_ALIGN - 1) / DIRECT_ALIGN * DIRECT_ALIGN;
        if (q.stride % DIRECT_ALIGN || q.slot_offset % DIRECT_ALIGN != lead || q.slot_offset - lead + span > slot_size_) {
            direct = false;
            break;
        }
        regions.push_back({q.slot_offset - lead, q.slot_offset - lead + span});
    }
    std::sort(regions.begin(), regions.end());
    for (size_t i = 1; direct && i < regions.size(); ++i) direct = regions[i].first >= regions[i - 1].second;
    if ((int) layers_.size() <= layer) layers_.resize(layer + 1);
    layers_[layer] = {n_expert, parts, direct && p_.direct, direct && want_direct_, std::vector<use_history>(n_expert)};
}

bool expert_cache::layer_direct(int layer) const {
    return layer >= 0 && layer < (int) layers_.size() && layers_[layer].direct && io_->direct();
}

const expert_cache::layer_info & expert_cache::layer_of(int layer, int expert) const {
    if (layer < 0 || layer >= (int) layers_.size() || layers_[layer].n_expert == 0) {
        throw Error("expert cache: layer " + std::to_string(layer) + " was not set");
    }
    const auto & L = layers_[layer];
    if (expert < 0 || expert >= L.n_expert) {
        throw Error("expert cache: expert " + std::to_string(expert) + " out of range for layer " + std::to_string(layer));
    }
    return L;
}

void expert_cache::start_load(int i, int layer, int expert) {
    const auto & L = layer_of(layer, expert);
    load_job job;
    job.key = key(layer, expert);
    job.dst = buf_;
    size_t n = 0;
    job.direct = L.direct;
    for (const auto & q : L.parts) {
        const uint64_t off = q.file_offset + (uint64_t) expert * q.stride;
        const size_t dst = pad_ + (size_t) i * slot_size_ + q.slot_offset;
        job.ranges.push_back(part_read(off, q.size, dst, L.direct));
        n += q.size;
    }
    if (tier_) tier_take(job, L, (uint64_t) expert, pad_ + (size_t) i * slot_size_, n);
    else st_.file_bytes += n;
    if (job.direct && io_->direct()) st_.direct_loads++;
    slot & s = slots_[i];
    s.key = job.key;
    s.load = io_->submit(std::move(job)).done;
    where_[s.key] = i;
    st_.bytes_loaded += n;
}

std::vector<int> expert_cache::map(int layer, const int32_t * ids, size_t n, int32_t * out, bool held_only) {
    std::vector<int> pinned;
    std::unordered_map<int, int> slot_of;   // expert -> slot, this call
    ++tick_;
    auto unpin = [&] { for (int i : pinned) slots_[i].pins--; };
    try {
        // the experts held are pinned first, so that loading the others never evicts one this call uses
        for (int pass = 0; pass < 2; ++pass) {
            for (size_t j = 0; j < n; ++j) {
                const int e = ids[j];
                if (slot_of.count(e)) continue;
                layer_of(layer, e);
                auto it = where_.find(key(layer, e));
                const bool hit = it != where_.end();
                if (hit != (pass == 0)) continue;
                if (!hit && held_only) {
                    st_.host_misses++;
                    count_use(layer, e);
                    slot_of[e] = -1;
                    continue;
                }
                const int i = hit ? it->second : take_slot();
                if (i < 0) {
                    throw Error("the expert cache has " + std::to_string(active_) + " slots, fewer than the " +
                                "experts one pass routes to: give it more memory (expert_cache)");
                }
                if (!hit) start_load(i, layer, e);
                slot & s = slots_[i];
                if (hit) { st_.hits++; if (s.prefetched) st_.prefetch_hits++; } else { st_.misses++; }
                s.prefetched = false;
                s.pins++;
                s.last_use = ++clock_;
                count_use(layer, e);
                pinned.push_back(i);
                slot_of[e] = i;
            }
        }
        for (int i : pinned) wait(i);
        for (auto & s : slots_) {   // this layer's prefetches that missed lose their protection
            if (s.prefetched && s.key >= 0 && s.key / 65536 == layer) s.prefetched = false;
        }
    } catch (...) {
        unpin();
        throw;
    }
    for (size_t j = 0; j < n; ++j) out[j] = slot_of[ids[j]];
    return pinned;
}

void expert_cache::wait(int i) {
    slot & s = slots_.at(i);
    if (!s.load.valid()) return;
    try {
        s.load.get();
    } catch (...) {
        where_.erase(s.key);
        const int pins = s.pins;
        s = slot{};
        s.pins = pins;       // the caller still releases it
        throw;
    }
    s.load = {};
}

void expert_cache::set_active(int n) {
    if (n < 1 || n > (int) slots_.size()) throw Error("expert cache: set_active out of range");
    for (int i = n; i < active_; ++i) {
        if (slots_[i].pins) throw Error("expert cache: a slot to set aside is pinned");
    }
    for (int i = n; i < active_; ++i) {
        slot & s = slots_[i];
        if (s.load.valid()) { try { s.load.get(); } catch (...) {} }
        if (s.key >= 0) { where_.erase(s.key); st_.evictions++; }
        s = slot{};
    }
    if (n < active_ && ggml_backend_buffer_is_host(buf_)) {
        const uintptr_t page = (uintptr_t) sysconf(_SC_PAGESIZE);
        const auto base = (uintptr_t) ggml_backend_buffer_get_base(buf_) + pad_;
        const uintptr_t lo = (base + (size_t) n * slot_size_ + page - 1) / page * page;
        const uintptr_t hi = (base + (size_t) active_ * slot_size_) / page * page;
        if (hi > lo) madvise((void *) lo, hi - lo, MADV_DONTNEED);   // advice: a failure only keeps the pages
    }
    active_ = n;
}

void expert_cache::release(const std::vector<int> & slots) {
    for (int i : slots) {
        slot & s = slots_.at(i);
        if (s.pins <= 0) throw Error("release of an expert cache slot that is not pinned");
        s.pins--;
    }
}

int expert_cache::prefetch(int layer, const std::vector<int> & experts) {
    int started = 0;
    for (int e : experts) {
        layer_of(layer, e);
        if (where_.count(key(layer, e))) continue;
        const int i = take_slot(expected(key(layer, e)));
        if (i < 0) continue;
        start_load(i, layer, e);
        slots_[i].prefetched = true;
        slots_[i].last_use = ++clock_;
        st_.prefetches++;
        started++;
    }
    return started;
}

void expert_cache::bind_view(ggml_tensor * t, size_t offset) const {
    if (t->ne[2] != (int64_t) slots_.size() + p_.zero_slots || t->ne[3] != 1) {
        throw Error("expert view: ne[2] must be n_slots + zero_slots");
    }
    if (offset + ggml_row_size(t->type, t->ne[0]) * (size_t) t->ne[1] > slot_size_) {
        throw Error("expert view: the matrix does not fit the slot at that offset");
    }
    // a GPU's kernels take the expert stride in whole blocks of the type (ggml-cuda: nb[2] / type size)
    if ((!ggml_backend_buffer_is_host(buf_) || io_->staged()) && slot_size_ % ggml_type_size(t->type) != 0) {
        throw Error("expert view: the slot (" + std::to_string(slot_size_) + " bytes) is not a multiple of " +
                    ggml_type_name(t->type) + "'s block (" + std::to_string(ggml_type_size(t->type)) + " bytes)");
    }
    t->nb[2] = slot_size_;
    t->nb[3] = slot_size_ * (size_t) t->ne[2];
    tensor_bind(t, buf_, static_cast<char *>(ggml_backend_buffer_get_base(buf_)) + pad_ + offset);
}

expert_cache_stats expert_cache::stats() const {
    expert_cache_stats s = st_;
    s.n_slots = (int) slots_.size();
    s.n_active = active_;
    s.slot_size = slot_size_;
    s.tier_slots = tier_ ? tier_->n_slots() : 0;
    for (const auto & x : slots_) if (x.key >= 0) s.slots_used++;
    return s;
}

}  // namespace superggml
