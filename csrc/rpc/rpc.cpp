#include "rpc.h"

#include "content-hash.h"
#include "io.h"
#include "remote.h"
#include "rpc-content.h"
#include "rpc-wire.h"

#include "telemetry.h"

#include "ggml.h"
#include "ggml-backend.h"
#include "ggml-backend-impl.h"   // ggml_backend_device: the served CPU device with the memory it advertises
#include "ggml-cpu.h"
#include "ggml-rpc.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <tuple>

namespace superggml {

namespace {

using namespace wire;

constexpr size_t HEAD = 512;                              // request bytes kept to answer for a failed server
static_assert(WIRE_TENSOR + 16 <= HEAD, "GET_TENSOR's size must be among the kept bytes");
static_assert(SET_HEAD + 16 <= HEAD, "a marker's key must be among the kept bytes");

// The response a command gets, as a failed server's stand-in gives it (zeros but where ggml would
// assert or divide); false: the command has none.
bool stand_in(uint8_t cmd, const uint8_t * head, size_t head_n, std::vector<uint8_t> & out) {
    auto u64 = [&](size_t at, uint64_t v) { std::memcpy(out.data() + at, &v, 8); };
    switch (cmd) {
        case HELLO: out.assign(4 + CAPS, 0); out[0] = RPC_PROTO_MAJOR_VERSION; return true;
        case DEVICE_COUNT: out.assign(4, 0); out[0] = 1; return true;
        case ALLOC_BUFFER: out.assign(16, 0); return true;                  // remote_ptr 0: allocation fails
        case GET_ALLOC_SIZE: out.assign(8, 0); return true;
        case GET_ALIGNMENT: out.assign(8, 0); u64(0, 64); return true;
        case GET_MAX_SIZE: out.assign(8, 0); u64(0, uint64_t(1) << 40); return true;
        case BUFFER_GET_BASE: out.assign(8, 0); u64(0, 4096); return true;  // a base of 0 is asserted on
        case SET_TENSOR_HASH: out.assign(1, 1); return true;                // "found": no data follows
        case COPY_TENSOR: out.assign(1, 1); return true;
        case GET_DEVICE_MEMORY: out.assign(16, 0); return true;
        case GET_TENSOR: {
            uint64_t n = 0;
            if (head_n >= WIRE_TENSOR + 16) std::memcpy(&n, head + WIRE_TENSOR + 8, 8);
            out.assign(n, 0);
            return true;
        }
        default: return false;
    }
}

// One server behind its relay.
struct endpoint_state {
    std::string endpoint, host, local;   // local: the relay's "127.0.0.1:port", what ggml connects to
    int port = 0;
    rpc_params params;
    fd_guard listener;
    std::vector<rpc_device_info> devices;
    std::atomic<uint64_t> sent{0}, received{0}, commands{0}, wait_ns{0};
    std::atomic<uint64_t> loaded_by_peer{0}, addressed_misses{0};
    std::atomic<bool> addressed{false};  // the server speaks superggml's relay protocol (answered SG_HELLO)
    // (hash, within, size) of a part it lacked -> the hash of that part's bytes, which it keeps once sent
    std::map<std::tuple<uint64_t, uint64_t, uint64_t>, uint64_t> parts;
    std::mutex mu;
    int dead_open = 0;                   // failed connections not yet closed by ggml
    std::string error;

