// A program for the multiprocess tests of process groups (tests/collectives/collectives_mp_test.cpp):
// one rank of a job, which finds its place through rpc::Options::fromEnv (rank 0 serves the store),
// builds a ProcessGroupGloo and plays the part of its rank in the scenario it is given. It prints
// one line per event ("rank R <phrase> ...").
//
//   WEFT_RANK=0 WEFT_WORLD_SIZE=3 WEFT_MASTER_ADDR=127.0.0.1 WEFT_MASTER_PORT=29500 collectives_worker all
//
// Scenarios (any world size >= 2 unless noted):
//   all       every collective for float32, float64 and int64 over the sizes 0, 1, 7 and 1001 (issued
//             asynchronously per dtype and size, then checked against values computed locally), point
//             to point with tags in both orders and any-source receives, a sub-group of the even
//             ranks, and one 64 MiB float32 allReduce. Prints "rank R checked N" and "rank R done".
//   timeout   ranks but the last call allReduce with a 1.5 s group timeout; the last rank never does
//             (it sleeps, then leaves). Prints "rank R failed in_ms T <ErrorType>: <message>".
//   fused     allReduce with every reduce op for float32, float64 and int64 at 0 and 1 elements and
//             at one element below, at and above the group's fused limit (pg.fusedLimit()), checked
//             against values computed locally; prints "rank R fused_limit L", "rank R fused_count C
//             expected E" (the collectives the call exchange carried against those at most L bytes),
//             "rank R identical N of M" (sum and avg of float data that rounds, below and above the
//             limit: results equal to the bit on every rank) and "rank R checked N".
//   mismatch  three mismatched allReduces, each followed by a matching one: rank 1 calls on 5
//             elements, the others on 4 ("mismatch"); rank 1 on one float32 more than the fused
//             limit holds, the others on exactly the limit ("mismatch_limit"); rank 1 on float64,
//             the others on twice as many float32, the same bytes ("mismatch_dtype"). Prints
//             "rank R <case> <ErrorType>: <message>" and "rank R after <case> ok" for each.
//   kill      [>= 3] after a first allReduce, the last rank kills itself with SIGKILL; the others
//             call allReduce (10 s timeout), print "rank R failed in_ms T <ErrorType>: <message>"
//             and keep their group until every survivor has failed.
//   b2b       20 allReduces of 10 float32 issued back to back (call checking on), then waited for,
//             in 5 rounds, every result checked; prints "rank R b2b_checked N" (the allReduces
//             checked) and the scheduling policies of this process's threads: "rank R batch_threads
//             N" (Gloo's loop thread runs SCHED_BATCH) and "rank R main_policy P" (unchanged: 0).
//             Their speed is measured by bench/collectives_bench --sizes 40 --back-to-back 20.
//   p2p_size  [3 ranks] point-to-point transfers whose sizes differ: rank 0 sends 12 float32 to a
//             receive of 4 at rank 1 ("longer"), then 4 to a receive of 12 ("shorter"), then a
//             matching transfer on the same tag ("matching", values checked), the same past the
//             size carried with the header: 300000 float32 to a receive of 400000 ("big_shorter"),
//             of 4096 ("big_longer"), then of 300000 ("big_matching", values checked); ranks 1 and 2 send
//             empty tensors to any-source receives of empty tensors at rank 0 ("empty_any"); rank
//             2 sends 3 float32 to an any-source receive of 2 at rank 0 ("any_longer"). Prints
//             "rank R <case> ok" or "rank R <case> <ErrorType>: <message>" for each, then checks
//             an allReduce and prints "rank R after p2p ok".
//   hostile   [2 ranks] rank 1 is a bare Gloo peer in rank 0's group: for allReduce #0 of 4 float32
//             it sends a matching call header followed by 8 bytes of data instead of 16, then 48
//             bytes of garbage where rank 0 awaits a size header (recv, tag 5). Rank 0 prints "rank 0
//             short_data <ErrorType>: <message>" and "rank 0 garbage_header <ErrorType>: <message>";
//             rank 1 prints "rank 1 sent".
//   stalled   [2 ranks] rank 1 is a bare Gloo peer in rank 0's group: it matches rank 0's broadcast
//             #0 of 64 MiB (root 0), posts its receive of the data and stops itself (SIGSTOP), so
//             that most of rank 0's data waits in Gloo's send queue; rank 0 then kills it (SIGKILL)
//             and prints "rank 0 failed in_ms T <ErrorType>: <message>", T counted from the kill
//             (group timeout 20 s).
//   ring_stall [4 ranks] after a first allReduce, every rank issues a 64 MiB ring allReduce; the
//             last rank stops itself (SIGSTOP) right after issuing it, stalling the ring on every
//             rank, and rank 0 kills it (SIGKILL) and prints "rank 0 killed at_ns K"; every other
//             rank prints "rank R failed at_ns T <ErrorType>: <message>" (steady clock; group
//             timeout 20 s).
//   p2p_after_death [3 ranks] after a first allReduce, the last rank kills itself (SIGKILL); a
//             second later ranks 0 and 1 exchange 1 MiB each way, checked ("rank R p2p ok"),
//             then call allReduce ("rank R later <ErrorType>: <message>").
//   leave HOST  [2 ranks, the store served by the test: no rank serves it] the group is built with
//             its connections on HOST (a 30 s timeout); after "rank R joined", rank 0 leaves at once
//             (its group closes its connections), rank 1 calls allReduce ("rank 1 allReduce
//             <ErrorType>: <message>"). The test stops rank 1 (SIGSTOP) while rank 0 connects.
//   stall HOST  as leave, with a 3 s timeout: a rank whose group cannot be built prints "rank R
//             create <ErrorType>: <message>" instead of "rank R joined".
// Every rank first prints "rank R pid P started". A wrong result throws: one line on stderr,
// exit status 1.
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gloo/rendezvous/context.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

