// A program for the multiprocess tests of the allreduce algorithms, reduceScatter and
// allGatherInto (tests/collectives/algorithms_mp_test.cpp): one rank of a job, which finds its
// place through rpc::Options::fromEnv (rank 0 serves the store), builds a ProcessGroupGloo and
// plays its rank's part in the scenario given. It prints one line per event ("rank R ...").
//
//   WEFT_RANK=0 WEFT_WORLD_SIZE=3 WEFT_MASTER_ADDR=127.0.0.1 WEFT_MASTER_PORT=29500 algorithms_worker algorithms
//
// Scenarios:
//   algorithms      allReduce with every algorithm (auto included), every reducible dtype and
//                   every op it takes, on 1, 7, 1001 elements and on just more than the call
//                   exchange carries, against a rank-order reduction computed here from every
//                   rank's inputs: integers and Min/Max exactly, naive and parallel (and auto
//                   below the fused limit) to the bit, the other algorithms within the
//                   reduction-order tolerance; every result is compared to the bit across the
//                   ranks. Then the traffic of one allReduce per algorithm, as counted by the
//                   group. Prints "rank R checked N identical M", "rank R same_everywhere N",
//                   "rank R traffic <algorithm> sent S received R messages M" and "rank R done".
//   reduce_scatter  reduceScatter of views into one flat buffer, shards even and uneven (one
//                   empty), every reducible dtype and op, against the ring's documented order
//                   computed here (to the bit); allGatherInto on 1, 7 and 1001 elements of every
//                   dtype; the traffic of one uneven reduceScatter against the bytes of the
//                   shards it must move. Prints "rank R rs_checked N", "rank R ag_checked N",
//                   "rank R rs_traffic sent S expected E received R expected F".
//   bad_args        [2 ranks] bad arguments: "rank R <case> <ErrorType>: <message>" per case
//                   and "rank R after <case> ok" where the group goes on.
//   kill            [3 ranks] the last rank issues a large reduceScatter and kills itself with
//                   SIGKILL at once; the others print "rank R failed in_ms T <ErrorType>: <msg>".
// A wrong result throws: one line on stderr, exit status 1.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gloo/types.h>

#include "collectives/gloo/detail/call_check.h"
#include "collectives/gloo/detail/group.h"
#include "collectives/gloo/process_group_gloo.h"
#include "common/error.h"
#include "rpc/options.h"
#include "rpc/store.h"

#include "mp_worker.h"

