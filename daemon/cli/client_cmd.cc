// toolsandbox exec | call | status: client verbs that talk to toolsandboxd
// over its Unix socket (protocol/PROTOCOL.md).
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <iterator>
#include <regex>
#include <sstream>

#include "daemon/common/quote.h"
#include "daemon/cli/cli.h"
#include "isolate/base/file.h"
#include "protocol/record.h"
#include "isolate/base/random.h"
#include "isolate/base/result.h"
#include "isolate/base/unique_fd.h"
#include "protocol/json_limits.h"

namespace tsb::cli {

using nlohmann::json;

Result<json> roundtrip(const std::string& socket_path, const json& request, int timeout_ms) {
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) return Error::from_errno("socket");
  if (timeout_ms > 0) {
    const timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
    (void)::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    (void)::setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  }
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (socket_path.size() >= sizeof addr.sun_path) return Error::invalid("socket path too long");
  std::memcpy(addr.sun_path, socket_path.c_str(), socket_path.size() + 1);
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0)
    return Error::from_errno("connecting to toolsandboxd at '" + socket_path + "'");
  std::string line = core::dump_json(request) + "\n";
  std::size_t off = 0;
  while (off < line.size()) {
    ssize_t n = ::write(fd.get(), line.data() + off, line.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Error::from_errno("sending the request");
    }
    off += static_cast<std::size_t>(n);
  }
  std::string reply;
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Error::from_errno("reading the response");
    }
    if (n == 0) break;
    reply.append(buf, static_cast<std::size_t>(n));
    if (reply.find('\n') != std::string::npos) break;
  }
  auto nl = reply.find('\n');
  if (nl == std::string::npos) return Error::invalid("the daemon closed the connection without a response", EPROTO);
  // Whatever answers on the socket path it was given: bounded like any
  // JSON from another process.
  json j = protocol::parse_json_bounded(std::string_view(reply).substr(0, nl));
  if (j.is_discarded()) return Error::invalid("the daemon sent invalid JSON", EPROTO);
  return j;
}

namespace {

// A script or an agent_state file: no bigger than a request may be.
Result<std::string> read_input_file(const std::string& path) {
  return tsb::read_file(path, {.max_bytes = 64u << 20, .regular_only = true});
}

int usage(const char* verb, const std::string& msg) {
  print_line(stderr, "toolsandbox %s: %s", verb, msg.c_str());
  return kExitUsage;
}

// What a tool printed, as it printed it when `f` is not a terminal (a file
// or a pipe gets the bytes); on a terminal, escaped (lines and tabs kept):
// a tool's output cannot move the cursor, retitle the window or type into
// the operator's shell.
void print_tool_output(std::FILE* f, const std::string& s) {
  if (::isatty(::fileno(f))) {
    print_block(f, s);
  } else {
    std::fwrite(s.data(), 1, s.size(), f);
  }
}

// Prints a run's outcome the way a person wants to read it; the exit status
// says whether the tool succeeded.
int report(const json& resp, bool as_json) {
  if (as_json) {
    std::printf("%s\n", core::dump_json(resp).c_str());
  }
  if (!resp.value("ok", false)) {
    if (!as_json) {
      const json& e = resp["error"];
      print_line(stderr, "toolsandbox: %s: %s", e.value("code", "?").c_str(),
                   e.value("message", "").c_str());
    }
    return 1;
  }
  if (resp.contains("status")) {
    if (!as_json) std::printf("%s\n", resp["status"].dump(2).c_str());
    return 0;
  }
  const json& r = resp["result"];
  if (!as_json) {
    for (const auto& s : r["stdout"]) print_tool_output(stdout, s.get<std::string>());
    for (const auto& s : r["stderr"]) print_tool_output(stderr, s.get<std::string>());
    std::printf("%s\n", core::dump_json(r["func_return"]).c_str());
    const json& rec = r["record"];
    // A local run says whether it took a warm sandbox (policies/README.md,
    // "warm_pool"); E2B's records have no such field.
    const char* warm = !rec.contains("warm") ? "" : rec.value("warm", false) ? ", warm" : ", cold";
    print_line(stderr, "[%s: %s, %.1f ms, policy %s%s]", r.value("status", "?").c_str(),
                 rec.value("end_reason", "?").c_str(), rec.value("wall_ms", 0.0),
                 rec.value("policy", "?").c_str(), warm);
  }
  return r.value("status", "") == "success" ? 0 : 1;
}

// The last top-level function defined in a tool file, as Letta names tools.
std::string last_function(const std::string& src) {
  std::regex def(R"(^(?:async\s+)?def\s+([A-Za-z_][A-Za-z_0-9]*)\s*\()", std::regex::multiline);
  std::string name;
  for (auto it = std::sregex_iterator(src.begin(), src.end(), def); it != std::sregex_iterator(); ++it) name = (*it)[1];
  return name;
}

}  // namespace

