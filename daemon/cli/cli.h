#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "isolate/base/result.h"

namespace tsb::cli {

inline constexpr const char* kDefaultSocket = "/run/toolsandboxd/toolsandboxd.sock";

int cmd_run(const std::vector<std::string>& args);
int cmd_policy(const std::vector<std::string>& args);
int cmd_client(const std::string& verb, const std::vector<std::string>& args);
int cmd_venv(const std::vector<std::string>& args);
int cmd_session(const std::vector<std::string>& args);

// One request to toolsandboxd and its answer line (protocol/PROTOCOL.md).
// `timeout_ms` > 0: each send and receive gives up after it.
Result<nlohmann::json> roundtrip(const std::string& socket_path, const nlohmann::json& request, int timeout_ms = 0);

// One long option of a verb. value_help: what its value is, for the message
// when it is missing ("--policy needs a name"); nullptr for a flag.
struct OptionSpec {
  const char* name;
  const char* value_help;
};

// Parses a verb's arguments with getopt_long: `on(name, value)` for each
// option, in order (it returns an error message to stop); operands into
// `operands`. With operands_after_dashdash_only, options end at "--" and
// every operand must follow it (`toolsandbox run [options] -- CMD ...`);
// otherwise options and operands mix, and "--" ends the options. Returns
// the usage error, if any.
std::optional<std::string> parse_options(const std::vector<std::string>& args, const std::vector<OptionSpec>& specs,
                                         bool operands_after_dashdash_only,
                                         const std::function<std::optional<std::string>(const std::string&, const std::string&)>& on,
                                         std::vector<std::string>* operands);

// Exit statuses of toolsandbox itself (the tool's own status passes through).
inline constexpr int kExitUsage = 2;
inline constexpr int kExitTimeout = 124;   // as timeout(1)
inline constexpr int kExitSetup = 125;     // the sandbox could not be built
inline constexpr int kExitNotFound = 127;

}  // namespace tsb::cli