namespace {

using namespace std::chrono_literals;
using weft::DType;
using weft::Tensor;
using weft::collectives::AllreduceAlgorithm;
using weft::collectives::ProcessGroupGloo;
using weft::collectives::ReduceOp;
using weft::collectives::Work;
using Clock = std::chrono::steady_clock;

int gRank = 0;

void say(const std::string& line) { weft::testing::say(weft::testing::prefix(gRank) + line); }

[[noreturn]] void fail(const std::string& what) { throw std::runtime_error("rank " + std::to_string(gRank) + ": " + what); }

const std::vector<DType> kReducible = {DType::Float32, DType::Float64, DType::Float16,
                                       DType::Int64,   DType::Int32,   DType::UInt8};

std::vector<ReduceOp> opsFor(DType t) {
  std::vector<ReduceOp> ops = {ReduceOp::Sum, ReduceOp::Product, ReduceOp::Min, ReduceOp::Max};
  if (weft::isFloating(t)) ops.push_back(ReduceOp::Avg);
  return ops;
}

// Element i of rank r's input for `op`, as a double (exactly representable in every dtype used).
double inputValue(int r, int64_t i, ReduceOp op, DType t) {
  const int64_t k = (r * 37 + i * 11) % 101;
  if (op == ReduceOp::Product) return weft::isFloating(t) ? 0.75 + static_cast<double>(k % 50) / 64.0 : (r + i) % 5 + 1;
  if (weft::isFloating(t)) return static_cast<double>(k + 1) / 8.0 + (t == DType::Float16 ? 0.0 : 1.0 / 3.0);
  if (t == DType::UInt8) return static_cast<double>(k);
  return static_cast<double>(k - 50);
}

// The element type of a reducible dtype, with the arithmetic Gloo uses (float16: each partial
// result rounded to float16).
template <class F>
void dispatch(DType t, F&& fn) {
  switch (t) {
    case DType::Float32: fn.template operator()<float>(); break;
    case DType::Float64: fn.template operator()<double>(); break;
    case DType::Float16: fn.template operator()<gloo::float16>(); break;
    case DType::Int64: fn.template operator()<int64_t>(); break;
    case DType::Int32: fn.template operator()<int32_t>(); break;
    case DType::UInt8: fn.template operator()<uint8_t>(); break;
    default: fail("not reducible");
  }
}

// *p = v bit for bit (gloo::float16's assignment skips the store when the old bits, read as
// an integer, round to the new value).
template <class T>
void put(T* p, T v) {
  std::memcpy(static_cast<void*>(p), &v, sizeof(T));
}

template <class T>
T fromDouble(double v) {
  if constexpr (std::is_same_v<T, gloo::float16>) {
    return gloo::cpu_float2half_rn(static_cast<float>(v));
  } else {
    return static_cast<T>(v);
  }
}

template <class T>
double toDouble(T v) {
  if constexpr (std::is_same_v<T, gloo::float16>) {
    return gloo::cpu_half2float(v);
  } else {
    return static_cast<double>(v);
  }
}

// a op b in T's arithmetic; integer sums and products wrap (unsigned arithmetic).
template <class T>
T combine(T a, T b, ReduceOp op) {
  if constexpr (std::is_same_v<T, gloo::float16>) {
    const float x = gloo::cpu_half2float(a), y = gloo::cpu_half2float(b);
    float z = 0;
    switch (op) {
      case ReduceOp::Sum:
      case ReduceOp::Avg: z = x + y; break;
      case ReduceOp::Product: z = x * y; break;
      case ReduceOp::Min: z = std::min(x, y); break;
      case ReduceOp::Max: z = std::max(x, y); break;
    }
    return gloo::cpu_float2half_rn(z);
  } else if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    switch (op) {
      case ReduceOp::Sum:
      case ReduceOp::Avg: return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
      case ReduceOp::Product: return static_cast<T>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
      case ReduceOp::Min: return std::min(a, b);
      case ReduceOp::Max: return std::max(a, b);
    }
    return a;
  } else {
    switch (op) {
      case ReduceOp::Sum:
      case ReduceOp::Avg: return a + b;
      case ReduceOp::Product: return a * b;
      case ReduceOp::Min: return std::min(a, b);
      case ReduceOp::Max: return std::max(a, b);
    }
    return a;
  }
}

template <class T>
T divideBy(T a, int n) {
  if constexpr (std::is_same_v<T, gloo::float16>) {
    return gloo::cpu_float2half_rn(gloo::cpu_half2float(a) / static_cast<float>(n));
  } else {
    return a / static_cast<T>(n);
  }
}

Tensor inputOf(DType t, int64_t n, int r, ReduceOp op, int64_t offset = 0) {
  Tensor x = weft::empty({n}, {.dtype = t});
  dispatch(t, [&]<class T>() {
    T* p = static_cast<T*>(x.rawData());
    for (int64_t i = 0; i < n; ++i) put(&p[i], fromDouble<T>(inputValue(r, i + offset, op, t)));
  });
  return x;
}

