// host-reserve: a range of host address space reserved for tensors whose pages are committed only when written.
//
// The range is an anonymous private mapping of `size` bytes made with MAP_NORESERVE: it costs no memory until a
// page is touched, a page never written reads as zeros, and release(offset, n) gives the whole pages inside
// [offset, offset + n) back to the system (they read as zeros again). It is a ggml CPU buffer
// (ggml_backend_cpu_buffer_from_ptr), so tensors bound into it (bind) are computed on by the CPU backend. Where
// the kernel refuses the mapping (strict overcommit), construction throws. Not thread safe: the caller orders
// release() against graphs that use the range.
#pragma once

#include <cstddef>

struct ggml_backend_buffer;
struct ggml_tensor;

namespace superggml {

class host_reservation {
public:
    explicit host_reservation(size_t size);
    ~host_reservation();
    host_reservation(const host_reservation &) = delete;
    host_reservation & operator=(const host_reservation &) = delete;

    // Places t (no storage yet, or aliased elsewhere) at byte `offset` of the range; throws if it does not fit.
    void bind(ggml_tensor * t, size_t offset);
    // Returns the pages wholly inside [offset, offset + n) to the system; they read as zeros after.
    void release(size_t offset, size_t n);
    // Bytes of the range currently backed by memory (mincore), a multiple of the page size.
    size_t resident() const;

    size_t size() const { return size_; }
    ggml_backend_buffer * buffer() const { return buf_; }

private:
    void * base_ = nullptr;
    size_t size_ = 0;
    ggml_backend_buffer * buf_ = nullptr;
};

}  // namespace superggml
