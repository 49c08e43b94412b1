#include "gguf-file.h"

#include "io.h"

#include "ggml.h"
#include "gguf.h"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace superggml {

// Tensor names are UTF-8 (GGUF spec); a mutated byte must not reach Python as an undecodable name.
static bool valid_utf8(const std::string & s) {
    size_t i = 0;
    while (i < s.size()) {
        const unsigned char c = (unsigned char) s[i];
        size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
        if (n == 0 || i + n > s.size()) return false;
        for (size_t k = 1; k < n; ++k) if (((unsigned char) s[i + k] >> 6) != 0x2) return false;
        i += n;
    }
    return true;
}

gguf_file::gguf_file(const std::string & path) : path_(path) {
    io_fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd.valid()) {
        int e = errno;
        throw FileError("cannot open " + path + ": " + std::strerror(e), e);
    }
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
        throw FileError("not a regular file: " + path, EINVAL);
    }
    file_size_ = (uint64_t) st.st_size;

    char magic[4] = {0, 0, 0, 0};
    if (file_size_ < 8 || ::pread(fd.get(), magic, 4, 0) != 4 || std::memcmp(magic, "GGUF", 4) != 0) {
        throw GGUFError("not a GGUF file (bad magic or too short): " + path);
    }

    gguf_init_params params = { /*no_alloc*/ true, /*ctx*/ &meta_ };
    gguf_ = gguf_init_from_file(path.c_str(), params);
    if (!gguf_) {
        throw GGUFError("malformed or truncated GGUF header: " + path);
    }
    data_offset_ = gguf_get_data_offset(gguf_);

    const int64_t n = gguf_get_n_tensors(gguf_);
    tensors_.reserve(n);
    for (int64_t i = 0; i < n; ++i) {
        gguf_tensor_info ti;
        ti.name   = gguf_get_tensor_name(gguf_, i);
        ti.type   = gguf_get_tensor_type(gguf_, i);
        const int64_t * ne = gguf_get_tensor_ne(gguf_, i);
        ti.n_dims = 1;
        for (int d = 0; d < 4; ++d) {
            ti.ne[d] = ne[d];
            if (ne[d] != 1) ti.n_dims = d + 1;
        }
        if (!valid_utf8(ti.name)) {
            close();
            throw GGUFError("tensor " + std::to_string(i) + " has a name that is not valid UTF-8: " + path);
        }
        ti.offset = data_offset_ + gguf_get_tensor_offset(gguf_, i);
        ti.nbytes = gguf_get_tensor_size(gguf_, i);
        if (ti.offset > file_size_ || ti.nbytes > file_size_ - ti.offset) {
            std::string msg = "GGUF is truncated: tensor '" + ti.name + "' needs bytes up to " +
                std::to_string(ti.offset + ti.nbytes) + " but the file has " +
                std::to_string(file_size_) + ": " + path;
            close();
            throw GGUFError(msg);
        }
        tensors_.push_back(std::move(ti));
    }

    void * m = ::mmap(nullptr, file_size_, PROT_READ, MAP_SHARED, fd.get(), 0);
    int e = errno;
    fd.reset();
    if (m == MAP_FAILED) {
        close();
        throw FileError("mmap failed for " + path + ": " + std::strerror(e), e);
    }
    map_ = static_cast<uint8_t *>(m);
}

gguf_file::~gguf_file() { close(); }

void gguf_file::close() {
    if (map_) { ::munmap(map_, file_size_); map_ = nullptr; }
    if (meta_) { ggml_free(meta_); meta_ = nullptr; }
    if (gguf_) { gguf_free(gguf_); gguf_ = nullptr; }
}

void gguf_file::drop_header() {
    if (gguf_) { alignment_ = gguf_get_alignment(gguf_); gguf_free(gguf_); gguf_ = nullptr; }
}

size_t gguf_file::alignment() const { return gguf_ ? gguf_get_alignment(gguf_) : alignment_; }

ggml_tensor * gguf_file::tensor(const std::string & name) const {
    return meta_ ? ggml_get_tensor(meta_, name.c_str()) : nullptr;
}

}  // namespace superggml
