#pragma once
#include <functional>
#include <future>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace rlx::runtime {

// commit_no_wait / sync_pending for a backend whose runs block their caller (the CPU, MLX): the run goes to a
// thread of its own with copies of the caller's pointer lists, and wait() rethrows its error. Every other entry
// point of the executable calls require_idle first, since the pending run owns the executable's buffers until
// then. Declare it as the executable's last member: its destructor waits for a pending run before the members
// that run reads are destroyed.
class PendingRun {
 public:
  using Run = std::function<void(std::span<const void* const> inputs, std::span<void* const> outputs)>;

  explicit PendingRun(std::string backend) : backend_(std::move(backend)) {}
  PendingRun(const PendingRun&) = delete;
  PendingRun& operator=(const PendingRun&) = delete;
  ~PendingRun();

  // Throws rlx::Error naming the backend and `method` while a run is pending.
  void require_idle(std::string_view method) const;
  // Starts run(inputs, outputs) on a thread of its own (require_idle("commit_no_wait") first).
  void start(std::span<const void* const> inputs, std::span<void* const> outputs, Run run);
  // Waits for the pending run, if any, and rethrows what it threw.
  void wait();
  // Waits for the pending run, if any, dropping its error: for destructors, where nobody is left to receive it.
  void finish() noexcept;
  bool pending() const { return future_.valid(); }

 private:
  std::string backend_;
  std::vector<const void*> inputs_;
  std::vector<void*> outputs_;
  std::future<void> future_;
};

// run_pipelined on a backend with no overlap to gain: the sets run back to back through `run`. Throws rlx::Error
// naming the backend when the input and output sets differ in number.
void run_sets_in_order(std::string_view backend, std::span<const std::vector<const void*>> inputs,
                       std::span<const std::vector<void*>> outputs, const PendingRun::Run& run);

}  // namespace rlx::runtime
