#pragma once
// Training as graphs: losses are graph builders, and an optimiser step is one
// graph (forward, backward by rlx::autodiff, and the update) that compiles,
// fuses and plans like any other. Trainer runs that graph in a loop and keeps
// params and optimiser state on the host. docs/training.md describes it.
#include <cstdint>
#include <initializer_list>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "rlx/autodiff/autodiff.hpp"
#include "rlx/distributed/distributed.hpp"
#include "rlx/ir/graph.hpp"
#include "rlx/runtime/session.hpp"

namespace rlx::train {

// ---- losses: each appends nodes to `g` and returns a float scalar ----

// Mean over every position of -log softmax(logits)[label]: logits [..., C]
// (float), labels [...] (any integer dtype) with the leading dims of logits.
// Computed as log_softmax + gather, so it is stable for large logits.
ir::NodeId cross_entropy(ir::Graph& g, ir::NodeId logits, ir::NodeId labels);
// Mean of (pred - target)^2; pred and target must have the same dtype and shape.
ir::NodeId mse(ir::Graph& g, ir::NodeId pred, ir::NodeId target);

// ---- optimisers (torch.optim's update rules) ----

// buf = momentum * buf + grad (no dampening, no nesterov); p -= lr * buf.
// weight_decay adds weight_decay * p to the gradient (L2).
struct Sgd {
  double lr = 0.01;
  double momentum = 0.0;
  double weight_decay = 0.0;
};
// Adam with bias correction; weight_decay is L2 added to the gradient.
struct Adam {
  double lr = 1e-3;
  double b1 = 0.9;
  double b2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
};
// Adam with decoupled weight decay: p *= 1 - lr * weight_decay before the Adam step.
struct AdamW {
  double lr = 1e-3;
  double b1 = 0.9;
  double b2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
};
using Optimizer = std::variant<Sgd, Adam, AdamW>;
double learning_rate(const Optimizer& opt);

// An optimiser state input of the step graph; every state starts at zero.
struct StateSpec {
  std::string name;
  ir::DType dtype;
  ir::Shape shape;
};

// One training step as a graph. Inputs: the model's inputs, then `lr_input`
// (a scalar), then the state in `state` order. Params: the model's params.
// Outputs: the loss (its name kept), "new_<p>" for each trained param in
// `params` order, then "new_<state name>" for each state input.
struct TrainStep {
  ir::Graph graph;
  std::vector<std::string> params;
  std::vector<StateSpec> state;  // "opt_step" (Adam/AdamW), "opt_momentum_<p>", "opt_m_<p>", "opt_v_<p>"
  std::string lr_input = "opt_lr";
  ir::DType scalar_dtype = ir::DType::F32;  // of opt_lr and opt_step: f64 when a trained param is f64
  // Loss-scaled steps only (train_step's `loss_scaled`): the scalar input the loss is multiplied by before the
  // backward pass (of the loss's dtype; the gradients are divided by it after), and the last output, the sum of
  // every gradient's |values|: not finite when a gradient holds an inf or a NaN.
  std::string loss_scale_input;
  std::string grad_check_output;
};

// `model`'s first output must be a float scalar loss; `params` names the
// params to train (float params of `model`). Throws rlx::Error for a name
// that is not a param, a repeated name, a non-scalar loss, bad
// hyperparameters, or state names that clash with the model's.
// `loss_scaled` adds loss scaling's input and check output (TrainStep::loss_scale_input, grad_check_output);
// the loss output stays the unscaled loss.
TrainStep train_step(const ir::Graph& model, std::span<const std::string> params, const Optimizer& opt,
                     const autodiff::Options& options = {}, bool loss_scaled = false);
inline TrainStep train_step(const ir::Graph& model, std::initializer_list<std::string> params, const Optimizer& opt,
                            const autodiff::Options& options = {}, bool loss_scaled = false) {
  return train_step(model, std::span<const std::string>(params.begin(), params.size()), opt, options, loss_scaled);
}

// The update alone, for gradients computed elsewhere (accumulated over
// micro-batches, all-reduced over ranks). Inputs: "grad_<p>" per param in
// `params` order (the param's dtype and shape), `lr_input`, then the state.
// Params: the trained params of `model`. Outputs: "new_<p>", then
// "new_<state>", as train_step's after its loss. The update is the same
// arithmetic as train_step's. Throws as train_step does, and for a grad input
// name that clashes with a param of `model`.
TrainStep apply_step(const ir::Graph& model, std::span<const std::string> params, const Optimizer& opt);

// The same graph (same node ids) with every param turned into an input of
// the same name.
ir::Graph params_to_inputs(const ir::Graph& g);

using TensorMap = std::map<std::string, ir::Tensor, std::less<>>;

// Dynamic loss scaling (docs/training.md, "Loss scaling"), for f16 mixed precision, whose small gradients would
// flush to zero in f16: each step multiplies the loss by the scale before the backward pass and the gradients
// by its inverse after. A step whose gradients hold an inf or a NaN is skipped (params and optimiser state stay
// as they were) and the scale is multiplied by backoff_factor; after growth_interval steps in a row without
// one, by growth_factor. Scales that are powers of two keep the scaling exact.
struct LossScaling {
  double init_scale = 65536.0;
  double growth_factor = 2.0;   // >= 1
  double backoff_factor = 0.5;  // in (0, 1]
  int growth_interval = 2000;   // 0: the scale never grows
};

struct TrainerOptions {
  runtime::Device device = runtime::Device::Cpu;
  std::vector<std::string> trainable;  // empty: every float param of the model
  compile::CompileOptions compile;
  autodiff::Options autodiff;
  // Gradient accumulation: step() cuts each input along axis 0 into this many micro-batches of the model's
  // batch (an input's leading dim is micro_batches times the model's), runs forward and backward on each, sums
  // the gradients in micro-batch order, divides by the number of micro-batches summed over every rank, and
  // applies one update. 1 with data_parallel off: the fused single-graph step.
  int micro_batches = 1;
  // Data parallelism: each rank passes its own share of the global batch to step(); the summed gradients (and
  // the loss) are all-reduced over `communicator` (distributed::world() when unset) before the update. The
  // mpi and local engines add in rank order, so N ranks of one micro-batch each end bit-identical to one
  // process with N micro-batches of the same data. Initial params are broadcast from rank 0.
  bool data_parallel = false;
  std::optional<distributed::Communicator> communicator;
  // Loss scaling; unset, it is on (with LossScaling's defaults) when compile.precision is f16, off otherwise.
  // It needs the fused step: set with micro_batches > 1 or data_parallel, the Trainer throws.
  std::optional<LossScaling> loss_scaling;
};

// Compiles the step once and runs it per batch. Params and optimiser state
// are fed as graph inputs from two host buffers each, and the step writes the
// new values straight into the other buffer: a step copies no weights.
class Trainer {
 public:
  // `params` gives the initial value of every param of `model`.
  Trainer(const ir::Graph& model, TensorMap params, const Optimizer& opt, const TrainerOptions& options = {});
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;
  Trainer(Trainer&&) noexcept = default;
  Trainer& operator=(Trainer&&) noexcept = default;

