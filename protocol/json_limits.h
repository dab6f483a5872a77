// Parsing JSON that comes from outside the process: clients, tools, remote
// services, the venv build sandbox. Nesting depth is bounded before any
// document is built: nlohmann::json copies, compares and serialises values
// recursively, so a few hundred kilobytes of "[[[[..." would otherwise
// overflow the daemon's stack.
//
// Two readers, for two kinds of input:
//   - parse_json_bounded: nlohmann's grammar, depth and NUL bounded; for
//     tools' results and E2B's answers, whose size the caller has capped;
//   - parse_json_limited: RFC 8259 exactly (scan_json's grammar) under the
//     limits one kind of document legitimately stays within (size, depth,
//     values, string length), with an error that says which was broken.
// Never a bare nlohmann::json::parse on such text: scripts/check-json-rule.sh
// fails the test command when one appears outside its list of trusted sites.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include <nlohmann/json.hpp>

#include "isolate/base/result.h"

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
// Every JSON text from a client, a tool or a remote service goes through it
// or through parse_json_limited.
nlohmann::json parse_json_bounded(std::string_view text);

// What one kind of document may hold. The defaults bound only the nesting;
// a caller sets each limit to what its legitimate documents stay within.
struct JsonLimits {
  std::size_t max_bytes = SIZE_MAX;         // the text
  int max_depth = kMaxJsonNesting;          // arrays and objects, nested ("[[1]]" is 2)
  std::size_t max_values = SIZE_MAX;        // values at every depth: containers, members' values, elements, the top one
  std::size_t max_string_bytes = SIZE_MAX;  // one string or key, decoded (UTF-8 bytes)
  bool duplicate_keys = true;               // refuse an object with a key twice; false: the last one wins (json.loads)
};

// `text` as a document, read under `limits`, or an error that names the
// first problem and, where it has one, its byte offset:
//   "larger than 1048576 bytes (1048577)"                     E2BIG
//   "nested deeper than 2 levels (at byte 14)"                 E2BIG
//   "more than 10321 values"                                   E2BIG
//   "a string or key longer than 4096 bytes (5000)"            E2BIG
//   "not JSON: invalid UTF-8 in a string (at byte 9)"          EINVAL
//   "not JSON: duplicate key (at byte 12)"                     EINVAL
//   "a number beyond a double's range (at byte 7)"             ERANGE
// The grammar is scan_json's (json_scan.h): RFC 8259, strings of valid
// UTF-8, no NUL, no comments, NaN or lone surrogate escapes. The text is
// scanned first, with no document built; then the document is built by a
// SAX reader that stops at the first limit, so what an over-limit text
// costs is bounded by the limits, not by the text.
Result<nlohmann::json> parse_json_limited(std::string_view text, const JsonLimits& limits);

}  // namespace tsb::protocol
