#include "bindings.h"

#include "graph.h"
#include "layer-pager.h"

#include <pybind11/stl.h>

namespace py = pybind11;

namespace superggml {

py::dict to_dict(const pager_stats & s) {
    py::dict d;
    d["loads"] = s.loads; d["hits"] = s.hits; d["evictions"] = s.evictions;
    d["bytes_loaded"] = s.bytes_loaded; d["wait_seconds"] = s.wait_seconds;
    return d;
}

void init_pager(py::module_ & m) {
    py::class_<layer_pager, std::shared_ptr<layer_pager>>(m, "LayerPager",
        "Streams groups of paged tensors (layers) through a buffer pool with worker-thread prefetch.")
        .def(py::init([](std::shared_ptr<weight_store> store, const std::vector<std::vector<std::string>> & layers,
                         int n_slots, size_t slot_size, int n_workers, compute_backend * backend, bool direct_io,
                         bool staged) {
            pager_params p;
            p.direct_io = direct_io;
            p.staged = staged;
            p.n_slots = n_slots;
            p.slot_size = slot_size;
            p.n_workers = n_workers;
            p.buft = backend ? backend->buffer_type() : nullptr;
            return std::make_shared<layer_pager>(std::move(store), layers, p);
        }), py::arg("store"), py::arg("layers"), py::arg("n_slots"), py::arg("slot_size") = 0,
            py::arg("n_workers") = 1, py::arg("backend") = nullptr, py::arg("direct_io") = false,
            py::arg("staged") = false)
        .def_property_readonly("staged", [](const layer_pager & p) { return p.staged(); },
                               "loads go through staging buffers and async device copies")
        .def_property_readonly("direct_io", &layer_pager::direct_io, "O_DIRECT reads are in use")
        .def_property_readonly("n_layers", &layer_pager::n_layers)
        .def_property_readonly("slot_size", [](const layer_pager & p) { return p.pool().slot_size(); })
        .def_property_readonly("n_slots", [](const layer_pager & p) { return p.pool().n_slots(); })
        .def("layer_bytes", &layer_pager::layer_bytes)
        .def("prefetch", &layer_pager::prefetch, py::arg("layer"), py::arg("priority") = 0)
        .def("acquire", &layer_pager::acquire, py::arg("layer"), py::call_guard<py::gil_scoped_release>(),
             "Waits for the layer's bytes (GIL released) and binds its tensors to the slot.")
        .def("release", &layer_pager::release)
        .def("pin", &layer_pager::pin, py::call_guard<py::gil_scoped_release>())
        .def("unpin", &layer_pager::unpin, py::arg("layer"))
        .def("pinned", &layer_pager::pinned, py::arg("layer"))
        .def("shrink", &layer_pager::shrink,
             "Frees one slot's memory (evicting its unpinned layer); False if every slot is in use or pinned.")
        .def("grow", &layer_pager::grow, py::call_guard<py::gil_scoped_release>(), "Allocates one more slot.")
        .def("resident", &layer_pager::resident)
        .def("last_load", [](const layer_pager & p, int l) -> py::object {
            double a = 0, b = 0;
            if (!p.last_load(l, a, b)) return py::none();
            return py::make_tuple(a, b);
        }, py::arg("layer"), "(start, end) wall-clock seconds of the layer's last finished load, or None")
        .def("stats", [](const layer_pager & p) {
            py::dict d = to_dict(p.stats());
            py::dict io = to_dict(p.io_stats());
            for (const char * k : {"read_seconds", "pending", "failed", "completed"}) d[k] = io[k];
            return d;
        });
}

}  // namespace superggml
