#include "weight-loader.h"

#include "io.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fcntl.h>
#include <set>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace superggml {

namespace {
constexpr uint64_t PAGE = 4096;
constexpr uint64_t MERGE_GAP = 256u << 10;   // read across gaps this small rather than split a range

double now() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Runs f; its exception, if any, is returned rather than thrown (it travels to whoever waits for the group).
template <typename F> std::exception_ptr attempt(F && f) {
    try {
        f();
    } catch (...) {
        return std::current_exception();
    }
    return nullptr;
}
}  // namespace

weight_loader::weight_loader(std::shared_ptr<weight_store> store, const std::vector<std::vector<std::string>> & groups,
                             const std::vector<std::string> & repack, ggml_backend_device * dev,
                             const loader_params & params)
    : store_(std::move(store)), params_(params) {
    if (params_.chunk < PAGE) params_.chunk = PAGE;
    params_.chunk = params_.chunk / PAGE * PAGE;
    store_->bind_mmap();
    std::set<std::string> placed;
    if (params_.repack && dev) {
        for (auto & n : store_->place_repacked(repack, dev, &repacked_bytes_)) placed.insert(n);
    }
    const uint64_t file_end = (store_->file().file_size() + PAGE - 1) / PAGE * PAGE;
    std::set<std::string> seen;
    auto add_group = [&](const std::vector<std::string> & names) {
        group G;
        std::vector<std::pair<uint64_t, uint64_t>> r;
        for (const auto & n : names) {
            auto [off, nb] = store_->file_range(n);   // GGUFError for an unknown name
            r.push_back({off / PAGE * PAGE, std::min(file_end, (off + nb + PAGE - 1) / PAGE * PAGE)});
            if (placed.count(n) && seen.insert(n).second) G.fill.push_back(n);
        }
        std::sort(r.begin(), r.end());
        for (const auto & x : r) {
            if (!G.ranges.empty() && x.first <= G.ranges.back().second + MERGE_GAP) {
                G.ranges.back().second = std::max(G.ranges.back().second, x.second);
            } else {
                G.ranges.push_back(x);
            }
        }
        groups_.push_back(std::move(G));
    };
    for (const auto & g : groups) add_group(g);
    std::vector<std::string> rest;
    for (const auto & n : placed) if (!seen.count(n)) rest.push_back(n);
    if (!rest.empty()) add_group(rest);

    fd_.reset(::open(store_->file().path().c_str(), O_RDONLY | O_CLOEXEC));
    t_start_ = now();
    for (int i = 0; i < std::max(1, params_.n_readers); ++i) threads_.emplace_back([this] { reader(); });
    if (!placed.empty()) {
        for (int i = 0; i < std::max(1, params_.n_workers); ++i) threads_.emplace_back([this] { filler(); });
    }
}

weight_loader::~weight_loader() {
    cancel();
}

void weight_loader::cancel() {
    // under the mutex: a filler between its predicate and its sleep would miss the notify and never wake
    { std::lock_guard<std::mutex> lk(mu_); stop_ = true; }
    cv_.notify_all();
    for (auto & t : threads_) if (t.joinable()) t.join();
    threads_.clear();
}

// Reads [off, end) of the file into the page cache: populate the mapping, else pread into a scratch buffer.
static void read_range(const uint8_t * map, int fd, uint64_t file_size, uint64_t off, uint64_t end,
                       std::atomic<bool> & no_populate, std::vector<uint8_t> & scratch) {
    while (off < end) {
        if (!no_populate) {
            ssize_t n = io_populate(map + off, end - off);
            if (n >= 0) { off += (uint64_t) n; continue; }
            const int e = errno;
            if (e == EINTR) continue;
            if (e == EFAULT || e == EIO) {
                throw FileError("cannot read the model file at offset " + std::to_string(off) + ": " +
                                (e == EFAULT ? std::string("the file was truncated") : std::strerror(e)), EIO);
            }
            no_populate = true;       // EINVAL/ENOSYS/...: a kernel without MADV_POPULATE_READ
        }
        if (fd < 0) throw FileError("cannot open the model file for reading", EIO);
        end = std::min(end, file_size);    // ranges end at a page boundary; the file may not
        if (off >= end) break;
        if (scratch.empty()) scratch.resize(4u << 20);
        const size_t n = (size_t) std::min<uint64_t>(scratch.size(), end - off);
        io_pread_all(fd, scratch.data(), n, (off_t) off, "the model file");
        off += n;
    }
}

