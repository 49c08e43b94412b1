// kv-cache: a paged K/V cache whose pages live in three tiers.
//
// Each (sequence, layer) has K and V rows for its tokens, cut into pages of
// `page_size` tokens. The device holds `n_frames` frames; a frame is one
// layer's K and V laid out exactly as the contiguous cache the attention
// graph reads (K F16 [n_embd_gqa, n_ctx]; V F16 [n_ctx, n_embd_gqa] when
// transposed, else like K), so graphs are the same as without paging.
// acquire(seq, layer) binds the layer's K/V tensors to a frame holding that
// (seq, layer), filling it from the pages when it was not there (layers below
// n_frames - n_stream own a frame each; the rest share the n_stream others,
// least recently used first, so cycling through the layers never thrashes
// the resident ones; with n_frames >= n_layer every (sequence, layer) uses
// any frame, least recently used first, so n_layer frames per active
// sequence keep them all on the device); release()
// marks the pages the step wrote dirty. When a frame is taken for another
// (seq, layer), its dirty pages are written back first: to host memory (a
// byte budget; page buffers allocated on demand), and when the host budget
// is full the least recently used host pages go to a spill file in
// `spill_dir` (written only if changed since their last spill). With
// n_frames >= the (seq, layer) pairs in use, pages never leave the device.
//
// Host and disk pages are stored as [K rows: page_size x n_embd_gqa]
// [V: page_size x n_embd_v_gqa, or n_embd_v_gqa x page_size when transposed].
// A cache of K only (has_v false: a latent K/V, whose V is read from K) has
// no V tensors, and its frames and pages hold the K rows alone.
// Failure (spill file unwritable, disk full, budget exhausted with no spill
// dir) throws before anything is dropped: a frame or host page is released
// only after its bytes are safe elsewhere. The spill file is unlinked when
// the cache is destroyed. Driven by one thread; prefetch fills run on the
// workers of a task_pool given to it, one job per (seq, layer) under the key
// seq * n_layer + layer (non-negative; the pool should be the cache's own).
#pragma once

#include "error.h"
#include "io.h"
#include "task-pool.h"

#include <cstddef>
#include <cstdint>
#include <deque>
#include <future>
#include <map>
#include <set>
#include <string>
#include <vector>

struct ggml_tensor;
struct ggml_backend_buffer;
struct ggml_backend_buffer_type;

namespace superggml {

// Tokens per KV page: page_size must lie in KV_PAGE_MIN..KV_PAGE_MAX.
constexpr int KV_PAGE_MIN = 16, KV_PAGE_MAX = 8192;

struct kv_params {
    int n_layer = 0;
    int64_t n_embd_gqa = 0;         // K channels per token
    int64_t n_embd_v_gqa = 0;       // V channels per token; 0: as K's
    int64_t n_ctx = 0;              // tokens a frame holds
    size_t k_row = 0;               // bytes of one token's K (ggml_row_size of the K type, n_embd_gqa)
    size_t v_row = 0;               // and of its V (n_embd_v_gqa); 0: as k_row
    bool has_v = true;              // false: K only (a latent K/V, whose V is read from K): no V tensors
    bool v_trans = true;            // V stored transposed, as the non-flash attention graph reads it (a V type
                                    // of whole elements only: F32, F16, BF16)
    int page_size = 256;            // tokens per page, KV_PAGE_MIN..KV_PAGE_MAX
    int n_frames = 0;               // frames on the device (0: n_layer; more: for several sequences)
    int n_stream = 1;               // of those, frames the other layers stream through when n_frames < n_layer;
                                    // the first n_frames - n_stream layers keep a frame of their own
    size_t host_budget = SIZE_MAX;  // bytes of host pages
    std::string spill_dir;          // empty: no disk tier
    ggml_backend_buffer_type * buft = nullptr;   // frames' buffer type (nullptr: CPU)
};

struct kv_stats {
    uint64_t pages_device = 0, pages_host = 0, pages_disk = 0;   // now
    uint64_t pages_loaded = 0;       // filled into frames (from host or disk)
    uint64_t pages_prefetched = 0;   // of those, by a worker ahead of use
    uint64_t pages_written_back = 0; // dirty pages copied out of frames
    uint64_t pages_evicted = 0;      // host pages moved to disk
    uint64_t pages_spilled = 0;      // pages written to the spill file
    uint64_t frame_hits = 0, frame_misses = 0;
    uint64_t pages_forgotten = 0;    // pages freed by seq_forget (sliding-window layers)
    uint64_t tokens = 0, token_slots = 0;   // cached tokens, and the slots of the pages held for them
    size_t host_bytes = 0, disk_bytes = 0, frame_bytes = 0;
    int n_frames = 0;
    int n_resident_layers = 0;       // layers with a frame of their own
};

class kv_cache {
public:
    // k[l], v[l]: layer l's no-alloc K/V tensors (the shapes above), bound to
    // frames by acquire(). `workers` runs prefetch fills (nullptr: prefetch()
    // fills on the calling thread); it must outlive the cache. Throws Error
    // for a page size outside KV_PAGE_MIN..KV_PAGE_MAX, FileError if the
    // spill file cannot be created, Error if the frames cannot be allocated.
    kv_cache(const kv_params & params, std::vector<ggml_tensor *> k, std::vector<ggml_tensor *> v,
             task_pool * workers);
    ~kv_cache();
    kv_cache(const kv_cache &) = delete;
    kv_cache & operator=(const kv_cache &) = delete;

