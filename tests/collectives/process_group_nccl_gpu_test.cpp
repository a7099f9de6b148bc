// ProcessGroupNccl (CUDA tensors). With a CUDA device: a group of one rank (NCCL
// supports a world of 1) runs every collective on device tensors, and bad
// arguments are refused at the call. Without a device those cases skip (exit
// 77, see WEFT_SKIP_WITHOUT_CUDA); the construction case checks the clear error
// instead. In a build without NCCL every case skips.
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>

#include "weft_test.h"

#ifdef WEFT_HAVE_NCCL

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "collectives/nccl/detail/group.h"
#include "common/error.h"
#include "rpc/store.h"
#include "captured_text.h"

using namespace weft;
using namespace weft::collectives;
using namespace std::chrono_literals;
using weft::testing::contains;

namespace {

// A store on 127.0.0.1 and its client, for a group of one rank.
struct OneRankStore {
  OneRankStore() : server(rpc::StoreServer::Config{}) {
    rpc::StoreClient::Config cc;
    cc.port = server.port();
    cc.timeout = 10s;
    client = std::make_unique<rpc::StoreClient>(cc);
  }
  rpc::StoreServer server;
  std::unique_ptr<rpc::StoreClient> client;
};

std::unique_ptr<ProcessGroupNccl> makeGroup(OneRankStore& s) {
  return ProcessGroupNccl::create(*s.client, 0, 1, {.timeout = 30s, .name = "test"});
}

std::string errorOf(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const InvalidArgumentError& e) {
    return std::string("InvalidArgumentError: ") + e.what();
  } catch (const std::exception& e) {
    return std::string("other: ") + e.what();
  }
  return "no error";
}

Tensor onDevice(const std::vector<float>& v) {
  return fromVector(v, {static_cast<int64_t>(v.size())}).to(Device::cuda(0));
}

std::vector<float> hostValues(const Tensor& t) { return t.to(Device::cpu()).toVector<float>(); }

}  // namespace

TEST_CASE("an nccl group without a CUDA device or with a CPU tensor is a clear error") {
  OneRankStore s;
  if (kernels::cudaDeviceCount() == 0) {
    std::string e = errorOf([&] { makeGroup(s); });
    CHECK(contains(e, "no CUDA device is visible"));
    CHECK(contains(e, "gloo backend"));
    return;
  }
  auto pg = makeGroup(s);
  std::string e = errorOf([&] { pg->allReduce(ones({4})); });
  CHECK(contains(e, "InvalidArgumentError"));
  CHECK(contains(e, "allReduce"));
  CHECK(contains(e, "use the gloo backend"));
}

TEST_CASE("a one-rank nccl group runs every collective on CUDA tensors") {
  WEFT_SKIP_WITHOUT_CUDA();
  OneRankStore s;
  auto pg = makeGroup(s);
  CHECK(pg->backendName() == "nccl");
  CHECK(pg->device() == 0);
  const std::vector<float> v{1.5f, -2.0f, 3.0f, 4.25f};

  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Product, ReduceOp::Min, ReduceOp::Max}) {
    Tensor t = onDevice(v);
    Work w = pg->allReduce(t, op);
    w.wait();
    CHECK(w.isSuccess());
    CHECK(hostValues(t) == v);
  }
  {
    Tensor i = fromVector(std::vector<int64_t>{7, -3}, {2}).to(Device::cuda(0));
    pg->allReduce(i, ReduceOp::Max).wait();
    CHECK(i.to(Device::cpu()).toVector<int64_t>() == std::vector<int64_t>{7, -3});
  }
  {
    Tensor t = onDevice(v);
    pg->broadcast(t, 0).wait();
    CHECK(hostValues(t) == v);
    pg->reduce(t, 0, ReduceOp::Sum).wait();
    CHECK(hostValues(t) == v);
  }
  {
    std::vector<Tensor> outs;
    pg->allGather(outs, onDevice(v)).wait();
    REQUIRE(outs.size() == 1);
    CHECK(outs[0].device() == Device::cuda(0));
    CHECK(hostValues(outs[0]) == v);
    Tensor into = onDevice({0, 0, 0, 0});
    pg->allGatherInto(into, onDevice(v)).wait();
    CHECK(hostValues(into) == v);
  }
  {
    std::vector<Tensor> outs;
    pg->gather(outs, onDevice(v), 0).wait();
    REQUIRE(outs.size() == 1);
    CHECK(hostValues(outs[0]) == v);
    Tensor out = onDevice({0, 0, 0, 0});
    pg->scatter(out, {onDevice(v)}, 0).wait();
    CHECK(hostValues(out) == v);
    Tensor rs = onDevice({0, 0, 0, 0});
    pg->reduceScatter(rs, {onDevice(v)}, ReduceOp::Avg).wait();
    CHECK(hostValues(rs) == v);
    Tensor a2a = onDevice({0, 0, 0, 0});
    pg->allToAll(a2a, onDevice(v)).wait();
    CHECK(hostValues(a2a) == v);
  }
  {
    Work b = pg->barrier();
    b.wait(10s);
    CHECK(b.isSuccess());
    CHECK(contains(b.description(), "barrier #"));
    Tensor none = empty({0}, {.device = Device::cuda(0)});
    pg->allReduce(none).wait();
  }
}

