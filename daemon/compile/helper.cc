#include "daemon/compile/helper.h"

#include <grp.h>
#include <pwd.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "daemon/common/quote.h"
#include "daemon/compile/host.h"
#include "daemon/compile/prepare.h"
#include "daemon/compile/spawn_policy.h"
#include "daemon/compile/set_codec.h"
#include "daemon/wire/compiled.h"
#include "isolate/engine/plan.h"

namespace tsb::compile {
namespace {

using tsb::quoted_for_message;

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
  // Runs and sessions together: the front end keeps each within its own
  // bound (max_concurrent_runs, max_sessions), so sessions never take a
  // run's place.
  out.max_concurrent_runs = cfg.max_concurrent_runs + cfg.max_sessions;
  out.shutdown_grace = cfg.shutdown_grace;
  for (const auto& [name, p] : set.policies) {
    if (!p->seccomp) return Error::invalid("policy " + quoted_for_message(name) + " has no compiled seccomp program");
    TSB_TRY(check_venv(*p), "the host");
    auto sp = tsb::core::to_spawn_policy(*p, runner, cfg.venvs.cache_dir);
    if (!sp.ok()) return std::move(sp).error().wrap("policy " + quoted_for_message(name));
    out.policies.push_back(std::move(sp).value());
    out.policies.back().name = name;
    // Per-tool venvs: the policy's build policy, when the builder is
    // installed (without it, a run with requirements is told so).
    const std::string builder = tsb::core::find_venv_builder(runner);
    if (p->packages.enabled && p->backend == tsb::core::Backend::Local && !builder.empty()) {
      auto bp = tsb::core::to_build_spawn_policy(*p, builder);
      if (!bp.ok()) return std::move(bp).error().wrap("policy " + quoted_for_message(name) + "'s venv builds");
      out.policies.push_back(std::move(bp).value());
      out.policies.back().name = name + "/build";
    }
    // TypeScript tools: the policy's runs under node, when the TypeScript
    // runner is installed (node itself is looked for at run time: a host
    // without it still starts).
    const std::string ts_runner = tsb::core::find_ts_runner(runner);
    if (p->typescript.enabled && p->backend == tsb::core::Backend::Local && !ts_runner.empty()) {
      auto tp = tsb::core::to_typescript_spawn_policy(*p, ts_runner, cfg.venvs.cache_dir);
      if (!tp.ok()) return std::move(tp).error().wrap("policy " + quoted_for_message(name) + "'s TypeScript runs");
      out.policies.push_back(std::move(tp).value());
      out.policies.back().name = name + "/typescript";
    }
    // Sessions: the policy's long-lived sandboxes, and its kept workspaces'.
    if (p->sessions.enabled && p->backend == tsb::core::Backend::Local) {
      for (const bool workspace : {false, true}) {
        if (workspace && !p->sessions.workspace) break;
        auto sp = tsb::core::to_session_spawn_policy(*p, cfg.venvs.cache_dir, workspace);
        if (!sp.ok()) return std::move(sp).error().wrap("policy " + quoted_for_message(name) + "'s sessions");
        out.policies.push_back(std::move(sp).value());
        out.policies.back().name = workspace ? tsb::core::workspace_policy_name(name) : tsb::core::session_policy_name(name);
      }
    }
    // TypeScript tools' node_modules: the policy's npm build policy.
    if (p->npm_packages.enabled && p->backend == tsb::core::Backend::Local && !builder.empty()) {
      auto bp = tsb::core::to_npm_build_spawn_policy(*p, builder);
      if (!bp.ok()) return std::move(bp).error().wrap("policy " + quoted_for_message(name) + "'s node_modules builds");
      out.policies.push_back(std::move(bp).value());
      out.policies.back().name = tsb::core::npm_build_policy_name(name);
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

int run_helper(const std::string& config_path, const core::DaemonConfig& cfg, const core::PolicySet& set,
               const core::SourceFiles& files, HelperMode mode, int sources_fd) {
  if (cfg.source == tsb::core::DaemonConfig{}.source)
    spdlog::info("configuration: {} (no file at '{}'; SIGHUP loads it once it exists)", cfg.source, config_path);
  else
    spdlog::info("configuration: {}", cfg.source);
  for (const auto& [name, p] : set.policies)
    spdlog::info("policy {} {} ({})", quoted_for_message(name), p->fingerprint, p->source);
  if (auto w = tsb::core::policy_set_warning(cfg, set); !w.empty()) spdlog::warn("{}", w);
  auto compiled = compile(cfg, set, mode == HelperMode::kSetup);
  if (!compiled.ok()) {
    spdlog::critical("{}", compiled.error().message);
    return 1;
  }
  if (mode == HelperMode::kCheck) return 0;
  if (auto st = tsb::core::write_source_record(sources_fd, files); !st.ok()) {
    spdlog::critical("{}", st.error().message);
    return 1;
  }
  return write_all(STDOUT_FILENO, tsb::spawn::encode_compiled_set(*compiled)) == 0 ? 0 : 1;
}

}  // namespace tsb::compile
