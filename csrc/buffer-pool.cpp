#include "buffer-pool.h"

#include "ggml-backend.h"
#include "ggml-cpu.h"

#include <cstdlib>
#include <string>

#ifdef __GLIBC__
#include <malloc.h>
#endif

namespace superggml {

buffer_pool::buffer_pool(const pool_params & p) {
    if (p.n_slots < 1) throw Error("buffer pool needs at least one slot");
    if (p.slot_size == 0) throw Error("buffer pool slot size must be > 0");
    ggml_backend_buffer_type * buft = p.buft ? p.buft : ggml_backend_cpu_buffer_type();
    is_host_ = ggml_backend_buft_is_host(buft);
    size_t align = ggml_backend_buft_get_alignment(buft);
    if (is_host_ && p.align > align) {
        if (p.align & (p.align - 1)) throw Error("buffer pool alignment must be a power of two");
        align_ = align = p.align;
    }
    slot_size_ = (p.slot_size + align - 1) / align * align;
    buft_ = buft;
    slots_.resize(p.n_slots);
    for (auto & s : slots_) {
        s.buf = alloc_slot(s);
        if (!s.buf) {
            for (auto & t : slots_) free_slot(t);
            slots_.clear();
            throw Error("cannot allocate buffer pool slot " + std::to_string(&s - slots_.data()) + " of " +
                        std::to_string(slot_size_) + " bytes on " + ggml_backend_buft_name(buft));
        }
    }
}

buffer_pool::~buffer_pool() {
    for (auto & s : slots_) free_slot(s);
}

ggml_backend_buffer * buffer_pool::alloc_slot(slot & s) {
    ggml_backend_buffer * b = nullptr;
    if (align_) {
        if (posix_memalign(&s.mem, align_, slot_size_) != 0) {
            s.mem = nullptr;
            return nullptr;
        }
        b = ggml_backend_cpu_buffer_from_ptr(s.mem, slot_size_);
        if (!b) {
            free(s.mem);
            s.mem = nullptr;
        }
    } else {
        b = ggml_backend_buft_alloc_buffer(buft_, slot_size_);
    }
    if (b) ggml_backend_buffer_set_usage(b, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    return b;
}

void buffer_pool::free_slot(slot & s) {
    if (s.buf) ggml_backend_buffer_free(s.buf);
    free(s.mem);   // a buffer from ggml_backend_cpu_buffer_from_ptr does not own its memory
    s.buf = nullptr;
    s.mem = nullptr;
}

int buffer_pool::n_slots() const {
    std::lock_guard<std::mutex> lk(mu_);
    int n = 0;
    for (const auto & s : slots_) n += s.buf != nullptr;
    return n;
}

int buffer_pool::victim() const {
    int best = -1;
    for (int i = 0; i < (int) slots_.size(); ++i) {
        const slot & s = slots_[i];
        if (!s.buf || s.in_use || s.pinned) continue;
        if (s.key < 0) return i;
        if (best < 0 || s.last_use < slots_[best].last_use) best = i;
    }
    return best;
}

bool buffer_pool::shrink(int & evicted) {
    std::lock_guard<std::mutex> lk(mu_);
    const int best = victim();
    if (best < 0) return false;
    slot & s = slots_[best];
    evicted = s.key;
    if (evicted >= 0) stats_.evictions++;
    free_slot(s);
    const uint64_t gen = s.gen + 1;
    s = slot{};
    s.gen = gen;
#ifdef __GLIBC__
    if (is_host_) malloc_trim(0);   // hand the freed pages back to the system now
#endif
    return true;
}

int buffer_pool::grow() {
    std::lock_guard<std::mutex> lk(mu_);
    int i = 0;
    while (i < (int) slots_.size() && slots_[i].buf) ++i;
    if (i == (int) slots_.size()) slots_.emplace_back();
    slots_[i].buf = alloc_slot(slots_[i]);
    if (!slots_[i].buf) {
        throw Error("cannot allocate buffer pool slot " + std::to_string(i) + " of " +
                    std::to_string(slot_size_) + " bytes on " + ggml_backend_buft_name(buft_));
    }
    return i;
}

buffer_pool::acquired buffer_pool::acquire(int key, bool evict) {
    std::lock_guard<std::mutex> lk(mu_);
    ++clock_;
    for (int i = 0; i < (int) slots_.size(); ++i) {
        if (slots_[i].key == key) {
            slots_[i].in_use++;
            slots_[i].last_use = clock_;
            stats_.hits++;
            return {i, true, -1};
        }
    }
    const int best = victim();
    if (best < 0) {
        int live = 0;
        for (const auto & t : slots_) live += t.buf != nullptr;
        throw PoolExhausted("all " + std::to_string(live) + " pool slots are in use or pinned");
    }
    if (!evict && slots_[best].key >= 0) throw PoolExhausted("no empty slot");
    slot & s = slots_[best];
    int evicted = s.key;
    if (evicted >= 0) stats_.evictions++;
    stats_.misses++;
    s.key = key;
    s.in_use = 1;
    s.last_use = clock_;
    s.gen++;
    return {best, false, evicted};
}

void buffer_pool::release(int i) {
    std::lock_guard<std::mutex> lk(mu_);
    slot & s = slots_.at(i);
    if (s.in_use <= 0) throw Error("release of slot " + std::to_string(i) + " that is not in use");
    if (--s.in_use == 0) s.gen++;
}

void buffer_pool::set_pinned(int i, bool pinned) {
    std::lock_guard<std::mutex> lk(mu_);
    slots_.at(i).pinned = pinned;
}

bool buffer_pool::drop(int key) {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto & s : slots_) {
        if (s.key == key && s.in_use == 0) {
            s.key = -1;
            s.pinned = false;
            s.gen++;
            return true;
        }
    }
    return false;
}

int buffer_pool::slot_of(int key) const {
    std::lock_guard<std::mutex> lk(mu_);
    for (int i = 0; i < (int) slots_.size(); ++i) if (slots_[i].key == key) return i;
    return -1;
}

int buffer_pool::key_of(int i) const {
    std::lock_guard<std::mutex> lk(mu_);
    return slots_.at(i).key;
}

int buffer_pool::in_use(int i) const {
    std::lock_guard<std::mutex> lk(mu_);
    return slots_.at(i).in_use;
}

bool buffer_pool::pinned(int i) const {
    std::lock_guard<std::mutex> lk(mu_);
    return slots_.at(i).pinned;
}

ggml_backend_buffer * buffer_pool::buffer(int i) const {
    std::lock_guard<std::mutex> lk(mu_);
    return slots_.at(i).buf;
}

uint8_t * buffer_pool::base(int i) const {
    ggml_backend_buffer * b = buffer(i);
    return is_host_ && b ? static_cast<uint8_t *>(ggml_backend_buffer_get_base(b)) : nullptr;
}

buffer_pool::view_t buffer_pool::view(int i) const {
    std::lock_guard<std::mutex> lk(mu_);
    const slot & s = slots_.at(i);
    if (s.in_use <= 0) throw Error("slot " + std::to_string(i) + " is not held: acquire it before viewing it");
    if (!s.buf) throw Error("slot " + std::to_string(i) + " has no memory (the pool was shrunk)");
    return {i, s.gen, slot_size_};
}

bool buffer_pool::view_valid(const view_t & v) const {
    std::lock_guard<std::mutex> lk(mu_);
    if (v.slot < 0 || v.slot >= (int) slots_.size()) return false;
    const slot & s = slots_[v.slot];
    return s.buf && s.in_use > 0 && s.gen == v.gen;
}

uint8_t * buffer_pool::view_data(const view_t & v) const {
    std::lock_guard<std::mutex> lk(mu_);
    const slot * s = v.slot >= 0 && v.slot < (int) slots_.size() ? &slots_[v.slot] : nullptr;
    if (!s || !s->buf || s->in_use <= 0 || s->gen != v.gen) {
        throw SlotReleased("slot " + std::to_string(v.slot) + " was released since this view was made");
    }
    return static_cast<uint8_t *>(ggml_backend_buffer_get_base(s->buf));
}

pool_stats buffer_pool::stats() const {
    std::lock_guard<std::mutex> lk(mu_);
    return stats_;
}

}  // namespace superggml
