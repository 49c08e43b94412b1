#include "bindings.h"

#include "buffer-pool.h"
#include "graph.h"
#include "lease.h"

#include <ggml-backend.h>
#include <pybind11/numpy.h>

namespace py = pybind11;

namespace superggml {

py::dict to_dict(const pool_stats & s) {
    py::dict d;
    d["hits"] = s.hits; d["misses"] = s.misses; d["evictions"] = s.evictions;
    return d;
}

static std::shared_ptr<slot_lease> slot_acquire(const std::shared_ptr<buffer_pool> & pool, int key, bool writable) {
    const auto a = pool->acquire(key);
    auto l = std::make_shared<slot_lease>();
    l->index = a.slot;
    l->key = key;
    l->hit = a.hit;
    l->evicted = a.evicted;
    l->owner = pool;
    l->buffer = pool->buffer(a.slot);
    l->host = pool->is_host();
    l->base = static_cast<uint8_t *>(ggml_backend_buffer_get_base(l->buffer));
    l->size = pool->slot_size();
    l->writable = writable;
    l->what = "slot " + std::to_string(a.slot) + " (key " + std::to_string(key) + ")";
    const buffer_pool::view_t v = pool->view(a.slot);
    buffer_pool * p = pool.get();
    l->alive = [p, v] { return p->view_valid(v); };
    l->on_release = [p, slot = a.slot] { p->release(slot); };
    return l;
}

void init_buffer_pool(py::module_ & m) {
    py::class_<slot_lease, lease, std::shared_ptr<slot_lease>> slot(m, "Slot", py::buffer_protocol(),
        "A held pool slot (BufferPool.acquire): the slot's bytes without a copy (buffer protocol, __dlpack__, "
        "tensor()), valid until release().");
    lease_buffer_procs(slot);
    slot.def_property_readonly("index", [](const slot_lease & l) { return l.index; })
        .def_property_readonly("key", [](const slot_lease & l) { return l.key; })
        .def_property_readonly("hit", [](const slot_lease & l) { return l.hit; },
                               "the slot already held the key's bytes (loaded or loading)")
        .def_property_readonly("evicted", [](const slot_lease & l) { return l.evicted; },
                               "the key whose bytes were dropped to make room, or -1");

    py::class_<buffer_pool, std::shared_ptr<buffer_pool>>(m, "BufferPool",
        "Fixed-size slots on one backend buffer type; LRU eviction, pinning, a hard byte budget.")
        .def(py::init([](size_t slot_size, int n_slots, compute_backend * backend, size_t align) {
            pool_params p;
            p.slot_size = slot_size;
            p.n_slots = n_slots;
            p.buft = backend ? backend->buffer_type() : nullptr;
            p.align = align;
            return std::make_shared<buffer_pool>(p);
        }), py::arg("slot_size"), py::arg("n_slots"), py::arg("backend") = nullptr, py::arg("align") = 0,
           "n_slots slots of slot_size bytes; host slots start at a multiple of `align` (4096: O_DIRECT reads "
           "go straight into them; 0: the buffer type's alignment).")
        .def_property_readonly("n_slots", &buffer_pool::n_slots)
        .def_property_readonly("slot_size", &buffer_pool::slot_size)
        .def_property_readonly("bytes", &buffer_pool::bytes)
        .def("acquire", [](buffer_pool & p, int key) {
            auto a = p.acquire(key);
            return py::make_tuple(a.slot, a.hit, a.evicted);
        }, py::arg("key"), "(slot, hit, evicted key or -1); PoolExhausted if every slot is in use or pinned")
        .def("acquire_slot", &slot_acquire, py::arg("key"), py::arg("writable") = true,
             "Holds the slot of `key` (a hit) or takes one (LRU eviction): a Slot; PoolExhausted if every slot "
             "is in use or pinned.")
        .def_property_readonly("is_host", &buffer_pool::is_host)
        .def("release", &buffer_pool::release)
        .def("set_pinned", &buffer_pool::set_pinned)
        .def("drop", &buffer_pool::drop)
        .def("shrink", [](buffer_pool & p) {
            int evicted = -1;
            bool ok = p.shrink(evicted);
            return py::make_tuple(ok, evicted);
        }, "Frees one slot's memory: (freed, evicted key or -1); freed is False if every slot is in use or pinned.")
        .def("grow", &buffer_pool::grow, "Allocates one more slot; returns its index.")
        .def("slot_of", &buffer_pool::slot_of)
        .def("key_of", &buffer_pool::key_of)
        .def("in_use", &buffer_pool::in_use)
        .def("read", [](buffer_pool & p, int slot, size_t offset, size_t size) {
            if (offset + size > p.slot_size()) throw Error("read past the end of the slot");
            py::array_t<uint8_t> a(size);
            ggml_backend_buffer * b = p.buffer(slot);
            if (!b) throw Error("slot " + std::to_string(slot) + " has no memory (the pool was shrunk)");
            auto * base = static_cast<uint8_t *>(ggml_backend_buffer_get_base(b));
            if (ggml_backend_buffer_is_host(b)) {
                std::memcpy(a.mutable_data(), base + offset, size);
            } else {
                throw Error("read() of device slots is not supported; bind a tensor and use tensor_get");
            }
            return a;
        }, py::arg("slot"), py::arg("offset"), py::arg("size"), "Copy of a slot's bytes (host slots).")
        .def("stats", [](const buffer_pool & p) { return to_dict(p.stats()); });
}

}  // namespace superggml
