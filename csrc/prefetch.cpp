#include "prefetch.h"

#include "io.h"
#include "tensor-bind.h"

#include "ggml.h"
#include "ggml-backend.h"

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <unistd.h>

namespace superggml {

constexpr size_t STAGING_CHUNK = 8u << 20;

struct prefetcher::stager {
    ggml_backend_t backend = nullptr;
    ggml_backend_buffer_t pinned[2] = {nullptr, nullptr};   // host buffers of the device, if it has them
    std::vector<uint8_t> plain[2];
    uint8_t * buf[2] = {nullptr, nullptr};
    ggml_backend_event_t event[2] = {nullptr, nullptr};
    bool busy[2] = {false, false};

    explicit stager(ggml_backend_device * dev) {
        if (!dev) dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
        backend = ggml_backend_dev_init(dev, nullptr);
        if (!backend) throw Error(std::string("cannot start a copy stream on ") + ggml_backend_dev_name(dev));
        ggml_backend_buffer_type_t host = ggml_backend_dev_host_buffer_type(dev);
        for (int i = 0; i < 2; ++i) {
            if (host) pinned[i] = ggml_backend_buft_alloc_buffer(host, STAGING_CHUNK);
            if (pinned[i]) {
                buf[i] = static_cast<uint8_t *>(ggml_backend_buffer_get_base(pinned[i]));
            } else {
                plain[i].resize(STAGING_CHUNK);
                buf[i] = plain[i].data();
            }
            event[i] = ggml_backend_event_new(dev);   // nullptr: no events, synchronize instead
        }
    }
    ~stager() {
        if (backend) ggml_backend_synchronize(backend);
        for (int i = 0; i < 2; ++i) {
            if (event[i]) ggml_backend_event_free(event[i]);
            if (pinned[i]) ggml_backend_buffer_free(pinned[i]);
        }
        if (backend) ggml_backend_free(backend);
    }
    void wait(int i) {
        if (!busy[i]) return;
        if (event[i]) ggml_backend_event_synchronize(event[i]); else ggml_backend_synchronize(backend);
        busy[i] = false;
    }
};

prefetcher::prefetcher(const std::string & path, int n_workers, bool direct, ggml_backend_device * device,
                       bool staged, range_writer writer)
    : path_(path), device_(device), staged_(staged), writer_(std::move(writer)) {
    if (n_workers < 1) throw Error("prefetcher needs at least one worker");
    fd_.reset(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd_.valid()) {
        int e = errno;
        throw FileError("cannot open " + path + ": " + std::strerror(e), e);
    }
    if (direct) fd_direct_.reset(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT));
    stagers_.resize(n_workers);
    pool_ = std::make_unique<task_pool>(n_workers, "load");
}

prefetcher::~prefetcher() = default;   // pool_, declared last, stops before what its jobs use

namespace {
// Calls a job's `done` once: after it ran, or with false when the job is dropped without running (cancelled).
struct done_once {
    std::function<void(bool)> fn;
    void call(bool ok) {
        auto f = std::move(fn);
        fn = nullptr;
        if (f) f(ok);
    }
    ~done_once() { call(false); }
};
}  // namespace

prefetcher::ticket prefetcher::submit(load_job job) {
    const int key = job.key, priority = job.priority;
    auto done = std::make_shared<done_once>();
    done->fn = std::move(job.done);
    job.done = nullptr;
    return pool_->submit(key, priority, [this, job = std::move(job), done] {
        try {
            load(job);
        } catch (...) {
            done->call(false);
            throw;
        }
        uint64_t n = 0;
        for (const auto & r : job.ranges) n += r.size;
        bytes_ += n;
        if (job.host_filled) host_bytes_ += n;
        done->call(true);
    });
}

bool prefetcher::cancel(int key) { return pool_->cancel(key); }

bool prefetcher::cancel_job(uint64_t id) { return pool_->cancel_job(id); }

prefetch_stats prefetcher::stats() const {
    task_stats t = pool_->stats();
    prefetch_stats s;
    s.completed = t.completed;
    s.failed = t.failed;
    s.cancelled = t.cancelled;
    s.bytes = bytes_.load();
    s.direct_bytes = direct_bytes_.load();
    s.host_bytes = host_bytes_.load();
    s.read_seconds = t.busy_seconds;
    s.pending = t.pending;
    return s;
}