#include "collectives/gloo/detail/call_check.h"
#include "collectives/gloo/detail/device.h"
#include "collectives/gloo/detail/group.h"
#include "common/error.h"
#include "rpc/options.h"
#include "rpc/store.h"
#include "tensor/generator.h"

#include "mp_worker.h"

namespace {

using namespace std::chrono_literals;
using weft::DType;
using weft::Tensor;
using weft::collectives::ProcessGroupGloo;
using weft::collectives::ReduceOp;
using weft::collectives::Work;
using Clock = std::chrono::steady_clock;

int gRank = 0;

void say(const std::string& line) { weft::testing::say(weft::testing::prefix(gRank) + line); }

[[noreturn]] void fail(const std::string& what) { throw std::runtime_error("rank " + std::to_string(gRank) + ": " + what); }

// The value rank r contributes at index i: small integers, so that float sums are exact.
double value(int r, int64_t i) { return static_cast<double>((r + 1) * ((i % 13) + 1)); }

Tensor filled(DType t, int64_t n, int r, int64_t offset = 0) {
  Tensor x = weft::empty({n}, {.dtype = t});
  for (int64_t i = 0; i < n; ++i) {
    double v = value(r, i + offset);
    if (t == DType::Float32) x.data<float>()[i] = static_cast<float>(v);
    else if (t == DType::Float64) x.data<double>()[i] = v;
    else x.data<int64_t>()[i] = static_cast<int64_t>(v);
  }
  return x;
}

double at(const Tensor& x, int64_t i) {
  switch (x.dtype()) {
    case DType::Float32: return x.data<float>()[i];
    case DType::Float64: return x.data<double>()[i];
    default: return static_cast<double>(x.data<int64_t>()[i]);
  }
}

int64_t gChecked = 0;

void expectEq(const Tensor& x, const std::function<double(int64_t)>& want, const std::string& what) {
  for (int64_t i = 0; i < x.numel(); ++i) {
    double w = want(i);
    if (at(x, i) != w) {
      fail(what + ": element " + std::to_string(i) + " is " + std::to_string(at(x, i)) + ", expected " +
           std::to_string(w));
    }
  }
  ++gChecked;
}

void runAll(ProcessGroupGloo& pg) {
  const int W = pg.size();
  const int me = pg.rank();
  const std::vector<DType> dtypes = {DType::Float32, DType::Float64, DType::Int64};
  const std::vector<int64_t> sizes = {0, 1, 7, 1001};
  for (DType t : dtypes) {
    for (int64_t n : sizes) {
      const std::string tag = std::string(weft::dtypeName(t)) + " n=" + std::to_string(n);
      const int root = static_cast<int>(n % W);
      std::vector<Work> works;
      Tensor sum = filled(t, n, me), prod = filled(t, n, me), mn = filled(t, n, me), mx = filled(t, n, me);
      works.push_back(pg.allReduce(sum, ReduceOp::Sum));
      works.push_back(pg.allReduce(prod, ReduceOp::Product));
      works.push_back(pg.allReduce(mn, ReduceOp::Min));
      works.push_back(pg.allReduce(mx, ReduceOp::Max));
      Tensor avg;
      if (t != DType::Int64) {
        avg = filled(t, n, me);
        works.push_back(pg.allReduce(avg, ReduceOp::Avg));
      }
      Tensor bc = filled(t, n, me);
      works.push_back(pg.broadcast(bc, root));
      Tensor red = filled(t, n, me);
      works.push_back(pg.reduce(red, root, ReduceOp::Sum));
      std::vector<Tensor> gathered;
      Tensor in = filled(t, n, me);
      works.push_back(pg.allGather(gathered, in));
      Tensor flat = weft::empty({n * W}, {.dtype = t});
      works.push_back(pg.allGatherInto(flat, in));
      std::vector<Tensor> atRoot;
      works.push_back(pg.gather(atRoot, in, root));
      std::vector<Tensor> parts;
      if (me == root) {
        for (int r = 0; r < W; ++r) parts.push_back(filled(t, n, r, 100));
      }
      Tensor scattered = weft::empty({n}, {.dtype = t});
      works.push_back(pg.scatter(scattered, parts, root));
      std::vector<Tensor> rsIn;
      for (int r = 0; r < W; ++r) rsIn.push_back(filled(t, n, me, 1000 * r));
      Tensor rsOut = weft::empty({n}, {.dtype = t});
      works.push_back(pg.reduceScatter(rsOut, rsIn, ReduceOp::Sum));
      Tensor a2aIn = filled(t, n * W, me);
      Tensor a2aOut = weft::empty({n * W}, {.dtype = t});
      works.push_back(pg.allToAll(a2aOut, a2aIn));
      works.push_back(pg.barrier());
      for (Work& w : works) w.wait(60s);

      expectEq(sum, [&](int64_t i) { double s = 0; for (int r = 0; r < W; ++r) s += value(r, i); return s; }, "allReduce sum " + tag);
      expectEq(prod, [&](int64_t i) { double p = 1; for (int r = 0; r < W; ++r) p *= value(r, i); return p; }, "allReduce product " + tag);
      expectEq(mn, [&](int64_t i) { return value(0, i); }, "allReduce min " + tag);
      expectEq(mx, [&](int64_t i) { return value(W - 1, i); }, "allReduce max " + tag);
      if (avg.defined()) {
        Tensor want = weft::empty({n}, {.dtype = t});
        for (int64_t i = 0; i < n; ++i) {
          double s = 0;
          for (int r = 0; r < W; ++r) s += value(r, i);
          if (t == DType::Float32) {
            want.data<float>()[i] = static_cast<float>(s) / static_cast<float>(W);
          } else {
            want.data<double>()[i] = s / W;
          }
        }
        expectEq(avg, [&](int64_t i) { return at(want, i); }, "allReduce avg " + tag);
      }
      expectEq(bc, [&](int64_t i) { return value(root, i); }, "broadcast " + tag);
      expectEq(red, [&](int64_t i) {
        if (me != root) return value(me, i);
        double s = 0;
        for (int r = 0; r < W; ++r) s += value(r, i);
        return s;
      }, "reduce " + tag);
      if (gathered.size() != static_cast<size_t>(W)) fail("allGather returned " + std::to_string(gathered.size()) + " tensors");
      for (int r = 0; r < W; ++r) {
        expectEq(gathered[static_cast<size_t>(r)], [&](int64_t i) { return value(r, i); }, "allGather " + tag);
      }
      expectEq(flat, [&](int64_t i) { return value(static_cast<int>(i / std::max<int64_t>(n, 1)), i % std::max<int64_t>(n, 1)); }, "allGatherInto " + tag);
      if (me == root) {
        if (atRoot.size() != static_cast<size_t>(W)) fail("gather filled " + std::to_string(atRoot.size()) + " tensors");
        for (int r = 0; r < W; ++r) expectEq(atRoot[static_cast<size_t>(r)], [&](int64_t i) { return value(r, i); }, "gather " + tag);
      }
      expectEq(scattered, [&](int64_t i) { return value(me, i + 100); }, "scatter " + tag);
      expectEq(rsOut, [&](int64_t i) { double s = 0; for (int r = 0; r < W; ++r) s += value(r, i + 1000 * me); return s; }, "reduceScatter " + tag);
      expectEq(a2aOut, [&](int64_t i) {
        int64_t from = n == 0 ? 0 : i / n;  // chunk j comes from rank j: its chunk `me`
        return value(static_cast<int>(from), me * n + (n == 0 ? 0 : i % n));
      }, "allToAll " + tag);
    }
  }

  // Point to point: a ring with two tags received in the opposite order, then any-source at rank 0.
  {
    const int next = (me + 1) % W;
    const int prev = (me + W - 1) % W;
    Tensor a = filled(DType::Float32, 33, me, 1);
    Tensor b = filled(DType::Float32, 17, me, 2);
    Work sa = pg.isend(a, next, 1);
    Work sb = pg.isend(b, next, 2);
    Tensor rb = weft::empty({17}, {.dtype = DType::Float32});
    Tensor ra = weft::empty({33}, {.dtype = DType::Float32});
    Work wb = pg.irecv(rb, prev, 2);
    Work wa = pg.irecv(ra, prev, 1);
    wb.wait(30s);
    wa.wait(30s);
    sa.wait(30s);
    sb.wait(30s);
    expectEq(ra, [&](int64_t i) { return value(prev, i + 1); }, "recv tag 1");
    expectEq(rb, [&](int64_t i) { return value(prev, i + 2); }, "recv tag 2");
    if (wa.sourceRank() != prev) fail("recv from a named rank reports source " + std::to_string(wa.sourceRank()));

    // Same tag twice between the same ranks: matched in issue order.
    Tensor first = filled(DType::Int64, 3, me, 10), second = filled(DType::Int64, 3, me, 20);
    Work s1 = pg.isend(first, next, 5);
    Work s2 = pg.isend(second, next, 5);
    Tensor r1 = weft::empty({3}, {.dtype = DType::Int64}), r2 = weft::empty({3}, {.dtype = DType::Int64});
    pg.recv(r1, prev, 5);
    pg.recv(r2, prev, 5);
    s1.wait(30s);
    s2.wait(30s);
    expectEq(r1, [&](int64_t i) { return value(prev, i + 10); }, "first same-tag recv");
    expectEq(r2, [&](int64_t i) { return value(prev, i + 20); }, "second same-tag recv");

    if (me == 0) {
      std::vector<bool> seen(static_cast<size_t>(W), false);
      for (int k = 1; k < W; ++k) {
        Tensor x = weft::empty({5}, {.dtype = DType::Float64});
        int from = pg.recvAny(x, 9);
        if (from <= 0 || from >= W || seen[static_cast<size_t>(from)]) fail("recvAny reported rank " + std::to_string(from));
        seen[static_cast<size_t>(from)] = true;
        expectEq(x, [&](int64_t i) { return value(from, i + 3); }, "recvAny from " + std::to_string(from));
      }
    } else {
      pg.send(filled(DType::Float64, 5, me, 3), 0, 9);
    }
    pg.barrier().wait(30s);
  }

  // A sub-group of the even ranks; odd ranks get none.
  {
    std::vector<int> evens;
    for (int r = 0; r < W; r += 2) evens.push_back(r);
    auto sub = pg.newGroup(evens);
    if ((me % 2 == 0) != (sub != nullptr)) fail("newGroup membership is wrong");
    if (sub) {
      if (sub->rank() != me / 2 || sub->size() != static_cast<int>(evens.size())) fail("sub-group rank or size");
      Tensor x = filled(DType::Int64, 9, me);
      sub->allReduce(x).wait(30s);
      expectEq(x, [&](int64_t i) { double s = 0; for (int r : evens) s += value(r, i); return s; }, "sub-group allReduce");
    }
    pg.barrier().wait(30s);
  }

  // 64 MiB.
  {
    const int64_t n = (64LL << 20) / 4;
    Tensor big = weft::full({n}, static_cast<double>(me + 1), {.dtype = DType::Float32});
    auto t0 = Clock::now();
    pg.allReduce(big).wait(120s);
    double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    const float want = static_cast<float>(W * (W + 1) / 2);
    const float* p = big.data<float>();
    for (int64_t i = 0; i < n; ++i) {
      if (p[i] != want) fail("64 MiB allReduce: element " + std::to_string(i) + " is " + std::to_string(p[i]));
    }
    ++gChecked;
    say("big_ms " + std::to_string(static_cast<long long>(ms)));
  }
  say("checked " + std::to_string(gChecked));
}

std::vector<ReduceOp> opsFor(DType t) {
  std::vector<ReduceOp> ops = {ReduceOp::Sum, ReduceOp::Product, ReduceOp::Min, ReduceOp::Max};
  if (t != DType::Int64) ops.push_back(ReduceOp::Avg);
  return ops;
}

// What allReduce with `op` gives at index i when rank r holds value(r, i).
double reduced(ReduceOp op, DType t, int world, int64_t i) {
  double acc = value(0, i);
  for (int r = 1; r < world; ++r) {
    const double v = value(r, i);
    if (op == ReduceOp::Sum || op == ReduceOp::Avg) acc += v;
    else if (op == ReduceOp::Product) acc *= v;
    else if (op == ReduceOp::Min) acc = std::min(acc, v);
    else acc = std::max(acc, v);
  }
  if (op != ReduceOp::Avg) return acc;
  if (t == DType::Float32) return static_cast<float>(acc) / static_cast<float>(world);
  return acc / world;
}

// Rank 0's bytes of `x`, broadcast, equal to this rank's.
bool sameBitsAsRank0(ProcessGroupGloo& pg, const Tensor& x) {
  Tensor mine = x.clone();
  Tensor theirs = x.clone();
  pg.broadcast(theirs, 0).wait(60s);
  return std::memcmp(mine.rawData(), theirs.rawData(), mine.nbytes()) == 0;
}

void runFused(ProcessGroupGloo& pg) {
  const int W = pg.size();
  const int me = pg.rank();
  const int64_t limit = static_cast<int64_t>(pg.fusedLimit());
  say("fused_limit " + std::to_string(limit));
  const int64_t fusedBefore = pg.fusedCollectives();
  int64_t expectFused = 0;
  for (DType t : {DType::Float32, DType::Float64, DType::Int64}) {
    const int64_t es = static_cast<int64_t>(weft::elementSize(t));
    const int64_t atLimit = limit / es;
    for (int64_t n : {int64_t{0}, int64_t{1}, atLimit - 1, atLimit, atLimit + 1}) {
      const std::string tag = std::string(weft::dtypeName(t)) + " n=" + std::to_string(n);
      std::vector<std::pair<ReduceOp, Tensor>> runs;
      std::vector<Work> works;
      for (ReduceOp op : opsFor(t)) {
        runs.emplace_back(op, filled(t, n, me));
        works.push_back(pg.allReduce(runs.back().second, op));
        if (n * es <= limit) ++expectFused;
      }
      for (Work& w : works) w.wait(60s);
      for (auto& [op, x] : runs) {
        expectEq(x, [&, op = op](int64_t i) { return reduced(op, t, W, i); },
                 std::string("allReduce ") + weft::collectives::reduceOpName(op) + " " + tag);
      }
    }
  }
  say("fused_count " + std::to_string(pg.fusedCollectives() - fusedBefore) + " expected " +
      std::to_string(expectFused));

  // Data that rounds: every rank must still end with the same bits.
  int identical = 0, cases = 0;
  for (DType t : {DType::Float32, DType::Float64}) {
    const int64_t atLimit = limit / static_cast<int64_t>(weft::elementSize(t));
    for (int64_t n : {int64_t{7}, atLimit, atLimit + 1}) {
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) {
        weft::Generator gen(77 + static_cast<uint64_t>(me));
        Tensor x = weft::randn({n}, {.dtype = t}, &gen);
        pg.allReduce(x, op).wait(60s);
        ++cases;
        if (sameBitsAsRank0(pg, x)) ++identical;
      }
    }
  }
  say("identical " + std::to_string(identical) + " of " + std::to_string(cases));
  say("checked " + std::to_string(gChecked));
}

