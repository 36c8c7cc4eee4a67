// Collective bandwidth between ranks (the multi-GPU issue's figure): all_reduce and all_gather of f32 and bf16
// messages from --min-mib to --max-mib (x4 steps), on whatever engine rlx::distributed::init() picks: nccl with
// one GPU per rank on a GPU machine (RLX_DISTRIBUTED=nccl), tcp or mpi between CPU processes.
//
//   RUN_TCP_ENGINE=nccl bash tests/distributed/run_tcp.sh 2 build/bench_collectives     (bench/gpu.sh nccl)
//   bash tests/distributed/run_tcp.sh 2 build/bench_collectives --max-mib 16             (here: the tcp engine)
//
// On nccl the messages are in the GPUs' memory (Communicator::allocate_device), as PyTorch's peer keeps them, and
// the collectives take them as they are; `--memory host` measures host messages staged through the GPU instead
// (impl rlx_nccl_host). Every line says which ("memory").
//
// Every message is checked before it is timed: rank r sends r + 1 in every element (small integers, exact in
// bf16), so each all_reduce must return world (world + 1) / 2 and each all_gather block r the value r + 1. A
// sample is one collective between barriers; the median of --reps samples after 2 warm-up calls. Rank 0 prints
// one JSON line per message (workload "<collective>_<MiB>mib_<dtype>", impl "rlx_<engine>", seconds, bytes) and
// the bandwidth as NCCL's tests state it: algbw = bytes / time, busbw = algbw * 2 (n - 1) / n for all_reduce
// and (n - 1) / n for all_gather, the figure bench/nccl_peer.py reports for torch.distributed.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "common.hpp"
#include "rlx/distributed/distributed.hpp"
#include "rlx/error.hpp"

namespace {

using namespace rlx;
namespace dist = rlx::distributed;

double element_value(const std::vector<std::byte>& buf, ir::DType t, std::size_t i) {
  if (t == ir::DType::F32) return double(reinterpret_cast<const float*>(buf.data())[i]);
  return double(ir::bf16_to_float(reinterpret_cast<const std::uint16_t*>(buf.data())[i]));
}

void fill(std::vector<std::byte>& buf, ir::DType t, std::size_t first, std::size_t count, float v) {
  if (t == ir::DType::F32) {
    std::fill_n(reinterpret_cast<float*>(buf.data()) + first, count, v);
  } else {
    std::fill_n(reinterpret_cast<std::uint16_t*>(buf.data()) + first, count, ir::float_to_bf16(v));
  }
}

// Checks a few elements spread over [first, first + count) against `want`; rlx::Error naming the message.
void expect(const std::vector<std::byte>& buf, ir::DType t, std::size_t first, std::size_t count, double want,
            const std::string& what) {
  for (std::size_t k = 0; k < 64 && count; ++k) {
    const std::size_t i = first + k * (count - 1) / 63;
    if (element_value(buf, t, i) != want)
      throw Error(what + ": element " + std::to_string(i) + " is " + std::to_string(element_value(buf, t, i)) +
                  ", expected " + std::to_string(want));
  }
}

}  // namespace