    void failed(const std::string & why) {
        std::lock_guard<std::mutex> lk(mu);
        ++dead_open;
        error = why;
        fprintf(stderr, "superggml: RPC server %s failed (%s); its commands now get empty answers\n",
                endpoint.c_str(), why.c_str());
    }
    void closed_dead() {
        std::lock_guard<std::mutex> lk(mu);
        --dead_open;
    }
    void relay(int client_fd);
    void accept_loop();
    bool write_addressed(int up, const uint8_t * set_head, const marker & mk, std::vector<uint8_t> & buf,
                         std::string & why);
};

std::mutex g_mu;
std::map<std::string, std::shared_ptr<endpoint_state>> g_by_endpoint;
std::map<std::string, std::shared_ptr<endpoint_state>> g_by_local;

void endpoint_state::accept_loop() {
    for (;;) {
        int c = ::accept4(listener.fd, nullptr, nullptr, SOCK_CLOEXEC);
        if (c < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            return;
        }
        int one = 1;
        ::setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        std::thread([this, c] { relay(c); }).detach();   // endpoint states live until the process exits
    }
}

// A marker's ranges: SG_LOAD asks the peer to load them from its own copy; those it lacks (all of them on a
// plain server) follow as SET_TENSOR with bytes read here, with ggml's cache flag for a superggml peer.
bool endpoint_state::write_addressed(int up, const uint8_t * set_head, const marker & mk, std::vector<uint8_t> & buf,
                                     std::string & why) {
    const double T = params.timeout;
    const size_t n = mk.entries.size();
    std::vector<uint8_t> held(n, 0);
    if (addressed) {
        std::vector<uint8_t> req(9 + WIRE_TENSOR + 4 + n * SG_ENTRY);
        req[0] = SG_LOAD;
        uint64_t size = req.size() - 9;
        uint32_t count = (uint32_t) n;
        std::memcpy(req.data() + 1, &size, 8);
        std::memcpy(req.data() + 9, set_head, WIRE_TENSOR);
        std::memcpy(req.data() + 9 + WIRE_TENSOR, &count, 4);
        {
            std::lock_guard<std::mutex> lk(mu);
            for (size_t i = 0; i < n; ++i) {
                marker_entry e = mk.entries[i];
                auto it = parts.find({e.hash, e.within, e.size});
                if (it != parts.end()) { e.hash = it->second; e.within = 0; }
                std::memcpy(req.data() + 9 + WIRE_TENSOR + 4 + i * SG_ENTRY, &e, SG_ENTRY);  // offset, size, hash, within
            }
        }
        const double t0 = now();
        uint64_t out = 0;
        if (!send_all(up, req.data(), req.size(), T) || !recv_all(up, &out, 8, T) || out != n ||
            !recv_all(up, held.data(), n, T)) {
            why = errno == 0 && out != n ? "SG_LOAD: a malformed answer" : reason("SG_LOAD", T);
            return false;
        }
        sent += req.size();
        received += 8 + n;
        wait_ns += (uint64_t) ((now() - t0) * 1e9);
    }
    fd_guard file;
    for (size_t i = 0; i < n; ++i) {
        const marker_entry & e = mk.entries[i];
        if (held[i]) { loaded_by_peer += e.size; continue; }
        ++addressed_misses;
        if (file.fd < 0 && (file.fd = ::open(mk.path.c_str(), O_RDONLY | O_CLOEXEC)) < 0) {
            why = "cannot open " + mk.path + " to send its bytes: " + std::strerror(errno);
            return false;
        }
        uint8_t hdr[SET_CMD_HEAD];
        set_tensor_head(hdr, set_head, addressed, e.dst_offset, e.size);  // a superggml peer keeps them in its cache
        if (!send_all(up, hdr, sizeof hdr, T)) { why = reason("SET_TENSOR", T); return false; }
        sent += sizeof hdr;
        uint64_t h = content_hash_seed;
        for (uint64_t done = 0; done < e.size;) {
            const size_t k = (size_t) std::min<uint64_t>(buf.size(), e.size - done);
            try {
                io_pread_all(file.fd, buf.data(), k, (off_t) (e.file_offset + done), mk.path);
            } catch (const std::exception & x) {
                why = x.what();
                return false;
            }
            if (!send_all(up, buf.data(), k, T)) { why = reason("SET_TENSOR", T); return false; }
            if (addressed) h = content_hash(buf.data(), k, h);
            sent += k;
            done += k;
        }
        if (addressed && h != e.hash) {           // kept under the hash of these bytes: ask for that next time
            std::lock_guard<std::mutex> lk(mu);
            parts[{e.hash, e.within, e.size}] = h;
        }
    }
    return true;
}

void endpoint_state::relay(int client_fd) {
    fd_guard client(client_fd);
    std::string err;
    fd_guard up(connect_to(host, port, params.connect_timeout, err));
    bool dead = up.fd < 0;
    if (dead) failed(err);
    auto fail = [&](const std::string & why) { if (!dead) { dead = true; failed(why); } };
    const double T = params.timeout;
    std::vector<uint8_t> buf(1 << 20), answer;
    uint8_t head[HEAD];
    relay_pipe pipe;
    for (;;) {
        uint8_t cmd;
        uint64_t size;
        if (!recv_blocking(client.fd, &cmd, 1) || !recv_blocking(client.fd, &size, 8)) break;
        // the payload's first bytes through this process (kept: a stand-in answer may need them), the rest
        // spliced from ggml's socket to the server's through a pipe, without a copy into this process
        size_t head_n = (size_t) std::min<uint64_t>(size, HEAD);
        if (!recv_blocking(client.fd, head, head_n)) goto done;
        if (cmd == SET_TENSOR && size >= SET_HEAD + MARKER_HEAD && size <= SET_HEAD + MARKER_HEAD + SG_MAX_ENTRIES *
            MARKER_ENTRY && marker_keyed(head + SET_HEAD)) {        // a write by content address: never forwarded
            std::vector<uint8_t> payload(head, head + head_n);
            payload.resize(size);
            if (!recv_blocking(client.fd, payload.data() + head_n, size - head_n)) goto done;
            marker mk;
            std::string why;
            if (!marker_parse(payload.data() + SET_HEAD, size - SET_HEAD, mk)) {
                fail("a malformed content-addressed write");
            } else if (!dead && !write_addressed(up.fd, payload.data(), mk, buf, why)) {
                fail(why);
            }
            ++commands;
            continue;
        }
        if (!dead) {
            uint8_t hdr[9];
            hdr[0] = cmd;
            std::memcpy(hdr + 1, &size, 8);
            if (!send_all(up.fd, hdr, 9, T)) fail(reason(cmd_name(cmd), T));
        }
        if (cmd == HELLO) std::memset(head, 0, head_n);                   // plain TCP: no transport upgrade
        if (!dead && !send_all(up.fd, head, head_n, T)) fail(reason(cmd_name(cmd), T));
        if (!dead) sent += head_n;
        {
            bool lost = dead;
            if (!forward(client.fd, up.fd, size - head_n, pipe, buf, T, lost)) goto done;
            if (lost) fail(reason(cmd_name(cmd), T));
            else sent += size - head_n;
        }
        ++commands;
        if (!has_response(cmd)) continue;
        if (!dead) {
            double t0 = now();
            uint64_t out = 0;
            if (!recv_all(up.fd, &out, 8, T)) {
                fail(reason(cmd_name(cmd), T));
            } else {
                if (!send_blocking(client.fd, &out, 8)) goto done;
                uint64_t got = 0;
                while (got < out) {
                    size_t n = (size_t) std::min<uint64_t>(out - got, buf.size());
                    if (!recv_all(up.fd, buf.data(), n, T)) {
                        fail(reason(cmd_name(cmd), T));
                        std::memset(buf.data(), 0, buf.size());
                        while (got < out) {                             // the rest as zeros: a whole answer
                            size_t z = (size_t) std::min<uint64_t>(out - got, buf.size());
                            if (!send_blocking(client.fd, buf.data(), z)) goto done;
                            got += z;
                        }
                        break;
                    }
                    if (cmd == HELLO && got == 0 && n >= 4) std::memset(buf.data() + 4, 0, std::min(n - 4, CAPS));
                    if (!send_blocking(client.fd, buf.data(), n)) goto done;
                    got += n;
                    received += n;
                }
                wait_ns += (uint64_t) ((now() - t0) * 1e9);
                continue;
            }
        }
        stand_in(cmd, head, head_n, answer);          // the server failed: the answer it would have sent
        uint64_t n = answer.size();
        if (!send_blocking(client.fd, &n, 8) || !send_blocking(client.fd, answer.data(), answer.size())) goto done;
    }
done:
    if (dead) closed_dead();
}

struct hello_rsp {
    uint8_t major, minor, patch, pad;
    uint8_t caps[CAPS];
};

// Probes the server; true if it also speaks superggml's relay protocol (a plain ggml server closes the
// connection on SG_HELLO, an unknown command to it).
bool probe(const std::string & endpoint, const std::string & host, int port, const rpc_params & p) {
    std::string err;
    fd_guard fd(connect_to(host, port, p.connect_timeout, err));
    if (fd.fd < 0) throw DeviceError("RPC server " + endpoint + ": " + err);
    uint8_t req[1 + 8 + CAPS] = {HELLO};
    uint64_t n = CAPS;
    std::memcpy(req + 1, &n, 8);
    uint64_t out = 0;
    hello_rsp rsp{};
    if (!send_all(fd.fd, req, sizeof req, p.connect_timeout) || !recv_all(fd.fd, &out, 8, p.connect_timeout)) {
        throw DeviceError("RPC server " + endpoint + ": " + (errno == ETIMEDOUT
            ? "no answer to HELLO within " + std::to_string((int) p.connect_timeout) +
              " s (is it serving another client? a ggml RPC server serves one at a time)"
            : reason("HELLO", p.connect_timeout) + " (not a ggml RPC server, or another protocol version)"));
    }
    if (out != sizeof rsp || !recv_all(fd.fd, &rsp, sizeof rsp, p.connect_timeout)) {
        throw DeviceError("RPC server " + endpoint + ": a malformed HELLO answer (not a ggml RPC server of protocol " +
                          std::to_string(RPC_PROTO_MAJOR_VERSION) + ".x)");
    }
    if (rsp.major != RPC_PROTO_MAJOR_VERSION || rsp.minor > RPC_PROTO_MINOR_VERSION) {
        throw DeviceError("RPC server " + endpoint + " speaks protocol " + std::to_string(rsp.major) + "." +
                          std::to_string(rsp.minor) + "." + std::to_string(rsp.patch) + "; this build speaks " +
                          std::to_string(RPC_PROTO_MAJOR_VERSION) + "." + std::to_string(RPC_PROTO_MINOR_VERSION) +
                          " (run the server from the same ggml)");
    }
    uint8_t sg[9] = {SG_HELLO};
    uint8_t rsp_sg[12] = {};
    if (!send_all(fd.fd, sg, sizeof sg, p.connect_timeout) || !recv_all(fd.fd, &out, 8, p.connect_timeout) ||
        out != sizeof rsp_sg || !recv_all(fd.fd, rsp_sg, sizeof rsp_sg, p.connect_timeout)) {
        return false;
    }
    uint32_t version = 0;
    std::memcpy(&version, rsp_sg + 4, 4);
    return std::memcmp(rsp_sg, "SGGL", 4) == 0 && version == SG_VERSION;
}

std::shared_ptr<endpoint_state> state_of(ggml_backend_device * dev) {
    if (!dev || ggml_backend_dev_backend_reg(dev) != ggml_backend_rpc_reg()) return nullptr;
    std::lock_guard<std::mutex> lk(g_mu);
    auto it = g_by_local.find(ggml_backend_dev_description(dev));
    return it == g_by_local.end() ? nullptr : it->second;
}

void check_state(endpoint_state & s) {
    std::lock_guard<std::mutex> lk(s.mu);
    if (s.dead_open > 0) {
        throw DeviceError("RPC server " + s.endpoint + " failed: " + s.error +
                          ". What it held is lost: the next call on the model reconnects and loads it again");
    }
}

}  // namespace

void rpc_probe(const std::string & endpoint, const rpc_params & params) {
    std::string host;
    int port = 0;
    if (!split_endpoint(endpoint, host, port)) {
        throw DeviceError("RPC endpoint '" + endpoint + "' is not HOST:PORT");
    }
    probe(endpoint, host, port, params);
}

std::vector<rpc_device_info> rpc_add_server(const std::string & endpoint, const rpc_params & params) {
    // the core learns about RPC devices through remote.h's hooks: installed before the first one is registered
    static std::once_flag hooks_once;
    std::call_once(hooks_once, [] {
        remote_device_hooks h;
        h.endpoint = rpc_device_endpoint;
        h.usable = rpc_device_usable;
        h.check = rpc_check;
        remote_devices_set(h);
    });
    std::string host;
    int port = 0;
    if (!split_endpoint(endpoint, host, port)) throw DeviceError("RPC endpoint '" + endpoint + "' is not HOST:PORT");
    std::shared_ptr<endpoint_state> s;
    {
        std::lock_guard<std::mutex> lk(g_mu);
        auto it = g_by_endpoint.find(endpoint);
        if (it != g_by_endpoint.end()) s = it->second;
    }
    if (s) {
        check_state(*s);
        std::lock_guard<std::mutex> lk(s->mu);
        s->params = params;
    }
    const bool addressed = probe(endpoint, host, port, params);
    if (s) {
        s->addressed = addressed;
        std::lock_guard<std::mutex> lk(s->mu);
        if (s->dead_open == 0) s->error.clear();     // serving again
        for (auto & d : s->devices) d.addressed = addressed;
        return s->devices;
    }

    s = std::make_shared<endpoint_state>();
    s->endpoint = endpoint;
    s->host = host;
    s->port = port;
    s->params = params;
    s->addressed = addressed;
    s->listener.fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (s->listener.fd < 0 || ::bind(s->listener.fd, (sockaddr *) &a, sizeof a) != 0 ||
        ::listen(s->listener.fd, 16) != 0 || ::getsockname(s->listener.fd, (sockaddr *) &a, &len) != 0) {
        throw Error(std::string("cannot open the RPC relay's loopback port: ") + std::strerror(errno));
    }
    s->local = "127.0.0.1:" + std::to_string(ntohs(a.sin_port));
    {
        std::lock_guard<std::mutex> lk(g_mu);
        g_by_endpoint[endpoint] = s;
        g_by_local[s->local] = s;
    }
    std::thread([s] { s->accept_loop(); }).detach();

    ggml_backend_reg_t reg = ggml_backend_rpc_add_server(s->local.c_str());
    check_state(*s);
    if (!reg) throw DeviceError("RPC server " + endpoint + " has no devices");
    ggml_backend_register(reg);
    for (size_t i = 0; i < ggml_backend_reg_dev_count(reg); ++i) {
        s->devices.push_back({ggml_backend_dev_name(ggml_backend_reg_dev_get(reg, i)), endpoint, (uint32_t) i, addressed});
    }
    return s->devices;
}

std::string rpc_device_endpoint(ggml_backend_device * dev) {
    auto s = state_of(dev);
    return s ? s->endpoint : std::string();
}

bool rpc_device_addressed(ggml_backend_device * dev) {
    auto s = state_of(dev);
    return s && s->addressed;
}

bool rpc_device_usable(ggml_backend_device * dev) {
    if (!dev || ggml_backend_dev_backend_reg(dev) != ggml_backend_rpc_reg()) return true;
    auto s = state_of(dev);
    if (!s) return false;
    std::lock_guard<std::mutex> lk(s->mu);
    return s->error.empty();
}

void rpc_check(ggml_backend_device * dev) {
    if (dev) {
        if (auto s = state_of(dev)) check_state(*s);
        return;
    }
    std::vector<std::shared_ptr<endpoint_state>> all;
    {
        std::lock_guard<std::mutex> lk(g_mu);
        for (auto & kv : g_by_endpoint) all.push_back(kv.second);
    }
    for (auto & s : all) check_state(*s);
}

std::vector<rpc_endpoint_stats> rpc_stats() {
    std::vector<rpc_endpoint_stats> out;
    std::lock_guard<std::mutex> lk(g_mu);
    for (auto & kv : g_by_endpoint) {
        endpoint_state & s = *kv.second;
        rpc_endpoint_stats st;
        st.endpoint = s.endpoint;
        st.bytes_sent = s.sent;
        st.bytes_received = s.received;
        st.commands = s.commands;
        st.wait_seconds = s.wait_ns * 1e-9;
        st.loaded_by_peer = s.loaded_by_peer;
        st.addressed_misses = s.addressed_misses;
        st.addressed = s.addressed;
        std::lock_guard<std::mutex> lk2(s.mu);
        st.failed = s.dead_open > 0;
        st.error = s.error;
        out.push_back(st);
    }
    return out;
}

}  // namespace superggml
