#include "daemon/policy/syscall_groups.h"

#include <algorithm>
#include <set>

#include "daemon/policy/jsonc.h"

namespace tsb::policy {
namespace {

using sv = std::string_view;

// Each list is sorted ("@..." references first, then names in byte order);
// the tests check it, so a new name goes where sort(1) would put it.

constexpr sv kAio[] = {
    "io_cancel", "io_destroy", "io_getevents", "io_pgetevents", "io_pgetevents_time64", "io_setup",
    "io_submit", "io_uring_enter", "io_uring_register", "io_uring_setup",
};

constexpr sv kBasicIo[] = {
    "_llseek", "close", "close_range", "dup", "dup2", "dup3", "lseek", "pread64", "preadv",
    "preadv2", "pwrite64", "pwritev", "pwritev2", "read", "readv", "write", "writev",
};

constexpr sv kChown[] = {
    "chown", "chown32", "fchown", "fchown32", "fchownat", "lchown", "lchown32",
};

constexpr sv kClock[] = {
    "adjtimex", "clock_adjtime", "clock_adjtime64", "clock_settime", "clock_settime64",
    "settimeofday", "stime",
};

constexpr sv kCpuEmulation[] = {
    "modify_ldt", "subpage_prot", "switch_endian", "vm86", "vm86old",
};

constexpr sv kDebug[] = {
    "kcmp", "lookup_dcookie", "perf_event_open", "pidfd_getfd", "process_madvise",
    "process_vm_readv", "process_vm_writev", "ptrace", "rtas", "s390_runtime_instr",
    "sys_debug_setcontext",
};

constexpr sv kDefault[] = {
    "arch_prctl", "brk", "cacheflush", "clock_getres", "clock_getres_time64", "clock_gettime",
    "clock_gettime64", "clock_nanosleep", "clock_nanosleep_time64", "exit", "exit_group", "futex",
    "futex_time64", "get_robust_list", "get_thread_area", "getegid", "getegid32", "geteuid",
    "geteuid32", "getgid", "getgid32", "getgroups", "getgroups32", "getpgid", "getpgrp", "getpid",
    "getppid", "getrandom", "getresgid", "getresgid32", "getresuid", "getresuid32", "getrlimit",
    "getsid", "gettid", "gettimeofday", "getuid", "getuid32", "membarrier", "mmap", "mmap2",
    "mprotect", "munmap", "nanosleep", "pause", "prlimit64", "restart_syscall", "rseq",
    "rt_sigreturn", "sched_getaffinity", "sched_yield", "set_robust_list", "set_thread_area",
    "set_tid_address", "set_tls", "sigreturn", "time", "ugetrlimit",
};

constexpr sv kFileSystem[] = {
    "access", "chdir", "chmod", "close", "creat", "faccessat", "faccessat2", "fallocate", "fchdir",
    "fchmod", "fchmodat", "fchmodat2", "fcntl", "fcntl64", "fgetxattr", "flistxattr",
    "fremovexattr", "fsetxattr", "fstat", "fstat64", "fstatat64", "fstatfs", "fstatfs64",
    "ftruncate", "ftruncate64", "futimesat", "getcwd", "getdents", "getdents64", "getxattr",
    "inotify_add_watch", "inotify_init", "inotify_init1", "inotify_rm_watch", "lgetxattr", "link",
    "linkat", "listxattr", "llistxattr", "lremovexattr", "lsetxattr", "lstat", "lstat64", "mkdir",
    "mkdirat", "mknod", "mknodat", "newfstatat", "oldfstat", "oldlstat", "oldstat", "open",
    "openat", "openat2", "readlink", "readlinkat", "removexattr", "rename", "renameat",
    "renameat2", "rmdir", "setxattr", "stat", "stat64", "statfs", "statfs64", "statx", "symlink",
    "symlinkat", "truncate", "truncate64", "unlink", "unlinkat", "utime", "utimensat",
    "utimensat_time64", "utimes",
};

constexpr sv kIoEvent[] = {
    "_newselect", "epoll_create", "epoll_create1", "epoll_ctl", "epoll_ctl_old", "epoll_pwait",
    "epoll_pwait2", "epoll_wait", "epoll_wait_old", "eventfd", "eventfd2", "poll", "ppoll",
    "ppoll_time64", "pselect6", "pselect6_time64", "select",
};

constexpr sv kIpc[] = {
    "ipc", "memfd_create", "mq_getsetattr", "mq_notify", "mq_open", "mq_timedreceive",
    "mq_timedreceive_time64", "mq_timedsend", "mq_timedsend_time64", "mq_unlink", "msgctl",
    "msgget", "msgrcv", "msgsnd", "pipe", "pipe2", "semctl", "semget", "semop", "semtimedop",
    "semtimedop_time64", "shmat", "shmctl", "shmdt", "shmget",
};

constexpr sv kKeyring[] = {
    "add_key", "keyctl", "request_key",
};

constexpr sv kMemlock[] = {
    "mlock", "mlock2", "mlockall", "munlock", "munlockall",
};

constexpr sv kMemory[] = {
    "brk", "get_mempolicy", "madvise", "mincore", "mmap", "mmap2", "mprotect", "mremap", "msync",
    "munmap", "remap_file_pages", "userfaultfd",
};

constexpr sv kModule[] = {
    "create_module", "delete_module", "finit_module", "init_module",
};

constexpr sv kMount[] = {
    "chroot", "fsconfig", "fsmount", "fsopen", "fspick", "mount", "mount_setattr", "move_mount",
    "open_tree", "pivot_root", "umount", "umount2",
};

constexpr sv kNetworkIo[] = {
    "accept", "accept4", "bind", "connect", "getpeername", "getsockname", "getsockopt", "listen",
    "recv", "recvfrom", "recvmmsg", "recvmmsg_time64", "recvmsg", "send", "sendmmsg", "sendmsg",
    "sendto", "setsockopt", "shutdown", "socket", "socketcall", "socketpair",
};

constexpr sv kObsolete[] = {
    "_sysctl", "afs_syscall", "bdflush", "break", "create_module", "ftime", "get_kernel_syms",
    "getpmsg", "gtty", "idle", "lock", "mpx", "prof", "profil", "putpmsg", "query_module",
    "security", "sgetmask", "ssetmask", "stty", "sysfs", "tuxcall", "ulimit", "uselib", "ustat",
    "vserver",
};

constexpr sv kPkey[] = {
    "pkey_alloc", "pkey_free", "pkey_mprotect",
};

constexpr sv kPrivileged[] = {
    "@chown", "@clock", "@module", "@raw-io", "@reboot", "@swap", "_sysctl", "acct", "bpf",
    "capset", "chroot", "fanotify_init", "fanotify_mark", "nfsservctl", "open_by_handle_at",
    "pivot_root", "quotactl", "quotactl_fd", "setdomainname", "setfsuid", "setfsuid32",
    "setgroups", "setgroups32", "sethostname", "setresuid", "setresuid32", "setreuid",
    "setreuid32", "setuid", "setuid32", "vhangup",
};

constexpr sv kProcess[] = {
    "capget", "clone", "clone3", "execve", "execveat", "exit", "exit_group", "fork", "getrusage",
    "gettid", "kill", "pidfd_open", "pidfd_send_signal", "prctl", "rt_sigqueueinfo",
    "rt_tgsigqueueinfo", "setns", "swapcontext", "tgkill", "times", "tkill", "unshare", "vfork",
    "wait4", "waitid", "waitpid",
};

constexpr sv kRawIo[] = {
    "ioperm", "iopl", "pciconfig_iobase", "pciconfig_read", "pciconfig_write",
    "s390_pci_mmio_read", "s390_pci_mmio_write",
};

constexpr sv kReboot[] = {
    "kexec_file_load", "kexec_load", "reboot",
};

constexpr sv kResources[] = {
    "ioprio_set", "mbind", "migrate_pages", "move_pages", "nice", "sched_setaffinity",
    "sched_setattr", "sched_setparam", "sched_setscheduler", "set_mempolicy",
    "set_mempolicy_home_node", "setpriority", "setrlimit",
};

constexpr sv kSandbox[] = {
    "landlock_add_rule", "landlock_create_ruleset", "landlock_restrict_self", "seccomp",
};

constexpr sv kSetuid[] = {
    "setgid", "setgid32", "setgroups", "setgroups32", "setregid", "setregid32", "setresgid",
    "setresgid32", "setresuid", "setresuid32", "setreuid", "setreuid32", "setuid", "setuid32",
};

constexpr sv kSignal[] = {
    "rt_sigaction", "rt_sigpending", "rt_sigprocmask", "rt_sigsuspend", "rt_sigtimedwait",
    "rt_sigtimedwait_time64", "sigaction", "sigaltstack", "signal", "signalfd", "signalfd4",
    "sigpending", "sigprocmask", "sigsuspend",
};

constexpr sv kSwap[] = {
    "swapoff", "swapon",
};

constexpr sv kSync[] = {
    "fdatasync", "fsync", "msync", "sync", "sync_file_range", "sync_file_range2", "syncfs",
};

constexpr sv kTimer[] = {
    "alarm", "getitimer", "setitimer", "timer_create", "timer_delete", "timer_getoverrun",
    "timer_gettime", "timer_gettime64", "timer_settime", "timer_settime64", "timerfd_create",
    "timerfd_gettime", "timerfd_gettime64", "timerfd_settime", "timerfd_settime64", "times",
};

constexpr SyscallGroup kGroups[] = {
    {"@aio", "Asynchronous I/O: the old io_* interface and io_uring, whose operations run without "
             "passing through seccomp at all", kAio, true},
    {"@basic-io", "Reading, writing, seeking and closing descriptors the process already holds",
     kBasicIo, false},
    {"@chown", "Changing the owner or group of files", kChown, false},
    {"@clock", "Setting or slewing the system clock, which every process on the host shares",
     kClock, true},
    {"@cpu-emulation", "Running code in other CPU modes (vm86, LDT segments, endianness switches)",
     kCpuEmulation, true},
    {"@debug", "Inspecting or controlling other processes: tracing, reading their memory, "
               "comparing or taking their descriptors, performance counters",
     kDebug, true},
    {"@default", "What every program needs before its own code runs: memory for the loader, "
                 "thread and futex set-up, clocks, its own ids, exit",
     kDefault, false},
    {"@file-system", "Opening, creating, renaming and removing files, and reading or changing "
                     "their metadata, extended attributes and change notifications",
     kFileSystem, false},
    {"@io-event", "Waiting for readiness on many descriptors: select, poll, epoll, eventfd",
     kIoEvent, false},
    {"@ipc", "Pipes, anonymous memory files, and System V and POSIX message queues, semaphores "
             "and shared memory",
     kIpc, false},
    {"@keyring", "The kernel keyring, which is only partly namespaced and whose keys can outlive a process",
     kKeyring, true},
    {"@memlock", "Pinning memory so it cannot be swapped out", kMemlock, false},
    {"@memory", "Mapping, protecting and advising on the process's own memory", kMemory, false},
    {"@module", "Loading and unloading kernel modules", kModule, true},
    {"@mount", "Changing the file-system view: mounting, unmounting, moving mounts, changing the "
               "root",
     kMount, true},
    {"@network-io", "Creating sockets and sending or receiving through them", kNetworkIo, false},
    {"@obsolete", "Syscalls the kernel no longer implements or keeps only for old binaries",
     kObsolete, true},
    {"@pkey", "Memory protection keys", kPkey, false},
    {"@privileged", "Operations that need capabilities: ownership and identity changes, host "
                    "administration, file handles, eBPF",
     kPrivileged, true},
    {"@process", "Creating, executing, signalling and waiting for processes and threads, and "
                 "namespace changes",
     kProcess, false},
    {"@raw-io", "Direct access to I/O ports and PCI configuration space", kRawIo, true},
    {"@reboot", "Rebooting the machine or loading a new kernel", kReboot, true},
    {"@resources", "Changing scheduling, priorities, resource limits and NUMA memory placement",
     kResources, false},
    {"@sandbox", "A process restricting itself further (seccomp, Landlock)", kSandbox, false},
    {"@setuid", "Changing user and group ids", kSetuid, false},
    {"@signal", "Installing handlers, masking and waiting for signals", kSignal, false},
    {"@swap", "Enabling and disabling swap", kSwap, true},
    {"@sync", "Flushing file data to storage", kSync, false},
    {"@timer", "Interval timers, POSIX timers and timer descriptors", kTimer, false},
};

Status expand_into(const SyscallGroup& group, std::vector<std::string_view>& stack,
                   std::set<std::string>& out) {
  if (std::find(stack.begin(), stack.end(), group.name) != stack.end()) {
    std::string path;
    for (const auto& name : stack) path.append(name).append(" -> ");
    path.append(group.name);
    return Error::invalid("syscall group reference cycle: " + path, ELOOP);
  }
  stack.push_back(group.name);
  for (const sv member : group.members) {
    if (member.empty() || member.front() != '@') {
      out.emplace(member);
      continue;
    }
    const SyscallGroup* ref = find_syscall_group(member);
    if (ref == nullptr) {
      return Error::invalid("syscall group " + std::string(group.name) + " refers to unknown group " +
                                quoted_for_message(member),
                            ENOENT);
    }
    if (Status s = expand_into(*ref, stack, out); !s) return s;
  }
  stack.pop_back();
  return {};
}

}  // namespace

std::span<const SyscallGroup> syscall_groups() noexcept { return kGroups; }

const SyscallGroup* find_syscall_group(std::string_view name) noexcept {
  const auto it = std::lower_bound(std::begin(kGroups), std::end(kGroups), name,
                                   [](const SyscallGroup& g, std::string_view n) { return g.name < n; });
  if (it == std::end(kGroups) || it->name != name) return nullptr;
  return &*it;
}

Result<std::vector<std::string>> expand_syscall_group(std::string_view name) {
  const SyscallGroup* group = find_syscall_group(name);
  if (group == nullptr) return Error::invalid("unknown syscall group " + quoted_for_message(name), ENOENT);
  std::vector<std::string_view> stack;
  std::set<std::string> out;
  // context: expand_into names the group and the member it could not find
  if (Status s = expand_into(*group, stack, out); !s) return std::move(s).error();
  return std::vector<std::string>(out.begin(), out.end());
}

std::vector<std::string_view> syscall_groups_of(std::string_view syscall) {
  std::vector<std::string_view> groups;
  for (const auto& group : kGroups) {
    auto members = expand_syscall_group(group.name);
    if (!members) continue;  // the invariant tests keep this from happening
    if (std::binary_search(members->begin(), members->end(), syscall)) groups.push_back(group.name);
  }
  return groups;
}

}  // namespace tsb::policy
