#include "tools/weftrun/line_tagger.h"

namespace weft::weftrun {

std::string LineTagger::feed(std::string_view bytes) {
  std::string out;
  while (!bytes.empty()) {
    // A line may hold up to kMaxLine bytes before its newline.
    size_t room = kMaxLine - pending_.size();
    size_t newline = bytes.substr(0, room + 1).find('\n');
    if (newline != std::string_view::npos) {
      out += tag_;
      out += pending_;
      out.append(bytes.data(), newline + 1);
      pending_.clear();
      bytes.remove_prefix(newline + 1);
    } else if (bytes.size() > room) {
      // More than kMaxLine bytes without a newline: cut a full line here.
      out += tag_;
      out += pending_;
      out.append(bytes.data(), room);
      out += '\n';
      pending_.clear();
      bytes.remove_prefix(room);
    } else {
      pending_.append(bytes.data(), bytes.size());
      break;
    }
  }
  return out;
}

std::string LineTagger::finish() {
  if (pending_.empty()) return {};
  std::string out = tag_ + pending_ + '\n';
  pending_.clear();
  return out;
}

}  // namespace weft::weftrun
