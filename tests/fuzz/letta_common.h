// Shared by the two Letta framing targets: checks on a parse result, and
// whether a payload is one Letta's json.loads would accept for sure.
#pragma once

#include <string>
#include <string_view>

#include "protocol/letta.h"
#include "tests/fuzz/fuzz_check.h"

namespace tsb::fuzz {

// What holds for any stdout.
inline void check_parsed(const protocol::ParsedOutput& out) {
  TSB_FUZZ_CHECK(is_utf8(out.stdout_text), "stdout_text is not UTF-8");
  if (out.corrupted) TSB_FUZZ_CHECK(!out.error_name.empty(), "a corrupted frame without an exception name");
  (void)out.results.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  (void)out.agent_state.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// A payload that Letta decodes into a result without raising: a JSON object
// (nlohmann accepts it, and it has no UTF-8 byte order mark, which Python's
// json.loads refuses on bytes), not nested deep enough to reach Python's
// recursion limit, without the agent_state that Letta would validate.
inline bool letta_accepts_payload(std::string_view payload) {
  if (payload.empty() || payload.rfind("\xef\xbb\xbf", 0) == 0 || opening_brackets(payload) > 100) return false;
  try {
    const auto v = nlohmann::json::parse(payload);
    return v.is_object() && !v.contains("agent_state");
  } catch (const nlohmann::json::exception&) {
    return false;
  }
}

}  // namespace tsb::fuzz