    // Binds layer's K/V to a frame holding rows [0, n_valid) of (seq, layer). With k and v given (tensors of
    // the layer's K/V shape and type: another sequence's lane of the same pass), binds those instead. Throws
    // Error when every frame that may hold the layer is in use.
    void acquire(int seq, int layer, int64_t n_valid, ggml_tensor * k = nullptr, ggml_tensor * v = nullptr);
    // The step wrote rows [.., n_end) of (seq, layer): their pages are dirty.
    void release(int seq, int layer, int64_t n_end);
    // Starts filling a frame for (seq, layer) on a worker; false if no frame is free.
    bool prefetch(int seq, int layer, int64_t n_valid);
    // Forgets tokens >= n of `seq` (n = 0: the whole sequence), freeing their pages.
    void seq_truncate(int seq, int64_t n);
    // Frees the pages of (seq, layer) that lie wholly below token n_first: the keys a sliding-window layer's
    // later queries never see. Their host and disk bytes go; a frame filled later leaves their rows as they
    // are (finite; the window's mask hides them). Truncating back into them is the caller's concern.
    void seq_forget(int seq, int layer, int64_t n_first);

    kv_stats stats() const;
    size_t page_bytes() const { return page_bytes_; }
    const kv_params & params() const { return p_; }
    // Layer l's K and V tensors (bound to a frame between acquire and release).
    ggml_tensor * k(int l) const { return k_.at(l); }
    ggml_tensor * v(int l) const { return p_.has_v ? v_.at(l) : nullptr; }   // nullptr: K only

private:
    struct page {
        uint8_t * host = nullptr;
        int64_t disk = -1;           // offset in the spill file
        bool host_newer = false;     // host bytes changed since the disk copy
        bool forgotten = false;      // freed by seq_forget: holds nothing
        int pins = 0;                // fills reading the host bytes
        uint64_t last_use = 0;
    };
    struct frame {
        ggml_backend_buffer * buf = nullptr;
        int seq = -1, layer = -1;
        int in_use = 0;
        uint64_t last_use = 0;
        std::vector<char> dirty;     // per page index
        std::shared_future<void> fill;
        std::vector<page *> pinned;  // host pages a pending fill reads
        int64_t valid = 0;           // rows held when acquired: the step writes from here
    };
    std::deque<page> & pages_of(int seq, int layer);   // stable references as it grows
    int find_frame(int seq, int layer) const;
    int take_frame(int layer);       // a free or evictable frame for `layer`, written back; -1 if none
    void settle(frame & f);          // waits for a pending fill; rethrows its error
    void write_back(frame & f);
    void start_fill(frame & f, int seq, int layer, int64_t n_valid, bool async);
    void bind(const frame & f, ggml_tensor * k, ggml_tensor * v);
    void store_page(frame & f, int64_t idx, page & pg);   // frame -> host (or disk)
    bool make_host_room(size_t bytes);
    void spill(page & pg);           // host -> disk, then frees the host bytes
    void disk_write(page & pg, const uint8_t * bytes);
    int64_t disk_alloc();
    void disk_free(page & pg);
    void free_page(page & pg);
    void touch(page & pg);           // a new last use (each its own tick: the LRU order has no ties)
    // page <-> frame copies; `to_frame` picks the direction
    void copy_page(frame & f, int64_t idx, uint8_t * page_bytes, bool to_frame) const;
    int64_t layer_tokens(int seq, int layer) const;
    void set_layer_tokens(int seq, int layer, int64_t n);

    kv_params p_;
    std::vector<ggml_tensor *> k_, v_;
    task_pool * workers_;
    size_t k_bytes_ = 0, v_off_ = 0, frame_size_ = 0, page_bytes_ = 0;
    int n_resident_ = 0;             // frames [0, n_resident_) belong to layers [0, n_resident_)
    std::vector<frame> frames_;
    std::map<int, std::vector<std::deque<page>>> seqs_;   // seq -> layer -> pages
    std::map<int, std::vector<int64_t>> layer_tokens_;     // seq -> layer -> cached tokens
    std::string spill_path_;
    io_fd spill_fd_;
    int64_t spill_end_ = 0;
    std::vector<int64_t> spill_free_;
    size_t host_bytes_ = 0;
    std::set<std::pair<uint64_t, page *>> host_lru_;   // pages with host bytes, least recently used first
    uint64_t clock_ = 0;
    kv_stats st_;
};

}  // namespace superggml
