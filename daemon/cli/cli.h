#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace tsb::cli {

int cmd_run(const std::vector<std::string>& args);
int cmd_policy(const std::vector<std::string>& args);
int cmd_client(const std::string& verb, const std::vector<std::string>& args);

// Exit statuses of toolsandbox itself (the tool's own status passes through).
inline constexpr int kExitUsage = 2;
inline constexpr int kExitTimeout = 124;   // as timeout(1)
inline constexpr int kExitSetup = 125;     // the sandbox could not be built
inline constexpr int kExitNotFound = 127;

}  // namespace tsb::cli
