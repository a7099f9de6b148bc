// The Agent's calls carry values of every codec type both ways (scalars at their extremes,
// strings, containers, records, tensors from 0 B to 64 MiB, views and shared storage), by
// rank and by name, and an argument that does not decode as the callee declared it is a
// ProtocolError. Every agent of a job lives in this process (tests/rpc/agent_group.h) and
// they talk over real TCP on 127.0.0.1.
#include "rpc/agent_functions.h"

// ---- values ------------------------------------------------------------------------------------

TEST_CASE("every scalar type round-trips through a real call, extremes included") {
  AgentGroup g(2);
  bindEchoes(g.agent(1).registry());
  g.start();
  Agent& a = g.agent(0);

  CHECK(a.call(1, echoBool, true) == true);
  CHECK(a.call(1, echoBool, false) == false);
  for (int8_t v : {std::numeric_limits<int8_t>::min(), int8_t{-1}, int8_t{0}, std::numeric_limits<int8_t>::max()}) {
    CHECK(a.call(1, echoI8, v) == v);
  }
  for (int16_t v : {std::numeric_limits<int16_t>::min(), int16_t{-300}, std::numeric_limits<int16_t>::max()}) {
    CHECK(a.call(1, echoI16, v) == v);
  }
  for (int32_t v : {std::numeric_limits<int32_t>::min(), -123456, std::numeric_limits<int32_t>::max()}) {
    CHECK(a.call(1, echoI32, v) == v);
  }
  for (int64_t v : {std::numeric_limits<int64_t>::min(), int64_t{-1}, int64_t{1} << 40,
                    std::numeric_limits<int64_t>::max()}) {
    CHECK(a.call(1, echoI64, v) == v);
  }
  for (uint8_t v : {uint8_t{0}, uint8_t{128}, std::numeric_limits<uint8_t>::max()}) CHECK(a.call(1, echoU8, v) == v);
  for (uint16_t v : {uint16_t{0}, std::numeric_limits<uint16_t>::max()}) CHECK(a.call(1, echoU16, v) == v);
  for (uint32_t v : {0u, 1u << 31, std::numeric_limits<uint32_t>::max()}) CHECK(a.call(1, echoU32, v) == v);
  for (uint64_t v : {uint64_t{0}, uint64_t{1} << 63, std::numeric_limits<uint64_t>::max()}) {
    CHECK(a.call(1, echoU64, v) == v);
  }

  CHECK(a.call(1, echoF32, 1.5f) == 1.5f);
  CHECK(a.call(1, echoF32, std::numeric_limits<float>::lowest()) == std::numeric_limits<float>::lowest());
  CHECK(a.call(1, echoF32, std::numeric_limits<float>::denorm_min()) == std::numeric_limits<float>::denorm_min());
  CHECK(std::isnan(a.call(1, echoF32, std::numeric_limits<float>::quiet_NaN())));
  CHECK(a.call(1, echoF32, std::numeric_limits<float>::infinity()) == std::numeric_limits<float>::infinity());
  CHECK(a.call(1, echoF64, 0.1) == 0.1);
  CHECK(a.call(1, echoF64, std::numeric_limits<double>::max()) == std::numeric_limits<double>::max());
  CHECK(a.call(1, echoF64, std::numeric_limits<double>::denorm_min()) == std::numeric_limits<double>::denorm_min());
  CHECK(std::isnan(a.call(1, echoF64, std::numeric_limits<double>::quiet_NaN())));
  CHECK(a.call(1, echoF64, -std::numeric_limits<double>::infinity()) == -std::numeric_limits<double>::infinity());
  double negZero = a.call(1, echoF64, -0.0);
  CHECK(negZero == 0.0);
  CHECK(std::signbit(negZero));
}