uint64_t fnv(const Tensor& x) {
  uint64_t h = 1469598103934665603ull;
  const auto* p = static_cast<const uint8_t*>(x.rawData());
  for (size_t i = 0; i < x.nbytes(); ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

const std::vector<AllreduceAlgorithm> kAlgorithms = {
    AllreduceAlgorithm::Ring,  AllreduceAlgorithm::RingChunked, AllreduceAlgorithm::HalvingDoubling,
    AllreduceAlgorithm::Bcube, AllreduceAlgorithm::Naive,       AllreduceAlgorithm::Parallel,
    AllreduceAlgorithm::Auto};

void runAlgorithms(ProcessGroupGloo& pg) {
  const int W = pg.size();
  const int me = pg.rank();
  int64_t checked = 0, identical = 0;
  std::vector<int64_t> hashes;
  for (DType t : kReducible) {
    const int64_t es = static_cast<int64_t>(weft::elementSize(t));
    const int64_t above = static_cast<int64_t>(pg.fusedLimit()) / es + 3;
    for (ReduceOp op : opsFor(t)) {
      for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{1001}, above}) {
        // The rank-order reference.
        Tensor want = inputOf(t, n, 0, op);
        dispatch(t, [&]<class T>() {
          T* w = static_cast<T*>(want.rawData());
          for (int r = 1; r < W; ++r) {
            Tensor x = inputOf(t, n, r, op);
            const T* p = static_cast<const T*>(x.rawData());
            for (int64_t i = 0; i < n; ++i) put(&w[i], combine(w[i], p[i], op));
          }
          if (op == ReduceOp::Avg) {
            for (int64_t i = 0; i < n; ++i) put(&w[i], divideBy(w[i], W));
          }
        });
        std::vector<Tensor> outs;
        std::vector<Work> works;
        for (AllreduceAlgorithm a : kAlgorithms) {
          outs.push_back(inputOf(t, n, me, op));
          works.push_back(pg.allReduce(outs.back(), op, a));
        }
        for (Work& w : works) w.wait(120s);
        for (size_t k = 0; k < kAlgorithms.size(); ++k) {
          const AllreduceAlgorithm a = kAlgorithms[k];
          const std::string what = std::string(weft::collectives::allreduceAlgorithmName(a)) + " " +
                                   weft::dtypeName(t) + " " + weft::collectives::reduceOpName(op) + " n=" +
                                   std::to_string(n);
          const bool exact = !weft::isFloating(t) || op == ReduceOp::Min || op == ReduceOp::Max;
          const bool rankOrder = a == AllreduceAlgorithm::Naive || a == AllreduceAlgorithm::Parallel ||
                                 (a == AllreduceAlgorithm::Auto && outs[k].nbytes() <= pg.fusedLimit());
          const double tol = t == DType::Float16 ? 4e-3 : t == DType::Float32 ? 2e-6 : 1e-14;
          bool same = true;
          dispatch(t, [&]<class T>() {
            const T* g = static_cast<const T*>(outs[k].rawData());
            const T* w = static_cast<const T*>(want.rawData());
            for (int64_t i = 0; i < n; ++i) {
              const double gv = toDouble(g[i]), wv = toDouble(w[i]);
              const bool bits = std::memcmp(&g[i], &w[i], sizeof(T)) == 0;
              same = same && bits;
              if ((exact || rankOrder) && !bits) {
                fail(what + ": element " + std::to_string(i) + " is " + std::to_string(gv) + ", expected exactly " +
                     std::to_string(wv));
              }
              if (std::fabs(gv - wv) > tol * std::max(1.0, std::fabs(wv)) * W) {
                fail(what + ": element " + std::to_string(i) + " is " + std::to_string(gv) + ", expected " +
                     std::to_string(wv) + " within the reduction-order tolerance");
              }
            }
          });
          ++checked;
          if (same) ++identical;
          hashes.push_back(static_cast<int64_t>(fnv(outs[k]) >> 1));
        }
      }
    }
  }
  say("checked " + std::to_string(checked) + " identical " + std::to_string(identical));
  // Every result equal to the bit on every rank.
  Tensor mine = weft::empty({static_cast<int64_t>(hashes.size())}, {.dtype = DType::Int64});
  std::memcpy(mine.rawData(), hashes.data(), mine.nbytes());
  Tensor all = weft::empty({mine.numel() * W}, {.dtype = DType::Int64});
  pg.allGatherInto(all, mine).wait(60s);
  for (int r = 0; r < W; ++r) {
    if (std::memcmp(all.data<int64_t>() + r * mine.numel(), hashes.data(), mine.nbytes()) != 0) {
      fail("rank " + std::to_string(r) + "'s results differ from this rank's in some bits");
    }
  }
  say("same_everywhere " + std::to_string(hashes.size()));

  // float16 sums whose first partial lands on bits that, read as an integer, round to it: rank 0
  // holds the smallest subnormal (bits 0x0001), rank 1 holds 1.0, the rest 0; the sum is 1.0 in
  // any order. Small (the call exchange) and past the fused limit.
  int64_t halfChecked = 0;
  for (int64_t n : {int64_t{3}, static_cast<int64_t>(pg.fusedLimit()) / 2 + 5}) {
    for (AllreduceAlgorithm a : kAlgorithms) {
      Tensor x = weft::empty({n}, {.dtype = DType::Float16});
      auto* bits = static_cast<uint16_t*>(x.rawData());
      for (int64_t i = 0; i < n; ++i) bits[i] = me == 0 ? 0x0001 : me == 1 ? 0x3c00 : 0x0000;
      pg.allReduce(x, ReduceOp::Sum, a).wait(60s);
      for (int64_t i = 0; i < n; ++i) {
        if (bits[i] != 0x3c00) {
          fail(std::string("float16 subnormal sum, ") + weft::collectives::allreduceAlgorithmName(a) + " n=" +
               std::to_string(n) + ": element " + std::to_string(i) + " has bits " + std::to_string(bits[i]) +
               ", expected 0x3c00 (1.0)");
        }
      }
      ++halfChecked;
    }
  }
  say("half_checked " + std::to_string(halfChecked));

  // One allReduce of 64 Ki float32 per algorithm, as counted.
  for (AllreduceAlgorithm a : kAlgorithms) {
    Tensor x = inputOf(DType::Float32, 65536, me, ReduceOp::Sum);
    pg.barrier().wait(60s);
    pg.resetTrafficStats();
    pg.allReduce(x, ReduceOp::Sum, a).wait(60s);
    const auto s = pg.trafficStats();
    say(std::string("traffic ") + weft::collectives::allreduceAlgorithmName(a) + " sent " +
        std::to_string(s.bytesSent) + " received " + std::to_string(s.bytesReceived) + " messages " +
        std::to_string(s.messagesSent));
  }
}

