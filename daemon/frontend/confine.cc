#include "daemon/frontend/confine.h"

#include <linux/capability.h>
#include <sched.h>
#include <seccomp.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <string_view>

namespace tsb::frontend {

Status check_unprivileged() {
  uid_t ru, eu, su;
  gid_t rg, eg, sg;
  if (::getresuid(&ru, &eu, &su) != 0 || ::getresgid(&rg, &eg, &sg) != 0) return Error::from_errno("getresuid");
  if (ru == 0 || eu == 0 || su == 0) return Error::invalid("refusing to run as uid 0", EPERM);
  if (rg == 0 || eg == 0 || sg == 0) return Error::invalid("refusing to run as gid 0", EPERM);
  __user_cap_header_struct h{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct d[2] = {};
  if (::syscall(SYS_capget, &h, d) != 0) return Error::from_errno("capget");
  for (const auto& x : d)
    if (x.effective || x.permitted || x.inheritable) return Error::invalid("refusing to run with capabilities", EPERM);
  for (int c = 0; c <= 63; ++c) {
    int r = ::prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_IS_SET, c, 0, 0);
    if (r == 1) return Error::invalid("refusing to run with ambient capabilities", EPERM);
  }
  if (::prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) != 1)
    return Error::invalid("refusing to run without no_new_privs", EPERM);
  return {};
}

Status load_front_end_filter() {
  struct Release {
    void operator()(scmp_filter_ctx c) const { seccomp_release(c); }
  };
  std::unique_ptr<void, Release> ctx(seccomp_init(SCMP_ACT_ALLOW));
  if (!ctx) return Error::invalid("seccomp_init failed");
  const int eperm = SCMP_ACT_ERRNO(EPERM);
  static const char* const kRefused[] = {
      // Other processes and the kernel's own state.
      "ptrace", "process_vm_readv", "process_vm_writev", "process_madvise", "pidfd_getfd", "kcmp",
      // Namespaces and mounts.
      "unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "fsopen", "fsmount", "fsconfig", "fspick",
      "move_mount", "open_tree", "mount_setattr", "open_by_handle_at", "name_to_handle_at",
      // Running anything: the front end never executes a program.
      "execve", "execveat",
      // Kernel interfaces a daemon of sockets and files never needs.
      "bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register",
      "keyctl", "add_key", "request_key", "init_module", "finit_module", "delete_module", "kexec_load",
      "kexec_file_load", "iopl", "ioperm", "swapon", "swapoff", "reboot", "syslog", "acct", "quotactl",
      "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "mknod", "mknodat", "vhangup", "personality",
      "uselib", "lookup_dcookie",
  };
  for (const char* name : kRefused) {
#if defined(__SANITIZE_ADDRESS__)
    // A sanitizer build (the test tier that looks for leaks): LeakSanitizer
    // stops the process's threads with ptrace at exit. Never in a release.
    if (std::string_view(name) == "ptrace") continue;
#endif
    int nr = seccomp_syscall_resolve_name(name);
    if (nr == __NR_SCMP_ERROR) continue;  // not on this architecture
    if (seccomp_rule_add(ctx.get(), eperm, nr, 0) != 0)
      return Error::invalid(std::string("seccomp: cannot add a rule for ") + name);
  }
  // Threads, yes (libcurl's resolver); processes, no: a child would outlive
  // this process (and hold the listening socket) when the spawner replaces
  // it. clone3 takes its flags in a struct the filter cannot read: ENOSYS,
  // and glibc falls back to clone, whose flags it can.
  if (seccomp_rule_add(ctx.get(), SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(clone3), 0) != 0)
    return Error::invalid("seccomp: cannot add the clone3 rule");
#if !defined(__SANITIZE_ADDRESS__)
  // (LeakSanitizer's tracer is a clone without CLONE_THREAD: sanitizer
  // builds only.)
  for (int nr : {SCMP_SYS(fork), SCMP_SYS(vfork)})
    if (seccomp_rule_add(ctx.get(), eperm, nr, 0) != 0) return Error::invalid("seccomp: cannot add the fork rules");
  if (seccomp_rule_add(ctx.get(), eperm, SCMP_SYS(clone), 1, SCMP_A0(SCMP_CMP_MASKED_EQ, CLONE_THREAD, 0)) != 0)
    return Error::invalid("seccomp: cannot add the clone rule");
#endif
  for (unsigned long flag : {CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET, CLONE_NEWUTS, CLONE_NEWIPC,
                             CLONE_NEWCGROUP}) {
    if (seccomp_rule_add(ctx.get(), eperm, SCMP_SYS(clone), 1, SCMP_A0(SCMP_CMP_MASKED_EQ, flag, flag)) != 0)
      return Error::invalid("seccomp: cannot add a clone rule");
  }
  if (int rc = seccomp_load(ctx.get()); rc != 0) return Error::from_errno(-rc, "seccomp_load (front end filter)");
  return {};
}

}  // namespace tsb::frontend
