// toolsandbox policy: check, explain, fingerprint, lint.
//
//   check FILE...          load each policy as the daemon would; one summary
//                          line per file, or the loader's message. Exit 0 when
//                          every file loads, 1 otherwise.
//   fingerprint FILE...    "sha256:<hex>  FILE" per file (exit as check).
//   explain NAME|FILE      the review page (daemon/core/policy_explain.h).
//       --compare PROFILE  instead: the syscall-by-syscall differences with an
//                          OCI/Moby profile (names this libseccomp does not
//                          know are dropped from its allow rules and listed).
//       --no-host          leave out the "[host]" lines about this machine.
//   lint FILE...           warnings for risky grants (daemon/core/policy_lint.h).
//                          Exit 0 none, 1 warnings, 2 a file does not load.
//       --notes            also print the notes (grants from dangerous groups
//                          that are inert in a toolsandboxd sandbox).
//
// Every verb takes --config FILE (the daemon configuration whose
// bind_allowlist applies; default /etc/toolsandboxd/toolsandboxd.json when it
// exists) and --bind-allow PATH (repeatable, added to that allow-list).
// Output goes to stdout, errors to stderr; both are stable (sorted, no
// timestamps, paths as given) so they can be diffed and kept in review.
#include <cstdio>

#include "daemon/cli/cli.h"
#include "daemon/core/config.h"
#include "daemon/core/policy.h"
#include "daemon/core/policy_explain.h"
#include "daemon/core/policy_lint.h"

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
};

int usage_error(const std::string& sub, const std::string& msg) {
  std::fprintf(stderr, "toolsandbox policy %s: %s\n", sub.c_str(), msg.c_str());
  return kExitUsage;
}

// Fills `out`, or returns a usage error message.
std::optional<std::string> parse_args(const std::string& sub, const std::vector<std::string>& args, PolicyArgs& out) {
  for (std::size_t i = 1; i < args.size(); ++i) {
    const std::string& a = args[i];
    const auto value = [&](const char* what) -> std::optional<std::string> {
      if (i + 1 >= args.size()) return std::nullopt;
      (void)what;
      return args[++i];
    };
    if (a == "--config") {
      auto v = value("FILE");
      if (!v) return "--config needs the daemon configuration file";
      out.config = *v;
    } else if (a == "--bind-allow") {
      auto v = value("PATH");
      if (!v || v->empty() || (*v)[0] != '/') return "--bind-allow needs an absolute host path";
      out.bind_allow.push_back(*v);
    } else if (a == "--compare" && sub == "explain") {
      auto v = value("PROFILE");
      if (!v) return "--compare needs a seccomp profile file";
      out.compare = *v;
    } else if (a == "--no-host" && sub == "explain") {
      out.host_facts = false;
    } else if (a == "--notes" && sub == "lint") {
      out.notes = true;
    } else if (a == "--") {
      out.operands.insert(out.operands.end(), args.begin() + static_cast<long>(i) + 1, args.end());
      break;
    } else if (a.size() > 1 && a[0] == '-') {
      return "unknown option '" + a + "'";
    } else {
      out.operands.push_back(a);
    }
  }
  return std::nullopt;
}

// The bind allow-list the daemon would apply.
Result<core::PolicyContext> context_from(const PolicyArgs& a) {
  core::PolicyContext ctx;
  const bool explicit_config = a.config.has_value();
  const std::string path = explicit_config ? *a.config : std::string(TSB_SYSCONFDIR) + "/toolsandboxd.json";
  auto cfg = core::load_daemon_config(path, !explicit_config);
  if (!cfg.ok()) return std::move(cfg).error().wrap("daemon configuration");
  ctx.bind_allowlist = cfg->bind_allowlist;
  ctx.bind_allowlist.insert(ctx.bind_allowlist.end(), a.bind_allow.begin(), a.bind_allow.end());
  return ctx;
}

int cmd_check(const std::string& sub, const PolicyArgs& a, const core::PolicyContext& ctx) {
  int rc = 0;
  for (const auto& ref : a.operands) {
    auto p = resolve_policy(ref, ctx);
    if (!p.ok()) {
      std::fprintf(stderr, "%s\n", p.error().message.c_str());
      rc = 1;
      continue;
    }
    if (sub == "fingerprint") std::printf("%s  %s\n", p->fingerprint.c_str(), ref.c_str());
    else std::printf("%s\n", core::check_summary(ref, *p).c_str());
  }
  return rc;
}

int cmd_explain(const PolicyArgs& a, const core::PolicyContext& ctx) {
  auto p = resolve_policy(a.operands[0], ctx);
  if (!p.ok()) {
    std::fprintf(stderr, "%s\n", p.error().message.c_str());
    return 1;
  }
  if (!a.compare) {
    core::ExplainOptions options;
    options.host_facts = a.host_facts;
    std::fputs(core::explain_policy(*p, options).c_str(), stdout);
    return 0;
  }
  // Third-party profiles list syscalls newer than this libseccomp; dropping
  // those from allow rules only makes that profile stricter, and the page
  // lists every name dropped.
  isolate::SeccompParseOptions lenient;
  lenient.unresolvable_syscalls = isolate::SeccompParseOptions::UnresolvableSyscalls::SkipInAllowRules;
  auto other = isolate::load_seccomp_profile_file(*a.compare, lenient);
  if (!other.ok()) {
    std::fprintf(stderr, "%s\n", other.error().wrap("--compare").message.c_str());
    return 1;
  }
  std::fputs(core::compare_profiles(*p, *other, *a.compare).c_str(), stdout);
  return 0;
}

int cmd_lint(const PolicyArgs& a, const core::PolicyContext& ctx) {
  int rc = 0;
  for (const auto& file : a.operands) {
    const core::LintReport report = core::lint_policy_file(file, ctx);
    for (const auto& f : report.findings) {
      if (f.severity == core::LintSeverity::Note && !a.notes) continue;
      std::FILE* out = f.severity == core::LintSeverity::Error ? stderr : stdout;
      std::fprintf(out, "%s\n", f.format().c_str());
    }
    rc = std::max(rc, report.exit_status());
  }
  return rc;
}

constexpr const char* kPolicyUsage =
    "usage: toolsandbox policy check FILE... [--config FILE] [--bind-allow PATH]...\n"
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
    std::fprintf(stderr, "toolsandbox policy: unknown subcommand '%s'\n", sub.c_str());
    return kExitUsage;
  }
  PolicyArgs a;
  if (auto err = parse_args(sub, args, a)) return usage_error(sub, *err);
  if (sub == "explain" && a.operands.size() != 1) return usage_error(sub, "need exactly one NAME or FILE");
  if (a.operands.empty()) return usage_error(sub, "need at least one FILE");

  auto ctx = context_from(a);
  if (!ctx.ok()) {
    std::fprintf(stderr, "%s\n", ctx.error().message.c_str());
    return sub == "lint" ? 2 : 1;
  }
  if (sub == "check" || sub == "fingerprint") return cmd_check(sub, a, *ctx);
  if (sub == "explain") return cmd_explain(a, *ctx);
  return cmd_lint(a, *ctx);
}

}  // namespace tsb::cli
