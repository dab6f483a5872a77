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
#include "daemon/common/quote.h"
#include "daemon/cli/seccomp_cache.h"
#include "daemon/common/quote.h"
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
  print_line(stderr, "toolsandbox run: %s", msg.c_str());
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

namespace {

// What the command line asks for: the policy, one run's overrides of it,
// the engine's places and the command.
struct RunOptions {
  std::string policy_ref = "default";
  std::optional<std::string> timeout, memory, network, venv, stdin_src;
  std::vector<std::string> binds, envs;
  std::vector<std::string> cmd;
  bool json = false;
  std::string seccomp_cache{kSeccompCacheDir};
  isolate::EngineConfig cfg;
};

// The options, or the usage error; the command goes after "--".
Result<RunOptions> parse_run_options(const std::vector<std::string>& args) {
  RunOptions o;
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
                             if (name == "json") o.json = true;
                             else if (name == "policy") o.policy_ref = v;
                             else if (name == "timeout") o.timeout = v;
                             else if (name == "memory") o.memory = v;
                             else if (name == "network") o.network = v;
                             else if (name == "venv") o.venv = v;
                             else if (name == "stdin") o.stdin_src = v;
                             else if (name == "bind") o.binds.push_back(v);
                             else if (name == "env") o.envs.push_back(v);
                             else if (name == "cgroup-parent") o.cfg.cgroup_parent = v;
                             else if (name == "state-dir") o.cfg.state_dir = v;
                             else if (name == "seccomp-cache") o.seccomp_cache = v;
                             else if (name == "no-seccomp-cache") o.seccomp_cache.clear();
                             return std::nullopt;
                           },
                           &o.cmd);
  if (err) return Error::invalid(err->starts_with("--") ? *err : *err + " (commands go after --)");
  if (o.cmd.empty()) return Error::invalid("no command given (toolsandbox run [options] -- CMD ARGS...)");
  return o;
}

// A seccomp program from the cache directory (compiled and kept there on a
// miss), or compiled afresh when there is no directory (--no-seccomp-cache).
Result<std::shared_ptr<const isolate::SeccompProgram>> compiled(const std::string& cache_dir, std::string_view what,
                                                                const CompileFn& compile) {
  return cache_dir.empty() ? compile() : cached_or_compiled(cache_dir, what, compile, "toolsandbox run");
}

// The policy the command line names, with its profile compiled (or found
// compiled: seccomp_cache.h). Either failure is the operator's to fix, so
// the caller reports it as a usage error.
Result<core::Policy> load_run_policy(const RunOptions& o) {
  // The profile is compiled below, or found compiled (seccomp_cache.h).
  core::PolicyContext ctx;
  ctx.compile = false;
  auto policy = resolve_policy(o.policy_ref, ctx);
  if (!policy.ok()) return policy;
  auto program = compiled(o.seccomp_cache, "policy " + policy->fingerprint,
                          [&] { return policy::compile_seccomp(*policy->seccomp_profile); });
  if (!program.ok()) return std::move(program).error().wrap("policy " + policy->name + ": compiling seccomp");
  policy->seccomp = std::move(program).value();
  return policy;
}

// One --bind SRC:DST[:rw|:ro]; the source must exist on this host now.
Result<isolate::BindMount> parse_bind_option(const std::string& b) {
  isolate::BindMount m;
  auto c1 = b.find(':');
  if (c1 == std::string::npos) return Error::invalid("--bind wants SRC:DST[:rw], got '" + b + "'");
  auto c2 = b.find(':', c1 + 1);
  m.source = b.substr(0, c1);
  m.target = c2 == std::string::npos ? b.substr(c1 + 1) : b.substr(c1 + 1, c2 - c1 - 1);
  if (c2 != std::string::npos) {
    std::string mode = b.substr(c2 + 1);
    if (mode == "rw") m.writable = true;
    else if (mode != "ro") return Error::invalid("--bind mode must be ro or rw, got '" + mode + "'");
  }
  if (m.source.empty() || m.source[0] != '/') return Error::invalid("--bind source must be absolute: '" + m.source + "'");
  struct stat st{};
  if (::stat(m.source.c_str(), &st) != 0) return Error::invalid("--bind source does not exist: '" + m.source + "'");
  return m;
}

// Command-line overrides: the operator (root) may tighten or relax one
// run. The usage error for a value that makes no sense.
Status apply_overrides(const RunOptions& o, const core::Policy& policy, isolate::RunSpec& spec, isolate::FsInputs& fs) {
  if (o.timeout) {
    // A bare number is seconds, as for timeout(1).
    bool bare = !o.timeout->empty() && o.timeout->find_first_not_of("0123456789.") == std::string::npos;
    auto d = core::parse_duration(nlohmann::json(bare ? *o.timeout + "s" : *o.timeout));
    if (!d.ok() || d->count() == 0) return Error::invalid("--timeout: not a positive duration: '" + *o.timeout + "'");
    spec.limits.wall_timeout = *d;
  }
  if (o.memory) {
    bool bare = !o.memory->empty() && o.memory->find_first_not_of("0123456789") == std::string::npos;
    auto s = core::parse_size(nlohmann::json(bare ? *o.memory + "B" : *o.memory));
    if (!s.ok() || *s < (16u << 20))
      return Error::invalid("--memory: need a size of at least 16MiB, like 256MiB: '" + *o.memory + "'");
    spec.limits.memory_bytes = *s;
  }
  if (o.network) {
    if (*o.network == "none") spec.network = isolate::NetworkMode::None;
    else if (*o.network == "host") spec.network = isolate::NetworkMode::Host;
    else return Error::invalid("--network must be none or host");
    fs.network = spec.network;
  }
  // The proxy of network egress is the daemon's (daemon/frontend/egress/proxy.h):
  // a sandbox of this command would have a listener no one accepts on.
  if (spec.network == isolate::NetworkMode::Egress)
    return Error::invalid("policy '" + policy.name + "' uses network \"egress\", whose proxy is the daemon's: run the tool "
                          "through toolsandboxd, or choose --network none or --network host for this command");
  if (o.venv) {
    if (o.venv->empty() || (*o.venv)[0] != '/') return Error::invalid("--venv needs an absolute path");
    fs.venv = *o.venv;
  }
  for (const auto& b : o.binds) {
    auto m = parse_bind_option(b);
    if (!m.ok()) return std::move(m).error().wrap("--bind");
    fs.binds.push_back(*m);
  }
  return {};
}