void runTimeout(ProcessGroupGloo& pg) {
  const int last = pg.size() - 1;
  if (pg.rank() == last) {
    std::this_thread::sleep_for(4s);  // outlives the others' timeout, then leaves without calling
    return;
  }
  Tensor x = weft::ones({8});
  auto t0 = Clock::now();
  try {
    pg.allReduce(x).wait();
    say("unexpected success");
  } catch (const std::exception&) {
    long long ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
    say("failed in_ms " + std::to_string(ms) + " " + weft::testing::describe(std::current_exception()));
  }
  // The group is now unusable: later ops fail at once.
  try {
    pg.barrier().wait(5s);
    say("unexpected later success");
  } catch (const std::exception&) {
    say("later " + weft::testing::describe(std::current_exception()));
  }
}

// One mismatched allReduce (rank 1 reduces `odd`, the others `even`), then a matching one.
void mismatchCase(ProcessGroupGloo& pg, const std::string& name, const Tensor& even, const Tensor& odd) {
  try {
    pg.allReduce(pg.rank() == 1 ? odd : even).wait(30s);
    say(name + " unexpected success");
  } catch (const std::exception&) {
    say(name + " " + weft::testing::describe(std::current_exception()));
  }
  Tensor y = weft::ones({4});
  pg.allReduce(y).wait(30s);
  expectEq(y, [&](int64_t) { return static_cast<double>(pg.size()); }, "allReduce after " + name);
  say("after " + name + " ok");
}

