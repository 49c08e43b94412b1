#include "rpc-peer.h"

#include "content-hash.h"
#include "error.h"
#include "io.h"
#include "prefetch.h"
#include "rpc-wire.h"
#include "telemetry.h"

#include "ggml.h"
#include "ggml-backend.h"
#include "ggml-backend-impl.h"   // ggml_backend_device: the served CPU device with the memory it advertises
#include "ggml-cpu.h"
#include "ggml-rpc.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

namespace superggml {

namespace {

using namespace wire;

uint64_t g_served_mem = 0;
ggml_backend_device g_served{};
void served_memory(ggml_backend_dev_t, size_t * free, size_t * total) {
    if (g_served_mem) {
        *free = *total = g_served_mem;
        return;
    }
    host_memory h = host_memory_info();     // what is available to this process (cgroup included)
    *free = h.available;
    *total = h.total;
}
void served_props(ggml_backend_dev_t dev, ggml_backend_dev_props * props) {
    ggml_backend_dev_get_props(ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU), props);
    served_memory(dev, &props->memory_free, &props->memory_total);
}
ggml_backend_t served_init(ggml_backend_dev_t dev, const char * params) {
    ggml_backend_t b = ggml_backend_dev_init(ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU), params);
    if (b) b->device = dev;      // the server asks the backend's device for the memory it reports
    return b;
}

constexpr double LONG = 1e7;                       // waits on the in-process server and on the client: no limit
constexpr size_t CHUNK = size_t(4) << 20;

// Where a hash's bytes are: a range of a model file or a cache file.
struct source {
    std::string path;
    uint64_t offset = 0, size = 0;
    bool direct = false;
};

struct held {
    size_t file;
    uint64_t offset, size;
    int state = 0;                                 // 0 not hashed yet, 1 good, 2 refused
};

struct cache_check {
    uint64_t size;
    int64_t mtime;
    bool good;
};

struct peer {
    rpc_server_params params;
    int inner_port = 0;
    fd_guard listener;
    std::mutex mu;
    std::map<uint64_t, std::vector<held>> by_hash;
    std::map<uint64_t, cache_check> cache_checked;
    std::atomic<uint64_t> loads{0}, bytes_loaded{0}, misses{0}, refused{0}, clients{0};

    bool good_copy(const std::string & path, uint64_t off, uint64_t size, uint64_t hash) {
        try {
            content_hash_params hp;
            hp.n_threads = 2;
            if (content_hash_ranges(path, {{off, size}}, hp).at(0) == hash) return true;
        } catch (const std::exception &) {
        }
        ++refused;
        fprintf(stderr, "superggml rpc-server: refused %s [%" PRIu64 ", +%" PRIu64 "): its bytes do not hash to "
                "%016" PRIx64 " (the client sends them instead)\n", path.c_str(), off, size, hash);
        return false;
    }
    bool find(uint64_t hash, uint64_t size, source & out);
    bool send_range(int inner, const uint8_t * tensor, uint64_t offset, const source & src, std::vector<uint8_t> & buf);
    void serve(int client);
};

std::mutex g_peers_mu;
std::vector<peer *> g_peers;                       // live until the process exits

// A held range whose bytes hash to `hash`, of at least `need` bytes (0: any; ggml's SET_TENSOR_HASH names
// no size; an SG_LOAD entry may ask for a part).
bool peer::find(uint64_t hash, uint64_t need, source & out) {
    for (;;) {
        held * h = nullptr;
        {
            std::lock_guard<std::mutex> lk(mu);
            auto it = by_hash.find(hash);
            if (it != by_hash.end()) {
                for (auto & x : it->second) {
                    if (x.state != 2 && x.size >= need) { h = &x; break; }
                }
            }
            if (h && h->state == 1) {
                out = {params.models[h->file].path, h->offset, h->size, params.direct};
                return true;
            }
        }
        if (!h) break;
        const bool good = good_copy(params.models[h->file].path, h->offset, h->size, hash);
        std::lock_guard<std::mutex> lk(mu);
        h->state = good ? 1 : 2;                   // vectors are not resized after start: h stays valid
    }
    if (params.cache_dir.empty()) return false;
    char name[17];
    snprintf(name, sizeof name, "%016" PRIx64, hash);
    const std::string path = params.cache_dir + "/" + name;
    struct stat st{};
    if (::stat(path.c_str(), &st) != 0 || st.st_size <= 0 || (uint64_t) st.st_size < need) return false;
    const int64_t mtime = (int64_t) st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
    bool good;
    {
        std::lock_guard<std::mutex> lk(mu);
        auto it = cache_checked.find(hash);
        if (it != cache_checked.end() && it->second.size == (uint64_t) st.st_size && it->second.mtime == mtime) {
            good = it->second.good;
        } else {
            good = false;
            it = cache_checked.end();
        }
        if (it != cache_checked.end()) {
            if (good) out = {path, 0, (uint64_t) st.st_size, false};
            return good;
        }
    }
    good = good_copy(path, 0, (uint64_t) st.st_size, hash);
    std::lock_guard<std::mutex> lk(mu);
    cache_checked[hash] = {(uint64_t) st.st_size, mtime, good};
    if (good) out = {path, 0, (uint64_t) st.st_size, false};
    return good;
}