TEST_CASE("strings and bytes round-trip through a real call: empty, with NUL bytes, and 1 MiB") {
  AgentGroup g(2);
  bindEchoes(g.agent(1).registry());
  g.start();
  Agent& a = g.agent(0);

  CHECK(a.call(1, echoString, std::string()).empty());
  std::string withNul("a\0b\0\0c", 6);
  std::string gotNul = a.call(1, echoString, withNul);
  CHECK(gotNul.size() == 6);
  CHECK(gotNul == withNul);
  CHECK(a.call(1, echoString, std::string("héllo, wörld")) == "héllo, wörld");

  std::mt19937 rng(7);
  std::string mib(size_t{1} << 20, '\0');
  for (char& c : mib) c = static_cast<char>(rng() & 0xff);  // every byte value, NULs included
  std::string gotMib = a.call(1, echoString, mib);
  CHECK(gotMib.size() == mib.size());
  CHECK(gotMib == mib);

  std::vector<uint8_t> bytes(100000);
  for (auto& b : bytes) b = static_cast<uint8_t>(rng());
  bytes[0] = 0;
  CHECK(a.call(1, echoBytes, bytes) == bytes);
  CHECK(a.call(1, echoBytes, std::vector<uint8_t>{}).empty());
  std::vector<std::byte> raw = {std::byte{0}, std::byte{255}, std::byte{0}, std::byte{17}};
  CHECK(a.call(1, echoRawBytes, raw) == raw);
}

TEST_CASE("vectors, nested vectors, maps, optionals, tuples and pairs round-trip through a real call") {
  AgentGroup g(2);
  bindEchoes(g.agent(1).registry());
  g.start();
  Agent& a = g.agent(0);

  std::vector<int64_t> ints = {std::numeric_limits<int64_t>::min(), -1, 0, 1, std::numeric_limits<int64_t>::max()};
  CHECK(a.call(1, echoVecI64, ints) == ints);
  CHECK(a.call(1, echoVecI64, std::vector<int64_t>{}).empty());
  std::vector<int8_t> small = {-128, 0, 127};
  CHECK(a.call(1, echoVecI8, small) == small);
  std::vector<uint64_t> unsignedInts = {0, std::numeric_limits<uint64_t>::max()};
  CHECK(a.call(1, echoVecU64, unsignedInts) == unsignedInts);
  std::vector<float> floats = {0.5f, -2.25f, std::numeric_limits<float>::infinity()};
  CHECK(a.call(1, echoVecF32, floats) == floats);
  std::vector<double> doubles(10000);
  for (size_t i = 0; i < doubles.size(); ++i) doubles[i] = std::sqrt(static_cast<double>(i)) - 50.0;
  CHECK(a.call(1, echoVecF64, doubles) == doubles);
  std::vector<bool> bools = {true, false, false, true, true};
  CHECK(a.call(1, echoVecBool, bools) == bools);
  std::vector<std::string> strings = {"", "one", std::string("t\0o", 3), std::string(1000, 'x')};
  CHECK(a.call(1, echoVecString, strings) == strings);

  std::vector<std::vector<int32_t>> nested = {{}, {1}, {2, 3, -4}, {}};
  CHECK(a.call(1, echoNested, nested) == nested);
  std::vector<std::vector<std::string>> nestedStrings = {{"a", "b"}, {}, {"c"}};
  CHECK(a.call(1, echoNestedStrings, nestedStrings) == nestedStrings);

  std::map<std::string, std::vector<int64_t>> map = {{"", {}}, {"alpha", {1, 2}}, {"beta", {-3}}};
  CHECK(a.call(1, echoMap, map) == map);
  CHECK(a.call(1, echoMap, std::map<std::string, std::vector<int64_t>>{}).empty());
  std::unordered_map<int64_t, std::string> umap = {{-5, "minus five"}, {0, ""}, {1LL << 50, "big"}};
  CHECK(a.call(1, echoUMap, umap) == umap);

  CHECK(a.call(1, echoOptional, std::optional<std::string>("set")) == std::optional<std::string>("set"));
  CHECK(a.call(1, echoOptional, std::optional<std::string>("")) == std::optional<std::string>(""));
  CHECK_FALSE(a.call(1, echoOptional, std::nullopt).has_value());
  Tensor t = arange(0, 6, 1, {.dtype = DType::Float32}).view({2, 3});
  std::optional<Tensor> gotT = a.call(1, echoOptionalTensor, std::optional<Tensor>(t));
  REQUIRE(gotT.has_value());
  CHECK(sameTensor(*gotT, t));
  CHECK_FALSE(a.call(1, echoOptionalTensor, std::nullopt).has_value());

  auto tuple = std::make_tuple(int32_t{-7}, std::string("seven"), 7.5, true);
  CHECK(a.call(1, echoTuple, tuple) == tuple);
  auto pair = std::make_pair(std::string("key"), int64_t{1} << 62);
  CHECK(a.call(1, echoPair, pair) == pair);

  std::vector<Tensor> tensors = {randn({3}), Tensor(), arange(0, 4, 1, {.dtype = DType::Int64})};
  std::vector<Tensor> gotTensors = a.call(1, echoVecTensor, tensors);
  REQUIRE(gotTensors.size() == 3);
  CHECK(sameTensor(gotTensors[0], tensors[0]));
  CHECK_FALSE(gotTensors[1].defined());
  CHECK(sameTensor(gotTensors[2], tensors[2]));

  std::string described = a.call(1, describe, 3, std::string("three"), std::vector<double>{1.5, 1.5}, true);
  CHECK(described == "3|three|" + std::to_string(3.0) + "|yes");
}

