#pragma once
// GLSL compute shaders generated from LIR kernel bodies. Every shader sees
// the executable's arena (intermediates, then the inputs region, the status
// words and kernel scratch) at binding 0 and its weights (params and
// constants) at binding 1, or, when they outgrow one binding, windows of them
// at even and odd bindings (backend.cpp, Windows); each binding is aliased
// with one typed array per element type the shader touches. Buffer offsets and shapes are baked into the source, so a
// shader is specific to its kernel and layout; identical kernels share SPIR-V
// and pipelines through the caches.
#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "backends/vulkan/context.hpp"
#include "rlx/compile/lir.hpp"

namespace rlx::backends::vulkan {

// Where a buffer's bytes are: a binding and a byte offset in what it shows.
// Generators see the arena's windows at even bindings and the weights' at odd
// ones (windows.hpp); the backend's own copies see binding 0 (arena) or 1
// (weights) with offsets from the buffer's start.
struct Loc {
  int binding = 0;
  std::int64_t offset = 0;
};

struct GenCtx {
  const compile::LirModule& lir;
  const compile::Kernel& kernel;
  const std::vector<Loc>& locs;  // per buffer id
  const Caps& caps;
  std::uint32_t code = 0;  // this kernel's code in the status words (index + 1)
  Loc status;              // the status words
  // Scratch memory a kernel may use between its dispatches (KernelCode::scratch_bytes
  // of it, at most kMaxScratch); every kernel gets the same.
  Loc scratch;
};
constexpr std::uint64_t kMaxScratch = std::uint64_t(32) << 20;

struct Dispatch {
  std::string glsl;
  std::array<std::uint32_t, 3> groups{1, 1, 1};
};

// A kernel's dispatches (run in order, with barriers between them).
struct KernelCode {
  std::vector<Dispatch> dispatches;
  // For run-time errors a shader reports through the status words: what the
  // recorded value means (the message after "index <v> ").
  std::string status_message;
  // Scratch the dispatches use (GenCtx::scratch_offset), e.g. split-K partial sums.
  std::uint64_t scratch_bytes = 0;
};

// The shaders for `c.kernel`, or nullopt with the reason in *why when it has
// none (the kernel then runs on the host).
std::optional<KernelCode> generate(const GenCtx& c, std::string* why);

// ---- shared by the generators (glsl.cpp) ----------------------------------

enum class CT : std::uint8_t { F32, F64, I32, I64, Bool };  // compute types
// The dtypes the shaders load, compute and store (BackendTraits::native_dtypes).
std::span<const ir::DType> vulkan_dtypes();
CT compute_type(ir::DType t);
std::string_view ct_name(CT t);

// Thrown by generators for kernels they cannot express; generate() turns it into nullopt.
struct NoShader {
  std::string why;
};

// Literal of `v` in dtype `t`'s compute type.
std::string literal(double v, ir::DType t);

std::int64_t numel(const std::vector<std::int64_t>& extents);

// Declares uint `names[d]`, the coordinates over `extents` of linear index `lin` (a GLSL expression).
std::string declare_coords(const std::string& lin, const std::vector<std::int64_t>& extents,
                           const std::vector<std::string>& names);

// An iteration space: the linear index and per-dim coordinates as GLSL uint expressions.
struct Space {
  std::vector<std::int64_t> dims;
  std::string linear;
  std::vector<std::string> coords;
};
// Declares coordinate variables `<prefix>0..` for `dims` from the linear index `lin`.
std::string coords_code(Space& s, const std::string& prefix);
// The element index, in a buffer of shape `shape` broadcast to `s`, of the space's current point.
std::string bcast_index(const Space& s, const std::vector<std::int64_t>& shape);

class Shader {
 public:
  explicit Shader(const GenCtx& c) : c_(c) {}
  const GenCtx& ctx() const { return c_; }
  // Element `idx` of buffer `id` in its storage type (an lvalue).
  std::string at(compile::BufferId id, const std::string& idx);
  // The same, as an unsigned integer of the element's size (for dtype-agnostic copies).
  std::string raw(compile::BufferId id, const std::string& idx);
  std::string raw_type(ir::DType t) const;
  // The 32-bit words of binding `binding` (atomics on narrow elements), its vec4s (16-byte
  // loads), and a buffer's byte offset.
  std::string words(int binding);
  std::string vec4s(int binding);
  std::int64_t byte_offset(compile::BufferId id) const { return c_.locs.at(std::size_t(id)).offset; }
  // Element `idx` of buffer `id`, converted to its compute type.
  std::string load(compile::BufferId id, const std::string& idx);
  // Statement storing compute-type value `v` into element `idx` of buffer `id`.
  std::string store(compile::BufferId id, const std::string& idx, const std::string& v);
  // Element `idx` of the kernel's f32 scratch (an lvalue).
  std::string scratch(const std::string& idx);
  // Statement recording a run-time error (first one wins) with an int64 value.
  std::string fail(const std::string& value);
  // `v` (compute type of `from`) as dtype `to`'s compute type, rounded to `to`.
  std::string convert(const std::string& v, ir::DType from, ir::DType to);
  // `v` rounded to what storing it in `t` gives (f16, bf16, i8, u8), else `v`.
  std::string narrow(const std::string& v, ir::DType t);
  void use(const std::string& helper) { helpers_.insert(helper); }
  // The whole shader: header, buffer declarations, helpers, `decls` and `main`.
  std::string source(std::array<std::uint32_t, 3> local, const std::string& decls, const std::string& main_body) const;

