#include "task-pool.h"

#include <algorithm>
#include <chrono>

namespace superggml {

static thread_local int tls_worker = -1;

int task_pool::worker_index() { return tls_worker; }

task_pool::task_pool(int n_workers, const std::string & what) : what_(what) {
    if (n_workers < 1) throw Error("a " + what + " pool needs at least one worker");
    for (int i = 0; i < n_workers; ++i) workers_.emplace_back([this, i] { run(i); });
}

task_pool::~task_pool() {
    {
        std::lock_guard<std::mutex> lk(mu_);
        stop_ = true;
        for (auto & e : queue_) e.done->set_exception(std::make_exception_ptr(Cancelled("the " + what_ + " pool stopped")));
        queue_.clear();
    }
    cv_.notify_all();
    for (auto & t : workers_) t.join();
}

task_pool::ticket task_pool::submit(int key, int priority, std::function<void()> fn) {
    auto done = std::make_shared<std::promise<void>>();
    ticket t{0, done->get_future().share()};
    {
        std::lock_guard<std::mutex> lk(mu_);
        if (stop_) throw Cancelled("the " + what_ + " pool stopped");
        t.id = next_id_++;
        queue_.push_back({key, priority, t.id, std::move(fn), done});
    }
    cv_.notify_one();
    return t;
}

template <typename Match>
bool task_pool::cancel_if(Match match) {
    std::lock_guard<std::mutex> lk(mu_);
    size_t n = 0;
    for (auto it = queue_.begin(); it != queue_.end();) {
        if (match(*it)) {
            it->done->set_exception(std::make_exception_ptr(
                Cancelled(what_ + " of key " + std::to_string(it->key) + " cancelled")));
            it = queue_.erase(it);
            ++n;
        } else {
            ++it;
        }
    }
    stats_.cancelled += n;
    return n > 0;
}

bool task_pool::cancel(int key) { return cancel_if([&](const entry & e) { return e.key == key; }); }

bool task_pool::cancel_job(uint64_t id) { return cancel_if([&](const entry & e) { return e.id == id; }); }

task_stats task_pool::stats() const {
    std::lock_guard<std::mutex> lk(mu_);
    task_stats s = stats_;
    s.pending = queue_.size();
    return s;
}

bool task_pool::last_job(int key, double & start, double & end) const {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = last_.find(key);
    if (it == last_.end()) return false;
    start = it->second.first;
    end = it->second.second;
    return true;
}

void task_pool::run(int index) {
    tls_worker = index;
    for (;;) {
        entry e;
        {
            std::unique_lock<std::mutex> lk(mu_);
            cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
            if (stop_) return;
            auto it = std::min_element(queue_.begin(), queue_.end(), [](const entry & a, const entry & b) {
                return a.priority != b.priority ? a.priority > b.priority : a.id < b.id;
            });
            e = std::move(*it);
            queue_.erase(it);
        }
        const auto t0 = std::chrono::steady_clock::now();
        const double wall0 = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
        std::exception_ptr err;
        try {
            e.fn();
        } catch (...) {
            err = std::current_exception();
        }
        e.fn = nullptr;   // the job's captures go before its future completes
        const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        {
            std::lock_guard<std::mutex> lk(mu_);
            stats_.busy_seconds += dt;
            last_[e.key] = {wall0, wall0 + dt};
            (err ? stats_.failed : stats_.completed)++;
        }
        if (err) e.done->set_exception(err); else e.done->set_value();
    }
}

}  // namespace superggml
