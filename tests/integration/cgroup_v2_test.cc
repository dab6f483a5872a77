// cgroup v2 paths of the engine, each proved by an observation that fails
// when the path is not taken:
//   - CLONE_INTO_CGROUP: the child is born in its leaf, never migrated;
//   - cgroup.kill: the whole-tree kill reaches every process of the leaf's
//     subtree, including ones a pid-namespace kill or a cgroup.procs sweep
//     cannot reach;
//   - memory.events / memory.peak: the OOM count and peak memory of a run;
//   - the limits written to the leaf;
//   - engine.cgroup_parent "self": the daemon moves into a "supervisor" leaf
//     of its delegated cgroup and creates run leaves beside it.
//
// They need the unified hierarchy and skip on v1/hybrid hosts (this build
// machine). The VM lane (tests/vm/run-lane.sh) runs them on a v2-only kernel
// with TSB_EXPECT_CGROUP=v2, which turns that skip into a failure.
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <set>
#include <thread>

#include "isolate/engine/cgroup.h"
#include "daemon/compile/prepare.h"
#include "isolate/base/random.h"
#include "tests/integration/harness.h"

using namespace tsb::testing;
using namespace std::chrono_literals;
using nlohmann::json;
using tsb::isolate::CgroupMode;
using tsb::isolate::to_string;
using tsb::isolate::EndReason;
using tsb::isolate::read_text_file;
using tsb::isolate::write_text_file;

namespace {

constexpr const char* kCgroupMount = "/sys/fs/cgroup";

std::string slurp(const std::string& p) {
  auto t = read_text_file(p);
  return t.ok() ? *t : std::string("<unreadable: ") + t.error().message + ">";
}

std::uint64_t keyed(const std::string& text, const std::string& key) {
  std::istringstream in(text);
  std::string k;
  std::uint64_t v;
  while (in >> k >> v)
    if (k == key) return v;
  return 0;
}

// This process's cgroup on the unified hierarchy ("0::<path>").
std::string own_v2_cgroup() {
  std::istringstream in(slurp("/proc/self/cgroup"));
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("0::", 0) == 0) return line.substr(3);
  return "";
}

std::string parent_of(const std::string& cg) {
  auto slash = cg.rfind('/');
  return slash == 0 || slash == std::string::npos ? "" : cg.substr(0, slash);
}

bool readable_within(int fd, std::chrono::milliseconds limit) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, static_cast<int>(limit.count())) == 1;
}

// waitpid with a bound; -1 when the child is still running afterwards.
int wait_exit(pid_t pid, std::chrono::milliseconds limit) {
  auto end = std::chrono::steady_clock::now() + limit;
  int st = 0;
  while (std::chrono::steady_clock::now() < end) {
    pid_t r = ::waitpid(pid, &st, WNOHANG);
    if (r == pid) return st;
    std::this_thread::sleep_for(10ms);
  }
  return -1;
}

std::set<std::string> subdirs(const std::string& dir) {
  std::set<std::string> out;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d))
      if (e->d_type == DT_DIR && e->d_name[0] != '.') out.insert(e->d_name);
    ::closedir(d);
  }
  return out;
}

class CgroupV2Test : public EngineTest {
 protected:
  void SetUp() override {
    EngineTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    if (engine_->cgroups().mode() != CgroupMode::V2) {
      const char* want = std::getenv("TSB_EXPECT_CGROUP");
      if (want && std::string(want) == "v2")
        FAIL() << "TSB_EXPECT_CGROUP=v2, but the engine found " << engine_->cgroups().describe();
      GTEST_SKIP() << "cgroup v2 only, this host has " << to_string(engine_->cgroups().mode())
                   << " (tests/vm/run-lane.sh runs these on a v2-only kernel)";
    }
  }
};

}  // namespace

