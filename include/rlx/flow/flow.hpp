#pragma once
// Blocks: the seam for new architecture pieces. A LayerStage composes
// primitives through FlowCtx's builders; ModelFlow chains stages into one
// ir::Graph. Blocks lower to ordinary ops, so they fuse and run on every
// backend like hand-built graphs (see docs/extending.md).
//
//   struct GatedMlp : rlx::flow::LayerStage { ... emit_layer(ctx, x) ... };
//   auto model = rlx::flow::ModelFlow::create("m").input("x", {4, 16}).layer_stage(GatedMlp(...)).build();
//   rlx::Session().compile(model.graph);
//
// Errors are rlx::Error; those raised while a stage emits name the stage.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "rlx/ir/graph.hpp"

namespace rlx::flow {

// A node of the graph being built, with its dtype and shape.
class FlowValue {
 public:
  FlowValue() = default;
  ir::NodeId id() const { return id_; }
  const ir::Shape& shape() const { return shape_; }
  ir::DType dtype() const { return dtype_; }

 private:
  friend class FlowCtx;
  FlowValue(ir::NodeId id, ir::Shape shape, ir::DType dtype) : id_(id), shape_(std::move(shape)), dtype_(dtype) {}
  ir::NodeId id_ = 0;
  ir::Shape shape_;
  ir::DType dtype_ = ir::DType::F32;
};

// Curated builders over one ir::Graph. Weights are params named by a prefix:
// linear("<p>") uses "<p>.weight" [in, out] and "<p>.bias" [out]; rms_norm("<p>")
// uses "<p>.weight" [last dim]. A param requested twice is shared (tied
// weights) when dtype and shape agree, and an error otherwise.
class FlowCtx {
 public:
  // `stage` labels every error message; ModelFlow sets it per stage.
  explicit FlowCtx(ir::Graph& graph, std::string stage = {}) : graph_(graph), stage_(std::move(stage)) {}

  FlowValue param(std::string_view name, ir::Shape shape, ir::DType dtype = ir::DType::F32);
  // A graph input declared on the ModelFlow (the first one is the stage's hidden stream).
  FlowValue input(std::string_view name) const;
  FlowValue matmul(const FlowValue& a, const FlowValue& b);
  FlowValue linear(const FlowValue& x, std::string_view name, std::int64_t out_features, bool bias = false);
  FlowValue add(const FlowValue& a, const FlowValue& b);
  FlowValue sub(const FlowValue& a, const FlowValue& b);
  FlowValue mul(const FlowValue& a, const FlowValue& b);
  // x + f(x): unlike add, the shapes must be equal (no broadcasting).
  FlowValue residual(const FlowValue& x, const FlowValue& fx);
  // kind: relu, gelu (erf form), gelu_tanh, silu, sigmoid, tanh or softplus.
  FlowValue activation(const FlowValue& x, std::string_view kind);
  FlowValue relu(const FlowValue& x) { return activation(x, "relu"); }
  FlowValue gelu(const FlowValue& x) { return activation(x, "gelu"); }
  FlowValue silu(const FlowValue& x) { return activation(x, "silu"); }
  // Over the last dim; an empty `name` means no learned scale.
  FlowValue rms_norm(const FlowValue& x, std::string_view name = {}, std::optional<double> eps = std::nullopt);
  FlowValue cast(const FlowValue& x, ir::DType to);

  // Dropping down: build with the raw graph, then wrap the node back.
  ir::Graph& hir() { return graph_; }
  FlowValue value(ir::NodeId id) const;

  // An auxiliary output (a KV tap, an aux head), appended after the primary
  // output in publish order.
  void publish_side_output(std::string name, const FlowValue& value);
  const std::vector<ir::GraphOutput>& side_outputs() const { return side_outputs_; }

  // The label errors carry; fail() throws rlx::Error prefixed with it, so a
  // stage's own checks read like the built-in ones.
  const std::string& stage() const { return stage_; }
  [[noreturn]] void fail(const std::string& what) const;

 private:
  ir::Graph& graph_;
  std::string stage_;
  std::vector<ir::GraphOutput> side_outputs_;
};

// What a stage reports besides its output value; `hidden` is checked against
// the returned value's shape so a stage's declared contract cannot drift.
struct StageArtifacts {
  ir::Shape hidden;
  static StageArtifacts hidden_only(ir::Shape shape) { return {std::move(shape)}; }
};

class LayerStage {
 public:
  virtual ~LayerStage() = default;
  virtual std::string_view name() const = 0;
  virtual std::pair<FlowValue, StageArtifacts> emit_layer(FlowCtx& ctx, FlowValue x) const = 0;
};

struct StageRecord {
  std::string name;
  StageArtifacts artifacts;
};

struct BuiltModel {
  ir::Graph graph;
  std::vector<StageRecord> stages;
  // The primary output first, then side outputs in publish order.
  std::vector<std::string> output_names() const;
};

class ModelFlow {
 public:
  static ModelFlow create(std::string name) { return ModelFlow(std::move(name)); }

  // The first input is the hidden stream fed to the first stage; later ones
  // are reachable from stages through FlowCtx::input.
  ModelFlow& input(std::string name, ir::Shape shape, ir::DType dtype = ir::DType::F32) &;
  ModelFlow&& input(std::string name, ir::Shape shape, ir::DType dtype = ir::DType::F32) && {
    return std::move(input(std::move(name), std::move(shape), dtype));
  }
  ModelFlow& layer_stage(std::unique_ptr<LayerStage> stage) &;
  ModelFlow&& layer_stage(std::unique_ptr<LayerStage> stage) && { return std::move(layer_stage(std::move(stage))); }
  template <class S>
  requires std::is_base_of_v<LayerStage, std::decay_t<S>> ModelFlow& layer_stage(S&& stage) & {
    return layer_stage(std::make_unique<std::decay_t<S>>(std::forward<S>(stage)));
  }
  template <class S>
  requires std::is_base_of_v<LayerStage, std::decay_t<S>> ModelFlow && layer_stage(S&& stage) && {
    return std::move(layer_stage(std::make_unique<std::decay_t<S>>(std::forward<S>(stage))));
  }
  // Name of the primary output (default "hidden").
  ModelFlow& output(std::string name) &;
  ModelFlow&& output(std::string name) && { return std::move(output(std::move(name))); }

  // Emits every stage in order into a fresh graph and verifies it.
  BuiltModel build() const;

 private:
  explicit ModelFlow(std::string name) : name_(std::move(name)) {}
  struct InputSpec {
    std::string name;
    ir::Shape shape;
    ir::DType dtype;
  };
  std::string name_;
  std::string output_ = "hidden";
  std::vector<InputSpec> inputs_;
  std::vector<std::unique_ptr<LayerStage>> stages_;
};

}  // namespace rlx::flow