int cmd_client(const std::string& verb, const std::vector<std::string>& args) {
  std::string socket_path = kDefaultSocket, org = "default", file, tool_name, args_json = "{}", agent_state_file, policy;
  std::map<std::string, std::string> env;
  std::optional<double> timeout;
  bool as_json = false;
  const char* v = verb.c_str();
  static const std::vector<OptionSpec> kOptions = {
      {"json", nullptr},          {"socket", "a path"},          {"org", "an organization id"},
      {"policy", "a name"},       {"tool-name", "a name"},       {"function", "a name"},
      {"args", "a JSON object"},  {"agent-state", "a JSON file"}, {"timeout", "seconds"},
      {"env", "NAME=VALUE"},
  };
  std::vector<std::string> operands;
  auto err = parse_options(args, kOptions, /*operands_after_dashdash_only=*/false,
                           [&](const std::string& name, const std::string& x) -> std::optional<std::string> {
                             if (name == "json") as_json = true;
                             else if (name == "socket") socket_path = x;
                             else if (name == "org") org = x;
                             else if (name == "policy") policy = x;
                             else if (name == "tool-name" || name == "function") tool_name = x;
                             else if (name == "args") args_json = x;
                             else if (name == "agent-state") agent_state_file = x;
                             else if (name == "timeout") {
                               char* end = nullptr;
                               double t = std::strtod(x.c_str(), &end);
                               if (*end != '\0' || !(t > 0)) return "--timeout needs a positive number of seconds";
                               timeout = t;
                             } else if (name == "env") {
                               if (x.find('=') == std::string::npos || x[0] == '=') return "--env needs NAME=VALUE";
                               env[x.substr(0, x.find('='))] = x.substr(x.find('=') + 1);
                             }
                             return std::nullopt;
                           },
                           &operands);
  if (err) return usage(v, *err);
  if (operands.size() > 1) return usage(v, "unexpected argument '" + operands[1] + "'");
  if (!operands.empty()) file = operands[0];

  json req = {{"v", 1}, {"id", random_hex(8)}};
  if (verb == "status") {
    if (!file.empty()) return usage(v, "takes no file");
    req["type"] = "status";
  } else {
    if (file.empty()) return usage(v, verb == "exec" ? "need a SCRIPT.py" : "need a TOOL.py");
    auto src = read_input_file(file);
    if (!src.ok()) return usage(v, src.error().message);
    if (tool_name.empty()) tool_name = verb == "call" ? last_function(*src) : "script";
    if (tool_name.empty()) return usage(v, "no function found in '" + file + "' (use --function NAME)");
    req["tool_name"] = tool_name;
    req["organization_id"] = org;
    if (!env.empty()) req["env"] = env;
    if (timeout) req["timeout"] = *timeout;
    if (!policy.empty()) req["policy"] = policy;
    if (verb == "exec") {
      req["type"] = "execute";
      req["script"] = *src;
    } else {
      req["type"] = "run_tool";
      req["source_code"] = *src;
      json a = protocol::parse_json_bounded(args_json);
      if (a.is_discarded() || !a.is_object()) return usage(v, "--args must be a JSON object");
      req["args"] = a;
      if (!agent_state_file.empty()) {
        auto s = read_input_file(agent_state_file);
        if (!s.ok()) return usage(v, s.error().message);
        json st = protocol::parse_json_bounded(*s);
        if (st.is_discarded() || !st.is_object()) return usage(v, "--agent-state must hold a JSON object");
        req["agent_state"] = st;
      }
    }
  }
  auto resp = roundtrip(socket_path, req);
  if (!resp.ok()) {
    print_line(stderr, "toolsandbox %s: %s", v, resp.error().message.c_str());
    return 1;
  }
  return report(*resp, as_json);
}

}  // namespace tsb::cli
