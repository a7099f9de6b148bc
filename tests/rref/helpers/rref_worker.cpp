// A program for the multiprocess tests of remote references (tests/rref/rref_mp_test.cpp): one
// process of a weft job, which finds its place through rpc::Options::fromEnv and plays the part
// of its rank in the scenario it is given. It prints one line per event, in a form the tests
// parse ("rank R <phrase> key value ...").
//
//   WEFT_RANK=0 WEFT_WORLD_SIZE=4 WEFT_MASTER_ADDR=127.0.0.1 WEFT_MASTER_PORT=29500 rref_worker chain
//
// Scenarios (world size in brackets):
//   kill    [3] rank 1 owns a Sleeper and two values and prints "rank 1 owner ready"; the test
//               kills it with SIGKILL once it serves a pending nap from ranks 0 and 2 and builds a
//               slow value rank 0 waits on with toHere. Ranks 0 and 2 print, for each pending
//               operation, "rank R pending <what> at_ns <steady ns> <ErrorType>: <message>", then
//               for each later use of their handles "rank R later <what> in_us <us> <ErrorType>:
//               <message>", "rank R alive <0|1>", and after a graceful shutdown
//               "rank R shutdown graceful <0|1> missing <names|-> seconds <s>" and the counts.
//   chain   [4] rank 0 creates a value on rank 1 and sends it 0 -> 2 -> 3 -> 0 through nested
//               calls; it comes back as the result. Each holder prints
//               "rank R holder <step> confirmed 1 value V".
//   bulk    [3] rank 0 creates 10,000 values and 100 objects on rank 1, fetches some, bounces some
//               through rank 2, drops them all; prints "rank 0 bulk created N ... seconds S".
//   tensor  [2] rank 0 fetches a 64 MiB float tensor owned by rank 1 and checks every element.
//   parcel  [3] RRefs inside a vector inside a WEFT_CODEC_FIELDS struct, sent user -> third worker
//               and owner -> user, used there.
//   errors  [2] localValue() on a user and on the owner, a remote constructor and a remote
//               function that throw, seen by the first use.
// Every scenario but kill ends the same way on every rank: a store barrier once all handles are
// dropped, a bounded wait until this worker's RRef tables are empty, then
//   "rank R counts before owned 0 forks 0 users 0 pendingUsers 0 pendingChildren 0"
//   "rank R shutdown graceful 1 missing - seconds S"
//   "rank R counts after owned 0 forks 0 users 0 pendingUsers 0 pendingChildren 0"
// Every rank first prints "rank R pid P started". Every wait is bounded (60 s at most). A wrong
// result throws: one line on stderr, exit status 1.
#include <atomic>
#include <chrono>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "common/future.h"
#include "rpc/agent.h"
#include "rpc/options.h"
#include "rpc/store.h"
#include "rref/rref.h"

#include "mp_worker.h"

namespace rrefworker {

using namespace std::chrono_literals;
using weft::Error;
using weft::Future;
using weft::RRef;
using weft::Tensor;
using weft::rpc::Agent;
using Clock = std::chrono::steady_clock;
using namespace weft::testing;  // tests/mp_worker.h: say, prefix, describe, require, waitUntil, ...

// A remote object whose nap() blocks its handler thread for as long as it is asked.
class Sleeper {
 public:
  explicit Sleeper(int64_t value) : value_(value) {}
  int64_t nap(int64_t ms) {
    say("rank 1 nap started");
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    return ms;
  }
  int64_t get() const { return value_; }

 private:
  int64_t value_;
};
WEFT_REMOTE_CLASS(Sleeper, WEFT_CONSTRUCTORS((int64_t)), nap, get);

class Tally {
 public:
  explicit Tally(int64_t start) : value_(start) {}
  int64_t add(int64_t n) { return value_.fetch_add(n) + n; }
  int64_t get() const { return value_.load(); }

