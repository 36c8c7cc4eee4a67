#pragma once
// The whole extension surface in one header (docs/extending.md). A downstream
// project adds blocks, ops, passes, backends and codegen targets without
// editing RLX; `using namespace rlx::extend;` brings every seam's names in:
//
//   blocks    LayerStage, FlowCtx, FlowValue, StageArtifacts, ModelFlow, BuiltModel
//   ops       OpExtension, register_op, register_op_strict, is_op_registered,
//             Graph::custom_op / try_custom_op
//   kernels   register_host_kernel / register_cpu_kernel, register_vulkan_kernel,
//             register_cuda_kernel, custom_op_route
//   passes    Pass, register_ir_pass, rewrite, Rewriter
//   backends  Backend, ExecutableGraph, register_backend, make_backend, Device
//   codegen   codegen::c (a C99 target; a model for your own)
#include "rlx/backends/cpu/cpu_backend.hpp"
#include "rlx/codegen/c.hpp"
#include "rlx/compile/pipeline.hpp"
#include "rlx/compile/rewrite.hpp"
#include "rlx/error.hpp"
#include "rlx/flow/flow.hpp"
#include "rlx/ir/custom_op.hpp"
#include "rlx/ir/graph.hpp"
#include "rlx/reference/interpreter.hpp"
#include "rlx/runtime/backend.hpp"
#include "rlx/runtime/custom_kernels.hpp"
#include "rlx/runtime/session.hpp"

namespace rlx::extend {

using rlx::Error;

// The IR an extension builds and inspects.
using ir::Attrs;
using ir::AttrSpec;
using ir::AttrType;
using ir::DType;
using ir::Graph;
using ir::MutableTensorView;
using ir::Node;
using ir::NodeId;
using ir::OpKind;
using ir::Shape;
using ir::Tensor;
using ir::TensorView;
using ir::TypeInfo;

// Blocks.
using flow::BuiltModel;
using flow::FlowCtx;
using flow::FlowValue;
using flow::LayerStage;
using flow::ModelFlow;
using flow::StageArtifacts;

// Ops and their kernels.
using ir::is_op_registered;
using ir::OpExtension;
using ir::register_op;
using ir::register_op_strict;
using ir::registered_op_names;
using runtime::CudaKernel;
using runtime::custom_op_route;
using runtime::custom_route_name;
using runtime::CustomRoute;
using runtime::HostKernel;
using runtime::register_cpu_kernel;
using runtime::register_cuda_kernel;
using runtime::register_host_kernel;
using runtime::register_vulkan_kernel;
using runtime::VulkanKernel;

// Passes.
using compile::Pass;
using compile::register_ir_pass;
using compile::rewrite;
using compile::Rewriter;

// Backends.
using compile::BackendTraits;
using compile::CompileOptions;
using compile::LirModule;
using runtime::Backend;
using runtime::CompiledGraph;
using runtime::Device;
using runtime::ExecutableGraph;
using runtime::make_backend;
using runtime::NamedTensor;
using runtime::register_backend;
using runtime::Session;

// Codegen targets: codegen::c::emit(graph, options).
namespace codegen = rlx::codegen;

}  // namespace rlx::extend
