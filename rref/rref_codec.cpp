// What the RRef<T> templates of rref/rref.h reach through rref::detail: creating a reference,
// checking a handle, the names and arguments of weft.rref.call and weft.rref.fetch, the owner's
// value, and the reference codec (a handle written into an outgoing value, read back from the
// handles the RRefExtension took over when the frame arrived). Called on whichever thread uses an
// RRef, encodes a value or decodes one.
#include "rref/rref_extension.h"

namespace weft::rref::detail {

std::shared_ptr<RRefCore> create(rpc::Agent& agent, const rpc::WorkerRef& to, const std::string& typeName,
                                 CreateKind kind, const std::string& name, uint64_t index, unsigned n,
                                 const std::function<void(rpc::EncodeContext&, capnp::List<rpc::wire::Value>::Builder)>& fill) {
  return agent.extension<RRefExtension>().create(to, typeName, kind, name, index, n, fill);
}

std::shared_ptr<RRefCore> makeOwned(rpc::Agent& agent, rpc::HeldValue value) {
  return agent.extension<RRefExtension>().makeOwned(std::move(value));
}

void check(const std::shared_ptr<RRefCore>& core) {
  WEFT_ENFORCE(core != nullptr, InvalidArgumentError, "RRef: the handle is empty");
  core->ctx->check(*core);
}

rpc::Agent& agentOf(const RRefCore& core) { return core.ctx->agentWhileOpen(core); }
const std::string& callFunction() { return kCall; }
const std::string& fetchFunction() { return kFetch; }
const std::string& toHereLabel() { return kToHere; }
uint64_t callFunctionId() {
  static const uint64_t id = rpc::nameId(kCall);
  return id;
}
uint64_t fetchFunctionId() {
  static const uint64_t id = rpc::nameId(kFetch);
  return id;
}

void writeTarget(rpc::EncodeContext& enc, rpc::wire::Value::Builder out, uint64_t id, const std::string& method) {
  rpc::encodeValue(std::make_tuple(id, method), out, enc);
}

Future<rpc::HeldValue> ownerValue(const RRefCore& core) { return core.record->value; }

void encodeRef(const std::shared_ptr<RRefCore>& core, rpc::wire::Value::Builder out, rpc::EncodeContext& enc) {
  WEFT_ENFORCE(core != nullptr, InvalidArgumentError, "RRef: an empty handle cannot be sent");
  core->ctx->encodeRef(core, out, enc);
}

std::shared_ptr<RRefCore> decodeRef(rpc::wire::Value::Reader in, rpc::DecodeContext& dec, const std::string& typeName) {
  auto d = in.getRref();
  const RRefInbox* inbox = dec.frame() ? dec.frame()->attachment<RRefInbox>() : nullptr;
  if (inbox == nullptr) throw ProtocolError("a reference in a frame not marked as carrying references");
  auto it = inbox->cores.find({d.getRrefId(), d.getForkId()});
  if (it == inbox->cores.end()) throw ProtocolError("a reference the frame did not announce");
  if (it->second->typeName != typeName) {
    throw ProtocolError("expected RRef<" + typeName + ">, got RRef<" + it->second->typeName + ">");
  }
  return it->second;
}
}  // namespace weft::rref::detail
