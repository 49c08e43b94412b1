// weight-loader: a resident model's weights loaded in the background, group
// by group, while the first forward pass computes.
//
// The groups are the model's units in the order a forward pass uses them
// (block 0, block 1, ..., the output head). The constructor places every
// re-laid weight (ggml-cpu "repack" buffer types) in its resident buffer and
// binds it there, without bytes; the other weights stay bound to the file
// mapping. Two stages of worker threads then take the groups in order:
// readers bring a group's file ranges into the page cache and map them (one
// populate call per chunk, no copy; pread where the kernel cannot), and
// fillers re-lay a group's re-laid weights from the mapping as soon as it is
// read, so the disk and the CPU work at once. The pass computes group i as
// soon as wait(i) returns, while the workers load i+1, i+2, ...: a cold start
// costs about one read of the file plus compute, not the two in sequence.
//
// Failure: a group whose load failed (I/O error, file truncated) is loaded
// once more by wait(), synchronously; if that fails too, wait() throws
// (FileError) and the group stays unloaded, so the next wait() tries again.
// A group's bytes are never used before its wait() returned.
#pragma once

#include "io.h"
#include "weight-store.h"

#include <atomic>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

struct ggml_backend_device;

namespace superggml {

struct loader_params {
    int n_readers = 2;                 // threads reading groups into the page cache
    int n_workers = 2;                 // threads re-laying the groups' repacked weights
    size_t chunk = 8u << 20;           // bytes per read call (the unit of cancellation)
    bool repack = true;                // re-lay the weights the device has faster kernels for
    int nice = 10;                     // the fillers' niceness (Linux: per thread); 0 leaves it
};

struct loader_stats {
    uint64_t bytes_read = 0;           // file bytes brought into the page cache
    uint64_t bytes_repacked = 0;       // bytes of the re-laid buffers
    int groups_done = 0, groups_failed = 0, retries = 0;
    double seconds = 0;                // from the start until the last group was loaded (0 while loading)
};

class weight_loader {
public:
    // Binds every weight of the store to the mapping, places the re-laid ones
    // (`repack` names, where `dev` supports them) and starts the workers.
    // A name in `repack` that no group holds is loaded after the last group.
    // Throws GGUFError for an unknown name, Error if a buffer cannot be allocated.
    weight_loader(std::shared_ptr<weight_store> store, const std::vector<std::vector<std::string>> & groups,
                  const std::vector<std::string> & repack, ggml_backend_device * dev,
                  const loader_params & params = {});
    ~weight_loader();                  // cancel()
    weight_loader(const weight_loader &) = delete;
    weight_loader & operator=(const weight_loader &) = delete;

    int n_groups() const { return (int) groups_.size(); }
    size_t repacked_bytes() const { return repacked_bytes_; }

    // Blocks until group g is loaded (see Failure above).
    void wait(int g);
    void wait_all();
    bool done() const;                 // every group loaded
    // Stops the workers after their current chunk and joins them; unloaded
    // groups stay unloaded (wait() loads them synchronously).
    void cancel();
    loader_stats stats() const;

private:
    struct group {
        std::vector<std::pair<uint64_t, uint64_t>> ranges;   // file [offset, end), page aligned, merged
        std::vector<std::string> fill;                       // re-laid tensors to copy in
        bool read = false;                                   // ranges are in the page cache
        int state = 0;                                       // 0 pending, 1 busy, 2 done, 3 failed
        std::exception_ptr error;
    };
    void reader();
    void filler();
    bool read(group & G, bool cancellable);   // throws on failure; false if cancelled
    bool fill(group & G, bool cancellable);
    void finish(group & G, std::exception_ptr err);   // under mu_

    std::shared_ptr<weight_store> store_;
    loader_params params_;
    std::vector<group> groups_;
    size_t repacked_bytes_ = 0;
    io_fd fd_;                         // for pread where populate is refused
    std::atomic<bool> stop_{false};
    std::atomic<bool> no_populate_{false};
    std::atomic<uint64_t> bytes_read_{0};
    mutable std::mutex mu_;
    std::condition_variable cv_;
    size_t next_read_ = 0, next_fill_ = 0;
    size_t n_done_ = 0;                // groups in state 2 (a group reaches it once)
    int retries_ = 0;
    double t_start_ = 0, t_done_ = 0;
    std::vector<std::thread> threads_;
};

}  // namespace superggml
