// Units in policy files: sizes ("512MiB", "64KiB", "1GB", 4096) and
// durations ("60s", "500ms", "2m", 1.5). Strict: anything else is an error.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "isolate/base/result.h"

namespace tsb::core {

// A plain integer is bytes. Suffixes: B, KiB, MiB, GiB, TiB (powers of 1024)
// and kB, MB, GB, TB (powers of 1000). No fractions, no spaces.
Result<std::uint64_t> parse_size(const nlohmann::json& v);
// A plain number is seconds. Suffixes: ms, s, m, h. Decimals allowed
// ("1.5s"); the result is rounded to whole milliseconds.
Result<std::chrono::milliseconds> parse_duration(const nlohmann::json& v);

std::string format_size(std::uint64_t bytes);          // "512MiB", "1000B"
std::string format_duration(std::chrono::milliseconds d);  // "60s", "1500ms"

}  // namespace tsb::core
