#include "backends/cpu/thread_pool.hpp"

#include <sched.h>

#include <chrono>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define RLX_CPU_RELAX() _mm_pause()
#else
#define RLX_CPU_RELAX() std::this_thread::yield()
#endif

namespace rlx::backends::cpu {

namespace {
thread_local int tl_slot = 0;
thread_local bool tl_in_task = false;
// How long an idle worker polls for the next job before parking: long enough
// to bridge the gap between consecutive kernels of one run, short enough that
// an idle process goes quiet at once.
constexpr auto kSpin = std::chrono::microseconds(100);

struct TaskScope {
  bool saved = tl_in_task;
  TaskScope() { tl_in_task = true; }
  ~TaskScope() { tl_in_task = saved; }
};
}  // namespace

ThreadPool::ThreadPool(int threads) {
  for (int i = 1; i < std::max(threads, 1); ++i) workers_.emplace_back([this, i] { worker_main(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(park_mu_);
    stop_.store(true);
  }
  park_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

namespace {
// CPUs this process may run on: in a container or under taskset that is
// fewer than hardware_concurrency(), and a pool larger than it only contends.
int usable_cpus() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}
}  // namespace

ThreadPool& ThreadPool::instance() {
  // Never destroyed: parked workers must not be joined during static
  // destruction, when a late run() from another destructor could still come.
  static ThreadPool* pool = new ThreadPool(usable_cpus());
  return *pool;
}

int ThreadPool::slot() { return tl_slot; }

void ThreadPool::execute(std::uint32_t gen) {
  for (;;) {
    // The ticket first, then the fields: a successful CAS on that ticket
    // proves the fields read after it were this generation's.
    std::uint64_t t = ticket_.load(std::memory_order_acquire);
    if (std::uint32_t(t >> 32) != gen) return;
    const auto* fn = fn_.load(std::memory_order_acquire);
    auto idx = std::int64_t(t & kClosed);
    if (idx >= n_.load(std::memory_order_acquire)) return;
    if (!ticket_.compare_exchange_weak(t, t + 1, std::memory_order_acq_rel)) continue;
    if (!failed_.load(std::memory_order_relaxed)) {
      try {
        (*fn)(idx);
      } catch (...) {
        if (!failed_.exchange(true)) error_ = std::current_exception();
      }
    }
    done_.fetch_add(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::worker_main(int index) {
  tl_slot = index;
  std::uint32_t seen = 0;
  // A new generation is ready once its ticket is no longer closed.
  auto fresh = [&](std::uint64_t t) { return std::uint32_t(t >> 32) != seen && (t & kClosed) != kClosed; };
  for (;;) {
    auto start = std::chrono::steady_clock::now();
    std::uint64_t t;
    for (int spins = 0;; ++spins) {
      t = ticket_.load(std::memory_order_acquire);
      if (fresh(t) || stop_.load(std::memory_order_relaxed)) break;
      if ((spins & 63) == 63 && std::chrono::steady_clock::now() - start > kSpin) {
        std::unique_lock lock(park_mu_);
        sleepers_.fetch_add(1);
        park_cv_.wait(lock, [&] { return fresh(ticket_.load()) || stop_.load(); });
        sleepers_.fetch_sub(1);
        start = std::chrono::steady_clock::now();
      }
      RLX_CPU_RELAX();
    }
    if (stop_.load()) return;
    seen = std::uint32_t(t >> 32);
    if (index >= max_threads_.load(std::memory_order_acquire)) continue;
    TaskScope scope;
    execute(seen);
  }
}

void ThreadPool::run(std::int64_t n, FunctionRef<void(std::int64_t)> task, int max_threads) {
  if (n <= 0) return;
  int threads = max_threads > 0 ? std::min(max_threads, size()) : size();
  if (n == 1 || threads <= 1 || tl_in_task || !submit_.try_lock()) {
    TaskScope scope;
    for (std::int64_t i = 0; i < n; ++i) task(i);
    return;
  }
  std::lock_guard lock(submit_, std::adopt_lock);
  std::uint32_t gen = ++gen_;
  if (gen == 0) gen = ++gen_;  // 0 is every worker's initial "seen"
  // Close the ticket under the new generation before rewriting the fields,
  // so that a straggler of the previous job cannot claim with stale fields.
  ticket_.store(std::uint64_t(gen) << 32 | kClosed);
  fn_.store(&task, std::memory_order_release);
  n_.store(n, std::memory_order_release);
  max_threads_.store(threads, std::memory_order_release);
  done_.store(0, std::memory_order_relaxed);
  failed_.store(false, std::memory_order_relaxed);
  error_ = nullptr;
  ticket_.store(std::uint64_t(gen) << 32);
  if (sleepers_.load() > 0) {
    std::lock_guard park(park_mu_);
    park_cv_.notify_all();
  }
  {
    TaskScope scope;
    execute(gen);
  }
  for (int spins = 0; done_.load(std::memory_order_acquire) < n; ++spins) {
    if (spins < 4096)
      RLX_CPU_RELAX();
    else
      std::this_thread::yield();  // a worker was descheduled mid-task
  }
  if (failed_.load()) std::rethrow_exception(error_);
}

}  // namespace rlx::backends::cpu