// Reads [off, off + n) of `fd` (O_DIRECT: from the aligned window around it, into `abuf`); false if the
// kernel refused the direct read. `data` points at the bytes.
bool read_chunk(int fd, bool direct, uint64_t off, size_t n, uint8_t * abuf, const uint8_t *& data) {
    if (!direct) {
        io_pread_all(fd, abuf, n, (off_t) off, "a held copy");
        data = abuf;
        return true;
    }
    const uint64_t a0 = off / DIRECT_ALIGN * DIRECT_ALIGN;
    const size_t lead = (size_t) (off - a0);
    const size_t len = (lead + n + DIRECT_ALIGN - 1) / DIRECT_ALIGN * DIRECT_ALIGN;
    size_t got = 0;
    while (got < lead + n) {
        ssize_t k = io_pread(fd, abuf + got, len - got, (off_t) (a0 + got));
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && errno == EINVAL) return false;
        if (k < 0) throw FileError(std::string("cannot read a held copy: ") + std::strerror(errno), errno);
        if (k == 0) throw FileError("a held copy was truncated", EIO);
        got += (size_t) k;
        if (got % DIRECT_ALIGN && got < lead + n) return false;
    }
    data = abuf + lead;
    return true;
}

bool peer::send_range(int inner, const uint8_t * tensor, uint64_t offset, const source & src,
                      std::vector<uint8_t> & buf) {
    io_fd fd(::open(src.path.c_str(), O_RDONLY | O_CLOEXEC));
    io_fd dfd(src.direct ? ::open(src.path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT) : -1);
    if (!fd.valid()) return false;
    uint8_t hdr[SET_CMD_HEAD];
    set_tensor_head(hdr, tensor, false, offset, src.size);
    if (!send_all(inner, hdr, sizeof hdr, LONG)) return false;
    uint8_t * abuf = reinterpret_cast<uint8_t *>(
        (reinterpret_cast<uintptr_t>(buf.data()) + DIRECT_ALIGN - 1) / DIRECT_ALIGN * DIRECT_ALIGN);
    bool direct = dfd.valid();
    for (uint64_t done = 0; done < src.size;) {
        const size_t n = (size_t) std::min<uint64_t>(CHUNK, src.size - done);
        const uint8_t * data = nullptr;
        if (!(direct && read_chunk(dfd.get(), true, src.offset + done, n, abuf, data))) {
            direct = false;
            read_chunk(fd.get(), false, src.offset + done, n, abuf, data);
        }
        if (!send_all(inner, data, n, LONG)) return false;
        done += n;
    }
    ++loads;
    bytes_loaded += src.size;
    return true;
}

