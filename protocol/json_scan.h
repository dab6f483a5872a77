// A strict JSON validator that builds no document.
//
// Request lines can be as large as max_frame_bytes (32 MiB by default), and
// a DOM of such a line costs 50 to 100 bytes per small value: one request of
// millions of small values would take the daemon more than a gigabyte. So a
// request line is validated in one pass by scan_json(), which allocates only
// a stack of open containers and 8 bytes per object key of the currently open
// objects, and hands back the top-level container's children as byte slices
// of the text. Values the daemon only forwards (a tool's args, agent_state,
// json_schema) stay text from end to end, so their numbers are never
// converted: an integer of 300 digits reaches the tool as those 300 digits.
//
// The grammar is RFC 8259, exactly:
//   - one value, with only JSON whitespace (space, tab, \n, \r) around it;
//     one UTF-8 byte order mark before it is skipped when allow_bom is set
//     (RFC 8259 section 8.1 lets a parser ignore one);
//   - no trailing commas, comments, single quotes, NaN, Infinity, hex or
//     leading zeros; "true", "false", "null" in lower case;
//   - numbers of any length and magnitude (the RFC's grammar: range and
//     precision are the reader's business, not the grammar's);
//   - strings of valid UTF-8 (no overlong forms, no UTF-8-encoded surrogates,
//     nothing above U+10FFFF), no raw control characters (below U+0020),
//     only the escapes \" \\ \/ \b \f \n \r \t \uXXXX; a \u escape of a high
//     surrogate must be followed by one of a low surrogate, and a lone
//     surrogate escape is refused (like nlohmann::json, and unlike Python,
//     which would make it a str no UTF-8 encoder accepts; python_values
//     below accepts it, and NaN/Infinity, for values Python wrote);
//   - arrays and objects nested at most max_depth levels;
//   - with duplicate_keys (the default), no two members of one object, at
//     any depth, whose keys are equal once unescaped ("a" and "\u0061" are
//     the same key).
//
// Duplicate detection costs 8 bytes per key of the open objects: each key is
// hashed with SipHash-1-3 under a random per-process key (so collisions
// cannot be chosen from outside), and when an object closes its hashes are
// sorted (radix sort, linear for uniform hashes) and compared. Only on equal
// hashes are the keys themselves compared, after unescaping, so the verdict
// is exact.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <variant>

#include "protocol/json_limits.h"

namespace tsb::protocol {

enum class JsonKind : std::uint8_t { Null, Boolean, Number, String, Array, Object };

// One direct child of the scanned text's top-level array or object.
struct JsonChild {
  std::string_view key;    // object member: the key's token, quotes and escapes as sent; array element: empty
  std::string_view value;  // the value's text exactly as sent, without surrounding whitespace
  JsonKind kind;
};

enum class JsonScanFailure : std::uint8_t {
  Syntax,        // not JSON, or not UTF-8
  TooDeep,       // nested deeper than max_depth
  DuplicateKey,  // otherwise valid, but an object holds a key twice
};

struct JsonScanError {
  JsonScanFailure failure;
  std::size_t offset;     // byte offset in the text where the scanner stopped
  std::string_view what;  // a fixed description ("unterminated string", ...)
};

struct JsonScanOptions {
  int max_depth = kMaxJsonNesting;
  bool duplicate_keys = true;  // refuse duplicate keys (at every depth)
  bool allow_bom = false;      // skip one leading UTF-8 byte order mark
  // Also accept what Python's json.dumps writes beyond RFC 8259, so that a
  // value a tool returned can be kept exactly as Python's json.loads reads
  // it: NaN, Infinity and -Infinity as numbers (kind Number, passed to
  // on_number), and \u escapes of lone surrogates. Use with
  // duplicate_keys = false where Python semantics are wanted (json.loads
  // keeps the last of equal keys).
  bool python_values = false;
  // Called for each direct child of the top-level array or object, in
  // document order, while scanning: a later failure can still refuse the
  // text, so a caller acts on children only once scan_json succeeded.
  std::function<void(const JsonChild&)> on_child;
  // Called for every number token at any depth, with its text.
  std::function<void(std::string_view)> on_number;
};

struct JsonScanned {
  JsonKind kind;           // of the top-level value
  std::string_view value;  // the top-level value's text, without surrounding whitespace
};

// Validates `text` as one JSON text. Never reads outside `text`, never
// recurses, and takes time linear in its size.
//
// When the text has several faults: a syntax error wins over a duplicate key
// found before it, so a line is called "duplicate keys" only if it is JSON.
std::variant<JsonScanned, JsonScanError> scan_json(std::string_view text, const JsonScanOptions& options = {});

// ---------------------------------------------------------------------------
// Tokens that scan_json accepted. These functions assume valid input and do
// not check it again.
// ---------------------------------------------------------------------------

// The UTF-8 text of a string token (quotes included), escapes decoded. The
// result is never longer than the token.
std::string json_string_value(std::string_view token);

// True when a number token is written as an integer (no fraction, no exponent).
bool json_number_is_integer(std::string_view token);

// True when an integer token fits in int64 (negative) or uint64.
bool json_integer_fits_64_bits(std::string_view token);

// `text`, which scan_json accepted, without the whitespace between its
// tokens (inside strings nothing changes): a value spliced into a response
// line can then never break that line.
std::string json_without_whitespace(std::string_view text);

// ---------------------------------------------------------------------------
// Writing JSON strings
// ---------------------------------------------------------------------------

// `utf8` as a JSON string token: quotes, \" \\ and control characters
// escaped (\b \f \n \r \t, else \u00XX), every other byte as is. The input
// must be valid UTF-8 (decoded request strings are). The token is never
// longer than any token the same text could have been received as, so
// re-encoding a decoded request string never makes it grow.
std::size_t json_quoted_size(std::string_view utf8);
void append_json_quoted(std::string& out, std::string_view utf8);

}  // namespace tsb::protocol
