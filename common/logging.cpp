#include "common/logging.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace weft::logging {
namespace {

Level levelFromEnv() {
  const char* v = std::getenv("WEFT_LOG_LEVEL");
  if (!v) return Level::Warn;
  if (!std::strcmp(v, "debug")) return Level::Debug;
  if (!std::strcmp(v, "info")) return Level::Info;
  if (!std::strcmp(v, "warn")) return Level::Warn;
  if (!std::strcmp(v, "error")) return Level::Error;
  if (!std::strcmp(v, "off")) return Level::Off;
  return Level::Warn;
}

std::atomic<int>& currentLevel() {
  static std::atomic<int> l{static_cast<int>(levelFromEnv())};
  return l;
}

std::mutex& nameMutex() {
  static std::mutex m;
  return m;
}
std::string& workerName() {
  static std::string n;
  return n;
}

}  // namespace

Level level() { return static_cast<Level>(currentLevel().load(std::memory_order_relaxed)); }
void setLevel(Level l) { currentLevel().store(static_cast<int>(l)); }
bool enabled(Level l) { return l != Level::Off && static_cast<int>(l) >= static_cast<int>(level()); }

void setWorkerName(std::string name) {
  std::lock_guard<std::mutex> g(nameMutex());
  workerName() = std::move(name);
}

Line::~Line() {
  static const char kTag[] = {'D', 'I', 'W', 'E'};
  std::string line = "[";
  line += kTag[static_cast<int>(level_)];
  {
    std::lock_guard<std::mutex> g(nameMutex());
    if (!workerName().empty()) line += " " + workerName();
  }
  line += "] ";
  line += os_.str();
  line += '\n';
  // A single write keeps lines from different threads whole.
  ssize_t unused = ::write(STDERR_FILENO, line.data(), line.size());
  (void)unused;
}

}  // namespace weft::logging
