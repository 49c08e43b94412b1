// layer-pager: groups of paged tensors ("layers": a transformer block, a row
// chunk of the lm head) streamed from the GGUF file through a buffer pool.
#pragma once

#include "buffer-pool.h"
#include "prefetch.h"
#include "weight-store.h"

#include <atomic>
#include <future>
#include <memory>
#include <string>
#include <vector>

struct ggml_backend_buffer_type;

namespace superggml {

// Bytes one slot of `buft` (nullptr: CPU) needs to hold `names`: back to
// back at the buffer alignment, or with `direct` (host buffers) in the file's
// own layout widened to O_DIRECT alignment. Throws GGUFError for an unknown name.
size_t layer_slot_bytes(const weight_store & store, const std::vector<std::string> & names,
                        ggml_backend_buffer_type * buft, bool direct = false);

struct pager_params {
    int n_slots = 1;
    size_t slot_size = 0;                      // 0: the largest layer
    int n_workers = 1;
    ggml_backend_buffer_type * buft = nullptr; // nullptr: CPU
    bool direct_io = false;                    // O_DIRECT reads into host slots (file layout, no page cache)
    bool staged = false;                       // host slots too go through staging + async copies (the device path)
    int host_slots = 0;                        // a host tier of this many layers between the file and a staged pool
    range_writer writer;                       // staged loads' writer (remote.h; none: every range is read)
};

struct pager_stats {
    uint64_t loads = 0, hits = 0, evictions = 0, bytes_loaded = 0;
    uint64_t host_hits = 0, host_bytes = 0;    // loads copied from the host tier, and their bytes (no file read)
    uint64_t file_bytes = 0;                   // bytes loads read from the file
    double wait_seconds = 0;                   // time acquire() blocked on I/O
};

// Streams groups of paged tensors ("layers") through a buffer pool.
//
// Each layer's tensors are laid out in one slot: back to back (buffer
// alignment), or with direct_io in the file's layout so O_DIRECT can read
// runs of them straight into the slot. prefetch(l) starts loading l into a slot in the background;
// acquire(l) waits for l's bytes and binds its tensors to the slot (a pointer
// swap); release(l) lets the slot be evicted again; pin(l) keeps l resident.
// When a slot is reused its old layer's tensors are unbound, so a stale
// binding can never be computed. Errors of a load (short read, I/O error)
// are thrown by acquire(). Not for concurrent callers: one executor drives it.
//
// The buffer pool (keyed by layer index) is the one record of where a layer
// is, its holds and its pin; the pager keeps no copies. A layer in a slot but
// not bound yet is loading (or loaded) ahead of use: one of its slot's holds
// is that prefetch's, taken by prefetch() and handed to the first acquire(),
// so the slot cannot be evicted under the load. A pin lives on the slot:
// pin(l) of a layer that is not resident loads and binds it first, and a
// pinned slot is never evicted, so no pin outlives its slot.
//
// The host tier (host_slots > 0, staged pools only): a second pool, of host
// memory (the device's pinned host buffers where it has them), keyed by
// layer too. A load takes the layer's host slot: a filled one is copied to
// the device slot without a file read; an empty one is read into from the
// file and copied on from there, and is filled once that load succeeds. Once
// every host slot holds a layer, a layer without one is read from the file
// past the tier: nothing is evicted (passes read the blocks in a cycle, and
// LRU would drop each one before its reuse). The load holds its host slot
// until it ends, so the tier never evicts a copy in use; a failed load
// empties it. With direct_io the tier's slots take the
// file's layout (widened to O_DIRECT alignment): a layer is read into its host
// slot with O_DIRECT, several reads in flight, and copied tensor by tensor to
// the device slot; its bytes never pass through the page cache.
class layer_pager {
public:
    // Throws Error naming the bytes needed if a layer does not fit a slot.
    layer_pager(std::shared_ptr<weight_store> store, const std::vector<std::vector<std::string>> & layers,
                const pager_params & params);
    ~layer_pager();

    int n_layers() const { return (int) layers_.size(); }
    bool direct_io() const { return (direct_ || tier_direct_) && io_->direct(); }   // O_DIRECT reads in use
    bool staged() const { return io_->staged() || !pool_->is_host(); }
    int host_slots() const { return host_ ? host_->n_slots() : 0; }
    size_t host_bytes() const { return host_ ? host_->bytes() : 0; }
    size_t layer_bytes(int l) const { return layers_.at(l).bytes; }
    const buffer_pool & pool() const { return *pool_; }
    const weight_store & store() const { return *store_; }
    // Layer l's tensors (bound to its slot between acquire and release).
    const std::vector<ggml_tensor *> & tensors(int l) const { return layers_.at(l).tensors; }

    // False (and nothing done) if no slot can be had right now.
    bool prefetch(int l, int priority = 0);
    void acquire(int l);
    void release(int l);
    void pin(int l);
    void unpin(int l);            // l stays in its slot but may be evicted again
    bool pinned(int l) const;
    bool resident(int l) const;   // bytes are in a slot (loaded or loading)

    // Frees one slot's memory (an empty slot first, else the least recently
    // used unpinned one, whose layer is unbound). False if every slot is in
    // use or pinned.
    bool shrink();
    // Allocates one more slot. Throws Error naming the bytes on failure.
    void grow();

    pager_stats stats() const;
    prefetch_stats io_stats() const { return io_->stats(); }
    bool last_load(int l, double & start, double & end) const { return io_->last_job(l, start, end); }

private:
    struct layer {
        std::vector<ggml_tensor *> tensors;
        std::vector<size_t> offsets;   // in the slot
        std::vector<read_range> ranges;
        size_t bytes = 0;
        std::vector<read_range> host_ranges;   // tier_direct_: the reads that fill its host slot (file layout)
        std::vector<size_t> host_offsets;      // tier_direct_: each tensor in its host slot
        bool bound = false;            // tensors point into the slot (loaded, acquired since)
        std::shared_future<void> ready;
    };
    int slot_of(int l) const;          // the pool's slot holding l, -1 if none
    void on_evict(int key);
    void settle(layer & L);            // wait for an in-flight load, swallowing its error
    void host_take(int l, load_job & job);   // the job reads through l's host slot, if one can be had

    std::shared_ptr<weight_store> store_;
    bool direct_ = false;                                   // host slots in the file's layout, O_DIRECT reads
    bool tier_direct_ = false;                              // host tier slots in it (a staged pool with a tier)
    std::vector<layer> layers_;
    std::unique_ptr<buffer_pool> pool_;
    std::unique_ptr<buffer_pool> host_;                     // the host tier, or none
    std::unique_ptr<std::atomic<bool>[]> host_filled_;      // per layer: its host slot holds its bytes
    std::unique_ptr<prefetcher> io_;
    pager_stats stats_;
};

}  // namespace superggml