void runMismatch(ProcessGroupGloo& pg) {
  mismatchCase(pg, "mismatch", weft::ones({4}), weft::ones({5}));
  // Across the fused limit: the others' data comes with their headers, rank 1's does not.
  const int64_t atLimit = static_cast<int64_t>(pg.fusedLimit()) / 4;
  mismatchCase(pg, "mismatch_limit", weft::ones({atLimit}), weft::ones({atLimit + 1}));
  // The same bytes, another dtype.
  mismatchCase(pg, "mismatch_dtype", weft::ones({8}), weft::ones({4}, {.dtype = DType::Float64}));
}

// One point-to-point case: `body` runs on every rank; its error, if any, is printed as
// "rank R <name> <ErrorType>: <message>", else "rank R <name> ok"; then a barrier.
void p2pCase(ProcessGroupGloo& pg, const std::string& name, const std::function<void()>& body) {
  try {
    body();
    say(name + " ok");
  } catch (const std::exception&) {
    say(name + " " + weft::testing::describe(std::current_exception()));
  }
  pg.barrier().wait(30s);
}

void runP2pSize(ProcessGroupGloo& pg) {
  const int me = pg.rank();
  // Rank 0 sends 12 float32 to rank 1, which posts a receive of 4; then 4 into a receive of 12.
  p2pCase(pg, "longer", [&] {
    if (me == 0) pg.send(filled(DType::Float32, 12, 0), 1, 3);
    if (me == 1) pg.recv(weft::zeros({4}), 0, 3);
  });
  p2pCase(pg, "shorter", [&] {
    if (me == 0) pg.send(filled(DType::Float32, 4, 0), 1, 3);
    if (me == 1) pg.recv(weft::zeros({12}), 0, 3);
  });
  // The same tag again, matching: the values arrive.
  p2pCase(pg, "matching", [&] {
    if (me == 0) pg.send(filled(DType::Float32, 4, 0, 5), 1, 3);
    if (me == 1) {
      Tensor x = weft::zeros({4});
      pg.recv(x, 0, 3);
      expectEq(x, [](int64_t i) { return value(0, i + 5); }, "matching recv after mismatches");
    }
  });
  // Past the size that travels with the header (1 MiB): 300000 float32 into 400000, then into 300000.
  p2pCase(pg, "big_shorter", [&] {
    if (me == 0) pg.send(filled(DType::Float32, 300000, 0), 1, 4);
    if (me == 1) pg.recv(weft::zeros({400000}), 0, 4);
  });
  p2pCase(pg, "big_longer", [&] {
    if (me == 0) pg.send(filled(DType::Float32, 300000, 0), 1, 4);
    if (me == 1) pg.recv(weft::zeros({4096}), 0, 4);
  });
  p2pCase(pg, "big_matching", [&] {
    if (me == 0) pg.send(filled(DType::Float32, 300000, 0, 9), 1, 4);
    if (me == 1) {
      Tensor x = weft::zeros({300000});
      pg.recv(x, 0, 4);
      expectEq(x, [](int64_t i) { return value(0, i + 9); }, "big matching recv after a mismatch");
    }
  });
  // Empty tensors received from any of two ranks.
  p2pCase(pg, "empty_any", [&] {
    if (me == 0) {
      std::vector<bool> seen(3, false);
      for (int k = 0; k < 2; ++k) {
        int from = pg.recvAny(weft::zeros({0}), 8);
        if (from < 1 || from > 2 || seen[static_cast<size_t>(from)]) fail("empty recvAny reported rank " + std::to_string(from));
        seen[static_cast<size_t>(from)] = true;
      }
    } else {
      pg.send(weft::zeros({0}), 0, 8);
    }
  });
  // Rank 2 sends 3 float32 to an any-source receive of 2 at rank 0.
  p2pCase(pg, "any_longer", [&] {
    if (me == 0) pg.recvAny(weft::zeros({2}), 9);
    if (me == 2) pg.send(filled(DType::Float32, 3, 2), 0, 9);
  });
  // The group is still usable for collectives.
  Tensor y = filled(DType::Float32, 5, me);
  pg.allReduce(y).wait(30s);
  expectEq(y, [&](int64_t i) { double s = 0; for (int r = 0; r < pg.size(); ++r) s += value(r, i); return s; },
           "allReduce after the point-to-point mismatches");
  say("after p2p ok");
}

