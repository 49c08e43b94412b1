// expert-cache: the experts of a mixture-of-experts model, paged one by one.
//
// One backend buffer of n_slots * slot_size bytes; a slot holds one expert
// of one layer (its gate, up and down matrices at fixed offsets inside the
// slot), so a 3-D tensor view with nb[2] = slot_size over the buffer is an
// expert tensor whose "experts" are the slots (bind_view): ggml_mul_mat_id
// reads it with ids remapped to slots. map(layer, ids) finds each expert's
// slot (a hit) or takes one (a free slot, else an unpinned one by the
// eviction rule below) and reads the expert's parts
// into it on the prefetcher's workers, then waits for them; the slots stay
// pinned until release(). A failed read empties its slot and is rethrown.
// prefetch() starts loads without pinning. Driven by one thread; the reads
// run on the workers.
// With `direct` (host slots), a layer whose parts keep the file's alignment
// (a stride of whole DIRECT_ALIGN blocks, and a slot offset congruent to the
// file offset modulo DIRECT_ALIGN, with room for the widened read: see
// direct_layout) is read with O_DIRECT, bypassing the page cache; other
// layers, and files O_DIRECT cannot open, read buffered.
//
// Eviction: the expert expected back farthest ahead (Belady's rule on a
// forecast). Time counts map() calls. Each (layer, expert) keeps its last
// HISTORY uses, evicted or not; its next use is forecast from their
// intervals: where the intervals repeat with some lag (a repeated text walks
// its experts in a cycle), the interval that lag back; else their mean. A
// forecast overdue by twice its interval is pushed out as far as the expert
// has been away. Experts used once are expected later than any with a
// forecast, and those never used (guesses) later still; among equals, the
// one used last goes first, so a cycle longer than the cache keeps a fixed
// part of itself where least-recently-used would miss every time.
// Prefetched experts not yet used are evicted only when nothing else is
// free, and a prefetch never evicts an expert expected back sooner than its
// own; a map() of a layer ends the protection of its prefetches that missed.
//
// The host tier (host_slots > 0, slots that are not host memory or a staged
// prefetcher): a buffer_pool of host slots (the device's pinned host memory
// where it has one), keyed by expert. A load takes the expert's host slot: a
// filled one is copied to the device slot without a file read; an empty one
// is read into (O_DIRECT where the layer's layout allows, several reads in
// flight) and copied on, and is filled once the load succeeds. The load holds
// its host slot until it ends; a failed load empties it.
//
// set_active(n) sets the slots past the first n aside: their experts are
// evicted, no load takes them, and on host memory their pages are returned
// to the system (MADV_DONTNEED) until set_active gives them back.
//
// Zero slots (zero_slots > 0): slots past the n_slots that no load ever
// takes, left zeroed, for the positions of a map() whose experts are computed
// elsewhere. ggml-cuda's mul_mat_id wants each row's ids distinct (its
// grouping of rows by expert keeps one of a repeated id and leaves the other's
// index unset); a zero slot is an expert that computes 0, distinct from every
// loaded one. The views span n_slots + zero_slots.
#pragma once

#include "error.h"
#include "buffer-pool.h"
#include "prefetch.h"

#include <cstddef>
#include <cstdint>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

struct ggml_tensor;
struct ggml_backend_buffer;
struct ggml_backend_buffer_type;

namespace superggml {

struct expert_cache_params {
    int n_slots = 1;
    size_t slot_size = 0;                       // bytes per slot (rounded up to the buffer alignment)
    ggml_backend_buffer_type * buft = nullptr;  // nullptr: CPU
    bool direct = false;                        // O_DIRECT reads where a layer's layout allows (host slots)
    int host_slots = 0;                         // a host tier of this many experts (device or staged slots)
    int zero_slots = 0;                         // zeroed slots after the n_slots, never loaded (see above)
};

struct expert_cache_stats {
    uint64_t hits = 0, misses = 0;        // acquires that found the expert / had to load it
    uint64_t prefetches = 0;              // loads started by prefetch()
    uint64_t prefetch_hits = 0;           // acquires served by a prefetched load
    uint64_t evictions = 0;
    uint64_t bytes_loaded = 0;            // expert bytes (without the widening of direct reads)
    uint64_t direct_loads = 0;            // loads read with O_DIRECT (where the file system allowed it)
    uint64_t host_misses = 0;             // experts a held_only map() left to the caller (not loaded)
    uint64_t tier_hits = 0;               // loads copied from the host tier (no file read)
    uint64_t tier_bytes = 0, file_bytes = 0;   // expert bytes copied from the host tier / read from the file
    int tier_slots = 0;
    int n_slots = 0, slots_used = 0, n_active = 0;
    size_t slot_size = 0;
};

class expert_cache {
public:
    // Allocates the slots. Throws Error naming the bytes if that fails.
    expert_cache(const expert_cache_params & params, std::shared_ptr<prefetcher> io);
    ~expert_cache();   // waits for loads in flight
    expert_cache(const expert_cache &) = delete;
    expert_cache & operator=(const expert_cache &) = delete;