static void read_exact(int fd, uint8_t * dst, size_t size, uint64_t off) {
    io_pread_all(fd, dst, size, (off_t) off, "the model file");
}

// O_DIRECT read of an aligned range; true once `need` bytes arrived, false if
// the kernel refused the direct read (the caller reads buffered instead).
static bool read_direct(int fd, uint8_t * dst, size_t size, size_t need, uint64_t off) {
    size_t got = 0;
    while (got < need) {
        if (got % DIRECT_ALIGN) return false;   // a short read mid-range: finish buffered
        ssize_t n = io_pread(fd, dst + got, size - got, (off_t) (off + got));
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == EINVAL) return false;
            int e = errno;
            throw FileError("read failed at offset " + std::to_string(off + got) + ": " + std::strerror(e), e);
        }
        if (n == 0) throw FileError("short read at offset " + std::to_string(off + got) + ": the file was truncated", EIO);
        got += (size_t) n;
    }
    return true;
}

void prefetcher::load(const load_job & job) {
    if (!job.dst) throw Error("load job without a destination buffer");
    const size_t cap = ggml_backend_buffer_get_size(job.dst);
    for (const auto & r : job.ranges) {
        if (r.dst_offset + r.size > cap) throw Error("load range does not fit in the slot");
        if (r.need > r.size) throw Error("load range needs more bytes than it reads");
    }
    if (ggml_backend_buffer_is_host(job.dst) && !staged_) {
        auto * base = static_cast<uint8_t *>(ggml_backend_buffer_get_base(job.dst));
        for (const auto & r : job.ranges) {
            uint8_t * dst = base + r.dst_offset;
            const size_t need = r.need ? r.need : r.size;
            const bool aligned = (uintptr_t) dst % DIRECT_ALIGN == 0 && r.file_offset % DIRECT_ALIGN == 0 &&
                                 r.size % DIRECT_ALIGN == 0;
            if (job.direct && fd_direct_.valid() && aligned &&
                read_direct(fd_direct_.get(), dst, r.size, need, r.file_offset)) {
                direct_bytes_ += r.size;
                continue;
            }
            read_exact(fd_.get(), dst, need, r.file_offset);
        }
        return;
    }
    auto & st = stagers_.at(task_pool::worker_index());
    if (!st) st = std::make_unique<stager>(device_);
    if (job.host) load_through_host(job, *st);
    else load_staged(job, *st);
}

// A context with room for a byte view of the slot per staging chunk of the job's ranges: the copies read their
// address after the loop that queues them.
static ggml_context * chunk_views(const std::vector<read_range> & ranges) {
    size_t n_chunks = 0;
    for (const auto & r : ranges) n_chunks += ((r.need ? r.need : r.size) + STAGING_CHUNK - 1) / STAGING_CHUNK;
    ggml_init_params p = { (n_chunks + 1) * ggml_tensor_overhead(), nullptr, true };
    ggml_context * ctx = ggml_init(p);
    if (!ctx) throw Error("cannot allocate staging views");
    return ctx;
}

void prefetcher::load_through_host(const load_job & job, stager & st) {
    ggml_context * ctx = chunk_views(job.ranges);
    auto * base = static_cast<uint8_t *>(ggml_backend_buffer_get_base(job.dst));
    try {
        for (const auto & r : job.ranges) {
            const size_t need = r.need ? r.need : r.size;
            if (job.host_filled) {      // one copy per range: the host tier is the device's pinned memory
                ggml_tensor * t = tensor_bytes(ctx, job.dst, base + r.dst_offset, need);
                ggml_backend_tensor_set_async(st.backend, t, job.host + r.dst_offset, 0, need);
                continue;
            }
            for (size_t done = 0; done < need; done += STAGING_CHUNK) {
                const size_t n = std::min(STAGING_CHUNK, need - done);
                uint8_t * src = job.host + r.dst_offset + done;
                read_exact(fd_.get(), src, n, r.file_offset + done);
                ggml_tensor * t = tensor_bytes(ctx, job.dst, base + r.dst_offset + done, n);
                ggml_backend_tensor_set_async(st.backend, t, src, 0, n);
            }
        }
    } catch (...) {
        ggml_backend_synchronize(st.backend);
        ggml_free(ctx);
        throw;
    }
    ggml_backend_synchronize(st.backend);
    ggml_free(ctx);
}

