#include "bindings.h"

#include "expert-cache.h"
#include "graph.h"

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

namespace py = pybind11;

namespace superggml {

py::dict to_dict(const expert_cache_stats & s) {
    py::dict d;
    d["expert_hits"] = s.hits; d["expert_misses"] = s.misses; d["expert_prefetches"] = s.prefetches;
    d["expert_prefetch_hits"] = s.prefetch_hits; d["expert_evictions"] = s.evictions;
    d["expert_host_misses"] = s.host_misses;
    d["expert_bytes_loaded"] = s.bytes_loaded; d["expert_slots"] = s.n_slots; d["expert_slots_active"] = s.n_active; d["expert_slots_used"] = s.slots_used;
    d["expert_slot_size"] = s.slot_size; d["expert_direct_loads"] = s.direct_loads;
    d["expert_tier_hits"] = s.tier_hits; d["expert_tier_bytes"] = s.tier_bytes; d["expert_file_bytes"] = s.file_bytes;
    d["expert_tier_slots"] = s.tier_slots;
    return d;
}

void init_expert_cache(py::module_ & m) {
    py::class_<expert_cache, std::shared_ptr<expert_cache>>(m, "ExpertCache",
        "Mixture-of-experts experts paged one by one through slots of one buffer (see csrc/expert-cache.h).")
        .def(py::init([](const std::string & path, int n_slots, size_t slot_size, compute_backend * backend,
                         int n_workers, bool direct_io, bool staged, int host_slots, int zero_slots) {
            expert_cache_params p;
            p.n_slots = n_slots;
            p.slot_size = slot_size;
            p.buft = backend ? backend->buffer_type() : nullptr;
            p.direct = direct_io;
            p.host_slots = host_slots;
            p.zero_slots = zero_slots;
            auto io = std::make_shared<prefetcher>(path, n_workers, direct_io,
                                                   backend ? backend->device() : nullptr, staged,
                                                   content_writer());
            return std::make_shared<expert_cache>(p, io);
        }), py::arg("path"), py::arg("n_slots"), py::arg("slot_size"), py::arg("backend") = nullptr,
            py::arg("n_workers") = 2, py::arg("direct_io") = false, py::arg("staged") = false,
            py::arg("host_slots") = 0, py::arg("zero_slots") = 0,
            "staged: host slots too load through staging and async copies (the device path); host_slots: a host "
            "tier of that many experts between the file and slots that are not host memory (or staged ones); "
            "zero_slots: zeroed slots after the n_slots that no load takes (map()'s positions computed elsewhere)")
        .def("set_layer", [](expert_cache & c, int layer, int n_expert,
                             const std::vector<std::tuple<uint64_t, size_t, size_t, size_t>> & parts) {
            std::vector<expert_cache::part> ps;
            for (auto & [off, stride, size, slot_off] : parts) ps.push_back({off, stride, size, slot_off});
            c.set_layer(layer, n_expert, ps);
        }, py::arg("layer"), py::arg("n_expert"), py::arg("parts"),
           "parts: (file_offset, stride, size, slot_offset) per matrix of an expert")
        .def("map", [](expert_cache & c, int layer, py::array_t<int32_t, py::array::c_style | py::array::forcecast> ids,
                       bool held_only) {
            py::array_t<int32_t> out(ids.request().shape);
            std::vector<int> pinned;
            {
                py::gil_scoped_release nogil;
                pinned = c.map(layer, ids.data(), (size_t) ids.size(), out.mutable_data(), held_only);
            }
            return py::make_tuple(out, pinned);
        }, py::arg("layer"), py::arg("ids"), py::arg("held_only") = false,
           "(slots of ids, same shape; the pinned slots for release): each distinct expert loaded and waited for "
           "(held_only: those not held are not loaded, their slots -1)")
        .def("release", &expert_cache::release, py::arg("slots"))
        .def("set_active", [](expert_cache & c, int n) { py::gil_scoped_release nogil; c.set_active(n); }, py::arg("n"),
             "Only the first n slots hold experts; the others are emptied and, on host memory, their pages released.")
        .def_property_readonly("n_active", &expert_cache::n_active)
        .def("prefetch", &expert_cache::prefetch, py::arg("layer"), py::arg("experts"),
             "Starts loading the experts not held; returns how many it started.")
        .def("layer_direct", &expert_cache::layer_direct, py::arg("layer"),
             "Whether the layer's experts are read with O_DIRECT.")
        .def("holds", &expert_cache::holds, py::arg("layer"), py::arg("expert"))
        .def("bind_view", [](const expert_cache & c, tensor_ref & t, size_t offset) { c.bind_view(t.t, offset); },
             py::arg("tensor"), py::arg("offset"),
             "Points a [K, M, n_slots + zero_slots] tensor at `offset` inside slot 0 with nb[2] = slot_size.")
        .def_property_readonly("slot_size", &expert_cache::slot_size)
        .def_property_readonly("n_slots", &expert_cache::n_slots)
        .def_property_readonly("zero_slots", &expert_cache::zero_slots)
        .def("stats", [](const expert_cache & c) { return to_dict(c.stats()); });
}

}  // namespace superggml
