#include "bindings.h"

#include "graph.h"
#include "layer-pager.h"   // layer_slot_bytes
#include "weight-store.h"

#include <pybind11/stl.h>

namespace py = pybind11;

namespace superggml {

void init_weight_store(py::module_ & m) {
    py::enum_<weight_home>(m, "WeightHome")
        .value("UNBOUND", weight_home::unbound)
        .value("MMAP", weight_home::mmap)
        .value("RESIDENT", weight_home::resident)
        .value("REPACKED", weight_home::repacked);

    py::class_<weight_store, std::shared_ptr<weight_store>>(m, "WeightStore",
        "The weights of a GGUF file as paged tensors, bound to the mmap or to resident buffers.")
        .def(py::init([](std::shared_ptr<gguf_file> file) {
            return std::make_shared<weight_store>(std::move(file), content_writer());
        }), py::arg("file"))
        .def("get", [](const std::shared_ptr<weight_store> & s, const std::string & name) {
            return tensor_ref{s->get(name), s};
        }, py::arg("name"), "The paged tensor `name` (GGUFError if the file has none).")
        .def_property_readonly("path", [](const weight_store & s) { return s.file().path(); })
        .def("has", &weight_store::has)
        .def("names", [](const weight_store & s) {
            std::vector<std::string> v;
            for (const auto & ti : s.file().tensors()) v.push_back(ti.name);
            return v;
        }, "Every tensor name of the file, in file order.")
        .def("add_row_chunks", &weight_store::add_row_chunks, py::arg("name"), py::arg("max_bytes"),
             "Row ranges of a 2-D tensor as new paged tensors of at most max_bytes; returns their names.")
        .def("add_copy", &weight_store::add_copy, py::arg("name"), py::arg("tag"),
             "A second paged tensor '<name>@<tag>' over the same bytes (a weight another device reads too).")
        .def("file_range", &weight_store::file_range)
        .def("slot_bytes", [](const weight_store & s, const std::vector<std::string> & names, compute_backend * b,
                              bool direct_io) {
            return layer_slot_bytes(s, names, b ? b->buffer_type() : nullptr, direct_io);
        }, py::arg("names"), py::arg("backend") = nullptr, py::arg("direct_io") = false,
           "Bytes a pool slot needs to hold these tensors (with direct_io: in the file's layout, O_DIRECT-aligned).")
        .def("home", &weight_store::home)
        .def("bytes", &weight_store::bytes)
        .def("bind_mmap", &weight_store::bind_mmap, py::arg("names") = std::vector<std::string>{},
             py::call_guard<py::gil_scoped_release>(), "Binds tensors (all if empty) to the file mapping, zero copy.")
        .def("load_resident", [](weight_store & s, const std::vector<std::string> & names, compute_backend & b) {
            py::gil_scoped_release nogil;
            return s.load_resident(names, b.buffer_type());
        }, py::arg("names"), py::arg("backend"), "Copies tensors into a new buffer of the backend's device; returns bytes.")
        .def("load_repacked", [](weight_store & s, const std::vector<std::string> & names, compute_backend & b) {
            py::gil_scoped_release nogil;
            return s.load_repacked(names, b.device());
        }, py::arg("names"), py::arg("backend"),
           "Re-lays the weights the device can use re-laid (ggml-cpu repack); returns bytes moved.");
}

}  // namespace superggml