 private:
  std::string array(int binding, ir::DType storage_of, bool raw);
  std::int64_t elem_offset(compile::BufferId id) const;
  const GenCtx& c_;
  std::set<std::string> arrays_;  // declared "<binding>:<suffix>:<type>"
  std::set<std::string> helpers_;
  bool uses_fp64_ = false;
};

// Evaluates body nodes in one iteration space, lazily and in dependency order:
// value(id) emits whatever `id` needs that is not computed yet.
class Emitter {
 public:
  Emitter(Shader& sh, const ir::Graph& body, const Space& space, std::string prefix)
      : sh_(sh), body_(body), space_(space), prefix_(std::move(prefix)) {}
  // A node computed elsewhere (the reduce or matmul result), by GLSL name.
  void preset(ir::NodeId id, std::string name) { names_[id] = std::move(name); }
  std::string value(ir::NodeId id);
  std::string take_code() { return std::move(code_); }

 private:
  std::string op_expr(const ir::Node& n, const std::vector<std::string>& a);
  Shader& sh_;
  const ir::Graph& body_;
  const Space& space_;
  std::string prefix_;
  std::map<ir::NodeId, std::string> names_;
  std::string code_;
};

// The kind-specific generators (gen_*.cpp).
KernelCode gen_elementwise(const GenCtx& c);
KernelCode gen_leaf(const GenCtx& c);
KernelCode gen_reduce(const GenCtx& c);
KernelCode gen_matmul(const GenCtx& c);
KernelCode gen_movement(const GenCtx& c);
KernelCode gen_native(const GenCtx& c);

// The 32 x 32-tile GEMM of gen_matmul (small products), for other producers of
// its operands (conv's implicit im2col). A shader with kTile32Shared among its
// declarations runs tile32_main() with 256 threads and a workgroup grid of
// (ceil(N / 32), ceil(M / 32), batches): it computes C[m, n] = sum over k of
// A[m, k] B[k, n] for k from k0 (a uint the caller declares and sets first) on
// for kchunk, and runs `result` for each m < M, n < N with the sum in `acc`.
// The loads fill registers ra0..3 / rb0..3 (or va / vb) for the K tile at k0
// from tid, m0 and n0; the stash moves them to shared memory.
struct TileLoads {
  std::string load, stash;
};
inline constexpr const char* kTile32Shared =
    "shared vec4 As[32][8];\nshared vec4 Bs[32][8];\nshared float Cs[4][32][33];\n";
// Scalar loaders: `a_code` sets float v to A[gm, gk] and `b_code` to B[gk, gn] (uint gm, gk, gn), zero outside.
TileLoads scalar_tile_loads(const std::string& a_code, const std::string& b_code);
std::string tile32_main(std::int64_t M, std::int64_t N, std::int64_t kchunk, const TileLoads& loads,
                        const std::string& result);

// Groups for `n` invocations of `local` threads, capped for grid-stride loops.
std::array<std::uint32_t, 3> groups_for(std::uint64_t n, std::uint32_t local, const Caps& caps);
std::string u(std::int64_t v);  // "123u"

}  // namespace rlx::backends::vulkan
