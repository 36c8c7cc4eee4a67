// plan_memory: one arena for every intermediate buffer. Live ranges are
// kernel-index intervals; placement is greedy by size (largest first, each at
// the lowest offset that fits between the buffers live at the same time, best
// fit among the gaps), as in TFLite's arena planner. Without reuse across
// dtypes, buffers of different dtypes never share bytes, live or not.
#include <algorithm>
#include <limits>
#include <vector>

#include "rlx/compile/pipeline.hpp"

namespace rlx::compile::passes {

namespace {
std::int64_t align_up(std::int64_t v, std::int64_t a) { return (v + a - 1) / a * a; }

struct Interval {
  BufferId id;
  ir::DType dtype;
  std::int64_t size;
  std::int64_t first, last;  // inclusive kernel indices
  std::int64_t offset = -1;
  bool overlaps_in_time(const Interval& o) const { return first <= o.last && o.first <= last; }
};
}  // namespace

void plan_memory(LirModule& m, std::int64_t alignment, bool reuse_across_dtypes) {
  alignment = std::max<std::int64_t>(alignment, 1);
  const auto n = m.buffers.size();
  const auto end = std::int64_t(m.kernels.size());
  constexpr auto kNever = std::numeric_limits<std::int64_t>::max();
  std::vector<std::int64_t> first(n, kNever), last(n, -1);
  auto root = [&](BufferId b) { return std::size_t(m.buffer(b).root); };
  for (std::int64_t k = 0; k < end; ++k) {
    const Kernel& kr = m.kernels[std::size_t(k)];
    // A kernel's outputs overlap its inputs in time, so they never share
    // bytes: kernels may read inputs after writing outputs.
    for (auto b : kr.outputs) {
      first[root(b)] = std::min(first[root(b)], k);
      last[root(b)] = std::max(last[root(b)], k);
    }
    for (auto b : kr.inputs) last[root(b)] = std::max(last[root(b)], k);
  }
  for (auto b : m.outputs) last[root(b)] = end;

  std::vector<Interval> items;
  m.memory = MemoryPlan{};
  m.memory.alignment = alignment;
  for (auto& b : m.buffers) {
    if (b.root != b.id) {
      ++m.memory.view_count;
      continue;
    }
    if (b.role != BufferRole::Arena) continue;
    b.arena_offset = 0;  // zero-size buffers keep a valid offset and take no space
    auto size = align_up(b.nbytes(), alignment);
    m.memory.naive_bytes += size;
    auto i = std::size_t(b.id);
    auto from = first[i] == kNever ? 0 : first[i];  // never written: only a module without kernels
    if (size > 0) items.push_back({b.id, b.dtype, size, from, std::max(last[i], from)});
  }
  std::stable_sort(items.begin(), items.end(), [](const Interval& a, const Interval& b) {
    return a.size != b.size ? a.size > b.size : a.first < b.first;
  });
  std::vector<const Interval*> placed, live;  // live: placed buffers `it` may not share bytes with
  for (auto& it : items) {
    live.clear();
    for (auto* p : placed)
      if (p->overlaps_in_time(it) || (!reuse_across_dtypes && p->dtype != it.dtype)) live.push_back(p);
    std::sort(live.begin(), live.end(), [](auto* a, auto* b) { return a->offset < b->offset; });
    std::int64_t cursor = 0, best = -1, best_gap = kNever;
    for (auto* p : live) {
      auto gap = p->offset - cursor;
      if (gap >= it.size && gap < best_gap) best = cursor, best_gap = gap;
      cursor = std::max(cursor, p->offset + p->size);
    }
    it.offset = best >= 0 ? best : cursor;
    m.buffers[std::size_t(it.id)].arena_offset = it.offset;
    m.memory.arena_bytes = std::max(m.memory.arena_bytes, it.offset + it.size);
    placed.push_back(&it);
  }
}

}  // namespace rlx::compile::passes