    // Where layer `layer`'s experts are in the file: expert e of part j is `size` bytes at
    // file_offset + e * stride, stored at slot_offset inside a slot. Call once per layer before map().
    struct part { uint64_t file_offset; size_t stride; size_t size; size_t slot_offset; };
    // Throws Error if a part does not fit the slot.
    void set_layer(int layer, int n_expert, const std::vector<part> & parts);
    // Whether layer's loads read with O_DIRECT (direct, host slots, and its parts' layout allows it).
    bool layer_direct(int layer) const;

    // The slots of layer's experts ids[0..n) (each in [0, n_expert)), loaded and pinned: out[i] is the slot of
    // ids[i]. The distinct experts held are pinned first, then the others' loads started (so none of this
    // call's experts is evicted for another), then all loads are waited for. Returns the pinned slots, one per
    // distinct expert, for release(). Throws Error for an id out of range or when the distinct experts
    // outnumber the slots that can be pinned; rethrows a failed read.
    // held_only: the experts not held are not loaded (out[i] = -1, counted as used and in host_misses): the caller
    // computes them elsewhere.
    std::vector<int> map(int layer, const int32_t * ids, size_t n, int32_t * out, bool held_only = false);
    void release(const std::vector<int> & slots);
    // Only slots [0, n) hold experts from now on (1 <= n <= n_slots); the others are emptied and, on host
    // memory, their whole pages released. Throws Error when one of them is pinned or n is out of range.
    void set_active(int n);
    int n_active() const { return active_; }
    // Starts loading layer's experts that are not held; returns how many were started (no slot free: fewer).
    int prefetch(int layer, const std::vector<int> & experts);
    bool holds(int layer, int expert) const { return where_.count(key(layer, expert)) != 0; }

    // Points `t` (ne[2] == n_slots + zero_slots) into the buffer at `offset` inside slot 0, with nb[2] = slot_size.
    void bind_view(ggml_tensor * t, size_t offset) const;

    expert_cache_stats stats() const;
    size_t slot_size() const { return slot_size_; }
    int n_slots() const { return (int) slots_.size(); }
    int zero_slots() const { return p_.zero_slots; }   // slots n_slots() .. n_slots() + zero_slots() - 1

private:
    struct slot {
        int key = -1;
        int pins = 0;
        bool prefetched = false;          // loaded by prefetch() and not used since
        uint64_t last_use = 0;
        std::shared_future<void> load;
    };
    static constexpr int HISTORY = 8;
    struct use_history {
        uint64_t at[HISTORY] = {};        // map() ticks of the last uses, oldest first
        int n = 0;
        double next = 0;                  // the forecast next use (n >= 2)
    };
    struct layer_info {
        int n_expert = 0;
        std::vector<part> parts;
        bool direct = false;              // O_DIRECT into the slots
        bool aligned = false;             // the parts' layout allows O_DIRECT (into the host tier's slots)
        std::vector<use_history> uses;
    };
    static int key(int layer, int expert) { return layer * 65536 + expert; }
    void count_use(int layer, int expert);
    // When the expert is expected back, as of now: larger is evicted first.
    double expected(int k) const;
    // A free slot, else the victim of the eviction rule (its old key dropped); -1 if none. With a limit (a
    // prefetch), only a victim expected back no sooner than `limit`, and never a prefetch not yet used.
    int take_slot(double limit = -1);
    void start_load(int i, int layer, int expert);
    void wait(int i);                     // its bytes are there (rethrows a failed read, emptying the slot)
    // The job reads through its expert's host slot, if the tier has one to give: then `n` bytes are counted.
    void tier_take(load_job & job, const layer_info & L, uint64_t expert, size_t dst, size_t n);
    const layer_info & layer_of(int layer, int expert) const;

    expert_cache_params p_;
    bool want_direct_ = false;            // direct as asked (O_DIRECT into the host tier where layouts allow)
    std::shared_ptr<prefetcher> io_;
    ggml_backend_buffer * buf_ = nullptr;
    size_t pad_ = 0;                      // bytes from the buffer's base to slot 0 (DIRECT_ALIGN-aligned if direct)
    size_t slot_size_ = 0;
    std::vector<slot> slots_;
    int active_ = 0;                      // slots [0, active_) take experts
    std::unordered_map<int, int> where_;  // key -> slot
    std::vector<layer_info> layers_;
    uint64_t clock_ = 0;                  // orders uses (ties of expected())
    uint64_t tick_ = 0;                   // map() calls
    expert_cache_stats st_;
    std::unique_ptr<buffer_pool> tier_;   // the host tier, or none
    std::mutex tier_mu_;
    std::unordered_set<int> tier_filled_; // keys whose host slot holds their bytes (the workers' done writes it)
};

}  // namespace superggml
