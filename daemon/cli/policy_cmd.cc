// toolsandbox policy: check, explain, fingerprint, lint.
//
//   check FILE...          load each policy as the daemon would; one summary
//                          line per file, or the loader's message. An
//                          organizations file is loaded with its own loader
//                          and every policy it names must be among the
//                          policies checked (see check_organizations below).
//                          Exit 0 when every file loads, 1 otherwise.
//       --e2b              as a daemon with E2B: E2B must be able to run
//                          as written (daemon/policy/e2b_network.h) every
//                          policy a delegated entry of an organizations file
//                          among the operands may run under, or, with no
//                          organizations file, every policy. A configuration
//                          that enables E2B implies it for organizations files.
//   fingerprint FILE...    "sha256:<hex>  FILE" per file (exit as check);
//                          organizations files are skipped with a note.
//   explain NAME|FILE      the review page (daemon/policy/policy_explain.h).
//       --compare PROFILE  instead: the syscall-by-syscall differences with an
//                          OCI/Moby profile (names this libseccomp does not
//                          know are dropped from its allow rules and listed).
//       --no-host          leave out the "[host]" lines about this machine.
//   lint FILE...           warnings for risky grants (daemon/policy/policy_lint.h).
//                          Exit 0 none, 1 warnings, 2 a file does not load.
//                          Organizations files are skipped with a note.
//       --notes            also print the notes (grants from dangerous groups
//                          that are inert in a toolsandboxd sandbox).
//
// Every verb takes --config FILE (the daemon configuration whose
// bind_allowlist applies; default <sysconfdir>/toolsandboxd/toolsandboxd.json,
// as toolsandboxd's, when it exists) and --bind-allow PATH (repeatable, added to that allow-list).
// Output goes to stdout, errors to stderr; both are stable (sorted, no
// timestamps, paths as given) so they can be diffed and kept in review.
#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <set>

#include "daemon/common/quote.h"
#include "daemon/cli/cli.h"
#include "daemon/policy/config.h"
#include "daemon/policy/e2b_network.h"
#include "daemon/policy/embedded.h"
#include "daemon/policy/policy.h"
#include "daemon/policy/policy_explain.h"
#include "daemon/policy/policy_lint.h"
#include "daemon/policy/registry.h"
#include "daemon/policy/jsonc.h"

