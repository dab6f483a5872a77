// toolsandboxd-frontend: the unprivileged side of toolsandboxd, started by
// the root spawner (daemon/spawner/), never by hand.
//
//   --serve --config FILE --sources-fd N --listen-fd N --control-fd N
//           [--e2b-key-fd N]
//       the front end: the listening socket, peers, the protocol, Letta
//       shaping, E2B, audit and counters. Refuses to run with uid 0, any
//       capability, or without no_new_privs; loads its own seccomp filter.
//       Opens no configuration or policy file: it loads them from the
//       compile helper's record (--sources-fd, daemon/policy/sources.h).
//   --compile --config FILE [--config-optional] [--setup] --sources-fd N
//       the compile helper: loads the configuration and policies, writes
//       the compiled set the spawner reads (daemon/wire/compiled.h) to
//       stdout and the record of the files it read to the memfd N; with
//       --setup (the spawner's start), first prepares what the engine needs
//       on the host (daemon/compile/prepare.h). Run as uid 0 with no capability.
//   --check --config FILE [--config-optional]
//       loads and reports, writes nothing (toolsandboxd --check).
#include <getopt.h>
#include <malloc.h>
#include <pwd.h>
#include <grp.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <asio/io_context.hpp>
#include <csignal>
#include <cstdio>
#include <cerrno>
#include <cstring>
#include <string>

#include "daemon/policy/config.h"
#include "daemon/frontend/e2b/e2b.h"
#include "daemon/policy/registry.h"
#include "daemon/frontend/server.h"
#include "daemon/frontend/local/spawner_link.h"
#include "daemon/frontend/confine.h"
#include "daemon/policy/seccomp_profile.h"
#include "daemon/policy/sources.h"
#include "daemon/compile/helper.h"
#include "daemon/common/log.h"
#include "daemon/common/quote.h"
#include "daemon/frontend/local/front_codec.h"

