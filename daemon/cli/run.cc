// toolsandbox run: one command through the engine, directly (root, no daemon).
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>

#include "daemon/compile/spawn_policy.h"
#include "daemon/cli/cli.h"
#include "daemon/cli/seccomp_cache.h"
#include "daemon/policy/seccomp_profile.h"
#include "daemon/policy/policy.h"
#include "protocol/record.h"
#include "daemon/policy/units.h"
#include "isolate/engine/engine.h"
#include "daemon/compile/prepare.h"
#include "daemon/policy/jsonc.h"
#include "daemon/compile/host.h"

namespace tsb::cli {
namespace {

int fail_usage(const std::string& msg) {
  std::fprintf(stderr, "toolsandbox run: %s\n", msg.c_str());
  return kExitUsage;
}

bool is_file_ref(const std::string& s) {
  return s.find('/') != std::string::npos || (s.size() > 5 && s.compare(s.size() - 5, 5, ".json") == 0);
}

}  // namespace

// Resolves NAME to /etc/toolsandboxd/policies/NAME.json when present, else
// to the policy embedded in the binary; anything with a '/' or ".json" is a file.
Result<core::Policy> resolve_policy(const std::string& ref, const core::PolicyContext& ctx) {
  if (is_file_ref(ref)) return core::load_policy(ref, ctx);
  std::string dir = std::string(TSB_SYSCONFDIR) + "/policies";
  struct stat st{};
  if (::stat((dir + "/" + ref + ".json").c_str(), &st) == 0) return core::load_named_policy(ref, dir, ctx);
  return core::load_named_policy(ref, "", ctx);
}

int cmd_run(const std::vector<std::string>& args) {
  std::string policy_ref = "default";
  std::optional<std::string> timeout, memory, network, venv, stdin_src;
  std::vector<std::string> binds, envs;
  std::vector<std::string> cmd;
  bool json = false;
  std::string seccomp_cache(kSeccompCacheDir);
  isolate::EngineConfig cfg;

  static const std::vector<OptionSpec> kOptions = {
      {"json", nullptr},
      {"policy", "a name or file"},
      {"timeout", "seconds"},
      {"memory", "a size (e.g. 256MiB)"},
      {"network", "none or host"},
      {"venv", "a directory"},
      {"stdin", "a file or -"},
      {"bind", "SRC:DST[:rw]"},
      {"env", "NAME=VALUE"},
      {"cgroup-parent", "a path"},
      {"state-dir", "a directory"},
      {"seccomp-cache", "a directory"},
      {"no-seccomp-cache", nullptr},
  };
  auto err = parse_options(args, kOptions, /*operands_after_dashdash_only=*/true,
                           [&](const std::string& name, const std::string& v) -> std::optional<std::string> {
                             if (name == "json") json = true;
                             else if (name == "policy") policy_ref = v;
                             else if (name == "timeout") timeout = v;
                             else if (name == "memory") memory = v;
                             else if (name == "network") network = v;
                             else if (name == "venv") venv = v;
                             else if (name == "stdin") stdin_src = v;
                             else if (name == "bind") binds.push_back(v);
                             else if (name == "env") envs.push_back(v);
                             else if (name == "cgroup-parent") cfg.cgroup_parent = v;
                             else if (name == "state-dir") cfg.state_dir = v;
                             else if (name == "seccomp-cache") seccomp_cache = v;
                             else if (name == "no-seccomp-cache") seccomp_cache.clear();
                             return std::nullopt;
                           },
                           &cmd);
  if (err) return fail_usage(err->starts_with("--") ? *err : *err + " (commands go after --)");
  if (cmd.empty()) return fail_usage("no command given (toolsandbox run [options] -- CMD ARGS...)");

  // The profile is compiled below, or found compiled (seccomp_cache.h).
  core::PolicyContext ctx;
  ctx.compile = false;
  auto policy = resolve_policy(policy_ref, ctx);
  if (!policy.ok()) {
    std::fprintf(stderr, "toolsandbox run: %s\n", policy.error().message.c_str());
    return kExitUsage;
  }
  const auto compiled = [&](std::string_view what, const CompileFn& compile) {
    return seccomp_cache.empty() ? compile() : cached_or_compiled(seccomp_cache, what, compile, "toolsandbox run");
  };
  auto program = compiled("policy " + policy->fingerprint, [&] { return policy::compile_seccomp(*policy->seccomp_profile); });
  if (!program.ok()) {
    std::fprintf(stderr, "toolsandbox run: policy %s: compiling seccomp: %s\n", policy->name.c_str(),
                 program.error().message.c_str());
    return kExitUsage;
  }
  policy->seccomp = std::move(program).value();
  auto init_filter = compiled("init", [] { return policy::compile_init_filter(); });
  if (!init_filter.ok()) {
    std::fprintf(stderr, "toolsandbox run: compiling the init filter: %s\n", init_filter.error().message.c_str());
    return kExitSetup;
  }
  isolate::RunSpec spec = core::run_spec_from(*policy);
  isolate::FsInputs fs = core::fs_inputs_from(*policy);

  // Command-line overrides: the operator (root) may tighten or relax one run.
  if (timeout) {
    // A bare number is seconds, as for timeout(1).
    bool bare = !timeout->empty() && timeout->find_first_not_of("0123456789.") == std::string::npos;
    auto d = core::parse_duration(nlohmann::json(bare ? *timeout + "s" : *timeout));
    if (!d.ok() || d->count() == 0) return fail_usage("--timeout: not a positive duration: '" + *timeout + "'");
    spec.limits.wall_timeout = *d;
  }
  if (memory) {
    bool bare = !memory->empty() && memory->find_first_not_of("0123456789") == std::string::npos;
    auto s = core::parse_size(nlohmann::json(bare ? *memory + "B" : *memory));
    if (!s.ok() || *s < (16u << 20)) return fail_usage("--memory: need a size of at least 16MiB, like 256MiB: '" + *memory + "'");
    spec.limits.memory_bytes = *s;
  }
  if (network) {
    if (*network == "none") spec.network = isolate::NetworkMode::None;
    else if (*network == "host") spec.network = isolate::NetworkMode::Host;
    else return fail_usage("--network must be none or host");
    fs.network = spec.network;
  }
  // The proxy of network egress is the daemon's (daemon/frontend/egress/proxy.h):
  // a sandbox of this command would have a listener no one accepts on.
  if (spec.network == isolate::NetworkMode::Egress)
    return fail_usage("policy '" + policy->name + "' uses network \"egress\", whose proxy is the daemon's: run the tool "
                      "through toolsandboxd, or choose --network none or --network host for this command");
  if (venv) {
    if (venv->empty() || (*venv)[0] != '/') return fail_usage("--venv needs an absolute path");
    fs.venv = *venv;
  }
  for (const auto& b : binds) {
    isolate::BindMount m;
    auto c1 = b.find(':');
    if (c1 == std::string::npos) return fail_usage("--bind wants SRC:DST[:rw], got '" + b + "'");
    auto c2 = b.find(':', c1 + 1);
    m.source = b.substr(0, c1);
    m.target = c2 == std::string::npos ? b.substr(c1 + 1) : b.substr(c1 + 1, c2 - c1 - 1);
    if (c2 != std::string::npos) {
      std::string mode = b.substr(c2 + 1);
      if (mode == "rw") m.writable = true;
      else if (mode != "ro") return fail_usage("--bind mode must be ro or rw, got '" + mode + "'");
    }
    if (m.source.empty() || m.source[0] != '/') return fail_usage("--bind source must be absolute: '" + m.source + "'");
    struct stat st{};
    if (::stat(m.source.c_str(), &st) != 0) return fail_usage("--bind source does not exist: '" + m.source + "'");
    fs.binds.push_back(m);
  }
  std::map<std::string, std::string> req_env;
  for (const auto& e : envs) {
    auto eq = e.find('=');
    if (eq == std::string::npos || eq == 0) return fail_usage("--env wants NAME=VALUE, got '" + e + "'");
    req_env[e.substr(0, eq)] = e.substr(eq + 1);
  }
  auto env = core::build_environment(*policy, req_env);
  if (!env.ok()) return fail_usage(env.error().message);
  spec.env = std::move(env).value();
  spec.argv = cmd;
  isolate::resolve_host_paths(fs);
  auto table = isolate::build_fs_table(fs);
  if (!table.ok()) return fail_usage(table.error().message);
  spec.fs = std::move(table).value();
  if (stdin_src) {
    std::string data;
    if (*stdin_src == "-") {
      data.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
    } else {
      std::ifstream in(*stdin_src, std::ios::binary);
      if (!in) return fail_usage("--stdin: cannot open '" + *stdin_src + "'");
      data.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    spec.stdin_data = std::move(data);
  }

  auto engine = policy::create_engine(cfg, std::move(init_filter).value());
  if (!engine.ok()) {
    std::fprintf(stderr, "toolsandbox run: %s\n", engine.error().message.c_str());
    return kExitSetup;
  }
  isolate::RunResult r = (*engine)->run(spec);

  if (json) {
    nlohmann::json j = core::run_record_json(r);
    j["policy"] = policy->name;
    j["policy_fingerprint"] = policy->fingerprint;
    j["stdout"] = r.stdout_data;
    j["stderr"] = r.stderr_data;
    std::fputs(core::dump_json(j).c_str(), stdout);
    std::fputc('\n', stdout);
  } else {
    std::fwrite(r.stdout_data.data(), 1, r.stdout_data.size(), stdout);
    std::fwrite(r.stderr_data.data(), 1, r.stderr_data.size(), stderr);
  }
  std::fflush(stdout);
  using isolate::EndReason;
  switch (r.reason) {
    case EndReason::Exited:
      return r.exit_code;
    case EndReason::Signaled:
      if (!json) std::fprintf(stderr, "toolsandbox run: killed by signal %d\n", r.signal);
      return 128 + r.signal;
    case EndReason::SetupFailed:
      if (!json) std::fprintf(stderr, "toolsandbox run: %s\n", r.error.c_str());
      return kExitSetup;
    case EndReason::Timeout:
      if (!json) std::fprintf(stderr, "toolsandbox run: timed out after %s; the whole process tree was killed\n",
                              core::format_duration(spec.limits.wall_timeout).c_str());
      return kExitTimeout;
    default:
      if (!json) std::fprintf(stderr, "toolsandbox run: run ended: %s\n", std::string(isolate::to_string(r.reason)).c_str());
      return 128 + 9;
  }
}

}  // namespace tsb::cli