TEST_CASE("the nccl group refuses bad arguments at the call") {
  WEFT_SKIP_WITHOUT_CUDA();
  OneRankStore s;
  auto pg = makeGroup(s);
  Tensor t = onDevice({1, 2, 3, 4});
  CHECK(contains(errorOf([&] { pg->broadcast(t, 1); }), "broadcast: root 1 is not a rank"));
  CHECK(contains(errorOf([&] { pg->allReduce(Tensor()); }), "undefined tensor"));
  Tensor strided = onDevice({1, 2, 3, 4}).view({2, 2}).t();
  CHECK(contains(errorOf([&] { pg->allReduce(strided); }), "must be contiguous"));
  Tensor ints = fromVector(std::vector<int64_t>{1, 2}, {2}).to(Device::cuda(0));
  CHECK(contains(errorOf([&] { pg->allReduce(ints, ReduceOp::Avg); }), "avg needs a floating dtype"));
  std::vector<Tensor> two(2);
  CHECK(contains(errorOf([&] { pg->allGather(two, t); }), "expected 1 output tensors"));
  CHECK(contains(errorOf([&] { pg->allGatherInto(onDevice({0, 0}), t); }), "must hold 1 x 4 elements"));
  CHECK(contains(errorOf([&] { pg->scatter(t, {onDevice({1, 2})}, 0); }), "must have the dtype and shape"));
  CHECK(contains(errorOf([&] { pg->isend(t, 0); }), "cannot isend to or from itself"));
  CHECK(contains(errorOf([&] { pg->irecv(t, 3); }), "source rank 3 is not a rank"));
  CHECK(contains(errorOf([&] { pg->isend(t, 0, 5); }), "the nccl backend has no tags"));
  CHECK(contains(errorOf([&] { pg->irecvFrom(t, {1, 2}); }), "no any-source receive"));
  CHECK(contains(errorOf([&] { pg->irecvFrom(t, {}); }), "list of source ranks is empty"));
  CHECK(contains(errorOf([&] { pg->newGroup({0, 0}); }), "name a rank twice"));
  CHECK(contains(errorOf([&] { ProcessGroupNccl::create(*s.client, 0, 1, {.timeout = 0ms, .name = "t0"}); }),
                 "timeout must be > 0"));
  CHECK(contains(errorOf([&] { ProcessGroupNccl::create(*s.client, 0, 1, {.name = "bad name"}); }),
                 "group name 'bad name'"));
  // The group still works after the refusals.
  pg->allReduce(t).wait();
  CHECK(hostValues(t) == std::vector<float>{1, 2, 3, 4});
}

#else  // !WEFT_HAVE_NCCL

TEST_CASE("the nccl backend is not built") {
  std::printf("SKIP: weft built without NCCL (needs CUDA and NCCL at configure time)\n");
  std::fflush(stdout);
  std::_Exit(77);
}

#endif
