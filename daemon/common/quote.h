// Text for messages and log lines: UTF-8 decoding and quoting that no
// client, tool or file can use to forge a line or a terminal sequence.
// Header-only, for the unprivileged programs (the front end, the compile
// helper, the command line); nothing of it runs in the root process.
#pragma once

#include <cstdarg>
#include <cstddef>
#include <cstdio>
#include <string>
#include <string_view>

namespace tsb {

// Decodes one UTF-8 sequence at s[i]. Returns its length (1-4) and the code
// point, or 0 when the bytes are not well-formed UTF-8 (RFC 3629: no overlong
// forms, no surrogates, nothing above U+10FFFF).
inline std::size_t decode_utf8(std::string_view s, std::size_t i, char32_t& cp) {
  const auto b = [&](std::size_t k) -> unsigned { return static_cast<unsigned char>(s[i + k]); };
  const auto cont = [&](std::size_t k, unsigned lo = 0x80, unsigned hi = 0xBF) {
    return i + k < s.size() && b(k) >= lo && b(k) <= hi;
  };
  const unsigned c = b(0);
  if (c < 0x80) {
    cp = c;
    return 1;
  }
  if (c >= 0xC2 && c <= 0xDF && cont(1)) {
    cp = ((c & 0x1F) << 6) | (b(1) & 0x3F);
    return 2;
  }
  if (c >= 0xE0 && c <= 0xEF) {
    const unsigned lo = c == 0xE0 ? 0xA0 : 0x80;
    const unsigned hi = c == 0xED ? 0x9F : 0xBF;
    if (!cont(1, lo, hi) || !cont(2)) return 0;
    cp = ((c & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F);
    return 3;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    const unsigned lo = c == 0xF0 ? 0x90 : 0x80;
    const unsigned hi = c == 0xF4 ? 0x8F : 0xBF;
    if (!cont(1, lo, hi) || !cont(2) || !cont(3)) return 0;
    cp = ((c & 0x07) << 18) | ((b(1) & 0x3F) << 12) | ((b(2) & 0x3F) << 6) | (b(3) & 0x3F);
    return 4;
  }
  return 0;
}

// Unicode's bidirectional controls (they reorder what a terminal shows).
inline bool is_bidi_control(char32_t cp) {
  return cp == 0x061C || cp == 0x200E || cp == 0x200F || (cp >= 0x202A && cp <= 0x202E) ||
         (cp >= 0x2066 && cp <= 0x2069);
}

// Appends `s` to `out` with every byte that could end a line, move the
// cursor or start a terminal sequence escaped: control characters (\n,
// \r, \t and ESC among them) as \n, \r, \t or \uXXXX, DEL and C1
// controls, bidirectional controls and line separators as \uXXXX, bytes
// that are not UTF-8 as \xNN. Quotes and backslashes stay as they are, so
// text already quoted by quoted_for_message() comes through unchanged;
// `keep_newlines` keeps \n and \t as they are (a block of text shown on
// an operator's terminal, one line still one line of it).
inline void append_escaped(std::string& out, std::string_view s, bool keep_newlines = false) {
  char buf[16];
  for (std::size_t i = 0; i < s.size();) {
    char32_t cp = 0;
    const std::size_t n = decode_utf8(s, i, cp);
    if (n == 0) {
      std::snprintf(buf, sizeof buf, "\\x%02X", static_cast<unsigned>(static_cast<unsigned char>(s[i])));
      out += buf;
      ++i;
      continue;
    }
    if (keep_newlines && (cp == '\n' || cp == '\t')) {
      out += static_cast<char>(cp);
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp < 0x20 || (cp >= 0x7F && cp <= 0x9F) || is_bidi_control(cp) || cp == 0x2028 || cp == 0x2029) {
      std::snprintf(buf, sizeof buf, "\\u%04X", static_cast<unsigned>(cp));
      out += buf;
    } else {
      out.append(s.substr(i, n));
    }
    i += n;
  }
}

inline std::string escaped(std::string_view s, bool keep_newlines = false) {
  std::string out;
  out.reserve(s.size());
  append_escaped(out, s, keep_newlines);
  return out;
}

// The command line's one way to put text on an operator's terminal (or
// in a file a person reads): a line made with printf's format, escaped
// whole as a log line is (append_escaped), then a newline. A name, a
// path, a message, pip's output or anything else a daemon, a tool, a
// package or a file put in it cannot end the line, move the cursor or
// start a terminal sequence, whether or not its call site thought of it.
// (JSON documents, whose encoder escapes every control character, and a
// tool's output into a pipe are written as they are.)
[[gnu::format(printf, 2, 3)]] inline void print_line(std::FILE* to, const char* format, ...) {
  std::va_list ap;
  va_start(ap, format);
  std::va_list again;
  va_copy(again, ap);
  const int n = std::vsnprintf(nullptr, 0, format, ap);
  va_end(ap);
  std::string raw(n > 0 ? static_cast<std::size_t>(n) : 0, '\0');
  if (n > 0) std::vsnprintf(raw.data(), raw.size() + 1, format, again);
  va_end(again);
  std::string line = escaped(raw);
  line += '\n';
  std::fwrite(line.data(), 1, line.size(), to);
}

// A block of text (a review page, a usage text, a tool's output on a
// terminal): escaped as print_line() escapes, its lines and tabs kept.
inline void print_block(std::FILE* to, std::string_view text) {
  const std::string e = escaped(text, /*keep_newlines=*/true);
  std::fwrite(e.data(), 1, e.size(), to);
}

// A string as a double-quoted literal safe to put in a message or a log line:
// quotes, backslashes, control characters, DEL, C1 controls, bidirectional
// controls and line separators are escaped, and bytes that are not UTF-8
// become \xNN.
inline std::string quoted_for_message(std::string_view s);

// A set-up failure's sentence names the sandbox path of the step that
// failed, quoted (a path can hold any byte). `R`: isolate::RunResult.
template <typename R>
void name_setup_path(R& r) {
  if (!r.setup_path.empty()) r.error += " (at " + quoted_for_message(r.setup_path) + ")";
}

inline std::string quoted_for_message(std::string_view s) {
  std::string q;
  q.reserve(s.size() + 2);
  q += '"';
  std::size_t from = 0;
  for (std::size_t i = 0; i <= s.size(); ++i) {
    if (i < s.size() && s[i] != '"' && s[i] != '\\') continue;
    append_escaped(q, s.substr(from, i - from));
    if (i < s.size()) {
      q += '\\';
      q += s[i];
    }
    from = i + 1;
  }
  q += '"';
  return q;
}

}  // namespace tsb
