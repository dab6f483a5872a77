// Invariant checks for the fuzz targets. A broken invariant prints what was
// expected and aborts, which libFuzzer reports as a crash and saves the input
// as the reproducer (tests/fuzz/run-fuzz.sh says where).
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include <nlohmann/json.hpp>

namespace tsb::fuzz {

[[noreturn]] inline void fail(const char* what, std::string_view detail = {}) {
  std::fprintf(stderr, "\nFUZZ INVARIANT BROKEN: %s\n", what);
  if (!detail.empty()) std::fprintf(stderr, "  %.*s\n", static_cast<int>(std::min<std::size_t>(detail.size(), 2000)), detail.data());
  std::abort();
}

#define TSB_FUZZ_CHECK(cond, ...) \
  do {                            \
    if (!(cond)) ::tsb::fuzz::fail("" #cond __VA_OPT__(, ) __VA_ARGS__); \
  } while (0)

// Whether `text` is one JSON value as nlohmann reads it. Numbers beyond a
// double (1e400) are valid JSON that nlohmann refuses with out_of_range 406;
// they count as valid here, since the code under test may keep numbers as
// the text that was sent. nlohmann takes a NUL byte for the end of its input
// ("{}\0junk" parses as {}); JSON has no raw NUL, so such text is not JSON.
inline bool is_json(std::string_view text) {
  if (text.find('\0') != std::string_view::npos) return false;
  try {
    (void)nlohmann::json::parse(text);
    return true;
  } catch (const nlohmann::json::out_of_range&) {
    return true;
  } catch (const nlohmann::json::exception&) {
    return false;
  }
}

// Strict UTF-8 (RFC 3629): no overlong forms, no surrogates, at most U+10FFFF.
inline bool is_utf8(std::string_view s) {
  std::size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    std::size_t n;
    char32_t cp;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xe0) == 0xc0) {
      n = 1, cp = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      n = 2, cp = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      n = 3, cp = c & 0x07;
    } else {
      return false;
    }
    if (s.size() - i <= n) return false;
    for (std::size_t k = 1; k <= n; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3f);
    }
    static constexpr char32_t kMin[] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMin[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += n + 1;
  }
  return true;
}

// How many [ and { `s` holds: an upper bound of its nesting depth.
inline std::size_t opening_brackets(std::string_view s) {
  return static_cast<std::size_t>(std::count_if(s.begin(), s.end(), [](char c) { return c == '[' || c == '{'; }));
}

}  // namespace tsb::fuzz
