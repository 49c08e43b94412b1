#include "bindings.h"

#include "rpc.h"

#include <pybind11/stl.h>

namespace py = pybind11;

namespace superggml {

void init_rpc(py::module_ & m) {
    m.def("rpc_add_server", [](const std::string & endpoint, double connect_timeout, double timeout) {
        rpc_params p;
        p.connect_timeout = connect_timeout;
        p.timeout = timeout;
        std::vector<rpc_device_info> devs;
        {
            py::gil_scoped_release nogil;
            devs = rpc_add_server(endpoint, p);
        }
        py::list l;
        for (const auto & d : devs) {
            py::dict e;
            e["name"] = d.name; e["endpoint"] = d.endpoint; e["index"] = d.index;
            l.append(e);
        }
        return l;
    }, py::arg("endpoint"), py::arg("connect_timeout") = 5.0, py::arg("timeout") = 60.0,
       "Probes a ggml RPC server (HOST:PORT) and adds its devices behind a guard; returns [{name, endpoint, "
       "index}]. DeviceError names the endpoint when it cannot be used.");
    m.def("rpc_probe", [](const std::string & endpoint, double connect_timeout) {
        rpc_params p;
        p.connect_timeout = connect_timeout;
        py::gil_scoped_release nogil;
        rpc_probe(endpoint, p);
    }, py::arg("endpoint"), py::arg("connect_timeout") = 5.0,
       "Connects and checks the server's HELLO; DeviceError if it cannot be used.");
    m.def("rpc_check", [] { rpc_check(nullptr); },
          "DeviceError if a server this process uses failed on a connection still open.");
    m.def("rpc_stats", [] {
        py::dict d;
        for (const auto & s : rpc_stats()) {
            py::dict e;
            e["bytes_sent"] = s.bytes_sent; e["bytes_received"] = s.bytes_received; e["commands"] = s.commands;
            e["wait_seconds"] = s.wait_seconds; e["failed"] = s.failed; e["error"] = s.error;
            d[py::str(s.endpoint)] = e;
        }
        return d;
    }, "Per server endpoint: bytes_sent, bytes_received, commands, wait_seconds, failed, error.");
    m.def("rpc_server_start", [](const std::string & endpoint, const std::string & cache_dir, int n_threads,
                                 uint64_t mem) {
        rpc_server_start(endpoint, cache_dir, n_threads, mem);
    }, py::arg("endpoint"), py::arg("cache_dir") = "", py::arg("n_threads") = 4, py::arg("mem") = 0,
       "Serves this process's CPU to ggml RPC clients on a background thread (one client at a time).");
}

}  // namespace superggml
