// prefetch: worker threads that read byte ranges of a file into pool slots.
//
// submit() queues a job (highest priority first, then FIFO) and returns a
// future. A worker preads each range straight into the slot when the slot is
// host memory. Otherwise (or with `staged`) it reads into one of two staging
// buffers (pinned host memory where the device offers it) and copies it to
// the slot with ggml_backend_tensor_set_async on its own backend instance of
// the slot's device, recording an event per staging buffer: the next chunk's
// read overlaps the previous chunk's copy, and the job completes only after
// its copies do. Devices without async copies or events (the CPU) take the
// same path synchronously.
// A direct job reads through a second descriptor opened with O_DIRECT: the
// disk DMAs into the slot, bypassing the page cache and the CPU copy; its
// ranges must be aligned (file offset, size and destination address, to
// DIRECT_ALIGN). Where O_DIRECT cannot be opened (tmpfs) or a read refuses
// it, the job falls back to the buffered descriptor.
// A short read or an I/O error fails that job's future with FileError; the
// worker carries on. cancel() fails a job that has not started with
// Cancelled; a running job always finishes (its slot is still being
// written), so callers wait for it before reusing the slot.
#pragma once

#include "error.h"

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

struct ggml_backend_buffer;
struct ggml_backend_device;

namespace superggml {

struct Cancelled : Error {
    using Error::Error;
};

// Alignment of O_DIRECT reads (a multiple of every common logical block size).
constexpr size_t DIRECT_ALIGN = 4096;

struct read_range {
    uint64_t file_offset;
    size_t size;
    size_t dst_offset;   // bytes from the start of the destination buffer
    size_t need = 0;     // bytes that must arrive (0: size); a direct read may stop short at EOF past them
};

struct load_job {
    int key = -1;
    int priority = 0;                 // larger runs first
    bool direct = false;              // read with O_DIRECT (aligned ranges, host destination)
    std::function<void()> task;       // if set, the worker runs this instead of reading ranges
    std::vector<read_range> ranges;
    ggml_backend_buffer * dst = nullptr;
};

struct prefetch_stats {
    uint64_t completed = 0, failed = 0, cancelled = 0;
    uint64_t bytes = 0;
    double read_seconds = 0;          // summed over workers
    size_t pending = 0;
};

class prefetcher {
public:
    // Opens `path` for reading (and with O_DIRECT too if `direct`; an empty
    // path: no file, task jobs only). `device`
    // is the slots' device (nullptr: CPU); `staged` sends host slots through
    // the staging path too. Throws FileError.
    prefetcher(const std::string & path, int n_workers = 1, bool direct = false,
               ggml_backend_device * device = nullptr, bool staged = false);
    ~prefetcher();   // fails queued jobs with Cancelled, joins the workers
    prefetcher(const prefetcher &) = delete;
    prefetcher & operator=(const prefetcher &) = delete;

    struct ticket {
        uint64_t id;
        std::shared_future<void> done;
    };
    ticket submit(load_job job);
    bool cancel(int key);             // cancels every queued job for `key`; true if there was one
    bool cancel_job(uint64_t id);     // cancels that job if it has not started
    prefetch_stats stats() const;
    // Wall-clock start and end (seconds since the epoch) of the last finished
    // job for `key`; false if none has finished.
    bool last_job(int key, double & start, double & end) const;
    int n_workers() const { return (int) workers_.size(); }
    bool direct() const { return fd_direct_ >= 0; }   // O_DIRECT reads are available
    bool staged() const { return staged_; }

    struct entry {   // a queued job
        load_job job;
        uint64_t seq;
        std::shared_ptr<std::promise<void>> done;
    };

    struct stager;   // a worker's backend instance, staging buffers and events

private:
    void run();
    void load(const load_job & job, std::unique_ptr<stager> & st);
    void load_staged(const load_job & job, stager & st);

    int fd_ = -1;
    int fd_direct_ = -1;
    ggml_backend_device * device_ = nullptr;
    bool staged_ = false;
    mutable std::mutex mu_;
    std::condition_variable cv_;
    std::vector<entry> queue_;
    std::vector<std::thread> workers_;
    bool stop_ = false;
    uint64_t seq_ = 0;
    prefetch_stats stats_;
    std::unordered_map<int, std::pair<double, double>> last_;   // key -> (start, end)
};

}  // namespace superggml