bool weight_loader::read(group & G, bool cancellable) {
    const uint8_t * map = store_->file().map();
    if (!map) throw Error("the GGUF file is closed");
    std::vector<uint8_t> scratch;
    for (const auto & [start, end] : G.ranges) {
        for (uint64_t off = start; off < end; off += params_.chunk) {
            if (cancellable && stop_) return false;
            const uint64_t stop = std::min(end, off + params_.chunk);
            read_range(map, fd_.get(), store_->file().file_size(), off, stop, no_populate_, scratch);
            bytes_read_ += stop - off;
        }
    }
    return true;
}

bool weight_loader::fill(group & G, bool cancellable) {
    const uint8_t * map = store_->file().map();
    for (const auto & n : G.fill) {
        if (cancellable && stop_) return false;
        store_->fill(n);
        // the re-laid copy is the one in use: unmap the file pages only it covered (as llama.cpp unmaps the
        // fragments it copied), so they leave this process's RSS; the page cache keeps them, clean
        auto [off, nb] = store_->file_range(n);
        const uint64_t a = (off + PAGE - 1) / PAGE * PAGE, b = (off + nb) / PAGE * PAGE;
        if (b > a) ::madvise(const_cast<uint8_t *>(map) + a, b - a, MADV_DONTNEED);
    }
    return true;
}

void weight_loader::finish(group & G, std::exception_ptr err) {
    G.state = err ? 3 : 2;
    G.error = err;
    if (!err && ++n_done_ == groups_.size()) t_done_ = now();
    cv_.notify_all();
}

void weight_loader::reader() {
    for (;;) {
        size_t g;
        {
            std::lock_guard<std::mutex> lk(mu_);
            if (stop_ || next_read_ >= groups_.size()) return;
            g = next_read_++;
            if (groups_[g].state != 0) continue;
            groups_[g].state = 1;
        }
        group & G = groups_[g];
        bool finished = true;
        std::exception_ptr err = attempt([&] { finished = read(G, true); });
        std::lock_guard<std::mutex> lk(mu_);
        G.read = finished && !err;
        if (err || (finished && G.fill.empty())) {
            finish(G, err);
        } else {
            G.state = 0;               // a filler takes it from here (or wait(), after a cancel)
            cv_.notify_all();
        }
    }
}

void weight_loader::filler() {
    // below the threads that compute (and build the tokenizer): they are the critical path of a cold start,
    // the fillers use what is left of the cores
    if (params_.nice > 0) setpriority(PRIO_PROCESS, (id_t) syscall(SYS_gettid), params_.nice);
    for (;;) {
        size_t g;
        std::unique_lock<std::mutex> lk(mu_);
        if (stop_ || next_fill_ >= groups_.size()) return;
        g = next_fill_++;
        group & G = groups_[g];
        if (G.fill.empty()) continue;
        cv_.wait(lk, [&] { return stop_ || G.state >= 2 || (G.state == 0 && G.read); });
        if (stop_ || G.state != 0) continue;   // failed, or loaded by wait()
        G.state = 1;
        lk.unlock();
        bool finished = true;
        std::exception_ptr err = attempt([&] { finished = fill(G, true); });
        lk.lock();
        if (err || finished) {
            finish(G, err);
        } else {
            G.state = 0;
            cv_.notify_all();
        }
    }
}

void weight_loader::wait(int g) {
    group & G = groups_.at((size_t) g);
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return G.state >= 2 || (G.state == 0 && stop_); });
    if (G.state == 2) return;
    const bool retry = G.state == 3, need_read = !G.read;
    G.state = 1;                       // loaded here, now: a failed load once more, or one cancelled
    lk.unlock();
    std::exception_ptr err = attempt([&] {
        if (need_read) read(G, false);
        fill(G, false);
    });
    lk.lock();
    if (retry) retries_++;
    G.read = !err;
    finish(G, err);
    if (err) std::rethrow_exception(err);
}

void weight_loader::wait_all() {
    for (int g = 0; g < n_groups(); ++g) wait(g);
}

bool weight_loader::done() const {
    std::lock_guard<std::mutex> lk(mu_);
    return n_done_ == groups_.size();
}

loader_stats weight_loader::stats() const {
    std::lock_guard<std::mutex> lk(mu_);
    loader_stats s;
    s.bytes_read = bytes_read_;
    s.bytes_repacked = repacked_bytes_;
    s.retries = retries_;
    s.groups_done = (int) n_done_;
    for (const auto & G : groups_) s.groups_failed += G.state == 3;
    s.seconds = t_done_ > 0 ? t_done_ - t_start_ : 0;
    return s;
}

}  // namespace superggml
