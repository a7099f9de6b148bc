#include "rpc/registry.h"

#include <algorithm>

namespace weft::rpc {

void Registry::implOnLoop(
    std::string name, std::function<Future<HeldValue>(const CallContext&, std::shared_ptr<IncomingFrame>)> body) {
  WEFT_ENFORCE(name.starts_with("weft."), InvalidArgumentError, "Registry::implOnLoop: '", name,
               "' is not a reserved name (they start with \"weft.\")");
  detail::Handler h;
  h.id = nameId(name);
  h.name = std::move(name);
  h.runOnLoop = std::move(body);
  add(std::move(h));
}

void Registry::add(detail::Handler handler) {
  WEFT_ENFORCE(!frozen_, StateError, "Registry::impl('", handler.name,
               "'): the agent has started; bind every function before Agent::start()");
  WEFT_ENFORCE(!handler.name.empty() && handler.name.size() <= 256, InvalidArgumentError,
               "Registry::impl: a function name must have 1 to 256 bytes, got ", handler.name.size());
  WEFT_ENFORCE(handler.runOnLoop || !handler.name.starts_with("weft."), InvalidArgumentError, "Registry::impl: '",
               handler.name, "': names starting with \"weft.\" are reserved for weft's own layers");
  auto it = handlers_.find(handler.id);
  if (it != handlers_.end()) {
    WEFT_ENFORCE(it->second->name != handler.name, InvalidArgumentError, "Registry::impl: function '", handler.name,
                 "' is already implemented");
    throw InvalidArgumentError("Registry::impl: functions '" + handler.name + "' and '" + it->second->name +
                               "' have the same 64-bit id; rename one");
  }
  uint64_t id = handler.id;
  handlers_.emplace(id, std::make_unique<detail::Handler>(std::move(handler)));
}

const detail::Handler* Registry::find(uint64_t id) const {
  auto it = handlers_.find(id);
  return it == handlers_.end() ? nullptr : it->second.get();
}

bool Registry::contains(std::string_view name) const {
  const detail::Handler* h = find(nameId(name));
  return h != nullptr && h->name == name;
}

std::vector<std::string> Registry::names() const {
  std::vector<std::string> out;
  for (const auto& [id, h] : handlers_) out.push_back(h->name);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace weft::rpc
