// Stress test of buffer_pool + prefetcher without Python, for ThreadSanitizer:
//   cmake -B build/tsan -DSUPERGGML_SANITIZE_THREAD=ON -DSUPERGGML_BUILD_TESTS=ON && cmake --build build/tsan
//   ./build/tsan/prefetch_stress
// Threads acquire keys, load them (or cancel the load), verify the bytes, release.
#include "buffer-pool.h"
#include "prefetch.h"

#include <ggml-backend.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <unistd.h>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

using namespace superggml;

// Four threads acquire random keys, load them (sometimes cancelling the load),
// wait, check the bytes and release; a fifth shrinks and grows the pool.
// mode 0: pread into the slot; 1: staged (staging buffers + async copies); 2: O_DIRECT; 3: staged through a
// host tier of 3 slots (a filled copy is copied, not read; jobs release their host slot when done or dropped);
// 4: mode 3 with the host copy in a layout of its own, read in 4 ranges at once (O_DIRECT where allowed) and
// copied to the slot in 4 pieces, in reverse order.
static int stress(const char * path, const std::vector<uint8_t> & data, size_t chunk, size_t n_keys, int mode) {
    pool_params pp;
    pp.slot_size = chunk;
    pp.n_slots = 6;
    buffer_pool pool(pp);
    pool_params hp;
    hp.slot_size = chunk;
    hp.n_slots = 3;
    buffer_pool host(hp);
    auto filled = std::make_unique<std::atomic<bool>[]>(n_keys);
    for (size_t k = 0; k < n_keys; ++k) filled[k] = false;
    std::atomic<int> host_copies{0};
    std::atomic<int> ok{0}, cancelled{0}, exhausted{0}, bad{0}, resized{0};
    std::atomic<bool> done{false};
    {
        const bool tier = mode == 3 || mode == 4;
        prefetcher io(path, 3, mode == 2 || mode == 4, nullptr, mode == 1 || tier);
        // the fill of each slot, shared by every thread that holds the slot's key
        std::mutex mu;
        std::vector<std::shared_future<void>> fill(pp.n_slots);
        auto load = [&](int slot, int key, int prio) {
            load_job j;
            j.key = key;
            j.priority = prio;
            j.ranges = {{key * chunk, chunk, 0}};
            j.dst = pool.buffer(slot);
            j.direct = mode == 2 || mode == 4;
            if (mode == 4) {
                const size_t q = chunk / 4;
                for (size_t i = 0; i < 4; ++i) {
                    j.host_ranges.push_back({key * chunk + i * q, q, i * q, 0});
                    j.copies.push_back({(3 - i) * q, (3 - i) * q, q});
                }
            }
            if (tier) {
                try {
                    auto h = host.acquire(key);       // held until the job ends or is dropped
                    if (h.evicted >= 0) filled[h.evicted] = false;
                    j.host = host.base(h.slot);
                    j.host_filled = h.hit && filled[key];
                    if (j.host_filled) host_copies++;
                    filled[key] = false;
                    j.done = [&host, &filled, hs = h.slot, key](bool good) {
                        filled[key] = good;
                        host.release(hs);
                        if (!good) host.drop(key);
                    };
                } catch (const PoolExhausted &) {
                }
            }
            return io.submit(j);
        };
        std::vector<std::thread> ts;
        for (int t = 0; t < 4; ++t) {
            ts.emplace_back([&, t] {
                std::mt19937 rnd(100 + t);
                for (int i = 0; i < 2000; ++i) {
                    int key = (int) (rnd() % (tier ? 8 : n_keys));   // few keys: host copies get reused
                    buffer_pool::acquired a;
                    std::shared_future<void> f;
                    {
                        std::lock_guard<std::mutex> lk(mu);
                        try {
                            a = pool.acquire(key);
                        } catch (const PoolExhausted &) {
                            exhausted++;
                            continue;
                        }
                        if (!a.hit) {
                            auto tk = load(a.slot, key, (int) (rnd() % 3));
                            fill[a.slot] = tk.done;
                            if (rnd() % 5 == 0 && io.cancel_job(tk.id)) cancelled++;
                        }
                        f = fill[a.slot];
                    }
                    for (;;) {
                        try {
                            f.get();
                            break;
                        } catch (const Cancelled &) {
                            std::lock_guard<std::mutex> lk(mu);   // refill once for everyone waiting
                            if (fill[a.slot].valid() && fill[a.slot].wait_for(std::chrono::seconds(0)) ==
                                    std::future_status::ready) {
                                try { fill[a.slot].get(); } catch (const Cancelled &) {
                                    fill[a.slot] = load(a.slot, key, 3).done;
                                }
                            }
                            f = fill[a.slot];
                        }
                    }
                    if (std::memcmp(pool.base(a.slot), data.data() + key * chunk, chunk) != 0) bad++;
                    else ok++;
                    pool.release(a.slot);
                }
            });
        }
        std::thread resizer([&] {
            std::mt19937 rnd(7);
            while (!done) {
                {
                    std::lock_guard<std::mutex> lk(mu);
                    int evicted = -1;
                    if (pool.n_slots() > 3 && rnd() % 2) { if (pool.shrink(evicted)) resized++; }
                    else if (pool.n_slots() < (int) pp.n_slots) { pool.grow(); resized++; }
                }
                std::this_thread::sleep_for(std::chrono::microseconds(200));
            }
        });
        for (auto & th : ts) th.join();
        done = true;
        resizer.join();
    }
    int held = 0;
    for (int i = 0; i < hp.n_slots; ++i) held += host.in_use(i);
    std::printf("mode %d: ok %d cancelled %d exhausted %d resized %d bad %d host copies %d, host holds left %d\n",
                mode, ok.load(), cancelled.load(), exhausted.load(), resized.load(), bad.load(), host_copies.load(),
                held);
    return bad.load() == 0 && ok.load() > 1000 && held == 0 && (mode < 3 || host_copies > 0) ? 0 : 1;
}

