#include "bindings.h"

#include "telemetry.h"

namespace py = pybind11;

namespace superggml {

void init_telemetry(py::module_ & m) {
    m.def("host_memory", [] {
        host_memory h;
        {
            py::gil_scoped_release nogil;
            h = host_memory_info();
        }
        py::dict d;
        d["total"] = h.total; d["available"] = h.available;
        d["cgroup_limit"] = h.cgroup_limit; d["cgroup_usage"] = h.cgroup_usage;
        d["cgroup_cache"] = h.cgroup_cache;
        d["process_rss"] = h.process_rss; d["process_peak"] = h.process_peak;
        d["pressure"] = h.pressure();
        return d;
    }, "Host memory as this process sees it: /proc/meminfo clipped by its memory cgroup (bytes).");
    m.def("host_memory_trim", [] {
        py::gil_scoped_release nogil;
        return host_memory_trim();
    }, "Returns freed heap memory to the system (glibc malloc_trim); whether any was released.");
    m.def("devices", [] {
        py::list l;
        for (const auto & dm : device_memory_info()) {
            py::dict e;
            e["name"] = dm.name; e["description"] = dm.description; e["type"] = dm.type;
            e["memory_free"] = dm.free; e["memory_total"] = dm.total;
            l.append(e);
        }
        return l;
    }, "The ggml devices of this build: name, description, type, memory_free, memory_total.");
}

}  // namespace superggml
