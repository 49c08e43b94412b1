#include "rpc.h"

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

namespace superggml {

namespace {

// The wire protocol the relay frames (ggml-rpc.cpp): request | cmd u8 | size u64 | payload |, response
// | size u64 | payload | for the commands that have one.
static_assert(RPC_PROTO_MAJOR_VERSION == 7, "ggml's RPC protocol changed: review the relay's command table");
enum : uint8_t {
    ALLOC_BUFFER, GET_ALIGNMENT, GET_MAX_SIZE, BUFFER_GET_BASE, FREE_BUFFER, BUFFER_CLEAR, SET_TENSOR,
    SET_TENSOR_HASH, GET_TENSOR, COPY_TENSOR, GRAPH_COMPUTE, GET_DEVICE_MEMORY, INIT_TENSOR, GET_ALLOC_SIZE,
    HELLO, DEVICE_COUNT, GRAPH_RECOMPUTE, MEMSET_TENSOR, CMD_COUNT,
};
constexpr size_t CAPS = 24;                               // HELLO's transport capabilities
constexpr size_t WIRE_TENSOR = 8 + 4 + 8 + 8 * GGML_MAX_DIMS + 4 + GGML_MAX_OP_PARAMS + 4 + 8 * GGML_MAX_SRC +
                               8 * 3 + GGML_MAX_NAME + 4;  // rpc_tensor
constexpr size_t HEAD = 512;                              // request bytes kept to answer for a failed server
static_assert(WIRE_TENSOR + 16 <= HEAD, "GET_TENSOR's size must be among the kept bytes");

const char * cmd_name(uint8_t c) {
    static const char * names[] = {"ALLOC_BUFFER", "GET_ALIGNMENT", "GET_MAX_SIZE", "BUFFER_GET_BASE", "FREE_BUFFER",
        "BUFFER_CLEAR", "SET_TENSOR", "SET_TENSOR_HASH", "GET_TENSOR", "COPY_TENSOR", "GRAPH_COMPUTE",
        "GET_DEVICE_MEMORY", "INIT_TENSOR", "GET_ALLOC_SIZE", "HELLO", "DEVICE_COUNT", "GRAPH_RECOMPUTE",
        "MEMSET_TENSOR"};
    return c < CMD_COUNT ? names[c] : "unknown";
}

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

bool has_response(uint8_t cmd) {
    switch (cmd) {
        case HELLO: case DEVICE_COUNT: case ALLOC_BUFFER: case GET_ALLOC_SIZE: case GET_ALIGNMENT: case GET_MAX_SIZE:
        case BUFFER_GET_BASE: case SET_TENSOR_HASH: case COPY_TENSOR: case GET_DEVICE_MEMORY: case GET_TENSOR:
            return true;
        default:
            return false;
    }
}

struct fd_guard {
    int fd = -1;
    fd_guard() = default;
    explicit fd_guard(int f) : fd(f) {}
    ~fd_guard() { if (fd >= 0) ::close(fd); }
    fd_guard(const fd_guard &) = delete;
    fd_guard & operator=(const fd_guard &) = delete;
};

double now() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

bool split_endpoint(const std::string & ep, std::string & host, int & port) {
    size_t c = ep.rfind(':');
    if (c == std::string::npos || c == 0) return false;
    host = ep.substr(0, c);
    if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
    try {
        size_t used = 0;
        port = std::stoi(ep.substr(c + 1), &used);
        return used == ep.size() - c - 1 && port > 0 && port < 65536;
    } catch (...) {
        return false;
    }
}

// Waits for `events` on fd until the deadline; false on timeout (errno ETIMEDOUT).
bool wait_fd(int fd, short events, double deadline) {
    for (;;) {
        double left = deadline - now();
        if (left <= 0) { errno = ETIMEDOUT; return false; }
        pollfd p{fd, events, 0};
        int r = ::poll(&p, 1, (int) std::min(left * 1e3 + 1, 1e9));
        if (r > 0) return true;
        if (r < 0 && errno != EINTR) return false;
    }
}

// Non-blocking socket I/O with a deadline: false on timeout, error or EOF (errno 0 for EOF).
bool send_all(int fd, const void * data, size_t n, double timeout) {
    const char * p = (const char *) data;
    double deadline = now() + timeout;
    while (n) {
        ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
        if (k > 0) { p += k; n -= (size_t) k; deadline = now() + timeout; continue; }
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
            if (!wait_fd(fd, POLLOUT, deadline)) return false;
            continue;
        }
        return false;
    }
    return true;
}

bool recv_all(int fd, void * data, size_t n, double timeout) {
    char * p = (char *) data;
    double deadline = now() + timeout;
    while (n) {
        ssize_t k = ::recv(fd, p, n, 0);
        if (k > 0) { p += k; n -= (size_t) k; deadline = now() + timeout; continue; }
        if (k == 0) { errno = 0; return false; }
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
            if (!wait_fd(fd, POLLIN, deadline)) return false;
            continue;
        }
        return false;
    }
    return true;
}

