#pragma once
// The CPU backend's one process-wide thread pool. Kernels split their work
// with parallel_for; the caller participates, idle workers spin briefly and
// then park on a condition variable so that an idle process uses no CPU.
// Submissions from several threads are serialized by a try-lock: a thread
// that finds the pool busy (or calls from inside a task) runs its work
// inline instead of waiting, which also makes nesting deadlock-free.
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace rlx::backends::cpu {

// A non-owning reference to a callable, so that submitting work never allocates.
template <class Sig>
class FunctionRef;
template <class R, class... A>
class FunctionRef<R(A...)> {
 public:
  template <class F, class = std::enable_if_t<!std::is_same_v<std::decay_t<F>, FunctionRef>>>
  FunctionRef(F&& f)  // NOLINT(google-explicit-constructor): used like a function parameter
      : obj_(const_cast<void*>(static_cast<const void*>(std::addressof(f)))), call_([](void* o, A... a) -> R {
          return (*static_cast<std::remove_reference_t<F>*>(o))(std::forward<A>(a)...);
        }) {}
  R operator()(A... a) const { return call_(obj_, std::forward<A>(a)...); }

 private:
  void* obj_;
  R (*call_)(void*, A...);
};

class ThreadPool {
 public:
  // `threads` counts the caller: a pool of 1 has no workers and runs everything inline.
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // The process-wide pool, sized to the CPUs this process may run on.
  static ThreadPool& instance();

  int size() const { return static_cast<int>(workers_.size()) + 1; }
  // Runs task(i) for every i in [0, n) on up to `max_threads` threads (0: all),
  // the caller included, and returns when all have run. The first exception a
  // task throws is rethrown here (the remaining tasks are skipped).
  void run(std::int64_t n, FunctionRef<void(std::int64_t)> task, int max_threads = 0);
  // The calling thread's scratch slot in [0, size()): a worker's index inside
  // a task, 0 on any other thread. Work that runs inline keeps its thread's slot.
  static int slot();
  // Number of workers currently parked (for tests).
  int parked() const { return sleepers_.load(); }

 private:
  void worker_main(int index);
  void execute(std::uint32_t gen);

  static constexpr std::uint64_t kClosed = 0xffffffffu;
  std::vector<std::thread> workers_;
  std::mutex submit_;
  // The current job. `ticket_` packs (generation << 32 | next task index); a
  // task is claimed by a CAS on it, which also proves the fields read before
  // belong to that generation (they are rewritten only under a new one).
  std::atomic<std::uint64_t> ticket_{kClosed};
  std::atomic<const FunctionRef<void(std::int64_t)>*> fn_{nullptr};
  std::atomic<std::int64_t> n_{0};
  std::atomic<int> max_threads_{0};
  std::atomic<std::int64_t> done_{0};
  std::atomic<bool> failed_{false};
  std::exception_ptr error_;
  std::uint32_t gen_ = 0;
  // Parking.
  std::mutex park_mu_;
  std::condition_variable park_cv_;
  std::atomic<int> sleepers_{0};
  std::atomic<bool> stop_{false};
};

// Splits [0, n) into chunks of at least `grain` (a few per thread, for balance)
// and runs fn(begin, end) over them on the process-wide pool.
template <class F>
void parallel_for(std::int64_t n, std::int64_t grain, F&& fn, int max_threads = 0) {
  if (n <= 0) return;
  grain = std::max<std::int64_t>(grain, 1);
  ThreadPool& pool = ThreadPool::instance();
  int threads = max_threads > 0 ? std::min(max_threads, pool.size()) : pool.size();
  std::int64_t chunks = (n + grain - 1) / grain;
  if (threads <= 1 || chunks <= 1) {
    fn(std::int64_t(0), n);
    return;
  }
  std::int64_t tasks = std::min<std::int64_t>(chunks, std::int64_t(threads) * 4);
  std::int64_t per = (chunks + tasks - 1) / tasks * grain;
  tasks = (n + per - 1) / per;
  pool.run(
      tasks, [&](std::int64_t t) { fn(t * per, std::min(n, (t + 1) * per)); }, threads);
}

}  // namespace rlx::backends::cpu
