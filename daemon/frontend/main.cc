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
//       the compiled set the spawner reads (daemon/spawner/compiled.h) to
//       stdout and the record of the files it read to the memfd N; with
//       --setup (the spawner's start), first prepares what the engine needs
//       on the host (isolate/prepare.h). Run as uid 0 with no capability.
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

#include "daemon/core/config.h"
#include "daemon/core/e2b.h"
#include "daemon/core/registry.h"
#include "daemon/core/server.h"
#include "daemon/core/spawner_link.h"
#include "daemon/frontend/confine.h"
#include "daemon/policy/seccomp_profile.h"
#include "daemon/policy/sources.h"
#include "isolate/base/quote.h"
#include "daemon/spawner/front_codec.h"

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

// What a local policy's sandboxes need of the host that no set-up step
// makes: its venv, with the interpreter the policy runs from it. A start
// (or a reload, or --check) without it is refused: its runs could only
// fail. It is named, with the command that makes it.
tsb::Status check_venv(const tsb::core::Policy& p) {
  if (p.backend != tsb::core::Backend::Local || p.venv.empty()) return {};
  const std::string venv_dir = std::string(tsb::isolate::kVenvPath) + "/";
  std::string need = p.venv;
  if (p.interpreter.starts_with(venv_dir)) need += "/" + p.interpreter.substr(venv_dir.size());
  struct stat st{};
  if (::stat(need.c_str(), &st) == 0) return {};
  const int err = errno;
  return tsb::Error::from_errno(err, "policy " + quoted_for_message(p.name) + ": its venv needs " + need +
                                " (create the venv: /usr/bin/python3 -m venv " + p.venv +
                                "; ./scripts/start.sh makes the default one)");
}

tsb::Result<tsb::spawn::CompiledSet> compile(const tsb::core::DaemonConfig& cfg, const tsb::core::PolicySet& set,
                                              bool setup) {
  using tsb::Error;
  tsb::spawn::CompiledSet out;
  out.engine = cfg.engine;
  // What the engine needs from the host, read here: the root spawner
  // parses no text.
  // At the spawner's start (not at a reload: engine settings need a
  // restart), what the engine needs on the host is prepared here, with no
  // capability: the spawner's root process creates none of it.
  if (setup) {
    if (auto st = tsb::policy::prepare_engine(out.engine, ::getppid()); !st.ok()) return std::move(st).error().wrap("engine");
  }
  auto init = tsb::policy::compile_init_filter();
  if (!init.ok()) return std::move(init).error().wrap("compiling the init filter");
  out.init_filter = std::move(init).value();
  out.socket_path = cfg.socket_path;
  out.socket_mode = cfg.socket_mode;
  if (!cfg.socket_group.empty()) {
    group* g = ::getgrnam(cfg.socket_group.c_str());
    if (!g) return Error::invalid("socket group " + quoted_for_message(cfg.socket_group) + " does not exist");
    out.socket_gid = g->gr_gid;
  }
  passwd* pw = ::getpwnam(cfg.front_end_user.c_str());
  if (!pw)
    return Error::invalid("front_end_user: no user " + quoted_for_message(cfg.front_end_user) +
                          " (systemd-sysusers creates it from toolsandboxd.sysusers; or useradd --system " +
                          cfg.front_end_user + ")");
  if (pw->pw_uid == 0) return Error::invalid("front_end_user: " + quoted_for_message(cfg.front_end_user) + " is uid 0");
  out.front_end_user = cfg.front_end_user;
  out.front_end_uid = pw->pw_uid;
  out.front_end_gid = pw->pw_gid;
  out.e2b_key_file = cfg.e2b.enabled ? cfg.e2b.api_key_file : "";
  // The front end refuses a key file of the wrong owner or mode, or one
  // that holds no single key: so does the set (read here, as uid 0 with no
  // capability, and forgotten), or a reload would be in force in the
  // spawner and refused by the front end, the two then parting ways on the
  // policies.
  if (cfg.e2b.enabled)
    if (auto k = tsb::core::read_e2b_api_key(cfg.e2b.api_key_file); !k.ok())
      return std::move(k).error().wrap("e2b.api_key_file");
  const std::string runner = tsb::core::find_runner(cfg.runner_path);
  out.max_concurrent_runs = cfg.max_concurrent_runs;
  out.shutdown_grace = cfg.shutdown_grace;
  for (const auto& [name, p] : set.policies) {
    if (!p->seccomp) return Error::invalid("policy " + quoted_for_message(name) + " has no compiled seccomp program");
    TSB_TRY(check_venv(*p), "the host");
    auto sp = tsb::core::to_spawn_policy(*p, runner, cfg.venvs.cache_dir);
    if (!sp.ok()) return std::move(sp).error();
    out.policies.push_back(std::move(sp).value());
    out.policies.back().name = name;
    // Per-tool venvs: the policy's build policy, when the builder is
    // installed (without it, a run with requirements is told so).
    const std::string builder = tsb::core::find_venv_builder(runner);
    if (p->packages.enabled && p->backend == tsb::core::Backend::Local && !builder.empty()) {
      auto bp = tsb::core::to_build_spawn_policy(*p, builder);
      if (!bp.ok()) return std::move(bp).error();
      out.policies.push_back(std::move(bp).value());
      out.policies.back().name = name + "/build";
    }
  }
  return out;
}

int write_all(int fd, const std::string& b) {
  std::size_t off = 0;
  while (off < b.size()) {
    ssize_t n = ::write(fd, b.data() + off, b.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return -1;
    off += static_cast<std::size_t>(n);
  }
  return 0;
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
  spdlog::set_default_logger(spdlog::stderr_logger_st("toolsandboxd"));
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %l %v");
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
  if (a.mode != Mode::Serve) {
    if (cfg->source == tsb::core::DaemonConfig{}.source)
      spdlog::info("configuration: {} (no file at '{}'; SIGHUP loads it once it exists)", cfg->source, a.config);
    else
      spdlog::info("configuration: {}", cfg->source);
    for (const auto& [name, p] : (*set)->policies)
      spdlog::info("policy {} {} ({})", quoted_for_message(name), p->fingerprint, p->source);
    if (auto w = tsb::core::policy_set_warning(*cfg, **set); !w.empty()) spdlog::warn("{}", w);
    auto compiled = compile(*cfg, **set, a.setup && a.mode == Mode::Compile);
    if (!compiled.ok()) {
      spdlog::critical("{}", compiled.error().message);
      return 1;
    }
    if (a.mode == Mode::Check) return 0;
    if (auto st = tsb::core::write_source_record(a.sources_fd, files); !st.ok()) {
      spdlog::critical("{}", st.error().message);
      return 1;
    }
    return write_all(STDOUT_FILENO, tsb::spawn::encode_compiled_set(*compiled)) == 0 ? 0 : 1;
  }

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
