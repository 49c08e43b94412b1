#include "rpc-wire.h"

#include "ggml-rpc.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>

namespace superggml::wire {

static_assert(RPC_PROTO_MAJOR_VERSION == 7, "ggml's RPC protocol changed: review the relay's command table");

const char * cmd_name(uint8_t c) {
    static const char * names[] = {"ALLOC_BUFFER", "GET_ALIGNMENT", "GET_MAX_SIZE", "BUFFER_GET_BASE", "FREE_BUFFER",
        "BUFFER_CLEAR", "SET_TENSOR", "SET_TENSOR_HASH", "GET_TENSOR", "COPY_TENSOR", "GRAPH_COMPUTE",
        "GET_DEVICE_MEMORY", "INIT_TENSOR", "GET_ALLOC_SIZE", "HELLO", "DEVICE_COUNT", "GRAPH_RECOMPUTE",
        "MEMSET_TENSOR"};
    return c < CMD_COUNT ? names[c] : "unknown";
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

fd_guard::~fd_guard() { if (fd >= 0) ::close(fd); }

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

relay_pipe::relay_pipe() {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) return;
    r = fds[0];
    w = fds[1];
    ::fcntl(w, F_SETPIPE_SZ, 1 << 20);
    int sz = ::fcntl(w, F_GETPIPE_SZ);
    size = sz > 0 ? (size_t) sz : 65536;
    ok = true;
}

relay_pipe::~relay_pipe() {
    if (r >= 0) ::close(r);
    if (w >= 0) ::close(w);
}

bool relay_pipe::to(int fd, size_t n, double timeout) {
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

void relay_pipe::drain(std::vector<uint8_t> & buf) {
    while (held) {
        ssize_t k = ::read(r, buf.data(), std::min(held, buf.size()));
        if (k <= 0) break;
        held -= (size_t) k;
    }
    held = 0;
}

void set_tensor_head(uint8_t * out, const uint8_t * tensor, bool cache, uint64_t offset, uint64_t n) {
    out[0] = SET_TENSOR;
    const uint64_t size = SET_HEAD + n;
    std::memcpy(out + 1, &size, 8);
    std::memcpy(out + 9, tensor, WIRE_TENSOR);
    out[9 + WIRE_TENSOR] = cache ? 1 : 0;
    std::memcpy(out + 9 + WIRE_TENSOR + 1, &offset, 8);
}

bool forward(int from, int to, uint64_t n, relay_pipe & pipe, std::vector<uint8_t> & buf, double timeout,
             bool & to_failed) {
    int failure = 0;                // errno of the failure of `to`, kept past the reads that drain the rest
    const auto failed = [&] { to_failed = true; failure = errno; };
    while (n) {
        ssize_t k = pipe.ok ? ::splice(from, nullptr, pipe.w, nullptr, std::min<uint64_t>(n, pipe.size), SPLICE_F_MOVE)
                            : ::recv(from, buf.data(), std::min<uint64_t>(n, buf.size()), 0);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return false;
        n -= (uint64_t) k;
        if (!pipe.ok) {
            if (!to_failed && !send_all(to, buf.data(), (size_t) k, timeout)) failed();
        } else if (!to_failed && !pipe.to(to, (size_t) k, timeout)) {
            failed();
        }
        if (to_failed && pipe.ok) pipe.drain(buf);
    }
    if (failure) errno = failure;
    return true;
}

int listen_on(const std::string & host, int & port, std::string & err) {
    addrinfo hints{}, * res = nullptr;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
    if (rc != 0) { err = "cannot resolve '" + host + "': " + gai_strerror(rc); return -1; }
    std::unique_ptr<addrinfo, void (*)(addrinfo *)> free_res(res, freeaddrinfo);
    fd_guard fd(::socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
    int one = 1;
    ::setsockopt(fd.fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_storage a{};
    socklen_t len = sizeof a;
    if (fd.fd < 0 || ::bind(fd.fd, res->ai_addr, res->ai_addrlen) != 0 || ::listen(fd.fd, 16) != 0 ||
        ::getsockname(fd.fd, (sockaddr *) &a, &len) != 0) {
        err = std::string("cannot listen on ") + host + ":" + std::to_string(port) + ": " + std::strerror(errno);
        return -1;
    }
    port = ntohs(a.ss_family == AF_INET6 ? ((sockaddr_in6 *) &a)->sin6_port : ((sockaddr_in *) &a)->sin_port);
    int out = fd.fd;
    fd.fd = -1;
    return out;
}

}  // namespace superggml::wire
