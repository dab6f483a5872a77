// Nothing outlives the engine: whatever kills it, its sandboxes die within
// a second, by mechanisms that need no engine (the death signal, init
// watching the engine's end of a pipe), their uid slots stay leased until
// they are really gone, and the next engine reclaims their cgroup leaves,
// also when it has the dead engine's pid (a container restart) and when the
// dead engine's lock file is gone with its /run.
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "isolate/engine/cgroup.h"
#include "daemon/policy/seccomp_profile.h"
#include "isolate/engine/engine.h"
#include "tests/integration/harness.h"
#include "daemon/compile/host.h"

using namespace tsb::testing;
using namespace std::chrono_literals;
using tsb::isolate::Engine;
using tsb::isolate::EngineConfig;
using tsb::isolate::EndReason;
using nlohmann::json;

namespace {

// A uid range of its own, beside the shared engine's.
constexpr std::uint32_t kUidBase = (1u << 30) + (1u << 28);
constexpr std::uint32_t kSlots = 8;

EngineConfig death_config(const std::string& tag) {
  EngineConfig cfg;
  const char* parent = std::getenv("TSB_CGROUP_PARENT");
  cfg.cgroup_parent = std::string(parent ? parent : "/toolsandbox-test") + "-death-" + tag;
  cfg.state_dir = "/run/tsb-death-" + tag;
  cfg.init_path = std::string(TSB_BIN_DIR) + "/toolsandbox-init";
  cfg.uid_base = kUidBase;
  cfg.uid_slots = kSlots;
  return cfg;
}

std::vector<std::string> leaves_of(const EngineConfig& cfg) {
  std::vector<std::string> out;
  for (const char* h : {"memory", "pids", ""}) {
    std::string base = std::string("/sys/fs/cgroup/") + h + cfg.cgroup_parent;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(base, ec))
      if (e.is_directory() && e.path().filename().string().rfind("run.", 0) == 0) out.push_back(e.path().string());
  }
  return out;
}

bool wait_readable(int fd, std::chrono::milliseconds limit) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, static_cast<int>(limit.count())) == 1;
}

std::string read_line(int fd, std::chrono::milliseconds limit) {
  std::string s;
  const auto deadline = std::chrono::steady_clock::now() + limit;
  char c;
  while (std::chrono::steady_clock::now() < deadline) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (!wait_readable(fd, left)) break;
    if (::read(fd, &c, 1) != 1) break;
    if (c == '\n') return s;
    s += c;
  }
  return s;
}

// Runs `body` as pid 2 of a new pid namespace whose pid 1 only reaps (so the
// engine's death does not end the namespace: only our mechanisms may kill
// the sandboxes). Returns the host pid of pid 1 (kill it to end everything)
// and, through *engine_pid, the host pid of `body`'s process.
pid_t run_as_pid2(const std::function<void()>& body, pid_t* engine_pid) {
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) return -1;
  pid_t outer = ::fork();
  if (outer == 0) {
    ::close(p[0]);
    if (::unshare(CLONE_NEWPID) != 0) ::_exit(120);
    pid_t init = ::fork();
    if (init != 0) {
      // Tell the test pid 1's host pid, then leave: pid 1 is reparented.
      (void)!::write(p[1], &init, sizeof init);
      ::_exit(0);
    }
    // pid 1 of the namespace, with a /proc of its own (the engine names
    // its children by pid there).
    if (::unshare(CLONE_NEWNS) != 0 || ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
        ::mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr) != 0)
      ::_exit(121);
    pid_t child = ::fork();
    if (child == 0) {
      ::close(p[1]);
      body();
      ::_exit(0);
    }
    ::close(p[1]);
    for (;;) {
      if (::waitpid(-1, nullptr, 0) < 0 && errno == ECHILD) ::pause();
    }
  }
  ::close(p[1]);
  pid_t init = -1;
  if (::read(p[0], &init, sizeof init) != sizeof init) init = -1;
  ::close(p[0]);
  ::waitpid(outer, nullptr, 0);
  // pid 2 of that namespace: pid 1's only child.
  *engine_pid = -1;
  for (int i = 0; i < 200 && *engine_pid <= 0; ++i) {
    std::ifstream ch("/proc/" + std::to_string(init) + "/task/" + std::to_string(init) + "/children");
    pid_t c = 0;
    if (ch >> c) *engine_pid = c;
    else std::this_thread::sleep_for(5ms);
  }
  return init;
}

void end_namespace(pid_t init) {
  if (init <= 0) return;
  ::kill(init, SIGKILL);
  // It was reparented to us (or to the guard's init); reaping is best effort.
  ::waitpid(init, nullptr, WNOHANG);
}

