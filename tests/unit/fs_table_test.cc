// The one mount table (daemon/policy/fs_table.h): what every sandbox is made of,
// in the order it is made. These are the properties the engine and
// toolsandbox-init rely on when they execute it.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include <sys/stat.h>

#include "daemon/policy/fs_table.h"

namespace {

using tsb::isolate::FsEntry;
using tsb::isolate::FsInputs;
using tsb::isolate::FsTable;

const FsTable& table_of(const FsInputs& in) {
  static std::vector<std::shared_ptr<const FsTable>> keep;
  auto t = tsb::isolate::build_fs_table(in);
  EXPECT_TRUE(t.ok()) << (t.ok() ? "" : t.error().message);
  keep.push_back(t.ok() ? *t : std::make_shared<const FsTable>());
  return *keep.back();
}

std::size_t index_of(const FsTable& t, const std::string& path, FsEntry::Kind kind) {
  for (std::size_t i = 0; i < t.size(); ++i)
    if (t[i].path == path && t[i].kind == kind) return i;
  return t.size();
}

bool has(const FsTable& t, const std::string& path) {
  return std::any_of(t.begin(), t.end(), [&](const FsEntry& e) { return e.path == path; });
}

}  // namespace

TEST(FsTable, EveryRowHasAReasonAndTheRootComesFirst) {
  FsInputs in;
  in.venv = "/var/lib/toolsandbox/venv";
  const FsTable& t = table_of(in);
  ASSERT_FALSE(t.empty());
  EXPECT_EQ(t.front().kind, FsEntry::kRoot);
  EXPECT_EQ(t.front().path, "/");
  EXPECT_EQ(std::count_if(t.begin(), t.end(), [](const FsEntry& e) { return e.kind == FsEntry::kRoot; }), 1);
  for (const FsEntry& e : t) {
    EXPECT_TRUE(tsb::isolate::check_sandbox_path(e.path, "row").ok()) << e.path;
    // The /dev links are self-explanatory; every other row says why it is there.
    if (e.kind != FsEntry::kSymlink) EXPECT_FALSE(e.reason.empty()) << e.path;
  }
}

TEST(FsTable, SystemPathsAndTheVenvAreReadOnlyHostPaths) {
  FsInputs in;
  in.venv = "/srv/venv";
  const FsTable& t = table_of(in);
  const auto usr = index_of(t, "/usr", FsEntry::kSystem);
  ASSERT_LT(usr, t.size());
  EXPECT_FALSE(t[usr].optional) << "a sandbox without /usr cannot run Python";
  EXPECT_TRUE(t[index_of(t, "/lib64", FsEntry::kSystem)].optional);
  const auto venv = index_of(t, "/venv", FsEntry::kHost);
  ASSERT_LT(venv, t.size());
  EXPECT_EQ(t[venv].source, "/srv/venv");
  EXPECT_FALSE(t[venv].optional) << "a missing venv fails the run";
  EXPECT_FALSE(has(table_of(FsInputs{}), "/venv")) << "no venv, no row";
}

TEST(FsTable, NameResolutionFilesOnlyWithTheHostsNetwork) {
  FsInputs in;
  EXPECT_FALSE(has(table_of(in), "/etc/resolv.conf"));
  EXPECT_FALSE(has(table_of(in), "/etc/ssl"));
  in.network = tsb::isolate::NetworkMode::Egress;
  EXPECT_FALSE(has(table_of(in), "/etc/resolv.conf")) << "with egress the daemon resolves names, not the tool";
  EXPECT_TRUE(has(table_of(in), "/etc/ssl")) << "HTTPS through the proxy's tunnel needs the CA certificates";
  in.network = tsb::isolate::NetworkMode::Host;
  EXPECT_TRUE(has(table_of(in), "/etc/resolv.conf"));
  EXPECT_TRUE(has(table_of(in), "/etc/ssl"));
}

