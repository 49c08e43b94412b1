#include "host-reserve.h"

#include "error.h"
#include "tensor-bind.h"

#include "ggml-backend.h"
#include "ggml-cpu.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace superggml {

host_reservation::host_reservation(size_t size) : size_(size) {
    if (size == 0) throw Error("host_reservation: size must be > 0");
    void * p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
        throw Error("host_reservation: cannot reserve " + std::to_string(size) + " bytes of address space: " +
                    std::strerror(errno));
    }
    base_ = p;
    buf_ = ggml_backend_cpu_buffer_from_ptr(base_, size_);
    if (!buf_) {
        ::munmap(base_, size_);
        throw Error("host_reservation: ggml cannot wrap the range as a CPU buffer");
    }
}

host_reservation::~host_reservation() {
    if (buf_) ggml_backend_buffer_free(buf_);   // does not own the range
    if (base_) ::munmap(base_, size_);
}

void host_reservation::bind(ggml_tensor * t, size_t offset) {
    if (offset > size_) throw Error("host_reservation: offset past the end of the range");
    tensor_bind(t, buf_, static_cast<uint8_t *>(base_) + offset);
}

void host_reservation::release(size_t offset, size_t n) {
    if (offset > size_ || n > size_ - offset) throw Error("host_reservation: release past the end of the range");
    const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    size_t a = (offset + page - 1) / page * page;
    size_t b = (offset + n) / page * page;
    if (b > a && ::madvise(static_cast<uint8_t *>(base_) + a, b - a, MADV_DONTNEED) != 0) {
        throw Error(std::string("host_reservation: madvise: ") + std::strerror(errno));
    }
}

size_t host_reservation::resident() const {
    const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    std::vector<unsigned char> v((size_ + page - 1) / page);
    if (::mincore(base_, size_, v.data()) != 0) {
        throw Error(std::string("host_reservation: mincore: ") + std::strerror(errno));
    }
    size_t n = 0;
    for (unsigned char c : v) n += c & 1;
    return n * page;
}

}  // namespace superggml
