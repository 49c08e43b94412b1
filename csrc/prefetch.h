// prefetch: a file reader that reads byte ranges of a file into pool slots on
// worker threads (a task_pool of its own).
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
// A job may name a host copy of its bytes (`host`: host memory, laid out as
// the slot; a host tier between the file and the device). If that copy is
// filled, the job copies it to the slot without reading the file; else the
// worker reads the file into the host copy, chunk by chunk, each chunk copied
// on to the slot from there (the host copy is the staging buffer). `done`
// runs once: on the worker after the job, with whether it succeeded, or with
// false where a cancelled job is dropped.
// A host copy may have a layout of its own (`copies` given): the file's,
// widened to DIRECT_ALIGN (`host_ranges` read it), so the disk DMAs into the
// host copy with O_DIRECT; then each copy moves one tensor from the host copy
// to the slot. Its reads are split into chunks and several are in flight at
// once (a reader pool of the prefetcher's own), so a first load runs at the
// disk's rate, not one thread's.
// A staged job's ranges that are read whole are first offered to the
// prefetcher's range_writer, if it was given one (remote.h: content-addressed
// writes to an RPC peer); the worker reads the ranges it leaves.
// A short read or an I/O error fails that job's future with FileError; the
// worker carries on. cancel() fails a job that has not started with
// Cancelled; a running job always finishes (its slot is still being
// written), so callers wait for it before reusing the slot.
#pragma once

#include "error.h"
#include "io.h"
#include "remote.h"
#include "task-pool.h"

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

struct ggml_backend_buffer;
struct ggml_backend_device;

namespace superggml {

// Alignment of O_DIRECT reads (a multiple of every common logical block size).
constexpr size_t DIRECT_ALIGN = 4096;

struct read_range {
    uint64_t file_offset;
    size_t size;
    size_t dst_offset;   // bytes from the start of the destination buffer
    size_t need = 0;     // bytes that must arrive (0: size); a direct read may stop short at EOF past them
};

struct copy_range {
    size_t src;          // bytes from the host copy's start
    size_t dst;          // bytes from the slot's start
    size_t size;
};

struct load_job {
    int key = -1;                     // names the job for cancel() and last_job()
    int priority = 0;                 // larger runs first
    bool direct = false;              // read with O_DIRECT (aligned ranges, host destination)
    std::vector<read_range> ranges;
    ggml_backend_buffer * dst = nullptr;
    uint8_t * host = nullptr;         // a host copy of the slot's bytes (same offsets), or none
    bool host_filled = false;         // it holds them already: copy, do not read
    std::vector<read_range> host_ranges;   // with copies: the reads that fill the host copy (its own layout)
    std::vector<copy_range> copies;        // the host copy's own layout to the slot's (none: the same layout)
    std::function<void(bool ok)> done;   // after the job, on the worker (ok: it succeeded)
};

struct prefetch_stats {
    uint64_t completed = 0, failed = 0, cancelled = 0;
    uint64_t bytes = 0;
    uint64_t direct_bytes = 0;        // of them, read with O_DIRECT (disk to slot, no page cache)
    uint64_t host_bytes = 0;          // of them, copied from a filled host copy (no file read)
    double read_seconds = 0;          // summed over workers
    size_t pending = 0;
};

class prefetcher {
public:
    // Opens `path` for reading (and with O_DIRECT too if `direct`) and starts
    // n_workers threads. `device` is the slots' device (nullptr: CPU);
    // `staged` sends host slots through the staging path too; `writer`
    // (none: every range is read) writes what it can of a staged job's whole
    // ranges by another route (remote.h). Throws FileError if the file
    // cannot be opened, Error if n_workers < 1.
    prefetcher(const std::string & path, int n_workers = 1, bool direct = false,
               ggml_backend_device * device = nullptr, bool staged = false, range_writer writer = {});
    ~prefetcher();   // fails queued jobs with Cancelled, joins the workers
    prefetcher(const prefetcher &) = delete;
    prefetcher & operator=(const prefetcher &) = delete;

    using ticket = task_pool::ticket;
    // Queues the reads; a job without a destination, or whose ranges do not
    // fit it, fails its future with Error. Throws Cancelled while stopping.
    ticket submit(load_job job);
    bool cancel(int key);             // cancels every queued job for `key`; true if there was one
    bool cancel_job(uint64_t id);     // cancels that job if it has not started
    prefetch_stats stats() const;
    // Wall-clock start and end (seconds since the epoch) of the last finished
    // job for `key`; false if none has finished.
    bool last_job(int key, double & start, double & end) const { return pool_->last_job(key, start, end); }
    int n_workers() const { return pool_->n_workers(); }
    bool direct() const { return fd_direct_.valid(); }   // O_DIRECT reads are available
    bool staged() const { return staged_; }

    struct stager;   // a worker's backend instance, staging buffers and events

private:
    void load(const load_job & job);
    void load_staged(const load_job & job, stager & st);
    void load_through_host(const load_job & job, stager & st);
    void load_via_tier(const load_job & job, stager & st);
    // Reads `ranges` into base + dst_offset in chunks, several in flight on the reader pool; O_DIRECT where
    // `direct`, the descriptor and the alignment allow, else buffered. Throws the first read's error.
    void read_parallel(const std::vector<read_range> & ranges, uint8_t * base, bool direct);

    std::string path_;
    io_fd fd_;
    io_fd fd_direct_;                                 // none: buffered reads only
    ggml_backend_device * device_ = nullptr;
    bool staged_ = false;
    range_writer writer_;                             // none: staged ranges are all read
    std::atomic<uint64_t> bytes_{0};
    std::atomic<uint64_t> direct_bytes_{0};
    std::atomic<uint64_t> host_bytes_{0};
    std::vector<std::unique_ptr<stager>> stagers_;   // per worker, made on its first staged job
    std::once_flag readers_once_;
    std::unique_ptr<task_pool> readers_;             // read_parallel's chunks (made on first use)
    std::unique_ptr<task_pool> pool_;                // declared last: its workers stop first
};

// Bytes per second of copies of `bytes` from host memory of the device's
// host buffer type (pinned, where it has one) into a buffer of the device,
// async with a synchronize after each: the best of `repeats` after a warm-up.
// The bound of a staged load. nullptr: the CPU (a memcpy).
double host_to_device_rate(ggml_backend_device * device, size_t bytes, int repeats = 5);

}  // namespace superggml
