#include "content-hash.h"

#include "error.h"
#include "io.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <exception>
#include <fcntl.h>
#include <mutex>
#include <thread>

namespace superggml {

uint64_t content_hash(const uint8_t * data, size_t len, uint64_t hash) {
    const uint64_t prime = 0x100000001b3ULL;
    for (size_t i = 0; i < len; ++i) {
        hash ^= data[i];
        hash *= prime;
    }
    return hash;
}

std::vector<uint64_t> content_hash_ranges(const std::string & path,
                                          const std::vector<std::pair<uint64_t, uint64_t>> & ranges,
                                          const content_hash_params & params) {
    io_fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd.valid()) throw FileError("cannot open " + path + " to hash it", errno);
    std::vector<uint64_t> out(ranges.size(), content_hash_seed);
    std::atomic<size_t> next{0};
    std::exception_ptr failed;
    std::mutex mu;
    auto work = [&]() {
        std::vector<uint8_t> buf(params.chunk);
        try {
            for (size_t i = next++; i < ranges.size(); i = next++) {
                uint64_t off = ranges[i].first, left = ranges[i].second, h = content_hash_seed;
                while (left > 0) {
                    const size_t n = (size_t) std::min<uint64_t>(left, buf.size());
                    io_pread_all(fd.get(), buf.data(), n, (off_t) off, path);
                    h = content_hash(buf.data(), n, h);
                    off += n;
                    left -= n;
                }
                out[i] = h;
            }
        } catch (...) {
            std::lock_guard<std::mutex> lk(mu);
            if (!failed) failed = std::current_exception();
            next = ranges.size();
        }
    };
    const int n = std::max(1, std::min<int>(params.n_threads, (int) ranges.size()));
    std::vector<std::thread> threads;
    for (int t = 1; t < n; ++t) threads.emplace_back(work);
    work();
    for (auto & t : threads) t.join();
    if (failed) std::rethrow_exception(failed);
    return out;
}

}  // namespace superggml
