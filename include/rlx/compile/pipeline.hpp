#pragma once
// The compile pipeline: HIR -> MIR -> LIR, driven by a pass manager.
//
//   HIR  (what the user built)
//    | param_specialize, legalize (decompose composites the backend
//    | does not claim), broadcast legalization
//   MIR  (primitives, plus composites the backend claims natively)
//    | const_fold, algebraic_simplify, cse, dce, promote_params,
//    | user passes (register_ir_pass), fusion
//   LIR  (kernels in order + one memory plan)
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "rlx/compile/lir.hpp"
#include "rlx/ir/graph.hpp"

namespace rlx::compile {

// The ops a backend runs natively, and for some of them the only result
// dtypes it has kernels for (at others they decompose: the CPU's SIMD
// sigmoid is f32, so an f64 sigmoid runs as its formula).
struct NativeOps {
  std::set<ir::OpKind> ops;
  std::map<ir::OpKind, std::set<ir::DType>> only_at;

  NativeOps() = default;
  NativeOps(std::set<ir::OpKind> o) : ops(std::move(o)) {}  // NOLINT(google-explicit-constructor): a set is one
  NativeOps(std::initializer_list<ir::OpKind> o) : ops(o) {}
  // Whether node `n` (its op at its result dtype) is kept as it is.
  bool keeps(const ir::Node& n) const;
  bool contains(ir::OpKind op) const { return ops.contains(op); }
  std::size_t count(ir::OpKind op) const { return ops.count(op); }
  void insert(ir::OpKind op) { ops.insert(op); }
  template <class It>
  void insert(It first, It last) {
    ops.insert(first, last);
  }
  void erase(ir::OpKind op) {
    ops.erase(op);
    only_at.erase(op);
  }
  auto begin() const { return ops.begin(); }
  auto end() const { return ops.end(); }
};

// What a backend declares about itself; the pipeline legalizes against it.
struct BackendTraits {
  std::string name = "cpu";
  // Ops the backend runs natively. Composites not listed are decomposed into
  // primitives; primitives not listed fall to the host (if host_fallback) or
  // fail with an error naming the op and the backend.
  NativeOps native_ops;
  // dtypes the backend computes natively (default: every element type, the storage-only ones included).
  // Floats outside it are legalized with casts to f32; a kernel with any other dtype outside it runs on the
  // host (a backend with host_fallback) or is refused naming the dtype.
  std::set<ir::DType> native_dtypes = all_element_dtypes();
  static std::set<ir::DType> all_element_dtypes() {
    std::set<ir::DType> s(std::begin(ir::kAllDTypes), std::end(ir::kAllDTypes));
    s.insert(std::begin(ir::kStorageDTypes), std::end(ir::kStorageDTypes));
    return s;
  }
  // Ops computed in f32 only: f16/bf16 operands get casts to f32 around them
  // (legalize_dtypes), and the casts fuse into neighbouring kernels.
  std::set<ir::OpKind> f32_compute_ops;
  bool host_fallback = false;  // may run unclaimed primitives on the host with staging
  // Custom ops (by name) the backend runs with a kernel of its own; other
  // custom ops are inlined through their lowering.
  std::set<std::string, std::less<>> custom_kernels;
  bool fuse_elementwise = true;
  bool fuse_reduce = true;
  bool fuse_matmul_epilogue = true;
  // Richer MatMul kernels a backend may accept (see docs/compile.md, "LIR"):
  // B given as permute(Input) swapping its last two dims (a transposed weight
  // in a backward pass reads in place of a transpose kernel), and epilogues
  // with several outputs of the matmul's shape (an optimiser update fused
  // behind the weight gradient).
  bool matmul_transposed_b = false;
  bool matmul_multi_output_epilogue = false;
  // An operand given as a widening cast (bf16 or f16 to f32, i8 or u8 to i32) read in its narrow type: the
  // kernel runs the low-precision product (an int8 or bf16 GEMM) instead of widening it in memory first.
  bool matmul_widened_operands = false;
  // A weight narrowed to bf16 only for a bf16 matmul (B = widen(bf16(param f32)), with A widened from bf16 too):
  // the cast joins the matmul's kernel, which reads the f32 param and rounds it to bf16 as it packs it, once per
  // write of the param, instead of a cast kernel and a pack on every run (auto-mixed precision's weights).
  bool matmul_narrowed_params = false;
  // A Native attention may read q, k and v through permutes that keep the head dim last (a [B, S, H, D]
  // projection read as [B, H, S, D]) and write its result through such a permute, in place of movement
  // kernels copying them: the kernel's body is then the permutes around the attention.
  bool attention_layout_views = false;
  // (op, dtype) pairs that run faster than in f32 here: the precision pass lowers an op only onto these, so an
  // auto-mixed-precision graph is never slower than its f32 form (docs/precision.md).
  std::set<std::pair<ir::OpKind, ir::DType>> fast_low_precision;
  // The fewest rows (M of an M·K·N matmul) at which the precision pass's bf16 or f16 matmul beats f32 here, for a
  // backend with a per-run cost the rows' faster products must pay back (B cast and packed every run: K·N work).
  // Not applied to a bf16 matmul whose B the backend rounds and packs once (matmul_narrowed_params).
  std::int64_t low_precision_matmul_min_rows = 0;
  // The least work (M·K·N multiply-adds) at which PTQ's int8 matmul beats f32 once its input is quantized and
  // its output dequantized, and the least width N (its GEMM's panels are that wide): smaller ones stay f32.
  std::int64_t int8_matmul_min_macs = 0, int8_matmul_min_n = 0;
  // The least K·N (multiply-adds per row) at which it does: a row's quantize (K values) and dequantize (N)
  // cost the same however many rows there are, so a layer too thin to pay them back stays f32 at any batch.
  std::int64_t int8_matmul_min_row_macs = 0;
  std::int64_t arena_alignment = 64;
  // false: a byte of the arena only ever holds buffers of one dtype (the C
  // target, where memory must not change its effective type).
  bool arena_reuse_across_dtypes = true;
};

// The weights BackendTraits::matmul_narrowed_params covers: a static, non-empty [K, N] f32 param. The precision
// pass (no row floor for them) and the lowering (the cast joins the matmul) ask the same question.
bool is_narrowable_weight(const ir::Node& param);

// Auto-mixed precision (the precision pass, docs/precision.md): f32 runs everything as written; bf16 and f16
// run matmuls and convolutions in that type with f32 accumulation where the backend has faster kernels for
// them, while reductions, softmax, norms and losses stay f32.
enum class Precision : std::uint8_t { F32, Bf16, F16 };
std::string_view precision_name(Precision p);      // "f32", "bf16", "f16"
Precision parse_precision(std::string_view name);  // throws rlx::Error naming the choices

struct CompileOptions {
  // Symbolic dims bound at compile time.
  std::vector<std::pair<std::string, std::int64_t>> bind;
  // param_specialize: params whose values are fixed become constants.
  std::map<std::string, ir::Tensor, std::less<>> param_bindings;
  // promote_params: constants at least this large become params (0 = off).
  std::int64_t promote_constants_over_bytes = 0;
  bool optimize = true;  // const_fold, simplify, cse, dce
  // f32 matmuls may run on TF32 tensor cores (a 10-bit mantissa) where the backend has them (CUDA); off, they
  // are exact f32.
  bool tf32 = false;
  Precision precision = Precision::F32;
  // quant_propagate (passes_extra.hpp, docs/precision.md): on a graph that quantizes (a cast to u8 or s8 of a
  // clamp), quantizes move above movement ops, quantize-of-dequantize pairs vanish, and an int8 matmul's
  // dequantize -> bias -> relu -> quantize becomes a requantize in its epilogue. Runs only with `optimize`.
  bool quant_propagate = true;
  bool fusion = true;
  // Called after every pass with (pass name, graph after the pass).
  std::function<void(std::string_view pass, const ir::Graph&)> inspect;
  // Pass names (or "all", "hir", "mir", "lir") whose output is printed to
  // stderr; defaults to the RLX_DUMP environment variable.
  std::string dump;
  int num_threads = 0;  // backend threads; 0 = all cores
  // lower_control_flow: a scan is unrolled into its body's ops when its length
  // is at most scan_unroll_max_length, or when length x body nodes is at most
  // scan_unroll_budget (0 turns either rule off); otherwise it runs as a host loop.
  std::int64_t scan_unroll_max_length = 64;
  std::int64_t scan_unroll_budget = 4096;
};

enum class DispatchTier : std::uint8_t {
  Native,        // the backend has a kernel for the op
  Decomposed,    // lowered to primitives the backend claims (common IR)
  Rewritten,     // rewritten to an equivalent form (e.g. dtype cast around it), unfused
  HostFallback,  // runs on the host with staging
  Unsupported,   // compile error
};
std::string_view dispatch_tier_name(DispatchTier t);

struct DispatchEntry {
  ir::NodeId hir_node;
  ir::OpKind op;
  DispatchTier tier;
  std::string reason;
};

struct DispatchReport {
  std::string backend;
  std::vector<DispatchEntry> entries;
  std::string to_text() const;
};

struct PassRecord {
  std::string name;
  std::size_t nodes_before = 0;
  std::size_t nodes_after = 0;
  double millis = 0;
};

struct FusionRecord {
  std::string kernel;  // kernel name
  KernelKind kind;
  std::vector<ir::OpKind> ops;       // ops fused into it
  std::string why_not;               // reason fusion stopped, when it did
  std::vector<std::string> origins;  // e.g. "custom:my_op" when an inlined custom op fused in here
};

// What the precision pass did with each op it considers (matmul, conv1d, conv2d, attention).
struct PrecisionEntry {
  ir::NodeId node = 0;  // in the graph the pass read
  ir::OpKind op = ir::OpKind::MatMul;
  ir::DType dtype = ir::DType::F32;  // what it runs in now
  std::string reason;
};
struct PrecisionReport {
  Precision policy = Precision::F32;
  std::vector<PrecisionEntry> entries;
  std::vector<std::string> quant_propagate;  // what the quant_propagate pass did, one line per rewrite
  std::string to_text() const;  // one line per entry: "%12 matmul: bf16 (...)", then quant_propagate's lines
};

struct CompileResult {
  ir::Graph hir;
  ir::Graph mir;
  LirModule lir;
  std::vector<PassRecord> passes;
  DispatchReport dispatch;
  std::vector<FusionRecord> fusion;
  PrecisionReport precision;
  // Params created by promote_params and the values they hold; the runtime
  // sets them before the first run.
  std::map<std::string, ir::Tensor, std::less<>> promoted_params;
  double total_millis = 0;
  std::string summary() const;  // what each level did: node counts, kernels, arena vs naive
};

// A graph -> graph pass. Passes build a new graph; they never mutate.
class Pass {
 public:
  virtual ~Pass() = default;
  virtual std::string_view name() const = 0;
  virtual ir::Graph run(const ir::Graph& g) const = 0;
};

// Runs the whole pipeline. Throws rlx::Error (naming the pass, node and op)
// on malformed graphs or unsupported ops.
CompileResult compile(const ir::Graph& hir, const BackendTraits& backend, const CompileOptions& options);

// ---- individual passes (each is also exposed for unit tests) ----
namespace passes {
// Replaces custom ops by their lowering, except those the backend has a kernel
// for (`native`); records each decision in `report`.
ir::Graph inline_custom(const ir::Graph& g, const std::set<std::string, std::less<>>& native,
                        DispatchReport* report = nullptr);
// Unrolls scans (by CompileOptions' unroll rules, nested ones too) and
// resolves ifs with a constant condition; the other control-flow ops stay for
// a host loop. Records one dispatch entry per op.
ir::Graph lower_control_flow(const ir::Graph& g, const CompileOptions& options, const BackendTraits& backend,
                             DispatchReport* report = nullptr);
ir::Graph param_specialize(const ir::Graph& g, const std::map<std::string, ir::Tensor, std::less<>>& bindings);
// Decomposes composites and formula ops (rlx/ir/op_def.hpp) that `keep`, the
// backend's native ops, does not keep, into primitives, filling `report`.
ir::Graph decompose(const ir::Graph& g, const NativeOps& keep, DispatchReport* report = nullptr);
ir::Graph legalize_broadcast(const ir::Graph& g);
ir::Graph const_fold(const ir::Graph& g);
ir::Graph algebraic_simplify(const ir::Graph& g);
ir::Graph cse(const ir::Graph& g);
ir::Graph dce(const ir::Graph& g);
ir::Graph promote_params(const ir::Graph& g, std::int64_t min_bytes);
ir::Graph legalize_dtypes(const ir::Graph& g, const std::set<ir::DType>& native);
// Auto-mixed precision: each f32 matmul, conv1d, conv2d or attention whose (op, low type) the backend lists in
// fast_low_precision runs in that type (operands cast to it, the result cast back to f32); every other one is
// left as it is, with the reason in `report`.
ir::Graph auto_mixed_precision(const ir::Graph& g, Precision policy, const BackendTraits& backend,
                               PrecisionReport* report = nullptr);
// Fusion and lowering to LIR (kernels + memory plan).
LirModule lower_to_lir(const ir::Graph& mir, const BackendTraits& backend, std::vector<FusionRecord>* fusion);
void plan_memory(LirModule& m, std::int64_t alignment, bool reuse_across_dtypes = true);
}  // namespace passes

// User passes: run after the built-in fusion-preparing passes and before
// legalization to LIR. Costs nothing while none is registered.
void register_ir_pass(std::shared_ptr<const Pass> pass);
std::vector<std::shared_ptr<const Pass>> registered_ir_passes();

}  // namespace rlx::compile