// Blocking reads from ggml's side of the relay (this process): false at EOF.
bool recv_blocking(int fd, void * data, size_t n) {
    char * p = (char *) data;
    while (n) {
        ssize_t k = ::recv(fd, p, n, 0);
        if (k > 0) { p += k; n -= (size_t) k; continue; }
        if (k < 0 && errno == EINTR) continue;
        return false;
    }
    return true;
}

bool send_blocking(int fd, const void * data, size_t n) {
    const char * p = (const char *) data;
    while (n) {
        ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
        if (k > 0) { p += k; n -= (size_t) k; continue; }
        if (k < 0 && errno == EINTR) continue;
        return false;
    }
    return true;
}

std::string reason(const char * what, double timeout) {
    if (errno == ETIMEDOUT) return std::string(what) + ": no answer within " + std::to_string((int) timeout) + " s";
    if (errno == 0) return std::string(what) + ": the server closed the connection";
    return std::string(what) + ": " + std::strerror(errno);
}

// A connected, non-blocking TCP socket to host:port with keepalive; -1 and `err` on failure.
int connect_to(const std::string & host, int port, double timeout, std::string & err) {
    addrinfo hints{}, * res = nullptr;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
    if (rc != 0) { err = std::string("cannot resolve the host: ") + gai_strerror(rc); return -1; }
    std::unique_ptr<addrinfo, void (*)(addrinfo *)> free_res(res, freeaddrinfo);
    double deadline = now() + timeout;
    err = "no address";
    for (addrinfo * a = res; a; a = a->ai_next) {
        int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) { err = std::strerror(errno); continue; }
        fd_guard g(fd);
        if (::connect(fd, a->ai_addr, a->ai_addrlen) != 0 && errno != EINPROGRESS) {
            err = std::string("cannot connect: ") + std::strerror(errno);
            continue;
        }
        if (!wait_fd(fd, POLLOUT, deadline)) {
            err = errno == ETIMEDOUT ? "cannot connect: no answer within " + std::to_string((int) timeout) + " s"
                                     : std::string("cannot connect: ") + std::strerror(errno);
            continue;
        }
        int soerr = 0;
        socklen_t len = sizeof soerr;
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len);
        if (soerr) { err = std::string("cannot connect: ") + std::strerror(soerr); continue; }
        int one = 1, idle = 5, intvl = 2, cnt = 3;
        ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
        ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
        ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
        ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
        g.fd = -1;
        return fd;
    }
    return -1;
}

