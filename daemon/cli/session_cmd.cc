// toolsandbox session: a stdio bridge to a session of toolsandboxd
// (protocol/PROTOCOL.md, "Sessions"). An MCP client that starts its server
// by command gets a sandboxed one by putting `toolsandbox session --` before
// that command: this process's stdin is the server's, the server's stdout
// and stderr come out here, and it exits with the session's status.
#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <variant>

#include "daemon/cli/cli.h"
#include "daemon/common/quote.h"
#include "isolate/base/random.h"
#include "isolate/base/unique_fd.h"
#include "protocol/json_limits.h"
#include "protocol/messages.h"

namespace tsb::cli {

using nlohmann::json;

namespace {

int usage(const std::string& msg) {
  print_line(stderr, "toolsandbox session: %s", msg.c_str());
  return kExitUsage;
}

// Signals are forwarded to the server (session_kill with "signal"). After
// the first SIGINT, SIGTERM, SIGHUP or SIGQUIT the session has this long to
// end; then, or at a second one, the connection closes and the daemon
// kills it. A signal that cannot be forwarded (the session has not started
// its command) ends the server's stdin instead, as an MCP client ends its
// server. SIGUSR1 and SIGUSR2 are only forwarded. A forward that the
// daemon does not answer within a second counts as not forwarded.
constexpr int kSignalGraceMs = 2000;
constexpr int kForwarded[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};

bool write_all(int fd, const char* p, std::size_t n) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<std::size_t>(w);
  }
  return true;
}

// A frame's payload to stdout or stderr: the bytes themselves to a pipe or
// a file (the server's protocol), escaped on a terminal. False when it
// could not be written (the reader is gone).
bool emit(int fd, std::string_view data) {
  if (::isatty(fd)) {
    print_block(fd == STDOUT_FILENO ? stdout : stderr, std::string(data));
    return std::fflush(fd == STDOUT_FILENO ? stdout : stderr) == 0;
  }
  return write_all(fd, data.data(), data.size());
}

long long now_ms() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000LL + ts.tv_nsec / 1000000;
}

// The exit status a session's end record stands for: the command's own
// status or 128 + its signal; 124 at max_lifetime; 125 for any other end
// the daemon decided (idle, limits, client, shutdown), said on stderr.
int status_of(const json& rec) {
  const std::string by = rec.value("ended_by", "");
  const std::string reason = rec.value("end_reason", "");
  if (by == "exit" && reason == "exited" && rec["exit_code"].is_number_integer()) return rec["exit_code"].get<int>();
  if (by == "exit" && reason == "signaled" && rec["signal"].is_number_integer()) return 128 + rec["signal"].get<int>();
  print_line(stderr, "toolsandbox session: the session ended: %s (%s)", by.c_str(), reason.c_str());
  return by == "lifetime" ? kExitTimeout : kExitSetup;
}

}  // namespace

namespace {

struct SessionArgs {
  std::string socket_path = kDefaultSocket, org = "default", policy, agent_id, workspace, record_file;
  std::map<std::string, std::string> env;
  std::vector<std::string> cmd;
};

// Connects and sends the request: the connection, or the exit status.
std::variant<UniqueFd, int> open_session(const SessionArgs& a) {
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (a.socket_path.size() >= sizeof addr.sun_path) return usage("socket path too long");
  std::memcpy(addr.sun_path, a.socket_path.c_str(), a.socket_path.size() + 1);
  if (!fd || ::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    print_line(stderr, "toolsandbox session: connecting to toolsandboxd at '%s': %s", a.socket_path.c_str(),
               std::strerror(errno));
    return kExitSetup;
  }
  json req = {{"v", 1}, {"id", random_hex(8)}, {"type", "session"}, {"organization_id", a.org}, {"command", a.cmd}};
  if (!a.policy.empty()) req["policy"] = a.policy;
  if (!a.env.empty()) req["env"] = a.env;
  if (!a.agent_id.empty()) req["agent_id"] = a.agent_id;
  if (!a.workspace.empty()) req["workspace"] = a.workspace;
  const std::string line = req.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
  if (!write_all(fd.get(), line.data(), line.size())) {
    print_line(stderr, "toolsandbox session: sending the request: %s", std::strerror(errno));
    return kExitSetup;
  }
  return fd;
}

// What came from the daemon, taken as far as it is whole: the answer line,
// then frames. Returns the exit status once the session is over.
struct Incoming {
  std::string in;
  bool answered = false;
  const std::string& record_file;
  std::string session_id;  // the answer's

