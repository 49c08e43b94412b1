// rpc_stress: the RPC guard relay under concurrency and failure, without Python (run under ThreadSanitizer
// and AddressSanitizer in CI). Two superggml RPC peers run in this process; threads write and read tensors on
// their devices while others poll rpc_stats() and rpc_check(). The first peer holds a file: threads write its
// ranges by content address (rpc-content.h) and read them back, among them a range the peer holds a wrong
// hash for (refused: the bytes are sent) and one it does not hold (sent, then kept in its cache). A fake
// server that answers the handshake and then drops the connection puts a relay in stand-in mode: ggml's
// client must neither abort nor hang, and rpc_check() must throw DeviceError.
#include "content-hash.h"
#include "prefetch.h"
#include "remote.h"
#include "rpc/rpc-content.h"
#include "rpc/rpc-peer.h"
#include "rpc/rpc.h"

#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-rpc.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

using namespace superggml;

constexpr int ROUNDS = 20;    // per worker
constexpr int N = 1 << 12;    // int32 per tensor: past the relay's first 512 bytes (spliced), small for TSan (it reports and
                              // suppresses each word ggml-rpc's uninstrumented thread wrote)

#define CHECK(x) do { if (!(x)) { fprintf(stderr, "FAILED: %s (line %d)\n", #x, __LINE__); std::exit(1); } } while (0)

static int listen_any(int & port) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    CHECK(::bind(fd, (sockaddr *) &a, sizeof a) == 0 && ::listen(fd, 8) == 0);
    CHECK(::getsockname(fd, (sockaddr *) &a, &len) == 0);
    port = ntohs(a.sin_port);
    return fd;
}

static int free_port() {
    int port = 0;
    ::close(listen_any(port));
    return port;
}

static bool read_n(int fd, void * p, size_t n) {
    char * c = (char *) p;
    while (n) {
        ssize_t k = ::recv(fd, c, n, 0);
        if (k <= 0) return false;
        c += k;
        n -= (size_t) k;
    }
    return true;
}

// Answers HELLO (protocol 7.0) and DEVICE_COUNT (1), and drops the connection at any other command.
static void fake_server(int lfd, std::atomic<bool> & stop) {
    while (!stop) {
        int c = ::accept(lfd, nullptr, nullptr);
        if (c < 0) return;
        for (;;) {
            uint8_t cmd;
            uint64_t size;
            if (!read_n(c, &cmd, 1) || !read_n(c, &size, 8)) break;
            std::vector<uint8_t> in(size);
            if (size && !read_n(c, in.data(), size)) break;
            if (cmd == 14) {                      // HELLO
                uint8_t out[8 + 28] = {};
                uint64_t n = 28;
                std::memcpy(out, &n, 8);
                out[8] = RPC_PROTO_MAJOR_VERSION;
                ::send(c, out, sizeof out, MSG_NOSIGNAL);
            } else if (cmd == 15) {               // DEVICE_COUNT
                uint8_t out[8 + 4] = {};
                uint64_t n = 4;
                std::memcpy(out, &n, 8);
                out[8] = 1;
                ::send(c, out, sizeof out, MSG_NOSIGNAL);
            } else {
                break;
            }
        }
        ::close(c);
    }
}

static ggml_backend_dev_t device_of(const std::string & name) {
    ggml_backend_dev_t d = ggml_backend_dev_by_name(name.c_str());
    CHECK(d != nullptr);
    return d;
}

constexpr int RANGES = 6;
constexpr size_t RANGE = 48 << 10;