 private:
  std::atomic<int64_t> value_;
};
WEFT_REMOTE_CLASS(Tally, WEFT_CONSTRUCTORS((int64_t)), add, get);

class Exploding {
 public:
  explicit Exploding(int64_t) { throw std::runtime_error("the constructor exploded on purpose"); }
  int64_t get() const { return 0; }
};
WEFT_REMOTE_CLASS(Exploding, WEFT_CONSTRUCTORS((int64_t)), get);

struct Parcel {
  std::string tag;
  std::vector<RRef<Tensor>> refs;
  int64_t count = 0;
};
WEFT_CODEC_FIELDS(Parcel, tag, refs, count);

inline const weft::Function<int64_t(int64_t)> slowValue{"rref_worker.slowValue"};
inline const weft::Function<Tensor(int64_t)> floatArange{"rref_worker.floatArange"};
inline const weft::Function<void(RRef<Sleeper>)> keep{"rref_worker.keep"};
inline const weft::Function<int64_t(int64_t)> square{"rref_worker.square"};
inline const weft::Function<int64_t(int64_t)> explode{"rref_worker.explode"};
inline const weft::Function<RRef<int64_t>(RRef<int64_t>)> hop{"rref_worker.hop"};
inline const weft::Function<RRef<int64_t>(RRef<int64_t>)> bounce{"rref_worker.bounce"};
inline const weft::Function<std::vector<RRef<int64_t>>(std::vector<RRef<int64_t>>)> bounceMany{
    "rref_worker.bounceMany"};
inline const weft::Function<Tensor(int64_t, double)> fill{"rref_worker.fill"};
inline const weft::Function<double(Parcel)> useParcel{"rref_worker.useParcel"};
inline const weft::Function<Parcel(int64_t)> ownerParcel{"rref_worker.ownerParcel"};

constexpr int64_t kChainRoot = 65;
constexpr int64_t kChainValue = kChainRoot * kChainRoot;
constexpr int64_t kBulkValues = 10000;
constexpr int64_t kBulkObjects = 100;
constexpr int64_t kTensorElements = int64_t{16} << 20;  // 64 MiB of float32

std::string countsLine(const weft::rref::DebugCounts& c) {
  return "owned " + std::to_string(c.owned) + " forks " + std::to_string(c.forks) + " users " +
         std::to_string(c.users) + " pendingUsers " + std::to_string(c.pendingUsers) + " pendingChildren " +
         std::to_string(c.pendingChildren);
}

// The common end: every rank has dropped its handles; wait (bounded) until this worker's tables
// are empty, shut down gracefully, print the counts before and after.
void settle(Agent& agent) {
  agent.store().barrier("rref-dropped", agent.worldSize(), 30s);
  auto began = Clock::now();
  waitUntil([&] { return weft::rref::debugCounts(agent).empty(); }, 15s);
  say(prefix(agent) + "counts before " + countsLine(weft::rref::debugCounts(agent)) + " settle_ms " +
      std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - began).count()));
  sayShutdown(agent);
  say(prefix(agent) + "counts after " + countsLine(weft::rref::debugCounts(agent)));
}

// Checks a handle as a holder sees it: confirmed by the owner (within 10 s) and holding kChainValue.
void checkHolder(const Agent& agent, const RRef<int64_t>& r, const std::string& step) {
  bool confirmed = waitUntil([&] { return r.confirmedByOwner(); }, 10s);
  int64_t v = r.toHere();
  require(v == kChainValue, step + ": toHere gave " + std::to_string(v));
  require(r.owner() == 1 && !r.isOwner(), step + ": the owner is rank 1");
  say(prefix(agent) + "holder " + step + " confirmed " + std::to_string(confirmed) + " value " + std::to_string(v) +
      " id " + std::to_string(r.id()));
}

// State shared between a rank's main thread and its handlers.
struct Shared {
  std::mutex mutex;
  std::optional<RRef<Sleeper>> kept;
};

