// paged-tensor: ggml tensors whose storage is bound at run time.
//
// A paged tensor is a no-alloc ggml tensor (shape and type fixed, from the
// GGUF tensor table) whose `buffer`/`data` point at wherever its bytes are
// now: the read-only mmap of the GGUF file (CPU zero copy), a resident
// backend buffer, or (later) a pool slot. Binding is a pointer update, never
// a copy; graphs that reference the tensor read the new address at compute.
#pragma once

#include "buffer-pool.h"
#include "gguf-file.h"
#include "prefetch.h"

#include <future>

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

struct ggml_backend_buffer;
struct ggml_backend_buffer_type;
struct ggml_backend_device;

namespace superggml {

// Points `t` at `addr` inside `buffer` (no copy). Rebinding an already bound
// tensor is allowed. Throws Error if addr..addr+nbytes is outside the buffer.
void tensor_bind(ggml_tensor * t, ggml_backend_buffer * buffer, void * addr);
// Detaches `t` from its storage (data = nullptr); computing it then fails.
void tensor_unbind(ggml_tensor * t);

// Where a weight's bytes live.
enum class weight_home { unbound, mmap, resident, repacked };

// The weights of one GGUF file as paged tensors.
class weight_store {
public:
    // Takes shared ownership of `file`; tensors start unbound.
    explicit weight_store(std::shared_ptr<gguf_file> file);
    ~weight_store();

    const gguf_file & file() const { return *file_; }
    std::shared_ptr<gguf_file> file_ptr() const { return file_; }

    // The paged tensor named `name`; throws GGUFError if the file has none.
    ggml_tensor * get(const std::string & name) const;
    bool has(const std::string & name) const;
    weight_home home(const std::string & name) const;

    // Binds `names` (empty: all) to the file mapping: zero copy, CPU only.
    void bind_mmap(const std::vector<std::string> & names = {});

    // Copies `names` into one new buffer of `buft` (nullptr: CPU) and binds
    // them there. Returns the bytes allocated. Throws Error if the
    // allocation fails. I/O comes from the mapping (page faults).
    size_t load_resident(const std::vector<std::string> & names, ggml_backend_buffer_type * buft);

    // Re-lays `names` for the device's faster kernels (ggml-cpu "repack"
    // extra buffer types) where the device supports the matmul with the
    // re-laid weight, copying them from the mapping; others stay as they are.
    // Returns the bytes moved (0 if the device has no such buffer type).
    size_t load_repacked(const std::vector<std::string> & names, ggml_backend_device * dev);

    // The two halves of the loads above. place_*: allocates the buffers and
    // binds the tensors there, without their bytes (computing them before
    // fill() reads garbage); returns the names placed and adds the bytes
    // allocated to *bytes. fill(name): copies a placed tensor's bytes from the
    // mapping (page faults if not in the page cache); safe to call from several
    // threads for different tensors.
    std::vector<std::string> place_resident(const std::vector<std::string> & names, ggml_backend_buffer_type * buft,
                                            size_t * bytes = nullptr);
    std::vector<std::string> place_repacked(const std::vector<std::string> & names, ggml_backend_device * dev,
                                            size_t * bytes = nullptr);
    void fill(const std::string & name) const;

    // Bytes of weights per home.
    size_t bytes(weight_home h) const;

    // Absolute file offset and size of a tensor's bytes.
    std::pair<uint64_t, uint64_t> file_range(const std::string & name) const;

    // Splits a 2-D tensor into row ranges of at most `max_bytes` each, as new
    // paged tensors "<name>.rows<first row>" over the same file bytes (so a
    // tensor bigger than a pool slot can stream). Returns their names.
    std::vector<std::string> add_row_chunks(const std::string & name, size_t max_bytes);

private:
    struct entry {
        ggml_tensor * t = nullptr;
        uint64_t offset = 0, nbytes = 0;
        weight_home home = weight_home::unbound;
    };
    const entry & at(const std::string & name) const;

