// Parent side: turns a RunSpec into the ChildPlan the sandbox executes.
// Everything that allocates happens here, before clone3.
#pragma once

#include <deque>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "isolate/child.h"
#include "isolate/base/result.h"
#include "isolate/spec.h"

namespace tsb::isolate {

// A mount the parent makes before clone3 (isolate/mounts.h), handed to the
// child as a detached mount fd that its kAttach step moves into place. Made
// by the parent so that nothing of the host shows in the sandbox's
// /proc/self/mountinfo: a tmpfs made by the engine carries no uid= option
// (one made in the user namespace would show the run's host uid), and a
// read-only host directory is seen through an overlay whose root is "/"
// (a bind would show the host path it comes from, its device and the host
// file system's options).
struct MountRequest {
  enum Kind {
    kTmpfs,  // a tmpfs: `options`, its root directory owned by sandbox uid/gid
    kDev,    // the /dev tmpfs: the device nodes, the /proc/self/fd links, shm/
    kView,   // a host directory or file: read-only view, or a bind when writable
  };
  Kind kind;
  std::size_t step;             // the kAttach step in PlanStorage::steps that gets the fd
  std::string host_path;        // kView
  bool writable = false;        // kView: a bind of the host tree (it shows its host path)
  bool is_dir = true;           // kView
  std::string options;          // kTmpfs, kDev: "size=...,nr_inodes=...,mode=..."
  std::uint32_t uid = 0;        // kTmpfs, kDev: owner of the root directory, as sandbox ids
  std::uint32_t gid = 0;
  std::uint64_t attrs = 0;      // MOUNT_ATTR_* of the mount
};

// Owns every byte the plan points to. Must outlive clone3 (not the run).
struct PlanStorage {
  std::deque<std::string> strings;  // deque: c_str() pointers stay valid on growth
  std::vector<MountStep> steps;
  std::vector<MountRequest> mounts;  // made by prepare_mounts(), in this order
  MountRequest root;                 // the root tmpfs (plan.root_fd)
  std::vector<const char*> argv;
  std::vector<const char*> envp;
  std::vector<RlimitStep> rlimits;
  std::set<std::string> made_dirs;  // sandbox paths already in the plan

  const char* keep(std::string s) { return strings.emplace_back(std::move(s)).c_str(); }
};

struct PlanInputs {
  const RunSpec* spec;
  std::string staging_root;  // host path where the root tmpfs is attached
  std::uint64_t root_tmpfs_bytes;
  std::string boot_id;       // what /proc/sys/kernel/random/boot_id shows ("" = a fresh random one)
};

// Fills `plan` and `storage` with what the sandbox is made of: pure, no
// mount is made here (isolate/mounts.h makes them), only host files are
// read (stat, the small files that are copied in). Its fd fields, filter
// and mount fds are set by the caller.
Status build_plan(const PlanInputs& in, PlanStorage& storage, ChildPlan& plan);

// Read-only host files up to this size are copied into the sandbox's root
// tmpfs rather than bound (a bind shows its host path in mountinfo).
inline constexpr std::uint64_t kMaxCopiedFileBytes = 256u << 10;

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
  enum Kind {
    kFile,      // an empty read-only file over it
    kDir,       // an empty read-only directory over it
    kReadOnly,  // itself, read-only
    kBootId,    // a per-run random value over it (tenants cannot be correlated)
  } kind;
  const char* reason;
};
const std::vector<ProcMask>& proc_masks();

}  // namespace tsb::isolate