  // One step on a batch (the model's inputs, by name); returns the loss
  // computed before the update (with micro-batches or data parallelism: the
  // mean of the micro-batches' losses over every rank). On error nothing is
  // updated.
  double step(std::span<const runtime::NamedTensor> inputs);
  double step(const TensorMap& inputs);

  const ir::Tensor& param(std::string_view name) const;
  TensorMap params() const;  // copies of the current values
  // Optimiser state by name (TrainStep::state), e.g. "opt_m_w".
  const ir::Tensor& state(std::string_view name) const;
  std::int64_t steps() const { return steps_; }
  double lr() const;
  void set_lr(double lr);  // takes effect at the next step; no recompile
  const TrainStep& step_graph() const { return step_; }
  // Loss scaling (TrainerOptions::loss_scaling): the scale the next step uses (1 without it), and the steps
  // skipped for an inf or NaN gradient (not counted in steps()).
  double loss_scale() const { return scaler_ ? scaler_->scale : 1.0; }
  std::int64_t skipped_steps() const { return scaler_ ? scaler_->skipped : 0; }
  // The compiled step: the fused one, or with accumulation the update alone (then grad_compiled() makes the
  // loss and gradients of one micro-batch).
  const runtime::CompiledGraph& compiled() const { return compiled_; }
  const runtime::CompiledGraph* grad_compiled() const { return grad_ ? &grad_->compiled : nullptr; }
  int micro_batches() const { return micro_batches_; }
  // The group gradients are all-reduced over; nullopt without data parallelism.
  const std::optional<distributed::Communicator>& communicator() const { return comm_; }

 private:
  struct Slot {
    std::string name;
    ir::Tensor buf[2];
    bool updated = false;  // trained params and state; frozen params and the lr keep buf[0]
    const ir::Tensor& current(int parity) const { return buf[updated ? parity : 0]; }
  };
  const Slot& slot(std::string_view name, std::string_view what) const;
  double accumulated_step(std::span<const runtime::NamedTensor> inputs);

  // Accumulation: the graph of one micro-batch's loss and gradients, and its buffers.
  struct GradPath {
    runtime::CompiledGraph compiled;
    std::vector<std::size_t> param_slot;  // per trained param, its slot
    std::vector<ir::Tensor> grad;         // one micro-batch's gradients (from the second micro-batch on)
    // Their running sum, then the mean, every param's back to back at `offset` (bytes): the update's grad
    // inputs, and one buffer for the all-reduce when the params share a dtype.
    std::vector<std::byte> flat;
    std::vector<std::size_t> offset;
    bool one_dtype = true;
    ir::Tensor loss;
    std::vector<runtime::NamedTensor> named;
    std::vector<void*> out_ptrs;
  };

  TrainStep step_;
  runtime::CompiledGraph compiled_;
  std::vector<Slot> slots_;            // every param, the lr, then the state
  std::vector<std::size_t> out_slot_;  // output j >= 1 -> slot it updates
  std::size_t lr_slot_ = 0;
  int parity_ = 0;
  std::int64_t steps_ = 0;
  ir::Tensor loss_;
  std::vector<runtime::NamedTensor> named_;
  std::vector<void*> out_ptrs_;
  std::size_t first_update_output_ = 1;  // 0 when compiled_ is the update alone (no loss output)
  int micro_batches_ = 1;
  std::optional<distributed::Communicator> comm_;
  std::optional<GradPath> grad_;

  struct Scaler {
    LossScaling config;
    double scale = 1;
    int good = 0;  // steps in a row with finite gradients
    std::int64_t skipped = 0;
    ir::Tensor input;  // the scale as the step's input
    ir::Tensor check;  // the step's grad_check_output
  };
  std::optional<Scaler> scaler_;
};

}  // namespace rlx::train
