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
#pragma once

#include <sstream>
#include <string>

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

}  // namespace weft::logging

#define WEFT_LOG(lvl)                                                   \
  if (!::weft::logging::enabled(::weft::logging::Level::lvl)) {                  \
  } else                                                                \
    ::weft::logging::Line(::weft::logging::Level::lvl)
