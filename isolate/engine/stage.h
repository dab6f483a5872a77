// Setup stages reported from the sandbox side as (stage, errno). Shared by the
// engine, its clone3 child and toolsandbox-init, so it is plain C++ with no
// library includes.
#pragma once

namespace tsb::isolate {

enum class Stage : int {
  None = 0,
  Sync,            // waiting for the parent (id maps, cgroup)
  SetIds,          // becoming the mapped root of the new user namespace
  Cgroupns,        // entering a cgroup namespace rooted at the run's leaf
  MountPrivate,    // making every mount private (no propagation to the host)
  MountRoot,       // the tmpfs that becomes /
  MountSkeleton,   // directories, symlinks, generated /etc files
  MountBind,       // read-only or read-write bind mounts
  MountTmpfs,      // /tmp, the working dir, /dev, /dev/shm
  MountProc,       // a new /proc for the new pid namespace
  MaskProc,        // hiding or freezing sensitive /proc entries
  MountDev,        // device nodes bound from the host
  PivotRoot,       // pivot_root and detaching the old root
  RemountRoot,     // making / read-only
  Hostname,        // sethostname in the new uts namespace
  Loopback,        // bringing lo up in the new net namespace
  Fork,            // forking the tool from the sandbox init
  Fds,             // arranging 0-2 (and the end note, 3) and closing everything else
  Rlimits,         // setrlimit
  Session,         // setsid, parent-death signal
  Securebits,      // locking securebits
  CapBound,        // dropping the bounding set
  SetToolIds,      // switching to the tool's uid/gid
  Caps,            // emptying every capability set
  NoNewPrivs,      // PR_SET_NO_NEW_PRIVS
  Chdir,           // entering the working dir
  Seccomp,         // loading the filter: the last step before execve
  Execve,          // executing the tool
  ExecInit,        // executing toolsandbox-init as pid 1
  InitSeccomp,     // the init loading its own filter
  MemfdNoexec,     // vm.memfd_noexec=2 for the sandbox's pid namespace
  DeathSignal,     // arming the parent-death signal again after the id switch
  InitReady,       // the tool waiting until the sandbox init runs
  Plan,            // toolsandbox-init reading the plan the engine wrote
  Egress,          // the egress proxy's listener, made and handed over
  Landlock,        // the tool's Landlock ruleset, made and enforced
  CgroupJoin,      // v1: the child moving itself into the run's leaf
  kCount
};

// The fixed-size record written to the report pipe. Written with one write(2)
// (smaller than PIPE_BUF, so atomic); read by the parent after the run.
struct Report {
  enum Kind : int {
    kSetupError = 1,  // a set-up step failed: stage, errno
    kToolStatus = 2,  // the tool ended: its wait status
    kBackstop = 3,    // init's own wall-clock backstop ended the run: value = seconds
    kEngineGone = 4,  // init saw the engine's end of the watch pipe close
    kLandlock = 5,    // the tool's Landlock domain, before its execve: value as below
    kMovedAside = 6,  // what stood at step's mount point was renamed to its path + kAsideInfix + value
  };
  int magic;   // kReportMagic
  int kind;    // Kind
  int stage;   // Stage, for kSetupError
  int value;   // errno for kSetupError; wait status for kToolStatus; seconds for kBackstop
  int step = -1;  // the plan's step (its path names the place), for kSetupError and kMovedAside
};
inline constexpr int kReportMagic = 0x7473626f;  // "tsbo"
// A kLandlock report's value: the kernel's ABI in bits 0-7 (0: this kernel
// has no Landlock) and the layers applied, or kLandlockOff (turned off).
inline constexpr int kLandlockFs = 1 << 8, kLandlockNet = 1 << 9, kLandlockScope = 1 << 10, kLandlockOff = 1 << 16;
inline constexpr char kAsideInfix[] = ".left-by-a-run-";

}  // namespace tsb::isolate