// A pipe for splice(): request payloads move from ggml's socket to the server's in the kernel.
struct relay_pipe {
    int r = -1, w = -1;
    size_t size = 0, held = 0;      // capacity; bytes in it not yet sent
    bool ok = false;                // splice works (else the relay copies through a buffer)
    relay_pipe() {
        int fds[2];
        if (::pipe2(fds, O_CLOEXEC) != 0) return;
        r = fds[0];
        w = fds[1];
        ::fcntl(w, F_SETPIPE_SZ, 1 << 20);
        int sz = ::fcntl(w, F_GETPIPE_SZ);
        size = sz > 0 ? (size_t) sz : 65536;
        ok = true;
    }
    ~relay_pipe() {
        if (r >= 0) ::close(r);
        if (w >= 0) ::close(w);
    }
    // Sends the n bytes just spliced in to `fd` (non-blocking), each wait within `timeout`; false on failure.
    bool to(int fd, size_t n, double timeout) {
        held += n;
        double deadline = now() + timeout;
        while (held) {
            ssize_t k = ::splice(r, nullptr, fd, nullptr, held, SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
            if (k > 0) { held -= (size_t) k; deadline = now() + timeout; continue; }
            if (k < 0 && (errno == EAGAIN || errno == EINTR)) {
                if (!wait_fd(fd, POLLOUT, deadline)) return false;
                continue;
            }
            return false;
        }
        return true;
    }
    void drain(std::vector<uint8_t> & buf) {     // after a failure: what the pipe holds is dropped
        while (held) {
            ssize_t k = ::read(r, buf.data(), std::min(held, buf.size()));
            if (k <= 0) break;
            held -= (size_t) k;
        }
        held = 0;
    }
};

// One server behind its relay.
struct endpoint_state {
    std::string endpoint, host, local;   // local: the relay's "127.0.0.1:port", what ggml connects to
    int port = 0;
    rpc_params params;
    fd_guard listener;
    std::vector<rpc_device_info> devices;
    std::atomic<uint64_t> sent{0}, received{0}, commands{0}, wait_ns{0};
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
        if (!dead) {
            uint8_t hdr[9];
            hdr[0] = cmd;
            std::memcpy(hdr + 1, &size, 8);
            if (!send_all(up.fd, hdr, 9, T)) fail(reason(cmd_name(cmd), T));
        }
        // the payload's first bytes through this process (kept: a stand-in answer may need them), the rest
        // spliced from ggml's socket to the server's through a pipe, without a copy into this process
        size_t head_n = (size_t) std::min<uint64_t>(size, HEAD);
        if (!recv_blocking(client.fd, head, head_n)) goto done;
        if (cmd == HELLO) std::memset(head, 0, head_n);                   // plain TCP: no transport upgrade
        if (!dead && !send_all(up.fd, head, head_n, T)) fail(reason(cmd_name(cmd), T));
        if (!dead) sent += head_n;
        for (uint64_t left = size - head_n; left;) {
            ssize_t k = pipe.ok ? ::splice(client.fd, nullptr, pipe.w, nullptr, std::min<uint64_t>(left, pipe.size),
                                           SPLICE_F_MOVE)
                                : ::recv(client.fd, buf.data(), std::min<uint64_t>(left, buf.size()), 0);
            if (k < 0 && errno == EINTR) continue;
            if (k <= 0) goto done;
            left -= (uint64_t) k;
            if (!pipe.ok) {
                if (!dead && !send_all(up.fd, buf.data(), (size_t) k, T)) fail(reason(cmd_name(cmd), T));
            } else if (!dead && !pipe.to(up.fd, (size_t) k, T)) {
                fail(reason(cmd_name(cmd), T));
            }
            if (dead && pipe.ok) pipe.drain(buf);
            if (!dead) sent += (uint64_t) k;
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

void probe(const std::string & endpoint, const std::string & host, int port, const rpc_params & p) {
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
                          ". What it held is lost: close this model (and reload it once the server is back)");
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
    probe(endpoint, host, port, params);
    if (s) {
        std::lock_guard<std::mutex> lk(s->mu);
        if (s->dead_open == 0) s->error.clear();     // serving again
        return s->devices;
    }

    s = std::make_shared<endpoint_state>();
    s->endpoint = endpoint;
    s->host = host;
    s->port = port;
    s->params = params;
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
        s->devices.push_back({ggml_backend_dev_name(ggml_backend_reg_dev_get(reg, i)), endpoint, (uint32_t) i});
    }
    return s->devices;
}

std::string rpc_device_endpoint(ggml_backend_device * dev) {
    auto s = state_of(dev);
    return s ? s->endpoint : std::string();
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
        std::lock_guard<std::mutex> lk2(s.mu);
        st.failed = s.dead_open > 0;
        st.error = s.error;
        out.push_back(st);
    }
    return out;
}

namespace {
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
}  // namespace

void rpc_server_start(const std::string & endpoint, const std::string & cache_dir, int n_threads, uint64_t mem) {
    std::string host;
    int port = 0;
    if (!split_endpoint(endpoint, host, port)) throw Error("RPC endpoint '" + endpoint + "' is not HOST:PORT");
    if (n_threads < 1) throw Error("n_threads must be >= 1");
    {   // ggml's server only prints a failed bind: try it here first, for an error
        addrinfo hints{}, * res = nullptr;
        hints.ai_family = AF_UNSPEC;
        hints.ai_socktype = SOCK_STREAM;
        hints.ai_flags = AI_PASSIVE;
        int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
        if (rc != 0) throw Error("RPC server: cannot resolve '" + host + "': " + gai_strerror(rc));
        std::unique_ptr<addrinfo, void (*)(addrinfo *)> free_res(res, freeaddrinfo);
        fd_guard fd(::socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
        int one = 1;
        ::setsockopt(fd.fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (fd.fd < 0 || ::bind(fd.fd, res->ai_addr, res->ai_addrlen) != 0) {
            throw Error("RPC server: cannot listen on " + endpoint + ": " + std::strerror(errno));
        }
    }
    ggml_backend_dev_t cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    if (!cpu) throw Error("RPC server: this build has no CPU device");
    // the CPU device, advertising `mem`, or else the memory available to this process (ggml's CPU device
    // reports all of the host's as free, which would leave a client's memory-pressure reading at 0)
    g_served_mem = mem;
    g_served = *cpu;
    g_served.iface.get_memory = served_memory;
    g_served.iface.get_props = served_props;
    g_served.iface.init_backend = served_init;
    ggml_backend_dev_t dev = &g_served;
    std::string ep = endpoint, cache = cache_dir;
    std::thread([ep, cache, n_threads, dev]() mutable {
        ggml_backend_rpc_start_server(ep.c_str(), cache.empty() ? nullptr : cache.c_str(), (size_t) n_threads, 1, &dev);
    }).detach();
}

}  // namespace superggml
