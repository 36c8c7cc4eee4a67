#pragma once
// Op sharding (docs/compile.md, "Sharding"): the ways to cut one node into pieces with no data dependency
// between them, what each piece moves in bytes, and whether running the pieces on workers beats running
// the op whole. Three questions and nothing else: the module does no graph surgery. An option names the
// operands, axes and ranges; the caller emits the narrows and the concat or sum, or ships ranges to
// workers (runtime::shard_placement, include/rlx/runtime/shard_placement.hpp, does both from the backends'
// cost models).
//
//   auto options = compile::shard::shardings(graph, node, 4);
//   auto pick = compile::shard::choose(options, workers, link, {.shared_resident = true}, local_rate);
//   if (!pick) ...  // run it whole
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "rlx/ir/graph.hpp"

namespace rlx::compile::shard {

// [start, start + length) along one axis.
struct Range {
  std::int64_t start = 0, length = 0;
  std::int64_t end() const { return start + length; }
  bool operator==(const Range&) const = default;
};

// [0, extent) cut into min(n, extent) contiguous, disjoint ranges that cover it, their lengths differing by at
// most one (the longer ones first); none for an empty axis. rlx::Error when n < 1 or extent < 0.
std::vector<Range> split_extent(std::int64_t extent, int n);

// How an op is cut. Rows, Columns and Reduction are matmul's ([.., M, K] x [.., K, N]: M, N, K); Batch and
// OutChannels conv's (and Batch attention's); Heads attention's; Axis an elementwise op's output axis.
enum class Cut : std::uint8_t { Rows, Columns, Reduction, Batch, OutChannels, Heads, Axis };
std::string_view cut_name(Cut c);  // "rows", "columns", "reduction", "batch", "out_channels", "heads", "axis"

// How the pieces' results become the op's: concatenated along an output axis, or summed (a reduction cut's
// partial products, each the op's whole shape).
enum class Recombine : std::uint8_t { Concat, Sum };

// How one operand of the node is fed to the pieces: sliced along one of its axes (piece p gets `ranges[p]`),
// or shared (every piece gets all of it).
struct OperandCut {
  std::size_t operand = 0;           // index into the node's inputs
  std::optional<std::int64_t> axis;  // the operand's axis that is cut; nullopt: shared
  std::vector<Range> ranges;         // one per piece along `axis`; empty when shared
  std::int64_t bytes = 0;            // the whole operand's bytes
  bool shared() const { return !axis.has_value(); }
};

// One way to cut a node into pieces(). The ranges of every sliced operand are contiguous and cover its axis;
// they are disjoint too, except k's and v's under grouped-query attention when a piece boundary falls inside
// a group of query heads (both pieces then read that kv head).
struct ShardOption {
  ir::NodeId node = 0;
  ir::OpKind op = ir::OpKind::Input;
  Cut cut = Cut::Rows;
  std::int64_t extent = 0;           // the length of the axis that is cut (M, N, K, batch, channels, heads, ...)
  std::vector<Range> ranges;         // the pieces along it: contiguous, disjoint, covering [0, extent)
  std::vector<OperandCut> operands;  // one per input of the node, in order
  Recombine recombine = Recombine::Concat;
  std::int64_t output_axis = 0;  // the concat axis of the result (Concat); the result's ranges are `ranges`
  // Costs. FLOPs follow the runtime's cost model (a matmul 2*M*N*K); bytes are each tensor's storage.
  double whole_flops = 0;                  // the op run whole
  std::vector<double> flops;               // each piece's
  std::vector<std::int64_t> sliced_bytes;  // each piece's share of the sliced operands (they cross a link once)
  std::int64_t shared_bytes = 0;           // the shared operands (each worker needs them, unless resident)
  std::vector<std::int64_t> result_bytes;  // each piece's result, coming back