int main() {
    // a file of RANGES ranges: the peer holds 0..3 rightly, 4 under a wrong hash, 5 not at all
    char dir[] = "/tmp/rpc_stressXXXXXX";
    CHECK(::mkdtemp(dir) != nullptr);
    const std::string file = std::string(dir) + "/held.bin", cache = std::string(dir) + "/cache";
    CHECK(::mkdir(cache.c_str(), 0700) == 0);
    std::vector<uint8_t> bytes(RANGES * RANGE);
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = (uint8_t) (i * 2654435761u >> 13);
    std::ofstream(file, std::ios::binary).write((const char *) bytes.data(), (std::streamsize) bytes.size());
    std::vector<content_range> all, held;
    for (int r = 0; r < RANGES; ++r) {
        const uint64_t off = (uint64_t) r * RANGE;
        all.push_back({off, RANGE, content_hash(bytes.data() + off, RANGE)});
        if (r < 4) held.push_back(all.back());
        if (r == 4) held.push_back({off, RANGE, all.back().hash});
    }
    bytes[4 * RANGE + 100] ^= 0xFF;          // the peer's copy of range 4 differs from the client's
    std::ofstream(file + ".peer", std::ios::binary).write((const char *) bytes.data(), (std::streamsize) bytes.size());
    bytes[4 * RANGE + 100] ^= 0xFF;
    content_index_set(file, all);

    std::vector<std::string> eps;
    for (int i = 0; i < 2; ++i) {
        eps.push_back("127.0.0.1:" + std::to_string(free_port()));
        rpc_server_params sp;
        sp.endpoint = eps.back();
        sp.n_threads = 1;
        if (i == 0) {
            sp.models = {{file + ".peer", held}};
            sp.cache_dir = cache;
        }
        rpc_server_start(sp);
    }
    std::vector<std::string> names;
    for (const auto & ep : eps) {
        for (int tries = 0;; ++tries) {
            try {
                rpc_probe(ep, {});
                break;
            } catch (const DeviceError &) {
                CHECK(tries < 100);
                std::this_thread::sleep_for(std::chrono::milliseconds(50));
            }
        }
        auto devs = rpc_add_server(ep, {});
        CHECK(devs.size() == 1 && devs[0].endpoint == ep);
        names.push_back(devs[0].name);
    }

    std::atomic<bool> done{false};
    std::atomic<int> rounds{0};
    std::thread poller([&] {
        while (!done) {
            for (const auto & s : rpc_stats()) CHECK(!s.failed);
            rpc_check(nullptr);
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
    });
    std::vector<std::thread> workers;
    for (int w = 0; w < 4; ++w) {
        workers.emplace_back([&, w] {
            ggml_backend_dev_t dev = device_of(names[w % names.size()]);
            ggml_init_params p = {ggml_tensor_overhead() * 2, nullptr, true};
            for (int r = 0; r < ROUNDS; ++r) {
                ggml_context * ctx = ggml_init(p);
                ggml_tensor * t = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, N);
                ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors_from_buft(ctx,
                    ggml_backend_dev_buffer_type(dev));
                CHECK(buf != nullptr);
                std::vector<int32_t> in(N), out(N);
                for (size_t i = 0; i < in.size(); ++i) in[i] = (int32_t) (i * 7 + w * 1000 + r);
                ggml_backend_tensor_set(t, in.data(), 0, ggml_nbytes(t));
                ggml_backend_tensor_get(t, out.data(), 0, ggml_nbytes(t));
                CHECK(in == out);
                rpc_check(dev);
                ggml_backend_buffer_free(buf);
                ggml_free(ctx);
                ++rounds;
            }
        });
    }
    for (int w = 0; w < 2; ++w) {             // by content address, on the peer that holds the file
        workers.emplace_back([&, w] {
            ggml_backend_dev_t dev = device_of(names[0]);
            ggml_init_params p = {ggml_tensor_overhead() * 2, nullptr, true};
            for (int r = 0; r < ROUNDS; ++r) {
                ggml_context * ctx = ggml_init(p);
                ggml_tensor * t = ggml_new_tensor_1d(ctx, GGML_TYPE_I8, RANGES * RANGE);
                ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors_from_buft(ctx,
                    ggml_backend_dev_buffer_type(dev));
                CHECK(buf != nullptr);
                std::vector<range_write> ranges;
                for (int k = 0; k < RANGES; ++k) {
                    const int q = (k + w + r) % RANGES;          // each range to another place each round
                    ranges.push_back({(uint64_t) q * RANGE, RANGE, (uint64_t) k * RANGE});
                }
                auto rest = content_write(buf, file, ranges);
                CHECK(rest.empty());
                std::vector<uint8_t> out(RANGES * RANGE);
                ggml_backend_tensor_get(t, out.data(), 0, out.size());
                for (int k = 0; k < RANGES; ++k) {
                    const int q = (k + w + r) % RANGES;
                    CHECK(std::memcmp(out.data() + k * RANGE, bytes.data() + q * RANGE, RANGE) == 0);
                }
                rpc_check(dev);
                ggml_backend_buffer_free(buf);
                ggml_free(ctx);
                ++rounds;
            }
        });
    }
    for (auto & t : workers) t.join();
    done = true;
    poller.join();
    CHECK(rounds == 6 * ROUNDS);
    uint64_t by_peer = 0, misses = 0;
    for (const auto & s : rpc_stats()) { by_peer += s.loaded_by_peer; misses += s.addressed_misses; }
    const rpc_server_stats ps = rpc_server_stats_get();
    CHECK(ps.refused == 1);                   // range 4, hashed once and refused from then on
    CHECK(by_peer >= 2u * ROUNDS * 4 * RANGE && ps.bytes_loaded == by_peer);
    CHECK(misses >= 2 && misses < 2u * ROUNDS * 2);   // 4 and 5 sent once or a few times, then from the cache
    uint64_t moved = 0;
    for (const auto & s : rpc_stats()) moved += s.bytes_sent + s.bytes_received;
    CHECK(moved >= 4u * ROUNDS * 2 * N * sizeof(int32_t));

    // The core's seam (remote.h): it sees the RPC devices through the hooks rpc_add_server installed, and a
    // prefetcher handed content_write as its writer loads a peer's buffer by content address.
    {
        ggml_backend_dev_t dev0 = device_of(names[0]);
        CHECK(remote_device_endpoint(dev0) == eps[0] && remote_device_usable(dev0));
        remote_device_check(dev0);
        ggml_init_params p = {ggml_tensor_overhead() * 2, nullptr, true};
        ggml_context * ctx = ggml_init(p);
        ggml_tensor * t = ggml_new_tensor_1d(ctx, GGML_TYPE_I8, 4 * RANGE);
        ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors_from_buft(ctx, ggml_backend_dev_buffer_type(dev0));
        CHECK(buf != nullptr);
        const uint64_t loaded = rpc_server_stats_get().bytes_loaded;
        {
            prefetcher io(file, 2, false, dev0, true, content_write);
            load_job job;
            job.dst = buf;
            for (int k = 0; k < 4; ++k) job.ranges.push_back({(uint64_t) (3 - k) * RANGE, RANGE, k * RANGE, 0});
            io.submit(std::move(job)).done.get();
        }
        std::vector<uint8_t> out(4 * RANGE);
        ggml_backend_tensor_get(t, out.data(), 0, out.size());
        for (int k = 0; k < 4; ++k) CHECK(std::memcmp(out.data() + k * RANGE, bytes.data() + (3 - k) * RANGE, RANGE) == 0);
        CHECK(rpc_server_stats_get().bytes_loaded == loaded + 4 * RANGE);   // all four by hash, none as bytes
        ggml_backend_buffer_free(buf);
        ggml_free(ctx);
    }

    // A server that fails after the handshake: stand-in answers, then DeviceError; no abort, no hang.
    int port = 0;
    int lfd = listen_any(port);
    std::atomic<bool> stop{false};
    std::thread fake(fake_server, lfd, std::ref(stop));
    std::string ep = "127.0.0.1:" + std::to_string(port);
    rpc_params rp;
    rp.timeout = 2;
    auto devs = rpc_add_server(ep, rp);
    CHECK(devs.size() == 1);
    ggml_backend_dev_t dev = device_of(devs[0].name);
    ggml_backend_t be = ggml_backend_dev_init(dev, nullptr);       // its commands now fail upstream
    CHECK(be != nullptr);
    ggml_backend_buffer_t buf = ggml_backend_buft_alloc_buffer(ggml_backend_dev_buffer_type(dev), 1 << 20);
    CHECK(buf == nullptr);                                            // the stand-in refuses allocations
    bool threw = false;
    try {
        rpc_check(dev);
    } catch (const DeviceError & e) {
        threw = std::string(e.what()).find(ep) != std::string::npos;
    }
    CHECK(threw);
    CHECK(!remote_device_usable(dev) && remote_device_endpoint(dev) == ep);
    threw = false;
    try {
        remote_device_check(dev);
    } catch (const DeviceError &) {
        threw = true;
    }
    CHECK(threw);
    ggml_backend_free(be);
    stop = true;
    ::shutdown(lfd, SHUT_RDWR);
    ::close(lfd);
    fake.join();
    printf("rpc_stress: %d rounds on %zu servers, %llu bytes relayed, %llu loaded by the peer from its copy "
           "(%llu misses, %llu refused); failed server: DeviceError\n", rounds.load(), names.size(),
           (unsigned long long) moved, (unsigned long long) by_peer, (unsigned long long) misses,
           (unsigned long long) ps.refused);
    std::filesystem::remove_all(dir);
    return 0;
}
