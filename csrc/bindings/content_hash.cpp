#include "bindings.h"

#include "content-hash.h"

#include <pybind11/stl.h>

namespace py = pybind11;

namespace superggml {

void init_content_hash(py::module_ & m) {
    m.def("content_hash", [](py::buffer data, uint64_t seed) {
        py::buffer_info info = data.request();
        return content_hash(static_cast<const uint8_t *>(info.ptr), (size_t) (info.size * info.itemsize), seed);
    }, py::arg("data"), py::arg("seed") = content_hash_seed,
       "FNV-1a (64-bit) of the bytes, as ggml RPC hashes a tensor's data; seed continues an earlier hash.");
    m.def("content_hash_ranges", [](const std::string & path, const std::vector<std::pair<uint64_t, uint64_t>> & ranges,
                                    int n_threads) {
        content_hash_params p;
        p.n_threads = n_threads;
        py::gil_scoped_release nogil;
        return content_hash_ranges(path, ranges, p);
    }, py::arg("path"), py::arg("ranges"), py::arg("n_threads") = 1,
       "content_hash of each (offset, size) range of the file, read on n_threads threads (GIL released).");
}

}  // namespace superggml
