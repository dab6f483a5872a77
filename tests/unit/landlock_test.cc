// The tool's Landlock ruleset as toolsandbox-init makes it from the plan's
// steps (isolate/init/landlock.h): the rights each step gives, what is
// handled at each ABI, and the ruleset enforced for real on a tree laid out
// like a sandbox's (in a child process: a domain cannot be left).
#include <gtest/gtest.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "isolate/init/landlock.h"

namespace {

namespace init = tsb::isolate::init;
namespace ll = tsb::isolate::landlock;
using tsb::isolate::Op;
using tsb::isolate::Stage;

init::Step step(Op op, const char* path, bool writable = false, bool noexec = false, int fd = 11, unsigned mode = 0) {
  init::Step s{};
  s.op = op;
  s.stage = Stage::MountBind;
  s.dir = true;
  s.writable = writable;
  s.noexec = noexec;
  s.fd = fd;
  s.mode = mode;
  s.path = path;
  s.source = "";
  s.data = "";
  return s;
}

int kernel_abi() {
  const long v = ::syscall(ll::kSysCreateRuleset, nullptr, 0, ll::kCreateRulesetVersion);
  return v < 0 ? 0 : static_cast<int>(v);
}

}  // namespace

TEST(Landlock, EachStepGivesWhatItsMountAllows) {
  // Read-only views: read and execute; a tmpfs (noexec): everything but
  // execute and device nodes; a writable bind: execute as well.
  EXPECT_EQ(init::landlock_rights(step(Op::kAttach, "/usr")), ll::kFsExecute | ll::kFsReadFile | ll::kFsReadDir);
  const uint64_t tmp = init::landlock_rights(step(Op::kAttach, "/tmp", true, true));
  EXPECT_EQ(tmp & (ll::kFsExecute | ll::kFsMakeChar | ll::kFsMakeBlock), 0u);
  for (uint64_t r : {ll::kFsWriteFile, ll::kFsMakeReg, ll::kFsMakeDir, ll::kFsMakeSock, ll::kFsRemoveFile, ll::kFsRefer,
                     ll::kFsTruncate})
    EXPECT_NE(tmp & r, 0u) << r;
  EXPECT_EQ(init::landlock_rights(step(Op::kAttach, "/data", true, false)), tmp | ll::kFsExecute);
  // /dev itself is read-only (noexec); its nodes read and write.
  EXPECT_EQ(init::landlock_rights(step(Op::kAttach, "/dev", false, true)), ll::kFsReadFile | ll::kFsReadDir);
  EXPECT_EQ(init::landlock_rights(step(Op::kDevice, "/dev/null")),
            ll::kFsReadFile | ll::kFsWriteFile | ll::kFsTruncate | ll::kFsIoctlDev);
  // /proc: read only (writes to /proc/self/mem, comm, ... are refused).
  EXPECT_EQ(init::landlock_rights(step(Op::kProc, "/proc")), ll::kFsReadFile | ll::kFsReadDir);
  // Files of the root: read, and execute only a copy with exec bits.
  EXPECT_EQ(init::landlock_rights(step(Op::kWriteFile, "/etc/passwd")), ll::kFsReadFile);
  EXPECT_EQ(init::landlock_rights(step(Op::kCopyFile, "/etc/hosts", false, false, 12, 0444)), ll::kFsReadFile);
  EXPECT_EQ(init::landlock_rights(step(Op::kCopyFile, "/opt/x", false, false, 12, 0555)),
            ll::kFsReadFile | ll::kFsExecute);
  // Nothing: what a step skipped, links, and covers under /proc.
  EXPECT_EQ(init::landlock_rights(step(Op::kAttach, "/lib32", false, false, -1)), 0u);
  EXPECT_EQ(init::landlock_rights(step(Op::kSymlink, "/bin")), 0u);
  EXPECT_EQ(init::landlock_rights(step(Op::kMask, "/proc/kcore")), 0u);
  EXPECT_EQ(init::landlock_rights(step(Op::kReadOnly, "/proc/sys")), 0u);
}

TEST(Landlock, HandledByAbiAndNetworkMode) {
  init::Plan p{};
  p.network = tsb::isolate::kNetworkEgress;
  EXPECT_EQ(ll::fs_rights(0), 0u);
  EXPECT_EQ(ll::fs_rights(1), (1u << 13) - 1);
  EXPECT_EQ(ll::fs_rights(2) & ll::kFsRefer, ll::kFsRefer);
  EXPECT_EQ(ll::fs_rights(2) & ll::kFsTruncate, 0u);
  EXPECT_EQ(ll::fs_rights(3) & ll::kFsTruncate, ll::kFsTruncate);
  EXPECT_EQ(ll::fs_rights(4) & ll::kFsIoctlDev, 0u);
  EXPECT_EQ(ll::fs_rights(7), (1u << 16) - 1);
  EXPECT_EQ(init::landlock_attr(p, 3).handled_access_net, 0u);
  EXPECT_EQ(init::landlock_attr(p, 4).handled_access_net, ll::kNetBindTcp | ll::kNetConnectTcp);
  EXPECT_EQ(init::landlock_attr(p, 5).scoped, 0u);
  EXPECT_EQ(init::landlock_attr(p, 6).scoped, ll::kScopeAbstractUnixSocket | ll::kScopeSignal);
  EXPECT_EQ(init::landlock_report(init::landlock_attr(p, 7), 7),
            7 | tsb::isolate::kLandlockFs | tsb::isolate::kLandlockNet | tsb::isolate::kLandlockScope);
  // No port is handled unless the network is egress: a tool of "none" or
  // "host" keeps talking to a server it started itself.
  for (uint8_t n : {tsb::isolate::kNetworkOwn, tsb::isolate::kNetworkHost}) {
    p.network = n;
    EXPECT_EQ(init::landlock_attr(p, 7).handled_access_net, 0u);
    EXPECT_EQ(init::landlock_report(init::landlock_attr(p, 7), 7),
              7 | tsb::isolate::kLandlockFs | tsb::isolate::kLandlockScope);
  }
}

