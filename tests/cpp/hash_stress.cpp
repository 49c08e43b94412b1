// Stress test of content_hash_ranges without Python, for ThreadSanitizer and ASan: a file of random bytes, hashed
// in thousands of random ranges (empty ones and ones longer than a read chunk among them) by 1, 2, 4 and 8
// threads from several callers at once; every hash must equal the one-threaded one and FNV-1a over the bytes.
// Then a range past the file's end must throw, whatever the thread count.
#include "content-hash.h"
#include "error.h"

#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

using namespace superggml;

int main() {
    const size_t size = (size_t(9) << 20) + 12345;
    std::vector<uint8_t> data(size);
    std::mt19937_64 rnd(7);
    for (auto & b : data) b = (uint8_t) rnd();
    char path[] = "/tmp/hash_stress_XXXXXX";
    const int fd = mkstemp(path);
    if (fd < 0 || write(fd, data.data(), size) != (ssize_t) size) { std::perror("hash_stress: temp file"); return 1; }
    close(fd);

    std::vector<std::pair<uint64_t, uint64_t>> ranges;
    for (int i = 0; i < 2000; ++i) {
        const uint64_t off = rnd() % size, len = i % 97 == 0 ? 0 : rnd() % std::min<uint64_t>(size - off, 300000);
        ranges.emplace_back(off, len);
    }
    ranges.emplace_back(0, size);                          // longer than a read chunk
    std::vector<uint64_t> want;
    for (auto & r : ranges) want.push_back(content_hash(data.data() + r.first, r.second));

    int failures = 0;
    std::vector<std::thread> callers;
    std::vector<int> bad(4, 0);
    for (int c = 0; c < 4; ++c) {
        callers.emplace_back([&, c] {
            for (int threads : {1, 2, 4, 8}) {
                content_hash_params p;
                p.n_threads = threads;
                p.chunk = size_t(64) << 10;
                if (content_hash_ranges(path, ranges, p) != want) bad[c]++;
            }
        });
    }
    for (auto & t : callers) t.join();
    for (int b : bad) failures += b;

    for (int threads : {1, 4}) {
        content_hash_params p;
        p.n_threads = threads;
        bool threw = false;
        try {
            content_hash_ranges(path, {{0, 10}, {size - 5, 10}, {0, 10}}, p);
        } catch (const FileError &) {
            threw = true;
        }
        if (!threw) failures++;
    }
    unlink(path);
    std::printf("hash_stress: %zu ranges x 4 thread counts x 4 callers, %d failures\n", ranges.size(), failures);
    return failures ? 1 : 0;
}
