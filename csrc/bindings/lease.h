// lease: a hold on memory that superggml lends to Python (a pool slot, a
// pager layer, a KV frame), with zero-copy views of it.
//
// Host memory is exported through the buffer protocol (memoryview,
// numpy.asarray) and __dlpack__ (numpy, torch), read-only or writable as the
// lease was taken. Every export is counted: release() raises BufferError while
// one is alive, so no view outlives the hold, and after release() (or once the
// owner took the memory back: `alive` is false) making a view raises
// SlotReleased. Tensors made by tensor() are unbound at release, so a graph
// built on them fails instead of reading another owner's bytes. Device memory
// has no host view, only tensors. Driven under the GIL (one Python thread at a
// time); the owners it calls are thread safe.
#pragma once

#include "bindings.h"

#include <functional>
#include <future>
#include <memory>
#include <string>
#include <vector>

struct ggml_backend_buffer;

namespace superggml {

struct lease {
    std::shared_ptr<void> owner;              // keeps the memory's owner alive
    ggml_backend_buffer * buffer = nullptr;   // the backend buffer the memory is in
    uint8_t * base = nullptr;                 // address of the memory in `buffer`
    size_t size = 0;
    bool host = true;                         // host memory: views allowed
    bool writable = true;
    std::string what = "lease";               // names it in errors: "slot 3", "layer 7"
    std::function<bool()> alive;              // false once the owner took the memory back
    std::function<void()> on_release;         // ends the hold (runs once)
    std::vector<std::shared_future<void>> loads;   // reads into the memory still in flight
    std::vector<std::shared_ptr<void>> tensors;    // contexts of tensor() results, unbound at release
    int exports = 0;                          // live buffer-protocol views
    bool released = false;

    virtual ~lease();
    // Throws SlotReleased if released or no longer alive.
    void check() const;
    // Ends the hold: BufferError if views are alive; waits for loads (GIL
    // released); unbinds tensor() results. A second call does nothing.
    void release();
    // A ggml tensor of `type` and `shape` (ggml order) over the bytes at `offset`.
    tensor_ref tensor(int type, const std::vector<int64_t> & shape, size_t offset);
};

// A held buffer-pool slot.
struct slot_lease : lease {
    int index = -1, key = -1, evicted = -1;
    bool hit = false;
};

// A layer acquired from a layer_pager: the slot its tensors are bound to.
struct layer_lease : lease {
    int layer = -1;
};

// A KV frame acquired from a kv_cache: layer's K then V in one buffer.
struct kv_lease : lease {
    int seq = -1, layer = -1;
    int64_t n_valid = 0;                                  // rows held at acquire
    std::shared_ptr<int64_t> n_end = std::make_shared<int64_t>(0);   // rows written: release marks them dirty
    size_t v_offset = 0;
};

// Registers the Lease base class (buffer protocol, __dlpack__, context manager).
void init_lease(pybind11::module_ & m);
// Gives a pybind class derived from lease the counted buffer procs.
void lease_buffer_procs(pybind11::handle cls);

}  // namespace superggml
