// The engine's result record as JSON: one shape for `toolsandbox run --json`
// and the daemon's responses (protocol/PROTOCOL.md, "RunRecord").
#pragma once

#include <nlohmann/json.hpp>

#include "isolate/supervise/outcome.h"

namespace tsb::core {

// Without stdout/stderr (the caller adds them where it wants them).
nlohmann::json run_record_json(const isolate::RunResult& r);

// dump() that never throws on invalid UTF-8 from a tool: bad bytes become U+FFFD.
std::string dump_json(const nlohmann::json& j, int indent = -1);

}  // namespace tsb::core
