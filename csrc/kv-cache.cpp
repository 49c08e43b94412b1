#include "kv-cache.h"

#include "io.h"

#include "tensor-bind.h"

#include "ggml.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <unistd.h>

namespace superggml {

kv_cache::kv_cache(const kv_params & params, std::vector<ggml_tensor *> k, std::vector<ggml_tensor *> v,
                   task_pool * workers) : p_(params), k_(std::move(k)), v_(std::move(v)), workers_(workers) {
    if (p_.page_size < KV_PAGE_MIN || p_.page_size > KV_PAGE_MAX) {
        throw Error("kv_page_size must be in " + std::to_string(KV_PAGE_MIN) + ".." + std::to_string(KV_PAGE_MAX) +
                    " tokens, not " + std::to_string(p_.page_size));
    }
    if (p_.n_layer < 1 || (int) k_.size() != p_.n_layer || (int) v_.size() != (p_.has_v ? p_.n_layer : 0)) {
        throw Error("kv cache needs one K and one V tensor per layer (K only without V)");
    }
    if (!p_.buft) p_.buft = ggml_backend_cpu_buffer_type();
    if (p_.n_frames <= 0) p_.n_frames = p_.n_layer;
    // fewer frames than layers: the first layers own one each, the rest stream through the others;
    // as many or more (several sequences): every (sequence, layer) competes for all of them, LRU
    n_resident_ = p_.n_frames >= p_.n_layer ? 0 : p_.n_frames - std::max(1, std::min(p_.n_stream, p_.n_frames));
    const size_t align = ggml_backend_buft_get_alignment(p_.buft);
    if (!p_.has_v) p_.v_row = 0;
    else if (p_.v_row == 0) p_.v_row = p_.k_row;
    if (p_.n_embd_v_gqa <= 0) p_.n_embd_v_gqa = p_.n_embd_gqa;
    if (p_.k_row == 0 || (p_.has_v && p_.v_trans && p_.v_row % (size_t) p_.n_embd_v_gqa)) {
        throw Error("kv cache needs the bytes of a token's K and V (a transposed V of whole elements)");
    }
    k_bytes_ = (size_t) p_.n_ctx * p_.k_row;
    v_off_ = (k_bytes_ + align - 1) / align * align;
    frame_size_ = v_off_ + (size_t) p_.n_ctx * p_.v_row;
    page_bytes_ = (size_t) p_.page_size * (p_.k_row + p_.v_row);
    if (!p_.spill_dir.empty()) {
        std::string tmpl = p_.spill_dir + "/superggml-kv-XXXXXX";
        std::vector<char> path(tmpl.begin(), tmpl.end());
        path.push_back('\0');
        spill_fd_.reset(::mkstemp(path.data()));
        if (!spill_fd_.valid()) {
            int e = errno;
            throw FileError("cannot create a KV spill file in " + p_.spill_dir + ": " + std::strerror(e), e);
        }
        spill_path_ = path.data();
    }
    frames_.resize(p_.n_frames);
    for (auto & f : frames_) {
        f.buf = ggml_backend_buft_alloc_buffer(p_.buft, frame_size_);
        if (!f.buf) {
            for (auto & g : frames_) if (g.buf) ggml_backend_buffer_free(g.buf);
            frames_.clear();
            if (spill_fd_.valid()) ::unlink(spill_path_.c_str());
            throw Error("cannot allocate " + std::to_string(p_.n_frames) + " KV frames of " +
                        std::to_string(frame_size_) + " bytes on " + ggml_backend_buft_name(p_.buft));
        }
        ggml_backend_buffer_clear(f.buf, 0);   // rows past the valid ones are read (masked): keep them finite
    }
}

kv_cache::~kv_cache() {
    for (auto & f : frames_) {
        if (f.fill.valid()) { try { f.fill.get(); } catch (...) {} }
    }
    for (auto * t : k_) tensor_unbind(t);
    for (auto * t : v_) tensor_unbind(t);
    for (auto & f : frames_) if (f.buf) ggml_backend_buffer_free(f.buf);
    for (auto & [seq, layers] : seqs_) for (auto & pages : layers) for (auto & pg : pages) std::free(pg.host);
    if (spill_fd_.valid()) ::unlink(spill_path_.c_str());
}

std::deque<kv_cache::page> & kv_cache::pages_of(int seq, int layer) {
    auto & layers = seqs_[seq];
    if (layers.empty()) layers.resize(p_.n_layer);
    return layers.at(layer);
}

int kv_cache::find_frame(int seq, int layer) const {
    for (int i = 0; i < (int) frames_.size(); ++i) if (frames_[i].seq == seq && frames_[i].layer == layer) return i;
    return -1;
}

void kv_cache::copy_page(frame & f, int64_t idx, uint8_t * pb, bool to_frame) const {
    const int64_t P = p_.page_size, g = p_.n_embd_v_gqa, p0 = idx * P;
    const int64_t rows = std::min(P, p_.n_ctx - p0);
    if (rows <= 0) return;
    const size_t kr = p_.k_row, vr = p_.v_row, es = vr / (size_t) g;   // es: a transposed V's element
    const size_t kblock = (size_t) P * kr;
    const bool host = ggml_backend_buffer_is_host(f.buf);
    auto * base = static_cast<uint8_t *>(ggml_backend_buffer_get_base(f.buf));
    // one byte view of the frame for device copies
    ggml_init_params ip = { ggml_tensor_overhead(), nullptr, true };
    ggml_context * ctx = host ? nullptr : ggml_init(ip);
    auto xfer = [&](size_t frame_off, uint8_t * page_ptr, size_t n) {
        if (host) {
            if (to_frame) std::memcpy(base + frame_off, page_ptr, n); else std::memcpy(page_ptr, base + frame_off, n);
            return;
        }
        ggml_reset(ctx);
        ggml_tensor * t = tensor_bytes(ctx, f.buf, base + frame_off, n);
        if (to_frame) ggml_backend_tensor_set(t, page_ptr, 0, n); else ggml_backend_tensor_get(t, page_ptr, 0, n);
    };
    try {
        xfer((size_t) p0 * kr, pb, (size_t) rows * kr);
        if (!p_.has_v) {
        } else if (p_.v_trans) {
            for (int64_t c = 0; c < g; ++c) {
                xfer(v_off_ + (size_t) (c * p_.n_ctx + p0) * es, pb + kblock + (size_t) (c * P) * es, (size_t) rows * es);
            }
        } else {
            xfer(v_off_ + (size_t) p0 * vr, pb + kblock, (size_t) rows * vr);
        }
    } catch (...) {
        if (ctx) ggml_free(ctx);
        throw;
    }
    if (ctx) ggml_free(ctx);
}

int64_t kv_cache::disk_alloc() {
    if (!spill_free_.empty()) {
        int64_t off = spill_free_.back();
        spill_free_.pop_back();
        return off;
    }
    int64_t off = spill_end_;
    spill_end_ += (int64_t) page_bytes_;
    return off;
}

void kv_cache::disk_free(page & pg) {
    if (pg.disk < 0) return;
    spill_free_.push_back(pg.disk);
    pg.disk = -1;
    st_.disk_bytes -= page_bytes_;
}

void kv_cache::disk_write(page & pg, const uint8_t * bytes) {
    if (!spill_fd_.valid()) {
        throw Error("the KV cache needs more than its host budget of " + std::to_string(p_.host_budget) +
                    " bytes: give it a spill directory (kv_spill_dir) or a larger host budget");
    }
    const bool fresh = pg.disk < 0;
    const int64_t off = fresh ? disk_alloc() : pg.disk;
    try {
        io_pwrite_all(spill_fd_.get(), bytes, page_bytes_, (off_t) off, "the KV spill file " + spill_path_);
    } catch (const FileError &) {
        if (fresh) spill_free_.push_back(off);
        throw;
    }
    if (fresh) {
        pg.disk = off;
        st_.disk_bytes += page_bytes_;
    }
    st_.pages_spilled++;
}

void kv_cache::touch(page & pg) {
    if (pg.host) host_lru_.erase({pg.last_use, &pg});
    pg.last_use = ++clock_;
    if (pg.host) host_lru_.insert({pg.last_use, &pg});
}

void kv_cache::free_page(page & pg) {
    if (pg.host) {
        host_lru_.erase({pg.last_use, &pg});
        std::free(pg.host);
        pg.host = nullptr;
        host_bytes_ -= page_bytes_;
    }
    disk_free(pg);
}

void kv_cache::spill(page & pg) {
    if (pg.host_newer || pg.disk < 0) disk_write(pg, pg.host);   // clean pages are just dropped
    host_lru_.erase({pg.last_use, &pg});
    std::free(pg.host);
    pg.host = nullptr;
    pg.host_newer = false;
    host_bytes_ -= page_bytes_;
    st_.pages_evicted++;
}

bool kv_cache::make_host_room(size_t bytes) {
    if (bytes > p_.host_budget) return false;
    while (host_bytes_ + bytes > p_.host_budget) {
        page * lru = nullptr;
        for (const auto & [t, pg] : host_lru_) {
            if (pg->pins == 0) { lru = pg; break; }
        }
        if (!lru) return false;
        spill(*lru);
    }
    return true;
}

void kv_cache::store_page(frame & f, int64_t idx, page & pg) {
    if (!pg.host && make_host_room(page_bytes_)) {
        pg.host = static_cast<uint8_t *>(std::calloc(1, page_bytes_));
        if (!pg.host) throw Error("cannot allocate a KV page of " + std::to_string(page_bytes_) + " bytes");
        host_bytes_ += page_bytes_;
    }
    touch(pg);
    if (pg.host) {
        copy_page(f, idx, pg.host, false);
        pg.host_newer = true;
    } else {   // no host room: straight to the spill file
        std::vector<uint8_t> tmp(page_bytes_, 0);
        copy_page(f, idx, tmp.data(), false);
        disk_write(pg, tmp.data());
    }
    st_.pages_written_back++;
}

void kv_cache::write_back(frame & f) {
    if (f.seq < 0) return;
    auto & pages = pages_of(f.seq, f.layer);
    for (int64_t i = 0; i < (int64_t) f.dirty.size(); ++i) {
        if (!f.dirty[i] || i >= (int64_t) pages.size()) continue;
        store_page(f, i, pages[i]);
        f.dirty[i] = 0;   // only once its bytes are safe
    }
}

void kv_cache::settle(frame & f) {
    if (!f.fill.valid()) return;
    auto fill = f.fill;
    f.fill = {};
    for (page * pg : f.pinned) pg->pins--;
    f.pinned.clear();
    try {
        fill.get();
    } catch (...) {
        f.seq = f.layer = -1;   // the frame's contents are unknown
        throw;
    }
}

int kv_cache::take_frame(int layer) {
    int best = -1;
    const int lo = layer < n_resident_ ? layer : n_resident_;
    const int hi = layer < n_resident_ ? layer + 1 : (int) frames_.size();
    for (int i = lo; i < hi; ++i) {
        const frame & f = frames_[i];
        if (f.in_use) continue;
        if (f.seq < 0) { best = i; break; }
        if (best < 0 || f.last_use < frames_[best].last_use) best = i;
    }
    if (best < 0) return -1;
    frame & f = frames_[best];
    try { settle(f); } catch (...) {}   // a failed prefetch of the victim: nothing to keep
    write_back(f);                      // throws with the frame still holding its (seq, layer)
    f.seq = f.layer = -1;
    f.dirty.clear();
    return best;
}

void kv_cache::start_fill(frame & f, int seq, int layer, int64_t n_valid, bool async) {
    auto & pages = pages_of(seq, layer);
    const int64_t n_pages = std::min<int64_t>((n_valid + p_.page_size - 1) / p_.page_size, (int64_t) pages.size());
    f.seq = seq;
    f.layer = layer;
    f.last_use = ++clock_;
    f.dirty.assign(pages.size(), 0);
    struct item { int64_t idx; uint8_t * host; int64_t disk; };
    std::vector<item> items;
    for (int64_t i = 0; i < n_pages; ++i) {
        page & pg = pages[i];
        if (!pg.host && pg.disk < 0) continue;   // never stored: nothing cached there yet
        items.push_back({i, pg.host, pg.host ? -1 : pg.disk});
        touch(pg);
        if (pg.host) {
            pg.pins++;
            f.pinned.push_back(&pg);
        }
    }
    st_.pages_loaded += items.size();
    frame * fp = &f;
    const int fd = spill_fd_.get();
    const size_t pbytes = page_bytes_;
    auto run = [this, fp, items, fd, pbytes] {
        std::vector<uint8_t> tmp;
        for (const auto & it : items) {
            uint8_t * src = it.host;
            if (!src) {
                tmp.resize(pbytes);
                io_pread_all(fd, tmp.data(), pbytes, (off_t) it.disk, "the KV spill file");
                src = tmp.data();
            }
            copy_page(*fp, it.idx, src, true);
        }
    };
    if (async && workers_) {
        f.fill = workers_->submit(seq * p_.n_layer + layer, 0, run).done;
        st_.pages_prefetched += items.size();
        return;
    }
    try {
        run();
    } catch (...) {
        for (page * pg : f.pinned) pg->pins--;
        f.pinned.clear();
        f.seq = f.layer = -1;
        throw;
    }
    for (page * pg : f.pinned) pg->pins--;
    f.pinned.clear();
}

void kv_cache::bind(const frame & f, ggml_tensor * k, ggml_tensor * v) {
    auto * base = static_cast<uint8_t *>(ggml_backend_buffer_get_base(f.buf));
    tensor_bind(k, f.buf, base);
    if (v) tensor_bind(v, f.buf, base + v_off_);
}

bool kv_cache::prefetch(int seq, int layer, int64_t n_valid) {
    if (find_frame(seq, layer) >= 0) return true;
    int i = take_frame(layer);
    if (i < 0) return false;
    start_fill(frames_[i], seq, layer, n_valid, true);
    return true;
}

void kv_cache::acquire(int seq, int layer, int64_t n_valid, ggml_tensor * k, ggml_tensor * v) {
    if (layer < 0 || layer >= p_.n_layer) throw Error("kv layer out of range");
    if (p_.has_v ? !k != !v : v != nullptr) throw Error("acquire: give both K and V tensors (K only without V), or neither");
    if (k && (k->type != k_[layer]->type || !ggml_are_same_shape(k, k_[layer]) ||
              (v && (v->type != v_[layer]->type || !ggml_are_same_shape(v, v_[layer]))))) {
        throw Error("acquire: the K/V tensors differ from the layer's in shape or type");
    }
    int i = find_frame(seq, layer);
    if (i >= 0) {
        st_.frame_hits++;
        try {
            settle(frames_[i]);
        } catch (...) {
            i = -1;   // the fill ahead of time failed: fill again now, once, and let that one throw
        }
    }
    if (i < 0) {
        st_.frame_misses++;
        i = take_frame(layer);
        if (i < 0) throw Error("every KV frame is in use");
        start_fill(frames_[i], seq, layer, n_valid, false);
    }
    frame & f = frames_[i];
    f.in_use++;
    f.valid = n_valid;
    f.last_use = ++clock_;
    bind(f, k ? k : k_[layer], k ? v : this->v(layer));
}

void kv_cache::release(int seq, int layer, int64_t n_end) {
    int i = find_frame(seq, layer);
    if (i < 0 || frames_[i].in_use <= 0) throw Error("release of a KV layer that is not acquired");
    frame & f = frames_[i];
    f.in_use--;
    auto & pages = pages_of(seq, layer);
    const int64_t P = p_.page_size;
    const int64_t n_pages = (n_end + P - 1) / P;
    if ((int64_t) pages.size() < n_pages) pages.resize(n_pages);
    if ((int64_t) f.dirty.size() < n_pages) f.dirty.resize(n_pages, 0);
    for (int64_t pi = f.valid / P; pi < n_pages; ++pi) f.dirty[pi] = 1;   // the step wrote [valid, n_end)
    set_layer_tokens(seq, layer, n_end);
}

void kv_cache::seq_truncate(int seq, int64_t n) {
    if (n < 0) throw Error("seq_truncate: negative token count");
    for (auto & f : frames_) {
        if (f.seq == seq) settle(f);
    }
    auto it = seqs_.find(seq);
    if (it == seqs_.end()) return;
    const int64_t keep = (n + p_.page_size - 1) / p_.page_size;
    for (int l = 0; l < p_.n_layer; ++l) {
        auto & pages = it->second[l];
        while ((int64_t) pages.size() > keep) {
            free_page(pages.back());
            pages.pop_back();
        }
        int fi = find_frame(seq, l);
        if (fi >= 0 && (int64_t) frames_[fi].dirty.size() > keep) frames_[fi].dirty.resize(keep);
        auto & t = layer_tokens_[seq];
        if ((int) t.size() > l) t[l] = std::min<int64_t>(t[l], n);
    }
    if (n == 0) {
        for (auto & f : frames_) if (f.seq == seq && !f.in_use) { f.seq = f.layer = -1; f.dirty.clear(); }
        seqs_.erase(it);
        layer_tokens_.erase(seq);
    }
}

void kv_cache::seq_forget(int seq, int layer, int64_t n_first) {
    if (layer < 0 || layer >= p_.n_layer) throw Error("kv layer out of range");
    auto it = seqs_.find(seq);
    if (it == seqs_.end() || n_first <= 0) return;
    auto & pages = it->second[layer];
    const int64_t n = std::min<int64_t>(n_first / p_.page_size, (int64_t) pages.size());
    const int fi = find_frame(seq, layer);
    if (fi >= 0) settle(frames_[fi]);   // a pending fill may read these pages' host bytes
    for (int64_t i = 0; i < n; ++i) {
        page & pg = pages[i];
        if (pg.forgotten) continue;
        free_page(pg);
        pg.forgotten = true;
        st_.pages_forgotten++;
        if (fi >= 0 && i < (int64_t) frames_[fi].dirty.size()) frames_[fi].dirty[i] = 0;
    }
}

int64_t kv_cache::layer_tokens(int seq, int layer) const {
    auto it = layer_tokens_.find(seq);
    if (it == layer_tokens_.end() || (int) it->second.size() <= layer) return 0;
    return it->second[layer];
}

void kv_cache::set_layer_tokens(int seq, int layer, int64_t n) {
    auto & t = layer_tokens_[seq];
    if ((int) t.size() < p_.n_layer) t.resize(p_.n_layer, 0);
    t[layer] = n;
}

kv_stats kv_cache::stats() const {
    kv_stats s = st_;
    s.host_bytes = host_bytes_;
    s.frame_bytes = frame_size_ * frames_.size();
    s.n_frames = (int) frames_.size();
    s.n_resident_layers = n_resident_;
    for (const auto & [seq, layers] : seqs_) {
        for (int l = 0; l < (int) layers.size(); ++l) {
            const auto & pages = layers[l];
            int fi = find_frame(seq, l);
            int64_t forgotten = 0;
            for (int64_t i = 0; i < (int64_t) pages.size(); ++i) {
                if (pages[i].forgotten) { forgotten++; continue; }
                if (pages[i].host) s.pages_host++;
                if (pages[i].disk >= 0) s.pages_disk++;
                if (fi >= 0) s.pages_device++;
                s.token_slots += (uint64_t) p_.page_size;
            }
            s.tokens += (uint64_t) std::max<int64_t>(0, layer_tokens(seq, l) - forgotten * p_.page_size);
        }
    }
    return s;
}

}  // namespace superggml
