// The shared-memory rings between pipeline stages (pipeline/shm_ring.h), in one process: a ring
// and its consumer's view of it through /proc, messages, generations, the consumer's sleep and
// wake-up, refusals of what is not the ring, a producer that ended and a deadline.
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstring>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "pipeline/shm_ring.h"

namespace {

using namespace std::chrono_literals;
using weft::pipeline::detail::PeerProcess;
using weft::pipeline::detail::RingDescriptor;
using weft::pipeline::detail::ShmRing;
using Header = std::array<int64_t, ShmRing::kHeaderWords>;

ShmRing::Clock::time_point in(std::chrono::milliseconds d) { return ShmRing::Clock::now() + d; }

}  // namespace

TEST_CASE("a ring's consumer maps it through /proc and reads each message's header and data") {
  auto ring = ShmRing::create(4, 1 << 20);
  std::string why;
  auto view = ShmRing::attach(ring->descriptor(), 4, &why);
  REQUIRE_MESSAGE(view != nullptr, why);
  ring->releaseFd();  // the mapping outlives the descriptor
  PeerProcess self(::getpid(), 0);
  CHECK(!self.ended());
  CHECK(ring->fits(1 << 18));
  CHECK(!ring->fits((1 << 18) + 1));
  for (uint64_t gen = 1; gen <= 3; ++gen) {
    for (int slot = 3; slot >= 0; --slot) {
      std::vector<float> data(1000);
      std::iota(data.begin(), data.end(), static_cast<float>(gen * 100 + slot));
      Header h{};
      h[0] = static_cast<int64_t>(gen);
      h[14] = slot;
      ring->publish(gen, slot, h.data(), data.data(), data.size() * sizeof(float));
    }
    for (int slot = 0; slot < 4; ++slot) {
      const int64_t* got = view->await(gen, slot, self, in(1000ms), "reading");
      CHECK(got[0] == static_cast<int64_t>(gen));
      CHECK(got[14] == slot);
      std::vector<float> out(1000);
      view->copyOut(slot, out.size() * sizeof(float), out.data());
      CHECK(out[0] == static_cast<float>(gen * 100 + slot));
      CHECK(out[999] == static_cast<float>(gen * 100 + slot + 999));
    }
  }
  // A header alone (no data) is a message too.
  Header h{};
  h[1] = 42;
  ring->publish(4, 2, h.data(), nullptr, 4000);
  CHECK(view->await(4, 2, self, in(1000ms), "reading")[1] == 42);
}

TEST_CASE("a consumer waits for the message of its own generation, sleeping until the producer writes it") {
  auto ring = ShmRing::create(2, 1 << 16);
  std::string why;
  auto view = ShmRing::attach(ring->descriptor(), 2, &why);
  REQUIRE(view != nullptr);
  PeerProcess self(::getpid(), 3);
  Header h{};
  h[0] = 7;
  ring->publish(1, 0, h.data(), nullptr, 0);
  // Generation 1's message is no answer to a wait for generation 2.
  const auto t0 = ShmRing::Clock::now();
  CHECK_THROWS_AS(view->await(2, 0, self, in(60ms), "waiting for step 2"), weft::TimeoutError);
  CHECK(ShmRing::Clock::now() - t0 >= 60ms);
  try {
    view->await(2, 1, self, in(20ms), "pipeline stage 0: receiving x");
  } catch (const weft::TimeoutError& e) {
    CHECK(std::string(e.what()).find("pipeline stage 0: receiving x: nothing arrived from rank 3") !=
          std::string::npos);
  }
  // Written by another thread 50 ms into the wait (the consumer is asleep by then).
  std::thread producer([&] {
    std::this_thread::sleep_for(50ms);
    Header g{};
    g[0] = 8;
    float value = 2.5f;
    ring->publish(2, 1, g.data(), &value, sizeof value);
  });
  const int64_t* got = view->await(2, 1, self, in(5000ms), "waiting");
  producer.join();
  CHECK(got[0] == 8);
  float value = 0;
  view->copyOut(1, sizeof value, &value);
  CHECK(value == 2.5f);
}

TEST_CASE("attach refuses what is not the producer's ring, saying why") {
  auto ring = ShmRing::create(3, 1 << 16);
  const RingDescriptor d = ring->descriptor();
  std::string why;
  CHECK(ShmRing::attach(RingDescriptor{}, 3, &why) == nullptr);
  CHECK(why.find("offers no shared memory") != std::string::npos);
  CHECK(ShmRing::attach(d, 4, &why) == nullptr);
  CHECK(why.find("3 slots, not 4") != std::string::npos);
  RingDescriptor other = d;
  other.tokenLo ^= 1;
  CHECK(ShmRing::attach(other, 3, &why) == nullptr);
  CHECK(why.find("holds another ring") != std::string::npos);
  other = d;
  other.capacity += 4096;
  CHECK(ShmRing::attach(other, 3, &why) == nullptr);
  CHECK(why.find("is not the peer's ring") != std::string::npos);
  other = d;
  other.fd = 100000;
  CHECK(ShmRing::attach(other, 3, &why) == nullptr);
  CHECK(why.find("/proc/") != std::string::npos);
  // The words a stage sends, and words that are no descriptor.
  std::array<int64_t, RingDescriptor::kWords> words{};
  d.toWords(words.data());
  const RingDescriptor back = RingDescriptor::fromWords(words.data());
  CHECK(back.pid == d.pid);
  CHECK(back.fd == d.fd);
  CHECK(back.tokenLo == d.tokenLo);
  CHECK(back.tokenHi == d.tokenHi);
  CHECK(back.slots == 3);
  CHECK(back.capacity == d.capacity);
  words[0] = 12345;
  CHECK(RingDescriptor::fromWords(words.data()).pid == 0);
  // Once the producer released its descriptor, nobody can map the ring any more.
  ring->releaseFd();
  CHECK(ShmRing::attach(d, 3, &why) == nullptr);
}

TEST_CASE("a consumer whose producer's process ended gets DisconnectedError naming its rank and pid") {
  auto ring = ShmRing::create(1, 1 << 16);
  std::string why;
  auto view = ShmRing::attach(ring->descriptor(), 1, &why);
  REQUIRE(view != nullptr);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ::usleep(100000);
    ::_exit(0);
  }
  PeerProcess peer(child, 5);
  const auto t0 = ShmRing::Clock::now();
  std::string message;
  try {
    view->await(1, 0, peer, in(10000ms), "pipeline stage 4: receiving y");
  } catch (const weft::DisconnectedError& e) {
    message = e.what();
  }
  const auto waited = ShmRing::Clock::now() - t0;
  int status = 0;
  ::waitpid(child, &status, 0);
  CHECK(message.find("pipeline stage 4: receiving y: the connection to rank 5 was lost: its process (pid " +
                     std::to_string(child) + ") ended") != std::string::npos);
  CHECK(waited >= 90ms);
  CHECK(waited < 5000ms);
  CHECK(peer.ended());
}