TEST_F(CgroupV2Test, ChildIsBornInItsLeafThroughCloneIntoCgroup) {
  // The trap: this process moves into a cgroup whose pids.max equals its own
  // task count, so not one more task may be created in it. A child created
  // by clone3 without CLONE_INTO_CGROUP is charged to its creator's cgroup
  // (and only migrated to the leaf afterwards), so it would fail here with
  // EAGAIN; with CLONE_INTO_CGROUP it is charged to the run's leaf from birth.
  const std::string own = own_v2_cgroup();
  ASSERT_FALSE(own.empty()) << slurp("/proc/self/cgroup");
  const std::string pin = std::string(kCgroupMount) + parent_of(own) + "/tsb-pin-" + std::to_string(::getpid());
  ASSERT_EQ(::mkdir(pin.c_str(), 0755), 0) << pin << ": " << std::strerror(errno);
  struct Restore {
    std::string own, pin;
    ~Restore() {
      (void)write_text_file(std::string(kCgroupMount) + own + "/cgroup.procs", std::to_string(::getpid()));
      ::rmdir(pin.c_str());
    }
  } restore{own, pin};
  struct stat st{};
  ASSERT_EQ(::stat((pin + "/pids.max").c_str(), &st), 0)
      << "the pids controller is not enabled for " << pin << "'s parent";
  ASSERT_TRUE(write_text_file(pin + "/cgroup.procs", std::to_string(::getpid())).ok());
  const std::string tasks = slurp(pin + "/pids.current");
  ASSERT_TRUE(write_text_file(pin + "/pids.max", tasks).ok()) << tasks;

  // The trap is armed: a plain fork from here is refused.
  pid_t f = ::fork();
  int fork_errno = errno;
  if (f == 0) ::_exit(0);
  if (f > 0) ::waitpid(f, nullptr, 0);
  ASSERT_EQ(f, -1) << "fork succeeded in a cgroup at its pids.max: the test cannot tell the two paths apart";
  ASSERT_EQ(fork_errno, EAGAIN);

  // A full run works from inside the trap ...
  auto r = run(spec({"/bin/true"}));
  EXPECT_EQ(r.reason, EndReason::Exited) << describe(r);
  EXPECT_EQ(r.exit_code, 0) << describe(r);

  // ... and the child is in its leaf the moment spawn returns.
  auto sb = engine_->spawn(spec({"/bin/sleep", "30"}));
  ASSERT_TRUE(sb.ok()) << sb.error().message;
  std::string expect = "0::" + engine_->cgroups().parent() + "/" + (*sb)->cgroup().name() + "\n";
  // The parent as the engine sees it is relative to this process's cgroup
  // namespace root, as is /proc/<pid>/cgroup read from here.
  if (engine_->cgroups().parent() == "/") expect = "0::/" + (*sb)->cgroup().name() + "\n";
  EXPECT_EQ(slurp("/proc/" + std::to_string((*sb)->pid()) + "/cgroup"), expect);
  (*sb)->kill();
}