    std::shared_ptr<gguf_file> file_;
    ggml_context * views_ = nullptr;                   // row-chunk tensors
    ggml_backend_buffer * mmap_buf_ = nullptr;
    std::vector<ggml_backend_buffer *> resident_bufs_;
    std::unordered_map<std::string, entry> entries_;
};

// Bytes one slot of `buft` (nullptr: CPU) needs to hold `names`: back to
// back at the buffer alignment, or with `direct` (host buffers) in the file's
// own layout widened to O_DIRECT alignment. Throws GGUFError for an unknown name.
size_t layer_slot_bytes(const weight_store & store, const std::vector<std::string> & names,
                        ggml_backend_buffer_type * buft, bool direct = false);

struct pager_params {
    int n_slots = 1;
    size_t slot_size = 0;                      // 0: the largest layer
    int n_workers = 1;
    ggml_backend_buffer_type * buft = nullptr; // nullptr: CPU
    bool direct_io = false;                    // O_DIRECT reads into host slots (file layout, no page cache)
    bool staged = false;                       // host slots too go through staging + async copies (the device path)
};

struct pager_stats {
    uint64_t loads = 0, hits = 0, evictions = 0, bytes_loaded = 0;
    double wait_seconds = 0;                   // time acquire() blocked on I/O
};

// Streams groups of paged tensors ("layers") through a buffer pool.
//
// Each layer's tensors are laid out in one slot: back to back (buffer
// alignment), or with direct_io in the file's layout so O_DIRECT can read
// runs of them straight into the slot. prefetch(l) starts loading l into a slot in the background;
// acquire(l) waits for l's bytes and binds its tensors to the slot (a pointer
// swap); release(l) lets the slot be evicted again; pin(l) keeps l resident.
// When a slot is reused its old layer's tensors are unbound, so a stale
// binding can never be computed. Errors of a load (short read, I/O error)
// are thrown by acquire(). Not for concurrent callers: one executor drives it.
class layer_pager {
public:
    // Throws Error naming the bytes needed if a layer does not fit a slot.
    layer_pager(std::shared_ptr<weight_store> store, const std::vector<std::vector<std::string>> & layers,
                const pager_params & params);
    ~layer_pager();

    int n_layers() const { return (int) layers_.size(); }
    bool direct_io() const { return direct_ && io_->direct(); }   // O_DIRECT reads in use
    bool staged() const { return io_->staged() || !pool_->is_host(); }
    size_t layer_bytes(int l) const { return layers_.at(l).bytes; }
    const buffer_pool & pool() const { return *pool_; }

    // False (and nothing done) if no slot can be had right now.
    bool prefetch(int l, int priority = 0);
    void acquire(int l);
    void release(int l);
    void pin(int l);
    void unpin(int l);            // l stays in its slot but may be evicted again
    bool pinned(int l) const;
    bool resident(int l) const;   // bytes are in a slot (loaded or loading)

    // Frees one slot's memory (an empty slot first, else the least recently
    // used unpinned one, whose layer is unbound). False if every slot is in
    // use or pinned.
    bool shrink();
    // Allocates one more slot. Throws Error naming the bytes on failure.
    void grow();

    pager_stats stats() const;
    prefetch_stats io_stats() const { return io_->stats(); }
    bool last_load(int l, double & start, double & end) const { return io_->last_job(l, start, end); }

private:
    struct layer {
        std::vector<ggml_tensor *> tensors;
        std::vector<size_t> offsets;   // in the slot
        std::vector<read_range> ranges;
        size_t bytes = 0;
        int slot = -1;
        bool prefetch_hold = false;    // the pool's in-use count taken by prefetch()
        int holds = 0;
        bool bound = false;
        bool pinned = false;
        std::shared_future<void> ready;
    };
    void on_evict(int key);
    void settle(layer & L);            // wait for an in-flight load, swallowing its error

    std::shared_ptr<weight_store> store_;
    bool direct_ = false;
    std::vector<layer> layers_;
    std::unique_ptr<buffer_pool> pool_;
    std::unique_ptr<prefetcher> io_;
    pager_stats stats_;
};

}  // namespace superggml
