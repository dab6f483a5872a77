// Parsing JSON that comes from clients or from tools. Nesting depth is
// bounded before any document is built: nlohmann::json copies, compares and
// serialises values recursively, so a few hundred kilobytes of "[[[[..."
// would otherwise overflow the daemon's stack.
#pragma once

#include <string_view>

#include <nlohmann/json.hpp>

namespace tsb::protocol {

// Deeper than any real tool result or request; Python's json module itself
// stops near 1000 (its recursion limit).
inline constexpr int kMaxJsonNesting = 512;

// True when no array/object in `text` nests deeper than max_depth. Linear,
// string-aware (brackets inside strings do not count); does not validate.
bool json_nesting_within(std::string_view text, int max_depth = kMaxJsonNesting);

// json::parse without exceptions that also refuses documents nested deeper
// than kMaxJsonNesting and documents holding a NUL byte (which nlohmann
// would take for the end of the input): all come back as a discarded value.
// Every JSON text from a client, a tool or a remote service goes through it.
nlohmann::json parse_json_bounded(std::string_view text);

}  // namespace tsb::protocol
