// Containment posture, asserted from inside real sandboxes with the probe.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>

#include "tests/integration/harness.h"

using namespace tsb::testing;
using tsb::isolate::EndReason;
using nlohmann::json;

TEST_F(EngineTest, NoCapabilitiesAnywhere) {
  auto j = probe1({"caps"});
  for (const char* set : {"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"})
    EXPECT_EQ(j[set], "0000000000000000") << set << " " << j.dump();
}

TEST_F(EngineTest, NoNewPrivsAndSeccompFilter) {
  auto v = probe({"nnp", "seccomp-mode", "securebits"});
  ASSERT_EQ(v.size(), 3u);
  EXPECT_EQ(v[0]["NoNewPrivs"], 1);
  EXPECT_EQ(v[0]["prctl"], 1);
  EXPECT_EQ(v[1]["Seccomp"], 2);
  EXPECT_EQ(v[1]["Seccomp_filters"], 1);
  // NOROOT, NO_SETUID_FIXUP, KEEP_CAPS_LOCKED, NO_CAP_AMBIENT_RAISE, all locked.
  EXPECT_EQ(v[2]["securebits"].get<int>() & 0xef, 0xef) << v[2].dump();
}

TEST_F(EngineTest, UserNamespaceMapsToTheRunsHostRange) {
  auto r = run(probe_spec({"ids"}));
  ASSERT_EQ(r.reason, EndReason::Exited) << describe(r);
  auto j = parse_lines(r.stdout_data).at(0);
  EXPECT_EQ(j["uid"]["real"], 1000);
  EXPECT_EQ(j["uid"]["effective"], 1000);
  EXPECT_EQ(j["gid"]["real"], 1000);
  EXPECT_EQ(j["groups"], json::array()) << "supplementary groups leaked: " << j.dump();
  EXPECT_EQ(j["setgroups"], "deny");
  ASSERT_EQ(j["uid_map"].size(), 1u);
  EXPECT_EQ(j["uid_map"][0][0], 0);
  EXPECT_EQ(j["uid_map"][0][1], r.host_uid);
  EXPECT_EQ(j["uid_map"][0][2], 65536);
  EXPECT_NE(r.host_uid, 0u);
  EXPECT_EQ(j["gid_map"], j["uid_map"]);
}

TEST_F(EngineTest, OnlyStdioReachesTheTool) {
  auto j = probe1({"fds"});
  ASSERT_TRUE(j["fds"].is_array());
  std::vector<int> fds;
  for (const auto& f : j["fds"]) fds.push_back(f["fd"]);
  EXPECT_EQ(fds, (std::vector<int>{0, 1, 2})) << j.dump();
}

TEST_F(EngineTest, PrivateHostnamePidsNetworkAndCgroup) {
  auto v = probe({"hostname", "pid", "netdevs", "cgroup"});
  ASSERT_EQ(v.size(), 4u);
  EXPECT_EQ(v[0]["hostname"], "sandbox");
  EXPECT_EQ(v[1]["ppid"], 1) << "the tool is not pid 1; init is its parent";
  EXPECT_NE(v[1]["pid"], 1);
  EXPECT_EQ(v[1]["init_cmdline"][0], "toolsandbox-init");
  EXPECT_LE(v[1]["nr_visible_pids"].get<int>(), 3) << "host processes visible: " << v[1].dump();
  EXPECT_EQ(v[2]["netdevs"], json::array({"lo"}));
  for (const auto& c : v[3]["cgroups"]) EXPECT_EQ(c["path"], "/") << v[3].dump();
}

