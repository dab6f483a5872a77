#include "daemon/policy/units.h"

#include <charconv>
#include <cmath>
#include <limits>

namespace tsb::core {
namespace {

struct Unit {
  std::string_view suffix;
  std::uint64_t factor;
};
constexpr Unit kSizeUnits[] = {
    {"TiB", 1ull << 40}, {"GiB", 1ull << 30}, {"MiB", 1ull << 20}, {"KiB", 1ull << 10},
    {"TB", 1000000000000ull}, {"GB", 1000000000ull}, {"MB", 1000000ull}, {"kB", 1000ull}, {"B", 1},
};

}  // namespace

Result<std::uint64_t> parse_size(const nlohmann::json& v) {
  if (v.is_number_integer()) {
    if (v.get<std::int64_t>() < 0 && !v.is_number_unsigned()) return Error::invalid("a size cannot be negative");
    return v.get<std::uint64_t>();
  }
  if (!v.is_string()) return Error::invalid("a size must be a string like \"512MiB\" or a number of bytes");
  std::string_view s = v.get_ref<const std::string&>();
  std::size_t digits = 0;
  while (digits < s.size() && s[digits] >= '0' && s[digits] <= '9') ++digits;
  if (digits == 0) return Error::invalid("a size must start with digits: \"" + std::string(s) + "\"");
  std::string_view suffix = s.substr(digits);
  std::uint64_t n = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + digits, n);
  if (ec != std::errc()) return Error::invalid("size out of range: \"" + std::string(s) + "\"");
  for (const auto& u : kSizeUnits) {
    if (suffix == u.suffix) {
      if (n > std::numeric_limits<std::uint64_t>::max() / u.factor)
        return Error::invalid("size out of range: \"" + std::string(s) + "\"");
      return n * u.factor;
    }
  }
  return Error::invalid("unknown size unit \"" + std::string(suffix) +
                        "\" (use B, KiB, MiB, GiB, TiB, kB, MB, GB or TB)");
}

Result<std::chrono::milliseconds> parse_duration(const nlohmann::json& v) {
  double value = 0;
  double factor_ms = 1000;
  if (v.is_number()) {
    value = v.get<double>();
  } else if (v.is_string()) {
    const std::string& s = v.get_ref<const std::string&>();
    std::size_t end = 0;
    while (end < s.size() && ((s[end] >= '0' && s[end] <= '9') || s[end] == '.')) ++end;
    if (end == 0) return Error::invalid("a duration must start with a number: \"" + s + "\"");
    auto [p, ec] = std::from_chars(s.data(), s.data() + end, value);
    if (ec != std::errc() || p != s.data() + end) return Error::invalid("not a number: \"" + s + "\"");
    std::string_view unit = std::string_view(s).substr(end);
    if (unit == "ms") factor_ms = 1;
    else if (unit == "s") factor_ms = 1000;
    else if (unit == "m") factor_ms = 60000;
    else if (unit == "h") factor_ms = 3600000;
    else return Error::invalid("unknown duration unit \"" + std::string(unit) + "\" (use ms, s, m or h)");
  } else {
    return Error::invalid("a duration must be a string like \"60s\" or a number of seconds");
  }
  double ms = value * factor_ms;
  if (!std::isfinite(ms) || ms < 0 || ms > 1e12) return Error::invalid("duration out of range");
  return std::chrono::milliseconds(static_cast<long long>(std::llround(ms)));
}

std::string format_size(std::uint64_t bytes) {
  if (bytes == 0) return "0B";
  for (const auto& u : kSizeUnits) {
    if (u.suffix.find('i') == std::string_view::npos) continue;
    if (bytes % u.factor == 0) return std::to_string(bytes / u.factor) + std::string(u.suffix);
  }
  return std::to_string(bytes) + "B";
}

std::string format_duration(std::chrono::milliseconds d) {
  auto ms = d.count();
  if (ms % 3600000 == 0 && ms > 0) return std::to_string(ms / 3600000) + "h";
  if (ms % 60000 == 0 && ms >= 60000 && ms % 3600000 != 0 && ms / 60000 >= 1) {
    // minutes read better only when they are whole and not an hour
    if (ms / 60000 < 60) return std::to_string(ms / 60000) + "m";
  }
  if (ms % 1000 == 0) return std::to_string(ms / 1000) + "s";
  return std::to_string(ms) + "ms";
}

}  // namespace tsb::core
