// rpc-peer: this process's CPU served to ggml RPC clients, as a peer that
// loads the bytes it is named by content hash from its own copies.
//
// ggml's own RPC server (ggml-rpc) runs on a loopback port; the clients
// reach it through a front on the public endpoint. The front forwards ggml's
// commands as they are, so a plain ggml client (llama.cpp's --rpc) works as
// against llama.cpp's rpc-server, and it answers superggml's relay commands
// (rpc-wire.h) itself:
//   SG_HELLO     names the front and its protocol version;
//   SG_LOAD      looks each hash up among the ranges of the model files it
//                was given, then in the cache directory (ggml's cache: one
//                file per hash, written when a client sends bytes with the
//                cache flag), and writes what it holds into the named tensor
//                as a SET_TENSOR to the server; the rest it answers 0 for;
//   SET_TENSOR_HASH (ggml's own) is answered from the model files too.
// A copy is hashed before its first use: one whose bytes do not hash to the
// name is refused (answered 0: the client sends the bytes), logged, and not
// read again. Reads use O_DIRECT where the file system allows (no page cache:
// the peer's memory is its --mem), else pread.
#pragma once

#include "rpc-content.h"

#include <cstdint>
#include <string>
#include <vector>

namespace superggml {

struct peer_file {
    std::string path;
    std::vector<content_range> ranges;    // what it holds, by hash
};

struct rpc_server_params {
    std::string endpoint;                 // "host:port" to serve on
    std::string cache_dir;                // ggml's cache of bytes by hash ("": none)
    int n_threads = 4;
    uint64_t mem = 0;                     // memory advertised (0: what this process may use, cgroup-aware)
    std::vector<peer_file> models;
    bool direct = true;                   // O_DIRECT reads of held ranges where the file system allows
};

struct rpc_server_stats {
    uint64_t loads = 0, bytes_loaded = 0; // ranges (and bytes) written from this peer's own copies
    uint64_t misses = 0;                  // ranges asked for by hash that it did not hold
    uint64_t refused = 0;                 // copies whose bytes did not hash to their name
    uint64_t clients = 0;                 // connections served
};

// Starts serving on detached threads, until the process exits. Throws Error if
// the endpoint cannot be parsed or bound, or n_threads < 1.
void rpc_server_start(const rpc_server_params & params);
rpc_server_stats rpc_server_stats_get();     // summed over the peers this process serves

}  // namespace superggml
