// collectives_bench: allReduce (float32 sum) on 2 (or --world N) processes through weft's
// ProcessGroupGloo, with and without the call check, and through a direct Gloo ring allreduce call
// on a context of its own, in the same run, for 1 KiB to 64 MiB. The bench re-executes itself as
// the other ranks (`/proc/self/exe --rank R PORT`); rank 0 prints one line per size with the
// median time of each path, the bus bandwidth (bytes * 2(N-1)/N / time, for 2 ranks bytes / time)
// and the overhead ratios against Gloo direct (goal: weft <= 1.1x).
//
//   collectives_bench [--sizes 1K,64K,64M] [--min-iters N] [--back-to-back K] [--world N] [--batch-device]
//
// The three paths alternate within each iteration, so that drift in machine load hits them alike.
// The direct path is Gloo used the way Gloo's own benchmarks use it, on its default device; with
// --batch-device its device is made the way weft makes its own (the loop thread under SCHED_BATCH,
// collectives/gloo/detail/device.h), so that the ratio leaves out what that policy saves. On a machine
// whose CPUs are busy with other work that is a lot: Gloo's TCP event-loop thread busy-polls a
// socket while the thread that posted the next operation holds the connection's lock, and when
// both share a CPU the poster only gets it back at the next scheduler tick (4 ms at HZ=250). With
// --back-to-back K (default 1) each path issues K allReduces in a row per iteration (direct: K Gloo
// calls one after the other; weft: K allReduce calls, then a wait on all of them, the way a training
// step reduces several gradients) and the times printed are per allReduce (the iteration's time / K),
// followed by a line with the median time of the K in a row. `--sizes 40 --back-to-back 20` gives
// the figure for 20 small allReduces in a row, the pattern a scheduler-tick stall per op would make
// take 80 ms or more on a busy machine.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <gloo/allreduce.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>

#include "collectives/gloo/detail/device.h"
#include "collectives/gloo/detail/group.h"
#include "collectives/gloo/detail/store.h"
#include "bench/two_process.h"
#include "rpc/store.h"
#include "tensor/tensor.h"

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using weft::Tensor;
using weft::collectives::ProcessGroupGloo;

using weft::bench::fail;

std::vector<int64_t> parseSizes(const std::string& text) {
  std::vector<int64_t> out;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find(',', pos);
    std::string item = text.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
    int64_t mult = 1;
    if (!item.empty() && (item.back() == 'K' || item.back() == 'k')) mult = 1 << 10;
    if (!item.empty() && (item.back() == 'M' || item.back() == 'm')) mult = 1 << 20;
    if (mult != 1) item.pop_back();
    if (item.empty()) fail("bad size list '" + text + "'");
    out.push_back(std::stoll(item) * mult);
    if (end == std::string::npos) break;
    pos = end + 1;
  }
  return out;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

struct Config {
  std::vector<int64_t> sizes = parseSizes("1K,4K,16K,64K,256K,1M,4M,16M,64M");
  int minIters = 5;
  int backToBack = 1;  // allReduces issued in a row per path and iteration
  int world = 2;
  bool batchDevice = false;  // the direct path on a SCHED_BATCH device like weft's
};

int iterationsFor(int64_t bytes, int minIters) {
  int64_t n = (int64_t{256} << 20) / bytes;  // about 256 MiB moved per path and size
  return static_cast<int>(std::clamp<int64_t>(n, minIters, 400));
}

