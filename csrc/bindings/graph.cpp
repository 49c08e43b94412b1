#include "bindings.h"

#include "graph.h"
#include "remote.h"
#include "tensor-bind.h"

#include <ggml.h>
#include <ggml-backend.h>
#include <ggml-cpu.h>
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <unordered_set>

namespace py = pybind11;

namespace superggml {

struct graph_ref {
    ggml_cgraph * g = nullptr;
    std::shared_ptr<graph_context> owner;
};

// Views have their storage through view_src, as ggml_backend_tensor_set/get read it.
static void need_storage(const ggml_tensor * t, const char * op) {
    if (!t->data || !(t->buffer || (t->view_src && t->view_src->buffer))) {
        throw Error(std::string(op) + ": '" + t->name + "' has no storage");
    }
}

// DeviceError if the RPC server holding the tensor's storage failed (its relay then answers with zeros).
static void check_device(const ggml_tensor * t) {
    const ggml_backend_buffer * b = t->buffer ? t->buffer : (t->view_src ? t->view_src->buffer : nullptr);
    if (!b) return;
    // a buffer over host memory from a pointer (the file mapping, an aligned pool slot) has no device: nothing
    // to check (remote_device_check(nullptr) would check every RPC server)
    if (auto * dev = ggml_backend_buft_get_device(ggml_backend_buffer_get_type(const_cast<ggml_backend_buffer *>(b)))) {
        remote_device_check(dev);
    }
}

static std::vector<int64_t> shape_of(const ggml_tensor * t) {
    int n = ggml_n_dims(t);
    return std::vector<int64_t>(t->ne, t->ne + n);
}

void init_graph(py::module_ & m) {
    py::enum_<ggml_type>(m, "GGMLType")
        .value("F32", GGML_TYPE_F32).value("F16", GGML_TYPE_F16).value("BF16", GGML_TYPE_BF16)
        .value("I32", GGML_TYPE_I32).value("I64", GGML_TYPE_I64)
        .value("Q4_0", GGML_TYPE_Q4_0).value("Q4_1", GGML_TYPE_Q4_1).value("Q8_0", GGML_TYPE_Q8_0)
        .value("Q5_0", GGML_TYPE_Q5_0).value("Q5_1", GGML_TYPE_Q5_1).value("Q2_K", GGML_TYPE_Q2_K)
        .value("Q3_K", GGML_TYPE_Q3_K).value("Q4_K", GGML_TYPE_Q4_K).value("Q5_K", GGML_TYPE_Q5_K)
        .value("Q6_K", GGML_TYPE_Q6_K).value("Q8_1", GGML_TYPE_Q8_1).value("Q8_K", GGML_TYPE_Q8_K).value("IQ4_NL", GGML_TYPE_IQ4_NL).value("MXFP4", GGML_TYPE_MXFP4);

    py::class_<tensor_ref>(m, "Tensor", "A ggml tensor (a node or leaf of a graph, or a paged weight).")
        .def_property_readonly("shape", [](const tensor_ref & r) { return shape_of(r.t); },
            "ne in ggml order (ne[0] = row length), trailing 1s dropped")
        .def_property_readonly("ne", [](const tensor_ref & r) { return std::vector<int64_t>(r.t->ne, r.t->ne + 4); })
        .def_property_readonly("nb", [](const tensor_ref & r) { return std::vector<size_t>(r.t->nb, r.t->nb + 4); })
        .def_property_readonly("type", [](const tensor_ref & r) { return r.t->type; })
        .def_property_readonly("type_name", [](const tensor_ref & r) { return std::string(ggml_type_name(r.t->type)); })
        .def_property_readonly("nbytes", [](const tensor_ref & r) { return ggml_nbytes(r.t); })
        .def_property_readonly("nelements", [](const tensor_ref & r) { return ggml_nelements(r.t); })
        .def_property_readonly("element_size", [](const tensor_ref & r) { return ggml_element_size(r.t); })
        .def_property_readonly("bound", [](const tensor_ref & r) { return r.t->data != nullptr; })
        .def_property("name", [](const tensor_ref & r) { return std::string(r.t->name); },
            [](tensor_ref & r, const std::string & n) { ggml_set_name(r.t, n.c_str()); })
        .def("set_input", [](tensor_ref & r) { ggml_set_input(r.t); })
        .def("set_output", [](tensor_ref & r) { ggml_set_output(r.t); })
        .def("__repr__", [](const tensor_ref & r) {
            std::string s = "<Tensor '" + std::string(r.t->name) + "' " + ggml_type_name(r.t->type) + " [";
            for (int i = 0; i < ggml_n_dims(r.t); ++i) s += (i ? ", " : "") + std::to_string(r.t->ne[i]);
            return s + "]>";
        });

    py::class_<graph_ref>(m, "Graph", "A ggml compute graph.")
        .def("expand", [](graph_ref & g, const tensor_ref & t) {
            g.owner->graph_expand(g.g, t.t);
        }, "Adds `t` and everything it depends on; SuperggmlError if the graph has no room.")
        .def_property_readonly("n_nodes", [](const graph_ref & g) { return ggml_graph_n_nodes(g.g); });

    py::class_<graph_context, std::shared_ptr<graph_context>>(m, "Context",
        "A no-alloc ggml context: tensors and ops are made here, storage comes later.")
        .def(py::init<size_t, size_t>(), py::arg("max_tensors") = 1024, py::arg("graph_size") = 0)
        .def("new_graph", [](const std::shared_ptr<graph_context> & c) {
            return graph_ref{c->new_graph(), c};
        });

    py::class_<buffer_handle, std::shared_ptr<buffer_handle>>(m, "Buffer", "A backend buffer (owned).")
        .def_property_readonly("size", &buffer_handle::size)
        .def("clear", [](buffer_handle & b, uint8_t v) { ggml_backend_buffer_clear(b.buf, v); }, py::arg("value") = 0);

    py::class_<compute_backend, std::shared_ptr<compute_backend>>(m, "Backend",
        "A ggml device plus the allocator of graph intermediates.")
        .def(py::init([](const std::string & device, int n_threads, int poll) {
            backend_params p; p.device = device; p.n_threads = n_threads; p.poll = poll;
            return std::make_shared<compute_backend>(p);
        }), py::arg("device") = "", py::arg("n_threads") = 4, py::arg("poll") = 0)
        .def_property_readonly("name", &compute_backend::name)
        .def_property_readonly("device_name", [](const compute_backend & b) {
            return std::string(ggml_backend_dev_name(b.device()));
        })
        .def_property_readonly("device_type", [](const compute_backend & b) -> std::string {
            switch (ggml_backend_dev_type(b.device())) {
                case GGML_BACKEND_DEVICE_TYPE_GPU: return "gpu";
                case GGML_BACKEND_DEVICE_TYPE_IGPU: return "igpu";
                case GGML_BACKEND_DEVICE_TYPE_ACCEL: return "accel";
                default: return "cpu";
            }
        }, "cpu, gpu, igpu or accel: the kind of memory the weights land in")
        .def_property_readonly("endpoint", [](const compute_backend & b) { return remote_device_endpoint(b.device()); },
            "The RPC server the device is on (\"host:port\"); \"\" for a device of this machine.")
        .def_property_readonly("is_host", [](const compute_backend & b) {
            return ggml_backend_buft_is_host(b.buffer_type());
        }, "Whether the device's buffers are host memory (the CPU) or its own (a GPU, an RPC server).")
        .def_property("n_threads", &compute_backend::n_threads, &compute_backend::set_n_threads)
        .def_property("poll", &compute_backend::poll, &compute_backend::set_poll,
                      "CPU: the thread pool's poll level (0: idle workers sleep between graphs; 1-100: they spin first)")
        .def_property("use_ref", [](const compute_backend & b) { return b.use_ref(); },
                      [](compute_backend & b, bool on) { b.set_use_ref(on); },
                      "CPU: ggml-cpu's reference matmul path (no tiled K-quant kernels from 8 rows on, no fused "
                      "ops): a row's result does not depend on how many rows the op has. Other devices: ignored.")
        .def_property_readonly("compute_buffer_size", &compute_backend::compute_buffer_size)
        .def("stats", [](const compute_backend & b) {
            compute_stats s;
            {
                py::gil_scoped_release nogil;   // with timing on, waits for the watcher's last spans
                s = b.stats();
            }
            py::dict d;
            d["graphs"] = s.graphs; d["reused"] = s.reused; d["nodes"] = s.nodes;
            d["prepare_s"] = s.prepare_s; d["launch_s"] = s.launch_s; d["wait_s"] = s.wait_s;
            d["device_s"] = s.device_s; d["device_graphs"] = s.device_graphs;
            return d;
        }, "What the graphs cost so far: graphs, reused (computed again unchanged: no allocation, ggml-cuda's CUDA "
           "graph replayed as it was), nodes (operations), prepare_s (host: checks, allocation), launch_s (ggml's "
           "graph compute: the CPU computing, a GPU being queued kernels), wait_s (synchronize), device_s and "
           "device_graphs (the device's span per graph from its events, with timing on; 0 where it has none).")
        .def_property("timing", &compute_backend::timing, &compute_backend::set_timing,
            "Records events around each graph, where the device has them (a GPU), for stats()['device_s'].")
        .def("compute", [](compute_backend & b, const graph_ref & g, bool sync) {
            try {
                py::gil_scoped_release nogil;
                b.compute(g.g, sync);
            } catch (const Error &) {
                remote_device_check(b.device());   // a failed server's empty answers fail the allocation: its DeviceError
                throw;
            }
            remote_device_check(b.device());
        }, py::arg("graph"), py::arg("sync") = true,
           "Allocates intermediates and runs the graph (sync=False: queued on the device's stream, see "
           "synchronize); the GIL is released.")
        .def("tensor_set_async", [](compute_backend & b, tensor_ref & r, py::buffer data) {
            py::buffer_info info = data.request();
            size_t n = (size_t) info.size * (size_t) info.itemsize;
            need_storage(r.t, "tensor_set_async");
            if (n > ggml_nbytes(r.t)) throw Error("tensor_set_async: data larger than the tensor");
            ggml_backend_buffer * buf = r.t->buffer ? r.t->buffer : r.t->view_src->buffer;
            // the device's own memory: queued on its stream (a GPU copies the bytes out before it returns);
            // anything else (host memory, another device's): copied at once
            const bool queue = ggml_backend_buffer_get_type(buf) == b.buffer_type() && !ggml_backend_buffer_is_host(buf);
            {
                py::gil_scoped_release nogil;
                if (queue) ggml_backend_tensor_set_async(b.backend(), r.t, info.ptr, 0, n);
                else ggml_backend_tensor_set(r.t, info.ptr, 0, n);
            }
            check_device(r.t);
        }, py::arg("tensor"), py::arg("data"),
           "Copies a contiguous buffer into the tensor: queued on this device's stream where the tensor is in the "
           "device's own memory (ordered with its graphs, no wait for them), else at once.")
        .def("synchronize", [](compute_backend & b) {
            {
                py::gil_scoped_release nogil;
                b.synchronize();
            }
            remote_device_check(b.device());
        }, "Waits for the graphs and copies queued on this device.")
        .def("alloc_tensors", [](compute_backend & b, const std::shared_ptr<graph_context> & c) {
            try {
                py::gil_scoped_release nogil;        // an RPC device's allocation is a round trip
                return alloc_tensors(*c, b.buffer_type());
            } catch (const Error &) {
                remote_device_check(b.device());              // a failed server's stand-in answer: its DeviceError
                throw;
            }
        }, "Allocates every unallocated tensor of the context in one new buffer of this device (DeviceError if "
           "it is on an RPC server that failed).");

    m.def("tensor_set", [](tensor_ref & r, py::buffer data, size_t offset) {
        py::buffer_info info = data.request();
        size_t n = (size_t) info.size * (size_t) info.itemsize;
        need_storage(r.t, "tensor_set");
        if (offset + n > ggml_nbytes(r.t)) throw Error("tensor_set: data larger than the tensor");
        {
            py::gil_scoped_release nogil;
            ggml_backend_tensor_set(r.t, info.ptr, offset, n);
        }
        check_device(r.t);
    }, py::arg("tensor"), py::arg("data"), py::arg("offset") = 0,
       "Copies the bytes of a contiguous buffer into the tensor's storage at byte `offset`.");

    m.def("tensor_alias", [](tensor_ref & dst, tensor_ref & src, size_t offset) {
        if (!src.t->buffer || !src.t->data) throw Error("tensor_alias: the source holds no memory");
        if (dst.t->type != src.t->type) throw Error("tensor_alias: the tensors differ in type");
        if (offset != 0 || !ggml_are_same_shape(dst.t, src.t)) {
            if (!ggml_is_contiguous(dst.t) || !ggml_is_contiguous(src.t) ||
                offset > ggml_nbytes(src.t) || ggml_nbytes(dst.t) > ggml_nbytes(src.t) - offset) {
                throw Error("tensor_alias: dst does not fit in src at that offset (or a tensor is not contiguous)");
            }
        }
        tensor_bind(dst.t, src.t->buffer, static_cast<char *>(src.t->data) + offset);
    }, py::arg("dst"), py::arg("src"), py::arg("offset") = 0,
       "Points dst at src's memory from byte `offset` (same type; dst contiguous and within src): graphs built on "
       "dst read and write those bytes from their next compute on.");
    m.def("tensor_copy", [](tensor_ref & src, tensor_ref & dst) {
        need_storage(src.t, "tensor_copy");
        need_storage(dst.t, "tensor_copy");
        if (src.t->type != dst.t->type || !ggml_are_same_shape(src.t, dst.t) || !ggml_is_contiguous(src.t) || !ggml_is_contiguous(dst.t)) throw Error("tensor_copy: the tensors must be contiguous, of one type and shape");
        for (ggml_tensor * t : {src.t, dst.t}) {
            if (!t->buffer && t->view_src) ggml_backend_view_init(t);   // a view: ggml's copy reads its buffer
        }
        {
            py::gil_scoped_release nogil;
            ggml_backend_tensor_copy(src.t, dst.t);
        }
        check_device(src.t);
        check_device(dst.t);
    }, py::arg("src"), py::arg("dst"), "Copies src into dst across backends (same type and shape).");

    m.def("tensor_get", [](tensor_ref & r) {
        need_storage(r.t, "tensor_get");
        if (!ggml_is_contiguous(r.t)) throw Error("tensor_get: tensor is not contiguous");
        std::vector<py::ssize_t> shape;
        for (int i = ggml_n_dims(r.t) - 1; i >= 0; --i) shape.push_back(r.t->ne[i]);
        auto fetch = [&](auto dummy) {
            using T = decltype(dummy);
            py::array_t<T> a(shape);
            {
                py::gil_scoped_release nogil;
                ggml_backend_tensor_get(r.t, a.mutable_data(), 0, ggml_nbytes(r.t));
            }
            check_device(r.t);
            return py::object(a);
        };
        switch (r.t->type) {
            case GGML_TYPE_F32: return fetch(float{});
            case GGML_TYPE_I32: return fetch(int32_t{});
            case GGML_TYPE_F16: return fetch(uint16_t{});
            default: {
                std::string s(ggml_nbytes(r.t), '\0');
                ggml_backend_tensor_get(r.t, s.data(), 0, s.size());
                check_device(r.t);
                return py::object(py::bytes(s));
            }
        }
    }, py::arg("tensor"), "Copies the tensor's contents out: numpy (shape reversed to row-major) for F32/I32/F16(raw), bytes otherwise.");

    m.def("cpu_features", [] {
        py::dict d;
        d["SSE3"] = ggml_cpu_has_sse3(); d["SSSE3"] = ggml_cpu_has_ssse3(); d["AVX"] = ggml_cpu_has_avx();
        d["AVX_VNNI"] = ggml_cpu_has_avx_vnni(); d["AVX2"] = ggml_cpu_has_avx2(); d["F16C"] = ggml_cpu_has_f16c();
        d["FMA"] = ggml_cpu_has_fma(); d["BMI2"] = ggml_cpu_has_bmi2(); d["AVX512"] = ggml_cpu_has_avx512();
        d["AVX512_VBMI"] = ggml_cpu_has_avx512_vbmi(); d["AVX512_VNNI"] = ggml_cpu_has_avx512_vnni();
        d["AVX512_BF16"] = ggml_cpu_has_avx512_bf16(); d["LLAMAFILE"] = ggml_cpu_has_llamafile();
        return d;
    }, "The instruction sets the loaded ggml-cpu was built for (as llama.cpp's system info).");

    m.def("vec_dot_type", [](ggml_type t) { return ggml_get_type_traits_cpu(t)->vec_dot_type; }, py::arg("type"),
          "The type ggml-cpu converts a matmul's activations to for weights of `type` (Q8_1 for Q4_1, ...).");
    m.def("to_vec_dot", [](ggml_type w, py::array_t<float, py::array::c_style | py::array::forcecast> rows) {
        if (rows.ndim() != 2) throw Error("to_vec_dot: need a 2-d F32 array [rows, row_length]");
        const auto * tr = ggml_get_type_traits_cpu(w);
        const ggml_type vt = tr->vec_dot_type;
        const int64_t n = rows.shape(1);
        if (n % ggml_blck_size(vt)) throw Error("to_vec_dot: row length is not a multiple of the block size");
        const auto * vtr = ggml_get_type_traits_cpu(vt);
        if (!vtr->from_float) throw Error(std::string("to_vec_dot: ggml-cpu cannot convert to ") + ggml_type_name(vt));
        py::array_t<uint8_t> out({(py::ssize_t) rows.shape(0), (py::ssize_t) ggml_row_size(vt, n)});
        for (py::ssize_t r = 0; r < rows.shape(0); ++r) {
            vtr->from_float(rows.data(r, 0), out.mutable_data(r, 0), n);
        }
        return py::make_tuple(vt, out);
    }, py::arg("type"), py::arg("rows"),
       "F32 activation rows as ggml-cpu converts them for a matmul with `type` weights: (vec_dot_type, bytes).");
    m.def("type_size", [](ggml_type t) { return ggml_type_size(t); });
    m.def("blck_size", [](ggml_type t) { return ggml_blck_size(t); });
    m.def("row_size", [](ggml_type t, int64_t ne) { return ggml_row_size(t, ne); });
    m.def("graph_overhead", [](size_t n) { return ggml_graph_overhead_custom(n, false); });
    m.def("quantize", [](ggml_type t, py::array_t<float, py::array::c_style | py::array::forcecast> rows) {
        if (rows.ndim() != 2) throw Error("quantize: need a 2-d F32 array [rows, row_length]");
        const int64_t nrows = rows.shape(0), n = rows.shape(1);
        if (ggml_get_type_traits(t)->is_quantized == false && t != GGML_TYPE_F16 && t != GGML_TYPE_BF16)
            throw Error(std::string("quantize: ") + ggml_type_name(t) + " is not a quantized type");
        if (n % ggml_blck_size(t)) throw Error("quantize: row length is not a multiple of the block size");
        py::array_t<uint8_t> out({(py::ssize_t) nrows, (py::ssize_t) ggml_row_size(t, n)});
        {
            py::gil_scoped_release nogil;
            ggml_quantize_chunk(t, rows.data(), out.mutable_data(), 0, nrows, n, nullptr);
        }
        return out;
    }, py::arg("type"), py::arg("rows"),
       "F32 rows [n_rows, n] -> their bytes in `type` (uint8 [n_rows, row_size]), as ggml quantizes them.");

}

}  // namespace superggml
