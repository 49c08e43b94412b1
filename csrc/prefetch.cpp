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
constexpr size_t READ_CHUNK = 4u << 20;    // read_parallel's unit (a multiple of DIRECT_ALIGN)
constexpr int N_READERS = 4;               // read_parallel's reads in flight

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
    for (const auto & c : job.copies) {
        if (c.dst + c.size > cap) throw Error("load copy does not fit in the slot");
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

void prefetcher::read_parallel(const std::vector<read_range> & ranges, uint8_t * base, bool direct) {
    struct chunk { uint64_t off; size_t size, need; uint8_t * dst; };
    std::vector<chunk> chunks;
    for (const auto & r : ranges) {
        const size_t need = r.need ? r.need : r.size;
        for (size_t done = 0; done < need; done += READ_CHUNK) {
            const size_t n = std::min(READ_CHUNK, r.size - done);
            chunks.push_back({r.file_offset + done, n, std::min(n, need - done), base + r.dst_offset + done});
        }
    }
    auto read_one = [this, direct](const chunk & c) {
        const bool aligned = (uintptr_t) c.dst % DIRECT_ALIGN == 0 && c.off % DIRECT_ALIGN == 0 &&
                             c.size % DIRECT_ALIGN == 0;
        if (direct && fd_direct_.valid() && aligned && read_direct(fd_direct_.get(), c.dst, c.size, c.need, c.off)) {
            direct_bytes_ += c.size;
            return;
        }
        read_exact(fd_.get(), c.dst, c.need, c.off);
    };
    if (chunks.size() < 2) {
        for (const auto & c : chunks) read_one(c);
        return;
    }
    std::call_once(readers_once_, [this] { readers_ = std::make_unique<task_pool>(N_READERS, "read"); });
    std::vector<std::shared_future<void>> inflight;
    inflight.reserve(chunks.size());
    for (const auto & c : chunks) inflight.push_back(readers_->submit(-1, 0, [c, read_one] { read_one(c); }).done);
    std::exception_ptr err;
    for (auto & f : inflight) {   // every chunk ends before the caller may reuse the buffer
        try { f.get(); } catch (...) { if (!err) err = std::current_exception(); }
    }
    if (err) std::rethrow_exception(err);
}

void prefetcher::load_via_tier(const load_job & job, stager & st) {
    if (!job.host_filled) read_parallel(job.host_ranges, job.host, job.direct);
    ggml_init_params p = { (job.copies.size() + 1) * ggml_tensor_overhead(), nullptr, true };
    ggml_context * ctx = ggml_init(p);
    if (!ctx) throw Error("cannot allocate staging views");
    auto * base = static_cast<uint8_t *>(ggml_backend_buffer_get_base(job.dst));
    for (const auto & c : job.copies) {
        ggml_tensor * t = tensor_bytes(ctx, job.dst, base + c.dst, c.size);
        ggml_backend_tensor_set_async(st.backend, t, job.host + c.src, 0, c.size);
    }
    ggml_backend_synchronize(st.backend);
    ggml_free(ctx);
}

void prefetcher::load_through_host(const load_job & job, stager & st) {
    if (!job.copies.empty()) {
        load_via_tier(job, st);
        return;
    }
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
