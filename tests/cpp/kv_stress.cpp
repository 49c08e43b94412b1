// Stress test of the paged KV cache without Python, for ThreadSanitizer:
// sequences grow, get truncated and dropped in random order through 3 frames,
// a host budget of a few pages and a spill file, with worker fills ahead of
// use; every acquire must show exactly the rows written before (checked
// against a shadow copy, K rows and transposed V). Layers 1 and 3 slide over
// a window of W tokens: each pass frees their pages below it (seq_forget), and
// only the rows still held are checked; truncating before them drops the
// sequence, as the executor does. Run three times: with V as wide as K, with
// a narrower V (deepseek2's legacy MHA), and with K only (a latent K/V).
#include "kv-cache.h"

#include "ggml.h"
#include "ggml-backend.h"

#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <unistd.h>
#include <vector>

using namespace superggml;

static int stress(bool has_v, int64_t gv) {
    const int n_layer = 4, n_seq = 3;
    const int64_t g = 8, n_ctx = 96, P = 16, row = g + gv;    // a token's shadow: K, then V
    ggml_init_params ip = { 2 * n_layer * ggml_tensor_overhead(), nullptr, true };
    ggml_context * ctx = ggml_init(ip);
    std::vector<ggml_tensor *> k, v;
    for (int l = 0; l < n_layer; ++l) {
        k.push_back(ggml_new_tensor_2d(ctx, GGML_TYPE_F32, g, n_ctx));
        v.push_back(ggml_new_tensor_2d(ctx, GGML_TYPE_F32, gv, n_ctx));
    }
    char dir[] = "/tmp/superggml-kvstress-XXXXXX";
    if (!mkdtemp(dir)) return 2;
    int bad = 0, steps = 0;
    {
        task_pool workers(2);
        kv_params p;
        p.n_layer = n_layer;
        p.n_embd_gqa = g;
        p.n_embd_v_gqa = gv;
        p.n_ctx = n_ctx;
        p.k_row = (size_t) g * 4;
        p.v_row = (size_t) gv * 4;
        p.page_size = (int) P;
        p.n_frames = 3;
        p.host_budget = 5 * P * row * 4;
        p.spill_dir = dir;
        p.has_v = has_v;
        kv_cache kv(p, k, has_v ? v : std::vector<ggml_tensor *>{}, &workers);
        std::mt19937 rnd(3);
        std::map<std::pair<int, int>, std::vector<float>> shadow;   // (seq, layer) -> n x [k g, v g]
        std::vector<int64_t> n_past(n_seq, 0), floor(n_seq, 0);
        const int64_t W = 20;
        auto slides = [](int l) { return l % 2 == 1; };
        for (int step = 0; step < 3000; ++step) {
            const int seq = (int) (rnd() % n_seq);
            if (rnd() % 12 == 0) {
                int64_t n = (int64_t) (rnd() % (n_past[seq] + 1));
                if (floor[seq] > std::max<int64_t>(0, n - W + 1)) n = 0;   // the window's keys are gone
                if (n == 0) floor[seq] = 0;
                kv.seq_truncate(seq, n);
                n_past[seq] = n;
                for (int l = 0; l < n_layer; ++l) {
                    auto & s = shadow[{seq, l}];
                    s.resize(std::min<size_t>(s.size(), (size_t) (n * row)));
                }
                continue;
            }
            const int64_t p0 = n_past[seq], n = 1 + (int64_t) (rnd() % 23);
            if (p0 + n > n_ctx) continue;
            if (p0 - W + 1 > 0) {
                for (int l = 0; l < n_layer; ++l) if (slides(l)) kv.seq_forget(seq, l, p0 - W + 1);
                floor[seq] = std::max(floor[seq], (p0 - W + 1) / P * P);
            }
            for (int l = 0; l < n_layer; ++l) {
                kv.acquire(seq, l, p0);
                if (rnd() % 2 && l + 1 < n_layer) kv.prefetch(seq, l + 1, p0);
                auto * kd = static_cast<float *>(k[l]->data);
                auto * vd = has_v ? static_cast<float *>(v[l]->data) : nullptr;
                auto & s = shadow[{seq, l}];
                for (int64_t t = slides(l) ? floor[seq] : 0; t < p0; ++t) {
                    for (int64_t c = 0; c < g; ++c) if (kd[t * g + c] != s[t * row + c]) bad++;
                    for (int64_t c = 0; vd && c < gv; ++c) if (vd[c * n_ctx + t] != s[t * row + g + c]) bad++;
                }
                for (int64_t t = p0; t < p0 + n; ++t) {
                    s.resize((size_t) ((t + 1) * row));
                    for (int64_t c = 0; c < g; ++c) {
                        const float a = (float) (rnd() % 100000);
                        kd[t * g + c] = a;
                        s[t * row + c] = a;
                    }
                    for (int64_t c = 0; vd && c < gv; ++c) {
                        const float b = (float) (rnd() % 100000);
                        vd[c * n_ctx + t] = b;
                        s[t * row + g + c] = b;
                    }
                }
                kv.release(seq, l, p0 + n);
            }
            n_past[seq] = p0 + n;
            steps++;
        }
        kv_stats st = kv.stats();
        std::printf("kv (%s, V of %lld): steps %d, loaded %llu, prefetched %llu, spilled %llu, evicted %llu, forgotten %llu, bad %d\n",
                    has_v ? "K and V" : "K only", (long long) gv, steps, (unsigned long long) st.pages_loaded, (unsigned long long) st.pages_prefetched,
                    (unsigned long long) st.pages_spilled, (unsigned long long) st.pages_evicted,
                    (unsigned long long) st.pages_forgotten, bad);
        if (st.pages_prefetched == 0 || st.pages_spilled == 0 || st.pages_forgotten == 0) bad++;
    }
    const bool left = rmdir(dir) != 0;   // the spill file must be gone
    if (left) std::printf("kv: the spill file was left behind\n");
    ggml_free(ctx);
    return bad == 0 && !left ? 0 : 1;
}

int main() {
    return stress(true, 8) | stress(true, 4) | stress(false, 0);
}
