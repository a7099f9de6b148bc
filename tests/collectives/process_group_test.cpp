// ProcessGroupGloo within one process: several ranks, each with its own store client and group,
// built on threads over real TCP on 127.0.0.1. Argument checks, Work semantics, the store
// adaptor, float16 reductions, any-source receives, sub-groups (arguments, ranks that pass different
// lists or never call) and destruction.
#include <doctest/doctest.h>

#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <arpa/inet.h>
#include <netinet/in.h>

#include <gloo/transport/tcp/address.h>
#include <gloo/types.h>

#include "collectives/gloo/detail/group.h"
#include "collectives/gloo/detail/store.h"
#include "common/error.h"
#include "rpc/store.h"
#include "captured_text.h"

using namespace weft;
using namespace weft::collectives;
using namespace std::chrono_literals;
using weft::testing::contains;
using weft::testing::numberAfter;

namespace {

// A store and `world` groups, one per rank, built concurrently (the constructor is collective).
class Ranks {
 public:
  explicit Ranks(int world, ProcessGroupGloo::Options options = {}) {
    rpc::StoreServer::Config sc;
    server_ = std::make_unique<rpc::StoreServer>(sc);
    for (int r = 0; r < world; ++r) {
      rpc::StoreClient::Config cc;
      cc.port = server_->port();
      cc.timeout = 10s;
      clients_.push_back(std::make_unique<rpc::StoreClient>(cc));
    }
    if (options.timeout == ProcessGroupGloo::Options{}.timeout) options.timeout = 10s;
    std::vector<std::future<std::unique_ptr<ProcessGroupGloo>>> made;
    for (int r = 0; r < world; ++r) {
      made.push_back(std::async(std::launch::async, [this, r, world, options] {
        return ProcessGroupGloo::create(*clients_[static_cast<size_t>(r)], r, world, options);
      }));
    }
    for (auto& f : made) groups_.push_back(f.get());
  }
  ProcessGroupGloo& operator[](int r) { return *groups_.at(static_cast<size_t>(r)); }
  rpc::StoreClient& store(int r) { return *clients_.at(static_cast<size_t>(r)); }
  void destroy(int r) { groups_.at(static_cast<size_t>(r)).reset(); }

