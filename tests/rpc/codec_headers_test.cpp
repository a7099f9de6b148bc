// The codec headers: one of them included alone brings the whole family, and the examples in
// rpc/codec_containers.h and rpc/codec_record.h hold as their comments write them.
#include "rpc/codec_record.h"  // alone: the core and the containers come with it
#include "weft_test.h"

using namespace weft;
using namespace weft::rpc;

namespace app {

struct Batch {
  Tensor x;
  std::vector<int64_t> labels;
  std::optional<std::string> tag;
};
WEFT_CODEC_FIELDS(Batch, x, labels, tag);

}  // namespace app

namespace other {

// A sender's struct of the same name whose `labels` hold another type.
struct Batch {
  Tensor x;
  std::vector<double> labels;
  std::optional<std::string> tag;
};
WEFT_CODEC_FIELDS(Batch, x, labels, tag);

}  // namespace other

namespace {

// One argument through a whole frame; returns the flattened bytes' decoded frame.
template <class T>
IncomingFrame sendOne(const T& value) {
  FrameWriter writer;
  auto call = writer.message().initCall();
  call.setCallId(1);
  EncodeContext enc(writer);
  encodeArguments(enc, call.initArgs(1), value);
  std::vector<std::byte> bytes;
  std::move(writer).finish().appendTo(bytes);
  FrameDecoder decoder;
  REQUIRE(decoder.feed(bytes.data(), bytes.size()).ok());
  std::optional<IncomingFrame> frame = decoder.next();
  REQUIRE(frame.has_value());
  return std::move(*frame);
}

// The ProtocolError message of decoding the one argument of `frame` as T.
template <class T>
std::string decodeError(const IncomingFrame& frame, const char* function) {
  DecodeContext dec(frame);
  try {
    decodeArguments<T>(function, frame.message().getCall().getArgs(), dec);
  } catch (const ProtocolError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("the container example: a map of vectors of optionals round-trips, a mismatch names its path") {
  using Index = std::map<std::string, std::vector<std::optional<int64_t>>>;
  IncomingFrame frame = sendOne(Index{{"a", {1, std::nullopt}}});
  DecodeContext dec(frame);
  auto [index] = decodeArguments<Index>("lookup", frame.message().getCall().getArgs(), dec);
  CHECK(index == Index{{"a", {1, std::nullopt}}});

  IncomingFrame strings = sendOne(std::map<std::string, std::vector<std::string>>{{"a", {"one"}}});
  CHECK(decodeError<Index>(strings, "lookup") ==
        "lookup: argument 0: entry 0: value: element 0: expected int64, got string");
}

TEST_CASE("the record example: a WEFT_CODEC_FIELDS struct round-trips, a mismatch names the field") {
  Tensor x = randn({2, 3});
  IncomingFrame frame = sendOne(app::Batch{x, {3, 1}, "train"});
  DecodeContext dec(frame);
  auto [batch] = decodeArguments<app::Batch>("fit", frame.message().getCall().getArgs(), dec);
  testing::expectClose(batch.x, x, 0, 0);
  CHECK(batch.labels == std::vector<int64_t>{3, 1});
  CHECK(batch.tag == "train");

  IncomingFrame doubles = sendOne(other::Batch{x, {3.0, 1.0}, std::nullopt});
  CHECK(decodeError<app::Batch>(doubles, "fit") ==
        "fit: argument 0: field 'labels': expected vector<int64>, got list of float64");
}
