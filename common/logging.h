// One leveled logger for the whole process.
//
// The level comes from WEFT_LOG_LEVEL (debug, info, warn, error, off; default
// warn). Each line is prefixed with the level and, once set, the worker name:
//
//   weft::logging::setWorkerName("trainer1");
//   WEFT_LOG(Info) << "connected to " << peer;   // "[I trainer1] connected to ps"
//
// Lines are written whole (one write per line), so lines from several threads
// never interleave. Thread-safe.
//
// Lines that a peer's behaviour can repeat at will (one per connection
// refused, per frame rejected) go through a RateLimiter, keyed by the peer's
// address, so that a flood of hostile connections costs a few lines and a
// summary instead of one line each:
//
//   logging::RateLimiter limiter("rpc");                  // one per component
//   WEFT_LOG_LIMITED(limiter, Warn, host) << "rpc: refused a connection from " << who;
//   limiter.flush();                                      // on a timer: writes the summaries due
//   // "[W] rpc: ... and 2,997 more from 127.0.0.1 in the last 10 s"
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace weft::logging {

enum class Level { Debug = 0, Info = 1, Warn = 2, Error = 3, Off = 4 };

Level level();
void setLevel(Level l);
void setWorkerName(std::string name);
bool enabled(Level l);

class Line {
 public:
  explicit Line(Level l) : level_(l) {}
  ~Line();
  template <class T>
  Line& operator<<(const T& v) {
    os_ << v;
    return *this;
  }

 private:
  Level level_;
  std::ostringstream os_;
};

// Writes `text` as one line at `level` (prefixed like a WEFT_LOG line), if the level is enabled.
void write(Level level, const std::string& text);

// RateLimiter's settings (RateLimiter::Config).
struct RateLimitConfig {
  int burst = 3;  // lines shown per key and window
  std::chrono::milliseconds window{std::chrono::seconds(10)};
  size_t maxKeys = 256;
};

// The Config a RateLimiter gets when its owner gives none (as the agent and the
// store server do): a program (or a test that counts every line) may change it
// before it builds them. Thread-safe.
RateLimitConfig rateLimitDefaults();
void setRateLimitDefaults(const RateLimitConfig& config);

// Lets through at most Config::burst lines per key in each window of
// Config::window that begins with a key's first line; the lines beyond are
// counted, and when the window ends one summary line at the highest level
// among them says how many: "<prefix>: ... and N more from <key> in the last
// 10 s". A key's next line after its window opens a new window. At most
// Config::maxKeys keys are tracked at once; lines for further keys share the
// key "other addresses", so memory stays bounded whatever a peer does.
//
// Summaries are written by flush() once their window has ended (call it from
// a periodic timer; nextDue() says when one is due), by the next admit() after
// that, and by the destructor for windows still open. Thread-safe.
class RateLimiter {
 public:
  using Clock = std::chrono::steady_clock;
  using Config = RateLimitConfig;
  // Where summaries go: by default write(level, text).
  using Sink = std::function<void(Level, const std::string&)>;

  explicit RateLimiter(std::string prefix, Config config = rateLimitDefaults(),
                       std::function<Clock::time_point()> now = {}, Sink sink = {});
  ~RateLimiter();
  RateLimiter(const RateLimiter&) = delete;
  RateLimiter& operator=(const RateLimiter&) = delete;

  // True when a line at `level` for `key` may be written now; false when it is
  // counted for the key's summary instead.
  bool admit(Level level, std::string_view key);
  // Writes the summaries of the windows that have ended, and forgets those keys.
  void flush();
  // When the earliest open window with lines held back ends; Clock::time_point::max() when none.
  Clock::time_point nextDue() const;

  // "host" of "host:port" or "[v6]:port"; the text itself when it has no port.
  static std::string hostOf(std::string_view address);

 private:
  struct Window {
    Clock::time_point start;
    int shown = 0;
    uint64_t held = 0;
    Level level = Level::Debug;  // the highest level held back
  };
  Clock::time_point now() const;
  // Under mutex_: removes the keys whose window ended by `at`, appending their summaries.
  void collectLocked(Clock::time_point at, std::vector<std::pair<Level, std::string>>& out);
  std::string summary(const std::string& key, const Window& w, Clock::duration span) const;
  void emit(const std::vector<std::pair<Level, std::string>>& lines);

  std::string prefix_;
  Config config_;
  std::function<Clock::time_point()> now_;
  Sink sink_;
  mutable std::mutex mutex_;
  std::map<std::string, Window, std::less<>> windows_;  // under mutex_
};

}  // namespace weft::logging

// WEFT_LOG through a RateLimiter: the line is built and written only when the
// level is enabled and limiter.admit(level, key) lets it through.
#define WEFT_LOG_LIMITED(limiter, lvl, key)                                                     \
  if (!::weft::logging::enabled(::weft::logging::Level::lvl) ||                                 \
      !(limiter).admit(::weft::logging::Level::lvl, (key))) {                                   \
  } else                                                                                        \
    ::weft::logging::Line(::weft::logging::Level::lvl)

#define WEFT_LOG(lvl)                                                   \
  if (!::weft::logging::enabled(::weft::logging::Level::lvl)) {                  \
  } else                                                                \
    ::weft::logging::Line(::weft::logging::Level::lvl)