double host_to_device_rate(ggml_backend_device * dev, size_t bytes, int repeats) {
    if (!dev) dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    if (bytes == 0 || repeats < 1) throw Error("host_to_device_rate needs bytes > 0 and repeats >= 1");
    ggml_backend_t be = ggml_backend_dev_init(dev, nullptr);
    if (!be) throw Error(std::string("cannot start ") + ggml_backend_dev_name(dev));
    ggml_backend_buffer_type_t host_buft = ggml_backend_dev_host_buffer_type(dev);
    if (!host_buft) host_buft = ggml_backend_cpu_buffer_type();
    ggml_backend_buffer_t host = ggml_backend_buft_alloc_buffer(host_buft, bytes);
    ggml_backend_buffer_t devbuf = ggml_backend_dev_buffer_type(dev) ?
        ggml_backend_buft_alloc_buffer(ggml_backend_dev_buffer_type(dev), bytes) : nullptr;
    ggml_init_params p = { 2 * ggml_tensor_overhead(), nullptr, true };
    ggml_context * ctx = ggml_init(p);
    auto cleanup = [&] {
        if (ctx) ggml_free(ctx);
        if (devbuf) ggml_backend_buffer_free(devbuf);
        if (host) ggml_backend_buffer_free(host);
        ggml_backend_free(be);
    };
    if (!host || !devbuf || !ctx) {
        cleanup();
        throw Error("host_to_device_rate: cannot allocate " + std::to_string(bytes) + " bytes on both sides");
    }
    ggml_backend_buffer_clear(host, 1);
    ggml_tensor * t = tensor_bytes(ctx, devbuf, static_cast<uint8_t *>(ggml_backend_buffer_get_base(devbuf)), bytes);
    const void * src = ggml_backend_buffer_get_base(host);
    double best = 0;
    for (int i = 0; i <= repeats; ++i) {
        auto t0 = std::chrono::steady_clock::now();
        ggml_backend_tensor_set_async(be, t, src, 0, bytes);
        ggml_backend_synchronize(be);
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (i > 0 && s > 0) best = std::max(best, (double) bytes / s);
    }
    cleanup();
    return best;
}

void prefetcher::load_staged(const load_job & in, stager & st) {
    // whole ranges go to the writer first (remote.h: an RPC peer that holds them is sent only their hashes)
    load_job job;
    job.dst = in.dst;
    std::vector<range_write> whole;
    for (const auto & r : in.ranges) {
        if (!writer_ || (r.need && r.need != r.size)) job.ranges.push_back(r);
        else whole.push_back({r.file_offset, r.size, r.dst_offset});
    }
    if (writer_) {
        for (const auto & w : writer_(in.dst, path_, std::move(whole))) {
            job.ranges.push_back({w.file_offset, (size_t) w.size, (size_t) w.dst_offset, 0});
        }
    }
    ggml_context * ctx = chunk_views(job.ranges);
    auto * base = static_cast<uint8_t *>(ggml_backend_buffer_get_base(job.dst));
    int cur = 0;
    try {
        for (const auto & r : job.ranges) {
            const size_t need = r.need ? r.need : r.size;
            for (size_t done = 0; done < need; done += STAGING_CHUNK, cur ^= 1) {
                const size_t n = std::min(STAGING_CHUNK, need - done);
                st.wait(cur);                                   // this staging buffer's last copy is done
                read_exact(fd_.get(), st.buf[cur], n, r.file_offset + done);
                ggml_tensor * t = tensor_bytes(ctx, job.dst, base + r.dst_offset + done, n);
                ggml_backend_tensor_set_async(st.backend, t, st.buf[cur], 0, n);
                if (st.event[cur]) ggml_backend_event_record(st.event[cur], st.backend);
                st.busy[cur] = true;
            }
        }
    } catch (...) {
        st.wait(0);
        st.wait(1);
        ggml_free(ctx);
        throw;
    }
    st.wait(0);
    st.wait(1);
    ggml_free(ctx);
}

}  // namespace superggml
