// Stress test of weight_loader without Python, for ThreadSanitizer / AddressSanitizer:
//   cmake -B build/tsan -DSUPERGGML_SANITIZE=thread -DSUPERGGML_BUILD_TESTS=ON && cmake --build build/tsan
//   ./build/tsan/loader_stress
// Writes a GGUF with re-laid (Q4_0) and plain (F32) tensors, then many times: starts a background load,
// waits for the groups in a random order from two threads, sometimes cancels or injects I/O faults part
// way, and checks every re-laid tensor's bytes against a synchronous load_repacked of the same file.
#include "gguf-file.h"
#include "io.h"
#include "weight-store.h"
#include "weight-loader.h"

#include <ggml-backend.h>
#include <ggml-cpu.h>
#include <ggml.h>
#include <gguf.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

using namespace superggml;

static const int N_GROUPS = 12;

static std::string write_model() {
    char path[] = "/tmp/loader_stress_XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) { perror("mkstemp"); exit(1); }
    close(fd);
    ggml_init_params ip = {256 * ggml_tensor_overhead() + (64u << 20), nullptr, false};
    ggml_context * ctx = ggml_init(ip);
    gguf_context * g = gguf_init_empty();
    std::mt19937 rnd(7);
    for (int i = 0; i < N_GROUPS; ++i) {
        for (int k = 0; k < 3; ++k) {
            ggml_tensor * t = k < 2 ? ggml_new_tensor_2d(ctx, GGML_TYPE_Q4_0, 256, 64 * (k + 1))
                                    : ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 256);
            ggml_set_name(t, ("blk." + std::to_string(i) + ".w" + std::to_string(k)).c_str());
            auto * p = static_cast<uint8_t *>(t->data);
            if (t->type == GGML_TYPE_Q4_0) {
                // valid blocks: an F16 scale of 1/64 and random nibbles
                const size_t bs = ggml_type_size(GGML_TYPE_Q4_0);
                for (size_t b = 0; b < ggml_nbytes(t) / bs; ++b) {
                    ggml_fp16_t d = ggml_fp32_to_fp16(1.0f / 64);
                    std::memcpy(p + b * bs, &d, 2);
                    for (size_t j = 2; j < bs; ++j) p[b * bs + j] = (uint8_t) rnd();
                }
            } else {
                for (size_t j = 0; j < ggml_nbytes(t) / 4; ++j) ((float *) p)[j] = (float) (rnd() % 100) / 10;
            }
            gguf_add_tensor(g, t);
        }
    }
    if (!gguf_write_to_file(g, path, false)) { fprintf(stderr, "cannot write %s\n", path); exit(1); }
    gguf_free(g);
    ggml_free(ctx);
    return path;
}

int main() {
    ggml_log_set([](ggml_log_level level, const char * text, void *) {
        if (level >= GGML_LOG_LEVEL_WARN) fputs(text, stderr);
    }, nullptr);
    const std::string path = write_model();
    std::vector<std::vector<std::string>> groups(N_GROUPS);
    std::vector<std::string> repack;
    for (int i = 0; i < N_GROUPS; ++i) {
        for (int k = 0; k < 3; ++k) groups[i].push_back("blk." + std::to_string(i) + ".w" + std::to_string(k));
        repack.push_back(groups[i][0]);
        repack.push_back(groups[i][1]);
    }
    ggml_backend_device * cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);

    auto ref_file = std::make_shared<gguf_file>(path);
    auto ref = std::make_shared<weight_store>(ref_file);
    ref->bind_mmap();
    const size_t ref_bytes = ref->load_repacked(repack, cpu);
    int checked = 0, failures = 0, cancels = 0, bad = 0;
    std::mt19937 rnd(1);
    for (int iter = 0; iter < 300; ++iter) {
        auto file = std::make_shared<gguf_file>(path);
        auto store = std::make_shared<weight_store>(file);
        const int mode = (int) (rnd() % 4);   // 0 plain, 1 cancel early, 2 transient faults, 3 hard faults first
        if (mode == 2) io_fault_arm(rnd() % 2 ? io_fault::short_read : io_fault::eintr, rnd() % 8, 20);
        if (mode == 3) io_fault_arm(io_fault::eio, rnd() % 8, (long) (rnd() % 6));
        loader_params lp;
        lp.chunk = 4096 * (1 + rnd() % 8);
        lp.n_readers = 1 + (int) (rnd() % 2);
        lp.n_workers = 1 + (int) (rnd() % 2);
        {
            weight_loader loader(store, groups, repack, cpu, lp);
            if (loader.repacked_bytes() != ref_bytes) bad++;
            if (mode == 1) {
                std::this_thread::sleep_for(std::chrono::microseconds(rnd() % 300));
                loader.cancel();
                cancels++;
            }
            std::vector<int> order(N_GROUPS);
            for (int i = 0; i < N_GROUPS; ++i) order[i] = i;
            std::shuffle(order.begin(), order.end(), rnd);
            auto waiter = [&](int from, int step) {
                for (int i = from; i < N_GROUPS; i += step) {
                    for (int attempt = 0;; ++attempt) {
                        try {
                            loader.wait(order[i]);
                            break;
                        } catch (const FileError &) {
                            if (mode != 3 || attempt > 10) { bad++; break; }
                        }
                    }
                }
            };
            std::thread other(waiter, 1, 2);
            waiter(0, 2);
            other.join();
            io_fault_clear();
            if (!loader.done()) bad++;
            failures += loader.stats().retries;
        }
        for (const auto & n : repack) {
            ggml_tensor * a = store->get(n), * b = ref->get(n);
            const bool placed = ref_bytes == 0 || store->home(n) == weight_home::repacked;
            if (!placed || std::memcmp(a->data, b->data, ggml_nbytes(a)) != 0) bad++;
            checked++;
        }
    }
    // cancel() as the workers start: a filler between its predicate and its sleep must still see the stop
    // (stop_ set without the mutex lost that wake-up and cancel() joined the filler forever)
    int quick = 0;
    for (int iter = 0; iter < 2000; ++iter) {
        auto store = std::make_shared<weight_store>(std::make_shared<gguf_file>(path));
        loader_params lp;
        lp.n_readers = 1 + iter % 2;
        lp.n_workers = 2;
        weight_loader loader(store, groups, repack, cpu, lp);
        if (iter % 3) std::this_thread::sleep_for(std::chrono::microseconds(iter % 50));
        loader.cancel();
        loader.wait(N_GROUPS - 1);
        const auto & n = repack[repack.size() - 1];
        if (std::memcmp(store->get(n)->data, ref->get(n)->data, ggml_nbytes(ref->get(n))) != 0) bad++;
        quick++;
    }
    unlink(path.c_str());
    printf("loader_stress: %d tensors checked, %d cancels (%d at start), %d retried loads, %d bad\n", checked,
           cancels, quick, failures, bad);
    return bad == 0 ? 0 : 1;
}