  std::optional<int> take() {
    for (;;) {
      if (!answered) {
        const auto nl = in.find('\n');
        if (nl == std::string::npos) {
          if (in.size() <= (1u << 20)) return std::nullopt;
          print_line(stderr, "toolsandbox session: the daemon's answer line is too long");
          return kExitSetup;
        }
        json a = protocol::parse_json_bounded(std::string_view(in).substr(0, nl));
        in.erase(0, nl + 1);
        if (a.is_discarded() || !a.is_object()) {
          print_line(stderr, "toolsandbox session: the daemon sent invalid JSON");
          return kExitSetup;
        }
        if (!a.value("ok", false)) {
          const json e = a.value("error", json::object());
          print_line(stderr, "toolsandbox session: %s: %s", e.value("code", "?").c_str(), e.value("message", "").c_str());
          return kExitSetup;
        }
        answered = true;
        if (a.contains("session") && a["session"].is_object() && a["session"].value("session_id", json()).is_string())
          session_id = a["session"]["session_id"].get<std::string>();
        continue;
      }
      if (in.size() < 5) return std::nullopt;
      const std::uint32_t n = (static_cast<std::uint32_t>(static_cast<unsigned char>(in[1])) << 24) |
                              (static_cast<std::uint32_t>(static_cast<unsigned char>(in[2])) << 16) |
                              (static_cast<std::uint32_t>(static_cast<unsigned char>(in[3])) << 8) |
                              static_cast<unsigned char>(in[4]);
      if (n > protocol::kMaxSessionFrame) {
        print_line(stderr, "toolsandbox session: the daemon sent a frame larger than the protocol allows");
        return kExitSetup;
      }
      if (in.size() < 5 + n) return std::nullopt;
      const char kind = in[0];
      const std::string_view payload = std::string_view(in).substr(5, n);
      if (kind == protocol::kSessionStdout) {
        // Whoever reads this process's stdout is gone: so is the session
        // (this process's end closes the connection).
        if (!emit(STDOUT_FILENO, payload)) return 128 + SIGPIPE;
      } else if (kind == protocol::kSessionStderr) {
        (void)emit(STDERR_FILENO, payload);
      } else if (kind == protocol::kSessionEnd) {
        json rec = protocol::parse_json_bounded(payload);
        if (rec.is_discarded() || !rec.is_object()) {
          print_line(stderr, "toolsandbox session: the daemon sent an invalid end record");
          return kExitSetup;
        }
        if (!record_file.empty()) std::ofstream(record_file) << rec.dump() << "\n";
        return status_of(rec);
      } else {
        print_line(stderr, "toolsandbox session: the daemon sent an unknown frame");
        return kExitSetup;
      }
      in.erase(0, 5 + n);
    }
  }
};

// The bridge: stdin to the connection (never more than one read ahead, so a
// command that does not read its stdin never makes this stop reading its
// output), the daemon's frames out, the signals.
int bridge(int fd, int sigfd, const std::string& socket_path, const std::string& record_file) {
  Incoming incoming{{}, false, record_file, {}};
  // A signal to the server's command, on a connection of its own.
  auto forward = [&](int signo) {
    if (incoming.session_id.empty()) return false;
    const std::string_view name = protocol::session_signal_name(signo);
    auto r = roundtrip(socket_path, {{"v", 1}, {"id", random_hex(8)}, {"type", "session_kill"},
                                     {"session_id", incoming.session_id}, {"signal", std::string(name)}},
                       1000);
    return r.ok() && r->value("ok", false);
  };
  std::string out;
  bool stdin_open = true, sent_eof = false;
  long long grace_until = -1;
  int signal_number = 0;  // the first signal's
  char buf[65536];
  auto end_stdin = [&] {
    stdin_open = false;
    if (!sent_eof) ::shutdown(fd, SHUT_WR);
    sent_eof = true;
  };
  for (;;) {
    if (auto status = incoming.take()) return *status;
    pollfd p[3] = {{sigfd, POLLIN, 0},
                   {fd, static_cast<short>(POLLIN | (out.empty() ? 0 : POLLOUT)), 0},
                   {stdin_open && out.empty() && incoming.answered ? STDIN_FILENO : -1, POLLIN, 0}};
    const int timeout = grace_until < 0 ? -1 : static_cast<int>(std::max<long long>(0, grace_until - now_ms()));
    const int r = ::poll(p, 3, timeout);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      print_line(stderr, "toolsandbox session: poll: %s", std::strerror(errno));
      return kExitSetup;
    }
    if (grace_until >= 0 && now_ms() >= grace_until) return 128 + signal_number;
    if (p[0].revents & POLLIN) {
      signalfd_siginfo si{};
      if (::read(sigfd, &si, sizeof si) == sizeof si) {
        const int signo = static_cast<int>(si.ssi_signo);
        const bool ending = signo == SIGINT || signo == SIGTERM || signo == SIGHUP || signo == SIGQUIT;
        if (ending && grace_until >= 0) return 128 + signo;
        const bool forwarded = forward(signo);
        if (ending) {
          signal_number = signo;
          grace_until = now_ms() + kSignalGraceMs;
          if (!forwarded) {
            out.clear();
            end_stdin();
          }
        }
      }
    }
    if (p[1].revents & (POLLIN | POLLHUP | POLLERR)) {
      const ssize_t n = ::read(fd, buf, sizeof buf);
      if (n < 0 && errno != EINTR && errno != EAGAIN) {
        print_line(stderr, "toolsandbox session: reading from the daemon: %s", std::strerror(errno));
        return kExitSetup;
      }
      if (n == 0) {
        print_line(stderr, "toolsandbox session: the daemon closed the session without its end");
        return kExitSetup;
      }
      if (n > 0) incoming.in.append(buf, static_cast<std::size_t>(n));
    }
    if ((p[1].revents & POLLOUT) && !out.empty()) {
      const ssize_t n = ::send(fd, out.data(), out.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n > 0) out.erase(0, static_cast<std::size_t>(n));
      if (n < 0 && errno != EAGAIN && errno != EINTR) out.clear();  // the daemon's read side is gone; its end tells
      if (out.empty() && !stdin_open) end_stdin();
    }
    if (p[2].fd >= 0 && (p[2].revents & (POLLIN | POLLHUP | POLLERR))) {
      const ssize_t n = ::read(STDIN_FILENO, buf, sizeof buf);
      if (n > 0)
        out.assign(buf, static_cast<std::size_t>(n));
      else if (n == 0 || (errno != EINTR && errno != EAGAIN))
        end_stdin();  // the command's stdin ends
    }
  }
}


