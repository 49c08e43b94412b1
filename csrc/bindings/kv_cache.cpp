#include "bindings.h"

#include "graph.h"
#include "kv-cache.h"
#include "lease.h"

#include <ggml-backend.h>

#include <ggml.h>
#include <pybind11/stl.h>

namespace py = pybind11;

namespace superggml {

// The cache with what it points into: the K/V tensors' contexts and its fill workers.
struct kv_handle {
    std::vector<std::shared_ptr<void>> owners;
    std::unique_ptr<task_pool> workers;
    std::unique_ptr<kv_cache> kv;   // destroyed first: it waits for its fills
};

py::dict to_dict(const kv_stats & s) {
    py::dict d;
    d["kv_pages_device"] = s.pages_device; d["kv_pages_host"] = s.pages_host; d["kv_pages_disk"] = s.pages_disk;
    d["kv_pages_loaded"] = s.pages_loaded; d["kv_pages_prefetched"] = s.pages_prefetched;
    d["kv_pages_written_back"] = s.pages_written_back; d["kv_pages_evicted"] = s.pages_evicted;
    d["kv_pages_spilled"] = s.pages_spilled; d["kv_pages_forgotten"] = s.pages_forgotten;
    d["kv_frame_hits"] = s.frame_hits; d["kv_frame_misses"] = s.frame_misses;
    d["kv_tokens"] = s.tokens; d["kv_token_slots"] = s.token_slots;
    d["kv_page_waste"] = s.token_slots ? 1.0 - (double) s.tokens / (double) s.token_slots : 0.0;
    d["kv_host_bytes"] = s.host_bytes; d["kv_disk_bytes"] = s.disk_bytes;
    d["kv_frame_bytes"] = s.frame_bytes; d["kv_frames"] = s.n_frames;
    d["kv_resident_layers"] = s.n_resident_layers;
    return d;
}

static std::shared_ptr<kv_lease> frame_acquire(const std::shared_ptr<kv_handle> & h, int seq, int layer, int64_t n_valid) {
    {
        py::gil_scoped_release nogil;
        h->kv->acquire(seq, layer, n_valid);
    }
    kv_cache * kv = h->kv.get();
    ggml_tensor * k = kv->k(layer), * v = kv->v(layer);    // v nullptr: K only
    auto r = std::make_shared<kv_lease>();
    r->seq = seq;
    r->layer = layer;
    r->n_valid = *r->n_end = n_valid;
    r->owner = h;
    r->buffer = k->buffer;
    r->host = ggml_backend_buffer_is_host(k->buffer);
    r->base = static_cast<uint8_t *>(k->data);
    r->v_offset = v ? (size_t) (static_cast<uint8_t *>(v->data) - r->base) : ggml_nbytes(k);
    r->size = r->v_offset + (v ? ggml_nbytes(v) : 0);
    r->what = "KV frame of (seq " + std::to_string(seq) + ", layer " + std::to_string(layer) + ")";
    r->on_release = [kv, seq, layer, end = r->n_end] { kv->release(seq, layer, *end); };
    return r;
}

void init_kv_cache(py::module_ & m) {
    py::class_<kv_lease, lease, std::shared_ptr<kv_lease>> frame(m, "KVFrame", py::buffer_protocol(),
        "A (sequence, layer)'s K and V held in a frame by KVCache.acquire_frame: K at byte 0, V at v_offset, "
        "viewable without a copy until release(); rows written up to written() become dirty pages.");
    lease_buffer_procs(frame);
    frame.def_property_readonly("seq", [](const kv_lease & r) { return r.seq; })
        .def_property_readonly("layer", [](const kv_lease & r) { return r.layer; })
        .def_property_readonly("n_valid", [](const kv_lease & r) { return r.n_valid; },
                               "rows [0, n_valid) held the cached tokens at acquire")
        .def_property_readonly("n_end", [](const kv_lease & r) { return *r.n_end; })
        .def_property_readonly("v_offset", [](const kv_lease & r) { return r.v_offset; })
        .def("written", [](kv_lease & r, int64_t n_end) {
            r.check();
            if (n_end < 0) throw Error("written: n_end must be >= 0");
            *r.n_end = n_end;
        }, py::arg("n_end"), "Rows up to n_end were written: release() marks their pages dirty.")
        .def("k", [](const kv_lease & r) {
            r.check();
            return tensor_ref{static_cast<kv_handle *>(r.owner.get())->kv->k(r.layer), r.owner};
        }, "The layer's K tensor, bound to the frame (for ggml graphs).")
        .def("v", [](const kv_lease & r) -> std::optional<tensor_ref> {
            r.check();
            ggml_tensor * v = static_cast<kv_handle *>(r.owner.get())->kv->v(r.layer);
            if (!v) return std::nullopt;
            return tensor_ref{v, r.owner};
        }, "The layer's V tensor, bound to the frame (None for a cache of K only).");

    m.attr("KV_PAGE_MIN") = KV_PAGE_MIN;
    m.attr("KV_PAGE_MAX") = KV_PAGE_MAX;
    py::class_<kv_handle, std::shared_ptr<kv_handle>>(m, "KVCache",
        "Paged K/V cache: pages of page_size tokens in device frames, host memory (a budget) and a spill file.\n"
        "v empty: a cache of K only (a latent K/V).")
        .def(py::init([](const std::vector<tensor_ref> & k, const std::vector<tensor_ref> & v, int page_size,
                         int n_frames, std::optional<size_t> host_budget, const std::string & spill_dir,
                         bool v_trans, compute_backend * backend, int n_workers, int n_stream) {
            if (k.empty() || (!v.empty() && k.size() != v.size())) {
                throw Error("KVCache needs one K and one V tensor per layer (or K only, a latent K/V)");
            }
            auto h = std::make_shared<kv_handle>();
            kv_params p;
            p.n_layer = (int) k.size();
            p.n_embd_gqa = k[0].t->ne[0];
            p.n_ctx = k[0].t->ne[1];
            p.k_row = ggml_row_size(k[0].t->type, p.n_embd_gqa);
            p.has_v = !v.empty();
            p.n_embd_v_gqa = p.has_v ? v[0].t->ne[0] : p.n_embd_gqa;
            p.v_row = p.has_v ? ggml_row_size(v[0].t->type, p.n_embd_v_gqa) : 0;
            p.v_trans = v_trans;
            p.page_size = page_size;
            p.n_frames = n_frames;
            p.n_stream = n_stream;
            p.host_budget = host_budget ? *host_budget : SIZE_MAX;
            p.spill_dir = spill_dir;
            p.buft = backend ? backend->buffer_type() : nullptr;
            std::vector<ggml_tensor *> kt, vt;
            for (size_t i = 0; i < k.size(); ++i) {
                if (ggml_nelements(k[i].t) != p.n_embd_gqa * p.n_ctx || k[i].t->type != k[0].t->type ||
                    (p.has_v && (ggml_nelements(v[i].t) != p.n_embd_v_gqa * p.n_ctx || v[i].t->type != v[0].t->type))) {
                    throw Error("KVCache: every K tensor must be [n_embd_gqa, n_ctx] of one type, and every V "
                                "[n_embd_v_gqa, n_ctx]");
                }
                if (p.has_v && v_trans && ggml_is_quantized(v[i].t->type)) {
                    throw Error("KVCache: a transposed V cache needs a type of whole elements, not a quantized one");
                }
                kt.push_back(k[i].t);
                h->owners.push_back(k[i].owner);
                if (p.has_v) {
                    vt.push_back(v[i].t);
                    h->owners.push_back(v[i].owner);
                }
            }
            if (n_workers > 0) h->workers = std::make_unique<task_pool>(n_workers, "KV fill");
            h->kv = std::make_unique<kv_cache>(p, kt, vt, h->workers.get());
            return h;
        }), py::arg("k"), py::arg("v"), py::arg("page_size") = 256, py::arg("n_frames") = 0,
            py::arg("host_budget") = py::none(), py::arg("spill_dir") = "", py::arg("v_trans") = true,
            py::arg("backend") = nullptr, py::arg("n_workers") = 1, py::arg("n_stream") = 1)
        .def("acquire", [](kv_handle & h, int seq, int layer, int64_t n_valid, tensor_ref * k, tensor_ref * v) {
                 py::gil_scoped_release nogil;
                 h.kv->acquire(seq, layer, n_valid, k ? k->t : nullptr, v ? v->t : nullptr);
             }, py::arg("seq"), py::arg("layer"), py::arg("n_valid"), py::arg("k") = nullptr, py::arg("v") = nullptr,
             "Binds the layer's K/V (or the tensors k, v of its shape: a lane of a pass over several sequences) to "
             "a frame holding rows [0, n_valid) of (seq, layer).")
        .def("acquire_frame", &frame_acquire, py::arg("seq"), py::arg("layer"), py::arg("n_valid"),
             "acquire() (GIL released) as a KVFrame lease whose release() releases (seq, layer).")
        .def("release", [](kv_handle & h, int seq, int layer, int64_t n_end) { h.kv->release(seq, layer, n_end); },
             py::arg("seq"), py::arg("layer"), py::arg("n_end"), "Rows up to n_end were written: their pages are dirty.")
        .def("prefetch", [](kv_handle & h, int seq, int layer, int64_t n_valid) { return h.kv->prefetch(seq, layer, n_valid); },
             py::arg("seq"), py::arg("layer"), py::arg("n_valid"), py::call_guard<py::gil_scoped_release>(),
             "Starts filling a frame on a worker; False if no frame is free.")
        .def("seq_truncate", [](kv_handle & h, int seq, int64_t n) { h.kv->seq_truncate(seq, n); },
             py::arg("seq"), py::arg("n"), py::call_guard<py::gil_scoped_release>(),
             "Forgets tokens >= n of the sequence (0: all), freeing their pages.")
        .def("seq_forget", [](kv_handle & h, int seq, int layer, int64_t n_first) { h.kv->seq_forget(seq, layer, n_first); },
             py::arg("seq"), py::arg("layer"), py::arg("n_first"), py::call_guard<py::gil_scoped_release>(),
             "Frees the pages of (seq, layer) wholly below token n_first (outside a sliding window).")
        .def_property_readonly("page_bytes", [](const kv_handle & h) { return h.kv->page_bytes(); })
        .def_property_readonly("page_size", [](const kv_handle & h) { return h.kv->params().page_size; })
        .def("stats", [](const kv_handle & h) { return to_dict(h.kv->stats()); });
}

}  // namespace superggml