TEST_F(EngineTest, MountsAreReadOnlyNosuidAndMinimal) {
  auto j = probe1({"mounts"});
  bool saw_tmp = false, saw_work = false, saw_venv = false, saw_proc = false;
  for (const auto& m : j["mounts"]) {
    std::string t = m["target"];
    EXPECT_TRUE(m["nosuid"].get<bool>()) << "mount without nosuid: " << m.dump();
    // /dev is the one mount without nodev: the engine made its device nodes.
    bool is_device = t == "/dev";
    if (t.rfind("/dev/", 0) == 0 && t != "/dev/shm") ADD_FAILURE() << "a mount inside /dev: " << m.dump();
    if (t == "/dev") EXPECT_TRUE(m["ro"].get<bool>()) << "writable /dev: " << m.dump();
    if (!is_device && t.rfind("/proc/", 0) != 0) EXPECT_TRUE(m["nodev"].get<bool>()) << m.dump();
    if (t == "/" || t == "/usr" || t == "/venv" || t == "/opt/tsb")
      EXPECT_TRUE(m["ro"].get<bool>()) << "writable: " << m.dump();
    if (t == "/tmp" || t == "/work") {
      EXPECT_FALSE(m["ro"].get<bool>());
      EXPECT_TRUE(m["noexec"].get<bool>()) << m.dump();
      EXPECT_EQ(m["fstype"], "tmpfs");
    }
    if (t == "/proc/sys") EXPECT_TRUE(m["ro"].get<bool>());
    saw_tmp |= t == "/tmp";
    saw_work |= t == "/work";
    saw_venv |= t == "/venv";
    saw_proc |= t == "/proc";
    EXPECT_NE(t, "/sys") << "no /sys in a sandbox";
  }
  EXPECT_TRUE(saw_tmp && saw_work && saw_venv && saw_proc) << j.dump();
}

TEST_F(EngineTest, SensitiveProcEntriesAreMasked) {
  for (const char* p : {"/proc/kcore", "/proc/sysrq-trigger", "/proc/kallsyms", "/proc/timer_list", "/proc/keys"}) {
    auto j = probe1({"stat", p});
    if (!j["ok"].get<bool>()) continue;  // not present on this kernel: nothing to mask
    auto w = probe1({"writefile", p, "x"});
    EXPECT_FALSE(w["ok"].get<bool>()) << p << " is writable: " << w.dump();
    auto r = probe1({"readfile", p, "64"});
    if (r["ok"].get<bool>()) EXPECT_EQ(r["bytes"], 0) << p << " leaks content: " << r.dump();
  }
  auto w = probe1({"writefile", "/proc/sys/kernel/hostname", "x"});
  EXPECT_FALSE(w["ok"].get<bool>());
}

TEST_F(EngineTest, HostFilesAreInvisibleAndSystemIsReadOnly) {
  for (const char* p : {"/root", "/home", "/etc/shadow", "/etc/ssh", "/run", "/var", "/sys", "/boot", "/srv", TSB_SOURCE_DIR})
    EXPECT_FALSE(probe1({"exists", p})["exists"].get<bool>()) << p << " is visible";
  for (const char* p : {"/usr/x", "/etc/passwd", "/venv/x", "/x", "/bin/x", "/dev/x"}) {
    auto j = probe1({"writefile", p, "x"});
    EXPECT_FALSE(j["ok"].get<bool>()) << p << " writable: " << j.dump();
  }
  EXPECT_TRUE(probe1({"writefile", "/tmp/ok", "x"})["ok"].get<bool>());
  EXPECT_TRUE(probe1({"writefile", "/work/ok", "x"})["ok"].get<bool>());
}

TEST_F(EngineTest, RefusedSyscallsAnswerThePolicysErrno) {
  struct Case {
    const char* name;
    const char* errname;
  };
  // What the default profile answers (policies/seccomp/default.json).
  const Case cases[] = {
      {"ptrace", "EPERM"},          {"process_vm_readv", "EPERM"}, {"keyctl", "EPERM"},
      {"add_key", "EPERM"},         {"bpf", "EPERM"},              {"perf_event_open", "EPERM"},
      {"userfaultfd", "EPERM"},     {"io_uring_setup", "EPERM"},   {"unshare", "EPERM"},
      {"clone3", "ENOSYS"},         {"clone-newns", "EPERM"},      {"mount", "EPERM"},
      {"umount2", "EPERM"},         {"pivot_root", "EPERM"},       {"setns", "EPERM"},
      {"open_by_handle_at", "EPERM"}, {"kexec_load", "EPERM"},     {"init_module", "EPERM"},
      {"reboot", "EPERM"},          {"swapon", "EPERM"},           {"settimeofday", "EPERM"},
      {"clock_settime", "EPERM"},   {"iopl", "EPERM"},             {"ioperm", "EPERM"},
      {"personality", "ENOSYS"},     {"socket-alg", "EPERM"},       {"socket-vsock", "EPERM"},
      {"socket-packet", "EPERM"},   {"chroot", "EPERM"},           {"acct", "EPERM"},
      {"tiocsti", "EPERM"},         {"tiocsti-high", "EPERM"},
  };
  std::vector<std::string> args;
  for (const auto& c : cases) {
    args.push_back("try-syscall");
    args.push_back(c.name);
  }
  auto v = probe(args);
  ASSERT_EQ(v.size(), std::size(cases));
  for (std::size_t i = 0; i < v.size(); ++i)
    EXPECT_EQ(v[i]["errname"], cases[i].errname) << v[i].dump();
  // Allowed families still work.
  auto ok = probe({"try-syscall", "socket-inet", "try-syscall", "socket-unix"});
  for (const auto& j : ok) EXPECT_EQ(j["ret"].get<long>() >= 0 || j["errname"] != "EPERM", true) << j.dump();
}

