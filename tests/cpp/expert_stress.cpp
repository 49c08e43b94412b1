// Stress test of the expert cache without Python, for ThreadSanitizer and
// ASan: 4 layers x 16 experts of three parts each in a scratch file, 6 slots,
// random routes of 1-3 experts mapped, checked byte for byte against the
// file while pinned, and random prefetches (the lookahead) in between.
#include "expert-cache.h"

#include "ggml.h"
#include "ggml-backend.h"

#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <unistd.h>
#include <vector>

using namespace superggml;

// direct: parts of whole O_DIRECT blocks behind a 100-byte header, each at its file offset's place inside a
// block of its own region of the slot (what ExpertPager.layout gives), read with O_DIRECT where /tmp allows it.
// tier: staged loads through a host tier of 20 experts (of 64), its done callbacks on the workers.
static int run(bool direct, bool tier = false) {
    const int n_layer = 4, n_expert = 16;
    const size_t head = direct ? 100 : 0;
    const size_t parts_b[3] = {1000, 1000, 1200}, off_b[3] = {0, 1024, 2048};
    const size_t parts_d[3] = {4096, 4096, 8192}, off_d[3] = {100, 8192 + 100, 16384 + 100};
    const size_t * parts = direct ? parts_d : parts_b;
    const size_t * part_off = direct ? off_d : off_b;
    const size_t slot_size = direct ? 28672 : 3300;
    const size_t layer_bytes = (parts[0] + parts[1] + parts[2]) * n_expert;
    char path[] = "/tmp/superggml-expertstress-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) return 2;
    std::mt19937 rnd(7);
    std::vector<uint8_t> file(head + layer_bytes * n_layer);
    for (auto & b : file) b = (uint8_t) rnd();
    if (write(fd, file.data(), file.size()) != (ssize_t) file.size()) return 2;
    close(fd);
    int bad = 0;
    {
        auto io = std::make_shared<prefetcher>(path, 2, direct, nullptr, tier);
        expert_cache_params p;
        p.n_slots = 6;
        p.slot_size = slot_size;
        p.direct = direct;
        p.host_slots = tier ? 20 : 0;
        expert_cache cache(p, io);
        auto base = [&](int l, int j) {   // file offset of part j's expert 0 in layer l
            size_t off = head + (size_t) l * layer_bytes;
            for (int i = 0; i < j; ++i) off += parts[i] * n_expert;
            return off;
        };
        for (int l = 0; l < n_layer; ++l) {
            std::vector<expert_cache::part> ps;
            for (int j = 0; j < 3; ++j) ps.push_back({base(l, j), parts[j], parts[j], part_off[j]});
            cache.set_layer(l, n_expert, ps);
            if (cache.layer_direct(l) != (direct && io->direct() && !tier)) bad++;
        }
        // the slots' bytes, read back through a view of the whole buffer
        ggml_init_params ip = { ggml_tensor_overhead(), nullptr, true };
        ggml_context * ctx = ggml_init(ip);
        ggml_tensor * view = ggml_new_tensor_3d(ctx, GGML_TYPE_I8, (int64_t) slot_size, 1, p.n_slots);
        cache.bind_view(view, 0);
        const auto * buf = static_cast<const uint8_t *>(view->data);
        const size_t stride = view->nb[2];
        for (int step = 0; step < 4000; ++step) {
            const int l = (int) (rnd() % n_layer);
            std::vector<int32_t> ids(1 + rnd() % 3), slots(ids.size());
            for (auto & e : ids) e = (int32_t) (rnd() % n_expert);
            auto pinned = cache.map(l, ids.data(), ids.size(), slots.data());
            for (size_t i = 0; i < ids.size(); ++i) {
                for (int j = 0; j < 3; ++j) {
                    const uint8_t * got = buf + (size_t) slots[i] * stride + part_off[j];
                    const uint8_t * want = file.data() + base(l, j) + (size_t) ids[i] * parts[j];
                    if (std::memcmp(got, want, parts[j]) != 0) bad++;
                }
            }
            if (rnd() % 2) cache.prefetch((l + 1) % n_layer, {(int) (rnd() % n_expert), (int) (rnd() % n_expert)});
            cache.release(pinned);
            // slots set aside (their pages released) and given back, with prefetches in flight
            if (step % 37 == 0) cache.set_active(3 + (int) (rnd() % 4));
        }
        expert_cache_stats st = cache.stats();
        std::printf("experts%s%s: hits %llu, misses %llu, prefetches %llu, prefetch hits %llu, evictions %llu, "
                    "direct loads %llu, tier hits %llu, bad %d\n", direct ? " (O_DIRECT)" : "", tier ? " (tier)" : "",
                    (unsigned long long) st.hits, (unsigned long long) st.misses,
                    (unsigned long long) st.prefetches, (unsigned long long) st.prefetch_hits,
                    (unsigned long long) st.evictions, (unsigned long long) st.direct_loads,
                    (unsigned long long) st.tier_hits, bad);
        if (st.misses == 0 || st.prefetch_hits == 0 || st.evictions == 0) bad++;
        if (direct && io->direct() && !tier && st.direct_loads != st.misses + st.prefetches) bad++;
        if (tier && (st.tier_hits == 0 || st.tier_slots != 20)) bad++;
        ggml_free(ctx);
    }
    unlink(path);
    return bad;
}

int main() {
    return run(false) == 0 && run(true) == 0 && run(false, true) == 0 && run(true, true) == 0 ? 0 : 1;
}
