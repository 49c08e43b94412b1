#include "io.h"

#include "error.h"

#include <atomic>
#include <cerrno>
#include <cstring>
#include <cstdint>
#include <mutex>
#include <sys/mman.h>
#include <unistd.h>

namespace superggml {

namespace {
std::atomic<bool> g_armed{false};
std::mutex g_mu;
io_fault g_kind = io_fault::none;
long g_skip = 0, g_count = 0, g_hits = 0;

// Whether this call of `kind`'s family is hit; counts it.
bool hit(bool is_write) {
    if (!g_armed.load(std::memory_order_relaxed)) return false;
    std::lock_guard<std::mutex> lk(g_mu);
    if (g_kind == io_fault::none) return false;
    const bool write_fault = g_kind == io_fault::enospc;
    const bool read_fault = g_kind == io_fault::short_read;
    if ((write_fault && !is_write) || (read_fault && is_write)) return false;
    if (g_skip > 0) { --g_skip; return false; }
    if (g_count == 0) return false;
    if (g_count > 0) --g_count;
    ++g_hits;
    return true;
}
}  // namespace

io_fd & io_fd::operator=(io_fd && o) noexcept {
    if (this != &o) reset(o.release());
    return *this;
}

int io_fd::release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
}

void io_fd::reset(int fd) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
}

ssize_t io_pread(int fd, void * buf, size_t n, off_t off) {
    if (hit(false)) {
        switch (g_kind) {
            case io_fault::short_read: return ::pread(fd, buf, n > 1 ? n / 2 : n, off);
            case io_fault::eintr: errno = EINTR; return -1;
            case io_fault::eio: errno = EIO; return -1;
            default: break;
        }
    }
    return ::pread(fd, buf, n, off);
}

ssize_t io_pwrite(int fd, const void * buf, size_t n, off_t off) {
    if (hit(true)) {
        switch (g_kind) {
            case io_fault::eintr: errno = EINTR; return -1;
            case io_fault::eio: errno = EIO; return -1;
            case io_fault::enospc: errno = ENOSPC; return -1;
            default: break;
        }
    }
    return ::pwrite(fd, buf, n, off);
}

void io_pread_all(int fd, void * buf, size_t n, off_t off, const std::string & what) {
    auto * p = static_cast<uint8_t *>(buf);
    while (n > 0) {
        ssize_t r = io_pread(fd, p, n, off);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            const int e = errno;
            throw FileError("cannot read " + what + " at offset " + std::to_string(off) + ": " + std::strerror(e), e);
        }
        if (r == 0) {
            throw FileError("short read at offset " + std::to_string(off) + " of " + what + ": the file was truncated",
                            EIO);
        }
        p += r;
        off += r;
        n -= (size_t) r;
    }
}

void io_pwrite_all(int fd, const void * buf, size_t n, off_t off, const std::string & what) {
    auto * p = static_cast<const uint8_t *>(buf);
    while (n > 0) {
        ssize_t r = io_pwrite(fd, p, n, off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            const int e = r < 0 ? errno : ENOSPC;
            throw FileError("cannot write " + what + " at offset " + std::to_string(off) + ": " + std::strerror(e), e);
        }
        p += r;
        off += r;
        n -= (size_t) r;
    }
}

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif

ssize_t io_populate(const void * addr, size_t n) {
    if (hit(false)) {
        switch (g_kind) {
            case io_fault::short_read: n = n > 8192 ? n / 2 / 4096 * 4096 : n; break;
            case io_fault::eintr: errno = EINTR; return -1;
            case io_fault::eio: errno = EIO; return -1;
            default: break;
        }
    }
    if (::madvise(const_cast<void *>(addr), n, MADV_POPULATE_READ) != 0) return -1;
    return (ssize_t) n;
}

void io_fault_arm(io_fault kind, long skip, long count) {
    std::lock_guard<std::mutex> lk(g_mu);
    g_kind = kind;
    g_skip = skip;
    g_count = count;
    g_hits = 0;
    g_armed.store(kind != io_fault::none, std::memory_order_relaxed);
}

void io_fault_clear() { io_fault_arm(io_fault::none, 0, 0); }

long io_fault_hits() {
    std::lock_guard<std::mutex> lk(g_mu);
    return g_hits;
}

}  // namespace superggml
