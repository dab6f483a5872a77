// The contract between the parent (engine.cc) and the code that runs in the
// sandbox between clone3 and execve (child_sandbox.cc, child_tool.cc).
//
// The parent builds a ChildPlan: flat arrays of plain structs whose strings
// point into storage the parent owns (std::string buffers). The child only
// READS the plan; it never allocates, logs, throws or takes locks, and it
// calls only async-signal-safe functions. Every failure there becomes one
// fixed-size Report {stage, errno} on the report pipe, then _exit.
#pragma once

#include <linux/filter.h>
#include <sys/resource.h>
#include <sys/types.h>

#include <cstddef>
#include <cstdint>

#include "isolate/stage.h"

namespace tsb::isolate {

// One row of the file-system plan, executed in order before pivot_root.
// All paths are absolute host-side paths under the staging root.
struct MountStep {
  enum Kind : int {
    kMkdir,      // mkdir dst (mode); EEXIST is fine
    kSymlink,    // symlink(src -> dst)
    kWriteFile,  // create dst (mode) with `data` of `len` bytes
    kBind,       // bind src on dst (created as dir or empty file), then set attributes
    kMount,      // mount(src, dst, fstype, flags, data) on a directory created first
    kSetAttr,    // mount_setattr(dst, attr_set) on an existing mount point
    kMaskFile,   // bind src (an empty read-only file) over dst if dst exists
    kMaskDir,    // bind src (an empty read-only directory) over dst if dst exists
    kAttach,     // move the detached mount `fd` (made by the parent) onto dst
  };
  int kind;
  int fd;                 // kAttach: a mount fd from fsmount(2)/open_tree(2), CLOEXEC;
                          // -1 when the parent could not make it (see `err`)
  int err;                // kAttach with fd -1: the errno the parent got (the step fails with it)
  Stage stage;            // reported on failure
  const char* src;
  const char* dst;
  const char* fstype;
  unsigned long flags;    // mount(2) flags for kMount
  const char* data;       // mount data for kMount; file contents for kWriteFile
  std::size_t len;        // kWriteFile
  unsigned mode;          // kMkdir, kWriteFile
  std::uint64_t attr_set; // MOUNT_ATTR_* for kBind/kSetAttr/kMount (applied recursively)
  bool is_dir;            // kBind: the source is a directory
  bool optional;          // skip when the source (or dst for masks) does not exist
};

struct RlimitStep {
  int resource;
  rlim_t value;  // soft and hard
};

struct ChildPlan {
  // Descriptors inherited through clone3; all O_CLOEXEC in the parent.
  int sync_fd;          // read end: the parent writes kSyncMaps then kSyncCgroup
  int sync_w_fd;        // the parent's write end, inherited: closed first, so EOF means the engine is gone
  int report_fd;        // write end of the report pipe
  int stdin_fd;         // the tool's 0, 1, 2
  int stdout_fd;
  int stderr_fd;
  int init_exe_fd;      // toolsandbox-init, opened O_PATH by the engine
  int init_filter_fd;   // sealed memfd holding the init's BPF program
  int watch_fd;         // read end of the engine's watch pipe: EOF = the engine is gone
  int lease_fd;         // the run's uid-slot lease (an OFD lock); init holds it until it dies
  bool unshare_cgroupns;  // enter a cgroup namespace rooted at the leaf
  bool memfd_noexec;      // write vm.memfd_noexec=2 for the new pid namespace
  unsigned init_backstop_s;   // init ends the run on its own after this many seconds

  // File system.
  const char* root;             // staging directory; the root tmpfs is attached here
  int root_fd;                  // the root tmpfs, made and owned by the parent (fsmount)
  const MountStep* steps;
  std::size_t nsteps;
  const char* hostname;
  bool loopback_up;             // new net namespace: bring lo up

  // The tool.
  const char* const* argv;
  const char* const* envp;
  const char* path_search;      // PATH value used when argv[0] has no '/'
  const char* workdir;
  uid_t tool_uid;               // inside the sandbox
  gid_t tool_gid;
  const RlimitStep* rlimits;
  std::size_t nrlimits;
  sock_fprog filter;            // points into the policy's compiled program
};

inline constexpr char kSyncMaps = 'M';    // uid/gid maps are written
inline constexpr char kSyncCgroup = 'C';  // the child sits in its cgroup leaf

// Entry point of the clone3 child (pid 1 of the new pid namespace). Never returns.
[[noreturn]] void child_sandbox_main(const ChildPlan& plan) noexcept;
// Entry point of the tool process, forked by child_sandbox_main. `ready_fd`
// is the read end of a pipe whose write end the sandbox init holds: EOF on it
// means init runs and its filter is loaded, a byte means the sandbox is being
// torn down. Never returns.
[[noreturn]] void child_tool_main(const ChildPlan& plan, int ready_fd) noexcept;
// Write one setup-error report and _exit(code). Async-signal-safe.
[[noreturn]] void child_fail(int report_fd, Stage stage, int err, int exit_code) noexcept;

// Privilege-dropping steps shared by pid 1 and the tool (child_sandbox.cc).
// Each returns 0 or -1 with errno set.
int child_lock_securebits() noexcept;
int child_drop_bounding_set() noexcept;  // bounding and ambient sets
int child_clear_caps() noexcept;         // raw capset(2) to empty sets, then verified
// Arm the parent-death signal (SIGKILL). The kernel clears it whenever the
// effective ids change, so it is armed again after every id switch.
int child_arm_death_signal() noexcept;

}  // namespace tsb::isolate
