#include "rlx/runtime/pending_run.hpp"

#include <fmt/format.h>

#include <utility>

#include "rlx/error.hpp"

namespace rlx::runtime {

PendingRun::~PendingRun() { finish(); }

void PendingRun::finish() noexcept {
  if (future_.valid()) future_.wait();  // a stored exception goes with the future
}

void PendingRun::require_idle(std::string_view method) const {
  if (future_.valid())
    throw Error(fmt::format("{}: {}: a commit_no_wait is pending; call sync_pending first", backend_, method));
}

void PendingRun::start(std::span<const void* const> inputs, std::span<void* const> outputs, Run run) {
  require_idle("commit_no_wait");
  inputs_.assign(inputs.begin(), inputs.end());
  outputs_.assign(outputs.begin(), outputs.end());
  future_ = std::async(std::launch::async, [this, run = std::move(run)] { run(inputs_, outputs_); });
}

void PendingRun::wait() {
  if (future_.valid()) std::exchange(future_, {}).get();
}

void run_sets_in_order(std::string_view backend, std::span<const std::vector<const void*>> inputs,
                       std::span<const std::vector<void*>> outputs, const PendingRun::Run& run) {
  if (inputs.size() != outputs.size())
    throw Error(
        fmt::format("{}: run_pipelined got {} input sets and {} output sets", backend, inputs.size(), outputs.size()));
  for (std::size_t k = 0; k < inputs.size(); ++k) run(inputs[k], outputs[k]);
}

}  // namespace rlx::runtime
