// Parent side: turns a RunSpec into the ChildPlan the sandbox executes.
// Everything that allocates happens here, before clone3.
#pragma once

#include <deque>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "isolate/child.h"
#include "isolate/result.h"
#include "isolate/spec.h"

namespace tsb::isolate {

// Owns every byte the plan points to. Must outlive clone3 (not the run).
struct PlanStorage {
  std::deque<std::string> strings;  // deque: c_str() pointers stay valid on growth
  std::vector<MountStep> steps;
  std::vector<const char*> argv;
  std::vector<const char*> envp;
  std::vector<RlimitStep> rlimits;
  std::set<std::string> made_dirs;  // sandbox paths already in the plan

  const char* keep(std::string s) { return strings.emplace_back(std::move(s)).c_str(); }
};

struct PlanInputs {
  const RunSpec* spec;
  std::string staging_root;  // host path where the root tmpfs is mounted
  std::uint64_t root_tmpfs_bytes;
};

// Fills `plan` (its fd fields and filter/caps are set by the caller).
Status build_plan(const PlanInputs& in, PlanStorage& storage, ChildPlan& plan);

// Validate a sandbox-side path: absolute, normalised, no "..", no "//".
Status check_sandbox_path(const std::string& p, const char* what);

// Host paths every sandbox gets read-only, with the reason for each: the
// system directories (merged-/usr aware: a symlink on the host is recreated
// as that symlink), the /etc files every run gets, the /etc files only runs
// with network get, and the device nodes bound into /dev. One table, used
// by the plan and by `toolsandbox policy explain`.
struct SystemPath {
  const char* path;
  const char* reason;
};
std::span<const SystemPath> system_paths();
std::span<const SystemPath> etc_paths_always();
std::span<const SystemPath> etc_paths_network();
std::span<const char* const> device_names();

// The /proc entries hidden or frozen in every sandbox, with reasons.
struct ProcMask {
  const char* path;    // under /proc
  enum Kind { kFile, kDir, kReadOnly } kind;
  const char* reason;
};
const std::vector<ProcMask>& proc_masks();

}  // namespace tsb::isolate
