// toolsandboxd: the daemon.
//
//   toolsandboxd [--config FILE] [--check]
//
// Without --config it reads /etc/toolsandboxd/toolsandboxd.json if present,
// else runs on its embedded defaults (policies compiled into the binary).
#include <spdlog/spdlog.h>

#include <asio/io_context.hpp>
#include <cstdio>
#include <cstring>
#include <string>

#include "daemon/core/config.h"
#include "daemon/core/registry.h"
#include "daemon/core/server.h"
#include "isolate/jsonc.h"

int main(int argc, char** argv) {
  std::string config_path = std::string(TSB_SYSCONFDIR) + "/toolsandboxd.json";
  bool explicit_config = false, check_only = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--config" && i + 1 < argc) {
      config_path = argv[++i];
      explicit_config = true;
    } else if (a == "--check") {
      check_only = true;
    } else if (a == "--version") {
      std::printf("toolsandboxd %s\n", TSB_VERSION);
      return 0;
    } else {
      std::fprintf(stderr, "usage: toolsandboxd [--config FILE] [--check]\n");
      return 2;
    }
  }
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %l %v");
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
  spdlog::info("configuration: {}", cfg->source);
  for (const auto& [name, p] : (*set)->policies)
    spdlog::info("policy {} {} ({})", tsb::quoted_for_message(name), p->fingerprint, p->source);
  if (check_only) return 0;

  auto engine = tsb::isolate::Engine::create(cfg->engine);
  if (!engine.ok()) {
    spdlog::critical("engine: {}", engine.error().message);
    return 1;
  }
  spdlog::info("engine: {}", (*engine)->cgroups().describe());

  asio::io_context io(1);
  tsb::core::Server server(io, explicit_config || cfg->source != "<embedded defaults>" ? config_path : std::string(), *cfg,
                           std::move(engine).value(), std::move(set).value());
  if (auto st = server.open_listener(); !st.ok()) {
    spdlog::critical("{}", st.error().message);
    return 1;
  }
  server.start();
  io.run();
  spdlog::info("stopped");
  return server.exit_code();
}
