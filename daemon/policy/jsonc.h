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

#include "daemon/common/quote.h"  // quoted_for_message, for every user of located errors

#include <unordered_map>
#include <string>
#include <string_view>
#include <vector>

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
  std::unordered_map<std::string, JsonLocation> locations;
  // JSON pointer of an object member -> position of its key.
  std::unordered_map<std::string, JsonLocation> key_locations;
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

// The one way a document the daemon reads from a file is read (the daemon
// configuration, policies, seccomp profiles, the organizations table): one
// object of it, member by member. Typed getters name the member's position
// on error ("file:line:col: must be ..."); a member no getter asked for is
// an error of done(), which names it and the members known there. An absent
// member gives the default; a member that is there must have the type.
// (Requests and the tools' results are scanned, not parsed into a tree:
// protocol/json_scan.h, with the same strictness.)
class ObjectReader {
 public:
  ObjectReader(const LocatedJson& doc, const nlohmann::json& value, std::string pointer)
      : doc_(doc), v_(value), ptr_(std::move(pointer)) {}

  // The value is an object ("<what> must be an object" if not).
  Status object(std::string_view what) const;
  // The member `key`, marked as known; null when absent.
  const nlohmann::json* get(std::string_view key);
  std::string pointer(std::string_view key) const { return json_pointer_append(ptr_, key); }
  std::string where(std::string_view key) const { return doc_.where(pointer(key)); }
  // "where(key): sentence", EINVAL.
  Error error(std::string_view key, std::string_view sentence) const;
  const LocatedJson& doc() const { return doc_; }

  Result<std::string> string(std::string_view key, const std::string& dflt, bool absolute_path = false);
  Result<bool> boolean(std::string_view key, bool dflt);
  // A whole number in [lo, hi].
  Result<std::uint64_t> number(std::string_view key, std::uint64_t dflt, std::uint64_t lo, std::uint64_t hi);
  // An array of strings (absent: empty).
  Result<std::vector<std::string>> strings(std::string_view key, std::string_view each);

  // Every member was asked for: else "unknown key "x" (known here: ...)".
  Status done() const;

 private:
  const LocatedJson& doc_;
  const nlohmann::json& v_;
  std::string ptr_;
  std::vector<std::string> seen_;
};



}  // namespace tsb