// One rank's part: every rank runs exactly the same sequence of operations.
int runRank(int rank, uint16_t port, const Config& cfg) {
  const int world = cfg.world;
  std::unique_ptr<weft::rpc::StoreServer> server;
  if (rank == 0) {
    weft::rpc::StoreServer::Config sc;
    sc.port = port;
    server = std::make_unique<weft::rpc::StoreServer>(sc);
  }
  weft::rpc::StoreClient::Config cc;
  cc.port = port;
  cc.timeout = 60s;
  weft::rpc::StoreClient store(cc);

  ProcessGroupGloo checked(store, rank, world, {.timeout = 120s, .checkCalls = true, .name = "checked"});
  ProcessGroupGloo unchecked(store, rank, world, {.timeout = 120s, .checkCalls = false, .name = "unchecked"});

  // The direct path: a Gloo context of its own, used the way Gloo's own benchmarks do.
  std::shared_ptr<gloo::transport::Device> device;
  if (cfg.batchDevice) {
    device = weft::collectives::detail::createTcpDevice("127.0.0.1");
  } else {
    gloo::transport::tcp::attr attr;
    attr.hostname = "127.0.0.1";
    device = gloo::transport::tcp::CreateDevice(attr);
  }
  auto context = std::make_shared<gloo::rendezvous::Context>(rank, world);
  context->setTimeout(120s);
  weft::collectives::GlooStore glooStore(store, "bench/direct/", 60s);
  context->connectFullMesh(glooStore, device);
  uint32_t tag = 0;

  if (rank == 0) {
    std::printf("collectives_bench: allReduce float32 sum, %d processes on 127.0.0.1, median of N iterations, "
                "%d allReduce(s) in a row per iteration (times per allReduce), direct Gloo on %s device, "
                "load %s\n",
                world, cfg.backToBack, cfg.batchDevice ? "a SCHED_BATCH" : "Gloo's default",
                weft::bench::loadAverage().c_str());
    std::printf("%9s %6s | %11s %11s %11s | %9s %9s %9s | %7s %7s\n", "bytes", "iters", "gloo_us", "weft_us",
                "nochk_us", "gloo_GB/s", "weft_GB/s", "nochk_GB/s", "weft/x", "nochk/x");
  }
  for (int64_t bytes : cfg.sizes) {
    const int64_t n = bytes / 4;
    const int k = cfg.backToBack;
    const int iters = std::max(cfg.minIters, iterationsFor(bytes, cfg.minIters) / k);
    // Path p's j-th tensor of the row; all start at 1 and see the same reductions.
    auto makeRow = [&] {
      std::vector<Tensor> row;
      for (int j = 0; j < k; ++j) row.push_back(weft::full({n}, 1.0));
      return row;
    };
    std::vector<Tensor> a = makeRow(), b = makeRow(), c = makeRow();
    std::vector<double> direct, viaWeft, viaUnchecked;
    for (int it = 0; it < iters + 1; ++it) {  // the first round warms up
      // Values stay small: reset to 1 every 16 rounds (2^16 fits a float exactly).
      if (it % 16 == 0) {
        for (int j = 0; j < k; ++j) {
          a[j].fill_(1.0);
          b[j].fill_(1.0);
          c[j].fill_(1.0);
        }
      }
      auto t0 = Clock::now();
      for (int j = 0; j < k; ++j) {
        gloo::AllreduceOptions opts(context);
        opts.setOutput(a[j].data<float>(), static_cast<size_t>(n));
        opts.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
        opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
        opts.setTag(tag++);
        opts.setTimeout(120s);
        gloo::allreduce(opts);
      }
      auto t1 = Clock::now();
      auto viaGroup = [k](ProcessGroupGloo& pg, const std::vector<Tensor>& row) {
        std::vector<weft::collectives::Work> works;
        for (int j = 0; j < k; ++j) works.push_back(pg.allReduce(row[static_cast<size_t>(j)]));
        for (auto& w : works) w.wait();
      };
      viaGroup(checked, b);
      auto t2 = Clock::now();
      viaGroup(unchecked, c);
      auto t3 = Clock::now();
      if (it == 0) continue;
      auto perOp = [k](Clock::time_point from, Clock::time_point to) {
        return std::chrono::duration<double, std::micro>(to - from).count() / k;
      };
      direct.push_back(perOp(t0, t1));
      viaWeft.push_back(perOp(t1, t2));
      viaUnchecked.push_back(perOp(t2, t3));
    }
    for (int j = 0; j < k; ++j) {
      const float x = a[j].data<float>()[n - 1], y = b[j].data<float>()[n - 1], z = c[j].data<float>()[n - 1];
      if (x != y || y != z) fail("the three paths disagree at " + std::to_string(bytes) + " bytes");
    }
    if (rank == 0) {
      double d = median(direct), w = median(viaWeft), u = median(viaUnchecked);
      const double busFactor = 2.0 * (world - 1) / world;
      auto gbps = [&](double us) { return static_cast<double>(bytes) * busFactor / (us * 1e-6) / 1e9; };
      std::printf("%9lld %6d | %11.1f %11.1f %11.1f | %9.3f %9.3f %9.3f | %7.3f %7.3f\n",
                  static_cast<long long>(bytes), iters, d, w, u, gbps(d), gbps(w), gbps(u), w / d, u / d);
      if (k > 1) {
        std::printf("%9s %6s | %d in a row take (us): gloo %.0f, weft %.0f, nochk %.0f\n", "", "", k, d * k, w * k,
                    u * k);
      }
      std::fflush(stdout);
    }
  }
  store.barrier("bench/exit", world, 60s);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    Config cfg;
    // Rank R > 0 gets "--rank R PORT" followed by rank 0's own arguments.
    const bool isOther = argc >= 4 && std::string(argv[1]) == "--rank";
    weft::bench::Flags flags;
    flags.onValue("--sizes", [&](const std::string& v) { cfg.sizes = parseSizes(v); });
    flags.onValue("--min-iters", [&](const std::string& v) {
      cfg.minIters = static_cast<int>(weft::bench::intFlag("--min-iters", v, 1, 1 << 30));
    });
    flags.onValue("--back-to-back", [&](const std::string& v) {
      cfg.backToBack = static_cast<int>(weft::bench::intFlag("--back-to-back", v, 1, 64));
    });
    flags.onSwitch("--batch-device", [&] { cfg.batchDevice = true; });
    flags.onValue("--world",
                  [&](const std::string& v) { cfg.world = static_cast<int>(weft::bench::intFlag("--world", v, 2, 16)); });
    if (!weft::bench::parseFlagsOrUsage(flags, argc, argv, "collectives_bench",
                                        "usage: collectives_bench [--sizes 1K,64K,64M] [--min-iters N] "
                                        "[--back-to-back K] [--world N] [--batch-device]\n",
                                        isOther ? 4 : 1)) {
      return 2;
    }
    for (int64_t s : cfg.sizes) {
      if (s < 4 || s % 4 != 0) fail("sizes must be positive multiples of 4 bytes");
    }
    if (isOther) return runRank(std::stoi(argv[2]), static_cast<uint16_t>(std::stoi(argv[3])), cfg);
    // The other ranks: this program again, with "--rank R PORT" before rank 0's own arguments.
    const uint16_t port = weft::bench::freePort();
    std::vector<std::unique_ptr<weft::bench::ServerProcess>> others;
    for (int r = 1; r < cfg.world; ++r) {
      std::vector<std::string> args = {"collectives_bench", "--rank", std::to_string(r), std::to_string(port)};
      for (int i = 1; i < argc; ++i) args.emplace_back(argv[i]);
      others.push_back(std::make_unique<weft::bench::ServerProcess>(std::move(args)));
    }
    int rc = runRank(0, port, cfg);
    for (auto& p : others) p->waitForExit(std::chrono::seconds(60));
    return rc;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "collectives_bench: %s\n", e.what());
    return 1;
  }
}
