// io: the pread/pwrite every byte mover goes through, with fault injection
// for tests.
//
// io_pread / io_pwrite behave as ::pread / ::pwrite unless a fault is armed
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

// Arms `kind` for `count` calls after `skip` unaffected ones (count < 0: forever).
void io_fault_arm(io_fault kind, long skip = 0, long count = 1);
void io_fault_clear();
long io_fault_hits();     // calls the armed fault has hit so far

}  // namespace superggml
