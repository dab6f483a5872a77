// The tool's Landlock ruleset: a second wall behind the mounts, made from
// the plan's own steps (isolate/engine/plan.h), so that it cannot drift
// from what the sandbox is built of (docs/SECURITY.md, "Landlock").
//
//   the root            list directories only: every file in it is a step's;
//   a read-only step    read and execute (no execute on a noexec mount):
//                       the system directories, the venv, copies, /proc, /dev;
//   a writable step     everything but execute (on a noexec mount) and
//                       making devices: /tmp, the working dir, /dev/shm,
//                       writable binds;
//   a device (kDevice)  read and write: the nodes the engine made in /dev;
//   anything else       nothing: no step, no access.
//
// Handled are every right the running ABI knows (so what a step does not
// grant is refused), TCP bind and connect under network egress (connect
// only to the proxy's port), and the abstract-socket and signal scopes.
//
// Header only, libc only: included by the static init and by the unit tests.
#pragma once

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "isolate/engine/stage.h"
#include "isolate/init/init.h"
#include "isolate/init/landlock_abi.h"
#include "isolate/init/plan_reader.h"

namespace tsb::isolate::init {

namespace ll = tsb::isolate::landlock;

inline constexpr uint64_t kLandlockReadOnly = ll::kFsExecute | ll::kFsReadFile | ll::kFsReadDir;
inline constexpr uint64_t kLandlockWritable =
    ll::kFsExecute | ll::kFsReadFile | ll::kFsReadDir | ll::kFsWriteFile | ll::kFsRemoveDir | ll::kFsRemoveFile |
    ll::kFsMakeDir | ll::kFsMakeReg | ll::kFsMakeSock | ll::kFsMakeFifo | ll::kFsMakeSym | ll::kFsRefer |
    ll::kFsTruncate | ll::kFsIoctlDev;
inline constexpr uint64_t kLandlockDevice = ll::kFsReadFile | ll::kFsWriteFile | ll::kFsTruncate | ll::kFsIoctlDev;

// The rights step `s` gives the tool at its path (0: none; the step makes
// nothing the tool reaches by that path, or its parent's rule covers it).
// Not yet masked to an ABI, nor to a file's rights.
inline uint64_t landlock_rights(const Step& s) {
  const uint64_t noexec = s.noexec ? ll::kFsExecute : 0;
  switch (s.op) {
    case Op::kMkdir:
    case Op::kProc:  // a noexec mount; /proc/self/exe resolves to the program's own place
      return ll::kFsReadFile | ll::kFsReadDir;
    case Op::kWriteFile:
    case Op::kBootId:
      return ll::kFsReadFile;
    case Op::kCopyFile:
      return ll::kFsReadFile | ((s.mode & 0111) != 0 ? ll::kFsExecute : 0);
    case Op::kAttach:
      if (s.fd < 0) return 0;  // skipped (optional) or failing: nothing there
      return (s.writable ? kLandlockWritable : kLandlockReadOnly) & ~noexec;
    case Op::kDevice:
      return kLandlockDevice;
    case Op::kSymlink:  // its target's rule decides
    case Op::kMask:     // covered by /proc's rule, and its source's own
    case Op::kReadOnly:
      return 0;
  }
  return 0;
}

// What handle_fs/net/scoped hold for a kernel of ABI `abi` and the plan.
inline ll::RulesetAttr landlock_attr(const Plan& plan, int abi) {
  return {ll::fs_rights(abi), plan.network == kNetworkEgress ? ll::net_rights(abi) : 0, ll::scopes(abi)};
}

// The kLandlock report's value for what `attr` handles at ABI `abi`.
inline int landlock_report(const ll::RulesetAttr& attr, int abi) {
  return (abi > 255 ? 255 : abi) | (attr.handled_access_fs ? kLandlockFs : 0) |
         (attr.handled_access_net ? kLandlockNet : 0) | (attr.scoped ? kLandlockScope : 0);
}

namespace detail {

// One path-beneath rule for the sandbox path `path`, resolved beneath
// `root` without following its last component. A path that is not there
// or not reachable by the tool gets no rule (less access, never more).
inline int add_path_rule(int ruleset, int root, const char* path, uint64_t access) {
  if (access == 0) return 0;
  Fd f{::openat(root, path[1] != '\0' ? path + 1 : ".", O_PATH | O_NOFOLLOW | O_CLOEXEC)};
  if (f.fd < 0) return errno == ENOENT || errno == EACCES || errno == ENOTDIR ? 0 : -1;
  struct stat st;
  if (::fstat(f.fd, &st) != 0) return -1;
  if (S_ISLNK(st.st_mode)) return 0;
  if (!S_ISDIR(st.st_mode)) access &= ll::kFsFileRights;
  if (access == 0) return 0;
  ll::PathBeneathAttr a{access, f.fd};
  return static_cast<int>(::syscall(ll::kSysAddRule, ruleset, ll::kRulePathBeneath, &a, 0));
}

}  // namespace detail

// Makes the ruleset for `plan` from its steps (paths beneath `root`, the
// sandbox's "/"), and enforces it on the calling thread, which must have
// no_new_privs. Returns the kLandlock report's value (kLandlockOff when
// the plan turns it off, the ABI 0 when the kernel has no Landlock), or -1
// with errno set: the run then fails at Stage::Landlock.
inline int apply_landlock(const Plan& plan, int root) {
  if (plan.landlock != kLandlockAuto) return kLandlockOff;
  const long version = ::syscall(ll::kSysCreateRuleset, nullptr, 0, ll::kCreateRulesetVersion);
  if (version < 0) return errno == ENOSYS || errno == EOPNOTSUPP ? 0 : -1;
  const int abi = static_cast<int>(version);
  // ABI 1 has no REFER right: a domain that handles the file system refuses
  // every rename and link across directories, /tmp and the working dir
  // included, and it has no network or scope layer. No ruleset there.
  if (abi < 2) return abi;
  ll::RulesetAttr attr = landlock_attr(plan, abi);
  const unsigned long size = abi >= 6 ? ll::kAttrSizeV6 : abi >= 4 ? ll::kAttrSizeV4 : ll::kAttrSizeV1;
  Fd rs{static_cast<int>(::syscall(ll::kSysCreateRuleset, &attr, size, 0))};
  if (rs.fd < 0) return -1;
  if (detail::add_path_rule(rs.fd, root, "/", ll::kFsReadDir) != 0) return -1;
  for (uint32_t i = 0; i < plan.nsteps; ++i)
    if (detail::add_path_rule(rs.fd, root, plan.steps[i].path, landlock_rights(plan.steps[i]) & attr.handled_access_fs) != 0)
      return -1;
  if (attr.handled_access_net != 0) {
    ll::NetPortAttr port{ll::kNetConnectTcp, kEgressProxyPort};
    if (::syscall(ll::kSysAddRule, rs.fd, ll::kRuleNetPort, &port, 0) != 0) return -1;
  }
  if (::syscall(ll::kSysRestrictSelf, rs.fd, 0) != 0) return -1;
  return landlock_report(attr, abi);
}

}  // namespace tsb::isolate::init