// toolsandbox session list | kill [--signal NAME] ID: the operator's requests
// (a signal also the session's own client's).
int operator_verb(const std::vector<std::string>& args) {
  const std::string& verb = args[0];
  std::string socket_path = kDefaultSocket;
  bool as_json = false;
  std::string signal_name;
  static const std::vector<OptionSpec> kOptions = {{"socket", "a path"}, {"json", nullptr}, {"signal", "a name"}};
  std::vector<std::string> operands;
  auto err = parse_options(std::vector<std::string>(args.begin() + 1, args.end()), kOptions, false,
                           [&](const std::string& name, const std::string& x) -> std::optional<std::string> {
                             if (name == "socket") socket_path = x;
                             else if (name == "json") as_json = true;
                             else if (name == "signal") signal_name = x.starts_with("SIG") ? x.substr(3) : x;
                             return std::nullopt;
                           },
                           &operands);
  if (err) return usage(*err);
  if (operands.size() != (verb == "kill" ? 1u : 0u))
    return usage(verb == "kill" ? "kill takes one session id" : "list takes no argument");
  json req = {{"v", 1}, {"id", random_hex(8)}, {"type", verb == "kill" ? "session_kill" : "session_list"}};
  if (!signal_name.empty() && verb != "kill") return usage("--signal is for kill");
  if (verb == "kill") req["session_id"] = operands[0];
  if (!signal_name.empty()) req["signal"] = signal_name;
  auto resp = roundtrip(socket_path, req);
  if (!resp.ok()) {
    print_line(stderr, "toolsandbox session %s: %s", verb.c_str(), resp.error().message.c_str());
    return 1;
  }
  if (!resp->value("ok", false)) {
    const json e = resp->value("error", json::object());
    print_line(stderr, "toolsandbox session %s: %s: %s", verb.c_str(), e.value("code", "?").c_str(),
               e.value("message", "").c_str());
    return 1;
  }
  if (verb == "kill") {
    if (!signal_name.empty())
      print_line(stdout, "sent SIG%s to %s", resp->value("signal", "").c_str(), resp->value("killed", "").c_str());
    else
      print_line(stdout, "ending %s", resp->value("killed", "").c_str());
    return 0;
  }
  const json list = resp->value("sessions", json::array());
  const json kept = resp->value("workspaces", json::array());
  if (as_json) {
    print_line(stdout, "%s", json{{"sessions", list}, {"workspaces", kept}}.dump().c_str());
    return 0;
  }
  print_line(stdout, "%-16s  %-20s  %-12s  %-24s  %8s  %8s  %10s  %10s", "SESSION", "ORGANIZATION", "POLICY", "PROGRAM",
             "AGE", "IDLE", "IN", "OUT");
  for (const json& s : list)
    print_line(stdout, "%-16s  %-20s  %-12s  %-24s  %7.0fs  %7.0fs  %10llu  %10llu", s.value("session_id", "").c_str(),
               s.value("organization_id", "").c_str(), s.value("policy", "").c_str(), s.value("program", "").c_str(),
               s.value("age_s", 0.0), s.value("idle_s", 0.0),
               static_cast<unsigned long long>(s.value("bytes_in", 0ull)),
               static_cast<unsigned long long>(s.value("bytes_out", 0ull)));
  if (kept.empty()) return 0;
  print_line(stdout, "%s", "");
  print_line(stdout, "%-16s  %-20s  %-20s  %-12s  %8s  %8s  %8s", "WORKSPACE", "ORGANIZATION", "NAME", "POLICY",
             "SESSIONS", "AGE", "IDLE");
  for (const json& w : kept)
    print_line(stdout, "%-16s  %-20s  %-20s  %-12s  %8llu  %7.0fs  %7.0fs", w.value("workspace_id", "").c_str(),
               w.value("organization_id", "").c_str(), w.value("name", "").c_str(), w.value("policy", "").c_str(),
               static_cast<unsigned long long>(w.value("sessions", 0ull)), w.value("age_s", 0.0),
               w.value("in_use", false) ? 0.0 : w.value("idle_s", 0.0));
  return 0;
}

}  // namespace

