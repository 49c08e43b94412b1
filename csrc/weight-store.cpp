#include "weight-store.h"

#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"

#include <cstring>
#include <map>

namespace superggml {

weight_store::weight_store(std::shared_ptr<gguf_file> file, range_writer writer)
    : file_(std::move(file)), writer_(std::move(writer)) {
    for (const auto & ti : file_->tensors()) entries_[ti.name] = {file_->tensor(ti.name), ti.offset, ti.nbytes};
}

weight_store::~weight_store() {
    if (!file_->closed()) {
        for (auto & [name, e] : entries_) tensor_unbind(e.t);
    }
    if (views_) ggml_free(views_);
    if (mmap_buf_) ggml_backend_buffer_free(mmap_buf_);
    for (auto * b : resident_bufs_) ggml_backend_buffer_free(b);
}

const weight_store::entry & weight_store::at(const std::string & name) const {
    if (file_->closed()) throw Error("the GGUF file is closed");
    auto it = entries_.find(name);
    if (it == entries_.end()) throw GGUFError("GGUF has no tensor '" + name + "': " + file_->path());
    return it->second;
}

bool weight_store::has(const std::string & name) const { return entries_.count(name) != 0; }
ggml_tensor * weight_store::get(const std::string & name) const { return at(name).t; }
weight_home weight_store::home(const std::string & name) const { return at(name).home; }

std::pair<uint64_t, uint64_t> weight_store::file_range(const std::string & name) const {
    const entry & e = at(name);
    return {e.offset, e.nbytes};
}

std::vector<std::string> weight_store::add_row_chunks(const std::string & name, size_t max_bytes) {
    const entry & base = at(name);
    ggml_tensor * t = base.t;
    const size_t row = t->nb[1];
    if (ggml_n_dims(t) > 2) throw Error("row chunks need a 2-D tensor: '" + name + "'");
    int64_t per = (int64_t) (max_bytes / row);
    if (per >= ROW_CHUNK_ALIGN) per -= per % ROW_CHUNK_ALIGN;
    if (per < 1) throw Error("a row of '" + name + "' (" + std::to_string(row) + " bytes) is bigger than " +
                             std::to_string(max_bytes) + " bytes");
    const int64_t n_chunks = (t->ne[1] + per - 1) / per;
    if (!views_) {
        ggml_init_params p = { 1024 * ggml_tensor_overhead(), nullptr, true };
        views_ = ggml_init(p);
    }
    if (ggml_used_mem(views_) + n_chunks * ggml_tensor_overhead() > ggml_get_mem_size(views_)) {
        throw Error("too many row chunks");
    }
    std::vector<std::string> names;
    for (int64_t c = 0; c < n_chunks; ++c) {
        const int64_t r0 = c * per, nr = std::min(per, t->ne[1] - r0);
        std::string n = name + ".rows" + std::to_string(r0);
        if (!entries_.count(n)) {
            ggml_tensor * v = ggml_new_tensor_2d(views_, t->type, t->ne[0], nr);
            ggml_set_name(v, n.c_str());
            entries_[n] = {v, base.offset + (uint64_t) (r0 * row), (uint64_t) (nr * row)};
        }
        names.push_back(n);
    }
    return names;
}

std::string weight_store::add_copy(const std::string & name, const std::string & tag) {
    const entry & base = at(name);
    std::string n = name + "@" + tag;
    if (entries_.count(n)) return n;
    if (!views_) {
        ggml_init_params p = { 1024 * ggml_tensor_overhead(), nullptr, true };
        views_ = ggml_init(p);
    }
    if (ggml_used_mem(views_) + ggml_tensor_overhead() > ggml_get_mem_size(views_)) throw Error("too many copies");
    ggml_tensor * v = ggml_new_tensor(views_, base.t->type, GGML_MAX_DIMS, base.t->ne);
    ggml_set_name(v, n.c_str());
    entries_[n] = {v, base.offset, base.nbytes};
    return n;
}

void weight_store::bind_mmap(const std::vector<std::string> & names) {
    if (!mmap_buf_) {
        mmap_buf_ = ggml_backend_cpu_buffer_from_ptr(const_cast<uint8_t *>(file_->map()), file_->file_size());
        if (!mmap_buf_) throw Error("cannot wrap the GGUF mapping in a CPU buffer");
        ggml_backend_buffer_set_usage(mmap_buf_, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    }
    auto bind_one = [&](entry & e) {
        tensor_bind(e.t, mmap_buf_, const_cast<uint8_t *>(file_->map()) + e.offset);
        e.home = weight_home::mmap;
    };
    if (names.empty()) {
        for (const auto & ti : file_->tensors()) bind_one(entries_.at(ti.name));
        return;
    }
    for (const auto & n : names) {
        at(n);
        bind_one(entries_.at(n));
    }
}

std::vector<std::string> weight_store::place_resident(const std::vector<std::string> & names,
                                                      ggml_backend_buffer_type * buft, size_t * bytes) {
    if (!buft) buft = ggml_backend_cpu_buffer_type();
    size_t total = 0;
    std::vector<entry *> pending;
    for (const auto & n : names) {
        at(n);
        entry & e = entries_.at(n);
        tensor_unbind(e.t);
        e.home = weight_home::unbound;
        total += tensor_padded_size(buft, e.t);
        pending.push_back(&e);
    }
    if (pending.empty()) return {};
    ggml_backend_buffer * buf = ggml_backend_buft_alloc_buffer(buft, total);
    if (!buf) throw Error("cannot allocate " + std::to_string(total) + " bytes for resident weights");
    ggml_backend_buffer_set_usage(buf, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    resident_bufs_.push_back(buf);
    auto * p = static_cast<uint8_t *>(ggml_backend_buffer_get_base(buf));
    for (entry * e : pending) {
        tensor_bind(e->t, buf, p);
        e->home = weight_home::resident;
        p += tensor_padded_size(buft, e->t);
    }
    if (bytes) *bytes += total;
    return names;
}

void weight_store::fill(const std::string & name) const {
    const entry & e = at(name);
    if (e.home != weight_home::resident && e.home != weight_home::repacked) {
        throw Error("fill: '" + name + "' is not placed in a resident buffer");
    }
    ggml_backend_tensor_set(e.t, file_->map() + e.offset, 0, e.nbytes);
}

size_t weight_store::load_resident(const std::vector<std::string> & names, ggml_backend_buffer_type * buft) {
    size_t total = 0;
    const std::vector<std::string> placed = place_resident(names, buft, &total);
    if (placed.empty()) return total;
    if (!writer_) {
        for (const auto & n : placed) fill(n);
        return total;
    }
    // the writer's first (remote.h: an RPC peer that holds them is sent only their hashes), the rest as bytes
    ggml_backend_buffer * buf = at(placed[0]).t->buffer;
    auto * base = static_cast<uint8_t *>(ggml_backend_buffer_get_base(buf));
    std::vector<range_write> ranges;
    for (const auto & n : placed) {
        const entry & e = at(n);
        ranges.push_back({e.offset, e.nbytes, (uint64_t) (static_cast<uint8_t *>(e.t->data) - base)});
    }
    std::vector<range_write> rest = writer_(buf, file_->path(), ranges);
    if (rest.size() == ranges.size()) {
        for (const auto & n : placed) fill(n);
        return total;
    }
    std::map<uint64_t, std::string> by_offset;
    for (const auto & n : placed) by_offset[at(n).offset] = n;
    for (const auto & r : rest) fill(by_offset.at(r.file_offset));
    return total;
}

// Would `dev` run mul_mat(w, x) (mul_mat_id for a 3-D w: experts) with w stored in `buft`? (llama.cpp's test.)
static bool repack_supported(ggml_backend_device * dev, ggml_backend_buffer_type * buft, ggml_tensor * w) {
    if (ggml_n_dims(w) != 2 && ggml_n_dims(w) != 3) return false;
    ggml_init_params p = { 3 * ggml_tensor_overhead(), nullptr, true };
    ggml_context * ctx = ggml_init(p);
    ggml_tensor * op;
    if (ggml_n_dims(w) == 2) {
        op = ggml_mul_mat(ctx, w, ggml_new_tensor_2d(ctx, GGML_TYPE_F32, w->ne[0], 512));
    } else {
        op = ggml_mul_mat_id(ctx, w, ggml_new_tensor_3d(ctx, GGML_TYPE_F32, w->ne[0], 1, 512),
                             ggml_new_tensor_2d(ctx, GGML_TYPE_I32, 1, 512));
    }
    ggml_backend_buffer * dummy = ggml_backend_buft_alloc_buffer(buft, 0);
    ggml_backend_buffer * saved = w->buffer;
    w->buffer = dummy;
    bool ok = dummy && ggml_backend_dev_supports_op(dev, op);
    w->buffer = saved;
    if (dummy) ggml_backend_buffer_free(dummy);
    ggml_free(ctx);
    return ok;
}

std::vector<std::string> weight_store::place_repacked(const std::vector<std::string> & names,
                                                      ggml_backend_device * dev, size_t * bytes) {
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
    auto get_extra = (ggml_backend_dev_get_extra_bufts_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts");
    std::vector<std::string> placed;
    if (!get_extra) return placed;
    for (ggml_backend_buffer_type_t * b = get_extra(dev); b && *b; ++b) {
        // ggml's AMX matmul faults on weights bound this way (seen on a Sapphire Rapids CPU): not used
        if (std::strcmp(ggml_backend_buft_name(*b), "AMX") == 0) continue;
        std::vector<std::string> ok;
        for (const auto & n : names) {
            if (home(n) != weight_home::repacked && repack_supported(dev, *b, get(n))) ok.push_back(n);
        }
        for (const auto & n : place_resident(ok, *b, bytes)) {
            entries_.at(n).home = weight_home::repacked;
            placed.push_back(n);
        }
    }
    return placed;
}

size_t weight_store::load_repacked(const std::vector<std::string> & names, ggml_backend_device * dev) {
    size_t total = 0;
    for (const auto & n : place_repacked(names, dev, &total)) fill(n);
    return total;
}

size_t weight_store::bytes(weight_home h) const {
    size_t s = 0;
    for (const auto & [name, e] : entries_) if (e.home == h) s += e.nbytes;
    return s;
}

}  // namespace superggml
