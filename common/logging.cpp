#include "common/logging.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
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

namespace {

void writeLine(Level level, const std::string& text) {
  static const char kTag[] = {'D', 'I', 'W', 'E'};
  std::string line = "[";
  line += kTag[static_cast<int>(level)];
  {
    std::lock_guard<std::mutex> g(nameMutex());
    if (!workerName().empty()) line += " " + workerName();
  }
  line += "] ";
  line += text;
  line += '\n';
  // A single write keeps lines from different threads whole.
  ssize_t unused = ::write(STDERR_FILENO, line.data(), line.size());
  (void)unused;
}

// 2997 -> "2,997".
std::string withThousands(uint64_t n) {
  std::string digits = std::to_string(n);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

// 10.0 -> "10", 3.25 -> "3.2", 0.04 -> "0.04".
std::string shortSeconds(double s) {
  char buf[32];
  if (s >= 0.095) {
    std::snprintf(buf, sizeof(buf), "%.1f", s);
    std::string t = buf;
    if (t.size() > 2 && t.ends_with(".0")) t.resize(t.size() - 2);
    return t;
  }
  std::snprintf(buf, sizeof(buf), "%.2g", s);
  return buf;
}

constexpr const char* kOtherKey = "other addresses";

}  // namespace

Line::~Line() { writeLine(level_, os_.str()); }

void write(Level level, const std::string& text) {
  if (enabled(level)) writeLine(level, text);
}

// ---- RateLimiter -------------------------------------------------------------------

namespace {

std::mutex& defaultsMutex() {
  static std::mutex m;
  return m;
}
RateLimitConfig& defaults() {
  static RateLimitConfig c;
  return c;
}

}  // namespace

RateLimitConfig rateLimitDefaults() {
  std::lock_guard<std::mutex> g(defaultsMutex());
  return defaults();
}

void setRateLimitDefaults(const RateLimitConfig& config) {
  std::lock_guard<std::mutex> g(defaultsMutex());
  defaults() = config;
}

RateLimiter::RateLimiter(std::string prefix, Config config, std::function<Clock::time_point()> now, Sink sink)
    : prefix_(std::move(prefix)), config_(config), now_(std::move(now)), sink_(std::move(sink)) {
  if (config_.burst < 0) config_.burst = 0;
  if (config_.maxKeys < 1) config_.maxKeys = 1;
}

RateLimiter::~RateLimiter() {
  std::vector<std::pair<Level, std::string>> out;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    Clock::time_point at = now();
    for (auto& [key, w] : windows_) {
      if (w.held > 0) out.emplace_back(w.level, summary(key, w, at - w.start));
    }
    windows_.clear();
  }
  emit(out);
}

RateLimiter::Clock::time_point RateLimiter::now() const { return now_ ? now_() : Clock::now(); }

bool RateLimiter::admit(Level level, std::string_view key) {
  std::vector<std::pair<Level, std::string>> out;
  bool show = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    Clock::time_point at = now();
    collectLocked(at, out);
    auto it = windows_.find(key);
    if (it == windows_.end()) {
      std::string k(key);
      if (windows_.size() >= config_.maxKeys) k = kOtherKey;
      it = windows_.find(k);
      if (it == windows_.end()) it = windows_.emplace(std::move(k), Window{at, 0, 0, Level::Debug}).first;
    }
    Window& w = it->second;
    if (w.shown < config_.burst) {
      ++w.shown;
      show = true;
    } else {
      ++w.held;
      if (static_cast<int>(level) > static_cast<int>(w.level)) w.level = level;
    }
  }
  emit(out);
  return show;
}

void RateLimiter::flush() {
  std::vector<std::pair<Level, std::string>> out;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    collectLocked(now(), out);
  }
  emit(out);
}

RateLimiter::Clock::time_point RateLimiter::nextDue() const {
  std::lock_guard<std::mutex> lock(mutex_);
  Clock::time_point due = Clock::time_point::max();
  for (auto& [key, w] : windows_) {
    if (w.held > 0) due = std::min(due, w.start + config_.window);
  }
  return due;
}

void RateLimiter::collectLocked(Clock::time_point at, std::vector<std::pair<Level, std::string>>& out) {
  for (auto it = windows_.begin(); it != windows_.end();) {
    const Window& w = it->second;
    if (at - w.start < config_.window) {
      ++it;
      continue;
    }
    if (w.held > 0) out.emplace_back(w.level, summary(it->first, w, config_.window));
    it = windows_.erase(it);
  }
}

std::string RateLimiter::summary(const std::string& key, const Window& w, Clock::duration span) const {
  return prefix_ + ": ... and " + withThousands(w.held) + " more from " + key + " in the last " +
         shortSeconds(std::chrono::duration<double>(span).count()) + " s";
}

void RateLimiter::emit(const std::vector<std::pair<Level, std::string>>& lines) {
  for (auto& [level, text] : lines) {
    if (sink_) {
      sink_(level, text);
    } else {
      write(level, text);
    }
  }
}

std::string RateLimiter::hostOf(std::string_view address) {
  if (address.starts_with('[')) {
    auto close = address.find(']');
    if (close != std::string_view::npos) return std::string(address.substr(1, close - 1));
    return std::string(address);
  }
  auto colon = address.rfind(':');
  if (colon == std::string_view::npos || address.find(':') != colon) return std::string(address);
  return std::string(address.substr(0, colon));
}

}  // namespace weft::logging