// Rank 0 of "hostile": a fused allReduce whose peer's data does not fit its header, then a
// receive whose peer sends no weft size header.
void runHostile(ProcessGroupGloo& pg, weft::rpc::StoreClient& store) {
  try {
    pg.allReduce(weft::ones({4})).wait(30s);
    say("short_data unexpected success");
  } catch (const std::exception&) {
    say("short_data " + weft::testing::describe(std::current_exception()));
  }
  try {
    pg.recv(weft::zeros({4}), 1, 5);
    say("garbage_header unexpected success");
  } catch (const std::exception&) {
    say("garbage_header " + weft::testing::describe(std::current_exception()));
  }
  store.barrier("collectives_worker/hostile", 2, 30s);
}

// Rank 1 of "hostile": joins rank 0's group as a bare Gloo peer (the same rendezvous keys) and
// sends what no weft rank sends: a call header for allReduce #0 of 4 float32 with 8 bytes of data
// after it, then 48 bytes of garbage where a size header belongs.
void runHostilePeer(weft::rpc::StoreClient& store) {
  namespace gd = weft::collectives::detail;
  store.set("weft/pg/default/joined/1", "1");
  auto context = std::make_shared<gd::MeshContext>(1, 2);
  context->setTimeout(30s);
  std::shared_ptr<gloo::transport::Device> device = gd::createTcpDevice("127.0.0.1");
  context->connectMesh(store, "weft/pg/default/", device, 30s, "the hostile peer");
  // Rank 0's message of run 0 (its header and 16 bytes of data) lands here.
  std::vector<uint8_t> incoming(gd::kHeaderBytes + ProcessGroupGloo::kFusedSendBytes);
  auto in = context->createUnboundBuffer(incoming.data(), incoming.size());
  in->recv(0, gd::kExchangeSlotBase);
  const int64_t words[gd::kHeaderWords] = {0x7765667470670003, static_cast<int64_t>(gd::OpCode::AllReduce), 0,
                                           static_cast<int64_t>(DType::Float32), 4, -1,
                                           static_cast<int64_t>(ReduceOp::Sum), 8, -1, -1};
  std::vector<uint8_t> message(gd::kHeaderBytes + 8, 0);
  std::memcpy(message.data(), words, gd::kHeaderBytes);
  auto out = context->createUnboundBuffer(message.data(), message.size());
  out->send(0, gd::kExchangeSlotBase);
  if (!in->waitRecv(nullptr, 30s) || !out->waitSend(nullptr, 30s)) fail("the hostile call header did not get through");
  std::vector<uint8_t> garbage(48, 0xAB);
  auto junk = context->createUnboundBuffer(garbage.data(), garbage.size());
  junk->send(0, gd::kP2pHeaderBase | 5);
  if (!junk->waitSend(nullptr, 30s)) fail("the garbage size header did not get through");
  say("sent");
  store.barrier("collectives_worker/hostile", 2, 30s);
}

