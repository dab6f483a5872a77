// The engine's writes to /proc (id maps, setgroups, OOM scores,
// vm.memfd_noexec) go only through a /proc it opened once and checked: the
// root of a procfs mount, files resolved beneath it with no link or mount
// crossed (the runc CVE-2025-52881 class). A /proc that is something else
// in the engine's mount namespace refuses the engine; nothing is written
// to what stands there.
#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "daemon/compile/host.h"
#include "daemon/policy/seccomp_profile.h"
#include "tests/integration/harness.h"

using namespace tsb::testing;

namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// In the calling process (pid 2 of a pid namespace of its own, with a
// mount namespace of its own): the real /proc kept at /tmp/real, and
// `cover` mounted on /proc. "tmpfs": a fake tree with the files the engine
// writes for pids 2..64 and `self` leading to the real one (so that
// nothing else the engine does there fails first); "subdir": procfs, but
// not its root (the real /proc/sys).
bool cover_proc(const std::string& cover) {
  if (::mount("tmpfs", "/tmp", "tmpfs", 0, "size=1m") != 0 || ::mkdir("/tmp/real", 0755) != 0 ||
      ::mount("/proc", "/tmp/real", nullptr, MS_BIND | MS_REC, nullptr) != 0)
    return false;
  if (cover == "subdir") return ::mount("/tmp/real/sys", "/proc", nullptr, MS_BIND, nullptr) == 0;
  if (::mkdir("/tmp/fake", 0755) != 0 || ::symlink("/tmp/real/self", "/tmp/fake/self") != 0) return false;
  for (int pid = 2; pid <= 64; ++pid) {
    const std::string d = "/tmp/fake/" + std::to_string(pid);
    if (::mkdir(d.c_str(), 0755) != 0) return false;
    for (const char* f : {"oom_score_adj", "setgroups", "uid_map", "gid_map"})
      if (!(std::ofstream(d + "/" + f) << "")) return false;
  }
  return ::mount("/tmp/fake", "/proc", nullptr, MS_BIND, nullptr) == 0;
}

// Runs an engine as pid 2 of a new pid namespace, after the set-up saw the
// real /proc and `cover` then took its place; one line back: "refused
// <why>", or "spawned <what the fake files hold>", or "error <why>".
std::string engine_under_covered_proc(const std::string& cover, const tsb::isolate::RunSpec& spec) {
  int q[2];
  if (::pipe2(q, O_CLOEXEC) != 0) return "error pipe2";
  const pid_t outer = ::fork();
  if (outer == 0) {
    ::close(q[0]);
    const auto say = [&](const std::string& m) { (void)!::write(q[1], (m + "\n").data(), m.size() + 1); };
    if (::unshare(CLONE_NEWPID | CLONE_NEWNS) != 0 || ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0)
      ::_exit(120);
    const pid_t one = ::fork();
    if (one != 0) {
      int st = 0;
      ::waitpid(one, &st, 0);
      ::_exit(0);
    }
    if (::mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr) != 0) ::_exit(121);
    const pid_t body = ::fork();
    if (body != 0) {
      int st = 0;
      ::waitpid(body, &st, 0);
      ::_exit(0);  // pid 1: the namespace ends with it
    }
    tsb::isolate::EngineConfig cfg;
    const char* parent = std::getenv("TSB_CGROUP_PARENT");
    cfg.cgroup_parent = std::string(parent ? parent : "/toolsandbox-test") + "-procfs";
    cfg.state_dir = "/run/tsb-procfs-test";
    cfg.init_path = std::string(TSB_BIN_DIR) + "/toolsandbox-init";
    cfg.uid_base = (1u << 30) + (1u << 29);
    cfg.uid_slots = 2;
    cfg.hide_host_paths = false;
    auto filter = tsb::policy::compile_init_filter();
    if (!filter.ok() || !tsb::policy::prepare_engine(cfg, ::getpid()).ok()) {
      say("error the set-up failed with the real /proc");
      ::_exit(0);
    }
    if (!cover_proc(cover)) {
      say(std::string("error covering /proc: ") + std::strerror(errno));
      ::_exit(0);
    }
    auto e = tsb::isolate::Engine::create(cfg, std::move(filter).value());
    if (!e.ok()) {
      say("refused " + e.error().message);
      ::_exit(0);
    }
    auto sb = (*e)->spawn(spec);
    if (!sb.ok()) {
      say("error spawn: " + sb.error().message);
      ::_exit(0);
    }
    std::string m = "spawned";
    const std::string d = "/tmp/fake/" + std::to_string((*sb)->pid()) + "/";
    for (const char* f : {"oom_score_adj", "setgroups", "uid_map"}) m += std::string(" ") + f + "=" + slurp(d + f);
    for (char& c : m)
      if (c == '\n') c = ' ';
    say(m);
    ::_exit(0);
  }
  ::close(q[1]);
  std::string line;
  char c;
  while (::read(q[0], &c, 1) == 1 && c != '\n') line += c;
  ::close(q[0]);
  ::waitpid(outer, nullptr, 0);
  return line;
}

}  // namespace

TEST_F(EngineTest, ProcWritesGoOnlyThroughACheckedProc) {
  const auto s = spec({"/bin/true"});
  for (const char* cover : {"tmpfs", "subdir"}) {
    const std::string got = engine_under_covered_proc(cover, s);
    EXPECT_EQ(got.rfind("refused ", 0), 0u) << cover << ": the engine started under a /proc that is not procfs's root, "
                                            << "and wrote: " << got;
    EXPECT_NE(got.find("/proc is not the root of a procfs mount"), std::string::npos) << cover << ": " << got;
  }
  // The real one still works.
  auto r = run(s);
  EXPECT_EQ(r.reason, tsb::isolate::EndReason::Exited) << describe(r);
}
