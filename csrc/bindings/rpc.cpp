#include "bindings.h"

#include "rpc/rpc-content.h"
#include "rpc/rpc-peer.h"
#include "rpc/rpc.h"

#include <pybind11/stl.h>

namespace py = pybind11;

namespace superggml {

range_writer content_writer() { return content_write; }

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
            e["name"] = d.name; e["endpoint"] = d.endpoint; e["index"] = d.index; e["addressed"] = d.addressed;
            l.append(e);
        }
        return l;
    }, py::arg("endpoint"), py::arg("connect_timeout") = 5.0, py::arg("timeout") = 60.0,
       "Probes a ggml RPC server (HOST:PORT) and adds its devices behind a guard; returns [{name, endpoint, "
       "index, addressed}] (addressed: a superggml peer, sent ranges by hash). DeviceError names the endpoint when it cannot be used.");
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
            e["loaded_by_peer"] = s.loaded_by_peer; e["addressed_misses"] = s.addressed_misses;
            e["addressed"] = s.addressed;
            d[py::str(s.endpoint)] = e;
        }
        return d;
    }, "Per server endpoint: bytes_sent, bytes_received, commands, wait_seconds, failed, error, addressed, "
       "loaded_by_peer (bytes it loaded from its own copy), addressed_misses (ranges whose bytes were sent).");
    m.def("rpc_server_start", [](const std::string & endpoint, const std::string & cache_dir, int n_threads,
                                 uint64_t mem, const std::vector<std::pair<std::string, std::vector<std::tuple<uint64_t,
                                 uint64_t, uint64_t>>>> & models, bool direct) {
        rpc_server_params p;
        p.endpoint = endpoint;
        p.cache_dir = cache_dir;
        p.n_threads = n_threads;
        p.mem = mem;
        p.direct = direct;
        for (const auto & [path, ranges] : models) {
            peer_file f{path, {}};
            for (const auto & [off, size, hash] : ranges) f.ranges.push_back({off, size, hash});
            p.models.push_back(std::move(f));
        }
        rpc_server_start(p);
    }, py::arg("endpoint"), py::arg("cache_dir") = "", py::arg("n_threads") = 4, py::arg("mem") = 0,
       py::arg("models") = std::vector<std::pair<std::string, std::vector<std::tuple<uint64_t, uint64_t, uint64_t>>>>{},
       py::arg("direct") = true,
       "Serves this process's CPU to ggml RPC clients on background threads (one client at a time), loading "
       "the ranges it is named by hash from `models` ([(path, [(offset, size, hash)])]) or cache_dir.");
    m.def("rpc_server_stats", [] {
        rpc_server_stats s = rpc_server_stats_get();
        py::dict d;
        d["loads"] = s.loads; d["bytes_loaded"] = s.bytes_loaded; d["misses"] = s.misses;
        d["refused"] = s.refused; d["clients"] = s.clients;
        return d;
    }, "This process's RPC peer: ranges (and bytes) loaded from its own copies, misses, refused copies, clients.");
    m.def("content_index_set", [](const std::string & path, const std::vector<std::tuple<uint64_t, uint64_t,
                                  uint64_t>> & ranges) {
        std::vector<content_range> r;
        for (const auto & [off, size, hash] : ranges) r.push_back({off, size, hash});
        content_index_set(path, r);
    }, py::arg("path"), py::arg("ranges"),
       "Sets the content hashes of (offset, size, hash) ranges of the file at `path`: writes of those ranges "
       "to superggml RPC peers go by hash. An empty list forgets them.");
}

}  // namespace superggml