constexpr int64_t kStalledElements = int64_t{16} << 20;  // 64 MiB of float32

// Rank 0 of "stalled": the root of a broadcast whose only peer stops reading, then dies.
void runStalledRoot(ProcessGroupGloo& pg, weft::rpc::StoreClient& store) {
  Tensor x = weft::ones({kStalledElements});
  Work w = pg.broadcast(x, 0);
  const pid_t peer = static_cast<pid_t>(std::stoll(store.get("collectives_worker/stalled/pid", 30s)));
  // The peer has stopped with its receive posted: what the socket does not hold waits in Gloo's
  // send queue, and stays there.
  std::this_thread::sleep_for(500ms);
  ::kill(peer, SIGKILL);
  auto t0 = Clock::now();
  try {
    w.wait();
    say("unexpected success");
  } catch (const std::exception&) {
    long long ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
    say("failed in_ms " + std::to_string(ms) + " " + weft::testing::describe(std::current_exception()));
  }
}

// Rank 1 of "stalled": joins rank 0's group as a bare Gloo peer, answers broadcast #0's call
// header with a matching one, posts the receive of the data on the slot Gloo's broadcast uses
// (tag 0: the group's first Gloo collective) and stops before reading it.
void runStalledPeer(weft::rpc::StoreClient& store) {
  namespace gd = weft::collectives::detail;
  store.set("weft/pg/default/joined/1", "1");
  auto context = std::make_shared<gd::MeshContext>(1, 2);
  context->setTimeout(30s);
  std::shared_ptr<gloo::transport::Device> device = gd::createTcpDevice("127.0.0.1");
  context->connectMesh(store, "weft/pg/default/", device, 30s, "the stalled peer");
  std::vector<uint8_t> incoming(gd::kHeaderBytes + ProcessGroupGloo::kFusedSendBytes);
  auto in = context->createUnboundBuffer(incoming.data(), incoming.size());
  in->recv(0, gd::kExchangeSlotBase);
  const int64_t words[gd::kHeaderWords] = {0x7765667470670003, static_cast<int64_t>(gd::OpCode::Broadcast), 0,
                                           static_cast<int64_t>(DType::Float32), kStalledElements, 0, -1, 0, -1, -1};
  std::vector<uint8_t> header(gd::kHeaderBytes);
  std::memcpy(header.data(), words, gd::kHeaderBytes);
  auto out = context->createUnboundBuffer(header.data(), header.size());
  out->send(0, gd::kExchangeSlotBase);
  if (!in->waitRecv(nullptr, 30s) || !out->waitSend(nullptr, 30s)) fail("the call headers did not get through");
  std::vector<float> data(static_cast<size_t>(kStalledElements));
  auto sink = context->createUnboundBuffer(data.data(), data.size() * sizeof(float));
  sink->recv(0, gloo::Slot::build(gloo::kBroadcastSlotPrefix, 0));
  store.set("collectives_worker/stalled/pid", std::to_string(::getpid()));
  say("stopping");
  ::raise(SIGSTOP);
  fail("went on after SIGSTOP");
}

