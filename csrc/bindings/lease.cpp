#include "lease.h"

#include "buffer-pool.h"   // SlotReleased
#include "graph.h"
#include "tensor-bind.h"

#include <ggml.h>
#include <pybind11/stl.h>

namespace py = pybind11;

namespace superggml {

lease::~lease() {
    if (released) return;
    try {
        for (auto & f : loads) if (f.valid()) f.wait();
        for (auto & t : tensors) tensor_unbind(static_cast<ggml_tensor *>(t.get()));
        if (on_release) on_release();
    } catch (...) {
        // a hold dropped by the garbage collector: its owner's error has nowhere to go
    }
}

void lease::check() const {
    if (released) throw SlotReleased(what + " was released: views of it can no longer be made");
    if (alive && !alive()) throw SlotReleased(what + " no longer holds these bytes (evicted or dropped)");
}

void lease::release() {
    if (released) return;
    if (exports > 0) {
        PyErr_SetString(PyExc_BufferError,
                        (what + ": cannot release while " + std::to_string(exports) +
                         " view(s) of it exist; delete them (numpy arrays, memoryviews, tensors from dlpack) first")
                            .c_str());
        throw py::error_already_set();
    }
    {
        py::gil_scoped_release nogil;
        for (auto & f : loads) if (f.valid()) f.wait();
    }
    loads.clear();
    for (auto & t : tensors) tensor_unbind(static_cast<ggml_tensor *>(t.get()));
    tensors.clear();
    released = true;
    if (on_release) on_release();
}

tensor_ref lease::tensor(int type, const std::vector<int64_t> & shape, size_t offset) {
    check();
    if (shape.empty() || shape.size() > 4) throw Error("tensor: shape needs 1 to 4 dimensions");
    auto ctx = std::make_shared<graph_context>(1);
    int64_t ne[4] = {1, 1, 1, 1};
    for (size_t i = 0; i < shape.size(); ++i) ne[i] = shape[i];
    ggml_tensor * t = ggml_new_tensor(ctx->ctx(), (ggml_type) type, (int) shape.size(), ne);
    if (offset + ggml_nbytes(t) > size) {
        throw Error("tensor: " + std::to_string(ggml_nbytes(t)) + " bytes at offset " + std::to_string(offset) +
                    " do not fit in " + what + " (" + std::to_string(size) + " bytes)");
    }
    tensor_bind(t, buffer, base + offset);
    tensors.push_back(std::shared_ptr<void>(ctx, t));
    struct keep { std::shared_ptr<graph_context> ctx; std::shared_ptr<void> owner; };
    return tensor_ref{t, std::make_shared<keep>(keep{ctx, owner})};
}

static lease * as_lease(PyObject * obj) {
    try {
        return py::cast<lease *>(py::handle(obj));
    } catch (const std::exception &) {
        return nullptr;
    }
}

static int lease_getbuffer(PyObject * obj, Py_buffer * view, int flags) {
    view->obj = nullptr;
    lease * l = as_lease(obj);
    if (!l) {
        PyErr_SetString(PyExc_BufferError, "not a superggml lease");
        return -1;
    }
    if (!l->host) {
        PyErr_SetString(PyExc_BufferError,
                        (l->what + " is device memory: it has no host view (use tensor() in a ggml graph)").c_str());
        return -1;
    }
    try {
        l->check();
    } catch (const SlotReleased & e) {
        py::object errors = py::module_::import("superggml.errors");
        PyErr_SetString(errors.attr("SlotReleased").ptr(), e.what());
        return -1;
    }
    if ((flags & PyBUF_WRITABLE) && !l->writable) {
        PyErr_SetString(PyExc_BufferError, (l->what + " was acquired read-only").c_str());
        return -1;
    }
    if (PyBuffer_FillInfo(view, obj, l->base, (Py_ssize_t) l->size, l->writable ? 0 : 1, flags) < 0) return -1;
    l->exports++;
    return 0;
}

static void lease_releasebuffer(PyObject * obj, Py_buffer *) {
    if (lease * l = as_lease(obj)) l->exports--;
}

void lease_buffer_procs(py::handle cls) {
    auto * ht = reinterpret_cast<PyHeapTypeObject *>(cls.ptr());
    ht->ht_type.tp_as_buffer = &ht->as_buffer;
    ht->as_buffer.bf_getbuffer = lease_getbuffer;
    ht->as_buffer.bf_releasebuffer = lease_releasebuffer;
}

void init_lease(py::module_ & m) {
    py::class_<lease, std::shared_ptr<lease>> cls(m, "Lease", py::buffer_protocol(),
        "A hold on memory lent by superggml (base of Slot, Layer and KVFrame). Host memory is viewed without "
        "a copy through the buffer protocol and __dlpack__; release() raises BufferError while views exist, and "
        "views cannot be made after it (SlotReleased).");
    lease_buffer_procs(cls);
    cls.def_property_readonly("nbytes", [](const lease & l) { return l.size; }, "bytes of the memory")
        .def_property_readonly("writable", [](const lease & l) { return l.writable; })
        .def_property_readonly("is_host", [](const lease & l) { return l.host; },
                               "host memory (views allowed) or a device's (tensors only)")
        .def_property_readonly("released", [](const lease & l) { return l.released; })
        .def_property_readonly("valid", [](const lease & l) { return !l.released && (!l.alive || l.alive()); },
                               "views can be made: not released and the memory still this hold's")
        .def_property_readonly("n_views", [](const lease & l) { return l.exports; }, "live buffer-protocol views")
        .def("release", &lease::release,
             "Ends the hold. BufferError while views of it are alive; waits for loads into it; unbinds its "
             "tensors. Calling it again does nothing.")
        .def("tensor", &lease::tensor, py::arg("type"), py::arg("shape"), py::arg("offset") = 0,
             "A ggml tensor of `type` and `shape` (ggml order: shape[0] is the row length) over the bytes at "
             "`offset`, for graphs built by the caller; unbound when the lease is released.")
        .def("wait", [](lease & l) {
            py::gil_scoped_release nogil;
            for (auto & f : l.loads) if (f.valid()) f.get();
        }, "Waits for the loads into the memory (GIL released); raises the first one's error.")
        .def("__array__", [](py::object self, py::object dtype, py::object copy) {
            lease & l = self.cast<lease &>();
            if (!l.host) throw Error(l.what + " is device memory: it has no host view (use tensor() in a ggml graph)");
            l.check();   // numpy would otherwise turn a refused buffer into an object array
            py::object np = py::module_::import("numpy");
            py::object a = np.attr("frombuffer")(self, np.attr("uint8"));
            if (!dtype.is_none()) a = a.attr("astype")(dtype, py::arg("copy") = false);
            return a;
        }, py::arg("dtype") = py::none(), py::arg("copy") = py::none())
        .def("__dlpack__", [](py::object self, py::kwargs kw) {
            py::object arr = py::module_::import("numpy").attr("asarray")(self);
            return arr.attr("__dlpack__")(**kw);
        }, "DLPack capsule of the memory as a 1-D uint8 tensor (zero copy; a read-only lease needs a DLPack "
           "1.0 consumer); counts as a view until the consumer frees it.")
        .def("__dlpack_device__", [](const lease & l) {
            if (!l.host) throw Error(l.what + " is device memory: it has no DLPack view");
            return py::make_tuple(1, 0);   // kDLCPU
        })
        .def("__enter__", [](py::object self) { return self; })
        .def("__exit__", [](lease & l, py::args) { l.release(); });
}

}  // namespace superggml
