#include "rlx/run_control.hpp"

#include <fmt/format.h>

#include "rlx/error.hpp"

namespace rlx {

namespace {
thread_local RunControl* current_run = nullptr;
}  // namespace

RunControl::Scope::Scope(RunControl& control) : previous_(current_run) {
  control.cancelled_.store(false, std::memory_order_relaxed);
  control.deadline_.reset();
  if (control.timeout_) control.deadline_ = Clock::now() + *control.timeout_;
  current_run = &control;
}

RunControl::Scope::~Scope() { current_run = previous_; }

void RunControl::check(std::string_view where) const {
  if (cancelled_.load(std::memory_order_relaxed)) throw Error(fmt::format("{}: the run was cancelled", where));
  if (deadline_ && Clock::now() > *deadline_)
    throw Error(fmt::format("{}: the run passed its timeout of {:.3f} s", where,
                            std::chrono::duration<double>(*timeout_).count()));
}

void check_run(std::string_view where) {
  if (current_run) current_run->check(where);
}

}  // namespace rlx