// Whether this kernel runs i386 system calls (int 0x80) at all: without
// IA32 emulation (or with it turned off) the CPU's fault ends the caller
// with SIGSEGV before seccomp sees anything.
bool host_runs_int80() {
  pid_t pid = ::fork();
  if (pid == 0) {
    long ret;
    __asm__ volatile("int $0x80" : "=a"(ret) : "a"(20) : "memory");  // i386 getpid
    ::_exit(ret > 0 ? 0 : 1);
  }
  int st = 0;
  ::waitpid(pid, &st, 0);
  return !(WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV);
}

TEST_F(EngineTest, ForeignArchitecturesAreKilled) {
  // The probe makes each call in a child and reports how that child ended.
  const bool int80 = host_runs_int80();
  for (const char* q : {"x32", "int80"}) {
    auto j = probe1({"try-syscall", q});
    EXPECT_TRUE(j.value("killed", false)) << q << ": " << j.dump();
    if (std::string(q) == "int80" && !int80) {
      // Refused by the kernel itself, so nothing reaches the filter.
      EXPECT_EQ(j["signame"], "SIGSEGV") << q << ": " << j.dump();
      std::fprintf(stderr, "NOTE: this kernel has no i386 system calls (int 0x80 faults on the host too)\n");
      continue;
    }
    EXPECT_EQ(j["signame"], "SIGSYS") << q << ": " << j.dump();
  }
}

TEST_F(EngineTest, NoNetworkEvenToTheHostsLoopback) {
  // A listener on the host's loopback: reachable from the host, not from
  // the sandbox (its own net namespace has its own lo). No packet leaves.
  int s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(s, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(s, 4), 0);
  socklen_t len = sizeof a;
  ASSERT_EQ(::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len), 0);
  auto j = probe1({"net-connect", "127.0.0.1", std::to_string(ntohs(a.sin_port))});
  ::close(s);
  EXPECT_FALSE(j["ok"].get<bool>()) << j.dump();
  EXPECT_EQ(j["errname"], "ECONNREFUSED") << j.dump();
}

TEST_F(EngineTest, EnvironmentIsExactlyWhatWasGiven) {
  ::setenv("TSB_TEST_SECRET", "must-not-leak", 1);
  auto s = probe_spec({"getenv"});
  s.env = {"ONLY=this", "PATH=/usr/bin"};
  auto r = run(s);
  ::unsetenv("TSB_TEST_SECRET");
  ASSERT_EQ(r.reason, EndReason::Exited) << describe(r);
  auto j = parse_lines(r.stdout_data).at(0);
  EXPECT_EQ(j["env"], json::array({"ONLY=this", "PATH=/usr/bin"})) << j.dump();
}

TEST_F(EngineTest, StdinIsDelivered) {
  auto s = spec({"/bin/cat"});
  s.stdin_data = std::string(300000, 'x') + "end";  // larger than a pipe buffer
  auto r = run(s);
  ASSERT_EQ(r.reason, EndReason::Exited) << describe(r);
  EXPECT_EQ(r.stdout_data, s.stdin_data);
}

TEST_F(EngineTest, KillAllOnlyReachesTheSandbox) {
  pid_t sentinel = ::fork();
  if (sentinel == 0) {
    ::execl("/bin/sleep", "sleep", "30", nullptr);
    ::_exit(127);
  }
  auto r = run(probe_spec({"kill-all"}));
  EXPECT_EQ(::kill(sentinel, 0), 0) << "a host process died";
  ::kill(sentinel, SIGKILL);
  ::waitpid(sentinel, nullptr, 0);
  (void)r;
}
