// Python view of host-reserve.h.
#include "bindings.h"

#include "../host-reserve.h"

namespace py = pybind11;

namespace superggml {

void init_host_reserve(py::module_ & m) {
    py::class_<host_reservation, std::shared_ptr<host_reservation>>(m, "HostReservation",
        "Host address space for tensors whose pages are committed when written (MAP_NORESERVE); release() gives "
        "pages back, which then read as zeros.")
        .def(py::init<size_t>(), py::arg("size"))
        .def_property_readonly("size", &host_reservation::size)
        .def("bind", [](host_reservation & r, tensor_ref & t, size_t offset) { r.bind(t.t, offset); },
             py::arg("tensor"), py::arg("offset"), "Places the tensor at byte `offset` of the range.")
        .def("release", &host_reservation::release, py::arg("offset"), py::arg("size"),
             "Gives the whole pages in [offset, offset + size) back to the system (they read as zeros after).")
        .def("resident", &host_reservation::resident, "Bytes of the range backed by memory now.");
}

}  // namespace superggml
