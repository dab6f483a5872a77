// Shared by the two Letta framing targets: checks on a parse result, and
// whether a payload is one Letta's json.loads would accept for sure.
#pragma once

#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "daemon/frontend/letta/letta.h"
#include "tests/fuzz/fuzz_check.h"

namespace tsb::fuzz {

// What holds for any stdout.
inline void check_parsed(const letta::ParsedOutput& out) {
  TSB_FUZZ_CHECK(is_utf8(out.stdout_text), "stdout_text is not UTF-8");
  if (out.corrupted) TSB_FUZZ_CHECK(!out.error_name.empty(), "a corrupted frame without an exception name");
  (void)out.results.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  (void)out.agent_state.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// One input, used twice: first as a whole stdout, then split into the text
// before a frame, the frame's payload and the text after it, from which the
// target builds a frame of its own framing.
struct FrameParts {
  std::string prefix, payload, suffix;
};
inline FrameParts parse_whole_then_split(const std::uint8_t* data, std::size_t size) {
  check_parsed(letta::parse_letta_stdout(std::string_view(reinterpret_cast<const char*>(data), size)));
  FuzzedDataProvider fdp(data, size);
  FrameParts parts;
  parts.prefix = fdp.ConsumeRandomLengthString(4096);
  parts.payload = fdp.ConsumeRandomLengthString(1 << 16);
  parts.suffix = fdp.ConsumeRemainingBytesAsString();
  return parts;
}

// A payload that Letta decodes into a result without raising: a JSON object
// (nlohmann accepts it, it holds no NUL byte, which nlohmann takes for the
// end of its input and json.loads refuses, and it has no UTF-8 byte order
// mark, which Python's json.loads refuses on bytes), not nested deep enough to reach Python's
// recursion limit, without the agent_state that Letta would validate.
inline bool letta_accepts_payload(std::string_view payload) {
  if (payload.empty() || payload.find('\0') != std::string_view::npos || payload.rfind("\xef\xbb\xbf", 0) == 0 || opening_brackets(payload) > 100) return false;
  try {
    const auto v = nlohmann::json::parse(payload);
    return v.is_object() && !v.contains("agent_state");
  } catch (const nlohmann::json::exception&) {
    return false;
  }
}

}  // namespace tsb::fuzz
