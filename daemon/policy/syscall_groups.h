// Named groups of syscalls: the vocabulary `toolsandbox policy explain` and
// `policy lint` speak. The names follow systemd's SystemCallFilter= groups
// ("@basic-io", "@mount", ...) because auditors already know them; the
// membership and help texts are ours and describe what a sandboxed tool does
// with each group.
//
// Policy as data: the table is sorted by name, every group has a help string,
// every member is a syscall name libseccomp resolves or a reference to
// another group ("@chown"), and references form no cycle. The unit tests
// (tests/unit/seccomp_test.cc) enforce all of that.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "isolate/base/result.h"

namespace tsb::policy {

struct SyscallGroup {
  std::string_view name;   // "@basic-io"
  std::string_view help;   // one sentence for people reading a policy
  // Sorted; "@group" references sort first. Names may include other
  // architectures' variants ("chown32") so third-party profiles explain too.
  std::span<const std::string_view> members;
  // Allowing any member in a sandbox policy deserves a written reason; lint
  // reports it. (Harmless-without-capabilities calls live in these groups
  // too: lint may accept them with argument rules or an explicit note.)
  bool dangerous = false;
};

// Every group, sorted by name.
std::span<const SyscallGroup> syscall_groups() noexcept;

// The group called `name` ("@mount"), or nullptr.
const SyscallGroup* find_syscall_group(std::string_view name) noexcept;

// The syscalls of a group with references expanded: sorted, no duplicates.
// Errors name an unknown group or a reference cycle.
Result<std::vector<std::string>> expand_syscall_group(std::string_view name);

// Names of the groups that list `syscall` directly or through a reference,
// in table order.
std::vector<std::string_view> syscall_groups_of(std::string_view syscall);

}  // namespace tsb::policy
