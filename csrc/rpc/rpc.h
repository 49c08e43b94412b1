// rpc: ggml RPC servers (ggml-rpc, llama.cpp's rpc-server) as devices of this
// process, and this process's CPU served to other processes.
//
// ggml's RPC client aborts the process when a server cannot be reached, when
// the handshake fails or when a server dies mid-run, and it waits on a silent
// server forever. So superggml reaches every server through a guard: a relay
// on a loopback port of this process, which ggml connects to instead of the
// server. The relay forwards each command and its response as they are (the
// transport is plain TCP: it clears the HELLO's transport capabilities), with
// a timeout on every wait (connect, send, each response) and TCP keepalive.
// When the server fails, the relay marks the endpoint failed and from then on
// answers every command of that connection itself with a well-formed empty
// response (zeros of the size ggml expects), so ggml neither aborts nor
// hangs; rpc_check() throws DeviceError naming the endpoint and the reason.
// The bindings call it (through remote.h's remote_device_check) after every
// compute, tensor read and copy on an RPC device, so a caller gets the
// exception, never the zeros.
//
// This module sits on top of the paging core (csrc/), which never calls it:
// rpc_add_server installs rpc_device_endpoint, rpc_device_usable and
// rpc_check as the core's remote device hooks (remote.h) before it registers
// the first RPC device.
//
// The relay also counts the bytes each way and the time spent waiting for
// responses (rpc_endpoint_stats), which is what a link of another speed would
// change.
#pragma once

#include "error.h"

#include <cstdint>
#include <string>
#include <vector>

struct ggml_backend_device;

namespace superggml {

// DeviceError (error.h): a device (an RPC server) failed or cannot be reached.

struct rpc_params {
    double connect_timeout = 5;   // seconds to connect and to get the HELLO answer
    double timeout = 60;          // seconds any one response (or send) may take before the server counts as failed
};

struct rpc_device_info {
    std::string name;             // ggml's device name ("RPC0"): what Backend(device=...) takes
    std::string endpoint;         // the server ("host:port") it is on
    uint32_t index = 0;           // the device's index on that server
    bool addressed = false;       // the server speaks superggml's relay protocol: it loads ranges it holds by hash
};

struct rpc_endpoint_stats {
    std::string endpoint;
    uint64_t bytes_sent = 0;      // command bytes to the server (weights, inputs, graphs)
    uint64_t bytes_received = 0;  // response bytes from it (tensor reads)
    uint64_t commands = 0;
    double wait_seconds = 0;      // waiting for responses (server compute + transfer of the response)
    uint64_t loaded_by_peer = 0;  // bytes the server loaded from its own copy when sent their hashes
    uint64_t addressed_misses = 0;// ranges sent by hash that it lacked (their bytes were sent)
    bool addressed = false;
    bool failed = false;          // a connection to it failed and is still open
    std::string error;            // the last failure ("" if none)
};

// Connects to `endpoint` ("host:port") and checks its HELLO (protocol major
// version equal, minor not newer), then disconnects. Throws DeviceError naming
// the endpoint: a malformed endpoint, no route or no answer within
// connect_timeout, nothing listening, a server busy with another client (it
// serves one at a time) or of another protocol version.
void rpc_probe(const std::string & endpoint, const rpc_params & params = {});

// Probes `endpoint`, then adds its devices to ggml's registry behind a guard
// (once per endpoint and process; later calls probe again and return the same
// devices). Throws DeviceError as rpc_probe, or if an earlier failure on the
// endpoint is still held by an open connection (a model not yet closed).
std::vector<rpc_device_info> rpc_add_server(const std::string & endpoint, const rpc_params & params = {});

// The server behind a ggml device ("" for devices that are not RPC).
std::string rpc_device_endpoint(ggml_backend_device * dev);

// Whether `dev` is on an RPC server that speaks superggml's relay protocol (rpc-content.h writes to it by hash).
bool rpc_device_addressed(ggml_backend_device * dev);

// Whether `dev` may be listed and queried: not an RPC device, or one whose server has not failed since it
// was last added (ggml keeps the devices of every server a process added; a failed one is only reached
// again through rpc_add_server).
bool rpc_device_usable(ggml_backend_device * dev);

// Throws DeviceError if the server behind `dev` (or, with nullptr, any server
// this process uses) has failed on a connection still open. No-op otherwise.
void rpc_check(ggml_backend_device * dev = nullptr);

std::vector<rpc_endpoint_stats> rpc_stats();

}  // namespace superggml