// What --stdin names: a file's bytes, or this process's stdin for "-".
Result<std::string> read_stdin_source(const std::string& src) {
  std::string data;
  if (src == "-") {
    data.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  } else {
    std::ifstream in(src, std::ios::binary);
    if (!in) return Error::invalid("--stdin: cannot open '" + src + "'");
    data.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  return data;
}

// The rest of the run: its environment (the policy decides which --env
// names it takes), the command, the file-system table and its stdin. The
// usage error for what cannot be built.
Status complete_spec(const RunOptions& o, const core::Policy& policy, isolate::FsInputs& fs, isolate::RunSpec& spec) {
  std::map<std::string, std::string> req_env;
  for (const auto& e : o.envs) {
    auto eq = e.find('=');
    if (eq == std::string::npos || eq == 0) return Error::invalid("--env wants NAME=VALUE, got '" + e + "'");
    req_env[e.substr(0, eq)] = e.substr(eq + 1);
  }
  auto env = core::build_environment(policy, req_env);
  if (!env.ok()) return std::move(env).error().wrap("the environment");
  spec.env = std::move(env).value();
  spec.argv = o.cmd;
  isolate::resolve_host_paths(fs);
  auto table = isolate::build_fs_table(fs);
  if (!table.ok()) return std::move(table).error().wrap("the file system table");
  spec.fs = std::move(table).value();
  if (o.stdin_src) {
    auto data = read_stdin_source(*o.stdin_src);
    if (!data.ok()) return std::move(data).error().wrap("--stdin");
    spec.stdin_data = std::move(data).value();
  }
  return {};
}

// Prints the run (its record as one JSON line, or its output as the tool
// wrote it) and turns how it ended into the exit status, the tool's own
// when it exited.
int report_run(const isolate::RunResult& r, const core::Policy& policy, const isolate::RunSpec& spec, bool json) {
  if (json) {
    nlohmann::json j = core::run_record_json(r);
    j["policy"] = policy.name;
    j["policy_fingerprint"] = policy.fingerprint;
    j["landlock"] = isolate::landlock_summary(r.landlock);
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
      if (!json) print_line(stderr, "toolsandbox run: killed by signal %d", r.signal);
      return 128 + r.signal;
    case EndReason::SetupFailed:
      if (!json) print_line(stderr, "toolsandbox run: %s", r.error.c_str());
      return kExitSetup;
    case EndReason::Timeout:
      if (!json) print_line(stderr, "toolsandbox run: timed out after %s; the whole process tree was killed",
                              core::format_duration(spec.limits.wall_timeout).c_str());
      return kExitTimeout;
    default:
      if (!json) print_line(stderr, "toolsandbox run: run ended: %s", std::string(isolate::to_string(r.reason)).c_str());
      return 128 + 9;
  }
}

}  // namespace

// The steps in the order they can fail: the command line, the policy and
// its filter, the init's filter, the run's spec, the engine; then the run.
int cmd_run(const std::vector<std::string>& args) {
  auto opts = parse_run_options(args);
  if (!opts.ok()) return fail_usage(opts.error().message);
  auto policy = load_run_policy(*opts);
  if (!policy.ok()) return fail_usage(policy.error().message);
  auto init_filter = compiled(opts->seccomp_cache, "init", [] { return policy::compile_init_filter(); });
  if (!init_filter.ok()) {
    print_line(stderr, "toolsandbox run: compiling the init filter: %s", init_filter.error().message.c_str());
    return kExitSetup;
  }
  isolate::RunSpec spec = core::run_spec_from(*policy);
  isolate::FsInputs fs = core::fs_inputs_from(*policy);
  if (auto st = apply_overrides(*opts, *policy, spec, fs); !st.ok()) return fail_usage(st.error().message);
  if (auto st = complete_spec(*opts, *policy, fs, spec); !st.ok()) return fail_usage(st.error().message);

  auto engine = policy::create_engine(opts->cfg, std::move(init_filter).value());
  if (!engine.ok()) {
    print_line(stderr, "toolsandbox run: %s", engine.error().message.c_str());
    return kExitSetup;
  }
  isolate::RunResult r = (*engine)->run(spec);
  name_setup_path(r);
  return report_run(r, *policy, spec, opts->json);
}

}  // namespace tsb::cli