namespace {

using tsb::quoted_for_message;

enum class Mode { None, Serve, Compile, Check };

struct Args {
  Mode mode = Mode::None;
  std::string config;
  bool config_optional = false;
  bool setup = false;
  int listen_fd = -1, control_fd = -1, e2b_key_fd = -1, sources_fd = -1;
};

bool parse_fd(const char* s, int* out) {
  char* end = nullptr;
  long v = std::strtol(s, &end, 10);
  if (!*s || *end || v < 3 || v > 1024) return false;
  *out = static_cast<int>(v);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  static const option kOptions[] = {
      {"serve", no_argument, nullptr, 's'},       {"compile", no_argument, nullptr, 'C'},
      {"check", no_argument, nullptr, 'k'},       {"config", required_argument, nullptr, 'c'},
      {"config-optional", no_argument, nullptr, 'o'}, {"listen-fd", required_argument, nullptr, 'l'},
      {"control-fd", required_argument, nullptr, 'f'}, {"e2b-key-fd", required_argument, nullptr, 'e'},
      {"setup", no_argument, nullptr, 'S'},       {"sources-fd", required_argument, nullptr, 'r'},
      {nullptr, 0, nullptr, 0},
  };
  constexpr const char* kUsage =
      "usage: toolsandboxd-frontend --serve|--compile [--setup]|--check --config FILE [--config-optional]\n"
      "       [--sources-fd N] [--listen-fd N --control-fd N [--e2b-key-fd N]]\n"
      "(started by toolsandboxd; not meant to be run by hand)\n";
  opterr = 0;
  for (int c; (c = ::getopt_long(argc, argv, "", kOptions, nullptr)) != -1;) {
    switch (c) {
      case 's': a.mode = Mode::Serve; break;
      case 'C': a.mode = Mode::Compile; break;
      case 'k': a.mode = Mode::Check; break;
      case 'c': a.config = optarg; break;
      case 'o': a.config_optional = true; break;
      case 'S': a.setup = true; break;
      case 'l':
      case 'f':
      case 'e':
      case 'r':
        if (!parse_fd(optarg, c == 'l'   ? &a.listen_fd
                              : c == 'f' ? &a.control_fd
                              : c == 'e' ? &a.e2b_key_fd
                                         : &a.sources_fd)) {
          std::fprintf(stderr, "toolsandboxd-frontend: '%s' is not a descriptor number\n", optarg);
          return 2;
        }
        break;
      default:
        std::fprintf(stderr, "toolsandboxd-frontend: bad option '%s'\n", argv[optind - 1]);
        std::fputs(kUsage, stderr);
        return 2;
    }
  }
  if (a.mode == Mode::None || a.config.empty() || optind < argc ||
      (a.mode != Mode::Check && a.sources_fd < 0) ||
      (a.mode == Mode::Serve && (a.listen_fd < 0 || a.control_fd < 0))) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  // Logs go to stderr (the journal under systemd): the compile helper's
  // stdout carries the compiled set.
  // Each message is escaped as it goes out (daemon/common/log.h).
  spdlog::set_default_logger(spdlog::stderr_logger_st("toolsandboxd"));
  spdlog::set_formatter(tsb::log_line_formatter());
  // Memory a big request used must go back to the kernel when it is freed:
  // a fixed mmap threshold keeps every block of 128 KiB or more in its own
  // mapping (glibc's default raises it after the first large free).
  ::mallopt(M_MMAP_THRESHOLD, 128 * 1024);

  if (a.mode == Mode::Serve) {
    // Before anything is read: this process must hold no privilege at all.
    if (auto st = tsb::frontend::check_unprivileged(); !st.ok()) {
      spdlog::critical("front end: {}", st.error().message);
      return 1;
    }
    // Names are looked up as they are written, never with the host's search
    // domains appended (resolv.conf(5): LOCALDOMAIN replaces the search
    // list; empty, there is none): the egress proxy checks the name a tool
    // asked for, and "x.example.com" must not become
    // "x.example.com.corp.internal" when it does not exist. Set while this
    // process has one thread, before any lookup.
    if (::setenv("LOCALDOMAIN", "", 1) != 0) {
      spdlog::critical("front end: cannot set LOCALDOMAIN: {}", std::strerror(errno));
      return 1;
    }
  }
  // The compile helper reads the files (and records them); the front end
  // loads the record it made, and reads no file.
  tsb::core::SourceFiles files;
  if (a.mode == Mode::Serve) {
    auto rec = tsb::core::read_source_record(a.sources_fd);
    if (!rec.ok()) {
      spdlog::critical("front end: {}", rec.error().message);
      return 1;
    }
    files = std::move(rec).value();
    ::close(a.sources_fd);
  }
  // Serving, a missing file is one the helper was allowed to miss: the
  // record says whether it existed.
  auto cfg = tsb::core::load_daemon_config(a.config, a.config_optional || a.mode == Mode::Serve, &files);
  if (!cfg.ok()) {
    spdlog::critical("{}", cfg.error().message);
    return 1;
  }
  auto set = tsb::core::load_policy_set(*cfg, &files);
  if (!set.ok()) {
    spdlog::critical("{}", set.error().message);
    return 1;
  }
  if (a.mode != Mode::Serve)
    return tsb::compile::run_helper(a.config, *cfg, **set, files,
                                    a.mode == Mode::Check ? tsb::compile::HelperMode::kCheck
                                    : a.setup             ? tsb::compile::HelperMode::kSetup
                                                          : tsb::compile::HelperMode::kCompile,
                                    a.sources_fd);

  // A write to a run's stdin pipe after the run ended (killed, or it never
  // read its input) must fail with EPIPE, not kill the front end: the
  // spawner starts this process with default dispositions. Client sockets
  // are written with MSG_NOSIGNAL, but pipes have no such flag.
  if (::signal(SIGPIPE, SIG_IGN) == SIG_ERR) {
    spdlog::critical("front end: cannot ignore SIGPIPE: {}", std::strerror(errno));
    return 1;
  }
  // The front end: its own seccomp filter before the first byte of a client.
  if (auto st = tsb::frontend::load_front_end_filter(); !st.ok()) {
    spdlog::critical("front end: {}", st.error().message);
    return 1;
  }
  // SIGHUP is the spawner's: it reloads, then tells this process.
  ::signal(SIGHUP, SIG_IGN);
  asio::io_context io(1);
  auto link = std::make_unique<tsb::core::SpawnerLink>(io, tsb::UniqueFd(a.control_fd));
  if (auto st = link->handshake(); !st.ok()) {
    spdlog::critical("front end: {}", st.error().message);
    return 1;
  }
  tsb::core::Server server(io, a.config, *cfg, std::move(link), std::move(set).value());
  if (auto st = server.open_listener(a.listen_fd, tsb::UniqueFd(a.e2b_key_fd)); !st.ok()) {
    spdlog::critical("{}", st.error().message);
    return 1;
  }
  server.start();
  io.run();
  spdlog::info("front end stopped");
  return server.exit_code();
}
