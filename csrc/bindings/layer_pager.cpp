#include "bindings.h"

#include "graph.h"
#include "layer-pager.h"
#include "lease.h"

#include <ggml.h>
#include <ggml-backend.h>

#include <pybind11/stl.h>

#include <algorithm>

namespace py = pybind11;

namespace superggml {

py::dict to_dict(const pager_stats & s) {
    py::dict d;
    d["loads"] = s.loads; d["hits"] = s.hits; d["evictions"] = s.evictions;
    d["bytes_loaded"] = s.bytes_loaded; d["wait_seconds"] = s.wait_seconds;
    d["host_hits"] = s.host_hits; d["host_bytes"] = s.host_bytes; d["file_bytes"] = s.file_bytes;
    return d;
}

static std::shared_ptr<layer_lease> layer_acquire(const std::shared_ptr<layer_pager> & p, int l) {
    {
        py::gil_scoped_release nogil;
        p->acquire(l);
    }
    const buffer_pool & pool = p->pool();
    const int slot = pool.slot_of(l);
    auto r = std::make_shared<layer_lease>();
    r->layer = l;
    r->owner = p;
    r->buffer = pool.buffer(slot);
    r->host = pool.is_host();
    r->base = static_cast<uint8_t *>(ggml_backend_buffer_get_base(r->buffer));
    r->size = pool.slot_size();
    r->writable = false;
    r->what = "layer " + std::to_string(l);
    const buffer_pool::view_t v = pool.view(slot);
    r->alive = [&pool, v] { return pool.view_valid(v); };
    layer_pager * pp = p.get();
    r->on_release = [pp, l] { pp->release(l); };
    return r;
}

void init_pager(py::module_ & m) {
    py::class_<layer_lease, lease, std::shared_ptr<layer_lease>> layer(m, "Layer", py::buffer_protocol(),
        "A layer held by LayerPager.acquire_layer: its tensors bound to one slot, viewable without a copy "
        "(read-only) until release().");
    lease_buffer_procs(layer);
    layer.def_property_readonly("index", [](const layer_lease & r) { return r.layer; })
        .def("names", [](const layer_lease & r) {
            std::vector<std::string> v;
            for (const ggml_tensor * t : static_cast<const layer_pager *>(r.owner.get())->tensors(r.layer)) v.push_back(t->name);
            return v;
        }, "The layer's tensor names, in the order given to the pager.")
        .def("offset", [](const layer_lease & r, const std::string & name) {
            r.check();
            const ggml_tensor * t = static_cast<const layer_pager *>(r.owner.get())->store().get(name);
            const auto * d = static_cast<const uint8_t *>(t->data);
            if (!d || d < r.base || d + ggml_nbytes(t) > r.base + r.size) {
                throw Error("tensor '" + name + "' is not in " + r.what);
            }
            return (size_t) (d - r.base);
        }, py::arg("name"), "Byte offset of a tensor of the layer in the slot.")
        .def("get", [](const layer_lease & r, const std::string & name) {
            r.check();
            const auto & p = std::static_pointer_cast<layer_pager>(r.owner);
            ggml_tensor * t = p->store().get(name);
            const auto & ts = p->tensors(r.layer);
            if (std::find(ts.begin(), ts.end(), t) == ts.end()) throw Error("tensor '" + name + "' is not in " + r.what);
            return tensor_ref{t, r.owner};
        }, py::arg("name"), "The layer's paged tensor `name`, bound to the slot (for ggml graphs).");

    py::class_<layer_pager, std::shared_ptr<layer_pager>>(m, "LayerPager",
        "Streams groups of paged tensors (layers) through a buffer pool with worker-thread prefetch.")
        .def(py::init([](std::shared_ptr<weight_store> store, const std::vector<std::vector<std::string>> & layers,
                         int n_slots, size_t slot_size, int n_workers, compute_backend * backend, bool direct_io,
                         bool staged, int host_slots) {
            pager_params p;
            p.direct_io = direct_io;
            p.staged = staged;
            p.host_slots = host_slots;
            p.n_slots = n_slots;
            p.slot_size = slot_size;
            p.n_workers = n_workers;
            p.writer = content_writer();
            p.buft = backend ? backend->buffer_type() : nullptr;
            return std::make_shared<layer_pager>(std::move(store), layers, p);
        }), py::arg("store"), py::arg("layers"), py::arg("n_slots"), py::arg("slot_size") = 0,
            py::arg("n_workers") = 1, py::arg("backend") = nullptr, py::arg("direct_io") = false,
            py::arg("staged") = false, py::arg("host_slots") = 0,
            "host_slots: a host tier of that many layers between the file and a staged pool (the device's pinned "
            "host memory where it has it): a layer read once is copied from there on its next loads.")
        .def_property_readonly("host_slots", &layer_pager::host_slots, "layers the host tier holds")
        .def_property_readonly("host_bytes", &layer_pager::host_bytes, "bytes of the host tier")
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
        .def("acquire_layer", &layer_acquire, py::arg("layer"),
             "acquire() (GIL released) as a Layer lease whose release() releases the layer.")
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
            for (const char * k : {"read_seconds", "pending", "failed", "completed", "direct_bytes"}) d[k] = io[k];
            return d;
        });
}

}  // namespace superggml