namespace tsb::cli {

Result<core::Policy> resolve_policy(const std::string& ref, const core::PolicyContext& ctx);

namespace {

struct PolicyArgs {
  std::vector<std::string> operands;
  std::optional<std::string> config;
  std::vector<std::string> bind_allow;
  std::optional<std::string> compare;
  bool host_facts = true;
  bool notes = false;
  bool e2b = false;       // check --e2b
  bool e2b_orgs = false;  // --e2b, or the configuration enables E2B: delegated entries checked
};

int usage_error(const std::string& sub, const std::string& msg) {
  print_line(stderr, "toolsandbox policy %s: %s", sub.c_str(), msg.c_str());
  return kExitUsage;
}

// Fills `out`, or returns a usage error message.
std::optional<std::string> parse_args(const std::string& sub, const std::vector<std::string>& args, PolicyArgs& out) {
  std::vector<OptionSpec> opts = {{"config", "the daemon configuration file"}, {"bind-allow", "an absolute host path"}};
  if (sub == "explain") {
    opts.push_back({"compare", "a seccomp profile file"});
    opts.push_back({"no-host", nullptr});
  }
  if (sub == "lint") opts.push_back({"notes", nullptr});
  if (sub == "check") opts.push_back({"e2b", nullptr});
  // args[0] is the sub-command.
  const std::vector<std::string> rest(args.begin() + (args.empty() ? 0 : 1), args.end());
  return parse_options(rest, opts, /*operands_after_dashdash_only=*/false,
                       [&](const std::string& name, const std::string& v) -> std::optional<std::string> {
                         if (name == "config") out.config = v;
                         else if (name == "bind-allow") {
                           if (v.empty() || v[0] != '/') return "--bind-allow needs an absolute host path";
                           out.bind_allow.push_back(v);
                         } else if (name == "compare") out.compare = v;
                         else if (name == "no-host") out.host_facts = false;
                         else if (name == "notes") out.notes = true;
                         else if (name == "e2b") out.e2b = true;
                         return std::nullopt;
                       },
                       &out.operands);
}

// The bind allow-list the daemon would apply; `e2b` set when its
// configuration enables E2B.
Result<core::PolicyContext> context_from(const PolicyArgs& a, bool& e2b) {
  core::PolicyContext ctx;
  const bool explicit_config = a.config.has_value();
  const std::string path = explicit_config ? *a.config : std::string(TSB_SYSCONFDIR) + "/toolsandboxd.json";
  auto cfg = core::load_daemon_config(path, !explicit_config);
  if (!cfg.ok()) return std::move(cfg).error().wrap("daemon configuration");
  ctx.bind_allowlist = cfg->bind_allowlist;
  e2b = cfg->e2b.enabled;
  ctx.bind_allowlist.insert(ctx.bind_allowlist.end(), a.bind_allow.begin(), a.bind_allow.end());
  return ctx;
}

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// resolve_policy's rule (run.cc): anything with a '/' or ending in ".json"
// is a file, the rest a NAME.
bool is_policy_file_ref(const std::string& ref) {
  return ref.find('/') != std::string::npos || (ref.size() > 5 && ends_with(ref, ".json"));
}

// The name the daemon would know the policy by: the file's stem, or the NAME.
std::string policy_name_of(const std::string& ref) {
  if (!is_policy_file_ref(ref)) return ref;
  std::string stem = ref.substr(ref.rfind('/') == std::string::npos ? 0 : ref.rfind('/') + 1);
  if (ends_with(stem, ".json")) stem.resize(stem.size() - 5);
  return stem;
}

// Where an operand naming an organizations file points: the file, and the
// directory its neighbouring policies live in ("" for the embedded set).
struct OrgsRef {
  std::string path;
  std::string policies_dir;
};

// Whether an operand is an organizations file rather than a policy:
//   - the NAME "organizations" (the installed file, else the embedded one),
//     or a file named organizations.json, which the daemon never loads as a
//     policy either (daemon/policy/registry.cc, load_policy_set);
//   - or a file whose top level has "organizations" or "default", keys only
//     an organizations file has (policies/schema/organizations.schema.json).
// A file that cannot be read or parsed is not sniffed: the policy loader
// then gives its message.
std::optional<OrgsRef> organizations_operand(const std::string& ref) {
  if (ref == "organizations") {
    const std::string dir = std::string(TSB_SYSCONFDIR) + "/policies";
    struct stat st{};
    if (::stat((dir + "/organizations.json").c_str(), &st) == 0) return OrgsRef{dir + "/organizations.json", dir};
    return OrgsRef{"embedded:organizations.json", ""};
  }
  if (!is_policy_file_ref(ref)) return std::nullopt;
  const auto slash = ref.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : ref.substr(0, slash);
  const std::string base = slash == std::string::npos ? ref : ref.substr(slash + 1);
  if (base == "organizations.json") return OrgsRef{ref, dir};
  auto text = core::read_policy_text(ref);
  if (!text.ok()) return std::nullopt;
  auto doc = parse_jsonc(*text, ref);
  if (!doc.ok() || !doc->value.is_object()) return std::nullopt;
  if (doc->value.contains("organizations") || doc->value.contains("default")) return OrgsRef{ref, dir};
  return std::nullopt;
}

// The policy names a daemon would load from `dir`: every *.json but
// organizations.json (load_policy_set), or the embedded policies.
std::set<std::string> neighbour_policies(const std::string& dir) {
  std::set<std::string> names;
  if (dir.empty()) {
    for (auto f : core::embedded_files()) {
      std::string n(f);
      if (n.find('/') == std::string::npos && ends_with(n, ".json") && n != "organizations.json")
        names.insert(n.substr(0, n.size() - 5));
    }
    return names;
  }
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      std::string n = e->d_name;
      if (n.size() > 5 && ends_with(n, ".json") && n != "organizations.json" && n[0] != '.')
        names.insert(n.substr(0, n.size() - 5));
    }
    ::closedir(d);
  }
  return names;
}

std::string joined(const std::set<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out.empty() ? "none" : out;
}

// What `check` found for one operand: its line, and whether it is an error.
struct CheckLine {
  std::string text;
  bool error = false;
};