// The shards' element counts: even, or uneven with one empty shard.
std::vector<int64_t> shardSizes(int W, bool even) {
  std::vector<int64_t> counts;
  for (int i = 0; i < W; ++i) counts.push_back(even ? 5 : (i * 5 + 2) % 7 + 1);
  if (!even) counts[1] = 0;
  return counts;
}

void runReduceScatter(ProcessGroupGloo& pg) {
  const int W = pg.size();
  const int me = pg.rank();
  int64_t checked = 0;
  for (DType t : kReducible) {
    for (ReduceOp op : opsFor(t)) {
      for (bool even : {true, false}) {
        const std::vector<int64_t> counts = shardSizes(W, even);
        int64_t total = 0;
        std::vector<int64_t> offsets;
        for (int64_t c : counts) {
          offsets.push_back(total);
          total += c;
        }
        Tensor flat = inputOf(t, total, me, op);
        std::vector<Tensor> inputs;
        for (int i = 0; i < W; ++i) inputs.push_back(flat.narrow(0, offsets[static_cast<size_t>(i)], counts[static_cast<size_t>(i)]));
        Tensor out = weft::empty({counts[static_cast<size_t>(me)]}, {.dtype = t});
        pg.reduceScatter(out, inputs, op).wait(60s);
        // The ring's order for shard c: x_{c+1}, then + x_{c+2}, ..., last + x_c.
        const int64_t n = counts[static_cast<size_t>(me)];
        const int64_t off = offsets[static_cast<size_t>(me)];
        std::vector<Tensor> xs;
        for (int r = 0; r < W; ++r) xs.push_back(inputOf(t, total, r, op));
        dispatch(t, [&]<class T>() {
          const T* g = static_cast<const T*>(out.rawData());
          for (int64_t i = 0; i < n; ++i) {
            T acc = static_cast<const T*>(xs[static_cast<size_t>((me + 1) % W)].rawData())[off + i];
            for (int k = 2; k <= W; ++k) {
              put(&acc, combine(acc, static_cast<const T*>(xs[static_cast<size_t>((me + k) % W)].rawData())[off + i], op));
            }
            if (op == ReduceOp::Avg) put(&acc, divideBy(acc, W));
            if (std::memcmp(&acc, &g[i], sizeof(T)) != 0) {
              fail(std::string("reduceScatter ") + weft::dtypeName(t) + " " + weft::collectives::reduceOpName(op) +
                   (even ? " even" : " uneven") + ": element " + std::to_string(i) + " is " +
                   std::to_string(toDouble(g[i])) + ", expected " + std::to_string(toDouble(acc)));
            }
          }
        });
        ++checked;
      }
    }
  }
  say("rs_checked " + std::to_string(checked));

  int64_t agChecked = 0;
  for (DType t : {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16, DType::Int64, DType::Int32,
                  DType::UInt8, DType::Bool}) {
    for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{1001}}) {
      auto byteOf = [&](int r, size_t b) {
        const uint8_t v = static_cast<uint8_t>(r * 31 + b * 7 + 1);
        return t == DType::Bool ? static_cast<uint8_t>(v & 1) : v;
      };
      Tensor in = weft::empty({n}, {.dtype = t});
      for (size_t b = 0; b < in.nbytes(); ++b) static_cast<uint8_t*>(in.rawData())[b] = byteOf(me, b);
      Tensor out = weft::empty({n * W}, {.dtype = t});
      pg.allGatherInto(out, in).wait(60s);
      for (int r = 0; r < W; ++r) {
        for (size_t b = 0; b < in.nbytes(); ++b) {
          if (static_cast<const uint8_t*>(out.rawData())[r * in.nbytes() + b] != byteOf(r, b)) {
            fail(std::string("allGatherInto ") + weft::dtypeName(t) + " n=" + std::to_string(n) + ": byte " +
                 std::to_string(b) + " of rank " + std::to_string(r) + "'s part differs");
          }
        }
      }
      ++agChecked;
    }
  }
  say("ag_checked " + std::to_string(agChecked));

  // Uneven shards of float32: this rank sends every shard but its own and receives every shard
  // but its left neighbour's, plus one call header to and from each peer.
  std::vector<int64_t> counts;
  int64_t total = 0;
  for (int i = 0; i < W; ++i) {
    counts.push_back(1000 + 37 * i);
    total += counts.back();
  }
  Tensor flat = inputOf(DType::Float32, total, me, ReduceOp::Sum);
  std::vector<Tensor> inputs;
  int64_t off = 0;
  for (int i = 0; i < W; ++i) {
    inputs.push_back(flat.narrow(0, off, counts[static_cast<size_t>(i)]));
    off += counts[static_cast<size_t>(i)];
  }
  Tensor out = weft::empty({counts[static_cast<size_t>(me)]}, {.dtype = DType::Float32});
  pg.barrier().wait(60s);
  pg.resetTrafficStats();
  pg.reduceScatter(out, inputs).wait(60s);
  const auto s = pg.trafficStats();
  const int64_t header = static_cast<int64_t>(weft::collectives::detail::kHeaderBytes);
  const int64_t sentWant = (total - counts[static_cast<size_t>(me)]) * 4 + (W - 1) * header;
  const int64_t recvWant = (total - counts[static_cast<size_t>((me - 1 + W) % W)]) * 4 + (W - 1) * header;
  say("rs_traffic sent " + std::to_string(s.bytesSent) + " expected " + std::to_string(sentWant) + " received " +
      std::to_string(s.bytesReceived) + " expected " + std::to_string(recvWant));
}