TEST_CASE("a struct declared with WEFT_CODEC_FIELDS, holding another, round-trips through a real call") {
  AgentGroup g(2);
  bindEchoes(g.agent(1).registry());
  g.start();

  sprites::Sprite s;
  s.id = "hero";
  s.color = {255, 0, 12, "red"};
  s.palette = {{1, 2, 3, "a"}, {4, 5, 6, ""}};
  s.layer = -3;
  s.props = {{"speed", 1.25}, {"mass", -0.5}};
  s.pixels = randn({4, 4});
  sprites::Sprite got = g.agent(0).call(1, echoSprite, s);
  CHECK(got.id == s.id);
  CHECK(got.color == s.color);
  CHECK(got.palette == s.palette);
  CHECK(got.layer == s.layer);
  CHECK(got.props == s.props);
  CHECK(sameTensor(got.pixels, s.pixels));

  sprites::Sprite bare;  // empty containers, no layer, undefined tensor
  sprites::Sprite gotBare = g.agent(0).call(1, echoSprite, bare);
  CHECK(gotBare.id.empty());
  CHECK(gotBare.palette.empty());
  CHECK_FALSE(gotBare.layer.has_value());
  CHECK_FALSE(gotBare.pixels.defined());
}

TEST_CASE("tensors of 0 B and 1 KiB round-trip through a real call in float32, float64 and int64") {
  AgentGroup g(2);
  bindEchoes(g.agent(1).registry());
  g.start();
  Agent& a = g.agent(0);

  for (DType dt : {DType::Float32, DType::Float64, DType::Int64}) {
    CAPTURE(dt);
    for (Shape shape : {Shape{0}, Shape{3, 0}}) {
      Tensor empty = zeros(shape, {.dtype = dt});
      Tensor got = a.call(1, echoTensor, empty);
      CHECK(got.dtype() == dt);
      CHECK(got.shape() == shape);
      CHECK(got.nbytes() == 0);
    }
    int64_t kibElements = 1024 / static_cast<int64_t>(elementSize(dt));
    Tensor kib = dt == DType::Int64 ? randint(-1000000, 1000000, {kibElements}) : randn({kibElements}, {.dtype = dt});
    CHECK(kib.nbytes() == 1024);
    Tensor got = a.call(1, echoTensor, kib);
    CHECK(sameTensor(got, kib));
    CHECK(got.isContiguous());
    CHECK(a.call(1, tensorSum, kib) == doctest::Approx(kib.to(DType::Float64).sum().item<double>()));
  }
  Tensor scalar = scalarTensor(-2.5, DType::Float64);
  Tensor gotScalar = a.call(1, echoTensor, scalar);
  CHECK(gotScalar.dim() == 0);
  CHECK(gotScalar.item<double>() == -2.5);
  CHECK_FALSE(a.call(1, echoTensor, Tensor()).defined());
}

