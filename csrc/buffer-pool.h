// buffer-pool: a fixed set of equal-size slots on one backend buffer type.
//
// A slot holds one layer's bytes. acquire(key) returns the slot already
// holding `key` (a hit) or takes a free slot, else evicts the least recently
// used slot that is neither in use nor pinned. The pool allocates exactly
// n_slots * slot_size bytes at construction; shrink() frees a slot's buffer
// and grow() allocates one again, so the bytes held are always
// n_slots() * slot_size(). Slot indices stay stable across both. The pool
// is the one record of which key a slot holds, how many holds it has (in
// use) and whether it is pinned: its users ask it rather than keep copies.
// Thread safe.
#pragma once

#include "error.h"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

struct ggml_backend_buffer;
struct ggml_backend_buffer_type;

namespace superggml {

// No slot can be given: every slot is in use or pinned.
struct PoolExhausted : Error {
    using Error::Error;
};

// A view's hold on its slot is over: the slot was released (its last hold),
// given to another key, dropped or shrunk since the view was made.
struct SlotReleased : Error {
    using Error::Error;
};

struct pool_params {
    size_t slot_size = 0;                     // bytes per slot (rounded up to the buffer alignment)
    int n_slots = 1;
    ggml_backend_buffer_type * buft = nullptr; // nullptr: CPU
    // Host slots start at a multiple of this (and their size is one): 4096
    // lets O_DIRECT read into them. 0: the buffer type's own alignment.
    // Ignored for device buffer types.
    size_t align = 0;
};

struct pool_stats {
    uint64_t hits = 0, misses = 0, evictions = 0;
};

class buffer_pool {
public:
    // Allocates the slots. Throws Error naming the bytes if the allocation fails.
    explicit buffer_pool(const pool_params & params);
    ~buffer_pool();
    buffer_pool(const buffer_pool &) = delete;
    buffer_pool & operator=(const buffer_pool &) = delete;

    int n_slots() const;          // slots with memory
    size_t slot_size() const { return slot_size_; }
    size_t bytes() const { return slot_size_ * n_slots(); }
    bool is_host() const { return is_host_; }

    struct acquired {
        int slot;
        bool hit;      // the slot already holds `key`'s bytes (loaded or loading)
        int evicted;   // key whose bytes were dropped to make room, or -1
    };
    // Marks the slot in use (a count: acquire twice, release twice).
    // Throws PoolExhausted if nothing can be evicted, or (evict false) if
    // `key` has no slot and none is empty: a cache read in cycles larger than
    // it keeps what it holds instead of evicting each key before its reuse.
    acquired acquire(int key, bool evict = true);
    void release(int slot);
    void set_pinned(int slot, bool pinned);
    // Drops `key` from its slot if the slot is not in use; returns whether it did.
    bool drop(int key);

    // Frees the memory of one slot that is neither in use nor pinned (an
    // empty one first, else the least recently used) and sets `evicted` to
    // the key it held (-1 if none). False if every slot is in use or pinned.
    bool shrink(int & evicted);
    // Allocates one more slot; returns its index. Throws Error naming the
    // bytes if the allocation fails.
    int grow();

    int slot_of(int key) const;   // -1 if not held
    int key_of(int slot) const;   // -1 if empty
    int in_use(int slot) const;
    bool pinned(int slot) const;

    ggml_backend_buffer * buffer(int slot) const;   // nullptr for a shrunk slot
    uint8_t * base(int slot) const;  // host address of the slot; nullptr if not host memory

    // A host view of a held slot: its address and size, valid while the
    // hold it was made under lasts. Each slot has a generation that moves on
    // when its last hold is released and when it is dropped, handed to
    // another key or shrunk; a view remembers the generation it saw.
    struct view_t {
        int slot = -1;
        uint64_t gen = 0;
        size_t size = 0;
    };
    // Throws Error if the slot is not in use or has no memory.
    view_t view(int slot) const;
    bool view_valid(const view_t & v) const;
    // The view's bytes (the buffer's base address: a device address for
    // device slots); throws SlotReleased (never returns freed or reused
    // memory) once the view is no longer valid.
    uint8_t * view_data(const view_t & v) const;

    pool_stats stats() const;

private:
    struct slot {
        ggml_backend_buffer * buf = nullptr;
        void * mem = nullptr;   // the memory of an aligned host slot (buf wraps it), else nullptr
        int key = -1;
        int in_use = 0;
        bool pinned = false;
        uint64_t last_use = 0;
        uint64_t gen = 0;   // moves on when the slot's holds end or its bytes change owner
    };
    ggml_backend_buffer * alloc_slot(slot & s);
    static void free_slot(slot & s);
    int victim() const;   // an empty slot, else the LRU one neither in use nor pinned; -1 if none (mu_ held)

    mutable std::mutex mu_;
    ggml_backend_buffer_type * buft_ = nullptr;
    std::vector<slot> slots_;   // a shrunk slot has buf == nullptr
    size_t slot_size_ = 0;
    size_t align_ = 0;          // > the buffer type's alignment: host slots allocated here, aligned
    bool is_host_ = true;
    uint64_t clock_ = 0;
    pool_stats stats_;
};

}  // namespace superggml
