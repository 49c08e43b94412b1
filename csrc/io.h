// io: the pread/pwrite (and mapping populate) every byte mover goes through,
// with fault injection for tests, and io_fd, the owner of a file descriptor.
//
// io_pread / io_pwrite behave as ::pread / ::pwrite, io_populate as
// madvise(MADV_POPULATE_READ) (reads a mapped file range into the page cache
// and maps it, no copy), unless a fault is armed
// (io_fault_arm, a test hook: off unless a test turns it on; when off the
// cost is one relaxed atomic load). An armed fault lets `skip` calls through,
// then hits the next `count` calls of its kind:
//   short_read   the read returns at most half the bytes asked (callers loop)
//   eintr        the call fails with EINTR (callers retry)
//   eio          the call fails with EIO (callers raise)
//   enospc       a write fails with ENOSPC (callers raise)
#pragma once

#include <cstddef>
#include <string>
#include <sys/types.h>

namespace superggml {

enum class io_fault { none, short_read, eintr, eio, enospc };

ssize_t io_pread(int fd, void * buf, size_t n, off_t off);
ssize_t io_pwrite(int fd, const void * buf, size_t n, off_t off);
// Populates the mapped pages of [addr, addr + n) (addr page aligned): returns the bytes done (n, or fewer
// with a short_read fault), or -1 with errno (EINVAL/ENOSYS: the kernel cannot; EFAULT: past the file's end;
// EINTR: retry; EIO).
ssize_t io_populate(const void * addr, size_t n);

// Read or write exactly n bytes at `off`, looping over short transfers and EINTR. Failure throws FileError
// carrying errno: "cannot read <what> at offset N: <strerror>", "short read at offset N of <what>: the file
// was truncated" (EOF first; EIO), "cannot write <what> at offset N: <strerror>" (a write of 0 bytes: ENOSPC).
void io_pread_all(int fd, void * buf, size_t n, off_t off, const std::string & what);
void io_pwrite_all(int fd, const void * buf, size_t n, off_t off, const std::string & what);

// An owned file descriptor (-1: none), closed when reset or destroyed.
class io_fd {
public:
    io_fd() = default;
    explicit io_fd(int fd) : fd_(fd) {}
    ~io_fd() { reset(); }
    io_fd(io_fd && o) noexcept : fd_(o.release()) {}
    io_fd & operator=(io_fd && o) noexcept;
    io_fd(const io_fd &) = delete;
    io_fd & operator=(const io_fd &) = delete;

    int get() const { return fd_; }
    bool valid() const { return fd_ >= 0; }
    int release();             // gives up ownership; returns the descriptor
    void reset(int fd = -1);   // closes the one held, then holds `fd`

private:
    int fd_ = -1;
};

// Arms `kind` for `count` calls after `skip` unaffected ones (count < 0: forever).
void io_fault_arm(io_fault kind, long skip = 0, long count = 1);
void io_fault_clear();
long io_fault_hits();     // calls the armed fault has hit so far

}  // namespace superggml
