#ifdef RLX_HAVE_VULKAN
// The Vulkan backend: traits, compile_lir and the executable.
//
// compile_lir lays out one device-local arena per executable (the LIR memory
// plan, then a region for the inputs, scratch for raw kernels' operands and
// the status words), one weights buffer shared by clones (params, then
// constants) and one host-visible staging buffer (inputs, outputs, host
// kernels' operands). Every kernel becomes shader dispatches, a raw custom
// kernel, or a host kernel run by the CPU backend on staged copies. Runs
// between host kernels form segments, each one command buffer recorded once
// per executable; run() copies inputs into staging, submits each segment and
// waits on a fence, runs the host kernels in between, and copies outputs back.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>

#include "backends/vulkan/codegen.hpp"
#include "backends/vulkan/context.hpp"
#include "backends/vulkan/spirv.hpp"
#include "rlx/backends/vulkan/vulkan_backend.hpp"
#include "rlx/error.hpp"
#include "rlx/runtime/custom_kernels.hpp"
#include "rlx/runtime/handle_checks.hpp"
#include "rlx/runtime/host_kernel.hpp"
#include "rlx/runtime/pending_run.hpp"

namespace rlx::backends::vulkan {

namespace {

using compile::BufferId;
using compile::BufferRole;
using Clock = std::chrono::steady_clock;

constexpr std::uint64_t kAlign = 64;
std::uint64_t align(std::uint64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// The arena and the weights can outgrow what one binding shows a shader
// (maxStorageBufferRange: 128 MiB on lavapipe, 4 GiB on NVIDIA). Each is bound
// as windows of `span` bytes starting every `stride` = span / 2 bytes, so that
// any range of up to `stride` bytes lies inside one window; a range that ends
// within the first span uses window 0, so a graph that fits one binding sees
// one. Window w of the arena is binding 2w, of the weights 2w + 1.
struct Windows {
  std::uint64_t span, stride;
  explicit Windows(const Caps& caps)
      : span(caps.max_storage_range / caps.storage_align * caps.storage_align),
        stride(span / 2 / caps.storage_align * caps.storage_align) {}
  std::uint64_t count(std::uint64_t bytes) const {
    return bytes <= span ? 1 : (bytes - span + stride - 1) / stride + 1;
  }
  // The window holding [off, off + n) and the offset in it.
  std::optional<std::pair<std::uint64_t, std::uint64_t>> locate(std::uint64_t off, std::uint64_t n) const {
    if (off + n <= span) return std::pair{std::uint64_t(0), off};
    const std::uint64_t w = off / stride;
    for (std::uint64_t v : {w, w - 1})
      if (v <= w && off >= v * stride && off + n <= v * stride + span) return std::pair{v, off - v * stride};
    return std::nullopt;
  }
  // Window w's descriptor range in a buffer of `bytes` (a window past the end shows window 0).
  VkDescriptorBufferInfo info(VkBuffer buf, std::uint64_t w, std::uint64_t bytes) const {
    if (w * stride >= bytes) w = 0;
    return {buf, w * stride, std::min(span, bytes - w * stride)};
  }
};

enum class Where : std::uint8_t { Arena, Weights, Staging };
struct Copy {
  Where src;
  std::uint64_t src_off;
  Where dst;
  std::uint64_t dst_off;
  std::uint64_t bytes;
  int input = -1;  // the graph input it brings in (not copied while the input is bound to a handle)
};

struct GpuKernel {
  std::size_t kernel = 0;
  std::vector<std::pair<std::shared_ptr<Pipeline>, std::array<std::uint32_t, 3>>> dispatches;
  int raw_set = -1;         // a raw custom kernel: its descriptor set (binding 1 = its operand offsets)
  std::uint32_t raw_n = 0;  // a raw kernel's output elements (push constant 0)
  std::vector<Copy> pre;    // a raw kernel's operands outside the arena, copied into it first
};

struct HostStep {
  std::size_t kernel = 0;
  runtime::StagedKernel prototype;
  std::vector<std::uint64_t> in_off, out_off;  // in staging
};

struct Segment {
  std::vector<Copy> head;
  std::vector<std::size_t> gpu;  // indices into Plan::gpu
  std::vector<Copy> tail;
  int host = -1;  // the host step run after it
};

// Immutable after compile_lir; shared by clones.
struct Plan {
  std::shared_ptr<Context> ctx;
  std::vector<std::string> kernel_names, status_messages;
  std::uint64_t arena_bytes = 0, staging_bytes = 0, weights_bytes = 0;
  std::vector<std::uint64_t> in_staging, in_bytes, out_staging, out_bytes, param_off, param_bytes;
  std::vector<std::uint64_t> in_at;  // each input's place in the arena, after the memory plan: kept between runs
  std::vector<Copy> out_to_input;    // each output's place, as the source of a copy (feed_handle sets the target)
  std::uint64_t status_staging = 0;
  std::uint64_t status_at = 0;  // the status words' arena offset
  std::vector<GpuKernel> gpu;
  std::vector<HostStep> host;
  std::vector<Segment> segments;
  std::vector<std::vector<std::uint32_t>> raw_offsets;  // per raw kernel: operand element offsets
  GpuBuffer raw_offsets_buf;                            // raw_offsets, 256 bytes apart
};

struct Weights {
  GpuBuffer buf;
};

class VulkanExecutable final : public runtime::ExecutableGraph {
 public:
  VulkanExecutable(std::shared_ptr<const Plan> plan, std::shared_ptr<Weights> weights);
  ~VulkanExecutable() override;
  VulkanExecutable(const VulkanExecutable&) = delete;
  VulkanExecutable& operator=(const VulkanExecutable&) = delete;

  void set_param(std::size_t index, const void* data, std::size_t nbytes) override;
  void run(std::span<const void* const> inputs, std::span<void* const> outputs) override;
  std::unique_ptr<runtime::ExecutableGraph> clone() const override {
    return std::make_unique<VulkanExecutable>(plan_, weights_);
  }
  runtime::ExecutableCapabilities capabilities() const override {
    return {.clone = true,
            .persistent_handles = true,
            .gpu_handles = true,
            .kv_resident = true,
            .async_pipeline = true,
            .read_outputs = true,
            .kernel_times = true};
  }
  // async_pipeline: commit_no_wait stages the inputs, runs every segment but the last to completion (the host
  // kernels between them included) and submits the last; sync_pending waits for its fence and copies the outputs
  // out. Every other call in between throws, naming the method. run_pipelined runs the sets one after the other
  // (one staging buffer: the sets do not overlap yet).
  void commit_no_wait(std::span<const void* const> inputs, std::span<void* const> outputs) override;
  void sync_pending() override;
  void run_pipelined(std::span<const std::vector<const void*>> inputs,
                     std::span<const std::vector<void*>> outputs) override;
  // Copies out only the outputs asked for (outputs[j] != nullptr).
  void run_read_outputs(std::span<const void* const> inputs, std::span<void* const> outputs) override;
  // A handle is the input's own place in the arena (after the memory plan, so no kernel's temporary reuses it):
  // runs copy nothing in for it, and feed_handle copies an output there at the end of each run, on the device.
  void bind_handle(std::size_t input_index, const void* data, std::size_t nbytes) override;
  void read_handle(std::size_t input_index, void* dst, std::size_t nbytes) const override;
  void feed_handle(std::size_t input_index, std::size_t output_index) override;
  // GPU timestamps are always on (a pair of timestamp writes per kernel costs no host time).
  void set_profiling(bool) override {}
  std::vector<KernelTime> kernel_times() const override {
    require_idle("kernel_times");
    return times();
  }
  std::vector<KernelTime> times() const;

 private:
  VkBuffer buffer(Where w) const {
    return w == Where::Arena ? arena_.get() : w == Where::Weights ? weights_->buf.get() : staging_.get();
  }
  void copy(VkCommandBuffer cb, const Copy& c) const;
  void record(std::size_t s);
  void record_all();  // again, after a handle is bound or fed
  void require_idle(std::string_view method) const;
  void begin(std::span<const void* const> inputs);  // stages, runs all but the last segment, submits the last
  void end(std::span<void* const> outputs);         // waits for the last segment, checks, copies out
  runtime::HandleChecks handle_checks() const { return {"vulkan", plan_->in_bytes, plan_->out_bytes}; }

  std::shared_ptr<const Plan> plan_;
  std::shared_ptr<Weights> weights_;
  Context& ctx_;
  GpuBuffer arena_, staging_;
  VkDescriptorPool pool_ = VK_NULL_HANDLE;
  std::vector<VkDescriptorSet> sets_;  // [0] arena + weights, then one per raw kernel
  VkCommandPool cmd_pool_ = VK_NULL_HANDLE;
  std::vector<VkCommandBuffer> cbs_;
  VkFence fence_ = VK_NULL_HANDLE;
  VkQueryPool queries_ = VK_NULL_HANDLE;
  std::vector<runtime::StagedKernel> host_;  // clones of the plan's host kernels (own arenas)
  std::vector<std::vector<const void*>> host_in_;
  std::vector<std::vector<void*>> host_out_;
  std::vector<double> host_micros_;
  bool ran_ = false;
  bool pending_ = false;  // commit_no_wait's run, until sync_pending
  std::vector<void*> pending_out_;
  std::vector<bool> bound_;                                 // per input: bound with bind_handle
  std::vector<std::pair<std::size_t, std::size_t>> feeds_;  // (input, output): copied into the handle after a run
};

VulkanExecutable::VulkanExecutable(std::shared_ptr<const Plan> plan, std::shared_ptr<Weights> weights)
    : plan_(std::move(plan)),
      weights_(std::move(weights)),
      ctx_(*plan_->ctx),
      arena_(ctx_, plan_->arena_bytes, false, "the arena"),
      staging_(ctx_, plan_->staging_bytes, true, "host staging") {
  const Vk& vk = ctx_.vk;
  VkDevice dev = ctx_.device;
  const std::uint32_t nsets = 1 + std::uint32_t(plan_->raw_offsets.size()), nb = ctx_.caps.bindings;
  VkDescriptorPoolSize ps{VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, nb * nsets};
  VkDescriptorPoolCreateInfo pi{VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO};
  pi.maxSets = nsets;
  pi.poolSizeCount = 1;
  pi.pPoolSizes = &ps;
  ctx_.check(vk.vkCreateDescriptorPool(dev, &pi, nullptr, &pool_), "vkCreateDescriptorPool");
  std::vector<VkDescriptorSetLayout> layouts(nsets, ctx_.set_layout);
  VkDescriptorSetAllocateInfo ai{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO};
  ai.descriptorPool = pool_;
  ai.descriptorSetCount = nsets;
  ai.pSetLayouts = layouts.data();
  sets_.resize(nsets);
  ctx_.check(vk.vkAllocateDescriptorSets(dev, &ai, sets_.data()), "vkAllocateDescriptorSets");
  // Set 0: the windows of the arena (even bindings) and of the weights (odd). A raw kernel's set: the arena
  // at binding 0 (one window: compile checked), its operand offsets at 1; every other binding shows window 0.
  const Windows win(ctx_.caps);
  std::vector<VkDescriptorBufferInfo> infos;
  infos.reserve(std::size_t(nb) * nsets);
  std::vector<VkWriteDescriptorSet> writes;
  for (std::uint32_t s = 0; s < nsets; ++s)
    for (std::uint32_t b = 0; b < nb; ++b) {
      const std::uint64_t w = s == 0 ? b / 2 : 0;
      if (b % 2 == 0)
        infos.push_back(win.info(arena_.get(), w, plan_->arena_bytes));
      else if (s == 0 || b > 1)
        infos.push_back(win.info(weights_->buf.get(), w, plan_->weights_bytes));
      else
        infos.push_back({plan_->raw_offsets_buf.get(), 256 * (s - 1), 256});
      VkWriteDescriptorSet wr{VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET};
      wr.dstSet = sets_[s];
      wr.dstBinding = b;
      wr.descriptorCount = 1;
      wr.descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
      wr.pBufferInfo = &infos.back();
      writes.push_back(wr);
    }
  vk.vkUpdateDescriptorSets(dev, std::uint32_t(writes.size()), writes.data(), 0, nullptr);

  VkCommandPoolCreateInfo cp{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
  cp.queueFamilyIndex = ctx_.queue_family;
  ctx_.check(vk.vkCreateCommandPool(dev, &cp, nullptr, &cmd_pool_), "vkCreateCommandPool");
  VkCommandBufferAllocateInfo ci{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
  ci.commandPool = cmd_pool_;
  ci.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
  ci.commandBufferCount = std::uint32_t(plan_->segments.size());
  cbs_.resize(plan_->segments.size());
  ctx_.check(vk.vkAllocateCommandBuffers(dev, &ci, cbs_.data()), "vkAllocateCommandBuffers");
  VkFenceCreateInfo fi{VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
  ctx_.check(vk.vkCreateFence(dev, &fi, nullptr, &fence_), "vkCreateFence");
  if (ctx_.caps.timestamps && !plan_->gpu.empty()) {
    VkQueryPoolCreateInfo qi{VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO};
    qi.queryType = VK_QUERY_TYPE_TIMESTAMP;
    qi.queryCount = 2 * std::uint32_t(plan_->gpu.size());
    ctx_.check(vk.vkCreateQueryPool(dev, &qi, nullptr, &queries_), "vkCreateQueryPool");
  }
  for (const auto& h : plan_->host) {
    runtime::StagedKernel k{h.prototype.exe->clone(), h.prototype.input_bytes, h.prototype.output_bytes};
    auto& in = host_in_.emplace_back();
    auto& out = host_out_.emplace_back();
    for (auto off : h.in_off) in.push_back(staging_.mapped() + off);
    for (auto off : h.out_off) out.push_back(staging_.mapped() + off);
    host_.push_back(std::move(k));
  }
  host_micros_.assign(plan_->host.size(), 0.0);
  bound_.assign(plan_->in_bytes.size(), false);
  for (std::size_t s = 0; s < plan_->segments.size(); ++s) record(s);
}

VulkanExecutable::~VulkanExecutable() {
  const Vk& vk = ctx_.vk;
  VkDevice dev = ctx_.device;
  if (pending_) vk.vkWaitForFences(dev, 1, &fence_, VK_TRUE, UINT64_MAX);  // its buffers are about to go
  if (queries_) vk.vkDestroyQueryPool(dev, queries_, nullptr);
  if (fence_) vk.vkDestroyFence(dev, fence_, nullptr);
  if (cmd_pool_) vk.vkDestroyCommandPool(dev, cmd_pool_, nullptr);
  if (pool_) vk.vkDestroyDescriptorPool(dev, pool_, nullptr);
}

void VulkanExecutable::copy(VkCommandBuffer cb, const Copy& c) const {
  if (!c.bytes) return;
  VkBufferCopy region{c.src_off, c.dst_off, c.bytes};
  ctx_.vk.vkCmdCopyBuffer(cb, buffer(c.src), buffer(c.dst), 1, &region);
}

void VulkanExecutable::record(std::size_t s) {
  const Vk& vk = ctx_.vk;
  const Segment& seg = plan_->segments[s];
  VkCommandBuffer cb = cbs_[s];
  VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
  ctx_.check(vk.vkBeginCommandBuffer(cb, &bi), "vkBeginCommandBuffer");
  if (queries_ && !seg.gpu.empty())
    vk.vkCmdResetQueryPool(cb, queries_, 2 * std::uint32_t(seg.gpu.front()), 2 * std::uint32_t(seg.gpu.size()));
  if (s == 0) vk.vkCmdFillBuffer(cb, arena_.get(), plan_->status_at, kAlign, 0);
  for (const auto& c : seg.head)
    if (c.input < 0 || !bound_[std::size_t(c.input)]) copy(cb, c);
  barrier(vk, cb);
  for (std::size_t g : seg.gpu) {
    const GpuKernel& k = plan_->gpu[g];
    if (!k.pre.empty()) {
      for (const auto& c : k.pre) copy(cb, c);
      barrier(vk, cb);
    }
    if (queries_) vk.vkCmdWriteTimestamp(cb, VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, queries_, 2 * std::uint32_t(g));
    VkDescriptorSet set = sets_[std::size_t(k.raw_set < 0 ? 0 : k.raw_set)];
    vk.vkCmdBindDescriptorSets(cb, VK_PIPELINE_BIND_POINT_COMPUTE, ctx_.pipeline_layout, 0, 1, &set, 0, nullptr);
    if (k.raw_set >= 0) vk.vkCmdPushConstants(cb, ctx_.pipeline_layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, 4, &k.raw_n);
    for (const auto& [pipe, groups] : k.dispatches) {
      vk.vkCmdBindPipeline(cb, VK_PIPELINE_BIND_POINT_COMPUTE, pipe->pipeline);
      vk.vkCmdDispatch(cb, groups[0], groups[1], groups[2]);
      barrier(vk, cb);
    }
    if (queries_) vk.vkCmdWriteTimestamp(cb, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, queries_, 2 * std::uint32_t(g) + 1);
  }
  for (const auto& c : seg.tail) copy(cb, c);
  // The fed handles last: the kernels that read them are past the barrier above, and the next run's first
  // barrier orders these writes before its kernels.
  if (s + 1 == plan_->segments.size())
    for (auto [i, j] : feeds_) {
      Copy c = plan_->out_to_input[j];
      c.dst_off = plan_->in_at[i];
      if (c.src != Where::Arena || c.src_off != c.dst_off) copy(cb, c);
    }
  host_barrier(vk, cb);
  ctx_.check(vk.vkEndCommandBuffer(cb), "vkEndCommandBuffer");
}

void VulkanExecutable::record_all() {
  ctx_.check(ctx_.vk.vkResetCommandPool(ctx_.device, cmd_pool_, 0), "vkResetCommandPool");
  for (std::size_t s = 0; s < plan_->segments.size(); ++s) record(s);
}

void VulkanExecutable::bind_handle(std::size_t input_index, const void* data, std::size_t nbytes) {
  require_idle("bind_handle");
  handle_checks().input("bind_handle", input_index, nbytes);
  if (nbytes) {
    GpuBuffer up(ctx_, nbytes, true, "a handle upload");
    std::memcpy(up.mapped(), data, nbytes);
    ctx_.run_once(
        [&](VkCommandBuffer cb) {
          VkBufferCopy region{0, plan_->in_at[input_index], nbytes};
          ctx_.vk.vkCmdCopyBuffer(cb, up.get(), arena_.get(), 1, &region);
        },
        "bind_handle: uploading");
  }
  if (!bound_[input_index]) {
    bound_[input_index] = true;
    record_all();
  }
}

void VulkanExecutable::read_handle(std::size_t input_index, void* dst, std::size_t nbytes) const {
  require_idle("read_handle");
  handle_checks().input("read_handle", input_index, nbytes);
  handle_checks().bound("read_handle", input_index, bound_);
  if (!nbytes) return;
  GpuBuffer down(ctx_, nbytes, true, "a handle download");
  ctx_.run_once(
      [&](VkCommandBuffer cb) {
        VkBufferCopy region{plan_->in_at[input_index], 0, nbytes};
        ctx_.vk.vkCmdCopyBuffer(cb, arena_.get(), down.get(), 1, &region);
        host_barrier(ctx_.vk, cb);
      },
      "read_handle");
  std::memcpy(dst, down.mapped(), nbytes);
}

void VulkanExecutable::feed_handle(std::size_t input_index, std::size_t output_index) {
  require_idle("feed_handle");
  handle_checks().feed(input_index, output_index, bound_);
  // An output that is a part of the handle it feeds (a view of the input, not the whole of it) would be copied
  // onto itself: the copy's regions would overlap.
  const Copy& from = plan_->out_to_input[output_index];
  const std::uint64_t at = plan_->in_at[input_index], n = plan_->in_bytes[input_index];
  if (from.src == Where::Arena && from.src_off != at && from.src_off < at + n && at < from.src_off + n)
    throw Error(fmt::format("vulkan: feed_handle: output {} overlaps the handle of input {} it would be copied into",
                            output_index, input_index));
  for (auto& f : feeds_)
    if (f.first == input_index) {
      f.second = output_index;
      return record_all();
    }
  feeds_.emplace_back(input_index, output_index);
  record_all();
}

void VulkanExecutable::set_param(std::size_t index, const void* data, std::size_t nbytes) {
  require_idle("set_param");
  if (index >= plan_->param_bytes.size())
    throw Error(fmt::format("vulkan: param index {} out of range ({} params)", index, plan_->param_bytes.size()));
  if (nbytes != plan_->param_bytes[index])
    throw Error(fmt::format("vulkan: param {} expects {} bytes, got {}", index, plan_->param_bytes[index], nbytes));
  if (!nbytes) return;
  GpuBuffer up(ctx_, nbytes, true, "a param upload");
  std::memcpy(up.mapped(), data, nbytes);
  ctx_.run_once(
      [&](VkCommandBuffer cb) {
        VkBufferCopy region{0, plan_->param_off[index], nbytes};
        ctx_.vk.vkCmdCopyBuffer(cb, up.get(), weights_->buf.get(), 1, &region);
      },
      "uploading a param");
}

void VulkanExecutable::run(std::span<const void* const> inputs, std::span<void* const> outputs) {
  for (std::size_t j = 0; j < outputs.size() && j < plan_->out_bytes.size(); ++j)
    if (!outputs[j] && plan_->out_bytes[j])
      throw Error(fmt::format("vulkan: run() got a null pointer for output {} (run_read_outputs skips outputs)", j));
  run_read_outputs(inputs, outputs);
}

void VulkanExecutable::require_idle(std::string_view method) const {
  if (pending_) throw Error(fmt::format("vulkan: {}: a commit_no_wait is pending; call sync_pending first", method));
}

void VulkanExecutable::run_read_outputs(std::span<const void* const> inputs, std::span<void* const> outputs) {
  require_idle("run");
  if (outputs.size() != plan_->out_bytes.size())
    throw Error(fmt::format("vulkan: run() got {} outputs, expected {}", outputs.size(), plan_->out_bytes.size()));
  begin(inputs);
  end(outputs);
}

void VulkanExecutable::commit_no_wait(std::span<const void* const> inputs, std::span<void* const> outputs) {
  require_idle("commit_no_wait");
  if (outputs.size() != plan_->out_bytes.size())
    throw Error(
        fmt::format("vulkan: commit_no_wait got {} outputs, expected {}", outputs.size(), plan_->out_bytes.size()));
  begin(inputs);
  pending_ = true;
  pending_out_.assign(outputs.begin(), outputs.end());
}

void VulkanExecutable::sync_pending() {
  if (!pending_) return;
  pending_ = false;  // whatever the wait says: the run is over
  end(pending_out_);
}

void VulkanExecutable::run_pipelined(std::span<const std::vector<const void*>> inputs,
                                     std::span<const std::vector<void*>> outputs) {
  require_idle("run_pipelined");
  runtime::run_sets_in_order("vulkan", inputs, outputs, [this](auto in, auto out) { run_read_outputs(in, out); });
}

void VulkanExecutable::begin(std::span<const void* const> inputs) {
  const Plan& p = *plan_;
  if (inputs.size() != p.in_bytes.size())
    throw Error(fmt::format("vulkan: run() got {} inputs, expected {}", inputs.size(), p.in_bytes.size()));
  std::byte* st = staging_.mapped();
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    if (!p.in_bytes[i] || bound_[i]) continue;
    if (!inputs[i]) throw Error(fmt::format("vulkan: run() got a null pointer for input {}, which has no handle", i));
    std::memcpy(st + p.in_staging[i], inputs[i], p.in_bytes[i]);
  }
  for (std::size_t s = 0; s + 1 < p.segments.size(); ++s) {
    ctx_.submit(cbs_[s], fence_);
    ctx_.wait(fence_, "waiting for a run");
    const auto h = std::size_t(p.segments[s].host);  // every segment but the last ends at a host kernel
    auto t0 = Clock::now();
    host_[h].run(host_in_[h], host_out_[h]);
    host_micros_[h] = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
  }
  ctx_.submit(cbs_.back(), fence_);
}

void VulkanExecutable::end(std::span<void* const> outputs) {
  const Plan& p = *plan_;
  const std::byte* st = staging_.mapped();
  ctx_.wait(fence_, "waiting for a run");
  ran_ = true;
  std::uint32_t status[3];
  std::memcpy(status, st + p.status_staging, sizeof status);
  if (status[0]) {
    auto k = std::size_t(status[0] - 1);
    auto value = std::int64_t(std::uint64_t(status[1]) | std::uint64_t(status[2]) << 32);
    throw Error(fmt::format("vulkan kernel '{}': index {} {}", p.kernel_names.at(k), value, p.status_messages.at(k)));
  }
  for (std::size_t j = 0; j < outputs.size(); ++j)
    if (p.out_bytes[j] && outputs[j]) std::memcpy(outputs[j], st + p.out_staging[j], p.out_bytes[j]);
}

std::vector<KernelTime> VulkanExecutable::times() const {
  std::vector<KernelTime> out;
  if (!ran_) return out;
  std::vector<std::uint64_t> ts(2 * plan_->gpu.size());
  if (queries_)
    ctx_.check(ctx_.vk.vkGetQueryPoolResults(ctx_.device, queries_, 0, std::uint32_t(ts.size()), ts.size() * 8,
                                             ts.data(), 8, VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT),
               "vkGetQueryPoolResults");
  std::size_t g = 0, h = 0;
  for (std::size_t k = 0; k < plan_->kernel_names.size(); ++k) {
    if (g < plan_->gpu.size() && plan_->gpu[g].kernel == k) {
      double us = queries_ ? double(ts[2 * g + 1] - ts[2 * g]) * ctx_.caps.timestamp_period_ns / 1000.0 : 0.0;
      out.push_back({plan_->kernel_names[k], us, false});
      ++g;
    } else if (h < plan_->host.size() && plan_->host[h].kernel == k) {
      out.push_back({plan_->kernel_names[k], host_micros_[h], true});
      ++h;
    }
  }
  return out;
}

// ---- compile_lir -----------------------------------------------------------------

std::string custom_name(const compile::Kernel& k) {
  for (const auto& n : k.body.nodes())
    if (n.op == ir::OpKind::Custom) return n.attrs.get_str("op");
  return {};
}

std::shared_ptr<const Plan> build_plan(const std::shared_ptr<Context>& ctx, const compile::LirModule& lir,
                                       const compile::CompileOptions& options, std::shared_ptr<Weights>& weights) {
  auto plan = std::make_shared<Plan>();
  plan->ctx = ctx;
  Context& c = *ctx;

  // Arena: the memory plan, then the inputs, raw kernels' scratch, the status words.
  std::uint64_t arena = align(std::uint64_t(std::max<std::int64_t>(lir.memory.arena_bytes, 0)));
  std::vector<std::uint64_t> input_at;
  for (BufferId id : lir.inputs) {
    input_at.push_back(arena);
    arena = align(arena + std::uint64_t(lir.buffer(id).nbytes()));
  }
  std::uint64_t weights_bytes = 0;
  for (BufferId id : lir.params) {
    plan->param_off.push_back(weights_bytes);
    plan->param_bytes.push_back(std::uint64_t(lir.buffer(id).nbytes()));
    weights_bytes = align(weights_bytes + plan->param_bytes.back());
  }
  std::vector<std::uint64_t> const_off;
  for (const auto& v : lir.constant_values) {
    const_off.push_back(weights_bytes);
    weights_bytes = align(weights_bytes + v.nbytes());
  }

  std::vector<Loc> locs(lir.buffers.size());
  for (const auto& b : lir.buffers) {
    const auto& root = lir.buffer(b.root < 0 ? b.id : b.root);
    if (root.root >= 0 && root.root != root.id)
      throw Error(fmt::format("vulkan: buffer {} is a view of a view ({})", b.id, root.id));
    std::int64_t view = b.root < 0 || b.root == b.id ? 0 : b.view_offset;
    switch (root.role) {
      case BufferRole::Arena: locs[std::size_t(b.id)] = {0, root.arena_offset + view}; break;
      case BufferRole::Input:
        locs[std::size_t(b.id)] = {0, std::int64_t(input_at.at(std::size_t(root.external_index))) + view};
        break;
      case BufferRole::Param:
        locs[std::size_t(b.id)] = {1, std::int64_t(plan->param_off.at(std::size_t(root.external_index))) + view};
        break;
      case BufferRole::Constant:
        locs[std::size_t(b.id)] = {1, std::int64_t(const_off.at(std::size_t(root.external_index))) + view};
        break;
    }
  }

  // Raw custom kernels read every operand from the arena: operands elsewhere get scratch there.
  struct Raw {
    std::size_t kernel;
    const runtime::VulkanKernel* vk;
  };
  std::vector<Raw> raws;
  for (std::size_t ki = 0; ki < lir.kernels.size(); ++ki) {
    const auto& k = lir.kernels[ki];
    if (k.kind != compile::KernelKind::Native) continue;
    if (auto name = custom_name(k); !name.empty())
      if (const auto* rk = runtime::find_vulkan_kernel(name)) raws.push_back({ki, rk});
  }
  std::vector<std::vector<Copy>> raw_pre(raws.size());
  for (std::size_t r = 0; r < raws.size(); ++r) {
    const auto& k = lir.kernels[raws[r].kernel];
    std::vector<std::uint32_t> offs;
    auto operand = [&](BufferId id) {
      Loc l = locs[std::size_t(id)];
      auto bytes = std::uint64_t(lir.buffer(id).nbytes());
      if (l.binding != 0) {
        raw_pre[r].push_back({Where::Weights, std::uint64_t(l.offset), Where::Arena, arena, bytes});
        l = {0, std::int64_t(arena)};
        arena = align(arena + bytes);
      }
      if (l.offset % 4)
        throw Error(fmt::format("vulkan: raw kernel '{}': operand b{} is not 4-byte aligned", k.name, id));
      offs.push_back(std::uint32_t(l.offset / 4));
    };
    for (auto id : k.inputs) operand(id);
    for (auto id : k.outputs) operand(id);
    if (offs.size() > 64) throw Error(fmt::format("vulkan: raw kernel '{}' has more than 64 operands", k.name));
    plan->raw_offsets.push_back(std::move(offs));
  }
  // The status words, then scratch for kernels that split their work over dispatches (sized once every
  // kernel has its shaders).
  const std::uint64_t status_at = arena;
  plan->status_at = status_at;
  const std::uint64_t scratch_at = status_at + kAlign;
  std::uint64_t scratch_bytes = 0;
  plan->weights_bytes = std::max<std::uint64_t>(weights_bytes, kAlign);
  // What generated shaders see: each buffer in a window of its arena or weights (see Windows).
  const Windows win(c.caps);
  auto check_windows = [&](const char* what, std::uint64_t bytes) {
    if (2 * win.count(bytes) > c.caps.bindings)
      throw Error(
          fmt::format("vulkan: the {} needs {} bytes ({:.1f} MiB): {} windows of {:.1f} MiB, more than the {} that "
                      "'{}' binds (maxStorageBufferRange {}, {} storage buffers per shader)",
                      what, bytes, double(bytes) / 1048576.0, win.count(bytes), double(win.span) / 1048576.0,
                      c.caps.bindings / 2, c.info.name, c.caps.max_storage_range, c.caps.bindings));
  };
  check_windows("arena", scratch_at);
  check_windows("weights buffer", weights_bytes);
  auto shader_loc = [&](int binding, std::uint64_t off, std::uint64_t n, const std::string& what) {
    auto at = win.locate(off, n);
    if (!at)
      throw Error(fmt::format("vulkan: {} ({} bytes, {:.1f} MiB) does not fit one binding of '{}' ({:.1f} MiB windows)",
                              what, n, double(n) / 1048576.0, c.info.name, double(win.stride) / 1048576.0));
    if (2 * at->first + std::uint64_t(binding) >= c.caps.bindings)
      check_windows(binding ? "weights buffer" : "arena", off + n);
    return Loc{int(2 * at->first) + binding, std::int64_t(at->second)};
  };
  std::vector<Loc> shader_locs(lir.buffers.size());
  for (const auto& b : lir.buffers)
    shader_locs[std::size_t(b.id)] =
        shader_loc(locs[std::size_t(b.id)].binding, std::uint64_t(locs[std::size_t(b.id)].offset),
                   std::uint64_t(std::max<std::int64_t>(b.nbytes(), 0)), fmt::format("buffer {}", b.id));
  const Loc status_loc = shader_loc(0, status_at, kAlign, "the status words");
  const Loc scratch_loc = shader_loc(0, scratch_at, kMaxScratch, "kernel scratch");

  // Staging: inputs, outputs, host kernels' operands, status words.
  std::uint64_t staging = 0;
  for (BufferId id : lir.inputs) {
    plan->in_staging.push_back(staging);
    plan->in_bytes.push_back(std::uint64_t(lir.buffer(id).nbytes()));
    staging = align(staging + plan->in_bytes.back());
  }
  for (BufferId id : lir.outputs) {
    plan->out_staging.push_back(staging);
    plan->out_bytes.push_back(std::uint64_t(lir.buffer(id).nbytes()));
    staging = align(staging + plan->out_bytes.back());
  }

  auto where = [](const Loc& l) { return l.binding == 0 ? Where::Arena : Where::Weights; };
  Segment seg;
  for (std::size_t i = 0; i < lir.inputs.size(); ++i)
    seg.head.push_back({Where::Staging, plan->in_staging[i], Where::Arena, input_at[i], plan->in_bytes[i], int(i)});
  plan->in_at = input_at;
  std::size_t next_raw = 0;
  for (std::size_t ki = 0; ki < lir.kernels.size(); ++ki) {
    const auto& k = lir.kernels[ki];
    plan->kernel_names.push_back(k.name);
    plan->status_messages.emplace_back();
    GpuKernel g;
    g.kernel = ki;
    if (next_raw < raws.size() && raws[next_raw].kernel == ki) {
      const auto* rk = raws[next_raw].vk;
      const std::string label = k.name + " (custom op '" + custom_name(k) + "')";
      auto spirv = rk->spirv.empty() ? compile_glsl(rk->glsl, label, c.optimize_shaders()) : rk->spirv;
      auto n = std::uint64_t(lir.buffer(k.outputs.at(0)).numel());
      g.raw_n = std::uint32_t(n);
      g.raw_set = int(1 + next_raw);
      g.pre = std::move(raw_pre[next_raw]);
      std::uint64_t groups = std::max<std::uint64_t>(1, (n + rk->local_size[0] - 1) / rk->local_size[0]);
      g.dispatches.push_back({c.pipeline(spirv, label), {std::uint32_t(groups), 1, 1}});
      plan->gpu.push_back(std::move(g));
      seg.gpu.push_back(plan->gpu.size() - 1);
      ++next_raw;
      continue;
    }
    GenCtx gc{lir, k, shader_locs, c.caps, std::uint32_t(ki + 1), status_loc, scratch_loc};
    std::string why;
    if (auto code = generate(gc, &why)) {
      scratch_bytes = std::max(scratch_bytes, code->scratch_bytes);
      for (const auto& d : code->dispatches)
        g.dispatches.push_back({c.pipeline(compile_glsl(d.glsl, k.name, c.optimize_shaders()), k.name), d.groups});
      plan->status_messages.back() = code->status_message;
      plan->gpu.push_back(std::move(g));
      seg.gpu.push_back(plan->gpu.size() - 1);
      continue;
    }
    // No shader: the CPU backend runs this kernel on staged copies of its operands.
    HostStep h;
    h.kernel = ki;
    h.prototype = runtime::compile_host_kernel(lir, ki, options);
    for (std::size_t i = 0; i < k.inputs.size(); ++i) {
      const Loc& l = locs[std::size_t(k.inputs[i])];
      h.in_off.push_back(staging);
      seg.tail.push_back({where(l), std::uint64_t(l.offset), Where::Staging, staging, h.prototype.input_bytes[i]});
      staging = align(staging + h.prototype.input_bytes[i]);
    }
    seg.host = int(plan->host.size());
    plan->segments.push_back(std::move(seg));
    seg = Segment{};
    for (std::size_t j = 0; j < k.outputs.size(); ++j) {
      const Loc& l = locs[std::size_t(k.outputs[j])];
      h.out_off.push_back(staging);
      seg.head.push_back({Where::Staging, staging, where(l), std::uint64_t(l.offset), h.prototype.output_bytes[j]});
      staging = align(staging + h.prototype.output_bytes[j]);
    }
    plan->host.push_back(std::move(h));
  }
  for (std::size_t j = 0; j < lir.outputs.size(); ++j) {
    const Loc& l = locs[std::size_t(lir.outputs[j])];
    seg.tail.push_back({where(l), std::uint64_t(l.offset), Where::Staging, plan->out_staging[j], plan->out_bytes[j]});
    plan->out_to_input.push_back({where(l), std::uint64_t(l.offset), Where::Arena, 0, plan->out_bytes[j]});
  }
  plan->status_staging = staging;
  seg.tail.push_back({Where::Arena, status_at, Where::Staging, staging, 16});
  staging += kAlign;
  plan->segments.push_back(std::move(seg));
  plan->staging_bytes = staging;
  plan->arena_bytes = scratch_at + align(scratch_bytes);
  check_windows("arena", plan->arena_bytes);
  if (!raws.empty() && plan->arena_bytes > win.span)
    throw Error(
        fmt::format("vulkan: raw kernels address the arena through one binding, and this graph's arena ({:.1f} MiB) is "
                    "larger than '{}' binds ({:.1f} MiB)",
                    double(plan->arena_bytes) / 1048576.0, c.info.name, double(win.span) / 1048576.0));

  if (!plan->raw_offsets.empty()) {
    plan->raw_offsets_buf = GpuBuffer(c, 256 * plan->raw_offsets.size(), false, "raw kernel offsets");
    GpuBuffer up(c, 256 * plan->raw_offsets.size(), true, "raw kernel offsets upload");
    for (std::size_t r = 0; r < plan->raw_offsets.size(); ++r)
      std::memcpy(up.mapped() + 256 * r, plan->raw_offsets[r].data(), plan->raw_offsets[r].size() * 4);
    c.run_once(
        [&](VkCommandBuffer cb) {
          VkBufferCopy region{0, 0, up.size()};
          c.vk.vkCmdCopyBuffer(cb, up.get(), plan->raw_offsets_buf.get(), 1, &region);
        },
        "uploading raw kernel offsets");
  }

  // Weights: params start zeroed; constants are uploaded once.
  weights = std::make_shared<Weights>();
  weights->buf = GpuBuffer(c, plan->weights_bytes, false, "params and constants");
  GpuBuffer up(c, plan->weights_bytes, true, "constants upload");
  std::memset(up.mapped(), 0, plan->weights_bytes);
  for (std::size_t i = 0; i < lir.constant_values.size(); ++i)
    if (auto n = lir.constant_values[i].nbytes())
      std::memcpy(up.mapped() + const_off[i], lir.constant_values[i].data(), n);
  c.run_once(
      [&](VkCommandBuffer cb) {
        VkBufferCopy region{0, 0, plan->weights_bytes};
        c.vk.vkCmdCopyBuffer(cb, up.get(), weights->buf.get(), 1, &region);
      },
      "uploading constants");
  return plan;
}

class VulkanBackend final : public runtime::Backend {
 public:
  VulkanBackend() {
    try {
      ctx_ = Context::get();
    } catch (const Error& e) {
      why_ = e.what();
    }
  }
  std::string_view name() const override { return "vulkan"; }
  std::string unavailable_reason() const override { return why_; }
  std::string device_name() const override { return ctx_ ? ctx_->info.name : std::string("vulkan"); }
  runtime::Calibration calibrate() override { return measure_device(); }

  compile::BackendTraits traits() const override {
    using ir::OpKind;
    compile::BackendTraits t;
    t.name = "vulkan";
    // Listed one by one: an op added later is not claimed until a generator handles it (it takes the host tier).
    // Ops with a formula (sigmoid, gelu, silu, softplus, ...) are not listed: they run as their formula.
    for (OpKind op :
         {OpKind::Input,        OpKind::Param,      OpKind::Constant,    OpKind::Iota,       OpKind::RandomUniform,
          OpKind::RandomNormal, OpKind::Neg,        OpKind::Abs,         OpKind::Exp,        OpKind::Log,
          OpKind::Sqrt,         OpKind::Rsqrt,      OpKind::Reciprocal,  OpKind::Tanh,       OpKind::Relu,
          OpKind::Erf,          OpKind::Sin,        OpKind::Cos,         OpKind::Floor,      OpKind::Ceil,
          OpKind::Round,        OpKind::Sign,       OpKind::Not,         OpKind::Add,        OpKind::Sub,
          OpKind::Mul,          OpKind::Div,        OpKind::Pow,         OpKind::Max,        OpKind::Min,
          OpKind::Mod,          OpKind::Eq,         OpKind::Ne,          OpKind::Lt,         OpKind::Le,
          OpKind::Gt,           OpKind::Ge,         OpKind::And,         OpKind::Or,         OpKind::Where,
          OpKind::Cast,         OpKind::Clamp,      OpKind::ReduceSum,   OpKind::ReduceMean, OpKind::ReduceMax,
          OpKind::ReduceMin,    OpKind::ReduceProd, OpKind::ArgMax,      OpKind::ArgMin,     OpKind::MatMul,
          OpKind::Reshape,      OpKind::Permute,    OpKind::Expand,      OpKind::Slice,      OpKind::Concat,
          OpKind::Pad,          OpKind::Gather,     OpKind::IndexSelect, OpKind::ScatterAdd, OpKind::Squeeze,
          OpKind::Unsqueeze,    OpKind::Flip})
      t.native_ops.insert(op);
    for (OpKind op : {OpKind::Softmax, OpKind::LogSoftmax, OpKind::LayerNorm, OpKind::RmsNorm, OpKind::Conv1d,
                      OpKind::Conv2d, OpKind::MaxPool2d, OpKind::AvgPool2d, OpKind::Attention}) {
      t.native_ops.insert(op);
      t.f32_compute_ops.insert(op);
    }
    t.f32_compute_ops.insert(OpKind::MatMul);
    // The dtypes the shaders compute; a kernel with any other (i16, u16, u32, u64, the storage-only types) runs
    // on the host (generate refuses it).
    t.native_dtypes = {vulkan_dtypes().begin(), vulkan_dtypes().end()};
    t.host_fallback = true;
    for (auto& n : runtime::vulkan_kernel_names()) t.custom_kernels.insert(std::move(n));
    for (auto& n : runtime::host_kernel_names()) t.custom_kernels.insert(std::move(n));
    t.arena_alignment = std::int64_t(kAlign);
    return t;
  }

  std::unique_ptr<runtime::ExecutableGraph> compile_lir(const compile::LirModule& lir,
                                                        const compile::CompileOptions& options) override {
    if (!ctx_) throw Error("device 'vulkan' is unavailable: " + why_);
    std::shared_ptr<Weights> weights;
    auto plan = build_plan(ctx_, lir, options, weights);
    return std::make_unique<VulkanExecutable>(std::move(plan), std::move(weights));
  }

 private:
  std::shared_ptr<Context> ctx_;
  std::string why_;
};

}  // namespace

std::unique_ptr<runtime::Backend> make_vulkan_backend() { return std::make_unique<VulkanBackend>(); }

std::string unavailable_reason() { return VulkanBackend().unavailable_reason(); }

std::vector<DeviceInfo> list_devices() { return Context::devices(); }

DeviceInfo selected_device() { return Context::get()->info; }

std::vector<KernelTime> last_run_times(const runtime::ExecutableGraph& exe) {
  const auto* v = dynamic_cast<const VulkanExecutable*>(&exe);
  if (!v) throw Error("last_run_times: not an executable of the Vulkan backend");
  return v->times();
}

}  // namespace rlx::backends::vulkan
#endif