// An organizations file: loaded as the daemon loads it, then every policy an
// entry names (its "policy" and its "allowed_policies") must be one the
// daemon would have. Which set that is depends on the command: the policies
// checked by the same command when it checks any (`policy check
// policies/*.json` checks a policies directory as a daemon would load it),
// else the policies next to the organizations file (for the embedded one,
// the embedded policies). One line: the summary, or every problem found.
// With E2B (`e2b`), an entry's e2b_policy is named too, and the policies
// checked that a delegated entry may run under must be ones E2B can run.
std::vector<CheckLine> check_organizations(const std::string& ref, const OrgsRef& orgs_ref,
                                           const std::map<std::string, std::shared_ptr<const core::Policy>>& policies,
                                           const std::set<std::string>& failed, bool policies_checked, bool e2b) {
  std::set<std::string> loaded;
  for (const auto& [name, p] : policies) loaded.insert(name);
  auto orgs = core::load_organizations(orgs_ref.path);
  if (!orgs.ok()) {
    // Named like the policy loader's messages ("policy: ..."); a read error
    // already is.
    const std::string& m = orgs.error().message;
    return {{m.rfind("organizations: ", 0) == 0 ? m : "organizations: " + m, true}};
  }
  const std::set<std::string> neighbours = policies_checked ? std::set<std::string>{} : neighbour_policies(orgs_ref.policies_dir);
  const std::set<std::string>& known = policies_checked ? loaded : neighbours;

  std::vector<CheckLine> problems;
  std::set<std::string> named;
  std::size_t privileged = orgs->fallback.privileged ? 1 : 0;
  const auto check_entry = [&](const core::OrgEntry& e, const std::string& who) {
    std::vector<std::string> names = e.allowed_policies;
    if (e2b && !e.privileged && !e.e2b_policy.empty()) names.push_back(e.e2b_policy);
    for (const auto& n : names) {
      named.insert(n);
      if (known.count(n)) continue;
      std::string why;
      if (policies_checked && failed.count(n)) why = "which does not load (its message is above)";
      else if (policies_checked) why = "which is not among the policies checked (" + joined(loaded) + ")";
      else if (orgs_ref.policies_dir.empty()) why = "which is not among the embedded policies (" + joined(neighbours) + ")";
      else why = "which is not next to it (no " + n + ".json in " + orgs_ref.policies_dir + ")";
      problems.push_back({ref + ": " + who + " names policy " + quoted_for_message(n) + ", " + why, true});
    }
  };
  check_entry(orgs->fallback, "the default entry");
  for (const auto& [id, e] : orgs->orgs) {
    privileged += e.privileged ? 1 : 0;
    check_entry(e, "organization " + quoted_for_message(id));
  }
  if (problems.empty() && e2b && policies_checked)
    if (auto st = core::check_delegated_policies(*orgs, policies); !st.ok())
      problems.push_back({st.error().message, true});  // names the file already
  if (!problems.empty()) return problems;
  std::string line = ref + ": ok: organizations, " + std::to_string(orgs->orgs.size()) + " listed, " +
                     std::to_string(privileged) + " privileged entr" + (privileged == 1 ? "y" : "ies") +
                     ", default entry policy '" + orgs->fallback.policy + "'" +
                     (orgs->fallback.privileged ? " (privileged)" : "") + ", policies named: " + joined(named);
  return {{line, false}};
}

int cmd_check(const PolicyArgs& a, const core::PolicyContext& ctx) {
  // Policies first, so that the organizations files can be checked against
  // them; then every line in the order of the operands.
  std::vector<std::optional<OrgsRef>> kinds;
  for (const auto& ref : a.operands) kinds.push_back(organizations_operand(ref));
  const bool with_orgs = std::any_of(kinds.begin(), kinds.end(), [](const auto& k) { return k.has_value(); });
  std::vector<std::vector<CheckLine>> lines(a.operands.size());
  std::map<std::string, std::shared_ptr<const core::Policy>> loaded;
  std::set<std::string> failed;
  bool policies_checked = false;
  for (std::size_t i = 0; i < a.operands.size(); ++i) {
    const std::string& ref = a.operands[i];
    if (kinds[i]) continue;
    policies_checked = true;
    auto p = resolve_policy(ref, ctx);
    if (!p.ok()) {
      lines[i] = {{p.error().message, true}};
      failed.insert(policy_name_of(ref));
      continue;
    }
    // --e2b without an organizations file: as a policy that runs on E2B.
    if (const core::E2BNetwork net = core::e2b_network(*p); a.e2b && !with_orgs && !net.refusal.empty()) {
      lines[i] = {{ref + ": " + net.refused_at + ": E2B (--e2b) cannot run policy '" + p->name + "': " + net.refusal, true}};
      failed.insert(p->name);
      continue;
    }
    const std::string name = p->name;
    lines[i] = {{core::check_summary(ref, *p), false}};
    loaded[name] = std::make_shared<const core::Policy>(std::move(p).value());
  }
  for (std::size_t i = 0; i < a.operands.size(); ++i)
    if (kinds[i]) lines[i] = check_organizations(a.operands[i], *kinds[i], loaded, failed, policies_checked, a.e2b_orgs);
  int rc = 0;
  for (const auto& ls : lines) {
    for (const auto& l : ls) {
      print_line(l.error ? stderr : stdout, "%s", l.text.c_str());
      if (l.error) rc = 1;
    }
  }
  return rc;
}

void skipped_organizations(const std::string& sub, const std::string& ref) {
  print_line(stderr, "%s: skipped: an organizations file, not a policy (policy %s applies to policies; policy check checks it)",
               ref.c_str(), sub.c_str());
}