// "ring_stall": see the file comment.
void runRingStall(ProcessGroupGloo& pg, weft::rpc::StoreClient& store) {
  pg.allReduce(weft::ones({1024})).wait(30s);
  Tensor x = weft::ones({int64_t{16} << 20});
  Work w = pg.allReduce(x, ReduceOp::Sum, weft::collectives::AllreduceAlgorithm::Ring);
  if (pg.rank() == pg.size() - 1) {
    store.set("collectives_worker/ring_stall/pid", std::to_string(::getpid()));
    ::raise(SIGSTOP);
    fail("went on after SIGSTOP");
  }
  if (pg.rank() == 0) {
    const auto victim = static_cast<pid_t>(std::stoll(store.get("collectives_worker/ring_stall/pid", 30s)));
    std::this_thread::sleep_for(500ms);  // every rank is inside the ring, waiting
    ::kill(victim, SIGKILL);
    say("killed at_ns " + std::to_string(weft::testing::steadyNs(Clock::now())));
  }
  try {
    w.wait();
    say("unexpected success");
  } catch (const std::exception&) {
    say("failed at_ns " + std::to_string(weft::testing::steadyNs(Clock::now())) + " " +
        weft::testing::describe(std::current_exception()));
  }
  store.barrier("collectives_worker/ring_stall/failed", pg.size() - 1, 30s);
}

// "p2p_after_death": see the file comment.
void runP2pAfterDeath(ProcessGroupGloo& pg, weft::rpc::StoreClient& store) {
  pg.allReduce(weft::ones({1024})).wait(30s);
  if (pg.rank() == pg.size() - 1) ::raise(SIGKILL);
  // Long enough for the group to see the connection lost (a dead process's sockets close at once);
  // no operation of this rank names the dead rank, so none fails on its own.
  std::this_thread::sleep_for(1s);
  const int64_t n = 1 << 18;  // 1 MiB of float32
  const int peer = 1 - pg.rank();
  Tensor out = filled(DType::Float32, n, pg.rank());
  Tensor in = weft::zeros({n});
  Work sent = pg.isend(out, peer, 7);
  Work got = pg.irecv(in, peer, 7);
  sent.wait(30s);
  got.wait(30s);
  expectEq(in, [&](int64_t i) { return value(peer, i); }, "p2p after a death");
  say("p2p ok");
  try {
    pg.allReduce(weft::ones({4})).wait(30s);
    say("later unexpected success");
  } catch (const std::exception&) {
    say("later " + weft::testing::describe(std::current_exception()));
  }
  store.barrier("collectives_worker/p2p_after_death/done", pg.size() - 1, 30s);
}

void runKill(ProcessGroupGloo& pg, weft::rpc::StoreClient& store) {
  Tensor x = weft::ones({1024});
  pg.allReduce(x).wait(30s);
  if (pg.rank() == pg.size() - 1) {
    say("dying");
    ::raise(SIGKILL);
  }
  std::this_thread::sleep_for(200ms);  // the victim is gone before the next collective
  Tensor y = weft::ones({1 << 20});
  auto t0 = Clock::now();
  try {
    pg.allReduce(y).wait();
    say("unexpected success");
  } catch (const std::exception&) {
    long long ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
    say("failed in_ms " + std::to_string(ms) + " " + weft::testing::describe(std::current_exception()));
  }
  // The survivors keep their connections until each has failed: a survivor that destroyed its
  // group first would be a lost connection for the others too.
  store.barrier("collectives_worker/kill/failed", pg.size() - 1, 30s);
}

// leave and stall (see the header): the group on `host`, then rank 0 leaves and rank 1 calls allReduce.
void runLeave(weft::rpc::StoreClient& store, int rank, int size, const std::string& host,
              std::chrono::milliseconds timeout) {
  std::unique_ptr<weft::collectives::ProcessGroup> pg;
  try {
    pg = weft::collectives::createGlooGroup(store, rank, size, {.timeout = timeout, .hostname = host});
  } catch (const std::exception&) {
    say("create " + weft::testing::describe(std::current_exception()));
    return;
  }
  say("joined");
  if (rank == 0) return;
  try {
    pg->allReduce(weft::ones({4})).wait(30s);
    say("allReduce unexpected success");
  } catch (const std::exception&) {
    say("allReduce " + weft::testing::describe(std::current_exception()));
  }
}

