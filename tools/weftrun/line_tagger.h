// Turns a byte stream (a child's stdout or stderr read in arbitrary chunks)
// into whole lines, each prefixed with a tag such as "[3] ".
//
//   LineTagger t("[3] ");
//   t.feed("hel");              // ""             (no complete line yet)
//   t.feed("lo\nwor");          // "[3] hello\n"
//   t.finish();                 // "[3] wor\n"    (the unterminated tail, terminated)
//
// The returned text holds only complete lines, so writing it with one write()
// never leaves a partial line for another rank's output to land in. A line
// longer than kMaxLine bytes (newline excluded) is cut into kMaxLine-byte
// lines, each tagged, so memory stays bounded whatever the child writes.
// Not thread-safe: one per stream, used by weftrun's single thread.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace weft::weftrun {

class LineTagger {
 public:
  static constexpr size_t kMaxLine = 64 * 1024;

  explicit LineTagger(std::string tag = {}) : tag_(std::move(tag)) {}

  // Takes the next bytes of the stream; returns the lines they complete, each
  // tagged and ending in '\n' ("" when none).
  std::string feed(std::string_view bytes);
  // At the end of the stream: the unterminated last line, tagged and
  // terminated, or "" when the stream ended with a newline.
  std::string finish();

 private:
  std::string tag_;
  std::string pending_;  // bytes after the last newline, at most kMaxLine
};

}  // namespace weft::weftrun