int cmd_fingerprint(const PolicyArgs& a, const core::PolicyContext& ctx) {
  int rc = 0;
  for (const auto& ref : a.operands) {
    if (organizations_operand(ref)) {
      skipped_organizations("fingerprint", ref);
      continue;
    }
    auto p = resolve_policy(ref, ctx);
    if (!p.ok()) {
      print_line(stderr, "%s", p.error().message.c_str());
      rc = 1;
      continue;
    }
    print_line(stdout, "%s  %s", p->fingerprint.c_str(), ref.c_str());
  }
  return rc;
}

int cmd_explain(const PolicyArgs& a, const core::PolicyContext& ctx) {
  if (organizations_operand(a.operands[0])) {
    print_line(stderr,
                 "%s: an organizations file, not a policy: explain describes one policy (policy check checks an "
                 "organizations file and the policies it names)",
                 a.operands[0].c_str());
    return 1;
  }
  auto p = resolve_policy(a.operands[0], ctx);
  if (!p.ok()) {
    print_line(stderr, "%s", p.error().message.c_str());
    return 1;
  }
  if (!a.compare) {
    core::ExplainOptions options;
    options.host_facts = a.host_facts;
    print_block(stdout, core::explain_policy(*p, options));
    return 0;
  }
  // Third-party profiles list syscalls newer than this libseccomp; dropping
  // those from allow rules only makes that profile stricter, and the page
  // lists every name dropped.
  policy::SeccompParseOptions lenient;
  lenient.unresolvable_syscalls = policy::SeccompParseOptions::UnresolvableSyscalls::SkipInAllowRules;
  auto other = policy::load_seccomp_profile_file(*a.compare, lenient);
  if (!other.ok()) {
    print_line(stderr, "%s", other.error().wrap("--compare").message.c_str());
    return 1;
  }
  print_block(stdout, core::compare_profiles(*p, *other, *a.compare));
  return 0;
}

int cmd_lint(const PolicyArgs& a, const core::PolicyContext& ctx) {
  int rc = 0;
  for (const auto& file : a.operands) {
    if (organizations_operand(file)) {
      skipped_organizations("lint", file);
      continue;
    }
    const core::LintReport report = core::lint_policy_file(file, ctx);
    for (const auto& f : report.findings) {
      if (f.severity == core::LintSeverity::Note && !a.notes) continue;
      std::FILE* out = f.severity == core::LintSeverity::Error ? stderr : stdout;
      print_line(out, "%s", f.format().c_str());
    }
    rc = std::max(rc, report.exit_status());
  }
  return rc;
}

constexpr const char* kPolicyUsage =
    "usage: toolsandbox policy check FILE... [--e2b] [--config FILE] [--bind-allow PATH]...\n"
    "       toolsandbox policy fingerprint FILE... [--config FILE] [--bind-allow PATH]...\n"
    "       toolsandbox policy explain NAME|FILE [--compare PROFILE] [--no-host] [--config FILE] [--bind-allow PATH]...\n"
    "       toolsandbox policy lint FILE... [--notes] [--config FILE] [--bind-allow PATH]...\n"
    "The policy format and every verb: policies/README.md.\n";

}  // namespace

int cmd_policy(const std::vector<std::string>& args) {
  if (args.empty()) {
    std::fputs(kPolicyUsage, stderr);
    return kExitUsage;
  }
  const std::string& sub = args[0];
  if (sub == "help" || sub == "-h" || sub == "--help") {
    std::fputs(kPolicyUsage, stdout);
    return 0;
  }
  if (sub != "check" && sub != "fingerprint" && sub != "explain" && sub != "lint") {
    print_line(stderr, "toolsandbox policy: unknown subcommand '%s'", sub.c_str());
    return kExitUsage;
  }
  PolicyArgs a;
  if (auto err = parse_args(sub, args, a)) return usage_error(sub, *err);
  if (sub == "explain" && a.operands.size() != 1) return usage_error(sub, "need exactly one NAME or FILE");
  if (a.operands.empty()) return usage_error(sub, "need at least one FILE");

  bool e2b_configured = false;
  auto ctx = context_from(a, e2b_configured);
  if (!ctx.ok()) {
    print_line(stderr, "%s", ctx.error().message.c_str());
    return sub == "lint" ? 2 : 1;
  }
  a.e2b_orgs = a.e2b || e2b_configured;
  if (sub == "check") return cmd_check(a, *ctx);
  if (sub == "fingerprint") return cmd_fingerprint(a, *ctx);
  if (sub == "explain") return cmd_explain(a, *ctx);
  return cmd_lint(a, *ctx);
}

}  // namespace tsb::cli