TEST(FsTable, GeneratedFilesNameNoHostAccount) {
  FsInputs in;
  in.uid = 1234;
  in.gid = 2345;
  in.workdir = "/home/tool";
  in.hostname = "box";
  const FsTable& t = table_of(in);
  std::map<std::string, std::string> files;
  for (const FsEntry& e : t)
    if (e.kind == FsEntry::kFile) files[e.path] = e.data;
  EXPECT_EQ(files["/etc/passwd"],
            "root:x:0:0:sandbox init:/:/usr/sbin/nologin\nsandbox:x:1234:2345:tool:/home/tool:/usr/sbin/nologin\n"
            "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n");
  EXPECT_EQ(files["/etc/hostname"], "box\n");
  EXPECT_NE(files["/etc/hosts"].find("localhost box"), std::string::npos);
  const auto work = index_of(t, "/home/tool", FsEntry::kTmpfs);
  ASSERT_LT(work, t.size());
  EXPECT_TRUE(t[work].tool_owned);
  EXPECT_TRUE(t[work].noexec);
  EXPECT_EQ(t[work].mode, 0700u);
}

TEST(FsTable, BindsShallowestFirstAndTheRunnerLast) {
  FsInputs in;
  in.binds = {{"/srv/inner", "/data/sub", false, false}, {"/srv/outer", "/data", true, false},
              {"/srv/opt", "/opt/x", false, true}};
  in.runner = "/usr/share/toolsandbox/runner/toolsandbox_runner.py";
  in.runner_files = {"/usr/share/toolsandbox/runner/_toolsandbox_runner/__init__.py",
                     "/usr/share/toolsandbox/runner/__pycache__/toolsandbox_runner.cpython-311.pyc",
                     "/usr/share/toolsandbox/runner/_toolsandbox_runner/__pycache__/__init__.cpython-311.pyc"};
  const FsTable& t = table_of(in);
  const auto outer = index_of(t, "/data", FsEntry::kBind), inner = index_of(t, "/data/sub", FsEntry::kHost);
  ASSERT_LT(outer, t.size());
  ASSERT_LT(inner, t.size());
  EXPECT_LT(outer, inner) << "a bind inside another must land on top of it";
  EXPECT_TRUE(t[index_of(t, "/opt/x", FsEntry::kHost)].optional);
  const auto runner = index_of(t, std::string(tsb::isolate::kRunnerSandboxPath), FsEntry::kHost);
  ASSERT_LT(runner, t.size());
  EXPECT_EQ(t[runner].source, in.runner);
  EXPECT_GT(runner, inner);
  // The runner's other files at their paths below its directory.
  const auto init = index_of(t, "/opt/toolsandbox/runner/_toolsandbox_runner/__init__.py", FsEntry::kHost);
  ASSERT_LT(init, t.size());
  EXPECT_EQ(t[init].source, in.runner_files[0]);
  const auto pyc = index_of(t, "/opt/toolsandbox/runner/__pycache__/toolsandbox_runner.cpython-311.pyc", FsEntry::kHost);
  ASSERT_LT(pyc, t.size());
  EXPECT_EQ(t[pyc].source, in.runner_files[1]);
  const auto init_pyc =
      index_of(t, "/opt/toolsandbox/runner/_toolsandbox_runner/__pycache__/__init__.cpython-311.pyc", FsEntry::kHost);
  ASSERT_LT(init_pyc, t.size());
  EXPECT_EQ(t[init_pyc].source, in.runner_files[2]);
  EXPECT_GT(init, runner);
  // Only .py and .pyc files below the runner's own directory, never the
  // runner itself again, and none without a runner.
  for (const std::string bad :
       {"relative.pyc", "/x/toolsandbox_runner.py", "/x/", "/usr/share/toolsandbox/runner/notes.txt",
        "/usr/share/toolsandbox/runner/../x.py", "/usr/share/toolsandbox/runner//x.py",
        "/usr/share/toolsandbox/runner/./x.pyc", "/usr/share/toolsandbox/runner/toolsandbox_runner.py",
        "/usr/share/toolsandbox/runnerx/a.py"}) {
    FsInputs b = in;
    b.runner_files = {bad};
    EXPECT_FALSE(tsb::isolate::build_fs_table(b).ok()) << bad;
  }
  FsInputs none = in;
  none.runner.clear();
  EXPECT_FALSE(tsb::isolate::build_fs_table(none).ok());
}