// The engine side: spawn `n` runs that would live for a long time (a sleep,
// and a double-forked, session-leading grandchild that ignores SIGTERM and
// SIGHUP), report readiness on `ready_fd`, then wait to be killed.
void spawn_survivors(const EngineConfig& cfg, int n, int ready_fd, const tsb::isolate::RunSpec& base) {
  auto e = tsb::policy::create_engine(cfg);
  if (!e.ok()) {
    std::string m = "error " + e.error().message + "\n";
    (void)!::write(ready_fd, m.data(), m.size());
    ::_exit(1);
  }
  std::vector<std::unique_ptr<tsb::isolate::Sandbox>> keep;
  for (int i = 0; i < n; ++i) {
    auto s = base;
    s.argv = {"/venv/bin/python3", "-c",
              "import os, signal, time\n"
              "if os.fork() == 0:\n"
              "    os.setsid()\n"
              "    if os.fork() == 0:\n"
              "        signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
              "        signal.signal(signal.SIGHUP, signal.SIG_IGN)\n"
              "        time.sleep(1000)\n"
              "    os._exit(0)\n"
              "print('up', flush=True)\n"
              "time.sleep(1000)\n"};
    s.limits.wall_timeout = 600s;
    auto sb = (*e)->spawn(s);
    if (!sb.ok()) {
      std::string m = "error " + sb.error().message + "\n";
      (void)!::write(ready_fd, m.data(), m.size());
      ::_exit(1);
    }
    // Wait until the tool runs (its first line), so the sandbox is complete.
    int out = (*sb)->take_stdout().release();
    (void)read_line(out, 20s);
    keep.push_back(std::move(sb).value());
  }
  std::string m = "ready " + (*e)->instance() + "\n";
  (void)!::write(ready_fd, m.data(), m.size());
  for (;;) ::pause();
}

// Starts a new engine as pid 2 of a fresh pid namespace (like the dead
// one), and returns "pid N" and its start-up notes, tab-separated, or
// "error ...".
std::string restart_engine_as_pid2(const EngineConfig& cfg) {
  int q[2];
  if (::pipe2(q, O_CLOEXEC) != 0) return "error pipe2";
  pid_t engine_pid = -1;
  pid_t ns = run_as_pid2(
      [&] {
        auto e = tsb::policy::create_engine(cfg);
        std::string m = e.ok() ? "pid " + std::to_string(::getpid()) : "error " + e.error().message;
        if (e.ok()) {
          for (const auto& n : (*e)->startup_notes()) m += "\t" + n;
          // The reclaimed leaves are removed by the pending clean-up, once
          // their killed processes are gone (the daemon's loop runs it): done
          // before answering, as the namespace ends as soon as the answer is read.
          m += "\tleaves left after the clean-up: " + std::to_string((*e)->drain_retired(std::chrono::seconds(20)));
        }
        m += "\n";
        (void)!::write(q[1], m.data(), m.size());
      },
      &engine_pid);
  ::close(q[1]);
  std::string notes = read_line(q[0], 30s);
  ::close(q[0]);
  end_namespace(ns);
  return notes;
}

std::vector<pid_t> survivors() { return host_pids_with_uid_in(kUidBase, kUidBase + kSlots * 65536u); }

}  // namespace

class EngineDeathTest : public EngineTest {};

TEST_F(EngineDeathTest, SandboxesDieWithTheirEngineAndTheNextEngineReclaimsTheirLeaves) {
  const auto cfg = death_config("a");
  const auto base = spec({"/bin/true"});
  int p[2];
  ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
  pid_t engine_pid = -1;
  pid_t ns_init = run_as_pid2([&] { spawn_survivors(cfg, 3, p[1], base); }, &engine_pid);
  ::close(p[1]);
  ASSERT_GT(ns_init, 0);
  std::string ready = read_line(p[0], 60s);
  ::close(p[0]);
  ASSERT_EQ(ready.rfind("ready ", 0), 0u) << ready;
  ASSERT_GE(survivors().size(), 9u) << "3 runs of at least 3 processes each were expected";
  ASSERT_EQ(leaves_of(cfg).size() / (tsb::isolate::CgroupMode::V2 == engine_->cgroups().mode() ? 1 : 2), 3u);

  // SIGKILL: the engine gets no chance to clean anything.
  ASSERT_EQ(::kill(engine_pid, SIGKILL), 0);
  const auto t0 = std::chrono::steady_clock::now();
  while (!survivors().empty() && std::chrono::steady_clock::now() - t0 < 1s) std::this_thread::sleep_for(10ms);
  auto left = survivors();
  end_namespace(ns_init);
  EXPECT_TRUE(left.empty()) << left.size() << " sandbox processes outlived their engine by 1 s";

  // The leaves are still there (nobody removed them); the next engine, with
  // the same pid in a namespace like the dead one's, removes them.
  ASSERT_FALSE(leaves_of(cfg).empty());
  std::string notes = restart_engine_as_pid2(cfg);
  EXPECT_EQ(notes.rfind("pid 2", 0), 0u) << "the new engine was not pid 2 like the dead one: " << notes;
  EXPECT_NE(notes.find("reclaiming 3 cgroup leaves"), std::string::npos) << notes;
  EXPECT_NE(notes.find("leaves left after the clean-up: 0"), std::string::npos) << notes;
  EXPECT_TRUE(leaves_of(cfg).empty()) << "leaves left after the restart";
}