TEST(Landlock, OffIsOff) {
  init::Plan p{};
  p.landlock = 0;
  EXPECT_EQ(init::apply_landlock(p, AT_FDCWD), tsb::isolate::kLandlockOff);
}

// The ruleset of a small plan, enforced in a child on a tree laid out like
// a sandbox's root: what a step made is reachable as the step says, and
// nothing else is.
TEST(Landlock, EnforcedAsThePlanSays) {
  const int abi = kernel_abi();
  if (abi < 3) GTEST_SKIP() << "this kernel's Landlock ABI is " << abi << " (the test wants 3+)";
  namespace fs = std::filesystem;
  char tmpl[] = "/tmp/tsb-landlock-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const fs::path root = tmpl;
  for (const char* d : {"usr/bin", "tmp", "etc", "work", "secret"}) fs::create_directories(root / d);
  for (const char* f : {"usr/bin/tool", "etc/passwd", "etc/unlisted", "secret/key"}) std::ofstream(root / f) << "x\n";
  fs::permissions(root / "usr/bin/tool", fs::perms::owner_all);

  std::vector<init::Step> steps = {
      step(Op::kAttach, "/usr"),
      step(Op::kAttach, "/tmp", true, true),
      step(Op::kWriteFile, "/etc/passwd"),
      step(Op::kAttach, "/work", true, true),
      step(Op::kAttach, "/missing", false, false, -1),
      step(Op::kAttach, "/not-there"),  // in the plan, not on disk: no rule, no failure
  };
  init::Plan p{};
  p.landlock = tsb::isolate::kLandlockAuto;
  p.network = tsb::isolate::kNetworkOwn;
  p.steps = steps.data();
  p.nsteps = static_cast<uint32_t>(steps.size());
  const int rootfd = ::open(root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
  ASSERT_GE(rootfd, 0);

  // The child reports one errno (0: allowed) per check, in order.
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::close(fds[0]);
    if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) ::_exit(10);
    const int applied = init::apply_landlock(p, rootfd);
    if (applied < 0) ::_exit(11);
    auto check = [&](const char* rel, int flags) {
      int fd = ::openat(rootfd, rel, flags | O_CLOEXEC, 0600);
      int e = fd >= 0 ? 0 : errno;
      if (fd >= 0) ::close(fd);
      (void)!::write(fds[1], &e, sizeof e);
    };
    check("usr/bin/tool", O_RDONLY);
    check("usr/bin/tool", O_WRONLY);
    check("usr/bin/new", O_WRONLY | O_CREAT);
    check("tmp/new", O_WRONLY | O_CREAT);
    check("work/new", O_RDWR | O_CREAT | O_TRUNC);
    check("etc/passwd", O_RDONLY);
    check("etc/passwd", O_WRONLY);
    check("etc/unlisted", O_RDONLY);
    check("secret/key", O_RDONLY);
    check("etc", O_RDONLY | O_DIRECTORY);  // listing: the root's rule
    (void)!::write(fds[1], &applied, sizeof applied);
    ::_exit(0);
  }
  ::close(fds[1]);
  std::vector<int> got;
  int v;
  while (::read(fds[0], &v, sizeof v) == static_cast<ssize_t>(sizeof v)) got.push_back(v);
  ::close(fds[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ::close(rootfd);
  fs::remove_all(root);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  ASSERT_EQ(got.size(), 11u);
  EXPECT_EQ(got[0], 0) << "read a read-only step";
  EXPECT_EQ(got[1], EACCES) << "write a read-only step";
  EXPECT_EQ(got[2], EACCES) << "create in a read-only step";
  EXPECT_EQ(got[3], 0) << "create in a writable step";
  EXPECT_EQ(got[4], 0) << "create and truncate in a writable step";
  EXPECT_EQ(got[5], 0) << "read a file step";
  EXPECT_EQ(got[6], EACCES) << "write a file step";
  EXPECT_EQ(got[7], EACCES) << "a file no step made";
  EXPECT_EQ(got[8], EACCES) << "a directory no step made";
  EXPECT_EQ(got[9], 0) << "list a directory";
  EXPECT_EQ(got[10] & 0xff, abi > 255 ? 255 : abi);
  EXPECT_NE(got[10] & tsb::isolate::kLandlockFs, 0);
  EXPECT_EQ(got[10] & tsb::isolate::kLandlockNet, 0);
}
