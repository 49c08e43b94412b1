// Stress test of task_pool without Python, for ThreadSanitizer and ASan:
// four threads submit jobs (some throw) and cancel them by key and by id
// while three workers run them; every future must end exactly one way (ran,
// threw the job's error, or Cancelled) and the stats must add up. Then the
// order (priority, then FIFO) on one worker, and a pool destroyed with jobs
// still queued.
#include "task-pool.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <future>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

using namespace superggml;

struct job_error : std::runtime_error {
    using std::runtime_error::runtime_error;
};

static int stress() {
    const int n_threads = 4, n_jobs = 3000, n_keys = 64;
    std::atomic<int> ran{0}, threw{0}, cancelled{0}, bad{0};
    std::vector<std::atomic<int>> runs(n_threads * n_jobs);
    task_stats st;
    {
        task_pool pool(3);
        std::vector<std::thread> ts;
        for (int t = 0; t < n_threads; ++t) {
            ts.emplace_back([&, t] {
                std::mt19937 rnd(11 + t);
                std::vector<std::pair<int, task_pool::ticket>> mine;
                for (int i = 0; i < n_jobs; ++i) {
                    const int job = t * n_jobs + i, key = (int) (rnd() % n_keys);
                    const bool fail = rnd() % 7 == 0;
                    mine.emplace_back(job, pool.submit(key, (int) (rnd() % 4), [&, job, fail] {
                        if (task_pool::worker_index() < 0 || task_pool::worker_index() >= 3) bad++;
                        runs[job]++;
                        if (fail) throw job_error("job " + std::to_string(job));
                    }));
                    if (rnd() % 40 == 0) pool.cancel((int) (rnd() % n_keys));
                    if (rnd() % 10 == 0) pool.cancel_job(mine[rnd() % mine.size()].second.id);
                }
                for (auto & [job, tk] : mine) {
                    try {
                        tk.done.get();
                        ran++;
                        if (runs[job] != 1) bad++;
                    } catch (const job_error &) {
                        threw++;
                        if (runs[job] != 1) bad++;
                    } catch (const Cancelled &) {
                        cancelled++;
                        if (runs[job] != 0) bad++;
                    }
                }
            });
        }
        for (auto & th : ts) th.join();
        st = pool.stats();
    }
    const int total = n_threads * n_jobs;
    if (ran + threw + cancelled != total || st.completed != (uint64_t) ran || st.failed != (uint64_t) threw ||
        st.cancelled != (uint64_t) cancelled || st.pending != 0) {
        bad++;
    }
    std::printf("task_pool: ran %d threw %d cancelled %d bad %d\n", ran.load(), threw.load(), cancelled.load(),
                bad.load());
    return bad == 0 && cancelled > 0 && threw > 0 ? 0 : 1;
}

// One worker, held by a gate job (the highest priority: it runs first): the queued jobs then run by priority, then FIFO.
static int order() {
    std::vector<int> seen;
    std::promise<void> gate;
    std::shared_future<void> open = gate.get_future().share();
    task_pool pool(1);
    auto g = pool.submit(-1, 100, [open] { open.wait(); });
    std::vector<task_pool::ticket> tk;
    const int prio[] = {0, 2, 1, 2, 0, 1};
    for (int i = 0; i < 6; ++i) tk.push_back(pool.submit(i, prio[i], [&seen, i] { seen.push_back(i); }));
    const bool cancelled = pool.cancel(4);
    gate.set_value();
    for (auto & t : tk) { try { t.done.get(); } catch (const Cancelled &) {} }
    g.done.get();
    double a = 0, b = 0;
    const bool timed = pool.last_job(3, a, b) && b >= a && !pool.last_job(4, a, b);
    const std::vector<int> want = {1, 3, 2, 5, 0};
    std::printf("task_pool order: %s\n", seen == want && cancelled && timed ? "ok" : "wrong");
    return seen == want && cancelled && timed ? 0 : 1;
}

// Destroying the pool fails the queued jobs with Cancelled; the running one finishes.
static int shutdown() {
    std::vector<task_pool::ticket> tk;
    std::atomic<int> ran{0};
    {
        task_pool pool(2);
        for (int i = 0; i < 200; ++i) {
            tk.push_back(pool.submit(i, 0, [&ran] {
                std::this_thread::sleep_for(std::chrono::microseconds(50));
                ran++;
            }));
        }
        while (ran == 0) std::this_thread::yield();
    }
    int done = 0, cancelled = 0;
    for (auto & t : tk) {
        try { t.done.get(); done++; } catch (const Cancelled &) { cancelled++; }
    }
    std::printf("task_pool shutdown: ran %d cancelled %d\n", done, cancelled);
    return done == ran && done > 0 && cancelled > 0 && done + cancelled == 200 ? 0 : 1;
}

int main() {
    int rc = 0;
    rc |= stress();
    rc |= order();
    rc |= shutdown();
    return rc;
}
