// The CPU backend: traits, compile_lir and the executable. Everything is
// planned at compile time; run() fills the input/output entries of a
// preallocated pointer table, runs the kernels and copies the outputs that
// were not written in place.
#include <cblas.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <new>

#include "backends/cpu/gemm_pack.hpp"
#include "backends/cpu/kernels.hpp"
#include "rlx/backends/cpu/cpu_backend.hpp"
#include "rlx/error.hpp"
#include "rlx/runtime/custom_kernels.hpp"

namespace rlx::backends::cpu {

namespace {

using compile::BufferId;
using compile::BufferRole;

constexpr std::size_t kAlign = 64;
std::size_t align_up(std::size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// One 64-byte aligned allocation.
class AlignedBytes {
 public:
  AlignedBytes() = default;
  explicit AlignedBytes(std::size_t n)
      : p_(static_cast<std::byte*>(::operator new(align_up(std::max<std::size_t>(n, 1)), std::align_val_t(kAlign)))),
        n_(n) {}
  std::byte* data() const { return p_.get(); }
  std::size_t size() const { return n_; }

 private:
  struct Free {
    void operator()(std::byte* p) const { ::operator delete(p, std::align_val_t(kAlign)); }
  };
  std::unique_ptr<std::byte, Free> p_;
  std::size_t n_ = 0;
};

// Where a buffer's bytes live: a base plus a byte offset.
enum class Base : std::uint8_t { Arena, Input, Param, Constant, Output };
struct Ref {
  Base base = Base::Arena;
  std::int32_t index = 0;
  std::int64_t offset = 0;
};

struct Output {
  BufferId buffer = 0;
  std::size_t bytes = 0;
  bool in_place = false;  // kernels write the caller's memory directly
};

// Immutable after compile_lir; shared by clones.
struct Plan {
  const KernelTable* isa = nullptr;
  int threads = 1;
  std::vector<std::unique_ptr<CpuKernel>> kernels;
  std::size_t shared_bytes = 0, thread_bytes = 0;
  std::size_t arena_bytes = 0;
  std::vector<AlignedBytes> constants;
  std::vector<std::size_t> param_bytes;
  std::vector<Ref> refs;                          // per buffer
  std::vector<std::pair<BufferId, Ref>> dynamic;  // entries bound per run (inputs, in-place outputs)
  std::vector<Output> outputs;
  std::size_t n_inputs = 0;
  std::vector<PackedOperand> packs;  // pointer table entries after the buffers' (gemm_pack.hpp)
};

struct ParamStore {
  std::vector<AlignedBytes> data;
  std::vector<AlignedBytes> packed;  // per Plan::packs
};

// (Re)packs plan.packs[i] from its source's current bytes.
void pack_operand(const Plan& plan, ParamStore& store, std::size_t i) {
  const PackedOperand& op = plan.packs[i];
  const Ref& r = plan.refs[std::size_t(op.buffer)];
  const std::byte* base =
      r.base == Base::Param ? store.data[std::size_t(r.index)].data() : plan.constants[std::size_t(r.index)].data();
  const auto* b = reinterpret_cast<const float*>(base + r.offset);
  auto* dst = reinterpret_cast<float*>(store.packed[i].data());
  const KernelTable& isa = *plan.isa;
  parallel_for((op.N + isa.gemm_nr - 1) / isa.gemm_nr, 1,
               [&](i64 p0, i64 p1) {
                 if (op.transposed)
                   isa.gemm_pack_bt(b, op.K, op.K, op.N, dst, p0, p1);
                 else
                   isa.gemm_pack_b(b, op.N, op.K, op.N, dst, p0, p1);
               },
               plan.threads);
}

std::size_t nbytes_of(const compile::Buffer& b) { return std::size_t(numel(b.shape)) * ir::dtype_size(b.dtype); }

class CpuExecutable final : public runtime::ExecutableGraph {
 public:
  CpuExecutable(std::shared_ptr<const Plan> plan, std::shared_ptr<ParamStore> params)
      : plan_(std::move(plan)),
        params_(std::move(params)),
        arena_(plan_->arena_bytes),
        shared_(plan_->shared_bytes),
        stride_(align_up(plan_->thread_bytes)),
        threads_(stride_ * std::size_t(ThreadPool::instance().size())),
        ptrs_(plan_->refs.size() + plan_->packs.size(), nullptr) {
    for (std::size_t i = 0; i < plan_->refs.size(); ++i) {
      const Ref& r = plan_->refs[i];
      std::byte* base = nullptr;
      switch (r.base) {
        case Base::Arena: base = arena_.data(); break;
        case Base::Param: base = params_->data[std::size_t(r.index)].data(); break;
        case Base::Constant: base = plan_->constants[std::size_t(r.index)].data(); break;
        default: continue;  // bound per run
      }
      ptrs_[i] = base + r.offset;
    }
    for (std::size_t i = 0; i < plan_->packs.size(); ++i) ptrs_[plan_->refs.size() + i] = params_->packed[i].data();
  }

  void set_param(std::size_t index, const void* data, std::size_t nbytes) override {
    if (index >= plan_->param_bytes.size())
      throw Error("cpu: param index " + std::to_string(index) + " out of range (" +
                  std::to_string(plan_->param_bytes.size()) + " params)");
    if (nbytes != plan_->param_bytes[index])
      throw Error("cpu: param " + std::to_string(index) + " expects " + std::to_string(plan_->param_bytes[index]) +
                  " bytes, got " + std::to_string(nbytes));
    if (nbytes) std::memcpy(params_->data[index].data(), data, nbytes);
    for (std::size_t i = 0; i < plan_->packs.size(); ++i) {
      const Ref& r = plan_->refs[std::size_t(plan_->packs[i].buffer)];
      if (r.base == Base::Param && std::size_t(r.index) == index) pack_operand(*plan_, *params_, i);
    }
  }

  void run(std::span<const void* const> inputs, std::span<void* const> outputs) override {
    if (inputs.size() != plan_->n_inputs || outputs.size() != plan_->outputs.size())
      throw Error("cpu: run() got " + std::to_string(inputs.size()) + " inputs and " + std::to_string(outputs.size()) +
                  " outputs, expected " + std::to_string(plan_->n_inputs) + " and " +
                  std::to_string(plan_->outputs.size()));
    for (const auto& [buffer, r] : plan_->dynamic) {
      const void* base = r.base == Base::Input ? inputs[std::size_t(r.index)] : outputs[std::size_t(r.index)];
      ptrs_[std::size_t(buffer)] = static_cast<std::byte*>(const_cast<void*>(base)) + r.offset;
    }
    const RunCtx ctx{ptrs_.data(), shared_.data(), threads_.data(), stride_, plan_->threads, plan_->isa};
    for (const auto& k : plan_->kernels) k->run(ctx);
    for (std::size_t j = 0; j < plan_->outputs.size(); ++j) {
      const Output& o = plan_->outputs[j];
      if (o.in_place || o.bytes == 0) continue;
      const std::byte* src = ptrs_[std::size_t(o.buffer)];
      auto* dst = static_cast<std::byte*>(outputs[j]);
      constexpr std::size_t kPiece = 1 << 20;
      parallel_for(
          i64((o.bytes + kPiece - 1) / kPiece), 1,
          [&](i64 b, i64 e) {
            std::size_t lo = std::size_t(b) * kPiece, hi = std::min(o.bytes, std::size_t(e) * kPiece);
            std::memcpy(dst + lo, src + lo, hi - lo);
          },
          plan_->threads);
    }
  }

  std::unique_ptr<runtime::ExecutableGraph> clone() const override {
    return std::make_unique<CpuExecutable>(plan_, params_);
  }

  std::size_t packed_operands() const { return plan_->packs.size(); }

 private:
  std::shared_ptr<const Plan> plan_;
  std::shared_ptr<ParamStore> params_;
  AlignedBytes arena_, shared_;
  std::size_t stride_;
  AlignedBytes threads_;
  std::vector<std::byte*> ptrs_;
};

// OpenBLAS runs single-threaded inside the pool's tasks (matmul panels, conv
// tiles, attention blocks): one threading layer, no oversubscription, and
// epilogues run on the panel a task just wrote. This sets a process-wide
// OpenBLAS setting, once.
void single_threaded_blas() {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

// Outputs bigger than the last-level cache are written with non-temporal
// stores. Virtual machines often report the host's whole L3 (or nothing), so
// the size is clamped to what one core can actually use.
std::int64_t stream_threshold() {
  long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
  return std::clamp<std::int64_t>(l3 > 0 ? l3 : 32 << 20, 8 << 20, 32 << 20);
}

class CpuBackend final : public runtime::Backend {
 public:
  std::string_view name() const override { return "cpu"; }

  compile::BackendTraits traits() const override {
    using ir::OpKind;
    compile::BackendTraits t;
    t.name = "cpu";
    for (OpKind op : ir::kAllOps)
      if (ir::op_info(op).cls != ir::OpClass::Composite) t.native_ops.insert(op);
    for (OpKind op : {OpKind::Softmax, OpKind::LogSoftmax, OpKind::LayerNorm, OpKind::RmsNorm, OpKind::Conv1d,
                      OpKind::Conv2d, OpKind::MaxPool2d, OpKind::AvgPool2d, OpKind::Attention}) {
      t.native_ops.insert(op);
      t.f32_compute_ops.insert(op);
    }
    t.f32_compute_ops.insert(OpKind::MatMul);
    t.matmul_transposed_b = true;
    t.matmul_multi_output_epilogue = true;
    for (auto& name : runtime::host_kernel_names()) t.custom_kernels.insert(std::move(name));
    t.arena_alignment = std::int64_t(kAlign);
    return t;
  }

  std::unique_ptr<runtime::ExecutableGraph> compile_lir(const compile::LirModule& lir,
                                                        const compile::CompileOptions& options) override {
    single_threaded_blas();
    auto plan = std::make_shared<Plan>();
    plan->isa = &select_kernels();
    const int pool = ThreadPool::instance().size();
    plan->threads = options.num_threads > 0 ? std::min(options.num_threads, pool) : pool;
    plan->arena_bytes = std::size_t(std::max<std::int64_t>(lir.memory.arena_bytes, 0));
    plan->n_inputs = lir.inputs.size();
    const std::int64_t stream = stream_threshold();
    PackRegistry packs{plan->isa, lir.buffers.size(), {}};

    for (const auto& k : lir.kernels) {
      BuildCtx b{lir, k, plan->threads, stream, &packs};
      std::unique_ptr<CpuKernel> ck;
      switch (k.kind) {
        case compile::KernelKind::Elementwise: ck = build_elementwise(b); break;
        case compile::KernelKind::Reduce: ck = build_reduce(b); break;
        case compile::KernelKind::MatMul: ck = build_matmul(b); break;
        case compile::KernelKind::Movement: ck = build_movement(b); break;
        case compile::KernelKind::Native:
          ck = b.anchor().op == ir::OpKind::Custom ? build_custom(b) : build_native(b);
          break;
        case compile::KernelKind::Leaf: ck = build_leaf(b); break;
      }
      plan->shared_bytes = std::max(plan->shared_bytes, align_up(ck->shared_bytes));
      plan->thread_bytes = std::max(plan->thread_bytes, align_up(ck->thread_bytes));
      plan->kernels.push_back(std::move(ck));
    }

    for (const auto& v : lir.constant_values) {
      AlignedBytes c(v.nbytes());
      if (v.nbytes()) std::memcpy(c.data(), v.data(), v.nbytes());
      plan->constants.push_back(std::move(c));
    }
    auto params = std::make_shared<ParamStore>();
    for (BufferId id : lir.params) {
      std::size_t n = nbytes_of(lir.buffer(id));
      plan->param_bytes.push_back(n);
      params->data.emplace_back(n);
      if (n) std::memset(params->data.back().data(), 0, n);
    }

    // Arena outputs that own their storage are written straight into the caller's memory.
    std::vector<int> out_of(lir.buffers.size(), -1);
    for (std::size_t j = 0; j < lir.outputs.size(); ++j) {
      const auto& b = lir.buffer(lir.outputs[j]);
      Output o{b.id, nbytes_of(b), false};
      if (b.role == BufferRole::Arena && (b.root < 0 || b.root == b.id) && o.bytes > 0 &&
          out_of[std::size_t(b.id)] < 0) {
        o.in_place = true;
        out_of[std::size_t(b.id)] = int(j);
      }
      plan->outputs.push_back(o);
    }

    plan->refs.resize(lir.buffers.size());
    for (const auto& b : lir.buffers) {
      const auto& root = lir.buffer(b.root < 0 ? b.id : b.root);
      Ref r;
      r.offset = b.root < 0 || b.root == b.id ? 0 : b.view_offset;
      if (root.root >= 0 && root.root != root.id)
        throw Error("cpu: buffer " + std::to_string(b.id) + " is a view of a view (" + std::to_string(root.id) + ")");
      switch (root.role) {
        case BufferRole::Arena:
          if (out_of[std::size_t(root.id)] >= 0) {
            r.base = Base::Output;
            r.index = out_of[std::size_t(root.id)];
          } else {
            r.base = Base::Arena;
            r.offset += root.arena_offset;
            if (root.arena_offset < 0 || std::size_t(root.arena_offset) + nbytes_of(root) > plan->arena_bytes)
              throw Error("cpu: arena buffer " + std::to_string(root.id) + " (" + root.name +
                          ") lies outside the planned arena of " + std::to_string(plan->arena_bytes) + " bytes");
          }
          break;
        case BufferRole::Input:
          r.base = Base::Input;
          r.index = root.external_index;
          break;
        case BufferRole::Param:
          r.base = Base::Param;
          r.index = root.external_index;
          break;
        case BufferRole::Constant:
          r.base = Base::Constant;
          r.index = root.external_index;
          break;
      }
      plan->refs[std::size_t(b.id)] = r;
      if (r.base == Base::Input || r.base == Base::Output) plan->dynamic.emplace_back(b.id, r);
    }

    // Params start zeroed, and so do their packed copies until set_param.
    plan->packs = std::move(packs.operands);
    for (std::size_t i = 0; i < plan->packs.size(); ++i) {
      const PackedOperand& op = plan->packs[i];
      const Base base = plan->refs[std::size_t(op.buffer)].base;
      if (base != Base::Param && base != Base::Constant)
        throw Error("cpu: packed GEMM operand " + std::to_string(op.buffer) + " is not a param or constant");
      AlignedBytes bytes(packed_floats(*plan->isa, op.K, op.N) * sizeof(float));
      std::memset(bytes.data(), 0, bytes.size());
      params->packed.push_back(std::move(bytes));
      if (base == Base::Constant) pack_operand(*plan, *params, i);
    }
    return std::make_unique<CpuExecutable>(std::move(plan), std::move(params));
  }
};

[[maybe_unused]] const bool registered =
    (runtime::register_backend(runtime::Device::Cpu, [] { return std::make_unique<CpuBackend>(); }), true);

}  // namespace

std::unique_ptr<runtime::Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

std::size_t packed_operand_count(const runtime::ExecutableGraph& exe) {
  const auto* cpu = dynamic_cast<const CpuExecutable*>(&exe);
  if (!cpu) throw Error("packed_operand_count: not an executable of the CPU backend");
  return cpu->packed_operands();
}

std::vector<std::string> available_isas() { return supported_isas(); }

std::string selected_isa() { return select_kernels().name; }

}  // namespace rlx::backends::cpu
