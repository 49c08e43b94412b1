#include "bindings.h"

#include "convert.h"
#include "gguf-file.h"

#include <ggml.h>
#include <gguf.h>
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

namespace py = pybind11;

namespace superggml {

static py::str to_str(const char * s) {
    PyObject * o = PyUnicode_DecodeUTF8(s, (Py_ssize_t) strlen(s), "surrogateescape");
    if (!o) throw py::error_already_set();
    return py::reinterpret_steal<py::str>(o);
}

template <typename T>
static py::list arr_to_list(const void * data, size_t n) {
    const T * p = static_cast<const T *>(data);
    py::list l(n);
    for (size_t i = 0; i < n; ++i) l[i] = py::cast(p[i]);
    return l;
}

static py::object scalar(const gguf_context * g, int64_t k, gguf_type t) {
    switch (t) {
        case GGUF_TYPE_UINT8:   return py::int_(gguf_get_val_u8(g, k));
        case GGUF_TYPE_INT8:    return py::int_(gguf_get_val_i8(g, k));
        case GGUF_TYPE_UINT16:  return py::int_(gguf_get_val_u16(g, k));
        case GGUF_TYPE_INT16:   return py::int_(gguf_get_val_i16(g, k));
        case GGUF_TYPE_UINT32:  return py::int_(gguf_get_val_u32(g, k));
        case GGUF_TYPE_INT32:   return py::int_(gguf_get_val_i32(g, k));
        case GGUF_TYPE_UINT64:  return py::int_(gguf_get_val_u64(g, k));
        case GGUF_TYPE_INT64:   return py::int_(gguf_get_val_i64(g, k));
        case GGUF_TYPE_FLOAT32: return py::float_(gguf_get_val_f32(g, k));
        case GGUF_TYPE_FLOAT64: return py::float_(gguf_get_val_f64(g, k));
        case GGUF_TYPE_BOOL:    return py::bool_(gguf_get_val_bool(g, k));
        case GGUF_TYPE_STRING:  return to_str(gguf_get_val_str(g, k));
        default: return py::none();
    }
}

static py::object value(const gguf_context * g, int64_t k) {
    gguf_type t = gguf_get_kv_type(g, k);
    if (t != GGUF_TYPE_ARRAY) return scalar(g, k, t);
    gguf_type at = gguf_get_arr_type(g, k);
    size_t n = gguf_get_arr_n(g, k);
    if (at == GGUF_TYPE_STRING) {
        py::list l(n);
        for (size_t i = 0; i < n; ++i) l[i] = to_str(gguf_get_arr_str(g, k, i));
        return l;
    }
    const void * d = gguf_get_arr_data(g, k);
    switch (at) {
        case GGUF_TYPE_UINT8:   return arr_to_list<uint8_t>(d, n);
        case GGUF_TYPE_INT8:    return arr_to_list<int8_t>(d, n);
        case GGUF_TYPE_UINT16:  return arr_to_list<uint16_t>(d, n);
        case GGUF_TYPE_INT16:   return arr_to_list<int16_t>(d, n);
        case GGUF_TYPE_UINT32:  return arr_to_list<uint32_t>(d, n);
        case GGUF_TYPE_INT32:   return arr_to_list<int32_t>(d, n);
        case GGUF_TYPE_UINT64:  return arr_to_list<uint64_t>(d, n);
        case GGUF_TYPE_INT64:   return arr_to_list<int64_t>(d, n);
        case GGUF_TYPE_FLOAT32: return arr_to_list<float>(d, n);
        case GGUF_TYPE_FLOAT64: return arr_to_list<double>(d, n);
        case GGUF_TYPE_BOOL:    return arr_to_list<bool>(d, n);
        default: return py::none();
    }
}

void init_gguf_file(py::module_ & m) {
    m.def("rows_bytes", &rows_bytes, py::arg("type"), py::arg("n_rows"), py::arg("row_len"),
          "Bytes of n_rows rows of row_len elements of a ggml type (SuperggmlError if row_len is not a multiple "
          "of its block size).");
    m.def("convert_rows", [](int src_type, py::buffer src, int64_t n_rows, int64_t row_len, int dst_type,
                             py::object out, int n_threads) -> py::object {
        const size_t need = rows_bytes(src_type, n_rows, row_len);
        py::buffer_info in = src.request();
        if (!PyBuffer_IsContiguous(in.view(), 'C')) throw Error("convert_rows: the source is not contiguous");
        if ((size_t) in.size * (size_t) in.itemsize < need) {
            throw Error("convert_rows: the source holds " + std::to_string(in.size * in.itemsize) + " bytes, " +
                        std::to_string(n_rows) + " rows need " + std::to_string(need));
        }
        if (dst_type != GGML_TYPE_F32 && dst_type != GGML_TYPE_F16) throw Error("convert_rows: the output is F32 or F16");
        const size_t out_bytes = (size_t) n_rows * (size_t) row_len * (dst_type == GGML_TYPE_F32 ? 4 : 2);
        py::object result = out;
        if (out.is_none()) {
            if (dst_type == GGML_TYPE_F32) result = py::array_t<float>({(py::ssize_t) n_rows, (py::ssize_t) row_len});
            else result = py::array(py::dtype("float16"), {(py::ssize_t) n_rows, (py::ssize_t) row_len});
        }
        py::buffer_info o = py::reinterpret_borrow<py::buffer>(result).request(true);
        if (!PyBuffer_IsContiguous(o.view(), 'C')) throw Error("convert_rows: the output is not contiguous");
        if ((size_t) o.size * (size_t) o.itemsize < out_bytes) {
            throw Error("convert_rows: the output holds " + std::to_string(o.size * o.itemsize) + " bytes, " +
                        std::to_string(out_bytes) + " are needed");
        }
        {
            py::gil_scoped_release nogil;
            convert_rows(src_type, in.ptr, n_rows, row_len, dst_type, o.ptr, n_threads);
        }
        return result;
    }, py::arg("src_type"), py::arg("src"), py::arg("n_rows"), py::arg("row_len"), py::arg("dst_type"),
       py::arg("out") = py::none(), py::arg("n_threads") = 1,
       "Converts rows of a ggml type (bytes in any buffer: a Slot, numpy, bytes) to F32 or F16 with ggml's type "
       "traits, into `out` (a writable contiguous buffer) or a new numpy array [n_rows, row_len]; GIL released.");
    py::class_<gguf_file, std::shared_ptr<gguf_file>>(m, "GGUFFile",
        "A GGUF file: header parsed, tensor ranges validated, data mapped read-only.")
        .def(py::init<const std::string &>(), py::arg("path"), py::call_guard<py::gil_scoped_release>())
        .def_property_readonly("path", &gguf_file::path)
        .def_property_readonly("file_size", &gguf_file::file_size)
        .def_property_readonly("data_offset", &gguf_file::data_offset)
        .def_property_readonly("alignment", &gguf_file::alignment)
        .def_property_readonly("closed", &gguf_file::closed)
        .def("metadata", [](const gguf_file & f) {
            if (f.closed()) throw Error("the GGUF file is closed");
            if (!f.has_header()) throw Error("the GGUF header was dropped after loading");
            py::dict d;
            const gguf_context * g = f.gguf();
            for (int64_t k = 0; k < gguf_get_n_kv(g); ++k) d[to_str(gguf_get_key(g, k))] = value(g, k);
            return d;
        }, "All key/value pairs of the header as a dict (arrays as lists).")
        .def("tensors", [](const gguf_file & f) {
            py::list l;
            for (const auto & ti : f.tensors()) {
                py::list shape;
                for (int d = 0; d < ti.n_dims; ++d) shape.append(ti.ne[d]);
                l.append(py::make_tuple(ti.name, ggml_type_name((ggml_type) ti.type), shape, ti.offset, ti.nbytes));
            }
            return l;
        }, "Tensor table: (name, type name, shape in ggml order, absolute offset, nbytes).")
        .def("drop_header", &gguf_file::drop_header, "Frees the parsed key/value header (metadata() then raises).")
        .def("close", &gguf_file::close);
}

}  // namespace superggml