TEST_F(CgroupV2Test, WholeTreeKillUsesCgroupKill) {
  ASSERT_TRUE(engine_->cgroups().has_cgroup_kill()) << "no cgroup.kill at " << engine_->cgroups().describe();
  // A tool that leaves a daemonized grandchild behind, reparented to the
  // sandbox's init.
  auto sb = engine_->spawn(spec({"/bin/sh", "-c", std::string(kProbe) + " daemonize; exec sleep 3600"}));
  ASSERT_TRUE(sb.ok()) << sb.error().message;
  const std::string leaf = engine_->config().cgroups.hierarchies.at(0).base + "/" + (*sb)->cgroup().name();
  std::size_t procs = 0;
  for (int i = 0; i < 1000 && procs < 3; ++i) {  // init, sleep, the grandchild
    std::this_thread::sleep_for(10ms);
    std::istringstream in(slurp(leaf + "/cgroup.procs"));
    procs = 0;
    for (pid_t p; in >> p;) ++procs;
  }
  ASSERT_GE(procs, 3u) << slurp(leaf + "/cgroup.procs");

  // A host process outside the sandbox's pid namespace, in a cgroup BELOW
  // the leaf: SIGKILL to the namespace's pid 1 cannot reach it, nor can
  // killing the pids listed in the leaf's own cgroup.procs (the fallback for
  // kernels without cgroup.kill). cgroup.kill acts on the whole subtree.
  const std::string sub = leaf + "/outside";
  ASSERT_EQ(::mkdir(sub.c_str(), 0755), 0) << std::strerror(errno);
  pid_t outsider = ::fork();
  if (outsider == 0) {
    for (;;) ::pause();
  }
  ASSERT_GT(outsider, 0);
  ASSERT_TRUE(write_text_file(sub + "/cgroup.procs", std::to_string(outsider)).ok());

  // What the wall-clock and CPU watchdogs do when a limit is reached.
  (*sb)->kill();

  int st = wait_exit(outsider, 10s);
  if (st == -1) {
    ::kill(outsider, SIGKILL);
    ::waitpid(outsider, nullptr, 0);
  }
  EXPECT_TRUE(st != -1 && WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL)
      << "the process below the leaf survived the run's kill (status " << st << ")";
  // The whole subtree is empty: the daemonized grandchild is gone too.
  std::string events;
  for (int i = 0; i < 1000; ++i) {
    events = slurp(leaf + "/cgroup.events");
    if (keyed(events, "populated") == 0) break;
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_EQ(keyed(events, "populated"), 0u) << events << slurp(leaf + "/cgroup.procs");
  ::rmdir(sub.c_str());
}

TEST_F(CgroupV2Test, LimitsOomAndPeakComeFromTheLeafsV2Files) {
  ASSERT_TRUE(engine_->cgroups().has_memory_peak()) << "no memory.peak (5.19+) at " << engine_->cgroups().describe();
  auto s = probe_spec({"mem-hog", "0"});
  s.limits.memory_bytes = 64ull << 20;
  s.limits.pids = 48;
  s.limits.cpu_quota_millicpus = 500;
  auto sb = engine_->spawn(s);
  ASSERT_TRUE(sb.ok()) << sb.error().message;
  const std::string leaf = engine_->config().cgroups.hierarchies.at(0).base + "/" + (*sb)->cgroup().name();

  // The limits, as written to the leaf before the child existed.
  EXPECT_EQ(slurp(leaf + "/memory.max"), std::to_string(64ull << 20) + "\n");
  EXPECT_EQ(slurp(leaf + "/memory.swap.max"), "0\n");
  EXPECT_EQ(slurp(leaf + "/memory.oom.group"), "1\n");
  EXPECT_EQ(slurp(leaf + "/pids.max"), "48\n");
  EXPECT_EQ(slurp(leaf + "/cpu.max"), "50000 100000\n");

  // memory.oom.group: the OOM kill takes the whole run, pid 1 included.
  ASSERT_TRUE(readable_within((*sb)->pidfd(), 120s)) << "the memory hog was not OOM-killed";
  const std::string events = slurp(leaf + "/memory.events");
  const std::uint64_t oom_kill = keyed(events, "oom_kill"), group_kill = keyed(events, "oom_group_kill");
  EXPECT_GE(oom_kill, 1u) << events;
  const std::uint64_t peak = std::strtoull(slurp(leaf + "/memory.peak").c_str(), nullptr, 10);
  EXPECT_GT(peak, 32ull << 20);
  EXPECT_LE(peak, 64ull << 20);

  // What the engine reports is exactly what the kernel counted there.
  auto stats = (*sb)->cgroup().stats();
  EXPECT_EQ(stats.oom_kills, oom_kill + group_kill) << events;
  EXPECT_EQ(stats.peak_memory_bytes, peak);
  EXPECT_GT(stats.cpu.count(), 0);
}

TEST_F(CgroupV2Test, StaleLeavesAreKilledAndRemoved) {
  // A leaf left by an engine that died (its owner pid does not exist), with
  // a process still inside, in a sub-cgroup of its own.
  const std::string base = engine_->config().cgroups.hierarchies.at(0).base;
  const std::string stale = base + "/stale.999999999.1";
  ASSERT_EQ(::mkdir(stale.c_str(), 0755), 0) << std::strerror(errno);
  ASSERT_EQ(::mkdir((stale + "/sub").c_str(), 0755), 0);
  pid_t leftover = ::fork();
  if (leftover == 0) {
    for (;;) ::pause();
  }
  ASSERT_TRUE(write_text_file(stale + "/sub/cgroup.procs", std::to_string(leftover)).ok());
  // A fresh Cgroups, as at the start of a new engine: reclaim runs before
  // any leaf of its own was created.
  auto placement = tsb::isolate::prepare_cgroups(engine_->cgroups().parent());
  ASSERT_TRUE(placement.ok()) << placement.error().message;
  auto fresh = tsb::isolate::Cgroups::open(*placement);
  ASSERT_TRUE(fresh.ok()) << fresh.error().message;
  EXPECT_TRUE((*fresh)->has_cgroup_kill());
  // Found stale (its pid is not alive, it has no lock file), then killed
  // with cgroup.kill: the process in the sub-cgroup too.
  const auto names = tsb::isolate::find_stale_leaves(*placement, "stale", "/run/toolsandbox-test", ::getpid());
  ASSERT_EQ(names, std::vector<std::string>{"stale.999999999.1"});
  auto leaf = (*fresh)->existing_leaf(names[0]);
  ASSERT_TRUE(leaf);
  EXPECT_TRUE(leaf->kill_all().ok());
  int st = wait_exit(leftover, 10s);
  if (st == -1) {
    ::kill(leftover, SIGKILL);
    ::waitpid(leftover, nullptr, 0);
  }
  EXPECT_TRUE(st != -1 && WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) << "status " << st;
  // The sub-cgroup keeps the leaf's directory; the engine never creates
  // one, so it is removed here.
  ::rmdir((stale + "/sub").c_str());
  ::rmdir(stale.c_str());
}

TEST_F(CgroupV2Test, DaemonWithParentSelfRunsBesideItsSupervisorLeaf) {
  // The layout systemd gives the service (Delegate=yes): a cgroup of its
  // own, with the daemon in it. Made here as a sibling of this process's.
  const std::string own = own_v2_cgroup();
  const std::string rel = parent_of(own) + "/tsb-service-" + std::to_string(::getpid());
  const std::string deleg = kCgroupMount + rel;
  ASSERT_EQ(::mkdir(deleg.c_str(), 0755), 0) << deleg << ": " << std::strerror(errno);

  const std::string dir = "/tmp/tsb-self-" + tsb::random_hex(4);
  ::mkdir(dir.c_str(), 0755);
  const std::string sock = dir + "/d.sock", cfgfile = dir + "/config.json", log = dir + "/log";
  json cfg = {{"version", 1},
              {"socket", {{"path", sock}}},
              {"request_timeout", "20s"},
              {"shutdown_grace", "2s"},
              {"policies_dir", std::string(TSB_SOURCE_DIR) + "/policies"},
              {"organizations", std::string(TSB_SOURCE_DIR) + "/policies/organizations.json"},
              // No warm sandboxes (no uid slot beyond the runs'): the leaves
              // below are the supervisor's and the run's alone. The systemd
              // lane checks the same layout with the shipped pools.
              {"max_concurrent_runs", 8},
              {"engine", {{"state_dir", "/run/tsb-self"},
                          {"cgroup_parent", "self"},
                          {"uid_slots", 8},
                          {"init", std::string(TSB_BIN_DIR) + "/toolsandbox-init"}}}};
  std::ofstream(cfgfile) << cfg.dump(2);
  pid_t d = ::fork();
  if (d == 0) {
    // What systemd does before it executes the service.
    if (!write_text_file(deleg + "/cgroup.procs", "0").ok()) ::_exit(126);
    int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    std::string bin = std::string(TSB_BIN_DIR) + "/toolsandboxd";
    ::execl(bin.c_str(), bin.c_str(), "--config", cfgfile.c_str(), nullptr);
    ::_exit(127);
  }
  ASSERT_GT(d, 0);
  struct Stop {
    pid_t pid;
    std::string deleg;
    ~Stop() {
      ::kill(pid, SIGTERM);
      if (wait_exit(pid, 20s) == -1) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, nullptr, 0);
      }
      for (const auto& n : subdirs(deleg)) ::rmdir((deleg + "/" + n).c_str());
      ::rmdir(deleg.c_str());
    }
  } stop{d, deleg};
  int fd = -1;
  for (int i = 0; i < 1500 && fd < 0; ++i) {  // up to 30 s: the VM lane is slow
    fd = connect_unix(sock);
    if (fd < 0) std::this_thread::sleep_for(20ms);
  }
  ASSERT_GE(fd, 0) << "the daemon did not start: " << slurp(log);

  EXPECT_EQ(slurp("/proc/" + std::to_string(d) + "/cgroup"), "0::" + rel + "/supervisor\n");
  EXPECT_EQ(slurp(deleg + "/cgroup.procs"), "") << "processes left in the delegated cgroup itself";
  std::string ctl = slurp(deleg + "/cgroup.subtree_control");
  std::set<std::string> enabled;
  {
    std::istringstream in(ctl);
    for (std::string w; in >> w;) enabled.insert(w);
  }
  for (const char* c : {"memory", "pids", "cpu"}) EXPECT_EQ(enabled.count(c), 1u) << c << " not in: " << ctl;

  // A run in flight has its leaf beside the supervisor.
  send_all(fd, run_tool_request("import time\ndef nap():\n    time.sleep(3)\n    return 7\n", "nap", json::object()).dump() +
                   "\n");
  std::set<std::string> during;
  for (int i = 0; i < 1000; ++i) {
    during = subdirs(deleg);
    if (during.size() >= 2) break;
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_EQ(during.count("supervisor"), 1u);
  bool saw_run = false;
  for (const auto& n : during) saw_run |= n.rfind("run." + std::to_string(d) + ".", 0) == 0;
  EXPECT_TRUE(saw_run) << "no run leaf beside the supervisor; saw " << during.size() << " dirs";
  json reply = read_json_line(fd);
  ::close(fd);
  EXPECT_EQ(reply.is_object() ? reply["result"].value("func_return", json()) : json(), 7) << reply.dump() << slurp(log);
  // The finished run's leaf is gone; only the supervisor stays.
  std::set<std::string> after;
  for (int i = 0; i < 500; ++i) {
    after = subdirs(deleg);
    if (after.size() == 1) break;
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_EQ(after, std::set<std::string>{"supervisor"});
  (void)!std::system(("rm -rf " + dir).c_str());
}
