#include "collectives/gloo/detail/store.h"

#include <utility>

namespace weft::collectives {

GlooStore::GlooStore(rpc::StoreClient& store, std::string prefix, std::chrono::milliseconds timeout)
    : store_(store), prefix_(std::move(prefix)), timeout_(timeout) {}

void GlooStore::set(const std::string& key, const std::vector<char>& data) {
  store_.set(prefix_ + key, std::string(data.begin(), data.end()));
}

std::vector<char> GlooStore::get(const std::string& key) {
  std::string value = store_.get(prefix_ + key, timeout_);
  return std::vector<char>(value.begin(), value.end());
}

void GlooStore::wait(const std::vector<std::string>& keys) { store_.wait(prefixed(keys), timeout_); }

void GlooStore::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  // Gloo passes its own default (30 s) or the context's timeout; negative means "unset".
  store_.wait(prefixed(keys), timeout.count() < 0 ? timeout_ : timeout);
}

std::vector<std::string> GlooStore::prefixed(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const std::string& k : keys) out.push_back(prefix_ + k);
  return out;
}

}  // namespace weft::collectives
