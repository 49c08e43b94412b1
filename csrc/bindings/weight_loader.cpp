#include "bindings.h"

#include "graph.h"
#include "weight-loader.h"

#include <pybind11/stl.h>

namespace py = pybind11;

namespace superggml {

py::dict to_dict(const loader_stats & s) {
    py::dict d;
    d["bytes_read"] = s.bytes_read;
    d["bytes_repacked"] = s.bytes_repacked;
    d["groups_done"] = s.groups_done;
    d["groups_failed"] = s.groups_failed;
    d["retries"] = s.retries;
    d["seconds"] = s.seconds;
    return d;
}

void init_weight_loader(py::module_ & m) {
    py::class_<weight_loader, std::shared_ptr<weight_loader>>(m, "WeightLoader",
        "A resident model's weights loaded group by group by worker threads while the first pass computes.")
        .def(py::init([](std::shared_ptr<weight_store> store, const std::vector<std::vector<std::string>> & groups,
                         const std::vector<std::string> & repack, compute_backend * backend, int n_workers,
                         bool do_repack, size_t chunk) {
            loader_params p;
            p.n_workers = n_workers;
            p.repack = do_repack;
            p.chunk = chunk;
            py::gil_scoped_release nogil;
            return std::make_shared<weight_loader>(std::move(store), groups, repack,
                                                   backend ? backend->device() : nullptr, p);
        }), py::arg("store"), py::arg("groups"), py::arg("repack") = std::vector<std::string>{},
            py::arg("backend") = nullptr, py::arg("n_workers") = 2, py::arg("do_repack") = true,
            py::arg("chunk") = (size_t) (8u << 20),
            "Binds every weight to the mapping, places the re-laid ones (`repack`, where the backend's device has "
            "such kernels) and starts loading `groups` (lists of tensor names, in the order a pass uses them).")
        .def_property_readonly("n_groups", &weight_loader::n_groups)
        .def_property_readonly("repacked_bytes", &weight_loader::repacked_bytes)
        .def("wait", &weight_loader::wait, py::arg("group"), py::call_guard<py::gil_scoped_release>(),
             "Blocks until the group is loaded (a failed load is retried once, here); OSError if it cannot be.")
        .def("wait_all", &weight_loader::wait_all, py::call_guard<py::gil_scoped_release>())
        .def("done", &weight_loader::done)
        .def("cancel", &weight_loader::cancel, py::call_guard<py::gil_scoped_release>(),
             "Stops the workers; groups not loaded yet are loaded by wait().")
        .def("stats", [](const weight_loader & l) { return to_dict(l.stats()); });
}

}  // namespace superggml
