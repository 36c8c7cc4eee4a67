#include "backends/cuda/conv.hpp"

#include <fmt/format.h>

#include <array>
#include <limits>
#include <vector>

#include "rlx/error.hpp"

#ifdef RLX_HAVE_CUDNN
#include "backends/cuda/api.hpp"
#endif

namespace rlx::backends::cuda {

#ifdef RLX_HAVE_CUDNN

struct ConvPlan {
  const Cudnn* dnn = nullptr;
  cudnnTensorDescriptor_t x = nullptr, y = nullptr, bias = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  cudnnConvolutionFwdAlgo_t algo{};
  std::size_t workspace = 0;
  bool f64 = false;
  ConvPlan() = default;
  ConvPlan(const ConvPlan&) = delete;
  ConvPlan& operator=(const ConvPlan&) = delete;
  ~ConvPlan() {
    if (!dnn) return;
    for (auto* t : {x, y, bias})
      if (t) dnn->cudnnDestroyTensorDescriptor(t);
    if (w) dnn->cudnnDestroyFilterDescriptor(w);
    if (conv) dnn->cudnnDestroyConvolutionDescriptor(conv);
  }
};

bool cudnn_convolutions() {
  try {
    (void)Cudnn::get();
    return true;
  } catch (const Error&) {
    return false;
  }
}

namespace {
// One process-wide handle for planning (the algorithm query needs one); runs use their executable's own.
cudnnHandle_t planning_handle(const Cudnn& dnn) {
  static cudnnHandle_t h = [&] {
    cudnnHandle_t made = nullptr;
    dnn.check(dnn.cudnnCreate(&made), "cudnnCreate");
    return made;
  }();
  return h;
}
}  // namespace

std::shared_ptr<const ConvPlan> plan_conv(const compile::Kernel& k, bool tf32, std::string* why) {
  auto no = [&](const std::string& reason) -> std::shared_ptr<const ConvPlan> {
    *why = reason;
    return nullptr;
  };
  const ir::Node* conv = nullptr;
  for (const auto& n : k.body.nodes()) {
    if (n.op == ir::OpKind::Conv1d || n.op == ir::OpKind::Conv2d) {
      if (conv) return no("more than one convolution in the kernel");
      conv = &n;
    } else if (n.op != ir::OpKind::Input) {
      return no(fmt::format("the kernel also computes {}", ir::op_name(n.op)));
    }
  }
  if (!conv) return no("no convolution in the kernel");
  if (k.body.outputs().size() != 1 || k.body.outputs()[0].node != conv->id)
    return no("the kernel's output is not the convolution");
  if (conv->dtype != ir::DType::F32 && conv->dtype != ir::DType::F64) return no("not f32 or f64");
  for (auto in : conv->inputs)
    if (k.body.node(in).dtype != conv->dtype) return no("operands of another type");
  const bool two_d = conv->op == ir::OpKind::Conv2d;
  const auto xe = k.body.node(conv->inputs[0]).shape.extents(), we = k.body.node(conv->inputs[1]).shape.extents(),
             ye = conv->shape.extents();
  for (const auto* e : {&xe, &we, &ye})
    for (auto d : *e)
      if (d <= 0 || d > std::numeric_limits<int>::max()) return no("an empty or too large dim");
  // 1-d as 2-d with a height of one.
  auto dims4 = [&](const std::vector<std::int64_t>& e) {
    return two_d ? std::array<int, 4>{int(e[0]), int(e[1]), int(e[2]), int(e[3])}
                 : std::array<int, 4>{int(e[0]), int(e[1]), 1, int(e[2])};
  };
  auto pair = [&](const char* name, int fill) {  // 1-d: the height's stride and dilation are 1, its padding 0
    const auto v = conv->attrs.get_ints(name);
    return two_d ? std::array<int, 2>{int(v.at(0)), int(v.at(1))} : std::array<int, 2>{fill, int(v.at(0))};
  };
  const auto stride = pair("stride", 1), padding = pair("padding", 0), dilation = pair("dilation", 1);
  const auto groups = int(conv->attrs.get_int("groups"));

  const Cudnn* dnn = nullptr;
  try {
    dnn = &Cudnn::get();
  } catch (const Error& e) {
    return no(e.what());
  }
  auto p = std::make_shared<ConvPlan>();
  p->dnn = dnn;
  p->f64 = conv->dtype == ir::DType::F64;
  const cudnnDataType_t dt = p->f64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
  auto tensor = [&](cudnnTensorDescriptor_t* t, std::array<int, 4> d) {
    dnn->check(dnn->cudnnCreateTensorDescriptor(t), "cudnnCreateTensorDescriptor");
    dnn->check(dnn->cudnnSetTensor4dDescriptor(*t, CUDNN_TENSOR_NCHW, dt, d[0], d[1], d[2], d[3]),
               "cudnnSetTensor4dDescriptor");
  };
  const auto xd = dims4(xe), wd = dims4(we), yd = dims4(ye);
  tensor(&p->x, xd);
  tensor(&p->y, yd);
  if (conv->inputs.size() > 2) tensor(&p->bias, {1, yd[1], 1, 1});
  dnn->check(dnn->cudnnCreateFilterDescriptor(&p->w), "cudnnCreateFilterDescriptor");
  dnn->check(dnn->cudnnSetFilter4dDescriptor(p->w, dt, CUDNN_TENSOR_NCHW, wd[0], wd[1], wd[2], wd[3]),
             "cudnnSetFilter4dDescriptor");
  dnn->check(dnn->cudnnCreateConvolutionDescriptor(&p->conv), "cudnnCreateConvolutionDescriptor");
  dnn->check(dnn->cudnnSetConvolution2dDescriptor(p->conv, padding[0], padding[1], stride[0], stride[1], dilation[0],
                                                  dilation[1], CUDNN_CROSS_CORRELATION, dt),
             "cudnnSetConvolution2dDescriptor");
  dnn->check(dnn->cudnnSetConvolutionGroupCount(p->conv, groups), "cudnnSetConvolutionGroupCount");
  // FMA math keeps f32 exact (cuDNN's default math may use TF32 tensor cores for f32).
  dnn->check(dnn->cudnnSetConvolutionMathType(p->conv, tf32 && !p->f64 ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH),
             "cudnnSetConvolutionMathType");
  // cuDNN must agree with the op table on the output's shape.
  int n = 0, c = 0, h = 0, w = 0;
  dnn->check(dnn->cudnnGetConvolution2dForwardOutputDim(p->conv, p->x, p->w, &n, &c, &h, &w),
             "cudnnGetConvolution2dForwardOutputDim");
  if (std::array<int, 4>{n, c, h, w} != yd)
    return no(fmt::format("cuDNN's output shape [{},{},{},{}] is not the op's", n, c, h, w));
  const cudnnHandle_t handle = planning_handle(*dnn);
  cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
  int found = 0;
  dnn->check(dnn->cudnnGetConvolutionForwardAlgorithm_v7(handle, p->x, p->w, p->conv, p->y,
                                                         CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &found, perf),
             "cudnnGetConvolutionForwardAlgorithm_v7");
  // The heuristic's order, skipping algorithms it reports unusable here and any whose math is not what was asked.
  constexpr std::size_t kMaxWorkspace = std::size_t(256) << 20;
  for (int i = 0; i < found; ++i) {
    const auto& a = perf[i];
    if (a.status != CUDNN_STATUS_SUCCESS || a.memory > kMaxWorkspace) continue;
    if (!(tf32 && !p->f64) && a.mathType != CUDNN_FMA_MATH && a.mathType != CUDNN_DEFAULT_MATH) continue;
    std::size_t ws = 0;
    if (dnn->cudnnGetConvolutionForwardWorkspaceSize(handle, p->x, p->w, p->conv, p->y, a.algo, &ws) !=
        CUDNN_STATUS_SUCCESS)
      continue;
    p->algo = a.algo;
    p->workspace = ws;
    return p;
  }
  return no("cuDNN has no algorithm for it");
}

std::size_t conv_workspace_bytes(const ConvPlan& p) { return p.workspace; }
bool conv_has_bias(const ConvPlan& p) { return p.bias != nullptr; }

ConvHandle::ConvHandle(void* stream) {
  const Cudnn& dnn = Cudnn::get();
  cudnnHandle_t h = nullptr;
  dnn.check(dnn.cudnnCreate(&h), "cudnnCreate");
  handle_ = h;
  dnn.check(dnn.cudnnSetStream(h, static_cast<cudaStream_t>(stream)), "cudnnSetStream");
}

ConvHandle::~ConvHandle() {
  if (handle_) Cudnn::get().cudnnDestroy(static_cast<cudnnHandle_t>(handle_));
}

ConvHandle& ConvHandle::operator=(ConvHandle&& o) noexcept {
  if (this != &o) {
    if (handle_) Cudnn::get().cudnnDestroy(static_cast<cudnnHandle_t>(handle_));
    handle_ = o.handle_;
    o.handle_ = nullptr;
  }
  return *this;
}

namespace {
void* device_pointer(unsigned long long p) {
  return reinterpret_cast<void*>(p);  // NOLINT(performance-no-int-to-ptr): device addresses are integers here
}
}  // namespace

void ConvHandle::enqueue(const ConvPlan& p, unsigned long long x, unsigned long long w, unsigned long long b,
                         unsigned long long y, unsigned long long workspace, std::size_t workspace_bytes) const {
  const Cudnn& dnn = *p.dnn;
  const auto h = static_cast<cudnnHandle_t>(handle_);
  const float one = 1, zero = 0;
  const double one64 = 1, zero64 = 0;
  const void* alpha = p.f64 ? static_cast<const void*>(&one64) : &one;
  const void* beta = p.f64 ? static_cast<const void*>(&zero64) : &zero;
  dnn.check(dnn.cudnnConvolutionForward(h, alpha, p.x, device_pointer(x), p.w, device_pointer(w), p.conv, p.algo,
                                        device_pointer(workspace), workspace_bytes, beta, p.y, device_pointer(y)),
            "cudnnConvolutionForward");
  if (p.bias)  // y += b, broadcast over the batch and the spatial dims
    dnn.check(dnn.cudnnAddTensor(h, alpha, p.bias, device_pointer(b), alpha, p.y, device_pointer(y)), "cudnnAddTensor");
}

#else

struct ConvPlan {};
bool cudnn_convolutions() { return false; }
std::shared_ptr<const ConvPlan> plan_conv(const compile::Kernel&, bool, std::string* why) {
  *why = "built without cuDNN's headers";
  return nullptr;
}
std::size_t conv_workspace_bytes(const ConvPlan&) { return 0; }
bool conv_has_bias(const ConvPlan&) { return false; }
ConvHandle::ConvHandle(void*) { throw Error("cuda: built without cuDNN's headers"); }
ConvHandle::~ConvHandle() = default;
ConvHandle& ConvHandle::operator=(ConvHandle&& o) noexcept {
  handle_ = o.handle_;
  o.handle_ = nullptr;
  return *this;
}
void ConvHandle::enqueue(const ConvPlan&, unsigned long long, unsigned long long, unsigned long long,
                         unsigned long long, unsigned long long, std::size_t) const {}

#endif

}  // namespace rlx::backends::cuda