TEST_CASE("tensors of 64 MiB round-trip through a real call with their content intact") {
  AgentGroup g(2);
  bindEchoes(g.agent(1).registry());
  g.start();
  Agent& a = g.agent(0);

  constexpr int64_t kBytes = int64_t{64} << 20;
  for (DType dt : {DType::Float32, DType::Float64, DType::Int64}) {
    CAPTURE(dt);
    int64_t n = kBytes / static_cast<int64_t>(elementSize(dt));
    Tensor big = dt == DType::Float32 ? randn({n}) : arange(0, 3.0 * static_cast<double>(n), 3, {.dtype = dt});
    big = big.view({n / 1024, 1024});
    REQUIRE(static_cast<int64_t>(big.nbytes()) == kBytes);
    Tensor got = a.call(1, echoTensor, big);
    CHECK(got.shape() == big.shape());
    CHECK(got.rawData() != big.rawData());
    CHECK(sameTensor(got, big));
    if (dt == DType::Float32) {
      // The callee sees the same content (not only the echo as a whole).
      CHECK(a.call(1, tensorSum, big) ==
            doctest::Approx(big.to(DType::Float64).sum().item<double>()).epsilon(1e-9));
    }
  }
}

TEST_CASE("non-contiguous views travel as their own values, and a tensor passed twice arrives as one storage") {
  AgentGroup g(2);
  bindEchoes(g.agent(1).registry());
  g.start();
  Agent& a = g.agent(0);

  Tensor base = randn({6, 8});
  Tensor transposed = base.t();
  REQUIRE_FALSE(transposed.isContiguous());
  Tensor got = a.call(1, echoTensor, transposed);
  CHECK(got.shape() == Shape{8, 6});
  CHECK(got.isContiguous());
  CHECK(sameTensor(got, transposed));

  Tensor narrowed = base.narrow(1, 2, 3);  // rows of 3 out of 8
  REQUIRE_FALSE(narrowed.isContiguous());
  CHECK(sameTensor(a.call(1, echoTensor, narrowed), narrowed));
  Tensor offsetRows = base.narrow(0, 4, 2);  // contiguous, at an offset into the storage
  CHECK(sameTensor(a.call(1, echoTensor, offsetRows), offsetRows));

  Tensor row = arange(0, 5, 1, {.dtype = DType::Float64});
  Tensor expanded = row.unsqueeze(0).expand({300, 5});  // stride 0
  REQUIRE(expanded.stride(0) == 0);
  Tensor gotExpanded = a.call(1, echoTensor, expanded);
  CHECK(gotExpanded.shape() == Shape{300, 5});
  CHECK(sameTensor(gotExpanded, expanded));
  CHECK(gotExpanded.storage()->nbytes() >= 300 * 5 * 8);

  Tensor permuted = arange(0, 24, 1, {.dtype = DType::Int64}).view({2, 3, 4}).permute({2, 0, 1});
  CHECK(sameTensor(a.call(1, echoTensor, permuted), permuted));

  // The same tensor twice: one storage on the callee, and one again in the reply.
  Tensor t = randn({32});
  auto [shared, x, y] = a.call(1, pairOfTensors, t, t);
  CHECK(shared);
  CHECK(sameTensor(x, t));
  CHECK(sameTensor(y, t));
  CHECK(x.storage() == y.storage());
  Tensor other = randn({32});
  auto [sharedOther, p, q] = a.call(1, pairOfTensors, t, other);
  CHECK_FALSE(sharedOther);
  CHECK(sameTensor(p, t));
  CHECK(sameTensor(q, other));
}

