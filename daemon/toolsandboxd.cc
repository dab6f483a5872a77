// toolsandboxd: the daemon.
//
//   toolsandboxd [--config FILE] [--check] [--version]
//
// Without --config it reads /etc/toolsandboxd/toolsandboxd.json if present,
// else runs on its embedded defaults (policies compiled into the binary).
// SIGHUP re-reads the same file; a file that is missing or unreadable then
// keeps the set in force.
#include <getopt.h>
#include <malloc.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>

#include <asio/io_context.hpp>
#include <cstdio>
#include <cstring>
#include <string>

#include "daemon/core/config.h"
#include "daemon/policy/seccomp_profile.h"
#include "daemon/core/registry.h"
#include "daemon/core/server.h"
#include "daemon/policy/jsonc.h"

namespace {

// Every connection and every run takes descriptors (a run: pipes, a pidfd,
// cgroup files). The soft limit a shell gives (1024) is far below what
// max_connections allows; the hard limit is what the operator granted.
void raise_open_files_limit() {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) {
    spdlog::warn("getrlimit RLIMIT_NOFILE: {}", std::strerror(errno));
    return;
  }
  if (rl.rlim_cur < rl.rlim_max) {
    rlim_t was = rl.rlim_cur;
    rl.rlim_cur = rl.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &rl) != 0) {
      spdlog::warn("raising RLIMIT_NOFILE from {} to {}: {}", was, rl.rlim_max, std::strerror(errno));
      return;
    }
  }
  spdlog::info("open files limit: {}", rl.rlim_cur);
}

}  // namespace

int main(int argc, char** argv) {
  std::string config_path = std::string(TSB_SYSCONFDIR) + "/toolsandboxd.json";
  bool explicit_config = false, check_only = false;
  static const option kOptions[] = {
      {"config", required_argument, nullptr, 'c'},
      {"check", no_argument, nullptr, 'k'},
      {"version", no_argument, nullptr, 'V'},
      {"help", no_argument, nullptr, 'h'},
      {nullptr, 0, nullptr, 0},
  };
  constexpr const char* kUsage = "usage: toolsandboxd [--config FILE] [--check] [--version]\n";
  opterr = 0;  // our own messages: one line, then the usage
  for (int c; (c = ::getopt_long(argc, argv, "", kOptions, nullptr)) != -1;) {
    switch (c) {
      case 'c':
        config_path = optarg;
        explicit_config = true;
        break;
      case 'k': check_only = true; break;
      case 'V': std::printf("toolsandboxd %s\n", TSB_VERSION); return 0;
      case 'h': std::fputs(kUsage, stdout); return 0;
      default:
        if (optopt != 0 && std::strchr(argv[optind - 1], '=') != nullptr)
          std::fprintf(stderr, "toolsandboxd: option '%s' takes no value\n", argv[optind - 1]);
        else if (optopt != 0)
          std::fprintf(stderr, "toolsandboxd: option '%s' needs a value\n", argv[optind - 1]);
        else
          std::fprintf(stderr, "toolsandboxd: unknown option '%s'\n", argv[optind - 1]);
        std::fputs(kUsage, stderr);
        return 2;
    }
  }
  if (optind < argc) {
    std::fprintf(stderr, "toolsandboxd: unexpected argument '%s'\n", argv[optind]);
    std::fputs(kUsage, stderr);
    return 2;
  }
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %l %v");
  // Memory a big request used must go back to the kernel when it is freed.
  // glibc's default raises its mmap threshold after the first large block is
  // freed (up to 32 MiB), after which request-sized buffers come from the
  // heap and stay resident. A fixed threshold keeps every block of 128 KiB
  // or more in its own mapping (returned by free, grown by mremap) and also
  // fixes the heap's trim threshold at its default.
  ::mallopt(M_MMAP_THRESHOLD, 128 * 1024);
  auto cfg = tsb::core::load_daemon_config(config_path, !explicit_config);
  if (!cfg.ok()) {
    spdlog::critical("{}", cfg.error().message);
    return 1;
  }
  auto set = tsb::core::load_policy_set(*cfg);
  if (!set.ok()) {
    spdlog::critical("{}", set.error().message);
    return 1;
  }
  if (cfg->source == tsb::core::DaemonConfig{}.source)
    spdlog::info("configuration: {} (no file at '{}'; SIGHUP loads it once it exists)", cfg->source, config_path);
  else
    spdlog::info("configuration: {}", cfg->source);
  for (const auto& [name, p] : (*set)->policies)
    spdlog::info("policy {} {} ({})", tsb::quoted_for_message(name), p->fingerprint, p->source);
  if (check_only) return 0;
  raise_open_files_limit();

  auto engine = tsb::policy::create_engine(cfg->engine);
  if (!engine.ok()) {
    spdlog::critical("engine: {}", engine.error().message);
    return 1;
  }
  spdlog::info("engine: {}", (*engine)->cgroups().describe());
  // What the engine found at start-up: leaves of dead engines it reclaimed,
  // kernel features it lacks.
  for (const auto& note : (*engine)->startup_notes()) spdlog::warn("engine: {}", note);

  asio::io_context io(1);
  tsb::core::Server server(io, config_path, *cfg, std::move(engine).value(), std::move(set).value());
  if (auto st = server.open_listener(); !st.ok()) {
    spdlog::critical("{}", st.error().message);
    return 1;
  }
  server.start();
  io.run();
  spdlog::info("stopped");
  return server.exit_code();
}
