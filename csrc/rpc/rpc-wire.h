// rpc-wire: ggml RPC's wire protocol as superggml's relays speak it, and the
// superggml relay commands that extend it between a superggml client and a
// superggml rpc-server (never sent to a server that did not answer SG_HELLO).
//
// ggml (ggml-rpc.cpp, protocol 7): request | cmd u8 | size u64 | payload |,
// response | size u64 | payload | for the commands that have one.
//
// superggml relay protocol, version SG_VERSION:
//   SG_HELLO  request: empty. Response: | "SGGL" | version u32 | flags u32 |.
//             A plain ggml server closes the connection on it (unknown command).
//   SG_LOAD   request: | rpc_tensor | n u32 | n x { offset u64, size u64, hash u64, within u64 } |: write
//             into that tensor at each offset the bytes [within, within + size) of the range whose content
//             hash is `hash`, from the server's own copy (a model file it indexed, or its cache). Response: n bytes, 1 where the server wrote the
//             bytes, 0 where it holds no copy of them (or its copy did not hash right): the client sends
//             those as SET_TENSOR, with the cache flag, in the same order.
// Socket helpers: non-blocking sockets with a deadline per wait (send_all,
// recv_all: false on timeout, error or EOF, errno 0 for EOF), blocking ones
// for the process's own loopback ends.
#pragma once

#include "ggml.h"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace superggml::wire {

enum : uint8_t {
    ALLOC_BUFFER, GET_ALIGNMENT, GET_MAX_SIZE, BUFFER_GET_BASE, FREE_BUFFER, BUFFER_CLEAR, SET_TENSOR,
    SET_TENSOR_HASH, GET_TENSOR, COPY_TENSOR, GRAPH_COMPUTE, GET_DEVICE_MEMORY, INIT_TENSOR, GET_ALLOC_SIZE,
    HELLO, DEVICE_COUNT, GRAPH_RECOMPUTE, MEMSET_TENSOR, CMD_COUNT,
    SG_HELLO = 0xF0, SG_LOAD = 0xF1,
};
constexpr uint32_t SG_VERSION = 1;
constexpr size_t CAPS = 24;                               // HELLO's transport capabilities
constexpr size_t WIRE_TENSOR = 8 + 4 + 8 + 8 * GGML_MAX_DIMS + 4 + GGML_MAX_OP_PARAMS + 4 + 8 * GGML_MAX_SRC +
                               8 * 3 + GGML_MAX_NAME + 4;  // rpc_tensor
constexpr size_t SET_HEAD = WIRE_TENSOR + 1 + 8;          // SET_TENSOR: | rpc_tensor | cache_flag u8 | offset u64 |
constexpr size_t SG_ENTRY = 32;                           // SG_LOAD: offset, size, hash, within
constexpr size_t SG_MAX_ENTRIES = 4096;

const char * cmd_name(uint8_t c);
bool has_response(uint8_t cmd);
double now();
bool split_endpoint(const std::string & ep, std::string & host, int & port);

struct fd_guard {
    int fd = -1;
    fd_guard() = default;
    explicit fd_guard(int f) : fd(f) {}
    ~fd_guard();
    fd_guard(const fd_guard &) = delete;
    fd_guard & operator=(const fd_guard &) = delete;
};

bool wait_fd(int fd, short events, double deadline);     // false on timeout (errno ETIMEDOUT)
bool send_all(int fd, const void * data, size_t n, double timeout);
bool recv_all(int fd, void * data, size_t n, double timeout);
bool recv_blocking(int fd, void * data, size_t n);       // false at EOF
bool send_blocking(int fd, const void * data, size_t n);
std::string reason(const char * what, double timeout);    // what failed, from errno
// A connected, non-blocking TCP socket to host:port with keepalive; -1 and `err` on failure.
int connect_to(const std::string & host, int port, double timeout, std::string & err);
// A listening socket on host:port (port 0: any); -1 and `err` on failure; `port` gets the bound port.
int listen_on(const std::string & host, int & port, std::string & err);

// A pipe for splice(): request payloads move from one socket to another in the kernel.
struct relay_pipe {
    int r = -1, w = -1;
    size_t size = 0, held = 0;      // capacity; bytes in it not yet sent
    bool ok = false;                // splice works (else the relay copies through a buffer)
    relay_pipe();
    ~relay_pipe();
    relay_pipe(const relay_pipe &) = delete;
    relay_pipe & operator=(const relay_pipe &) = delete;
    // Sends the n bytes just spliced in to `fd` (non-blocking), each wait within `timeout`; false on failure.
    bool to(int fd, size_t n, double timeout);
    void drain(std::vector<uint8_t> & buf);     // after a failure: what the pipe holds is dropped
};

// The first bytes of a SET_TENSOR that writes `n` bytes at `offset` of `tensor` (its rpc_tensor bytes):
// | cmd | size | rpc_tensor | cache_flag | offset |; the n bytes follow.
constexpr size_t SET_CMD_HEAD = 9 + SET_HEAD;
void set_tensor_head(uint8_t * out, const uint8_t * tensor, bool cache, uint64_t offset, uint64_t n);

// Moves `n` payload bytes from `from` (blocking) to `to` (non-blocking, `timeout` per wait) through `pipe`
// (or `buf`). Returns false if `from` ended; `to_failed` is set (and the rest read and dropped) if `to` failed,
// with errno as that failure left it.
bool forward(int from, int to, uint64_t n, relay_pipe & pipe, std::vector<uint8_t> & buf, double timeout,
             bool & to_failed);

}  // namespace superggml::wire
