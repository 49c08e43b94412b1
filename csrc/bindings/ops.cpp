#include "bindings.h"

#include "graph.h"

#include <ggml.h>
#include <pybind11/stl.h>

namespace py = pybind11;

namespace superggml {

using ctx_ptr = std::shared_ptr<graph_context>;
using T = tensor_ref;

// Every op checks room and shapes first: ggml itself would abort the process.
static T wrap(const ctx_ptr & c, ggml_tensor * t) { return T{t, c}; }

static void need(bool ok, const char * op, const char * what) {
    if (!ok) throw Error(std::string(op) + ": " + what);
}

void init_ops(py::module_ & m) {
    auto ctx = py::reinterpret_borrow<py::class_<graph_context, ctx_ptr>>(m.attr("Context"));

    ctx.def("new_tensor", [](const ctx_ptr & c, ggml_type type, const std::vector<int64_t> & shape) {
        need(!shape.empty() && shape.size() <= 4, "new_tensor", "shape must have 1..4 dims");
        c->check_room();
        int64_t ne[4] = {1, 1, 1, 1};
        for (size_t i = 0; i < shape.size(); ++i) ne[i] = shape[i];
        return wrap(c, ggml_new_tensor(c->ctx(), type, (int) shape.size(), ne));
    }, py::arg("type"), py::arg("shape"), "New tensor, shape in ggml order (ne[0] first).");

    ctx.def("mul_mat", [](const ctx_ptr & c, const T & a, const T & b) {
        need(a.t->ne[0] == b.t->ne[0] && b.t->ne[2] % a.t->ne[2] == 0 && b.t->ne[3] % a.t->ne[3] == 0, "mul_mat", "shapes do not match (a.ne[0] != b.ne[0] or no broadcast)");
        c->check_room();
        return wrap(c, ggml_mul_mat(c->ctx(), a.t, b.t));
    }, "a [K, M, ...] x b [K, N, ...] -> F32 [M, N, ...]");
    ctx.def("mul_mat_set_prec_f32", [](const ctx_ptr &, T & a) { ggml_prec_set_acc(a.t, GGML_PREC_F32); });
    ctx.def("mul_mat_hadamard", [](const ctx_ptr & c, const T & a, const T & rot) {
        const int64_t n = rot.t->ne[0];
        need(rot.t->type == GGML_TYPE_F32 && rot.t->ne[1] == n && n > 0 && (n & (n - 1)) == 0 &&
             ggml_nelements(a.t) % n == 0, "mul_mat_hadamard", "rot must be F32 [n, n], n a power of 2 dividing a");
        c->check_room();
        ggml_context * x = c->ctx();
        ggml_tensor * r = ggml_is_contiguous(a.t) ? ggml_reshape_2d(x, a.t, n, ggml_nelements(a.t) / n)
                                                  : ggml_cont_2d(x, a.t, n, ggml_nelements(a.t) / n);
        r = ggml_mul_mat(x, rot.t, r);
        ggml_mul_mat_set_hint(r, GGML_HINT_SRC0_IS_HADAMARD);
        return wrap(c, ggml_reshape_4d(x, r, a.t->ne[0], a.t->ne[1], a.t->ne[2], a.t->ne[3]));
    }, "a rotated by rot, a Walsh-Hadamard matrix F32 [n, n], in rows of n values (the backend may use a fast "
       "transform), as llama.cpp rotates Q, K and V for a quantized K/V cache");

    auto binary = [&](const char * name, ggml_tensor * (*f)(ggml_context *, ggml_tensor *, ggml_tensor *)) {
        ctx.def(name, [f, name](const ctx_ptr & c, const T & a, const T & b) {
            need(ggml_can_repeat(b.t, a.t), name, "b does not broadcast to a");
            c->check_room();
            return wrap(c, f(c->ctx(), a.t, b.t));
        });
    };
    binary("add", ggml_add);
    binary("mul", ggml_mul);
    binary("sub", ggml_sub);
    binary("add_inplace", ggml_add_inplace);

    ctx.def("scale", [](const ctx_ptr & c, const T & a, float s) { c->check_room(); return wrap(c, ggml_scale(c->ctx(), a.t, s)); });
    ctx.def("norm", [](const ctx_ptr & c, const T & a, float eps) { c->check_room(); return wrap(c, ggml_norm(c->ctx(), a.t, eps)); },
            "each row less its mean, over its standard deviation (a layer norm without weight or bias)");
    ctx.def("rms_norm", [](const ctx_ptr & c, const T & a, float eps) { c->check_room(); return wrap(c, ggml_rms_norm(c->ctx(), a.t, eps)); });
    ctx.def("silu", [](const ctx_ptr & c, const T & a) { c->check_room(); return wrap(c, ggml_silu(c->ctx(), a.t)); });
    ctx.def("tanh", [](const ctx_ptr & c, const T & a) { c->check_room(); return wrap(c, ggml_tanh(c->ctx(), a.t)); });
    ctx.def("sigmoid", [](const ctx_ptr & c, const T & a) { c->check_room(); return wrap(c, ggml_sigmoid(c->ctx(), a.t)); });
    ctx.def("relu", [](const ctx_ptr & c, const T & a) { c->check_room(); return wrap(c, ggml_relu(c->ctx(), a.t)); });
    ctx.def("sqr", [](const ctx_ptr & c, const T & a) { c->check_room(); return wrap(c, ggml_sqr(c->ctx(), a.t)); });
    ctx.def("sqrt", [](const ctx_ptr & c, const T & a) { c->check_room(); return wrap(c, ggml_sqrt(c->ctx(), a.t)); });
    ctx.def("exp", [](const ctx_ptr & c, const T & a) { c->check_room(); return wrap(c, ggml_exp(c->ctx(), a.t)); });
    ctx.def("abs", [](const ctx_ptr & c, const T & a) { c->check_room(); return wrap(c, ggml_abs(c->ctx(), a.t)); });
    ctx.def("sgn", [](const ctx_ptr & c, const T & a) { c->check_room(); return wrap(c, ggml_sgn(c->ctx(), a.t)); },
            "-1, 0 or 1 by the sign of each value");
    ctx.def("arange", [](const ctx_ptr & c, float start, float stop, float step) {
        need(step != 0.0f && (stop - start) / step > 0.0f, "arange", "need a non-empty range");
        c->check_room();
        return wrap(c, ggml_arange(c->ctx(), start, stop, step));
    }, py::arg("start"), py::arg("stop"), py::arg("step") = 1.0f, "F32 [ceil((stop - start) / step)]: start, start + step, ...");
    ctx.def("pool_2d_max", [](const ctx_ptr & c, const T & a, int k0, int k1, int s0, int s1) {
        need(a.t->type == GGML_TYPE_F32 && k0 > 0 && k1 > 0 && s0 > 0 && s1 > 0, "pool_2d_max",
             "need F32 input and positive kernel sizes and strides");
        c->check_room();
        return wrap(c, ggml_pool_2d(c->ctx(), a.t, GGML_OP_POOL_MAX, k0, k1, s0, s1, 0.0f, 0.0f));
    }, py::arg("a"), py::arg("k0"), py::arg("k1"), py::arg("s0"), py::arg("s1"),
       "The largest value of each k0 x k1 window, stepping s0, s1 (no padding)");
    ctx.def("scale_bias", [](const ctx_ptr & c, const T & a, float s, float b) {
        c->check_room();
        return wrap(c, ggml_scale_bias(c->ctx(), a.t, s, b));
    }, "s * a + b");
    ctx.def("top_k", [](const ctx_ptr & c, const T & a, int k) {
        need(a.t->type == GGML_TYPE_F32 && k > 0 && k <= a.t->ne[0], "top_k", "need F32 rows of at least k values");
        c->check_room();
        return wrap(c, ggml_top_k(c->ctx(), a.t, k));
    }, py::arg("a"), py::arg("k"), "I32 indices of the k largest of each row, in no particular order");
    ctx.def("lightning_indexer", [](const ctx_ptr & c, const T & q, const T & k, const T & w, const T & mask) {
        need(q.t->type == GGML_TYPE_F32 && w.t->type == GGML_TYPE_F32 && mask.t->type == GGML_TYPE_F16 &&
             q.t->ne[0] == k.t->ne[0] && mask.t->ne[0] == k.t->ne[2] && q.t->ne[1] == w.t->ne[0] && k.t->ne[1] == 1 &&
             mask.t->ne[1] == q.t->ne[2] && q.t->ne[2] == w.t->ne[1] && w.t->ne[2] == 1 && mask.t->ne[2] == 1 &&
             q.t->ne[3] == k.t->ne[3] && k.t->ne[3] == w.t->ne[3] && w.t->ne[3] % mask.t->ne[3] == 0,
             "lightning_indexer", "shapes or types do not fit (see ggml.h)");
        c->check_room();
        return wrap(c, ggml_lightning_indexer(c->ctx(), q.t, k.t, w.t, mask.t));
    }, py::arg("q"), py::arg("k"), py::arg("weights"), py::arg("mask"),
       "DeepSeek's sparse-attention scores: q F32 [d, n_head, n, S], k [d, 1, n_kv, S], weights F32 [n_head, n, 1, S] "
       "(prescaled), mask F16 [n_kv, n, 1, S'] -> F32 [n_kv, n, 1, S]: sum over heads of relu(q.k) * weight, plus "
       "the mask");
    ctx.def("gelu", [](const ctx_ptr & c, const T & a) { c->check_room(); return wrap(c, ggml_gelu(c->ctx(), a.t)); });
    ctx.def("pad", [](const ctx_ptr & c, const T & a, std::vector<int> p) {
        need(p.size() >= 1 && p.size() <= 4, "pad", "1 to 4 sizes");
        p.resize(4, 0);
        for (int x : p) need(x >= 0, "pad", "sizes must not be negative");
        c->check_room();
        return wrap(c, ggml_pad(c->ctx(), a.t, p[0], p[1], p[2], p[3]));
    }, py::arg("a"), py::arg("p"), "a with p[i] zeros appended along dim i");
    ctx.def("softplus", [](const ctx_ptr & c, const T & a) { c->check_room(); return wrap(c, ggml_softplus(c->ctx(), a.t)); });
    ctx.def("sum_rows", [](const ctx_ptr & c, const T & a) { c->check_room(); return wrap(c, ggml_sum_rows(c->ctx(), a.t)); },
            "[n, ...] -> [1, ...]");
    ctx.def("fill", [](const ctx_ptr & c, const T & a, float v) {
        need((a.t->type == GGML_TYPE_F32 || a.t->type == GGML_TYPE_F16) && ggml_is_contiguous(a.t), "fill",
             "need a contiguous F32 or F16 tensor");
        c->check_room();
        return wrap(c, ggml_fill(c->ctx(), a.t, v));
    }, "A new tensor of a's shape, every element v.");
    ctx.def("clamp", [](const ctx_ptr & c, const T & a, float lo, float hi) {
        c->check_room();
        return wrap(c, ggml_clamp(c->ctx(), a.t, lo, hi));
    });
    ctx.def("argsort_top_k", [](const ctx_ptr & c, const T & a, int k) {
        need(a.t->type == GGML_TYPE_F32 && k >= 1 && k <= a.t->ne[0], "argsort_top_k", "need F32 rows of at least k");
        c->check_room();
        return wrap(c, ggml_argsort_top_k(c->ctx(), a.t, k));
    }, "I32 indices of the k largest of each row, largest first (a view of a descending argsort)");
    ctx.def("mul_mat_id", [](const ctx_ptr & c, const T & as, const T & b, const T & ids) {
        need(ids.t->type == GGML_TYPE_I32, "mul_mat_id", "ids must be I32");
        need(as.t->ne[0] == b.t->ne[0] && ids.t->ne[1] == b.t->ne[2] && b.t->ne[1] <= ids.t->ne[0] &&
             (b.t->ne[1] == 1 || b.t->ne[1] == ids.t->ne[0]), "mul_mat_id",
             "shapes do not match: as [K, M, n_as], b [K, 1 or n_used, n_tokens], ids I32 [n_used, n_tokens]");
        c->check_room();
        return wrap(c, ggml_mul_mat_id(c->ctx(), as.t, b.t, ids.t));
    }, "as [K, M, n_as] (one matrix per expert) x b [K, n_b, n_tokens] with ids I32 [n_used, n_tokens] -> F32 "
       "[M, n_used, n_tokens]");
    ctx.def("add_id", [](const ctx_ptr & c, const T & a, const T & b, const T & ids) {
        need(ids.t->type == GGML_TYPE_I32 && a.t->ne[0] == b.t->ne[0], "add_id", "a [n, n_used, n_tokens], b [n, n_as], ids I32");
        c->check_room();
        return wrap(c, ggml_add_id(c->ctx(), a.t, b.t, ids.t));
    }, "a + b[:, ids] (per-expert biases)");
    ctx.def("swiglu_oai", [](const ctx_ptr & c, const T & gate, const T & up, float alpha, float limit) {
        need(ggml_are_same_shape(gate.t, up.t), "swiglu_oai", "gate and up differ in shape");
        c->check_room();
        return wrap(c, ggml_swiglu_oai(c->ctx(), gate.t, up.t, alpha, limit));
    }, "gpt-oss's clamped SwiGLU");
    ctx.def("swiglu_clamp", [](const ctx_ptr & c, const T & gate, const T & up, float limit) {
        need(ggml_are_same_shape(gate.t, up.t) && gate.t->type == up.t->type && ggml_is_contiguous_1(gate.t) &&
             ggml_is_contiguous_1(up.t), "swiglu_clamp", "gate and up differ in shape or type, or are not contiguous rows");
        c->check_room();
        return wrap(c, ggml_swiglu_clamp(c->ctx(), gate.t, up.t, limit));
    }, "silu(min(gate, limit)) * clamp(up, -limit, limit) (DeepSeek V4's SwiGLU)");
    ctx.def("div", [](const ctx_ptr & c, const T & a, const T & b) {
        need(ggml_can_repeat(b.t, a.t), "div", "b does not broadcast to a");
        c->check_room();
        return wrap(c, ggml_div(c->ctx(), a.t, b.t));
    });
    ctx.def("swiglu_split", [](const ctx_ptr & c, const T & gate, const T & up) {
        need(ggml_are_same_shape(gate.t, up.t), "swiglu_split", "gate and up differ in shape");
        c->check_room();
        return wrap(c, ggml_swiglu_split(c->ctx(), gate.t, up.t));
    }, "silu(gate) * up");
    ctx.def("geglu_split", [](const ctx_ptr & c, const T & gate, const T & up) {
        need(ggml_are_same_shape(gate.t, up.t), "geglu_split", "gate and up differ in shape");
        c->check_room();
        return wrap(c, ggml_geglu_split(c->ctx(), gate.t, up.t));
    }, "gelu(gate) * up (ggml's tanh approximation)");
    ctx.def("cont", [](const ctx_ptr & c, const T & a) { c->check_room(); return wrap(c, ggml_cont(c->ctx(), a.t)); });
    ctx.def("cast", [](const ctx_ptr & c, const T & a, ggml_type t) { c->check_room(); return wrap(c, ggml_cast(c->ctx(), a.t, t)); });
    ctx.def("transpose", [](const ctx_ptr & c, const T & a) { c->check_room(); return wrap(c, ggml_transpose(c->ctx(), a.t)); });

    ctx.def("reshape", [](const ctx_ptr & c, const T & a, const std::vector<int64_t> & shape) {
        int64_t n = 1;
        for (auto s : shape) n *= s;
        need(!shape.empty() && shape.size() <= 4, "reshape", "shape must have 1..4 dims");
        need(n == ggml_nelements(a.t), "reshape", "element count differs");
        need(ggml_is_contiguous(a.t), "reshape", "tensor is not contiguous");
        c->check_room();
        ggml_context * x = c->ctx();
        switch (shape.size()) {
            case 1: return wrap(c, ggml_reshape_1d(x, a.t, shape[0]));
            case 2: return wrap(c, ggml_reshape_2d(x, a.t, shape[0], shape[1]));
            case 3: return wrap(c, ggml_reshape_3d(x, a.t, shape[0], shape[1], shape[2]));
            default: return wrap(c, ggml_reshape_4d(x, a.t, shape[0], shape[1], shape[2], shape[3]));
        }
    });

    ctx.def("view", [](const ctx_ptr & c, const T & a, const std::vector<int64_t> & shape,
                       const std::vector<size_t> & nb, size_t offset) {
        need(!shape.empty() && shape.size() <= 4 && nb.size() + 1 == shape.size(), "view",
             "need 1..4 dims and len(nb) == len(shape) - 1 (row strides in bytes)");
        int64_t ne[4] = {1, 1, 1, 1};
        size_t st[3] = {0, 0, 0};
        for (size_t i = 0; i < shape.size(); ++i) ne[i] = shape[i];
        for (size_t i = 0; i < nb.size(); ++i) st[i] = nb[i];
        size_t last = offset + ggml_row_size(a.t->type, ne[0]);
        for (int i = 1; i < 4; ++i) last += (ne[i] - 1) * (i - 1 < 3 ? st[i - 1] : 0);
        need(last <= ggml_nbytes(a.t), "view", "view reaches past the end of the tensor");
        c->check_room();
        ggml_context * x = c->ctx();
        switch (shape.size()) {
            case 1: return wrap(c, ggml_view_1d(x, a.t, ne[0], offset));
            case 2: return wrap(c, ggml_view_2d(x, a.t, ne[0], ne[1], st[0], offset));
            case 3: return wrap(c, ggml_view_3d(x, a.t, ne[0], ne[1], ne[2], st[0], st[1], offset));
            default: return wrap(c, ggml_view_4d(x, a.t, ne[0], ne[1], ne[2], ne[3], st[0], st[1], st[2], offset));
        }
    }, py::arg("a"), py::arg("shape"), py::arg("nb"), py::arg("offset") = 0,
       "View of `a`: shape in ggml order, nb = byte strides of dims 1.., byte offset.");

    ctx.def("permute", [](const ctx_ptr & c, const T & a, int a0, int a1, int a2, int a3) {
        c->check_room();
        return wrap(c, ggml_permute(c->ctx(), a.t, a0, a1, a2, a3));
    });

    ctx.def("concat", [](const ctx_ptr & c, const T & a, const T & b, int dim) {
        need(dim >= 0 && dim < 4, "concat", "dim must be 0..3");
        need(a.t->type == b.t->type, "concat", "a and b must have one type");
        for (int i = 0; i < 4; ++i) need(i == dim || a.t->ne[i] == b.t->ne[i], "concat", "shapes differ off dim");
        c->check_room();
        return wrap(c, ggml_concat(c->ctx(), a.t, b.t, dim));
    }, py::arg("a"), py::arg("b"), py::arg("dim"), "a and b joined along dim (the other dims equal).");
    ctx.def("repeat_4d", [](const ctx_ptr & c, const T & a, std::vector<int64_t> ne) {
        need(ne.size() >= 1 && ne.size() <= 4, "repeat_4d", "1 to 4 sizes");
        ne.resize(4, 1);
        for (int i = 0; i < 4; ++i) need(ne[i] > 0 && ne[i] % a.t->ne[i] == 0, "repeat_4d", "each size a multiple of a's");
        c->check_room();
        return wrap(c, ggml_repeat_4d(c->ctx(), a.t, ne[0], ne[1], ne[2], ne[3]));
    }, py::arg("a"), py::arg("ne"));
    ctx.def("get_rows", [](const ctx_ptr & c, const T & a, const T & idx) {
        need(idx.t->type == GGML_TYPE_I32, "get_rows", "indices must be I32");
        c->check_room();
        return wrap(c, ggml_get_rows(c->ctx(), a.t, idx.t));
    }, "Rows of `a` at I32 indices, as F32.");

    ctx.def("cpy", [](const ctx_ptr & c, const T & a, const T & b) {
        need(ggml_nelements(a.t) == ggml_nelements(b.t), "cpy", "element counts differ");
        c->check_room();
        return wrap(c, ggml_cpy(c->ctx(), a.t, b.t));
    }, "Copies a into b (converting type); returns a view of b.");

    ctx.def("set_rows", [](const ctx_ptr & c, const T & dst, const T & src, const T & idx) {
        need(idx.t->type == GGML_TYPE_I64 || idx.t->type == GGML_TYPE_I32, "set_rows", "indices must be I64 or I32");
        need(dst.t->ne[0] == src.t->ne[0] && src.t->ne[1] == idx.t->ne[0], "set_rows", "shapes do not match");
        c->check_room();
        return wrap(c, ggml_set_rows(c->ctx(), dst.t, src.t, idx.t));
    }, "dst[idx[i], :] = src[i, :] (rows of ne[0] elements, converting type).");

    using rope_fn = ggml_tensor * (*)(ggml_context *, ggml_tensor *, ggml_tensor *, ggml_tensor *, int, int, int, float,
                                      float, float, float, float, float);
    auto rope = [&](const char * name, rope_fn f, const char * doc) {
        ctx.def(name, [f, name](const ctx_ptr & c, const T & a, const T & pos, std::optional<T> freq_factors, int n_dims,
                                int mode, int n_ctx_orig, float freq_base, float freq_scale, float ext_factor,
                                float attn_factor, float beta_fast, float beta_slow, int offset) {
            need(pos.t->type == GGML_TYPE_I32 && pos.t->ne[0] == a.t->ne[2], name, "positions must be I32 [n_tokens]");
            need(n_dims <= a.t->ne[0] && n_dims % 2 == 0, name, "n_dims must be even and <= head_dim");
            need(offset >= 0 && offset + n_dims <= a.t->ne[0], name, "offset + n_dims must be <= head_dim");
            need(!freq_factors || (freq_factors->t->type == GGML_TYPE_F32 && freq_factors->t->ne[0] >= n_dims / 2),
                 name, "freq_factors must be F32 [n_dims/2]");
            c->check_room();
            ggml_tensor * r = f(c->ctx(), a.t, pos.t, freq_factors ? freq_factors->t : nullptr, n_dims, mode, n_ctx_orig,
                                freq_base, freq_scale, ext_factor, attn_factor, beta_fast, beta_slow);
            if (offset) {
                need(mode != GGML_ROPE_TYPE_VISION, name, "an offset does not apply to vision RoPE");
                ggml_rope_set_offset(r, offset);
            }
            return wrap(c, r);
        }, py::arg("a"), py::arg("pos"), py::arg("freq_factors"), py::arg("n_dims"), py::arg("mode"),
           py::arg("n_ctx_orig"), py::arg("freq_base"), py::arg("freq_scale") = 1.0f, py::arg("ext_factor") = 0.0f,
           py::arg("attn_factor") = 1.0f, py::arg("beta_fast") = 32.0f, py::arg("beta_slow") = 1.0f, py::kw_only(),
           py::arg("offset") = 0, doc);
    };
    rope("rope_ext", ggml_rope_ext,
         "RoPE of a [head_dim, n_head, n_tokens] at I32 positions; freq_factors (F32 [n_dims/2]) or None; offset: "
         "the rotated dims are [offset, offset + n_dims) (ggml_rope_set_offset), the others pass.");
    rope("rope_ext_back", ggml_rope_ext_back,
         "rope_ext's inverse: rotated back by the same angles (DeepSeek V4's attention output, whose V is its roped K).");

    ctx.def("rope_multi", [](const ctx_ptr & c, const T & a, const T & pos, int n_dims, std::vector<int> sections,
                             int mode, int n_ctx_orig, float freq_base, float freq_scale, float ext_factor,
                             float attn_factor, float beta_fast, float beta_slow) {
        need(pos.t->type == GGML_TYPE_I32 && pos.t->ne[0] == 4 * a.t->ne[2], "rope_multi",
             "positions must be I32 [4 * n_tokens]");
        need(n_dims <= a.t->ne[0] && n_dims % 2 == 0, "rope_multi", "n_dims must be even and <= head_dim");
        need(sections.size() == GGML_MROPE_SECTIONS, "rope_multi", "4 sections");
        c->check_room();
        return wrap(c, ggml_rope_multi(c->ctx(), a.t, pos.t, nullptr, n_dims, sections.data(), mode, n_ctx_orig,
                                       freq_base, freq_scale, ext_factor, attn_factor, beta_fast, beta_slow));
    }, py::arg("a"), py::arg("pos"), py::arg("n_dims"), py::arg("sections"), py::arg("mode"), py::arg("n_ctx_orig"),
       py::arg("freq_base"), py::arg("freq_scale") = 1.0f, py::arg("ext_factor") = 0.0f, py::arg("attn_factor") = 1.0f,
       py::arg("beta_fast") = 32.0f, py::arg("beta_slow") = 1.0f,
       "Multi-section RoPE (M-RoPE, interleaved or not) of a [head_dim, n_head, n_tokens] at I32 [4 * n_tokens] "
       "positions (the sections' positions one after another).");

    ctx.def("ssm_conv", [](const ctx_ptr & c, const T & sx, const T & w) {
        need(sx.t->type == GGML_TYPE_F32 && w.t->type == GGML_TYPE_F32 && sx.t->ne[1] == w.t->ne[1] &&
             sx.t->ne[0] >= w.t->ne[0], "ssm_conv", "sx F32 [d_conv - 1 + n_t, d_inner, n_s], w F32 [d_conv, d_inner]");
        c->check_room();
        return wrap(c, ggml_ssm_conv(c->ctx(), sx.t, w.t));
    }, py::arg("sx"), py::arg("w"), "The causal depthwise conv1d of Mamba-style layers: [d_inner, n_t, n_s].");

    ctx.def("ssm_scan", [](const ctx_ptr & c, const T & s, const T & x, const T & dt, const T & A, const T & B,
                           const T & C, const T & ids) {
        auto * st = s.t;
        need(st->type == GGML_TYPE_F32 && x.t->type == GGML_TYPE_F32 && ggml_is_contiguous(st) &&
             ggml_is_contiguous(dt.t) && ggml_is_contiguous(A.t) && x.t->nb[1] == x.t->ne[0] * x.t->nb[0] &&
             B.t->nb[1] == B.t->ne[0] * B.t->nb[0] && ggml_are_same_shape(B.t, C.t) && st->ne[1] == x.t->ne[0] &&
             st->ne[2] == x.t->ne[1] && B.t->ne[0] == st->ne[0] && B.t->ne[2] == x.t->ne[2] &&
             dt.t->ne[0] == x.t->ne[1] && dt.t->ne[1] == x.t->ne[2] && A.t->ne[0] == 1 && A.t->ne[1] == x.t->ne[1] &&
             ids.t->type == GGML_TYPE_I32 && ids.t->ne[0] == x.t->ne[3] && x.t->ne[1] % B.t->ne[1] == 0,
             "ssm_scan", "s [d_state, head_dim, n_head, *], x [head_dim, n_head, t, s], dt [n_head, t, s], "
             "A [1, n_head], B, C [d_state, n_group, t, s], ids I32 [s]");
        c->check_room();
        return wrap(c, ggml_ssm_scan(c->ctx(), st, x.t, dt.t, A.t, B.t, C.t, ids.t, 1));
    }, py::arg("s"), py::arg("x"), py::arg("dt"), py::arg("A"), py::arg("B"), py::arg("C"), py::arg("ids"),
       "Mamba-2's selective scan over t tokens from the states ids picks in s: the outputs [head_dim * n_head * "
       "t * s], then the final states.");

    ctx.def("gated_delta_net", [](const ctx_ptr & c, const T & q, const T & k, const T & v, const T & g,
                                  const T & beta, const T & state, int64_t K) {
        const int64_t S = v.t->ne[0], H = v.t->ne[1];
        need(q.t->ne[0] == S && k.t->ne[0] == S && H % q.t->ne[1] == 0 && state.t->ne[0] == S &&
             state.t->ne[1] == S && state.t->ne[2] == H && K >= 1, "gated_delta_net",
             "q, k [S, H_k, t, s], v [S, H_v, t, s], state [S, S, H_v, s], K >= 1");
        c->check_room();
        return wrap(c, ggml_gated_delta_net(c->ctx(), q.t, k.t, v.t, g.t, beta.t, state.t, K));
    }, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("g"), py::arg("beta"), py::arg("state"), py::arg("K") = 1,
       "The gated delta rule over n_tokens: the outputs [S, H_v, t, s], then K states, most recent first.");

    ctx.def("soft_max_ext", [](const ctx_ptr & c, const T & a, std::optional<T> mask, float scale, float max_bias,
                               std::optional<T> sinks) {
        need(!sinks || (sinks->t->type == GGML_TYPE_F32 && sinks->t->ne[0] == a.t->ne[2]), "soft_max_ext",
             "sinks must be F32 [n_head]");
        c->check_room();
        ggml_tensor * r = ggml_soft_max_ext(c->ctx(), a.t, mask ? mask->t : nullptr, scale, max_bias);
        if (sinks) ggml_soft_max_add_sinks(r, sinks->t);
        return wrap(c, r);
    }, py::arg("a"), py::arg("mask"), py::arg("scale"), py::arg("max_bias") = 0.0f, py::arg("sinks") = py::none(),
       "softmax(a * scale + mask) over rows; sinks (F32 [n_head]): a per-head logit that joins each row's sum");

    ctx.def("flash_attn_ext", [](const ctx_ptr & c, const T & q, const T & k, const T & v, std::optional<T> mask,
                                 float scale, float max_bias, float softcap, std::optional<T> sinks, int n_kv_max) {
        need(n_kv_max >= 0 && (n_kv_max == 0 || mask), "flash_attn_ext", "n_kv_max must be >= 0, and > 0 only with a mask");
        need(q.t->ne[0] == k.t->ne[0] && k.t->ne[1] == v.t->ne[1] && q.t->ne[2] % k.t->ne[2] == 0,
             "flash_attn_ext", "q/k/v shapes do not match");
        need(!mask || mask->t->type == GGML_TYPE_F16, "flash_attn_ext", "mask must be F16");
        need(!sinks || sinks->t->type == GGML_TYPE_F32, "flash_attn_ext", "sinks must be F32 [n_head]");
        c->check_room();
        ggml_tensor * r = ggml_flash_attn_ext(c->ctx(), q.t, k.t, v.t, mask ? mask->t : nullptr, scale, max_bias, softcap);
        if (sinks) ggml_flash_attn_ext_add_sinks(r, sinks->t);
        if (n_kv_max) ggml_flash_attn_ext_set_n_kv_max(r, n_kv_max);
        ggml_prec_set_acc(r, GGML_PREC_F32);   // as llama.cpp sets it
        return wrap(c, r);
    }, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("mask"), py::arg("scale"),
       py::arg("max_bias") = 0.0f, py::arg("softcap") = 0.0f, py::arg("sinks") = py::none(), py::arg("n_kv_max") = 0,
       "q [d, n_tokens, n_head], k/v [d, n_kv, n_head_kv], mask F16 [n_kv, n_tokens] -> [d, n_head, n_tokens]; "
       "n_kv_max > 0: the mask's finite entries are a sparse K/V set, at most n_kv_max in any row");

    // DeepSeek V4's hyper-connections: hc residual streams in place of one (ggml.h)
    ctx.def("dsv4_hc_comb", [](const ctx_ptr & c, const T & mixes, const T & scale, const T & base, float eps,
                               int n_iter) {
        const int64_t hc = 4, dim = (2 + hc) * hc;
        need(mixes.t->type == GGML_TYPE_F32 && scale.t->type == GGML_TYPE_F32 && base.t->type == GGML_TYPE_F32,
             "dsv4_hc_comb", "mixes, scale and base must be F32");
        need(mixes.t->ne[0] == dim && mixes.t->ne[2] == 1 && mixes.t->ne[3] == 1 && ggml_nrows(scale.t) == 1 &&
             scale.t->ne[0] >= 3 && base.t->ne[0] == dim && ggml_nrows(base.t) == 1,
             "dsv4_hc_comb", "mixes [24, n_tokens] (4 streams), scale [3], base [24]");
        need(n_iter > 0, "dsv4_hc_comb", "n_iter must be > 0");
        c->check_room();
        return wrap(c, ggml_dsv4_hc_comb(c->ctx(), mixes.t, scale.t, base.t, eps, n_iter));
    }, py::arg("mixes"), py::arg("scale"), py::arg("base"), py::arg("eps"), py::arg("n_iter"),
       "The streams' mixing matrices F32 [hc, hc, n_tokens]: Sinkhorn-normalized softmax of mixes' last hc*hc rows");
    ctx.def("dsv4_hc_pre", [](const ctx_ptr & c, const T & x, const T & weights) {
        need(x.t->type == GGML_TYPE_F32 && weights.t->type == GGML_TYPE_F32 && x.t->ne[3] == 1 &&
             weights.t->ne[0] == x.t->ne[1] && weights.t->ne[1] == x.t->ne[2] && weights.t->ne[2] == 1 &&
             weights.t->ne[3] == 1, "dsv4_hc_pre", "x F32 [n_embd, hc, n_tokens], weights F32 [hc, n_tokens]");
        c->check_room();
        return wrap(c, ggml_dsv4_hc_pre(c->ctx(), x.t, weights.t));
    }, py::arg("x"), py::arg("weights"), "The streams summed by weight: F32 [n_embd, n_tokens]");
    ctx.def("dsv4_hc_pre_gated", [](const ctx_ptr & c, const T & x, const T & gate, float scale) {
        need(x.t->type == GGML_TYPE_F32 && gate.t->type == GGML_TYPE_F32 && ggml_are_same_shape(x.t, gate.t) &&
             x.t->ne[3] == 1, "dsv4_hc_pre_gated", "x and gate F32 [n_embd, hc, n_tokens]");
        c->check_room();
        return wrap(c, ggml_dsv4_hc_pre_gated(c->ctx(), x.t, gate.t, scale));
    }, py::arg("x"), py::arg("gate"), py::arg("scale"),
       "scale * the streams summed, each value gated by sigmoid(gate): F32 [n_embd, n_tokens]");
    ctx.def("dsv4_hc_post", [](const ctx_ptr & c, const T & x, const T & residual, const T & post, std::optional<T> comb) {
        const int64_t n = x.t->ne[1], hc = residual.t->ne[1];
        need(x.t->type == GGML_TYPE_F32 && residual.t->type == GGML_TYPE_F32 && post.t->type == GGML_TYPE_F32 &&
             x.t->ne[2] == 1 && x.t->ne[3] == 1 && residual.t->ne[0] == x.t->ne[0] && residual.t->ne[2] == n &&
             residual.t->ne[3] == 1 && post.t->ne[0] == hc && post.t->ne[1] == n && ggml_nrows(post.t) == n,
             "dsv4_hc_post", "x F32 [n_embd, n_tokens], residual F32 [n_embd, hc, n_tokens], post F32 [hc, n_tokens]");
        need(!comb || (comb->t->type == GGML_TYPE_F32 && comb->t->ne[0] == hc && comb->t->ne[1] == hc &&
                       comb->t->ne[2] == n && comb->t->ne[3] == 1),
             "dsv4_hc_post", "comb F32 [hc, hc, n_tokens]");
        c->check_room();
        return wrap(c, ggml_dsv4_hc_post(c->ctx(), x.t, residual.t, post.t, comb ? comb->t : nullptr));
    }, py::arg("x"), py::arg("residual"), py::arg("post"), py::arg("comb") = py::none(),
       "The streams after a block: x * post[dst] + sum over src of residual[src] * comb[dst, src] (comb None: the "
       "identity) -> F32 [n_embd, hc, n_tokens]");
}

}  // namespace superggml
