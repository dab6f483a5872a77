// The log lines of the unprivileged programs (the front end and its compile
// helper): one format, and every message escaped on its way out, whatever
// its call site put in it. A tool's output, a package's path, an E2B answer
// or a client's string that reaches a log line cannot end the line, forge
// the next one or drive the terminal that shows the journal: control
// characters, invalid UTF-8 and the rest of append_escaped()'s list come
// out as escapes. Quoted strings (quoted_for_message) pass unchanged.
#pragma once

#include <spdlog/pattern_formatter.h>
#include <spdlog/spdlog.h>

#include <memory>
#include <string>

#include "daemon/common/quote.h"

namespace tsb {

// The pattern flag %* : the message, escaped.
class EscapedMessageFlag final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&, spdlog::memory_buf_t& dest) override {
    std::string line;
    append_escaped(line, std::string_view(msg.payload.data(), msg.payload.size()));
    dest.append(line.data(), line.data() + line.size());
  }
  std::unique_ptr<custom_flag_formatter> clone() const override { return std::make_unique<EscapedMessageFlag>(); }
};

// The formatter of every log line: time, level, the escaped message.
inline std::unique_ptr<spdlog::formatter> log_line_formatter() {
  auto f = std::make_unique<spdlog::pattern_formatter>();
  f->add_flag<EscapedMessageFlag>('*').set_pattern("%Y-%m-%dT%H:%M:%S.%e %l %*");
  return f;
}

}  // namespace tsb
