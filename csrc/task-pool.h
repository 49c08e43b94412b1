// task-pool: worker threads running queued tasks, highest priority first,
// then in submission order (FIFO).
//
// submit() queues a function under a caller-chosen key and returns a ticket:
// the job's id and a future that completes when the function returns, or
// holds the exception it threw (the worker carries on). cancel(key) and
// cancel_job(id) fail jobs that have not started with Cancelled; a running
// job always finishes. The destructor fails every queued job with Cancelled
// and joins the workers after their running jobs. Keys mean nothing to the
// pool: they name jobs for cancel() and last_job(), so each user keeps its own
// pool and key scheme. Thread safe.
#pragma once

#include "error.h"

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace superggml {

// A queued job was cancelled (or its pool stopped) before it ran
// (superggml.LoadCancelled in Python).
struct Cancelled : Error {
    using Error::Error;
};

struct task_stats {
    uint64_t completed = 0, failed = 0, cancelled = 0;
    double busy_seconds = 0;   // time spent running jobs, summed over workers
    size_t pending = 0;        // queued, not started
};

class task_pool {
public:
    // Starts n_workers threads; `what` names the jobs in Cancelled messages
    // ("<what> of key 3 cancelled"). Throws Error if n_workers < 1.
    explicit task_pool(int n_workers = 1, const std::string & what = "task");
    ~task_pool();
    task_pool(const task_pool &) = delete;
    task_pool & operator=(const task_pool &) = delete;

    struct ticket {
        uint64_t id;
        std::shared_future<void> done;
    };
    // Queues fn; larger priority runs first. Throws Cancelled if the pool is stopping.
    ticket submit(int key, int priority, std::function<void()> fn);
    bool cancel(int key);             // cancels every queued job for `key`; true if there was one
    bool cancel_job(uint64_t id);     // cancels that job if it has not started; true if it did
    task_stats stats() const;
    // Wall-clock start and end (seconds since the epoch) of the last finished
    // job for `key`; false if none has finished.
    bool last_job(int key, double & start, double & end) const;
    int n_workers() const { return (int) workers_.size(); }

    // Index of the calling thread among its pool's workers; -1 outside a worker.
    static int worker_index();

    struct entry {   // a queued job
        int key;
        int priority;
        uint64_t id;
        std::function<void()> fn;
        std::shared_ptr<std::promise<void>> done;
    };

private:
    void run(int index);
    template <typename Match> bool cancel_if(Match match);

    std::string what_;
    mutable std::mutex mu_;
    std::condition_variable cv_;
    std::vector<entry> queue_;
    std::vector<std::thread> workers_;
    bool stop_ = false;
    uint64_t next_id_ = 0;
    task_stats stats_;
    std::unordered_map<int, std::pair<double, double>> last_;   // key -> (start, end)
};

}  // namespace superggml
