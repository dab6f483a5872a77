#include "protocol/json_limits.h"

namespace tsb::protocol {

bool json_nesting_within(std::string_view text, int max_depth) {
  int depth = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;  // skip the escaped character
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    else if (c == '[' || c == '{') {
      if (++depth > max_depth) return false;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return true;
}

nlohmann::json parse_json_bounded(std::string_view text) {
  // nlohmann's lexer takes a NUL byte for the end of the input, so
  // "{}\0anything" would parse as {}. JSON has no raw NUL anywhere (inside a
  // string it is a control character that must be escaped), and Python's
  // json.loads refuses it, so it is refused here before nlohmann sees it.
  if (text.find('\0') != std::string_view::npos || !json_nesting_within(text))
    return nlohmann::json(nlohmann::json::value_t::discarded);
  return nlohmann::json::parse(text.begin(), text.end(), nullptr, false);
}

}  // namespace tsb::protocol