void bindAll(Agent& agent, Shared& shared) {
  auto& reg = agent.registry();
  reg.impl(slowValue, [](int64_t ms) {
    say("rank 1 building slow value");
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    return ms;
  });
  reg.impl(floatArange, [](int64_t n) { return weft::arange(n, {.dtype = weft::DType::Float32}); });
  reg.impl(keep, [&shared](RRef<Sleeper> s) {
    std::lock_guard<std::mutex> lock(shared.mutex);
    shared.kept = std::move(s);
  });
  reg.impl(square, [](int64_t i) { return i * i; });
  reg.impl(explode, [](int64_t) -> int64_t { throw std::runtime_error("the function exploded on purpose"); });
  // The chain 0 -> 2 -> 3 -> 0: each holder checks the handle, passes it on to the next rank,
  // and returns what comes back (rank 0 ends it by returning the handle it received).
  reg.impl(hop, [&agent](RRef<int64_t> r) {
    int next = agent.rank() == 2 ? 3 : agent.rank() == 3 ? 0 : -1;
    checkHolder(agent, r, "hop" + std::to_string(agent.rank()));
    if (next < 0) return r;
    return agent.call(next, hop, r);
  });
  reg.impl(bounce, [](RRef<int64_t> r) { return r; });
  reg.impl(bounceMany, [](std::vector<RRef<int64_t>> v) { return v; });
  reg.impl(fill, [](int64_t n, double v) { return weft::full({n}, v); });
  reg.impl(useParcel, [&agent](Parcel p) {
    require(static_cast<int64_t>(p.refs.size()) == p.count, "parcel " + p.tag + ": " + std::to_string(p.refs.size()) +
                                                                   " refs, count " + std::to_string(p.count));
    double sum = 0;
    bool confirmed = true;
    for (auto& r : p.refs) {
      confirmed = confirmed && waitUntil([&] { return r.confirmedByOwner(); }, 10s);
      sum += r.toHere().sum().item<float>();
    }
    std::string localValue = "none";
    try {
      p.refs.at(0).localValue();
    } catch (...) {
      localValue = describe(std::current_exception());
    }
    say(prefix(agent) + "used parcel " + p.tag + " refs " + std::to_string(p.refs.size()) + " confirmed " +
        std::to_string(confirmed) + " sum " + std::to_string(sum) + " localValue " + localValue);
    return sum;
  });
  reg.impl(ownerParcel, [&agent](int64_t n) {
    Parcel p{"owner-to-user", {}, 3};
    for (int k = 1; k <= 3; ++k) p.refs.push_back(weft::makeRRef(agent, weft::full({n}, static_cast<double>(k))));
    return p;
  });
}

Agent* startAgent(Agent& agent, Shared& shared) {
  bindAll(agent, shared);
  agent.start();
  sayStarted(agent);
  return &agent;
}

// ---- kill ---------------------------------------------------------------------------------------

// A pending operation: when it failed (steady clock), and how.
struct Pending {
  std::string what;
  std::shared_ptr<std::atomic<long long>> failedAt = std::make_shared<std::atomic<long long>>(0);
  Future<void> done;
};

template <class T>
Pending watch(std::string what, Future<T> f) {
  Pending p;
  p.what = std::move(what);
  auto at = p.failedAt;
  f.onComplete([at](const Future<T>&) { at->store(steadyNs(Clock::now())); });
  p.done = f.then([](const T&) {});
  return p;
}

void reportPending(const Agent& agent, Pending& p) {
  if (!p.done.waitFor(40s)) throw Error(p.what + ": never completed after the owner was killed");
  if (!p.done.hasError()) throw Error(p.what + ": succeeded although its owner was killed");
  say(prefix(agent) + "pending " + p.what + " at_ns " + std::to_string(p.failedAt->load()) + " " +
      describe(p.done.exception()));
}

// Runs `use` and prints how it failed and how long that took; a use that succeeds is an error.
template <class F>
void later(const Agent& agent, const std::string& what, F&& use) {
  auto began = Clock::now();
  try {
    use();
  } catch (...) {
    auto us = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - began).count();
    say(prefix(agent) + "later " + what + " in_us " + std::to_string(us) + " " + describe(std::current_exception()));
    return;
  }
  throw Error(what + ": succeeded although the owner was killed");
}

