// `toolsandbox policy lint`: risky grants in policies that load. A policy
// that does not load is an error (what `policy check` says); one that loads
// may still grant more than a reviewer expects, and each such grant is one
// warning line pointing at the key or the seccomp entry that grants it:
//
//   privileged.json:24:14: warning: network "host": ...
//   seccomp/custom.json:40:5: warning: syscall "ptrace" allowed: ...
//   policy.json: warning: ...                 (position unknown)
//
// Notes name grants that look dangerous by their group but are inert in
// every toolsandboxd sandbox (chown without CAP_CHOWN, ...). They carry the
// reason, never change the exit status, and the command line prints them
// only with --notes (`policy explain` lists them under "Accepted").
//
// The tables of what counts as risky are data with reasons (below, and in
// policy_lint.cc), shared with `policy explain`'s "Dangerous grants".
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "daemon/policy/policy.h"

namespace tsb::core {

enum class LintSeverity { Note, Warning, Error };

// One risky grant of a loaded policy, as `explain` and `lint` report it.
struct PolicyRisk {
  LintSeverity severity = LintSeverity::Warning;  // Note or Warning
  // Where the grant is written, in one of two forms: a JSON pointer into
  // the policy ("/network") or into its seccomp profile ("/defaultAction"),
  // or the "file:line:col" of a seccomp entry.
  enum class Anchor { PolicyKey, ProfileKey, ProfileEntry } anchor = Anchor::PolicyKey;
  std::string pointer;  // PolicyKey, ProfileKey; ProfileEntry: the entry's pointer in its profile
  std::string where;    // ProfileEntry
  std::string syscall;  // ProfileEntry about one syscall: its name, to point at it in "names"
  std::string message;  // one sentence, no trailing period
};

// Every risk of `policy`, policy keys first (in page order), then the
// seccomp profile's, each group sorted.
std::vector<PolicyRisk> assess_policy(const Policy& policy);

// Why allowing `syscall` in a tool's filter is dangerous, or nothing.
// `conditional`: only for some arguments (clone with a flag mask is fine;
// ptrace is dangerous with or without conditions).
std::optional<std::string> dangerous_syscall_reason(std::string_view syscall, bool conditional);
// Why a syscall from a dangerous group does no harm in a toolsandboxd
// sandbox (no capabilities, setgroups denied), or nothing.
std::optional<std::string_view> inert_syscall_reason(std::string_view syscall);
// Why binding `host_path` into a sandbox is dangerous, or nothing.
std::optional<std::string> sensitive_host_path_reason(std::string_view host_path);

struct LintFinding {
  LintSeverity severity = LintSeverity::Warning;
  std::string file;  // as given on the command line, or as the loader named it
  int line = 0;      // 0: position unknown
  int col = 0;
  std::string message;

  // "file:line:col: warning: message", or "file: warning: message".
  std::string format() const;
};

struct LintReport {
  std::vector<LintFinding> findings;
  // 0 no warnings, 1 warnings, 2 errors (a file that does not load).
  int exit_status() const;
};

// Loads `path` (with ctx's bind allow-list; seccomp compiled) and reports
// its risks; a load error is one Error finding carrying the loader's message.
LintReport lint_policy_file(const std::string& path, const PolicyContext& ctx);

}  // namespace tsb::core
