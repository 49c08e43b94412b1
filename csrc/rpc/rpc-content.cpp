#include "rpc-content.h"

#include "error.h"
#include "rpc.h"
#include "tensor-bind.h"

#include "ggml.h"
#include "ggml-backend.h"

#include <climits>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <unordered_map>
#include <utility>

namespace superggml {

namespace {

struct range_key_hash {
    size_t operator()(const std::pair<uint64_t, uint64_t> & k) const { return std::hash<uint64_t>()(k.first * 31 + k.second); }
};
// A file's hashed ranges: exact ones, and by start the largest starting there (a range inside one is named
// by that one's hash and its place in it).
struct range_map {
    std::unordered_map<std::pair<uint64_t, uint64_t>, uint64_t, range_key_hash> exact;
    std::map<uint64_t, std::pair<uint64_t, uint64_t>> spans;      // offset -> (size, hash)
    bool find(uint64_t off, uint64_t size, uint64_t & hash, uint64_t & within) const {
        auto e = exact.find({off, size});
        if (e != exact.end()) { hash = e->second; within = 0; return true; }
        auto it = spans.upper_bound(off);
        if (it == spans.begin()) return false;
        --it;
        if (off + size > it->first + it->second.first) return false;
        hash = it->second.second;
        within = off - it->first;
        return true;
    }
};

struct registry {
    std::mutex mu;
    std::map<std::string, range_map> index;     // path -> (offset, size) -> hash
    std::vector<std::string> files;             // file id -> path
    uint8_t key[16];
    registry() {
        std::random_device rd;
        for (auto & b : key) b = (uint8_t) rd();
    }
    uint32_t file_id(const std::string & path) {
        for (size_t i = 0; i < files.size(); ++i) if (files[i] == path) return (uint32_t) i;
        files.push_back(path);
        return (uint32_t) files.size() - 1;
    }
};

registry & reg() {
    static registry r;
    return r;
}

std::string canonical(const std::string & path) {
    char buf[PATH_MAX];
    return ::realpath(path.c_str(), buf) ? std::string(buf) : path;
}

template <typename T> void put(std::vector<uint8_t> & out, T v) {
    const auto * p = reinterpret_cast<const uint8_t *>(&v);
    out.insert(out.end(), p, p + sizeof v);
}

}  // namespace

void content_index_set(const std::string & path, const std::vector<content_range> & ranges) {
    range_map m;
    for (const auto & r : ranges) {
        m.exact[{r.offset, r.size}] = r.hash;
        auto & sp = m.spans[r.offset];
        if (r.size > sp.first) sp = {r.size, r.hash};
    }
    const std::string key = canonical(path);
    std::lock_guard<std::mutex> lk(reg().mu);
    if (ranges.empty()) reg().index.erase(key); else reg().index[key] = std::move(m);
}

std::vector<range_write> content_write(ggml_backend_buffer * buf, const std::string & path,
                                       std::vector<range_write> ranges) {
    if (!buf || ranges.empty()) return ranges;
    if (!rpc_device_addressed(ggml_backend_buft_get_device(ggml_backend_buffer_get_type(buf)))) return ranges;
    const size_t cap = ggml_backend_buffer_get_size(buf);
    const std::string key = canonical(path);
    std::vector<range_write> rest;
    std::vector<uint8_t> m;
    uint32_t n = 0;
    {
        std::lock_guard<std::mutex> lk(reg().mu);
        auto it = reg().index.find(key);
        if (it == reg().index.end()) return ranges;
        const uint32_t id = reg().file_id(key);
        m.insert(m.end(), reg().key, reg().key + 16);
        put(m, id);
        put(m, uint32_t(0));
        for (const auto & r : ranges) {
            if (r.dst_offset > cap || r.size > cap - r.dst_offset) throw Error("content_write: a range is outside the buffer");
            uint64_t hash = 0, within = 0;
            if (r.size < ADDRESSED_MIN || !it->second.find(r.file_offset, r.size, hash, within)) {
                rest.push_back(r);
                continue;
            }
            put(m, r.dst_offset);
            put(m, r.size);
            put(m, hash);
            put(m, within);
            put(m, r.file_offset);
            ++n;
        }
    }
    if (n == 0 || m.size() > cap) return ranges;
    std::memcpy(m.data() + 20, &n, 4);
    // the marker goes where ggml's writes go: a byte view of the whole buffer, written at its start
    ggml_init_params p = { ggml_tensor_overhead(), nullptr, true };
    ggml_context * ctx = ggml_init(p);
    if (!ctx) throw Error("cannot allocate a view for an addressed write");
    try {
        ggml_tensor * view = tensor_bytes(ctx, buf, ggml_backend_buffer_get_base(buf), cap);
        ggml_backend_tensor_set(view, m.data(), 0, m.size());
    } catch (...) {
        ggml_free(ctx);
        throw;
    }
    ggml_free(ctx);
    return rest;
}

bool marker_keyed(const uint8_t * p) {
    return std::memcmp(p, reg().key, 16) == 0;
}

bool marker_parse(const uint8_t * p, size_t n, marker & out) {
    if (n < MARKER_HEAD || !marker_keyed(p)) return false;
    uint32_t id = 0, count = 0;
    std::memcpy(&id, p + 16, 4);
    std::memcpy(&count, p + 20, 4);
    if (n != MARKER_HEAD + (size_t) count * MARKER_ENTRY) return false;
    {
        std::lock_guard<std::mutex> lk(reg().mu);
        if (id >= reg().files.size()) return false;
        out.path = reg().files[id];
    }
    out.entries.resize(count);
    for (uint32_t i = 0; i < count; ++i) std::memcpy(&out.entries[i], p + MARKER_HEAD + i * MARKER_ENTRY, MARKER_ENTRY);
    return true;
}

}  // namespace superggml
