#include "bindings.h"

#include "buffer-pool.h"
#include "error.h"
#include "task-pool.h"   // Cancelled

#include <cctype>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <ggml.h>
#include <pybind11/stl.h>

namespace py = pybind11;

namespace superggml {

static std::map<std::string, uint64_t> & log_counts() { static std::map<std::string, uint64_t> m; return m; }
static std::mutex & log_counts_mutex() { static std::mutex m; return m; }

static void raise_from(const char * cls, const char * msg) {
    py::object errors = py::module_::import("superggml.errors");
    PyErr_SetString(errors.attr(cls).ptr(), msg);
}

void init_errors(py::module_ & m) {
    py::register_exception_translator([](std::exception_ptr p) {
        try {
            if (p) std::rethrow_exception(p);
        } catch (const PoolExhausted & e) {
            raise_from("PoolExhausted", e.what());
        } catch (const SlotReleased & e) {
            raise_from("SlotReleased", e.what());
        } catch (const Cancelled & e) {
            raise_from("LoadCancelled", e.what());
        } catch (const DeviceError & e) {
            raise_from("DeviceError", e.what());
        } catch (const GGUFError & e) {
            raise_from("GGUFError", e.what());
        } catch (const FileError & e) {
            // OSError(errno, message): Python picks the subclass (FileNotFoundError, PermissionError, ...)
            py::object err = py::reinterpret_steal<py::object>(
                PyObject_CallFunction(PyExc_OSError, "is", e.err, e.what()));
            if (err) PyErr_SetObject(reinterpret_cast<PyObject *>(Py_TYPE(err.ptr())), err.ptr());
        } catch (const Error & e) {
            raise_from("SuperggmlError", e.what());
        }
    });
    // ggml logs go through Python's stderr only when asked (SUPERGGML_GGML_LOG=1). ggml-cuda's word on its CUDA
    // graphs (captured, reused, reset, disabled and why) is counted, message by message, for ggml_log_counts.
    ggml_log_set([](ggml_log_level level, const char * text, void *) {
        static const bool on = [] { const char * v = std::getenv("SUPERGGML_GGML_LOG"); return v && *v && *v != '0'; }();
        if (on || level == GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
        if (strstr(text, "CUDA graph") || strstr(text, "CUDA Graph")) {
            std::string key;
            for (const char * c = text; *c && *c != '\n'; ++c) key += std::isdigit((unsigned char) *c) ? '#' : *c;
            std::lock_guard<std::mutex> lk(log_counts_mutex());
            log_counts()[key] += 1;
        }
    }, nullptr);
    m.def("ggml_log_counts", [] {
        std::lock_guard<std::mutex> lk(log_counts_mutex());
        return log_counts();
    }, "How often ggml logged each message about CUDA graphs (digits as #), since the module loaded: ggml-cuda "
       "says there when it captures, reuses, resets or disables its CUDA graphs, and why.");
    m.attr("GGML_VERSION") = ggml_version();
    m.attr("GGML_COMMIT") = ggml_commit();
}

}  // namespace superggml
