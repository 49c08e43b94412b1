#include "bindings.h"

#include "buffer-pool.h"
#include "graph.h"
#include "lease.h"
#include "prefetch.h"

#include <chrono>
#include <pybind11/stl.h>

namespace py = pybind11;

namespace superggml {

struct future_ref {
    std::shared_future<void> f;
    std::weak_ptr<prefetcher> owner;
    uint64_t id = 0;
};

py::dict to_dict(const prefetch_stats & s) {
    py::dict d;
    d["completed"] = s.completed; d["failed"] = s.failed; d["cancelled"] = s.cancelled;
    d["bytes"] = s.bytes; d["direct_bytes"] = s.direct_bytes; d["host_bytes"] = s.host_bytes; d["read_seconds"] = s.read_seconds; d["pending"] = s.pending;
    return d;
}

void init_prefetch(py::module_ & m) {
    m.attr("DIRECT_ALIGN") = DIRECT_ALIGN;   // bytes O_DIRECT reads align to
    m.def("host_to_device_rate", [](compute_backend & b, size_t bytes, int repeats) {
        py::gil_scoped_release nogil;
        return host_to_device_rate(b.device(), bytes, repeats);
    }, py::arg("backend"), py::arg("bytes") = (size_t) 256 << 20, py::arg("repeats") = 5,
       "Bytes per second of async copies from the device's pinned host memory (plain memory without it) into "
       "the device: the best of `repeats`. The bound of a staged load.");
    py::class_<future_ref>(m, "LoadFuture", "The completion of one load job.")
        .def("result", [](future_ref & r, std::optional<double> timeout) {
            bool ready = true;
            {
                py::gil_scoped_release nogil;
                if (timeout) {
                    ready = r.f.wait_for(std::chrono::duration<double>(*timeout)) == std::future_status::ready;
                } else {
                    r.f.wait();
                }
            }
            if (!ready) {
                PyErr_SetString(PyExc_TimeoutError, "load not finished in time");
                throw py::error_already_set();
            }
            r.f.get();
        }, py::arg("timeout") = py::none(), "Waits (GIL released); raises the load's error, TimeoutError on timeout.")
        .def("done", [](future_ref & r) {
            return r.f.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
        })
        .def("cancel", [](future_ref & r) {
            auto p = r.owner.lock();
            return p ? p->cancel_job(r.id) : false;
        }, "Cancels the job if it has not started (result() then raises LoadCancelled); returns whether it did.");

    py::class_<prefetcher, std::shared_ptr<prefetcher>>(m, "Prefetcher",
        "Worker threads reading file byte ranges into pool slots (pread).")
        .def(py::init([](const std::string & path, int n_workers, bool direct, bool staged) {
            return std::make_shared<prefetcher>(path, n_workers, direct, nullptr, staged, content_writer());
        }), py::arg("path"), py::arg("n_workers") = 1, py::arg("direct") = false, py::arg("staged") = false)
        .def_property_readonly("direct", &prefetcher::direct, "O_DIRECT reads are available")
        .def("submit", [](const std::shared_ptr<prefetcher> & p, int key, buffer_pool & pool, int slot,
                          const std::vector<std::tuple<uint64_t, size_t, size_t>> & ranges, int priority,
                          bool direct) {
            load_job j;
            j.key = key;
            j.priority = priority;
            j.direct = direct;
            j.dst = pool.buffer(slot);
            if (!j.dst) throw Error("slot " + std::to_string(slot) + " has no memory (the pool was shrunk)");
            for (auto & [off, size, dst] : ranges) j.ranges.push_back({off, size, dst});
            auto t = p->submit(std::move(j));
            return future_ref{t.done, p, t.id};
        }, py::arg("key"), py::arg("pool"), py::arg("slot"), py::arg("ranges"), py::arg("priority") = 0,
           py::arg("direct") = false,
           "Queues reads of (file_offset, size, slot_offset) ranges into the slot; returns a LoadFuture. "
           "direct: O_DIRECT where the range and slot address are 4096-aligned and the file allows it.")
        .def("submit_slot", [](const std::shared_ptr<prefetcher> & p, slot_lease & slot,
                               const std::vector<std::tuple<uint64_t, size_t, size_t>> & ranges, int priority,
                               std::optional<bool> direct) {
            slot.check();
            if (!slot.writable) throw Error(slot.what + " was acquired read-only: nothing can be loaded into it");
            load_job j;
            j.key = slot.key;
            j.priority = priority;
            j.direct = direct.value_or(p->direct());
            j.dst = slot.buffer;
            for (auto & [off, size, dst] : ranges) {
                if (dst + size > slot.size) {
                    throw Error("range of " + std::to_string(size) + " bytes at slot offset " + std::to_string(dst) +
                                " does not fit in " + slot.what + " (" + std::to_string(slot.size) + " bytes)");
                }
                j.ranges.push_back({off, size, dst});
            }
            auto t = p->submit(std::move(j));
            slot.loads.push_back(t.done);
            return future_ref{t.done, p, t.id};
        }, py::arg("slot"), py::arg("ranges"), py::arg("priority") = 0, py::arg("direct") = py::none(),
           "Queues reads of (file_offset, size, slot_offset) ranges into a held Slot (its key names the job); "
           "the slot's release() waits for them. direct (default: when the prefetcher has O_DIRECT): O_DIRECT for "
           "ranges whose offset, size and address are 4096-aligned, buffered reads for the rest.")
        .def("cancel", &prefetcher::cancel, py::arg("key"), "Cancels every queued job for key; returns whether any.")
        .def_property_readonly("n_workers", &prefetcher::n_workers)
        .def("stats", [](const prefetcher & p) { return to_dict(p.stats()); });
}

}  // namespace superggml