// A container restart also wipes /run: no lock file says the dead engine
// is dead, and the new engine has its pid. Its leaves are reclaimed anyway.
TEST_F(EngineDeathTest, ReclaimWithoutTheDeadEnginesLockFileAndWithItsPid) {
  const auto cfg = death_config("b");
  const auto base = spec({"/bin/true"});
  int p[2];
  ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
  pid_t engine_pid = -1;
  pid_t ns_init = run_as_pid2([&] { spawn_survivors(cfg, 1, p[1], base); }, &engine_pid);
  ::close(p[1]);
  std::string ready = read_line(p[0], 60s);
  ::close(p[0]);
  ASSERT_EQ(ready.rfind("ready ", 0), 0u) << ready;
  ::kill(engine_pid, SIGKILL);
  const auto t0 = std::chrono::steady_clock::now();
  while (!survivors().empty() && std::chrono::steady_clock::now() - t0 < 1s) std::this_thread::sleep_for(10ms);
  EXPECT_TRUE(survivors().empty());
  end_namespace(ns_init);
  std::filesystem::remove_all(cfg.state_dir + "/engines");
  ASSERT_FALSE(leaves_of(cfg).empty());
  std::string notes = restart_engine_as_pid2(cfg);
  EXPECT_NE(notes.find("reclaiming 1 cgroup leaves"), std::string::npos) << notes;
  EXPECT_NE(notes.find("leaves left after the clean-up: 0"), std::string::npos) << notes;
  EXPECT_TRUE(leaves_of(cfg).empty());
}

// A slot whose last init still exists (its engine died; the kernel is still
// tearing the namespace down, or nobody reaped it yet) is not leased, even
// though nothing holds its lock any more.
TEST_F(EngineDeathTest, UidSlotIsNotLeasedWhileItsLastInitExists) {
  auto cfg = death_config("c");
  cfg.uid_slots = 2;
  ::mkdir(cfg.state_dir.c_str(), 0711);
  pid_t holder = ::fork();
  if (holder == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    for (;;) ::pause();
  }
  // The record a dead engine would have left for slot 0: this live process.
  std::uint64_t start = 0;
  {
    std::ifstream st("/proc/" + std::to_string(holder) + "/stat");
    std::string text((std::istreambuf_iterator<char>(st)), {});
    std::istringstream rest(text.substr(text.rfind(')') + 2));
    std::string f;
    for (int field = 3; field < 22; ++field) rest >> f;
    rest >> start;
  }
  {
    struct {
      std::uint32_t magic;
      std::int32_t pid;
      std::uint64_t start;
    } rec{0x74736c31, holder, start};
    int fd = ::open((cfg.state_dir + "/uid-slots.lock").c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::pwrite(fd, &rec, sizeof rec, 0), static_cast<ssize_t>(sizeof rec));
    ::close(fd);
  }
  auto e = tsb::policy::create_engine(cfg);
  ASSERT_TRUE(e.ok()) << e.error().message;
  auto s = spec({"/bin/true"});
  auto r = (*e)->run(s);
  EXPECT_EQ(r.reason, EndReason::Exited) << describe(r);
  EXPECT_EQ(r.host_uid, kUidBase + 65536u) << "slot 0 was leased while its recorded init still exists";
  ::kill(holder, SIGKILL);
  ::waitpid(holder, nullptr, 0);
  // Gone: slot 0 is free again.
  r = (*e)->run(s);
  EXPECT_EQ(r.reason, EndReason::Exited) << describe(r);
  EXPECT_EQ(r.host_uid, kUidBase) << describe(r);
}

// An engine that is alive but never ends a run (its event loop stuck):
// the sandbox's init ends it on its own a few seconds after the wall
// timeout, and says so.
TEST_F(EngineDeathTest, InitEndsARunItsEngineDoesNotEnd) {
  auto s = spec({"/bin/sleep", "1000"});
  s.limits.wall_timeout = 1s;
  auto sb = engine_->spawn(s);
  ASSERT_TRUE(sb.ok()) << sb.error().message;
  // Nobody supervises: no wall timer, nobody reads.
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(wait_readable((*sb)->pidfd(), 30s)) << "init did not end the run on its own";
  const auto took = std::chrono::steady_clock::now() - t0;
  ASSERT_TRUE((*sb)->reap().ok());
  EXPECT_GE(took, 3s) << "the fence must leave the engine its own timeout first";
  tsb::isolate::Observations obs;
  (*sb)->read_reports(obs);
  EXPECT_TRUE(obs.backstop) << "init's report does not say why the run ended";
}