// Views of slots: valid while held; after release, eviction or shrink view_data throws SlotReleased
// (under ASan: never touching freed memory), while other threads churn the pool. align: the pool's
// (4096: slots allocated by the pool itself, page-aligned, freed with their buffers).
static int views(size_t align) {
    pool_params pp;
    pp.slot_size = 4000;
    pp.n_slots = 3;
    pp.align = align;
    buffer_pool pool(pp);
    int bad = 0;
    if (align && (pool.slot_size() % align || (uintptr_t) pool.base(0) % align)) bad++;
    auto expect_released = [&](const buffer_pool::view_t & v) {
        try {
            pool.view_data(v)[0] = 1;
            bad++;
        } catch (const SlotReleased &) {
        }
    };
    auto a = pool.acquire(1);
    auto v = pool.view(a.slot);
    pool.view_data(v)[0] = 42;
    pool.release(a.slot);
    expect_released(v);                       // released
    a = pool.acquire(1);                      // a hit: a new hold, a new view
    auto v2 = pool.view(a.slot);
    bad += pool.view_data(v2)[0] != 42;
    pool.release(a.slot);
    int evicted = -1;
    while (pool.shrink(evicted)) {}           // every slot's memory freed
    expect_released(v2);
    pool.grow();
    std::atomic<bool> stop{false};
    std::thread churn([&] {
        while (!stop) {
            try {
                auto c = pool.acquire(7);
                pool.release(c.slot);
            } catch (const PoolExhausted &) {
            }
        }
    });
    for (int i = 0; i < 20000; ++i) {
        try {
            auto b = pool.acquire(100 + i % 5);
            auto w = pool.view(b.slot);
            pool.view_data(w)[i % 4000] = (uint8_t) i;
            if (align && (uintptr_t) pool.view_data(w) % align) bad++;
            pool.release(b.slot);
            expect_released(w);
        } catch (const PoolExhausted &) {
        }
    }
    stop = true;
    churn.join();
    if (bad) fprintf(stderr, "views (align %zu): %d stale or misaligned views were served\n", align, bad);
    else printf("views (align %zu): stale views refused\n", align);
    return bad ? 1 : 0;
}

int main() {
    const size_t chunk = 16 << 10, n_keys = 256;
    char path[] = "/tmp/superggml-stress-XXXXXX";
    int fd = mkstemp(path);
    std::vector<uint8_t> data(chunk * n_keys);
    std::mt19937 gen(1);
    for (auto & b : data) b = (uint8_t) gen();
    if (write(fd, data.data(), data.size()) != (ssize_t) data.size()) return 2;
    close(fd);
    int rc = views(0) | views(4096);
    for (int mode = 0; mode < 5; ++mode) rc |= stress(path, data, chunk, n_keys, mode);
    unlink(path);
    return rc;
}
