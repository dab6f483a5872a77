// Strict JSON with comments, for policy files that people edit and auditors
// read. Comments (// and /* */) are the only extension. Everything else a
// lenient parser would guess at is an error that names file:line:col:
// duplicate keys (a later key silently winning would let a second definition
// hide below the first), trailing commas, NaN/Infinity, invalid UTF-8,
// control characters, nesting deeper than kMaxJsonDepth, and anything after
// the top-level value.
//
// Integers keep their exact value: non-negative ones up to 2^64-1 are stored
// as unsigned, negative ones down to -2^63 as signed; integers beyond that
// range are errors rather than silently rounded doubles (seccomp argument
// values use the whole 64-bit range).
//
// Positions are 1-based; columns count Unicode code points, so a tab or a
// multi-byte character is one column.
#pragma once

#include "isolate/base/quote.h"  // quoted_for_message, for every user of located errors

#include <map>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "isolate/base/result.h"

namespace tsb {

inline constexpr int kMaxJsonDepth = 64;

struct JsonLocation {
  int line = 0;
  int col = 0;
};

struct LocatedJson {
  nlohmann::json value;
  // JSON pointer (RFC 6901, "" for the root) -> position of that value.
  std::map<std::string, JsonLocation> locations;
  // JSON pointer of an object member -> position of its key.
  std::map<std::string, JsonLocation> key_locations;
  std::string source;  // file path or "<inline>", for messages

  // "source:line:col" of the value at `pointer`, or "source: <pointer>"
  // when its position is unknown.
  [[nodiscard]] std::string where(const std::string& pointer) const;
  // Same, for the key of the member at `pointer` (falls back to the value).
  [[nodiscard]] std::string where_key(const std::string& pointer) const;
};

// Parse `text`. Errors read "source:line:col: sentence" and carry EINVAL.
Result<LocatedJson> parse_jsonc(std::string_view text, std::string_view source);

// Appends one reference token to a JSON pointer, escaping '~' and '/'.
std::string json_pointer_append(std::string_view pointer, std::string_view token);
std::string json_pointer_append(std::string_view pointer, std::size_t index);


}  // namespace tsb
