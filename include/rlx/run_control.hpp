#pragma once
// Stopping a run that takes too long: a compiled graph's run can be cancelled
// from another thread (CompiledGraph::cancel) or bounded by a deadline
// (CompiledGraph::set_run_timeout). A while loop whose condition never turns
// false is legal IR, so the runtime, not the verifier, has to end it.
//
// The run in flight on a thread is found through a thread-local scope, so host
// loops deep inside any backend (the CPU's while and scan loops, the reference
// interpreter's, a host-fallback kernel inside Vulkan) poll one place without
// plumbing: check_run() throws rlx::Error once the run is cancelled or late.
// A check is one relaxed atomic load, plus a clock read when a deadline is set.
#include <atomic>
#include <chrono>
#include <optional>
#include <string_view>

namespace rlx {

class RunControl {
 public:
  using Clock = std::chrono::steady_clock;

  // Thread-safe: the run in flight stops at its next check; with none in
  // flight, the next run starts fresh (a cancel does not outlive its run).
  void cancel() noexcept { cancelled_.store(true, std::memory_order_relaxed); }
  // nullopt (the default): no deadline. Applies to each later run.
  void set_timeout(std::optional<Clock::duration> timeout) { timeout_ = timeout; }
  std::optional<Clock::duration> timeout() const { return timeout_; }

  // One run on this thread, for its duration: clears the cancel flag, arms the
  // deadline, and makes check_run() on this thread consult this control.
  class Scope {
   public:
    explicit Scope(RunControl& control);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    RunControl* previous_;
  };

  // Throws rlx::Error naming `where` if cancelled or past the deadline.
  void check(std::string_view where) const;

 private:
  std::atomic<bool> cancelled_{false};
  std::optional<Clock::duration> timeout_;
  std::optional<Clock::time_point> deadline_;
};

// Called by loops once per step: checks the run in flight on this thread, if any.
void check_run(std::string_view where);

}  // namespace rlx
