// toolsandboxd: the root spawner, the process systemd starts.
//
//   toolsandboxd [--config FILE] [--check] [--version]
//
// Loads the configuration and policies through the compile helper, creates
// the engine and the listening socket, and runs the unprivileged front end
// (toolsandboxd-frontend) that serves clients. Without --config it reads
// TSB_SYSCONFDIR/toolsandboxd.json if present (/etc/toolsandboxd for a
// /usr prefix, /usr/local/etc/toolsandboxd for /usr/local; --help says),
// else the embedded defaults. SIGHUP reloads; SIGTERM and SIGINT stop after in-flight runs
// (shutdown_grace). docs/ARCHITECTURE.md, "Privilege separation".
#include <getopt.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "daemon/spawner/spawner.h"

namespace {

// Every run takes descriptors (pipes, a pidfd, cgroup files); the hard limit
// is what the operator granted (LimitNOFILE=), and the front end inherits it.
void raise_open_files_limit() {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) return;
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

// Says why the spawner cannot start; its exit status.
int critical(const std::string& message) {
  spdlog::critical("{}", message);
  return 1;
}

// toolsandboxd-frontend: next to this program (a build tree), in the
// libexec directory beside its own (an installed tree, wherever its prefix
// or DESTDIR put it), else in the configured libexec directory.
std::string find_front_end() {
  char self[4096];
  ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  if (n > 0) {
    std::string dir(self, static_cast<std::size_t>(n));
    dir.resize(dir.rfind('/'));
    for (const std::string& cand : {dir + "/toolsandboxd-frontend", dir + "/../libexec/toolsandbox/toolsandboxd-frontend"})
      if (::access(cand.c_str(), X_OK) == 0) return cand;
  }
  return std::string(TSB_LIBEXECDIR) + "/toolsandboxd-frontend";
}

}  // namespace

int main(int argc, char** argv) {
  tsb::spawn::SpawnerOptions opts;
  opts.config_path = std::string(TSB_SYSCONFDIR) + "/toolsandboxd.json";
  bool explicit_config = false, check_only = false;
  static const option kOptions[] = {
      {"config", required_argument, nullptr, 'c'},
      {"check", no_argument, nullptr, 'k'},
      {"version", no_argument, nullptr, 'V'},
      {"help", no_argument, nullptr, 'h'},
      {nullptr, 0, nullptr, 0},
  };
  constexpr const char* kUsage = "usage: toolsandboxd [--config FILE] [--check] [--version]\n";
  for (int c; (c = ::getopt_long(argc, argv, "", kOptions, nullptr)) != -1;) {
    switch (c) {
      case 'c':
        opts.config_path = optarg;
        explicit_config = true;
        break;
      case 'k': check_only = true; break;
      case 'V': std::printf("toolsandboxd %s\n", TSB_VERSION); return 0;
      case 'h': std::printf("%sdefault configuration: %s\n", kUsage, opts.config_path.c_str()); return 0;
      default: std::fputs(kUsage, stderr); return 2;  // getopt said what was wrong
    }
  }
  if (optind < argc) {
    std::fprintf(stderr, "toolsandboxd: unexpected argument '%s'\n%s", argv[optind], kUsage);
    return 2;
  }
  // Logs go to stderr (the journal under systemd): the compile helper's
  // stdout carries the compiled set.
  spdlog::set_default_logger(spdlog::stderr_logger_st("toolsandboxd"));
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %l %v");
  opts.front_end = find_front_end();
  if (::access(opts.front_end.c_str(), X_OK) != 0)
    return critical(tsb::Error::from_errno("the front end " + opts.front_end + " is missing").message);
  // The helper's own messages (the configuration, each policy) go to stderr.
  // At the start it also prepares the host for the engine.
  if (!check_only && ::geteuid() != 0)
    return critical("toolsandboxd must run as root (it creates namespaces, cgroups and id maps)");
  tsb::UniqueFd sources;
  auto set = tsb::spawn::compile_policies(opts, !explicit_config,
                                          check_only ? tsb::spawn::Compile::kCheck : tsb::spawn::Compile::kSetup,
                                          &sources);
  if (!set.ok()) return critical(set.error().message);
  if (check_only) return 0;
  raise_open_files_limit();
  auto engine = tsb::isolate::Engine::create(set->engine, set->init_filter);
  if (!engine.ok()) return critical("engine: " + engine.error().message);
  spdlog::info("engine: {}", (*engine)->cgroups().describe());
  for (const auto& note : (*engine)->startup_notes()) spdlog::warn("engine: {}", note);
  tsb::spawn::Spawner spawner(opts, std::move(set).value(), std::move(sources), std::move(engine).value());
  if (auto st = spawner.open_listener(); !st.ok()) return critical(st.error().message);
  return spawner.run();
}