  std::size_t pieces() const { return ranges.size(); }
  // "matmul %4 by rows into 3 (22,21,21): a sliced on axis 0, b shared; concat on axis 0"
  std::string describe() const;
};

// The ways to cut node `node` of `graph` into `n` pieces that have no data dependency between them:
//   matmul:          by rows (a's row axis; b shared), by columns (b's column axis; a shared), and by K
//                    (a's and b's K axes; the partial products are summed);
//   conv1d/conv2d:   by batch (weights and bias shared) and, with groups = 1, by out-channel (x shared; w and
//                    the bias sliced);
//   elementwise ops: by any axis of the output of length >= 2 (operands broadcast along it are shared);
//   attention:       by heads (q sliced, k and v by their kv heads: a piece of query heads reads the kv heads
//                    serving them; a mask sliced when it has a head axis, else shared) and by batch.
// Fewer than n pieces when the axis is shorter than n; an axis of length 1 gives no option, and so does n = 1.
// Any other op has no shardings: the list is empty. rlx::Error, naming the node, when `node` is out of range,
// n < 1, or the node or its operands have symbolic dims (bind them first).
std::vector<ShardOption> shardings(const ir::Graph& graph, ir::NodeId node, int n);

// ---- choosing ----

// The link between the caller and a worker: each message pays the latency, then bytes at the bandwidth.
struct LinkCost {
  double latency_s = 0;
  double bytes_per_s = 0;
};

// A worker: its FLOP rate, and whether its cost model may be ranked at all (the caller fills `rankable` from
// its cost model: the seed's CostCalibration::is_rankable, which runtime::worker_cost supplies; a worker
// that is not rankable is excluded and reported). A `local` worker shares memory
// with the caller, so nothing crosses the link to it.
struct WorkerCost {
  std::string name;
  double flops_per_s = 0;
  bool rankable = true;
  bool local = false;
};

// Whether the shared operands are already on every worker (data-parallel weights), so that only the sliced
// bytes and the results move.
struct Residency {
  bool shared_resident = false;
};

struct Exclusion {
  std::string worker;
  std::string reason;
};

// One piece on one worker, with its predicted times.
struct PieceRun {
  std::size_t piece = 0;
  std::size_t worker = 0;  // index into the workers given to choose
  double compute_s = 0, transfer_s = 0;
};

struct Choice {
  std::size_t option_index = 0;  // into the options given to choose
  ShardOption option;
  std::vector<PieceRun> runs;        // one per piece, in piece order
  std::vector<std::string> workers;  // the names of the workers used, in worker order
  double split_s = 0;                // the slowest worker's compute plus transfer
  double whole_s = 0;                // the op's FLOPs at local_rate
  std::vector<Exclusion> excluded;
  // "split: matmul %2 by rows into 4 (256,256,256,256): ...; concat on axis 0; on w0, w1, w2, w3: 1.11 ms
  // against 21.5 ms whole"
  std::string why;
};

// What choose saw, also when it answers "run it whole".
struct ChoiceReport {
  double whole_s = 0;
  std::vector<double> option_s;  // each option's best split time (infinity when no worker may run it)
  std::vector<Exclusion> excluded;
  std::string why;  // the Choice's, or "run whole: <why>"
};

// Prices every option (all of one node, as shardings returns them) against running the op whole (whole_flops /
// local_rate). Each option's pieces go to the workers greedily, largest first, each to the worker that would finish it
// soonest; a worker's time is the sum over its pieces of FLOPs / its rate, plus, unless it is local, per piece the
// link's latency and (sliced + result bytes) / bandwidth, and once the shared bytes / bandwidth unless they are
// resident. The option's time is its slowest worker's. Returns the fastest option when it beats running whole, else
// nullopt (so too without options or without usable workers). Workers that are not rankable, or whose FLOP rate is not
// a positive number, are excluded and reported (in the Choice, and in *report when given). rlx::Error when
// local_rate is not positive or the link's bandwidth is not positive or its latency negative.
std::optional<Choice> choose(std::span<const ShardOption> options, std::span<const WorkerCost> workers, LinkCost link,
                             Residency residency, double local_rate, ChoiceReport* report = nullptr);

}  // namespace rlx::compile::shard