void survive(Agent& agent, std::vector<Pending>& pending, const RRef<Sleeper>& obj,
             const std::optional<RRef<Tensor>>& tensor, const std::optional<RRef<int64_t>>& slow) {
  for (Pending& p : pending) reportPending(agent, p);
  later(agent, "rpcSync", [&] { obj.rpcSync(&Sleeper::get); });
  later(agent, "rpcAsync", [&] { obj.rpcAsync(&Sleeper::get).get(); });
  later(agent, "remote", [&] { obj.remote(&Sleeper::get).toHere(); });
  if (tensor) later(agent, "toHere", [&] { tensor->toHere(); });
  if (slow) later(agent, "toHereSlow", [&] { slow->toHere(); });
  later(agent, "create", [&] { agent.remote<Sleeper>(1, int64_t{3}).rpcSync(&Sleeper::get); });
  say(prefix(agent) + "alive " + std::to_string(agent.isAlive(1)));
  sayShutdown(agent);
  say(prefix(agent) + "counts after " + countsLine(weft::rref::debugCounts(agent)));
}

int killScenario(Agent& agent, Shared& shared) {
  startAgent(agent, shared);
  if (agent.rank() == 1) {
    say("rank 1 owner ready");
    std::this_thread::sleep_for(60s);
    say("rank 1 victim was not killed");
    return 6;
  }
  const weft::rpc::CallOptions noTimeout{.timeout = 0ms};
  if (agent.rank() == 0) {
    RRef<Sleeper> obj = agent.remote<Sleeper>(1, int64_t{7});
    require(obj.rpcSync(&Sleeper::get) == 7, "Sleeper::get before the kill");
    RRef<Tensor> tensor = agent.remote(1, floatArange, int64_t{16});
    require(tensor.toHere().sum().item<float>() == 120.0f, "toHere before the kill");
    agent.call(2, keep, obj);
    RRef<int64_t> slow = agent.remote(1, slowValue, int64_t{30000});
    std::vector<Pending> pending;
    pending.push_back(watch("toHere", slow.toHereAsync(0ms)));
    pending.push_back(watch("nap", obj.rpcAsync(noTimeout, &Sleeper::nap, int64_t{30000})));
    say("rank 0 pending");
    survive(agent, pending, obj, tensor, slow);
    return 0;
  }
  // Rank 2 holds a fork of rank 0's handle.
  std::optional<RRef<Sleeper>> kept;
  bool got = waitUntil(
      [&] {
        std::lock_guard<std::mutex> lock(shared.mutex);
        if (shared.kept) kept = shared.kept;
        return kept.has_value();
      },
      20s);
  require(got, "rank 2 never received the handle");
  require(waitUntil([&] { return kept->confirmedByOwner(); }, 10s), "the fork on rank 2 was never confirmed");
  require(kept->rpcSync(&Sleeper::get) == 7, "Sleeper::get from rank 2");
  std::vector<Pending> pending;
  pending.push_back(watch("nap", kept->rpcAsync(noTimeout, &Sleeper::nap, int64_t{30000})));
  say("rank 2 pending");
  survive(agent, pending, *kept, std::nullopt, std::nullopt);
  {
    std::lock_guard<std::mutex> lock(shared.mutex);
    shared.kept.reset();
  }
  return 0;
}

// ---- chain --------------------------------------------------------------------------------------

int chainScenario(Agent& agent, Shared& shared) {
  startAgent(agent, shared);
  if (agent.rank() == 0) {
    RRef<int64_t> r = agent.remote(1, square, kChainRoot);
    checkHolder(agent, r, "creator");
    RRef<int64_t> back = agent.call(2, hop, r);
    require(back.id() == r.id(), "the handle that came back is another reference");
    checkHolder(agent, back, "returned");
  }
  settle(agent);
  return 0;
}

// ---- bulk ---------------------------------------------------------------------------------------

