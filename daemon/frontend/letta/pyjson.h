// Python-exact JSON text and Python text semantics.
//
// Letta computes values from Python's json.dumps output (the sandbox config
// fingerprint hashes it) and measures or cuts strings in Python characters
// (code points). These functions reproduce CPython 3.11 byte for byte so that
// a digest or a cut computed here equals the one letta-server computes.
// tests/unit/pyjson_test.cc checks them against /usr/bin/python3.
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <string>
#include <string_view>

#include "isolate/base/result.h"

namespace tsb::letta {

// json.dumps(v, sort_keys=True, separators=(",", ":")), ensure_ascii=True.
//
// - Keys are sorted by code point at every level. Python compares str keys by
//   code point; UTF-8 byte order is the same order, so this is a byte sort.
//   (UTF-16 order, as used by JavaScript and Java, differs: it puts U+E000..
//   U+FFFF after astral characters.)
// - Every non-ASCII character is written as a lowercase \uXXXX escape, astral
//   characters as a surrogate pair; \" \\ \n \r \t \b \f; other control
//   characters and DEL (0x7f) as \u00XX; '/' is not escaped.
// - Integers are exact; floats use repr() (python_float_repr); NaN and the
//   infinities are written as NaN, Infinity and -Infinity, as json.dumps does
//   with its default allow_nan=True (that output is not strict JSON).
//
// Fails on input Python's json.dumps could not have received: strings or keys
// that are not valid UTF-8, binary values, discarded values, and nesting
// deeper than kMaxDumpDepth (Python raises RecursionError near 1000 levels;
// the exact Python limit depends on the caller's stack, ours is fixed).
Result<std::string> dumps_compact_sorted(const nlohmann::json& v);
Result<std::string> dumps_compact_sorted(const nlohmann::ordered_json& v);

// json.dumps(v): separators ", " and ": ", keys in container order,
// ensure_ascii=True. nlohmann::json keeps its objects sorted, so insertion
// order needs nlohmann::ordered_json (parse with ordered_json::parse).
Result<std::string> dumps_python_default(const nlohmann::json& v);
Result<std::string> dumps_python_default(const nlohmann::ordered_json& v);

inline constexpr int kMaxDumpDepth = 1000;

// repr(float): the shortest string that round-trips, in fixed notation when
// the decimal exponent is in [-4, 16) and scientific otherwise ("1e-05",
// "1e+16", "1.5e+300"), with ".0" added to integral values ("1.0"), "-0.0",
// and "inf", "-inf", "nan".
std::string python_float_repr(double d);

// bytes.decode("utf-8", "replace") re-encoded as UTF-8: each maximal invalid
// subsequence (Unicode's "maximal subpart" rule, which CPython follows)
// becomes one U+FFFD. `had_invalid` says whether anything was replaced.
struct Utf8Text {
  std::string text;
  bool had_invalid = false;
};
Utf8Text utf8_decode_replace(std::string_view bytes);

// Strict UTF-8 validity, as bytes.decode("utf-8") without errors= checks it
// (no overlongs, no surrogates, nothing above U+10FFFF).
bool is_valid_utf8(std::string_view bytes);

// Number of bytes taken by the first `max_code_points` code points of
// `valid_utf8`, i.e. the byte length of Python's s[:max_code_points]. Never
// ends inside a UTF-8 sequence. Input must be valid UTF-8.
std::size_t utf8_prefix_bytes(std::string_view valid_utf8, std::size_t max_code_points);

// Decode one code point from valid UTF-8 at `pos`, advancing `pos`.
char32_t utf8_next(std::string_view valid_utf8, std::size_t& pos);

// `text`, which protocol::scan_json accepted with python_values (JSON as
// Python writes it), as RFC 8259 JSON as
// far as numbers go: each NaN, Infinity and -Infinity token becomes the
// string "NaN", "Infinity" or "-Infinity" (what a strict reader can take);
// everything else, lone surrogate escapes included (the RFC's grammar allows
// them), is copied unchanged. Text that does not scan is returned as is.
std::string python_json_as_strict(std::string_view text);

}  // namespace tsb::letta