// The scheduling policy of thread `tid` of this process (field 41 of /proc/self/task/<tid>/stat),
// -1 when unreadable.
int threadPolicy(const std::string& tid) {
  std::ifstream in("/proc/self/task/" + tid + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return -1;
  std::istringstream fields(stat.substr(close + 2));  // from field 3 (state) on
  std::string field;
  for (int i = 3; i <= 41 && (fields >> field); ++i) {
    if (i == 41) return std::stoi(field);
  }
  return -1;
}

void runBackToBack(ProcessGroupGloo& pg) {
  constexpr int kOps = 20;
  constexpr int kRounds = 5;
  std::vector<Tensor> xs;
  for (int i = 0; i < kOps; ++i) xs.push_back(weft::ones({10}));
  pg.barrier().wait(30s);
  int checked = 0;
  for (int round = 0; round < kRounds; ++round) {
    for (Tensor& x : xs) x.fill_(1.0);
    std::vector<weft::collectives::Work> works;
    for (Tensor& x : xs) works.push_back(pg.allReduce(x));
    for (auto& w : works) w.wait(30s);
    for (Tensor& x : xs) {
      expectEq(x, [&](int64_t) { return static_cast<double>(pg.size()); }, "back-to-back allReduce");
      ++checked;
    }
  }
  say("b2b_checked " + std::to_string(checked));
  int batch = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) {
    if (threadPolicy(entry.path().filename().string()) == SCHED_BATCH) ++batch;
  }
  say("batch_threads " + std::to_string(batch));
  say("main_policy " + std::to_string(threadPolicy(std::to_string(::getpid()))));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: collectives_worker all|fused|timeout|mismatch|kill|b2b|p2p_size|hostile|stalled|ring_stall|"
                 "p2p_after_death|leave HOST|stall HOST\n");
    return 2;
  }
  const std::string scenario = argv[1];
  try {
    weft::rpc::Options opt = weft::rpc::Options::fromEnv();
    gRank = opt.rank;
    say("pid " + std::to_string(::getpid()) + " started");
    if (scenario == "leave" || scenario == "stall") {
      if (argc < 3) fail(scenario + " needs the address to bind");
      weft::rpc::StoreClient store(weft::rpc::StoreClient::configFor(opt));
      runLeave(store, opt.rank, opt.worldSize, argv[2], scenario == "leave" ? 30s : 3s);
      say("done");
      return 0;
    }
    std::unique_ptr<weft::rpc::StoreServer> server;
    if (opt.rank == 0) server = std::make_unique<weft::rpc::StoreServer>(weft::rpc::StoreServer::configFor(opt));
    weft::rpc::StoreClient store(weft::rpc::StoreClient::configFor(opt));
    if (scenario == "hostile" && opt.rank == 1) {
      runHostilePeer(store);
      say("done");
      return 0;
    }
    if (scenario == "stalled" && opt.rank == 1) runStalledPeer(store);
    ProcessGroupGloo::Options po;
    po.timeout = scenario == "timeout"                                                  ? 1500ms
                 : scenario == "kill"                                               ? 10s
                 : scenario == "stalled" || scenario == "ring_stall" || scenario == "p2p_after_death" ? 20s
                                                                                    : 60s;
    {
      ProcessGroupGloo pg(store, opt.rank, opt.worldSize, po);
      if (scenario == "all") runAll(pg);
      else if (scenario == "timeout") runTimeout(pg);
      else if (scenario == "mismatch") runMismatch(pg);
      else if (scenario == "fused") runFused(pg);
      else if (scenario == "kill") runKill(pg, store);
      else if (scenario == "b2b") runBackToBack(pg);
      else if (scenario == "p2p_size") runP2pSize(pg);
      else if (scenario == "hostile") runHostile(pg, store);
      else if (scenario == "stalled") runStalledRoot(pg, store);
      else if (scenario == "ring_stall") runRingStall(pg, store);
      else if (scenario == "p2p_after_death") runP2pAfterDeath(pg, store);
      else fail("unknown scenario " + scenario);
    }
    // Ranks that took part to the end meet before leaving (the last rank of timeout and kill does not).
    // Rank 0 serves the store: it leaves only once every other such rank has said it is leaving (a
    // barrier alone lets rank 0 close the store while another rank's barrier answer is in flight).
    const int staying =
        scenario == "timeout" || scenario == "kill" || scenario == "hostile" || scenario == "stalled" ||
                scenario == "ring_stall" || scenario == "p2p_after_death"
            ? opt.worldSize - 1
            : opt.worldSize;
    if (opt.rank < staying) {
      store.barrier("collectives_worker/exit", staying, 30s);
      if (opt.rank == 0) {
        std::vector<std::string> left;
        for (int r = 1; r < staying; ++r) left.push_back("collectives_worker/left/" + std::to_string(r));
        if (!left.empty()) store.wait(left, 30s);
      } else {
        store.set("collectives_worker/left/" + std::to_string(opt.rank), "1");
      }
    }
    say("done");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", gRank, e.what());
    return 1;
  }
}