// The same through the real daemon: runs in flight, the daemon SIGKILLed
// (as the OOM killer would), no sandbox left a second later; the daemon
// started again, as pid 2 like before, reclaims the leaves and says so.
TEST_F(EngineDeathTest, KilledDaemonLeavesNoSandboxAndItsRestartReclaims) {
  const auto ecfg = death_config("d");
  const std::string dir = "/tmp/tsb-death-d";
  ::mkdir(dir.c_str(), 0755);
  const std::string sock = dir + "/d.sock", cfgfile = dir + "/config.json";
  json cfg = {{"version", 1},
              {"socket", {{"path", sock}}},
              {"request_timeout", "20s"},
              {"shutdown_grace", "1s"},
              {"policies_dir", std::string(TSB_SOURCE_DIR) + "/policies"},
              {"organizations", std::string(TSB_SOURCE_DIR) + "/policies/organizations.json"},
              {"engine",
               {{"state_dir", ecfg.state_dir},
                {"cgroup_parent", ecfg.cgroup_parent},
                {"uid_base", ecfg.uid_base},
                {"uid_slots", ecfg.uid_slots},
                {"init", ecfg.init_path}}}};
  std::ofstream(cfgfile) << cfg.dump(2);
  const auto start_daemon = [&](const std::string& log, pid_t* daemon) {
    ::unlink(sock.c_str());
    return run_as_pid2(
        [&] {
          int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
          ::dup2(fd, 1);
          ::dup2(fd, 2);
          std::string bin = std::string(TSB_BIN_DIR) + "/toolsandboxd";
          ::execl(bin.c_str(), bin.c_str(), "--config", cfgfile.c_str(), nullptr);
          ::_exit(127);
        },
        daemon);
  };
  const auto wait_connect = [&] {
    for (int i = 0; i < 500; ++i) {
      int fd = connect_unix(sock);
      if (fd >= 0) return fd;
      std::this_thread::sleep_for(20ms);
    }
    return -1;
  };
  const auto read_log = [](const std::string& p) {
    std::ifstream in(p);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };

  pid_t daemon = -1;
  pid_t ns1 = start_daemon(dir + "/log1", &daemon);
  ASSERT_GT(ns1, 0);
  std::vector<int> clients;
  for (int i = 0; i < 2; ++i) {
    int fd = wait_connect();
    ASSERT_GE(fd, 0) << read_log(dir + "/log1");
    send_all(fd, execute_request("import time\nprint('up', flush=True)\ntime.sleep(1000)\n").dump() + "\n");
    clients.push_back(fd);
  }
  for (int i = 0; i < 500 && survivors().size() < 4; ++i) std::this_thread::sleep_for(20ms);
  ASSERT_GE(survivors().size(), 4u) << "the runs did not start: " << read_log(dir + "/log1");

  ASSERT_EQ(::kill(daemon, SIGKILL), 0);
  const auto t0 = std::chrono::steady_clock::now();
  while (!survivors().empty() && std::chrono::steady_clock::now() - t0 < 1s) std::this_thread::sleep_for(10ms);
  auto left = survivors();
  end_namespace(ns1);
  for (int fd : clients) ::close(fd);
  EXPECT_TRUE(left.empty()) << left.size() << " sandbox processes outlived the daemon by 1 s";
  ASSERT_FALSE(leaves_of(ecfg).empty());

  pid_t daemon2 = -1;
  pid_t ns2 = start_daemon(dir + "/log2", &daemon2);
  int fd = wait_connect();
  std::string log2 = read_log(dir + "/log2");
  if (fd >= 0) {
    auto st = request_once(sock, {{"v", 1}, {"id", "s"}, {"type", "status"}});
    EXPECT_TRUE(st.value("ok", false)) << st.dump();
    ::close(fd);
  }
  ::kill(daemon2, SIGTERM);
  for (int i = 0; i < 200 && ::kill(daemon2, 0) == 0; ++i) std::this_thread::sleep_for(20ms);
  end_namespace(ns2);
  EXPECT_GE(fd, 0) << "the daemon did not start again: " << log2;
  EXPECT_NE(log2.find("reclaiming 2 cgroup leaves"), std::string::npos) << log2;
  EXPECT_TRUE(leaves_of(ecfg).empty()) << "leaves left after the restart";
}
