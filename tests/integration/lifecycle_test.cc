// Set-up failures, concurrency, and nothing left behind after many runs.
#include <dirent.h>
#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>

#include "tests/integration/harness.h"

using namespace tsb::testing;
using tsb::isolate::EndReason;
using tsb::isolate::Stage;
using namespace std::chrono_literals;

namespace {
int count_fds() {
  int n = 0;
  DIR* d = ::opendir("/proc/self/fd");
  while (dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
  ::closedir(d);
  return n;
}
std::string read_all(const std::string& p) {
  std::ifstream in(p);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
std::set<std::string> leaves(const tsb::isolate::Engine& e) {
  std::set<std::string> out;
  (void)e;
  for (const char* h : {"memory", "pids", "cpu", "cpuacct", "freezer", ""}) {
    std::string base = std::string("/sys/fs/cgroup/") + h;
    const char* parent = std::getenv("TSB_CGROUP_PARENT");
    base += parent ? parent : "/toolsandbox-test";
    DIR* d = ::opendir(base.c_str());
    if (!d) continue;
    while (dirent* ent = ::readdir(d))
      if (ent->d_type == DT_DIR && ent->d_name[0] != '.') out.insert(base + "/" + ent->d_name);
    ::closedir(d);
  }
  return out;
}
}  // namespace

TEST_F(EngineTest, MissingCommandIsASetupFailureAtExecve) {
  auto r = run(spec({"/no/such/tool"}));
  EXPECT_EQ(r.reason, EndReason::SetupFailed) << describe(r);
  EXPECT_EQ(r.setup_stage, Stage::Execve);
  EXPECT_EQ(r.setup_errno, ENOENT);
  EXPECT_NE(r.error.find("execve"), std::string::npos);
}

TEST_F(EngineTest, CommandIsSearchedInPath) {
  auto r = run(spec({"true"}));
  EXPECT_EQ(r.reason, EndReason::Exited) << describe(r);
  EXPECT_EQ(r.exit_code, 0);
}

TEST_F(EngineTest, MissingVenvIsASetupFailureNamingTheStage) {
  auto s = spec({"/bin/true"}, [](tsb::isolate::FsInputs& in) { in.venv = "/nonexistent/venv"; });
  auto r = run(s);
  EXPECT_EQ(r.reason, EndReason::SetupFailed) << describe(r);
  EXPECT_EQ(r.setup_stage, Stage::MountBind);
  EXPECT_EQ(r.setup_errno, ENOENT);
}

TEST_F(EngineTest, SpawnWithoutSeccompIsRefused) {
  auto s = spec({"/bin/true"});
  s.seccomp.reset();
  auto r = run(s);
  EXPECT_EQ(r.reason, EndReason::SetupFailed);
  EXPECT_NE(r.error.find("seccomp"), std::string::npos) << r.error;
}

TEST_F(EngineTest, ExitCodesAndSignalsPassThrough) {
  auto r = run(spec({"/bin/sh", "-c", "exit 42"}));
  EXPECT_EQ(r.reason, EndReason::Exited);
  EXPECT_EQ(r.exit_code, 42);
  r = run(spec({"/bin/sh", "-c", "kill -SEGV $$"}));
  EXPECT_EQ(r.reason, EndReason::Signaled) << describe(r);
  EXPECT_EQ(r.signal, SIGSEGV);
}

// The end note (RunSpec::end_note: warm sandboxes' runner, script mode's
// launcher): fd 3 is a pipe
// to pid 1, and one byte on it ends the run with that exit status while
// the process still runs (it is killed with the sandbox); closed without a
// byte, the process's own exit counts. Without the note there is no fd 3.
TEST_F(EngineTest, EndNoteEndsTheRunWithItsStatus) {
  auto noted = [this](const char* script) {
    auto s = spec({"/bin/sh", "-c", script});
    s.end_note = true;
    return run(s);
  };
  const auto t0 = std::chrono::steady_clock::now();
  auto r = noted("printf '\\052' >&3; exec sleep 30");
  EXPECT_EQ(r.reason, EndReason::Exited) << describe(r);
  EXPECT_EQ(r.exit_code, 42);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 20s) << "the run waited for the process, not the note";
  r = noted("exec 3>&-; exit 7");
  EXPECT_EQ(r.reason, EndReason::Exited) << describe(r);
  EXPECT_EQ(r.exit_code, 7);
  r = noted("exec 2>/dev/null; if true >&3; then exit 3; fi; exit 4");
  EXPECT_EQ(r.exit_code, 3) << describe(r);
  r = run(spec({"/bin/sh", "-c", "exec 2>/dev/null; if true >&3; then exit 3; fi; exit 4"}));
  EXPECT_EQ(r.exit_code, 4) << "a run without the note has an fd 3: " << describe(r);
}

TEST_F(EngineTest, ConcurrentRunsGetDistinctHostUids) {
  auto a = engine_->spawn(spec({"/bin/sleep", "1"}));
  auto b = engine_->spawn(spec({"/bin/sleep", "1"}));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE((*a)->host_uid(), (*b)->host_uid());
  (*a)->kill();
  (*b)->kill();
}

// TSB_LEAK_TEST_RUNS overrides the 500 runs, for quick runs under emulation
// (tests/vm/run-lane.sh --quick sets 100; the full lane keeps 500, see
// docs/VM-LANE.md). The override is announced on stderr, never silent.
static int leak_test_runs() {
  const char* v = std::getenv("TSB_LEAK_TEST_RUNS");
  if (!v || !*v) return 500;
  int n = std::atoi(v);
  if (n < 50) n = 50;  // below that, not every exit path of the mix below is taken
  std::fprintf(stderr, "NOTE: NothingLeftBehindAfter500Runs does %d runs, not 500 (TSB_LEAK_TEST_RUNS=%s)\n", n, v);
  return n;
}

TEST_F(EngineTest, NothingLeftBehindAfter500Runs) {
  const int runs = leak_test_runs();
  // Warm up once so lazily created state (lock file, parent cgroups) exists.
  (void)run(spec({"/bin/true"}));
  int fds = count_fds();
  std::string mounts = read_all("/proc/self/mountinfo");
  auto leaves_before = leaves(*engine_);
  int failures = 0;
  for (int i = 0; i < runs; ++i) {
    // Mix successes, failures and kills so every exit path is covered.
    tsb::isolate::RunResult r;
    if (i % 50 == 7) r = run(spec({"/no/such/tool"}));
    else if (i % 50 == 13) {
      auto s = spec({"/bin/sleep", "10"});
      s.limits.wall_timeout = 50ms;
      r = run(s);
    } else {
      r = run(spec({"/bin/true"}));
      failures += r.reason != EndReason::Exited || r.exit_code != 0;
    }
  }
  EXPECT_EQ(failures, 0);
  EXPECT_EQ(count_fds(), fds) << "file descriptors leaked";
  EXPECT_EQ(read_all("/proc/self/mountinfo"), mounts) << "mounts leaked into the engine's namespace";
  EXPECT_EQ(leaves(*engine_), leaves_before) << "cgroups left behind";
  EXPECT_TRUE(host_pids_with_uid_in(engine_->config().uid_base, engine_->config().uid_base + 65536u * engine_->config().uid_slots).empty())
      << "sandbox processes left behind";
}