int bulkScenario(Agent& agent, Shared& shared) {
  startAgent(agent, shared);
  if (agent.rank() == 0) {
    auto began = Clock::now();
    std::vector<RRef<int64_t>> values;
    values.reserve(kBulkValues);
    for (int64_t i = 0; i < kBulkValues; ++i) values.push_back(agent.remote(1, square, i));
    std::vector<RRef<Tally>> objects;
    for (int64_t i = 0; i < kBulkObjects; ++i) objects.push_back(agent.remote<Tally>(1, i));
    double createSeconds = std::chrono::duration<double>(Clock::now() - began).count();

    std::vector<std::pair<int64_t, Future<int64_t>>> fetches;
    for (int64_t i = 0; i < kBulkValues; i += 10) fetches.emplace_back(i, values[static_cast<size_t>(i)].toHereAsync());
    for (auto& [i, f] : fetches) require(f.get() == i * i, "toHere of value " + std::to_string(i));
    for (int64_t i = 0; i < kBulkObjects; ++i) {
      require(objects[static_cast<size_t>(i)].rpcSync(&Tally::add, int64_t{1}) == i + 1, "Tally::add");
    }
    // Round trips through rank 2: one at a time, and 500 in one vector.
    std::vector<RRef<int64_t>> bounced;
    for (int64_t i = 0; i < kBulkValues; i += 100) {
      RRef<int64_t> b = agent.call(2, bounce, values[static_cast<size_t>(i)]);
      require(b.id() == values[static_cast<size_t>(i)].id(), "bounce returned another reference");
      bounced.push_back(b);
    }
    std::vector<RRef<int64_t>> batch;
    for (int64_t i = 0; i < kBulkValues; i += 20) batch.push_back(values[static_cast<size_t>(i)]);
    std::vector<RRef<int64_t>> batchBack = agent.call(2, bounceMany, batch);
    require(batchBack.size() == batch.size(), "bounceMany returned " + std::to_string(batchBack.size()));
    for (size_t k = 0; k < batch.size(); ++k) require(batchBack[k].id() == batch[k].id(), "bounceMany order");
    for (size_t k = 0; k < batchBack.size(); k += 50) {
      require(batchBack[k].toHere() == static_cast<int64_t>(k * 20 * k * 20), "toHere of a bounced value");
    }
    bool confirmed = waitUntil(
        [&] {
          for (auto& v : values)
            if (!v.confirmedByOwner()) return false;
          for (auto& o : objects)
            if (!o.confirmedByOwner()) return false;
          for (auto& b : bounced)
            if (!b.confirmedByOwner()) return false;
          for (auto& b : batchBack)
            if (!b.confirmedByOwner()) return false;
          return true;
        },
        30s);
    require(confirmed, "not every handle was confirmed by its owner");
    double loadedSeconds = std::chrono::duration<double>(Clock::now() - began).count();
    say("rank 0 bulk created " + std::to_string(values.size() + objects.size()) + " fetched " +
        std::to_string(fetches.size()) + " bounced " + std::to_string(bounced.size() + batchBack.size()) +
        " create_seconds " + std::to_string(createSeconds) + " seconds " + std::to_string(loadedSeconds));
    agent.store().barrier("rref-loaded", agent.worldSize(), 30s);
    agent.store().barrier("rref-loaded-seen", agent.worldSize(), 30s);
    auto dropAt = Clock::now();
    values.clear();
    objects.clear();
    bounced.clear();
    batch.clear();
    batchBack.clear();
    fetches.clear();
    say("rank 0 bulk dropped seconds " + std::to_string(std::chrono::duration<double>(Clock::now() - dropAt).count()));
  } else {
    agent.store().barrier("rref-loaded", agent.worldSize(), 30s);
    say(prefix(agent) + "counts loaded " + countsLine(weft::rref::debugCounts(agent)));
    agent.store().barrier("rref-loaded-seen", agent.worldSize(), 30s);
  }
  settle(agent);
  return 0;
}

// ---- tensor -------------------------------------------------------------------------------------

int tensorScenario(Agent& agent, Shared& shared) {
  startAgent(agent, shared);
  if (agent.rank() == 0) {
    RRef<Tensor> r = agent.remote(1, floatArange, kTensorElements);
    auto first = Clock::now();
    Tensor t = r.toHere();
    double firstMs = std::chrono::duration<double, std::milli>(Clock::now() - first).count();
    auto second = Clock::now();
    Tensor again = r.toHere();
    double secondMs = std::chrono::duration<double, std::milli>(Clock::now() - second).count();
    for (const Tensor* x : {&t, &again}) {
      require(x->dtype() == weft::DType::Float32 && x->numel() == kTensorElements && x->isContiguous(),
              "the fetched tensor's dtype, size or layout");
      const float* p = x->data<float>();
      int64_t wrong = 0;
      for (int64_t i = 0; i < kTensorElements; ++i) wrong += p[i] != static_cast<float>(i);
      require(wrong == 0, std::to_string(wrong) + " elements differ from arange");
    }
    require(t.data<float>() != again.data<float>(), "two fetches share storage");
    say("rank 0 tensor bytes " + std::to_string(kTensorElements * 4) + " elements_ok 1 first_ms " +
        std::to_string(firstMs) + " second_ms " + std::to_string(secondMs));
  }
  settle(agent);
  return 0;
}