template <class F>
void expectError(const std::string& name, F&& call) {
  try {
    call();
    say(name + " unexpected success");
  } catch (const std::exception&) {
    say(name + " " + weft::testing::describe(std::current_exception()));
  }
}

void checkOk(ProcessGroupGloo& pg, const std::string& after) {
  Tensor x = weft::ones({10});
  pg.allReduce(x).wait(60s);
  if (x.data<float>()[0] != static_cast<float>(pg.size())) fail("allReduce after " + after);
  say("after " + after + " ok");
}

void runBadArgs(ProcessGroupGloo& pg, weft::rpc::StoreClient& store) {
  const int me = pg.rank();
  const int W = pg.size();
  std::vector<Tensor> ins;
  for (int i = 0; i < W; ++i) ins.push_back(weft::ones({4}));
  expectError("rs_output_size", [&] { pg.reduceScatter(weft::ones({5}), ins); });
  std::vector<Tensor> mixed = ins;
  mixed[1] = weft::ones({4}, {.dtype = DType::Float64});
  expectError("rs_dtype", [&] { pg.reduceScatter(weft::ones({4}), mixed); });
  expectError("rs_count", [&] { pg.reduceScatter(weft::ones({4}), {weft::ones({4})}); });
  expectError("ag_output_size", [&] { pg.allGatherInto(weft::ones({4 * W + 1}), weft::ones({4})); });
  expectError("ag_dtype", [&] {
    pg.allGatherInto(weft::ones({4 * W}, {.dtype = DType::Float64}), weft::ones({4}));
  });
  expectError("unknown_name", [&] { weft::collectives::parseAllreduceAlgorithm("ringg", "test"); });

  // Ranks asking for different algorithms, then for different shard sizes of the same total.
  Tensor x = weft::ones({1000});
  expectError("algorithm_mismatch", [&] {
    pg.allReduce(x, ReduceOp::Sum, me == 0 ? AllreduceAlgorithm::Ring : AllreduceAlgorithm::Naive).wait(60s);
  });
  checkOk(pg, "algorithm_mismatch");
  std::vector<Tensor> shards = {weft::ones({me == 0 ? 3 : 4}), weft::ones({me == 0 ? 4 : 3})};
  expectError("split_mismatch", [&] { pg.reduceScatter(shards[static_cast<size_t>(me)], shards).wait(60s); });
  checkOk(pg, "split_mismatch");

  // The environment variable: an unknown name fails the group's construction at once.
  ::setenv("WEFT_ALLREDUCE_ALGORITHM", "halving_doubling", 1);
  expectError("env_unknown", [&] { ProcessGroupGloo bad(store, me, W, {.timeout = 10s, .name = "bad"}); });
  ::setenv("WEFT_ALLREDUCE_ALGORITHM", "naive", 1);
  {
    ProcessGroupGloo naive(store, me, W, {.timeout = 60s, .name = "envnaive"});
    Tensor y = weft::ones({1000});
    naive.barrier().wait(60s);
    naive.resetTrafficStats();
    naive.allReduce(y).wait(60s);
    say(std::string("env_naive algorithm ") + weft::collectives::allreduceAlgorithmName(naive.allreduceAlgorithm()) +
        " sum " + std::to_string(y.data<float>()[999]) + " sent " + std::to_string(naive.trafficStats().bytesSent));
    naive.barrier().wait(60s);
  }
  ::unsetenv("WEFT_ALLREDUCE_ALGORITHM");
}

