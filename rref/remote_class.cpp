// The table of remote classes (rref/remote_class.h): WEFT_REMOTE_CLASS registers each declared
// class by name at static-initialisation time, and an owner looks the name up when a create
// arrives. Any thread; the table is under its own mutex.
#include <mutex>
#include <string>
#include <unordered_map>

#include "common/logging.h"
#include "rref/remote_class.h"

namespace weft::rref {

namespace {

struct ClassTable {
  std::mutex mutex;
  std::unordered_map<std::string, const ClassInfo*> byName;
};

ClassTable& classTable() {
  static ClassTable t;
  return t;
}

}  // namespace

const ClassInfo* findClass(std::string_view name) {
  auto& t = classTable();
  std::lock_guard<std::mutex> lock(t.mutex);
  auto it = t.byName.find(std::string(name));
  return it == t.byName.end() ? nullptr : it->second;
}

namespace detail {

bool registerClass(const ClassInfo& info) {
  auto& t = classTable();
  std::lock_guard<std::mutex> lock(t.mutex);
  auto [it, inserted] = t.byName.emplace(info.name, &info);
  WEFT_CHECK(inserted || it->second->type == info.type)
      << "WEFT_REMOTE_CLASS: two different classes are declared as '" << info.name << "'";
  return true;
}

}  // namespace detail
}  // namespace weft::rref