TEST_CASE("void functions and functions without arguments work, by rank and by name") {
  AgentGroup g(2);
  std::atomic<int> noted{0};
  std::atomic<int> pinged{0};
  g.agent(1).registry().impl(note, [&](int32_t v) { noted += v; });
  g.agent(1).registry().impl(ping, [&] { ++pinged; });
  g.agent(1).registry().impl(answer, [] { return int32_t{42}; });
  g.agent(1).registry().impl(whoami, [](const CallContext& ctx) { return ctx.callerName + "@" + *ctx.function; });
  g.start();
  Agent& a = g.agent(0);

  a.call(1, note, 5);
  a.call("worker1", note, 7);
  CHECK(noted == 12);
  a.call(1, ping);
  Future<void> f = a.callAsync("worker1", ping);
  REQUIRE(f.waitFor(5s));
  CHECK_FALSE(f.hasError());
  CHECK(pinged == 2);
  CHECK(a.call(1, answer) == 42);
  CHECK(a.call("worker1", answer) == 42);
  CHECK(a.call(1, whoami) == "worker0@whoami");
}

TEST_CASE("workers are listed by rank and found by name or rank, and an agent can call itself") {
  AgentGroup g(3, [](int rank, Options& o) { o.name = rank == 1 ? "middle" : ""; });
  for (int r = 0; r < 3; ++r) bindEcho(g.agent(r).registry(), echoI64);
  g.start();
  Agent& a = g.agent(2);
  std::vector<WorkerInfo> ws = a.workers();
  REQUIRE(ws.size() == 3);
  CHECK(ws[0].name == "worker0");
  CHECK(ws[1].name == "middle");
  CHECK(ws[2].name == "worker2");
  for (int r = 0; r < 3; ++r) CHECK(ws[static_cast<size_t>(r)].rank == r);
  CHECK(a.worker("middle").rank == 1);
  CHECK(a.worker(0).name == "worker0");
  CHECK(a.name() == "worker2");
  CHECK(a.rank() == 2);
  CHECK(a.worldSize() == 3);
  CHECK(a.listenPort() != 0);
  CHECK(a.call("middle", echoI64, 11) == 11);
  CHECK(a.call(ws[0], echoI64, 12) == 12);
  CHECK(a.isAlive(2));
  CHECK(a.call(2, echoI64, 13) == 13);          // itself, by rank
  CHECK(a.call("worker2", echoI64, 14) == 14);  // and by name
}

// ---- declaration mismatches --------------------------------------------------------------------

TEST_CASE("an argument that does not decode as the callee declared it is a ProtocolError naming the function and "
          "the argument index") {
  // Two declarations of one name with different signatures, as two programs out of step would have.
  const Function<int32_t(int32_t, std::string)> callerView{"mismatch.args"};
  const Function<int32_t(int32_t, int32_t)> calleeView{"mismatch.args"};
  const Function<int32_t(int32_t)> resultCallerView{"mismatch.result"};
  const Function<std::string(int32_t)> resultCalleeView{"mismatch.result"};
  const Function<int32_t(int32_t)> arityCallerView{"mismatch.arity"};
  const Function<int32_t(int32_t, int32_t)> arityCalleeView{"mismatch.arity"};

  AgentGroup g(2);
  g.agent(1).registry().impl(calleeView, [](int32_t a, int32_t b) { return a + b; });
  g.agent(1).registry().impl(resultCalleeView, [](int32_t a) { return std::to_string(a); });
  g.agent(1).registry().impl(arityCalleeView, [](int32_t a, int32_t b) { return a * b; });
  g.start();
  Agent& a = g.agent(0);

  std::string args = messageOf<ProtocolError>([&] { a.call(1, callerView, 1, std::string("two")); });
  CHECK(contains(args, "mismatch.args"));
  CHECK(contains(args, "argument 1"));
  CHECK(contains(args, "string"));

  std::string result = messageOf<ProtocolError>([&] { a.call(1, resultCallerView, 5); });
  CHECK(contains(result, "mismatch.result"));
  CHECK(contains(result, "result"));
  CHECK(contains(result, "string"));

  std::string arity = messageOf<ProtocolError>([&] { a.call(1, arityCallerView, 5); });
  CHECK(contains(arity, "mismatch.arity"));
  CHECK(contains(arity, "argument"));

  // A mismatch costs only that call: the connection keeps working.
  const Function<int32_t(int32_t, int32_t)> rightView{"mismatch.args"};
  CHECK(a.call(1, rightView, 2, 3) == 5);
  CHECK(a.isAlive(1));
  CHECK(eventually([&] { return quiet(g); }, 2s));
}