void runKill(ProcessGroupGloo& pg, weft::rpc::StoreClient& store) {
  const int W = pg.size();
  const int64_t shard = int64_t{4} << 20;
  Tensor flat = weft::ones({shard * W});
  std::vector<Tensor> inputs;
  for (int i = 0; i < W; ++i) inputs.push_back(flat.narrow(0, i * shard, shard));
  Tensor out = weft::empty({shard});
  pg.reduceScatter(out, inputs).wait(60s);
  if (out.data<float>()[0] != static_cast<float>(W)) fail("first reduceScatter");
  say("first ok");
  store.barrier("algorithms_worker/kill/first", W, 30s);
  auto t0 = Clock::now();
  Work w = pg.reduceScatter(out, inputs);
  if (pg.rank() == W - 1) {
    // Dies with its reduceScatter issued and not done (its data is still to move: 2 shards of 16 MiB).
    say("dying");
    ::raise(SIGKILL);
  }
  try {
    w.wait();
    say("unexpected success");
  } catch (const std::exception&) {
    long long ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
    say("failed in_ms " + std::to_string(ms) + " " + weft::testing::describe(std::current_exception()));
  }
  store.barrier("algorithms_worker/kill/failed", W - 1, 30s);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: algorithms_worker algorithms|reduce_scatter|bad_args|kill\n");
    return 2;
  }
  const std::string scenario = argv[1];
  try {
    weft::rpc::Options opt = weft::rpc::Options::fromEnv();
    gRank = opt.rank;
    say("pid " + std::to_string(::getpid()) + " started");
    std::unique_ptr<weft::rpc::StoreServer> server;
    if (opt.rank == 0) server = std::make_unique<weft::rpc::StoreServer>(weft::rpc::StoreServer::configFor(opt));
    weft::rpc::StoreClient store(weft::rpc::StoreClient::configFor(opt));
    ProcessGroupGloo::Options po;
    po.timeout = scenario == "kill" ? 10s : 120s;
    {
      ProcessGroupGloo pg(store, opt.rank, opt.worldSize, po);
      if (scenario == "algorithms") runAlgorithms(pg);
      else if (scenario == "reduce_scatter") runReduceScatter(pg);
      else if (scenario == "bad_args") runBadArgs(pg, store);
      else if (scenario == "kill") runKill(pg, store);
      else fail("unknown scenario " + scenario);
    }
    const int staying = scenario == "kill" ? opt.worldSize - 1 : opt.worldSize;
    store.barrier("algorithms_worker/exit", staying, 30s);
    if (opt.rank == 0) {
      std::vector<std::string> left;
      for (int r = 1; r < staying; ++r) left.push_back("algorithms_worker/left/" + std::to_string(r));
      if (!left.empty()) store.wait(left, 30s);
    } else {
      store.set("algorithms_worker/left/" + std::to_string(opt.rank), "1");
    }
    say("done");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", gRank, e.what());
    return 1;
  }
}