// ---- parcel -------------------------------------------------------------------------------------

int parcelScenario(Agent& agent, Shared& shared) {
  startAgent(agent, shared);
  if (agent.rank() == 0) {
    RRef<Tensor> a = agent.remote(1, fill, int64_t{4}, 2.0);
    RRef<Tensor> b = agent.remote(1, fill, int64_t{3}, 5.0);
    // user (0) -> third worker (2): 8 + 15 + 8
    double s = agent.call(2, useParcel, Parcel{"user-to-third", {a, b, a}, 3});
    say("rank 0 parcel user-to-third sum " + std::to_string(s));
    // owner (1) -> user (0): three values rank 1 owns, 2 + 4 + 6
    Parcel q = agent.call(1, ownerParcel, int64_t{2});
    bool atOnce = true;
    double sum = 0;
    for (auto& r : q.refs) {
      atOnce = atOnce && r.confirmedByOwner() && r.owner() == 1;
      sum += r.toHere().sum().item<float>();
    }
    say("rank 0 parcel " + q.tag + " refs " + std::to_string(q.refs.size()) + " confirmed_at_once " +
        std::to_string(atOnce) + " sum " + std::to_string(sum));
    // and on from this user to the third worker
    q.tag = "owner-to-user-to-third";
    double s2 = agent.call(2, useParcel, q);
    say("rank 0 parcel owner-to-user-to-third sum " + std::to_string(s2));
  }
  settle(agent);
  return 0;
}

// ---- errors -------------------------------------------------------------------------------------

int errorsScenario(Agent& agent, Shared& shared) {
  startAgent(agent, shared);
  if (agent.rank() == 0) {
    RRef<Tensor> t = agent.remote(1, fill, int64_t{2}, 1.0);
    try {
      t.localValue();
      throw Error("localValue on a user succeeded");
    } catch (const weft::InvalidArgumentError&) {
      say("rank 0 localValue " + describe(std::current_exception()));
    }
    RRef<Exploding> e = agent.remote<Exploding>(1, int64_t{1});
    for (const char* use : {"first", "second"}) {
      try {
        e.rpcSync(&Exploding::get);
        throw Error("a call on an object whose constructor threw succeeded");
      } catch (const weft::RemoteError&) {
        say(std::string("rank 0 constructor ") + use + " " + describe(std::current_exception()));
      }
    }
    RRef<int64_t> f = agent.remote(1, explode, int64_t{1});
    try {
      f.toHere();
      throw Error("toHere of a value whose function threw succeeded");
    } catch (const weft::RemoteError&) {
      say("rank 0 function " + describe(std::current_exception()));
    }
  } else {
    RRef<Tensor> mine = weft::makeRRef(agent, weft::full({3}, 4.0));
    std::shared_ptr<Tensor> v = mine.localValue();
    say("rank 1 localValue owner sum " + std::to_string(v->sum().item<float>()));
  }
  settle(agent);
  return 0;
}

}  // namespace rrefworker

int main(int argc, char** argv) {
  using namespace rrefworker;
  return weft::testing::workerMain(
      "rref_worker", {"kill", "chain", "bulk", "tensor", "parcel", "errors"}, argc, argv, [](const std::string& scenario) {
        Shared shared;
        Agent agent(weft::rpc::Options::fromEnv());
        if (scenario == "kill") return killScenario(agent, shared);
        if (scenario == "chain") return chainScenario(agent, shared);
        if (scenario == "bulk") return bulkScenario(agent, shared);
        if (scenario == "tensor") return tensorScenario(agent, shared);
        if (scenario == "parcel") return parcelScenario(agent, shared);
        return errorsScenario(agent, shared);
      });
}