 private:
  std::unique_ptr<rpc::StoreServer> server_;
  std::vector<std::unique_ptr<rpc::StoreClient>> clients_;  // outlive the groups
  std::vector<std::unique_ptr<ProcessGroupGloo>> groups_;
};

std::string errorOf(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("bad arguments are refused at the call with InvalidArgumentError naming the op") {
  Ranks ranks(1);
  ProcessGroupGloo& pg = ranks[0];
  Tensor m = zeros({4, 6});
  CHECK_THROWS_AS(pg.allReduce(m.transpose(0, 1)), InvalidArgumentError);
  CHECK(contains(errorOf([&] { pg.allReduce(m.transpose(0, 1)); }), "allReduce: tensor must be contiguous"));
  CHECK(contains(errorOf([&] { pg.allReduce(Tensor()); }), "allReduce: tensor is an undefined tensor"));
  CHECK(contains(errorOf([&] { pg.allReduce(zeros({3}, {.dtype = DType::Int64}), ReduceOp::Avg); }),
                 "allReduce: ReduceOp avg needs a floating dtype, got int64"));
  CHECK(contains(errorOf([&] { pg.broadcast(m, 1); }), "broadcast: root 1 is not a rank of a group of size 1"));
  std::vector<Tensor> outs(3);
  CHECK(contains(errorOf([&] { pg.allGather(outs, m); }), "allGather: expected 1 output tensors (one per rank), got 3"));
  std::vector<Tensor> wrong = {zeros({4, 5})};
  CHECK(contains(errorOf([&] { pg.allGather(wrong, m); }), "allGather: outputs[0] (float32, shape [4, 5]) must have"));
  CHECK(contains(errorOf([&] { pg.allGatherInto(zeros({3}), m); }), "allGatherInto: output"));
  CHECK(contains(errorOf([&] { pg.scatter(m, {}, 0); }), "scatter: the root passes 1 inputs"));
  CHECK(contains(errorOf([&] { pg.allToAll(zeros({}), zeros({})); }), "allToAll: dim 0 of the input"));
  CHECK(contains(errorOf([&] { pg.isend(m, 0); }), "isend: rank 0 cannot isend to or from itself"));
  CHECK(contains(errorOf([&] { pg.irecv(m, 3); }), "irecv: source rank 3 is not a rank"));
  CHECK(contains(errorOf([&] { pg.newGroup({}); }), "newGroup: the list of ranks is empty"));
  CHECK(contains(errorOf([&] { pg.newGroup({0, 0}); }), "name a rank twice"));
  CHECK(contains(errorOf([&] { pg.newGroup({1}); }), "are not all ranks of group 'default'"));
  // Nothing was queued by the refused calls.
  CHECK(pg.collectivesStarted() == 0);
  pg.barrier().wait(5s);
  CHECK(pg.collectivesStarted() == 1);
}

TEST_CASE("a group of one runs every collective locally") {
  Ranks ranks(1);
  ProcessGroupGloo& pg = ranks[0];
  Tensor x = fromVector<double>({1, 2, 3});
  pg.allReduce(x, ReduceOp::Avg).wait(5s);
  CHECK(x.toVector<double>() == std::vector<double>{1, 2, 3});
  std::vector<Tensor> outs;
  pg.allGather(outs, x).wait(5s);
  REQUIRE(outs.size() == 1);
  CHECK(outs[0].toVector<double>() == std::vector<double>{1, 2, 3});
}

TEST_CASE("group options are checked: a bad name or a zero timeout") {
  rpc::StoreServer server(rpc::StoreServer::Config{});
  rpc::StoreClient::Config cc;
  cc.port = server.port();
  rpc::StoreClient store(cc);
  CHECK_THROWS_AS(ProcessGroupGloo(store, 0, 1, {.name = "a b"}), InvalidArgumentError);
  CHECK_THROWS_AS(ProcessGroupGloo(store, 0, 1, {.timeout = 0ms}), InvalidArgumentError);
  CHECK_THROWS_AS(ProcessGroupGloo(store, 2, 2, {}), InvalidArgumentError);
}

TEST_CASE("Work::wait with a timeout gives up waiting but not the op, which completes once the peer calls") {
  Ranks ranks(2);
  Tensor a = full({5}, 1.0);
  Tensor b = full({5}, 2.0);
  Work w0 = ranks[0].allReduce(a);
  CHECK_FALSE(w0.isCompleted());
  std::string err = errorOf([&] { w0.wait(100ms); });
  CHECK(contains(err, "Work::wait: allReduce #0 on group 'default' has not completed after 100 ms"));
  CHECK_FALSE(w0.isCompleted());
  CHECK(w0.exception() == nullptr);
  Work w1 = ranks[1].allReduce(b);
  w0.wait(5s);
  w1.wait(5s);
  CHECK(w0.isSuccess());
  CHECK(w0.sourceRank() == -1);
  CHECK(a.toVector<float>() == std::vector<float>(5, 3.0f));
  CHECK(b.toVector<float>() == std::vector<float>(5, 3.0f));
  CHECK(w0.future().isReady());
}

TEST_CASE("collectives of one group run in issue order, and float16 reduces through Gloo's half type") {
  Ranks ranks(2);
  std::vector<std::vector<Work>> works(2);
  std::vector<Tensor> halves;
  for (int r = 0; r < 2; ++r) {
    Tensor h = empty({3}, {.dtype = DType::Float16});
    auto* p = static_cast<gloo::float16*>(h.rawData());
    for (int i = 0; i < 3; ++i) p[i] = gloo::cpu_float2half_rn(static_cast<float>((r + 1) * (i + 1)));
    halves.push_back(h);
  }
  std::vector<Tensor> steps = {zeros({1}), zeros({1})};
  for (int r = 0; r < 2; ++r) {
    steps[static_cast<size_t>(r)].fill_(r + 1);
    for (int k = 0; k < 5; ++k) works[static_cast<size_t>(r)].push_back(ranks[r].allReduce(steps[static_cast<size_t>(r)]));
    works[static_cast<size_t>(r)].push_back(ranks[r].allReduce(halves[static_cast<size_t>(r)], ReduceOp::Avg));
  }
  for (auto& ws : works) {
    for (Work& w : ws) w.wait(10s);
  }
  // (1 + 2) doubled four more times, in order.
  CHECK(steps[0].item<float>() == 48.0f);
  CHECK(steps[1].item<float>() == 48.0f);
  auto* p = static_cast<gloo::float16*>(halves[1].rawData());
  for (int i = 0; i < 3; ++i) CHECK(gloo::cpu_half2float(p[i]) == doctest::Approx(1.5 * (i + 1)));
  CHECK(ranks[0].collectivesStarted() == 6);
}

TEST_CASE("a receive from a list of ranks reports the sender it matched") {
  Ranks ranks(3);
  Tensor from2 = full({4}, 2.0);
  Work s = ranks[2].isend(from2, 0, 11);
  Tensor got = zeros({4});
  Work r = ranks[0].irecvFrom(got, {1, 2}, 11);
  r.wait(5s);
  s.wait(5s);
  CHECK(r.sourceRank() == 2);
  CHECK(got.toVector<float>() == std::vector<float>(4, 2.0f));
  CHECK(contains(r.description(), "recv from any of ranks [1, 2] (tag 11) on group 'default'"));
}

TEST_CASE("a receive nobody answers times out, and the group is unusable afterwards") {
  Ranks ranks(2, {.timeout = 300ms});
  Tensor got = zeros({4});
  auto t0 = std::chrono::steady_clock::now();
  Work r = ranks[0].irecv(got, 1, 3);
  std::string err = errorOf([&] { r.wait(5s); });
  CHECK(std::chrono::steady_clock::now() - t0 < 3s);
  CHECK_THROWS_AS(r.wait(), TimeoutError);
  CHECK(contains(err, "recv from rank 1 (tag 3) on group 'default' failed on rank 0: timed out after 300 ms"));
  CHECK_THROWS_AS(ranks[0].barrier().wait(5s), StateError);
}

TEST_CASE("destroying a group fails its queued collectives with StateError") {
  Ranks ranks(2, {.timeout = 500ms});
  Work first = ranks[0].barrier();   // waits for rank 1, which never calls
  Work queued = ranks[0].allReduce(zeros({3}));
  auto until = std::chrono::steady_clock::now() + 5s;  // the barrier is running, the allReduce queued
  while (ranks[0].collectivesStarted() < 1 && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(1ms);
  REQUIRE(ranks[0].collectivesStarted() == 1);
  ranks.destroy(0);
  CHECK_THROWS_AS(first.wait(5s), TimeoutError);
  CHECK_THROWS_AS(queued.wait(5s), StateError);
  CHECK(contains(errorOf([&] { queued.wait(); }), "destroyed before the collective ran"));
}

TEST_CASE("sub-groups have their own ranks and store prefix, and non-members get none") {
  Ranks ranks(3);
  std::vector<std::future<std::unique_ptr<ProcessGroup>>> subs;
  for (int r = 0; r < 3; ++r) {
    subs.push_back(std::async(std::launch::async, [&ranks, r] { return ranks[r].newGroup({2, 0}); }));
  }
  std::vector<std::unique_ptr<ProcessGroup>> got;
  for (auto& f : subs) got.push_back(f.get());
  REQUIRE(got[0] != nullptr);
  CHECK(got[1] == nullptr);
  REQUIRE(got[2] != nullptr);
  CHECK(got[2]->rank() == 0);  // ranks[0] of the list
  CHECK(got[0]->rank() == 1);
  CHECK(got[0]->name() == "default/sub0[2,0]");
  Tensor a = full({2}, 1.0), c = full({2}, 5.0);
  Work wa = got[0]->allReduce(a, ReduceOp::Max);
  Work wc = got[2]->allReduce(c, ReduceOp::Max);
  wa.wait(5s);
  wc.wait(5s);
  CHECK(a.toVector<float>() == std::vector<float>(2, 5.0f));
  CHECK(ranks.store(0).check({"weft/pg/default/sub0[2,0]/joined/0", "weft/pg/default/sub0[2,0]/joined/1"}));
}

TEST_CASE("ranks passing newGroup different rank lists all fail naming what each passed, and the group stays "
          "usable") {
  Ranks ranks(3);
  // Runs newGroup on every rank with lists[r]; returns each rank's error (empty: it succeeded).
  auto newGroups = [&](const std::vector<std::vector<int>>& lists, std::vector<std::unique_ptr<ProcessGroup>>* made) {
    std::vector<std::future<std::string>> calls;
    for (int r = 0; r < 3; ++r) {
      calls.push_back(std::async(std::launch::async, [&, r] {
        return errorOf([&] {
          auto g = ranks[r].newGroup(lists[static_cast<size_t>(r)]);
          if (made != nullptr) (*made)[static_cast<size_t>(r)] = std::move(g);
        });
      }));
    }
    std::vector<std::string> errors;
    for (auto& c : calls) errors.push_back(c.get());
    return errors;
  };
  auto errors = newGroups({{0, 2}, {0, 1}, {0, 2}}, nullptr);
  for (int r = 0; r < 3; ++r) {
    const std::string& e = errors[static_cast<size_t>(r)];
    INFO("rank " << r << ": " << e);
    CHECK(contains(e, "newGroup #0 on group 'default': the ranks passed different rank lists:"));
    CHECK(contains(e, "rank 0 passed [0, 2]\n  rank 1 passed [0, 1]\n  rank 2 passed [0, 2]"));
  }
  // The same ranks in another order number them differently: a different list.
  errors = newGroups({{0, 2}, {0, 2}, {2, 0}}, nullptr);
  for (const std::string& e : errors) CHECK(contains(e, "newGroup #1 on group 'default'"));
  CHECK(contains(errors[0], "rank 2 passed [2, 0]"));
  // A rank with a bad list fails at once; the others learn its list.
  errors = newGroups({{0, 1}, {0, 1}, {0, 5}}, nullptr);
  CHECK(contains(errors[2], "newGroup: ranks [0, 5] are not all ranks of group 'default' of size 3"));
  CHECK(contains(errors[0], "newGroup #2 on group 'default': the ranks passed different rank lists"));
  CHECK(contains(errors[1], "rank 2 passed [0, 5]"));
  // Then matching lists make a working sub-group, and the group itself still works.
  std::vector<std::unique_ptr<ProcessGroup>> subs(3);
  errors = newGroups({{0, 1}, {0, 1}, {0, 1}}, &subs);
  for (const std::string& e : errors) CHECK(e.empty());
  REQUIRE(subs[0] != nullptr);
  REQUIRE(subs[1] != nullptr);
  CHECK(subs[2] == nullptr);
  CHECK(subs[0]->name() == "default/sub3[0,1]");
  Tensor a = full({3}, 2.0), b = full({3}, 5.0);
  Work wa = subs[0]->allReduce(a);
  Work wb = subs[1]->allReduce(b);
  wa.wait(5s);
  wb.wait(5s);
  CHECK(a.toVector<float>() == std::vector<float>(3, 7.0f));
  std::vector<Tensor> xs = {full({2}, 1.0), full({2}, 1.0), full({2}, 1.0)};
  std::vector<Work> ws;
  for (int r = 0; r < 3; ++r) ws.push_back(ranks[r].allReduce(xs[static_cast<size_t>(r)]));
  for (Work& w : ws) w.wait(5s);
  CHECK(xs[2].toVector<float>() == std::vector<float>(2, 3.0f));
}

TEST_CASE("a rank that never calls newGroup makes the others fail after the group timeout, naming it") {
  Ranks ranks(2, {.timeout = 500ms});
  auto began = std::chrono::steady_clock::now();
  std::string e = errorOf([&] { ranks[0].newGroup({0, 1}); });
  auto took = std::chrono::steady_clock::now() - began;
  CHECK(contains(e, "newGroup #0 on group 'default': ranks [1] did not call it within 500 ms"));
  CHECK(took >= 400ms);
  CHECK(took < 5s);
  CHECK_THROWS_AS(ranks[0].newGroup({0, 1}), TimeoutError);
}

TEST_CASE("a rank that never joins the rendezvous fails the others within the group's timeout, naming it") {
  rpc::StoreServer server(rpc::StoreServer::Config{});
  rpc::StoreClient::Config cc;
  cc.port = server.port();
  rpc::StoreClient store(cc);
  auto began = std::chrono::steady_clock::now();
  std::string e;
  try {
    ProcessGroupGloo::create(store, 0, 3, {.timeout = 800ms, .name = "lonely"});
  } catch (const TimeoutError& x) {
    e = x.what();
  }
  auto took = std::chrono::steady_clock::now() - began;
  CHECK(contains(e, "group 'lonely' (rank 0 of 3): rendezvous timed out after "));
  INFO(e);
  CHECK(contains(e, "ranks [1, 2] have not joined (the group's timeout is 800 ms)"));
  CHECK(took >= 700ms);
  CHECK(took < 5s);
}

TEST_CASE("a peer that gives its address but never connects fails the connect at the group's timeout, naming it") {
  rpc::StoreServer server(rpc::StoreServer::Config{});
  rpc::StoreClient::Config cc;
  cc.port = server.port();
  rpc::StoreClient store(cc);
  // Rank 1's address, 127.0.0.2, sorts above rank 0's 127.0.0.1: rank 0 waits for rank 1 to dial
  // in (Gloo's rule), which it never does.
  sockaddr_in peer{};
  peer.sin_family = AF_INET;
  peer.sin_port = htons(9);
  ::inet_pton(AF_INET, "127.0.0.2", &peer.sin_addr);
  std::vector<char> bytes =
      gloo::transport::tcp::Address(reinterpret_cast<const sockaddr*>(&peer), sizeof peer).bytes();
  store.set("weft/pg/silent/mesh/1", std::string(bytes.begin(), bytes.end()));
  auto began = std::chrono::steady_clock::now();
  std::string e;
  try {
    ProcessGroupGloo::create(store, 0, 2, {.timeout = 800ms, .hostname = "127.0.0.1", .name = "silent"});
  } catch (const TimeoutError& x) {
    e = x.what();
  }
  auto took = std::chrono::steady_clock::now() - began;
  INFO(e);
  CHECK(contains(e, "group 'silent' (rank 0 of 2): rank 0 (at 127.0.0.1:"));
  CHECK(contains(e, "connecting to rank 1 at 127.0.0.2:9 (the group's timeout is 800 ms)"));
  CHECK(contains(e, "WEFT_SOCKET_IFNAME"));
  // One deadline for the whole rendezvous; Gloo's own connect would wait 5 times the timeout.
  CHECK(took >= 700ms);
  CHECK(took < 3s);
}

TEST_CASE("GlooStore puts every key under its prefix") {
  rpc::StoreServer server(rpc::StoreServer::Config{});
  rpc::StoreClient::Config cc;
  cc.port = server.port();
  rpc::StoreClient store(cc);
  GlooStore gs(store, "p/", 1s);
  gs.set("0", {'a', 'b'});
  CHECK(store.get("p/0", 1s) == "ab");
  CHECK(gs.get("0") == std::vector<char>{'a', 'b'});
  gs.wait({"0"}, std::chrono::milliseconds(100));
  CHECK_THROWS_AS(gs.wait({"1"}, std::chrono::milliseconds(100)), TimeoutError);
}

TEST_CASE("a peer's address in the store that Gloo cannot take fails the rendezvous with ProtocolError, no abort") {
  rpc::StoreServer server(rpc::StoreServer::Config{});
  rpc::StoreClient::Config cc;
  cc.port = server.port();
  cc.timeout = 10s;
  rpc::StoreClient store(cc);
  rpc::StoreClient peer(cc);
  // Rank 1 "joins" with 3 bytes where Gloo expects its pair addresses.
  peer.set("weft/pg/default/joined/1", "1");
  peer.set("weft/pg/default/mesh/1", "abc");
  std::string error;
  try {
    ProcessGroupGloo pg(store, 0, 2, {.timeout = 5s});
  } catch (const ProtocolError& e) {
    error = e.what();
  }
  CHECK(contains(error, "ProcessGroupGloo: group 'default' (rank 0 of 2): rank 1 posted 3 bytes of addresses"));
}

TEST_CASE("int32 and uint8 reduce with sum, max, min and product, and bool, int32 and uint8 move by broadcast and "
          "allGather") {
  Ranks ranks(3);
  // Small tensors go through the fused exchange, the large ones through Gloo's ring: test both.
  const int64_t large = static_cast<int64_t>(ranks[0].fusedLimit()) + 1000;
  for (int64_t n : {int64_t{5}, large}) {
    CAPTURE(n);
    // Rank r holds (r + 1) * (i % 7) - 3 as int32 and (r + 1) * (i % 100) mod 256 as uint8, so
    // that Sum and Product wrap past 255.
    auto int32Of = [n](int r) {
      std::vector<int32_t> v(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<int32_t>((r + 1) * (i % 7) - 3);
      return fromVector(v);
    };
    auto uint8Of = [n](int r) {
      std::vector<uint8_t> v(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<uint8_t>((r + 1) * (i % 100) % 256);
      return fromVector(v);
    };
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min, ReduceOp::Product}) {
      CAPTURE(reduceOpName(op));
      std::vector<Tensor> ints, bytes;
      std::vector<Work> works;
      for (int r = 0; r < 3; ++r) {
        ints.push_back(int32Of(r));
        bytes.push_back(uint8Of(r));
      }
      for (int r = 0; r < 3; ++r) {
        works.push_back(ranks[r].allReduce(ints[static_cast<size_t>(r)], op));
        works.push_back(ranks[r].allReduce(bytes[static_cast<size_t>(r)], op));
      }
      for (Work& w : works) w.wait(20s);
      // The reference: the same reduction element by element over the three ranks' inputs.
      std::vector<std::vector<int32_t>> inI;
      std::vector<std::vector<uint8_t>> inU;
      for (int r = 0; r < 3; ++r) {
        inI.push_back(int32Of(r).toVector<int32_t>());
        inU.push_back(uint8Of(r).toVector<uint8_t>());
      }
      auto combine = [op](auto a, auto b) -> decltype(a) {
        switch (op) {
          case ReduceOp::Sum: return static_cast<decltype(a)>(a + b);
          case ReduceOp::Max: return a > b ? a : b;
          case ReduceOp::Min: return a < b ? a : b;
          default: return static_cast<decltype(a)>(a * b);
        }
      };
      std::vector<int32_t> wantI(static_cast<size_t>(n));
      std::vector<uint8_t> wantU(static_cast<size_t>(n));
      for (size_t i = 0; i < wantI.size(); ++i) {
        wantI[i] = combine(combine(inI[0][i], inI[1][i]), inI[2][i]);
        wantU[i] = combine(combine(inU[0][i], inU[1][i]), inU[2][i]);
      }
      for (int r = 0; r < 3; ++r) {
        CHECK(ints[static_cast<size_t>(r)].dtype() == DType::Int32);
        CHECK(ints[static_cast<size_t>(r)].toVector<int32_t>() == wantI);
        CHECK(bytes[static_cast<size_t>(r)].toVector<uint8_t>() == wantU);
      }
      if (op == ReduceOp::Sum && n == 5) CHECK(wantU[4] == static_cast<uint8_t>(4 + 8 + 12));
    }
    // Broadcast and allGather of every new dtype, bool included.
    std::vector<Tensor> masks, gathered(3);
    std::vector<std::vector<Tensor>> outs(3);
    std::vector<Work> works;
    for (int r = 0; r < 3; ++r) {
      std::vector<bool> bits(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) bits[static_cast<size_t>(i)] = (i + r) % 3 == 0;
      masks.push_back(fromVector(bits));
    }
    std::vector<Tensor> fromRoot = {int32Of(0), int32Of(1), int32Of(2)};
    for (int r = 0; r < 3; ++r) {
      works.push_back(ranks[r].broadcast(fromRoot[static_cast<size_t>(r)], 2));
      works.push_back(ranks[r].allGather(outs[static_cast<size_t>(r)], masks[static_cast<size_t>(r)]));
    }
    for (Work& w : works) w.wait(20s);
    for (int r = 0; r < 3; ++r) {
      CHECK(fromRoot[static_cast<size_t>(r)].toVector<int32_t>() == int32Of(2).toVector<int32_t>());
      REQUIRE(outs[static_cast<size_t>(r)].size() == 3);
      for (int k = 0; k < 3; ++k) {
        CHECK(outs[static_cast<size_t>(r)][static_cast<size_t>(k)].dtype() == DType::Bool);
        CHECK(outs[static_cast<size_t>(r)][static_cast<size_t>(k)].toVector<bool>() ==
              masks[static_cast<size_t>(k)].toVector<bool>());
      }
    }
  }
  // uint8 by broadcast, on the fused path.
  std::vector<Tensor> px = {fromVector<uint8_t>({1, 2}), fromVector<uint8_t>({250, 251}),
                            zeros({2}, {.dtype = DType::UInt8})};
  std::vector<Work> works;
  for (int r = 0; r < 3; ++r) works.push_back(ranks[r].broadcast(px[static_cast<size_t>(r)], 1));
  for (Work& w : works) w.wait(20s);
  for (const Tensor& t : px) CHECK(t.toVector<uint8_t>() == std::vector<uint8_t>{250, 251});
}

TEST_CASE("reducing a bool mask or averaging integers is refused with the dtype named") {
  Ranks ranks(1);
  Tensor mask = fromVector(std::vector<bool>{true, false});
  CHECK(contains(errorOf([&] { ranks[0].allReduce(mask, ReduceOp::Max); }),
                 "allReduce: the gloo backend reduces float32, float64, int64, int32, uint8 and float16, not bool "
                 "(convert a mask to uint8: Max is any, Min is all)"));
  CHECK(contains(errorOf([&] { ranks[0].allReduce(zeros({2}, {.dtype = DType::Int32}), ReduceOp::Avg); }),
                 "allReduce: ReduceOp avg needs a floating dtype, got int32"));
  CHECK(contains(errorOf([&] { ranks[0].reduce(zeros({2}, {.dtype = DType::UInt8}), 0, ReduceOp::Avg); }),
                 "reduce: ReduceOp avg needs a floating dtype, got uint8"));
}

TEST_CASE("a timed-out collective reports stale progress as stale, not as a rank that has not started it") {
  // Rank 1's progress stops reaching the store (its client is gone, as in a
  // partition); it then starts allReduce #1 with rank 0, and rank 2 never
  // calls it. Rank 0 may say rank 2 had not started it (rank 2 keeps posting),
  // but of rank 1 only when it was last heard.
  Ranks ranks(3, {.timeout = 4s});
  std::vector<Work> first;
  for (int r = 0; r < 3; ++r) first.push_back(ranks[r].barrier());
  for (Work& w : first) w.wait(10s);
  // The number of the last collective rank r posted (its key starts with it).
  auto posted = [&](int r) {
    return std::stoll(ranks.store(0).get("weft/pg/default/progress/" + std::to_string(r), 5s));
  };
  auto deadline = std::chrono::steady_clock::now() + 10s;
  while ((posted(1) != 0 || posted(2) != 0) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(10ms);
  }
  REQUIRE(posted(1) == 0);
  ranks.store(1).close();

  Tensor a = full({8}, 1.0);
  Tensor b = full({8}, 2.0);
  Work w0 = ranks[0].allReduce(a);
  Work w1 = ranks[1].allReduce(b);
  std::string err0 = errorOf([&] { w0.wait(30s); });
  std::string err1 = errorOf([&] { w1.wait(30s); });
  INFO(err0);
  INFO(err1);
  CHECK(contains(err0, "allReduce #1 on group 'default' failed on rank 0: timed out after 4000 ms"));
  CHECK(contains(err0, "ranks [2] had not started it when last heard (rank 2 at #0, "));
  CHECK(contains(err0, "rank 1 was last heard at #0, "));
  CHECK(contains(err0, " s ago (whether it has started it since is unknown)"));
  CHECK_FALSE(contains(err0, "ranks [1"));
  // Rank 1 was last heard before the collective began, at least the timeout ago;
  // rank 2 posts every second.
  CHECK(numberAfter(err0, "rank 1 was last heard at #0, ") >= 3);
  CHECK(numberAfter(err0, "(rank 2 at #0, ") < 3);
  // Rank 1 cannot read the store, and says so instead of guessing.
  CHECK(contains(err1, "whether ranks [0, 2] started it is unknown: their progress could not be read (store: cannot "));
}
