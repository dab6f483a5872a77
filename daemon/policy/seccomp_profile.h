// Seccomp profiles in the OCI/Moby JSON format: parsed strictly and
// compiled once per policy with libseccomp into the plain program the engine
// loads in the sandbox (isolate/engine/seccomp.h). Also the sandbox init's own
// fixed filter.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "daemon/policy/jsonc.h"
#include "isolate/base/result.h"
#include "isolate/engine/engine.h"
#include "isolate/engine/seccomp.h"

namespace tsb::policy {

enum class SeccompAction { Allow, Errno, KillProcess, KillThread, Trap, Log, Trace };

// One argument comparison of a rule (OCI "args" entry).
struct SeccompArg {
  unsigned index = 0;            // 0..5
  std::uint64_t value = 0;
  std::uint64_t value_two = 0;   // the datum for SCMP_CMP_MASKED_EQ (value is the mask)
  std::string op;                // "SCMP_CMP_EQ", "SCMP_CMP_MASKED_EQ", ...
};

// One entry of "syscalls".
struct SeccompRule {
  std::vector<std::string> names;
  SeccompAction action = SeccompAction::Allow;
  int errno_ret = 0;  // for Errno: the errno returned (OCI "errnoRet"; default EPERM)
  std::vector<SeccompArg> args;
  std::string comment;
  std::string pointer;  // JSON pointer of the entry in its file, for messages
  std::string where;    // "file:line:col" of the entry, for messages
};

struct SeccompProfile {
  std::string source;  // file path or "<inline>", for messages
  SeccompAction default_action = SeccompAction::Errno;
  int default_errno = 1;  // EPERM
  std::vector<std::string> architectures;  // SCMP_ARCH_* names, native first
  std::vector<SeccompRule> rules;           // after includes/excludes were resolved
  // Names dropped from allow rules under SeccompParseOptions::
  // UnresolvableSyscalls::SkipInAllowRules, each as "file:line:col: name".
  std::vector<std::string> skipped_syscalls;
};

// How a profile is resolved against the machine. The defaults are the strict
// production behaviour; the overrides exist for tests and for linting a
// profile meant for another host.
struct SeccompParseOptions {
  enum class UnresolvableSyscalls {
    // A name libseccomp cannot resolve is a load error (production).
    Error,
    // Drop such a name, and record it in skipped_syscalls, only from a rule
    // whose action is Allow while the default action is not: dropping it can
    // only make the filter stricter. Anywhere else it is still an error. For
    // third-party profiles that list syscalls newer than libseccomp.
    SkipInAllowRules,
  };
  UnresolvableSyscalls unresolvable_syscalls = UnresolvableSyscalls::Error;
  std::string native_arch;     // SCMP_ARCH_* name; "" = this machine
  std::string kernel_release;  // compared with minKernel; "" = uname(2)
};

// The engine's plain program type (isolate/engine/seccomp.h).
using isolate::SeccompProgram;

// Parse a profile (JSON, comments allowed). Strict: unknown keys, wrong
// types, unknown actions, operators, architectures and syscall names are
// errors that name the file and the JSON pointer (and line:col when known).
// includes/excludes are resolved here, for a tool with no capabilities:
// an entry that includes caps is dropped, one that excludes caps is kept;
// arches are compared with the native architecture, minKernel with uname.
// A syscall defined twice with different actions where libseccomp would
// silently keep one of them is an error naming both places.
Result<SeccompProfile> parse_seccomp_profile(std::string_view text, std::string_view source);
Result<SeccompProfile> parse_seccomp_profile(std::string_view text, std::string_view source,
                                             const SeccompParseOptions& options);
// The same, from a document parse_jsonc already read (one parse where the
// caller also needs the document itself).
Result<SeccompProfile> parse_seccomp_profile(const LocatedJson& doc, const SeccompParseOptions& options = {});
Result<SeccompProfile> load_seccomp_profile_file(const std::string& path);
Result<SeccompProfile> load_seccomp_profile_file(const std::string& path,
                                                 const SeccompParseOptions& options);

// "SCMP_ACT_ERRNO(38)", "SCMP_ACT_ALLOW", ...: the OCI spelling, for messages
// and for `policy explain`.
std::string seccomp_action_name(SeccompAction action, int errno_ret = 0);

// The SCMP_ARCH_* name of the machine this process runs on.
std::string seccomp_native_arch();

// The syscalls compile_init_filter() allows, in the order it adds them.
const std::vector<std::string>& init_filter_syscalls();

// Compile with libseccomp for the native architecture (plus the profile's
// listed ones). Never call on the per-run path.
Result<std::shared_ptr<const SeccompProgram>> compile_seccomp(const SeccompProfile& profile);

// The small fixed filter the sandbox init (pid 1) loads on itself: only what
// a reaper needs (wait, signals, write of one report, exit).
Result<std::shared_ptr<const SeccompProgram>> compile_init_filter();

}  // namespace tsb::policy