int main(int argc, char** argv) try {
  using namespace rlx::bench;
  const auto min_mib = std::stoll(arg(argc, argv, "--min-mib", "1"));
  const auto max_mib = std::stoll(arg(argc, argv, "--max-mib", "1024"));
  const int reps = std::atoi(arg(argc, argv, "--reps", "10").c_str());
  if (min_mib < 1 || max_mib < min_mib || reps < 1)
    throw Error("bench_collectives: need 1 <= --min-mib <= --max-mib, --reps >= 1");
  auto comm = dist::init();
  const int n = comm.world_size(), r = comm.rank();
  // Messages live where the engine works: in the GPU's memory on nccl (as PyTorch's peer keeps them), with
  // `--memory host` in host memory staged through it; in host memory on every other engine.
  const std::string memory = arg(argc, argv, "--memory", "device");
  if (memory != "device" && memory != "host") throw Error("bench_collectives: --memory is device or host");
  const bool host_flag = memory == "host";
  const bool on_device = comm.takes_device_memory() && !host_flag;
  const std::string impl =
      "rlx_" + std::string(comm.engine()) + (comm.takes_device_memory() && !on_device ? "_host" : "");
  // A message: host bytes, and on the device a copy that the collectives work on.
  struct Message {
    std::vector<std::byte> host;
    std::shared_ptr<dist::DeviceMemory> device;
    dist::Buffer buffer(ir::DType t, std::size_t count) {
      return device ? device->buffer(t, count) : dist::Buffer{host.data(), count, t};
    }
    void upload() {
      if (device) device->upload(host);
    }
    void download() {
      if (device) device->download(host);
    }
  };
  const auto message = [&](std::size_t nbytes) {
    Message m{std::vector<std::byte>(nbytes), nullptr};
    if (on_device) m.device = comm.allocate_device(nbytes);
    return m;
  };
  for (ir::DType t : {ir::DType::F32, ir::DType::BF16}) {
    const std::size_t esize = ir::dtype_size(t);
    for (long long mib = min_mib; mib <= max_mib; mib *= 4) {
      const std::size_t bytes = std::size_t(mib) << 20, count = bytes / esize;
      const std::string suffix = "_" + std::to_string(mib) + "mib_" + std::string(ir::dtype_name(t));
      // all_reduce: every rank's message is `bytes`.
      Message data = message(bytes);
      auto reduce_once = [&] { comm.all_reduce(data.buffer(t, count)); };
      // all_gather: every rank sends bytes / n, and receives `bytes`.
      const std::size_t part = count / std::size_t(n);
      Message in = message(part * esize), out = message(part * std::size_t(n) * esize);
      fill(in.host, t, 0, part, float(r + 1));
      in.upload();
      auto gather_once = [&] {
        const dist::Buffer b = in.buffer(t, part);
        comm.all_gather(dist::ConstBuffer{b.data, b.count, b.dtype, b.memory}, out.buffer(t, part * std::size_t(n)));
      };
      struct Case {
        const char* name;
        std::function<void()> once;
        std::function<void(const std::string&)> check;  // after one call on fresh data
        double bus;                                     // busbw / algbw
        std::size_t bytes;
      };
      const Case cases[] = {{"all_reduce", reduce_once,
                             [&](const std::string& w) {
                               data.download();
                               expect(data.host, t, 0, count, double(n) * (n + 1) / 2, w);
                             },
                             2.0 * (n - 1) / n, bytes},
                            {"all_gather", gather_once,
                             [&](const std::string& w) {
                               out.download();
                               for (int q = 0; q < n; ++q)
                                 expect(out.host, t, std::size_t(q) * part, part, double(q + 1), w);
                             },
                             double(n - 1) / n, part * std::size_t(n) * esize}};
      for (const Case& c : cases) {
        const std::string workload = c.name + suffix;
        fill(data.host, t, 0, count, float(r + 1));
        data.upload();
        c.once();
        c.check(workload);
        c.once();  // warm-up; the sums grow by a factor n a call, far from f32's and bf16's range in --reps calls
        std::vector<double> seconds;
        for (int k = 0; k < reps; ++k) {
          comm.barrier();
          const double t0 = now_s();
          c.once();
          seconds.push_back(now_s() - t0);
        }
        std::sort(seconds.begin(), seconds.end());
        const double median = seconds[seconds.size() / 2];
        if (r == 0) {
          nlohmann::json j{{"workload", workload},
                           {"impl", impl},
                           {"median_s", median},
                           {"bytes", c.bytes},
                           {"ranks", n},
                           {"memory", on_device ? "device" : "host"},
                           {"algbw_gbps", double(c.bytes) / median * 1e-9},
                           {"busbw_gbps", double(c.bytes) / median * 1e-9 * c.bus}};
          std::printf("%s\n", j.dump().c_str());
          std::fflush(stdout);
        }
      }
    }
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_collectives: %s\n", e.what());
  return 1;
}