void peer::serve(int client_fd) {
    fd_guard client(client_fd);
    ++clients;
    std::string err;
    fd_guard inner;
    for (int i = 0; i < 100 && inner.fd < 0; ++i) {     // ggml's server may still be starting
        inner.fd = connect_to("127.0.0.1", inner_port, 5, err);
        if (inner.fd < 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (inner.fd < 0) {
        fprintf(stderr, "superggml rpc-server: cannot reach ggml's server: %s\n", err.c_str());
        return;
    }
    std::vector<uint8_t> buf(CHUNK + 2 * DIRECT_ALIGN), payload;
    relay_pipe pipe;
    for (;;) {
        uint8_t cmd;
        uint64_t size;
        if (!recv_blocking(client.fd, &cmd, 1) || !recv_blocking(client.fd, &size, 8)) return;
        const bool ours = cmd == SG_HELLO || cmd == SG_LOAD || cmd == SET_TENSOR_HASH;
        if (ours) {
            if (size > WIRE_TENSOR + 4 + SG_MAX_ENTRIES * SG_ENTRY) return;
            payload.resize(size);
            if (!recv_blocking(client.fd, payload.data(), size)) return;
        }
        if (cmd == SG_HELLO) {
            uint8_t rsp[8 + 12] = {12, 0, 0, 0, 0, 0, 0, 0, 'S', 'G', 'G', 'L'};
            const uint32_t v = SG_VERSION, flags = params.models.empty() ? 0 : 1;
            std::memcpy(rsp + 12, &v, 4);
            std::memcpy(rsp + 16, &flags, 4);
            if (!send_blocking(client.fd, rsp, sizeof rsp)) return;
            continue;
        }
        if (cmd == SG_LOAD) {
            uint32_t n = 0;
            if (size < WIRE_TENSOR + 4) return;
            std::memcpy(&n, payload.data() + WIRE_TENSOR, 4);
            if (size != WIRE_TENSOR + 4 + (uint64_t) n * SG_ENTRY) return;
            std::vector<uint8_t> rsp(8 + n, 0);
            std::vector<source> srcs(n);
            std::vector<uint64_t> offsets(n);
            const uint64_t count = n;
            std::memcpy(rsp.data(), &count, 8);
            for (uint32_t i = 0; i < n; ++i) {
                uint64_t e[4];                      // offset, size, hash, within
                std::memcpy(e, payload.data() + WIRE_TENSOR + 4 + i * SG_ENTRY, SG_ENTRY);
                offsets[i] = e[0];
                rsp[8 + i] = e[3] + e[1] >= e[3] && find(e[2], e[3] + e[1], srcs[i]) ? 1 : 0;
                if (!rsp[8 + i]) { ++misses; continue; }
                srcs[i].offset += e[3];
                srcs[i].size = e[1];
            }
            if (!send_blocking(client.fd, rsp.data(), rsp.size())) return;
            for (uint32_t i = 0; i < n; ++i) {
                if (rsp[8 + i] && !send_range(inner.fd, payload.data(), offsets[i], srcs[i], buf)) return;
            }
            continue;
        }
        if (cmd == SET_TENSOR_HASH && size == WIRE_TENSOR + 16) {
            uint64_t offset, hash;
            std::memcpy(&offset, payload.data() + WIRE_TENSOR, 8);
            std::memcpy(&hash, payload.data() + WIRE_TENSOR + 8, 8);
            source src;
            if (find(hash, 0, src)) {
                if (!send_range(inner.fd, payload.data(), offset, src, buf)) return;
                const uint8_t rsp[9] = {1, 0, 0, 0, 0, 0, 0, 0, 1};
                if (!send_blocking(client.fd, rsp, sizeof rsp)) return;
                continue;
            }
        }
        uint8_t hdr[9];
        hdr[0] = cmd;
        std::memcpy(hdr + 1, &size, 8);
        if (!send_all(inner.fd, hdr, 9, LONG)) return;
        if (ours) {
            if (!send_all(inner.fd, payload.data(), size, LONG)) return;
        } else {
            bool failed = false;
            if (!forward(client.fd, inner.fd, size, pipe, buf, LONG, failed) || failed) return;
        }
        if (!has_response(cmd)) continue;
        uint64_t out = 0;
        if (!recv_all(inner.fd, &out, 8, LONG) || !send_blocking(client.fd, &out, 8)) return;
        for (uint64_t got = 0; got < out;) {
            const size_t k = (size_t) std::min<uint64_t>(out - got, buf.size());
            if (!recv_all(inner.fd, buf.data(), k, LONG) || !send_blocking(client.fd, buf.data(), k)) return;
            got += k;
        }
    }
}

}  // namespace

void rpc_server_start(const rpc_server_params & params) {
    std::string host, err;
    int port = 0;
    if (!split_endpoint(params.endpoint, host, port)) throw Error("RPC endpoint '" + params.endpoint + "' is not HOST:PORT");
    if (params.n_threads < 1) throw Error("n_threads must be >= 1");
    auto p = std::make_unique<peer>();
    p->params = params;
    for (size_t f = 0; f < params.models.size(); ++f) {
        for (const auto & r : params.models[f].ranges) p->by_hash[r.hash].push_back({f, r.offset, r.size});
    }
    p->listener.fd = listen_on(host, port, err);
    if (p->listener.fd < 0) throw Error("RPC server: " + err);
    {   // a free loopback port for ggml's own server
        int inner = 0;
        fd_guard probe(listen_on("127.0.0.1", inner, err));
        if (probe.fd < 0) throw Error("RPC server: " + err);
        p->inner_port = inner;
    }
    ggml_backend_dev_t cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    if (!cpu) throw Error("RPC server: this build has no CPU device");
    // the CPU device, advertising `mem`, or else the memory available to this process (ggml's CPU device
    // reports all of the host's as free, which would leave a client's memory-pressure reading at 0)
    g_served_mem = params.mem;
    g_served = *cpu;
    g_served.iface.get_memory = served_memory;
    g_served.iface.get_props = served_props;
    g_served.iface.init_backend = served_init;
    ggml_backend_dev_t dev = &g_served;
    std::string inner_ep = "127.0.0.1:" + std::to_string(p->inner_port), cache = params.cache_dir;
    const size_t n_threads = (size_t) params.n_threads;
    std::thread([inner_ep, cache, n_threads, dev]() mutable {
        ggml_backend_rpc_start_server(inner_ep.c_str(), cache.empty() ? nullptr : cache.c_str(), n_threads, 1, &dev);
    }).detach();
    peer * me = p.release();
    {
        std::lock_guard<std::mutex> lk(g_peers_mu);
        g_peers.push_back(me);
    }
    std::thread([me] {
        for (;;) {
            int c = ::accept4(me->listener.fd, nullptr, nullptr, SOCK_CLOEXEC);
            if (c < 0) {
                if (errno == EINTR || errno == ECONNABORTED) continue;
                return;
            }
            int one = 1;
            ::setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            ::setsockopt(c, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
            std::thread([me, c] { me->serve(c); }).detach();
        }
    }).detach();
}

rpc_server_stats rpc_server_stats_get() {
    rpc_server_stats s;
    std::lock_guard<std::mutex> lk(g_peers_mu);
    for (const peer * p : g_peers) {
        s.loads += p->loads;
        s.bytes_loaded += p->bytes_loaded;
        s.misses += p->misses;
        s.refused += p->refused;
        s.clients += p->clients;
    }
    return s;
}

}  // namespace superggml
