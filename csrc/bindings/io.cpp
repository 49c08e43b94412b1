#include "bindings.h"

#include "error.h"
#include "io.h"

#include <map>

namespace py = pybind11;

namespace superggml {

void init_io(py::module_ & m) {
    m.def("inject_io_fault", [](const std::string & kind, long skip, long count) {
        static const std::map<std::string, io_fault> kinds = {
            {"short_read", io_fault::short_read}, {"eintr", io_fault::eintr}, {"eio", io_fault::eio},
            {"enospc", io_fault::enospc}};
        auto it = kinds.find(kind);
        if (it == kinds.end()) throw Error("unknown I/O fault '" + kind + "' (short_read, eintr, eio, enospc)");
        io_fault_arm(it->second, skip, count);
    }, py::arg("kind"), py::arg("skip") = 0, py::arg("count") = 1,
       "Test hook: the next `count` preads/pwrites (after `skip`) fail as `kind`; count < 0: until cleared.");
    m.def("clear_io_faults", &io_fault_clear, "Test hook: I/O behaves normally again.");
    m.def("io_fault_hits", &io_fault_hits, "Calls the armed fault has hit so far.");
}

}  // namespace superggml