int cmd_session(const std::vector<std::string>& args) {
  if (!args.empty() && (args[0] == "list" || args[0] == "kill")) return operator_verb(args);
  SessionArgs a;
  static const std::vector<OptionSpec> kOptions = {
      {"socket", "a path"}, {"org", "an organization id"}, {"policy", "a name"},
      {"env", "NAME=VALUE"}, {"agent-id", "an id"},        {"record", "a file"},
      {"workspace", "a name"},
  };
  auto err = parse_options(args, kOptions, /*operands_after_dashdash_only=*/true,
                           [&](const std::string& name, const std::string& x) -> std::optional<std::string> {
                             if (name == "socket") a.socket_path = x;
                             else if (name == "org") a.org = x;
                             else if (name == "policy") a.policy = x;
                             else if (name == "agent-id") a.agent_id = x;
                             else if (name == "workspace") a.workspace = x;
                             else if (name == "record") a.record_file = x;
                             else if (name == "env") {
                               if (x.find('=') == std::string::npos || x[0] == '=') return "--env needs NAME=VALUE";
                               a.env[x.substr(0, x.find('='))] = x.substr(x.find('=') + 1);
                             }
                             return std::nullopt;
                           },
                           &a.cmd);
  if (err) return usage(*err);
  if (a.cmd.empty()) return usage("need a command after -- (toolsandbox session [options] -- COMMAND ARGS...)");
  // Signals are read from a descriptor, not handled: the bridge's loop
  // stays the only place anything happens. SIGPIPE: a reader of stdout
  // gone shows as a failed write.
  sigset_t sigs;
  sigemptyset(&sigs);
  for (int s : kForwarded) sigaddset(&sigs, s);
  ::sigprocmask(SIG_BLOCK, &sigs, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
  UniqueFd sigfd(::signalfd(-1, &sigs, SFD_CLOEXEC | SFD_NONBLOCK));
  if (!sigfd) {
    print_line(stderr, "toolsandbox session: signalfd: %s", std::strerror(errno));
    return kExitSetup;
  }
  auto conn = open_session(a);
  if (auto* status = std::get_if<int>(&conn)) return *status;
  return bridge(std::get<UniqueFd>(conn).get(), sigfd.get(), a.socket_path, a.record_file);
}

}  // namespace tsb::cli