TEST(FsTable, ProcMasksFollowProcAndCoverWithObjectsInitMakesForEach) {
  const FsTable& t = table_of(FsInputs{});
  const auto proc = index_of(t, "/proc", FsEntry::kProc);
  ASSERT_LT(proc, t.size());
  int masks = 0;
  std::set<std::string> sources;
  for (std::size_t i = 0; i < t.size(); ++i) {
    const FsEntry& e = t[i];
    if (e.kind != FsEntry::kMask && e.kind != FsEntry::kReadOnly && e.kind != FsEntry::kBootId) continue;
    ++masks;
    EXPECT_GT(i, proc) << e.path;
    EXPECT_EQ(e.path.rfind("/proc/", 0), 0u) << e.path;
    if (e.kind == FsEntry::kReadOnly) continue;
    // Init makes each mask's object new (O_EXCL) at its source: a name of
    // its own, that no other row makes, in the root tmpfs.
    EXPECT_EQ(e.source.rfind("/.masks/", 0), 0u) << e.path;
    EXPECT_TRUE(sources.insert(e.source).second) << e.source << " covers two entries";
    EXPECT_FALSE(has(t, e.source)) << e.source << " is made by another row";
    EXPECT_TRUE(S_ISREG(e.mode) || (S_ISDIR(e.mode) && e.kind == FsEntry::kMask)) << e.path;
    EXPECT_EQ(e.mode & 0222, 0u) << e.path;
  }
  EXPECT_GE(masks, 15);
  for (const char* p : {"/proc/kcore", "/proc/sysrq-trigger", "/proc/sys/kernel/random/boot_id", "/proc/cmdline"})
    EXPECT_TRUE(has(t, p)) << p;
  // The boot id is covered after /proc/sys turned read-only (a bind inside it).
  EXPECT_LT(index_of(t, "/proc/sys", FsEntry::kReadOnly), index_of(t, "/proc/sys/kernel/random/boot_id", FsEntry::kBootId));
}

TEST(FsTable, DevHoldsOnlyTheEnginesRowsThenShm) {
  const FsTable& t = table_of(FsInputs{});
  const auto dev = index_of(t, "/dev", FsEntry::kDev);
  ASSERT_LT(dev, t.size());
  for (const char* d : {"/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom"}) {
    const auto i = index_of(t, d, FsEntry::kDevNode);
    ASSERT_LT(i, t.size()) << d;
    EXPECT_GT(i, dev);
    EXPECT_EQ(t[i].source, d);
  }
  const auto shm = index_of(t, "/dev/shm", FsEntry::kTmpfs);
  ASSERT_LT(shm, t.size());
  EXPECT_LT(index_of(t, "/dev/shm", FsEntry::kDir), shm) << "the engine makes the mount point before /dev turns read-only";
  EXPECT_EQ(shm, t.size() - 1);
  for (std::size_t i = dev + 1; i < t.size(); ++i) EXPECT_EQ(t[i].path.rfind("/dev/", 0), 0u) << t[i].path;
}

TEST(FsTable, InputsThatCannotMakeATableAreRefused) {
  auto refused = [](FsInputs in) { return !tsb::isolate::build_fs_table(in).ok(); };
  FsInputs in;
  in.workdir = "/";
  EXPECT_TRUE(refused(in));
  in = {};
  in.workdir = "/work/../etc";
  EXPECT_TRUE(refused(in));
  in = {};
  in.hostname = "";
  EXPECT_TRUE(refused(in));
  in.hostname = std::string(65, 'h');
  EXPECT_TRUE(refused(in));
  in.hostname = "a b";
  EXPECT_TRUE(refused(in));
  in = {};
  in.binds = {{"relative", "/x", false, false}};
  EXPECT_TRUE(refused(in));
  in.binds = {{"/srv", "/x/./y", false, false}};
  EXPECT_TRUE(refused(in));
  in.binds = {{"/srv", "x", false, false}};
  EXPECT_TRUE(refused(in));
  in = {};
  in.venv = "venv";
  EXPECT_TRUE(refused(in));
  in = {};
  in.runner = "runner.py";
  EXPECT_TRUE(refused(in));
}
