#include "daemon/policy/policy_lint.h"

#include <sys/stat.h>

#include <seccomp.h>

#include <algorithm>
#include <chrono>
#include <regex>
#include <set>
#include <tuple>

#include "daemon/policy/policy_explain.h"
#include "daemon/policy/units.h"
#include "daemon/policy/jsonc.h"
#include "daemon/policy/syscall_groups.h"

namespace tsb::core {
namespace {

using policy::SeccompAction;

// Syscalls that are dangerous in a tool's filter although their group in
// daemon/policy/syscall_groups.cc is not marked dangerous (or they have none).
struct DangerousSyscall {
  std::string_view name;
  std::string_view reason;
  // Argument conditions can make it acceptable (clone with a mask that
  // excludes namespace flags); for the others a condition changes nothing
  // a reviewer can rely on.
  bool fine_with_conditions;
};
constexpr DangerousSyscall kDangerousSyscalls[] = {
    {"clone", "without a condition on its flags it creates namespaces (CLONE_NEWUSER grants a full capability "
              "set inside the new namespace and a large kernel surface)",
     true},
    {"clone3", "its flags are in memory, where seccomp cannot check them: allowing it allows new namespaces", false},
    {"setns", "joins another namespace", false},
    {"syslog", "reads or clears the host's kernel log (kernel addresses, other tenants' messages)", false},
    {"unshare", "creates namespaces: a new user namespace grants a full capability set inside it and a large "
                "kernel surface (the root cause of many container escapes)",
     false},
    {"userfaultfd", "stalls page faults in user space, the classic way to widen race windows in kernel exploits",
     false},
};

// Members of dangerous groups that do no harm in a toolsandboxd sandbox:
// the tool holds no capabilities (isolate/init/tool.cc empties every set
// and locks securebits) and its user namespace denies setgroups.
struct InertSyscall {
  std::string_view name;
  std::string_view reason;
};
constexpr std::string_view kNoChown =
    "without CAP_CHOWN a process can only give its own files to a group it is in";
constexpr std::string_view kNoSetuid =
    "without CAP_SETUID a process can only switch among the ids it holds, which are all the tool's";
constexpr std::string_view kNoSetgroups = "setgroups is denied in the sandbox's user namespace";
constexpr InertSyscall kInertSyscalls[] = {
    {"capset", "can only lower capabilities, and the tool holds none"},
    {"chown", kNoChown},        {"chown32", kNoChown},      {"fchown", kNoChown},
    {"fchown32", kNoChown},     {"fchownat", kNoChown},     {"lchown", kNoChown},
    {"lchown32", kNoChown},     {"setfsuid", kNoSetuid},    {"setfsuid32", kNoSetuid},
    {"setgroups", kNoSetgroups}, {"setgroups32", kNoSetgroups}, {"setresuid", kNoSetuid},
    {"setresuid32", kNoSetuid}, {"setreuid", kNoSetuid},    {"setreuid32", kNoSetuid},
    {"setuid", kNoSetuid},      {"setuid32", kNoSetuid},
};

// Host paths a policy should not bind, and what binding them exposes.
struct SensitivePath {
  std::string_view path;
  std::string_view reason;
};
constexpr SensitivePath kSensitivePaths[] = {
    {"/boot", "the host's kernels and boot loader configuration"},
    {"/dev", "the host's device nodes"},
    {"/etc", "the host's configuration, password hashes (/etc/shadow) and keys"},
    {"/home", "users' home directories: keys, credentials, shell history"},
    {"/proc", "the host's process and kernel interfaces"},
    {"/root", "root's home directory: keys, credentials, shell history"},
    {"/run", "runtime state and service sockets (docker, containerd, systemd, D-Bus, toolsandboxd itself)"},
    {"/sys", "the host's kernel and device interfaces"},
    {"/var/lib/containerd", "container images and state"},
    {"/var/lib/docker", "container images and state"},
    {"/var/log", "the host's logs"},
    {"/var/run", "runtime state and service sockets (docker, containerd, systemd, D-Bus, toolsandboxd itself)"},
};
constexpr std::string_view kSocketReason =
    "a Unix socket of a host service: whoever can talk to it (docker.sock, containerd.sock) controls that service";

bool path_under(std::string_view p, std::string_view prefix) {
  if (prefix == "/") return true;
  return p == prefix || (p.size() > prefix.size() && p.substr(0, prefix.size()) == prefix && p[prefix.size()] == '/');
}

// Thresholds above which a limit deserves a second look. Not errors: a
// policy may need them, but then a reviewer should have agreed.
constexpr std::uint64_t kMemoryWarnBytes = 4ull << 30;
constexpr std::chrono::milliseconds kWallWarn{10 * 60 * 1000};
constexpr std::uint64_t kPidsWarn = 4096;

std::string q(std::string_view s) { return quoted_for_message(s); }

// The dangerous group that says most about `syscall`: one that lists it
// directly (@reboot for kexec_load), else one that includes it through a
// reference (@privileged for chown, via @chown).
const policy::SyscallGroup* dangerous_group_of(std::string_view syscall) {
  const policy::SyscallGroup* via_reference = nullptr;
  for (const auto name : policy::syscall_groups_of(syscall)) {
    const policy::SyscallGroup* g = policy::find_syscall_group(name);
    if (g == nullptr || !g->dangerous) continue;
    if (std::find(g->members.begin(), g->members.end(), syscall) != g->members.end()) return g;
    if (via_reference == nullptr) via_reference = g;
  }
  return via_reference;
}

}  // namespace

std::optional<std::string> dangerous_syscall_reason(std::string_view syscall, bool conditional) {
  for (const auto& d : kDangerousSyscalls) {
    if (d.name != syscall) continue;
    if (conditional && d.fine_with_conditions) return std::nullopt;
    return std::string(d.reason);
  }
  if (const policy::SyscallGroup* g = dangerous_group_of(syscall))
    return std::string(g->help) + " (" + std::string(g->name) + ")";
  return std::nullopt;
}

std::optional<std::string_view> inert_syscall_reason(std::string_view syscall) {
  for (const auto& i : kInertSyscalls)
    if (i.name == syscall) return i.reason;
  return std::nullopt;
}

std::optional<std::string> sensitive_host_path_reason(std::string_view host_path) {
  if (host_path == "/") return "the host's whole file system";
  const std::string_view base = host_path.substr(host_path.rfind('/') + 1);
  if (base.size() > 5 && base.substr(base.size() - 5) == ".sock") return std::string(kSocketReason);
  for (const auto& s : kSensitivePaths)
    if (path_under(host_path, s.path)) return std::string(s.reason);
  // A directory that contains sensitive paths exposes them all.
  std::string contained;
  for (const auto& s : kSensitivePaths)
    if (path_under(s.path, host_path)) contained += (contained.empty() ? "" : ", ") + std::string(s.path);
  if (!contained.empty()) return "contains " + contained;
  return std::nullopt;
}

namespace {

// A risk written at a key of the policy ("/network").
void add_policy_key(std::vector<PolicyRisk>& risks, std::string pointer, std::string message) {
  PolicyRisk r;
  r.anchor = PolicyRisk::Anchor::PolicyKey;
  r.pointer = std::move(pointer);
  r.message = std::move(message);
  risks.push_back(std::move(r));
}

// A risk written at a key of the seccomp profile ("/defaultAction").
void add_profile_key(std::vector<PolicyRisk>& risks, std::string pointer, std::string message) {
  PolicyRisk r;
  r.anchor = PolicyRisk::Anchor::ProfileKey;
  r.pointer = std::move(pointer);
  r.message = std::move(message);
  risks.push_back(std::move(r));
}

// A risk written at one entry of the seccomp profile; `syscall` names the
// one it is about, if it is about one.
void add_profile_entry(std::vector<PolicyRisk>& risks, const SyscallRuleView& rule, const std::string& syscall,
                       std::string message, LintSeverity sev = LintSeverity::Warning) {
  PolicyRisk r;
  r.severity = sev;
  r.anchor = PolicyRisk::Anchor::ProfileEntry;
  r.where = rule.where;
  r.pointer = rule.pointer;
  r.syscall = syscall;
  r.message = std::move(message);
  risks.push_back(std::move(r));
}

// The network, first: "host" is the largest grant a policy can make;
// egress to any public address and E2B's all-or-nothing internet follow.
void assess_network(const Policy& p, std::vector<PolicyRisk>& risks) {
  if (p.network == isolate::NetworkMode::Host)
    add_policy_key(risks, "/network",
                   "highest risk: network \"host\": the tool shares the host's network namespace: every service "
                   "listening on the host's localhost (the agent server's database), the host's neighbours on its "
                   "private networks, the cloud metadata service at 169.254.169.254 (instance credentials), abstract "
                   "Unix sockets; network \"egress\" gives tools the internet without these");
  if (p.network == isolate::NetworkMode::Egress && !p.egress.public_ports.empty()) {
    std::string ports;
    for (auto port : p.egress.public_ports) ports += (ports.empty() ? "" : ", ") + std::to_string(port);
    add_policy_key(risks, "/egress/public", "egress \"public\": a tool may connect to any public address on port " + ports +
                                                " (anything it holds can leave for any server on the internet; the host and "
                                                "its private networks stay denied)");
  }
  // Under E2B (docs/E2B.md, "Networks"): "host" is E2B's whole internet;
  // "egress" is enforced by name, without the proxy's caps and with E2B's
  // resolver open.
  if (p.network == isolate::NetworkMode::Host && p.backend == Backend::E2B)
    add_policy_key(risks, "/network", "backend e2b with network \"host\": the E2B sandbox reaches the whole internet, "
                                      "every port and protocol; no egress rule or cap applies there");
  if (p.network == isolate::NetworkMode::Egress && p.backend == Backend::E2B &&
      (!p.egress.allow.empty() || !p.egress.public_ports.empty()))
    add_policy_key(risks, "/network", "backend e2b with network \"egress\": E2B allows the rules' hosts by name on ports "
                                      "80 and 443 only, but does not apply max_connections or max_bytes, and its sandbox "
                                      "reaches E2B's resolver 8.8.8.8 on any port (DNS queries can carry data out)");
}

// Packages: build code that runs, and an index whose every project a tool
// may get.
void assess_packages(const Policy& p, std::vector<PolicyRisk>& risks) {
  if (p.packages.enabled && p.packages.source_builds)
    add_policy_key(risks, "/packages/source_builds",
                   "packages source_builds: pip may build sdists, running their build code "
                   "(in the build sandbox, with the package source's network)");
  if (p.packages.enabled && !p.packages.index.empty() &&
      std::find(p.packages.allow.begin(), p.packages.allow.end(), "*") != p.packages.allow.end())
    add_policy_key(risks, "/packages/allow",
                   "packages allow \"*\" with an index: a tool may have any project of " + q(p.packages.index) +
                       " installed and imported (name the projects tools need instead)");
}

// Binds of sensitive host paths, and every writable bind.
void assess_binds(const Policy& p, std::vector<PolicyRisk>& risks) {
  for (std::size_t i = 0; i < p.binds.size(); ++i) {
    const auto& b = p.binds[i];
    const std::string ptr = json_pointer_append("/filesystem/binds", i);
    if (auto why = sensitive_host_path_reason(b.source))
      add_policy_key(risks, ptr + "/source", "bind of sensitive host path " + q(b.source) + ": " + std::string(*why));
    if (b.writable)
      add_policy_key(risks, ptr + "/writable", "read-write bind of host path " + q(b.source) + " at " + q(b.target) +
                                                   ": the tool can change host files there");
  }
}

// An environment a request may fill with any name.
void assess_environment(const Policy& p, std::vector<PolicyRisk>& risks) {
  for (std::size_t i = 0; i < p.env_allow.size(); ++i) {
    if (p.env_allow[i] == "*")
      add_policy_key(risks, json_pointer_append("/environment/allow", i),
                     "environment allow \"*\": a request may set any variable the policy does not fix");
  }
}

// Limits past the thresholds above, and no CPU-time limit at all.
void assess_limits(const Policy& p, std::vector<PolicyRisk>& risks) {
  const isolate::Limits& l = p.limits;
  if (l.wall_timeout > kWallWarn)
    add_policy_key(risks, "/limits/wall_timeout", "wall_timeout " + format_duration(l.wall_timeout) + " is above " +
                                                      format_duration(kWallWarn) + ": one run can hold a slot that long");
  if (l.cpu_time.count() == 0)
    add_policy_key(risks, "/limits/cpu_time", "cpu_time 0 sets no CPU-time limit: only the wall clock ends a busy run");
  if (l.memory_bytes > kMemoryWarnBytes)
    add_policy_key(risks, "/limits/memory",
                   "memory " + format_size(l.memory_bytes) + " is above " + format_size(kMemoryWarnBytes));
  if (l.pids > kPidsWarn)
    add_policy_key(risks, "/limits/pids", "pids " + std::to_string(l.pids) + " is above " + std::to_string(kPidsWarn));
}

// A default action that lets unnamed syscalls run (a deny-list), or that
// refuses them while reporting success.
void assess_default_action(const ProfileView& view, std::vector<PolicyRisk>& risks) {
  if (view.default_action == SeccompAction::Allow)
    add_profile_key(risks, "/defaultAction",
                    "seccomp default action SCMP_ACT_ALLOW: every syscall the profile does not name is allowed "
                    "(a deny-list, as good as no seccomp against an unknown syscall)");
  else if (view.default_action == SeccompAction::Log)
    add_profile_key(risks, "/defaultAction",
                    "seccomp default action SCMP_ACT_LOG: every syscall the profile does not name is allowed and "
                    "only logged (a deny-list)");
  if (view.default_action == SeccompAction::Errno && view.default_data == 0)
    add_profile_key(risks, "/defaultErrnoRet",
                    "seccomp default errno 0: every refused syscall reports success without running");
}

// Entries that pretend or only log, once per entry.
void assess_pretending_entries(const policy::SeccompProfile& prof, std::vector<PolicyRisk>& risks) {
  for (const auto& rule : prof.rules) {
    std::string names;
    for (const auto& n : rule.names) names += (names.empty() ? "" : ", ") + q(n);
    SyscallRuleView at;
    at.where = rule.where;
    at.pointer = rule.pointer;
    if (rule.action == SeccompAction::Log)
      add_profile_entry(risks, at, "", "seccomp entry with SCMP_ACT_LOG allows " + names + " (the call runs and is only logged)");
    if (rule.action == SeccompAction::Errno && rule.errno_ret == 0)
      add_profile_entry(risks, at, "", "seccomp entry with errnoRet 0 for " + names +
                                           ": the refused call reports success without running, which code cannot tell from "
                                           "the real thing");
  }
}

// A deny-list lets every dangerous syscall it does not name through: one
// warning per dangerous group (and per syscall of kDangerousSyscalls),
// naming the syscalls of this architecture it lets through.
void assess_deny_list(const ProfileView& view, std::vector<PolicyRisk>& risks) {
  const std::uint32_t native = seccomp_arch_native();
  const auto passes = [&](const std::string& name) {
    return !view.syscalls.count(name) && seccomp_syscall_resolve_name_arch(native, name.c_str()) >= 0;
  };
  for (const auto& g : policy::syscall_groups()) {
    if (!g.dangerous) continue;
    auto members = policy::expand_syscall_group(g.name);
    if (!members.ok()) continue;
    std::string names;
    for (const auto& m : *members)
      if (passes(m) && !inert_syscall_reason(m)) names += (names.empty() ? "" : ", ") + m;
    if (!names.empty())
      add_profile_key(risks, "/defaultAction", "the default action allows " + std::string(g.name) + " (" +
                                                   std::string(g.help) + "): " + names);
  }
  for (const auto& d : kDangerousSyscalls)
    if (passes(std::string(d.name)))
      add_profile_key(risks, "/defaultAction",
                      "the default action allows syscall " + q(d.name) + ": " + std::string(d.reason));
}

// Dangerous syscalls the profile allows by name, each at its first
// allowing entry; those inert in this sandbox are notes, not warnings.
void assess_allowed_by_name(const ProfileView& view, std::vector<PolicyRisk>& risks) {
  for (const auto& [name, rules] : view.syscalls) {
    const SyscallFate fate = syscall_fate(view, name);
    if (fate == SyscallFate::Refused) continue;
    const bool conditional = fate == SyscallFate::AllowedSometimes;
    const auto why = dangerous_syscall_reason(name, conditional);
    if (!why) continue;
    const std::string what = "syscall " + q(name) + " allowed" + (conditional ? " for some arguments" : "");
    auto it = view.syscalls.find(name);
    const SyscallRuleView* rule = &it->second.front();
    for (const auto& r : it->second) {
      if (action_runs_syscall(r.action)) {
        rule = &r;
        break;
      }
    }
    if (auto inert = inert_syscall_reason(name)) {
      const policy::SyscallGroup* g = dangerous_group_of(name);
      const std::string group = g != nullptr ? std::string(g->name) : std::string("?");
      add_profile_entry(risks, *rule, name, what + " (" + group + ", inert here): " + std::string(*inert),
                        LintSeverity::Note);
      continue;
    }
    add_profile_entry(risks, *rule, name, what + ": " + *why);
  }
}

}  // namespace

// TypeScript: what the policy names must be on this host, or every
// TypeScript run fails its set-up (the daemon still starts).
void assess_typescript(const Policy& p, std::vector<PolicyRisk>& risks) {
  if (!p.typescript.enabled) return;
  const TypeScriptPolicy& t = p.typescript;
  struct stat st{};
  const std::string how = " (Debian: apt-get install nodejs esbuild node-typescript node-acorn)";
  if (::stat(t.node.c_str(), &st) != 0)
    add_policy_key(risks, "/typescript/node", "typescript node " + q(t.node) + " is not on this host: every TypeScript run "
                                              "fails its set-up" + how);
  if (::stat(t.stripper().c_str(), &st) != 0)
    add_policy_key(risks, t.strip_types == "esbuild" ? "/typescript/esbuild" : "/typescript/typescript_module",
                   "typescript strip_types " + q(t.strip_types) + ": " + q(t.stripper()) +
                       " is not on this host: every TypeScript run fails its set-up" + how);
  if (::stat(std::string(kAcornPath).c_str(), &st) != 0)
    add_policy_key(risks, "/typescript", "typescript: the runner's parser " + q(kAcornPath) +
                                             " is not on this host: every TypeScript run fails its set-up" + how);
}

// The policy's keys first, in the order the explain page shows them, then
// the seccomp profile's.
std::vector<PolicyRisk> assess_policy(const Policy& p) {
  std::vector<PolicyRisk> risks;
  assess_network(p, risks);
  assess_packages(p, risks);
  assess_typescript(p, risks);
  assess_binds(p, risks);
  assess_environment(p, risks);
  assess_limits(p, risks);

  const policy::SeccompProfile* prof = p.seccomp_profile.get();
  if (prof == nullptr) {
    add_policy_key(risks, "/seccomp", "no seccomp profile is loaded");
    return risks;
  }
  const ProfileView view = view_profile(*prof);
  assess_default_action(view, risks);
  assess_pretending_entries(*prof, risks);
  if (action_runs_syscall(view.default_action)) assess_deny_list(view, risks);
  assess_allowed_by_name(view, risks);
  return risks;
}

// ---------------------------------------------------------------------------
// Lint.

std::string LintFinding::format() const {
  const char* sev = severity == LintSeverity::Error ? "error" : severity == LintSeverity::Warning ? "warning" : "note";
  std::string at = file;
  if (line > 0) at += ":" + std::to_string(line) + ":" + std::to_string(col);
  return at + ": " + sev + ": " + message;
}

int LintReport::exit_status() const {
  int rc = 0;
  for (const auto& f : findings) {
    if (f.severity == LintSeverity::Error) return 2;
    if (f.severity == LintSeverity::Warning) rc = 1;
  }
  return rc;
}

namespace {

std::optional<LocatedJson> parse_file(const std::string& path) {
  auto text = read_policy_text(path);
  if (!text.ok()) return std::nullopt;
  auto doc = parse_jsonc(*text, path);
  if (!doc.ok()) return std::nullopt;
  return std::move(doc).value();
}

// Fills file/line/col from the first document that has `pointer`.
bool locate(LintFinding& f, const std::vector<const LocatedJson*>& docs, const std::string& pointer) {
  for (const LocatedJson* d : docs) {
    if (d == nullptr) continue;
    auto it = d->locations.find(pointer);
    if (it == d->locations.end()) continue;
    f.file = d->source;
    f.line = it->second.line;
    f.col = it->second.col;
    return true;
  }
  return false;
}

// Points at `name` inside the "names" (or "name") of the entry at `entry`.
bool locate_name(LintFinding& f, const std::vector<const LocatedJson*>& docs, const std::string& entry,
                 const std::string& name) {
  for (const LocatedJson* d : docs) {
    if (d == nullptr || !d->locations.count(entry)) continue;
    for (std::size_t k = 0;; ++k) {
      const std::string ptr = json_pointer_append(entry + "/names", k);
      if (!d->locations.count(ptr)) break;
      const auto& v = d->value.at(nlohmann::json::json_pointer(ptr));
      if (v.is_string() && v.get<std::string>() == name) return locate(f, {d}, ptr);
    }
    return locate(f, {d}, entry + "/name");
  }
  return false;
}

// "file:line:col" -> the finding's position.
bool parse_where(LintFinding& f, const std::string& where) {
  static const std::regex re(R"(^(.*):(\d+):(\d+)$)");
  std::smatch m;
  if (!std::regex_match(where, m, re)) return false;
  f.file = m[1];
  f.line = std::stoi(m[2]);
  f.col = std::stoi(m[3]);
  return true;
}

}  // namespace

LintReport lint_policy_file(const std::string& path, const PolicyContext& ctx) {
  LintReport report;
  auto loaded = load_policy(path, ctx);
  if (!loaded.ok()) {
    LintFinding f;
    f.severity = LintSeverity::Error;
    f.file = path;
    f.message = loaded.error().message;
    // Loader messages carry "file:line:col: " after their context; lead
    // with it, as compilers do.
    static const std::regex re(R"(([^\s:]+):(\d+):(\d+): )");
    std::smatch m;
    if (std::regex_search(f.message, m, re)) {
      std::string rest = m.suffix();
      f.file = m[1];
      f.line = std::stoi(m[2]);
      f.col = std::stoi(m[3]);
      f.message = rest;
    }
    report.findings.push_back(std::move(f));
    return report;
  }
  const Policy& p = *loaded;
  const auto main_doc = parse_file(path);
  const auto inc_doc = p.include.empty() ? std::nullopt : parse_file(p.include);
  const LocatedJson* main_ptr = main_doc ? &*main_doc : nullptr;
  const LocatedJson* inc_ptr = inc_doc ? &*inc_doc : nullptr;

  // The seccomp profile's own document, and the prefix of its keys there.
  std::optional<LocatedJson> profile_doc;
  std::string profile_prefix;
  std::vector<const LocatedJson*> profile_docs;
  const std::string inline_suffix = "#/seccomp/inline";
  if (p.seccomp_source.size() > inline_suffix.size() &&
      p.seccomp_source.compare(p.seccomp_source.size() - inline_suffix.size(), inline_suffix.size(), inline_suffix) == 0) {
    profile_prefix = "/seccomp/inline";
    profile_docs = {main_ptr, inc_ptr};
  } else if (!p.seccomp_source.empty()) {
    profile_doc = parse_file(p.seccomp_source);
    profile_docs = {profile_doc ? &*profile_doc : nullptr};
  }

  std::vector<LintFinding> own, profile;
  for (const auto& r : assess_policy(p)) {
    LintFinding f;
    f.severity = r.severity;
    f.file = path;
    f.message = r.message;
    switch (r.anchor) {
      case PolicyRisk::Anchor::PolicyKey:
        locate(f, {main_ptr, inc_ptr}, r.pointer);
        break;
      case PolicyRisk::Anchor::ProfileKey:
        if (!locate(f, profile_docs, profile_prefix + r.pointer)) {
          f.file = p.seccomp_source;
          locate(f, profile_docs, profile_prefix);
        }
        break;
      case PolicyRisk::Anchor::ProfileEntry:
        if (!r.syscall.empty() && locate_name(f, profile_docs, profile_prefix + r.pointer, r.syscall)) break;
        if (!parse_where(f, r.where)) f.file = p.seccomp_source;
        break;
    }
    (f.file == path ? own : profile).push_back(std::move(f));
  }
  const auto by_position = [](const LintFinding& a, const LintFinding& b) {
    return std::tie(a.file, a.line, a.col, a.message) < std::tie(b.file, b.line, b.col, b.message);
  };
  std::stable_sort(own.begin(), own.end(), by_position);
  std::stable_sort(profile.begin(), profile.end(), by_position);
  report.findings = std::move(own);
  report.findings.insert(report.findings.end(), profile.begin(), profile.end());
  return report;
}

}  // namespace tsb::core
