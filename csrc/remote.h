// remote: the seam between the paging core (csrc/) and the code that reaches
// devices in other processes (ggml RPC servers: csrc/rpc/). The core builds
// and runs without csrc/rpc/; it never calls into it, it is handed what it
// needs through the two hooks below.
//
// 1. Content-addressed writes (range_writer): a weight store, a layer pager
//    and a prefetcher take a writer (weight_store's constructor,
//    pager_params::writer, prefetcher's constructor). Where a file's byte
//    ranges go into a destination buffer as a whole (a resident load, a
//    staged load), the core first offers them to the writer, which writes
//    those it can by some other route (csrc/rpc/rpc-content.h: by hash, to an
//    RPC peer that holds the same bytes) and returns the rest; the core
//    writes the rest as bytes. No writer (an empty std::function): every
//    range goes as bytes. The Python extension hands every weight store,
//    pager and expert cache's prefetcher it makes rpc-content's
//    content_write (csrc/bindings/rpc.cpp: content_writer()).
//
// 2. Remote devices (remote_device_hooks): which server a ggml device is on,
//    whether it may still be used, and whether it failed. Process-wide, set
//    by the RPC module (rpc_add_server installs them before it registers the
//    first RPC device). Until set, every device is local: no endpoint,
//    usable, never failed.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

struct ggml_backend_buffer;
struct ggml_backend_device;

namespace superggml {

// A byte range of a file and where it goes in the destination buffer.
struct range_write {
    uint64_t file_offset = 0, size = 0;
    uint64_t dst_offset = 0;          // from the start of the destination buffer
};

// Writes what it can of `ranges` (of the file at `path`) into `dst` and returns the ranges it left for the
// caller to write as bytes (all of them where it writes none), in any order. It is called on the caller's
// thread (weight_store::load_resident) and on prefetch workers, several at once: it must be thread safe.
// It may throw Error (a range outside the buffer); the load fails with it.
using range_writer = std::function<std::vector<range_write>(ggml_backend_buffer * dst, const std::string & path,
                                                             std::vector<range_write> ranges)>;

// What the core asks about a device in another process. Each may be null (as if the device were local).
struct remote_device_hooks {
    std::string (*endpoint)(ggml_backend_device * dev) = nullptr;   // the server it is on; "" for a local device
    bool (*usable)(ggml_backend_device * dev) = nullptr;            // false: may not be listed or queried
    void (*check)(ggml_backend_device * dev) = nullptr;             // throws DeviceError if its server failed
                                                                    // (nullptr: any server this process uses)
};

// Installs the hooks (replacing any set before). Thread safe; meant to be called once, before the first
// remote device exists.
void remote_devices_set(const remote_device_hooks & hooks);

// The hooks' answers, or a local device's where none are set.
std::string remote_device_endpoint(ggml_backend_device * dev);
bool remote_device_usable(ggml_backend_device * dev);
void remote_device_check(ggml_backend_device * dev);

}  // namespace superggml
