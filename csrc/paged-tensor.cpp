#include "paged-tensor.h"

#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"

namespace superggml {

void tensor_bind(ggml_tensor * t, ggml_backend_buffer * buffer, void * addr) {
    auto * base = static_cast<uint8_t *>(ggml_backend_buffer_get_base(buffer));
    auto * p = static_cast<uint8_t *>(addr);
    size_t need = ggml_backend_buffer_get_alloc_size(buffer, t);
    if (p < base || p + need > base + ggml_backend_buffer_get_size(buffer)) {
        throw Error(std::string("tensor_bind: '") + t->name + "' does not fit in the buffer at that address");
    }
    t->buffer = nullptr;
    t->data = nullptr;
    if (ggml_backend_tensor_alloc(buffer, t, addr) != GGML_STATUS_SUCCESS) {
        throw Error(std::string("tensor_bind: cannot bind '") + t->name + "'");
    }
}

void tensor_unbind(ggml_tensor * t) {
    t->buffer = nullptr;
    t->data = nullptr;
    t->extra = nullptr;
}

weight_store::weight_store(std::shared_ptr<gguf_file> file) : file_(std::move(file)) {
    for (const auto & ti : file_->tensors()) home_[ti.name] = weight_home::unbound;
}

weight_store::~weight_store() {
    if (!file_->closed()) {
        for (const auto & ti : file_->tensors()) tensor_unbind(file_->tensor(ti.name));
    }
    if (mmap_buf_) ggml_backend_buffer_free(mmap_buf_);
    for (auto * b : resident_bufs_) ggml_backend_buffer_free(b);
}

bool weight_store::has(const std::string & name) const { return home_.count(name) != 0; }

ggml_tensor * weight_store::get(const std::string & name) const {
    if (file_->closed()) throw Error("the GGUF file is closed");
    ggml_tensor * t = file_->tensor(name);
    if (!t) throw GGUFError("GGUF has no tensor '" + name + "': " + file_->path());
    return t;
}

weight_home weight_store::home(const std::string & name) const {
    auto it = home_.find(name);
    if (it == home_.end()) throw GGUFError("GGUF has no tensor '" + name + "'");
    return it->second;
}

void weight_store::bind_mmap(const std::vector<std::string> & names) {
    if (!mmap_buf_) {
        mmap_buf_ = ggml_backend_cpu_buffer_from_ptr(const_cast<uint8_t *>(file_->map()), file_->file_size());
        if (!mmap_buf_) throw Error("cannot wrap the GGUF mapping in a CPU buffer");
        ggml_backend_buffer_set_usage(mmap_buf_, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    }
    auto bind_one = [&](const gguf_tensor_info & ti) {
        tensor_bind(get(ti.name), mmap_buf_, const_cast<uint8_t *>(file_->map()) + ti.offset);
        home_[ti.name] = weight_home::mmap;
    };
    if (names.empty()) {
        for (const auto & ti : file_->tensors()) bind_one(ti);
        return;
    }
    std::unordered_map<std::string, const gguf_tensor_info *> by_name;
    for (const auto & ti : file_->tensors()) by_name[ti.name] = &ti;
    for (const auto & n : names) {
        auto it = by_name.find(n);
        if (it == by_name.end()) throw GGUFError("GGUF has no tensor '" + n + "'");
        bind_one(*it->second);
    }
}

size_t weight_store::load_resident(const std::vector<std::string> & names, ggml_backend_buffer_type * buft) {
    if (!buft) buft = ggml_backend_cpu_buffer_type();
    std::unordered_map<std::string, const gguf_tensor_info *> by_name;
    for (const auto & ti : file_->tensors()) by_name[ti.name] = &ti;
    const size_t align = ggml_backend_buft_get_alignment(buft);
    size_t total = 0;
    std::vector<std::pair<ggml_tensor *, const gguf_tensor_info *>> todo;
    for (const auto & n : names) {
        auto it = by_name.find(n);
        if (it == by_name.end()) throw GGUFError("GGUF has no tensor '" + n + "'");
        ggml_tensor * t = get(n);
        tensor_unbind(t);
        total += GGML_PAD(ggml_backend_buft_get_alloc_size(buft, t), align);
        todo.emplace_back(t, it->second);
    }
    if (todo.empty()) return 0;
    ggml_backend_buffer * buf = ggml_backend_buft_alloc_buffer(buft, total);
    if (!buf) throw Error("cannot allocate " + std::to_string(total) + " bytes for resident weights");
    ggml_backend_buffer_set_usage(buf, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    resident_bufs_.push_back(buf);
    auto * p = static_cast<uint8_t *>(ggml_backend_buffer_get_base(buf));
    for (auto & [t, ti] : todo) {
        tensor_bind(t, buf, p);
        ggml_backend_tensor_set(t, file_->map() + ti->offset, 0, ti->nbytes);
        home_[ti->name] = weight_home::resident;
        p += GGML_PAD(ggml_backend_buft_get_alloc_size(buft, t), align);
    }
    return total;
}

// Would `dev` run mul_mat(w, x) with w stored in `buft`? (llama.cpp's test.)
static bool repack_supported(ggml_backend_device * dev, ggml_backend_buffer_type * buft, ggml_tensor * w) {
    if (ggml_n_dims(w) != 2) return false;
    ggml_init_params p = { 2 * ggml_tensor_overhead(), nullptr, true };
    ggml_context * ctx = ggml_init(p);
    ggml_tensor * x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, w->ne[0], 512);
    ggml_tensor * op = ggml_mul_mat(ctx, w, x);
    ggml_backend_buffer * dummy = ggml_backend_buft_alloc_buffer(buft, 0);
    ggml_backend_buffer * saved = w->buffer;
    w->buffer = dummy;
    bool ok = dummy && ggml_backend_dev_supports_op(dev, op);
    w->buffer = saved;
    if (dummy) ggml_backend_buffer_free(dummy);
    ggml_free(ctx);
    return ok;
}

size_t weight_store::load_repacked(const std::vector<std::string> & names, ggml_backend_device * dev) {
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
    auto get_extra = (ggml_backend_dev_get_extra_bufts_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts");
    if (!get_extra) return 0;
    size_t total = 0;
    for (ggml_backend_buffer_type_t * b = get_extra(dev); b && *b; ++b) {
        std::vector<std::string> ok;
        for (const auto & n : names) {
            auto h = home(n);
            if (h != weight_home::repacked && repack_supported(dev, *b, get(n))) ok.push_back(n);
        }
        if (ok.empty()) continue;
        total += load_resident(ok, *b);
        for (const auto & n : ok) home_[n] = weight_home::repacked;
    }
    return total;
}

size_t weight_store::bytes(weight_home h) const {
    size_t s = 0;
    for (const auto & ti : file_->tensors()) {
        auto it = home_.find(ti.name);
        if (it != home_.end() && it->second == h) s += ti.nbytes;
    }
    return s;
}

}  // namespace superggml
