// `toolsandbox policy explain`: what a policy lets a tool do, as one plain
// text page a reviewer can read and diff. The page is stable: sections in a
// fixed order, lists sorted, no timestamps, and paths only as the policy or
// the command line gave them. Facts about the machine it runs on (which of
// /lib32, /libx32 exist, where a symlink points) are on lines of their own
// that start with "[host]", so they can be left out (ExplainOptions) or
// filtered from a snapshot. Lines that start with "!" are dangerous grants;
// every one of them is listed again under "Dangerous grants", which says the
// same as `policy lint` (daemon/policy/policy_lint.h).
//
// The syscall vocabulary is daemon/policy/syscall_groups.h; the file-system
// rows are the one table (daemon/policy/fs_table.h) the engine and
// toolsandbox-init execute, reasons included, so the page cannot drift from
// what is built.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "daemon/policy/policy.h"
#include "daemon/policy/seccomp_profile.h"

namespace tsb::core {

// ---------------------------------------------------------------------------
// A seccomp profile seen syscall by syscall.

// One rule's effect on one syscall: `action` when every comparison in
// `args` holds (always, when `args` is empty).
struct SyscallRuleView {
  policy::SeccompAction action = policy::SeccompAction::Allow;
  int data = 0;  // errno for Errno, the tracer's datum for Trace
  std::vector<policy::SeccompArg> args;
  std::string where;    // "file:line:col" of the syscalls entry
  std::string pointer;  // JSON pointer of the entry in its profile ("/syscalls/3")
};

struct ProfileView {
  policy::SeccompAction default_action = policy::SeccompAction::Errno;
  int default_data = 0;
  // Every syscall the profile names (entries that apply to this machine),
  // with its rules in file order.
  std::map<std::string, std::vector<SyscallRuleView>> syscalls;
};

ProfileView view_profile(const policy::SeccompProfile& profile);

// Allow and Log let the call run (Log only adds an audit record).
bool action_runs_syscall(policy::SeccompAction action) noexcept;

// How a named syscall fares: always allowed, allowed for some arguments
// (an allowing rule with comparisons), or never allowed.
enum class SyscallFate { Allowed, AllowedSometimes, Refused };
SyscallFate syscall_fate(const ProfileView& view, const std::string& name);

// "EPERM (1)", "ENOSYS (38)", "errno 0 (reports success without running)".
std::string errno_label(int err);
// What the caller of a syscall observes under an action: "allowed",
// "allowed, logged", "EPERM (1)", "kills the process", ...
std::string action_effect(policy::SeccompAction action, int data);

// The comparisons of `rules` (all for `syscall`) in readable form, one
// clause per alternative: rules are ORed, the comparisons of a rule ANDed.
// Single equality tests of one argument merge into one clause:
//   "family (arg0) is AF_UNIX, AF_INET, AF_INET6"
std::vector<std::string> describe_conditions(std::string_view syscall, const std::vector<SyscallRuleView>& rules);

// ---------------------------------------------------------------------------
// The page.

struct ExplainOptions {
  // Add "[host]" lines describing this machine (what the engine would make
  // of each host path here). Off for snapshots and for pages meant to be
  // compared across hosts.
  bool host_facts = true;
};

std::string explain_policy(const Policy& policy, const ExplainOptions& options = {});

// One row of the file-system table, in the order the sandbox is built, in
// the page's words.
struct MountRow {
  std::string path;    // inside the sandbox
  std::string type;    // tmpfs, system, view, bind, file, dir, proc, device, symlink, masked
  std::string mode;    // ro, rw, rw,noexec, ...
  std::string source;  // "host /usr", "generated", "64MiB", "-> /proc/self/fd"
  std::string note;    // the row's reason
  bool optional = false;   // skipped when the host lacks it
  bool flagged = false;    // a dangerous grant
  bool inside_parent_mount = false;  // made by the engine inside the mount above (/dev's nodes), not a step
  isolate::FsEntry entry;  // the table's row
};
// The rows for `policy`: its tool-mode table (the script-mode one without
// the runner's row), as isolate::build_fs_table makes it.
std::vector<MountRow> mount_rows(const Policy& policy);

// `toolsandbox policy explain NAME --compare PROFILE`: the differences
// between the policy's profile and `other`, syscall by syscall, sorted by
// name, ending with a count line. `other_label` names it in the page.
std::string compare_profiles(const Policy& policy, const policy::SeccompProfile& other, const std::string& other_label);

// The one line `policy check` prints for a policy that loads.
std::string check_summary(const std::string& argument, const Policy& policy);

}  // namespace tsb::core
