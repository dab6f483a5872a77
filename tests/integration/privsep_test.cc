// Privilege separation (docs/SECURITY.md, "The front end"): the front end
// holds no privilege, the root spawner holds no libcurl and trusts nothing
// the front end sends, and a front end that dies takes only its own runs.
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "daemon/policy/policy.h"
#include "isolate/base/random.h"
#include "tests/integration/harness.h"

using nlohmann::json;
using namespace std::chrono_literals;
using tsb::testing::EngineTest;
using Daemon = tsb::testing::TestDaemon;

namespace {

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// "Key:\tvalue" of /proc/<pid>/status.
std::map<std::string, std::string> proc_status(pid_t pid) {
  std::map<std::string, std::string> m;
  std::istringstream in(slurp("/proc/" + std::to_string(pid) + "/status"));
  for (std::string line; std::getline(in, line);) {
    auto c = line.find(':');
    if (c == std::string::npos) continue;
    std::string v = line.substr(c + 1);
    v.erase(0, v.find_first_not_of(" \t"));
    m[line.substr(0, c)] = v;
  }
  return m;
}

// The daemon's front end: its child running toolsandboxd-frontend.
pid_t front_end_of(pid_t daemon) {
  std::istringstream kids(slurp("/proc/" + std::to_string(daemon) + "/task/" + std::to_string(daemon) + "/children"));
  for (pid_t k; kids >> k;) {
    char exe[4096];
    ssize_t n = ::readlink(("/proc/" + std::to_string(k) + "/exe").c_str(), exe, sizeof exe - 1);
    if (n > 0 && std::string(exe, static_cast<std::size_t>(n)).find("toolsandboxd-frontend") != std::string::npos) return k;
  }
  return -1;
}

pid_t wait_front_end(pid_t daemon, pid_t not_this, std::chrono::milliseconds max) {
  const auto until = std::chrono::steady_clock::now() + max;
  while (std::chrono::steady_clock::now() < until) {
    pid_t fe = front_end_of(daemon);
    if (fe > 0 && fe != not_this) return fe;
    std::this_thread::sleep_for(20ms);
  }
  return -1;
}

// Processes whose real uid is in the engine's sandbox range (uid_base 2^30
// by default): what is left of runs.
int sandbox_processes() {
  int n = 0;
  DIR* d = ::opendir("/proc");
  if (!d) return -1;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    struct stat st{};
    if (::stat(("/proc/" + std::string(e->d_name)).c_str(), &st) == 0 && st.st_uid >= (1u << 30)) ++n;
  }
  ::closedir(d);
  return n;
}

}  // namespace

TEST_F(EngineTest, PrivsepFrontEndHoldsNoPrivilegeAndRootHasNoLibcurl) {
  Daemon d;
  ASSERT_TRUE(d.status().is_object()) << d.log_text();
  pid_t fe = front_end_of(d.pid());
  ASSERT_GT(fe, 0) << "no front end below the daemon " << d.pid();
  auto st = proc_status(fe);
  std::istringstream uids(st["Uid"]), gids(st["Gid"]);
  for (int i = 0; i < 4; ++i) {
    unsigned u = 0, g = 0;
    uids >> u;
    gids >> g;
    EXPECT_NE(u, 0u) << "Uid: " << st["Uid"];
    EXPECT_NE(g, 0u) << "Gid: " << st["Gid"];
  }
  for (const char* k : {"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"})
    EXPECT_EQ(st[k], "0000000000000000") << k;
  EXPECT_EQ(st["NoNewPrivs"], "1");
  EXPECT_EQ(st["Seccomp"], "2") << "the front end has no seccomp filter";
  EXPECT_EQ(st["Groups"], "") << "supplementary groups: " << st["Groups"];
  // The root process maps no libcurl; the front end does (the check can fail).
  const std::string root_maps = slurp("/proc/" + std::to_string(d.pid()) + "/maps");
  const std::string fe_maps = slurp("/proc/" + std::to_string(fe) + "/maps");
  ASSERT_FALSE(root_maps.empty());
  EXPECT_EQ(root_maps.find("libcurl"), std::string::npos) << "the root spawner maps libcurl";
  EXPECT_NE(fe_maps.find("libcurl"), std::string::npos) << "the front end should be the one that maps libcurl";
  EXPECT_EQ(proc_status(d.pid())["Uid"].substr(0, 1), "0");
  // And it serves: a run goes through the spawner.
  auto r = d.request(tsb::testing::execute_request("print('ok')\n"));
  ASSERT_TRUE(r.value("ok", false)) << r.dump() << d.log_text();
  EXPECT_EQ(r["result"]["status"], "success") << r.dump();
}

// The spawner, spoken to directly by a hostile front end
// (tests/probe/spawner_probe.cc): every malformed or out-of-policy order is
// refused, and the valid order after each one still runs.
TEST_F(EngineTest, PrivsepSpawnerRefusesWhatThePolicyDoesNotAllow) {
  const std::string dir = "/tmp/tsb-privsep-" + tsb::random_hex(4);
  ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0);
  ASSERT_EQ(std::system(("cp -r " + std::string(TSB_SOURCE_DIR) + "/policies " + dir + "/policies").c_str()), 0);
  // A policy that allows LETTA_* only, so that a name outside it exists.
  const std::string pol = dir + "/policies/default.json";
  std::string text = slurp(pol);
  auto at = text.find("\"allow\": [\"*\"]", text.find("\"environment\""));
  ASSERT_NE(at, std::string::npos);
  text.replace(at, std::strlen("\"allow\": [\"*\"]"), "\"allow\": [\"LETTA_*\"]");
  std::ofstream(pol) << text;
  tsb::core::PolicyContext ctx;
  auto loaded = tsb::core::load_policy(pol, ctx);
  ASSERT_TRUE(loaded.ok()) << loaded.error().message;
  // The spawner finds its front end next to itself: a copy of toolsandboxd
  // beside the probe.
  ASSERT_EQ(std::system(("cp " + std::string(TSB_BIN_DIR) + "/toolsandboxd " + dir + "/toolsandboxd && cp " +
                         std::string(TSB_BIN_DIR) + "/tsb-spawner-probe " + dir + "/toolsandboxd-frontend")
                            .c_str()),
            0);
  const char* parent = std::getenv("TSB_CGROUP_PARENT");
  json cfg = {{"version", 1},
              {"socket", {{"path", dir + "/d.sock"}}},
              {"policies_dir", dir + "/policies"},
              {"organizations", dir + "/policies/organizations.json"},
              {"engine", {{"state_dir", "/run/tsb-privsep"},
                          {"cgroup_parent", std::string(parent ? parent : "/toolsandbox-test") + "-privsep"},
                          {"init", std::string(TSB_BIN_DIR) + "/toolsandbox-init"}}}};
  std::ofstream(dir + "/config.json") << cfg.dump(2);
  const std::string out = dir + "/probe.out", log = dir + "/log";
  // The probe writes it as the front end's user.
  { std::ofstream(out).flush(); }
  ASSERT_EQ(::chmod(out.c_str(), 0666), 0);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::setenv("TSB_REAL_FRONTEND", (std::string(TSB_BIN_DIR) + "/toolsandboxd-frontend").c_str(), 1);
    ::setenv("TSB_PROBE_OUT", out.c_str(), 1);
    ::setenv("TSB_PROBE_FINGERPRINT", loaded->fingerprint.c_str(), 1);
    int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    const std::string bin = dir + "/toolsandboxd", conf = dir + "/config.json";
    ::execl(bin.c_str(), bin.c_str(), "--config", conf.c_str(), nullptr);
    ::_exit(127);
  }
  ASSERT_GT(pid, 0);
  int status = 0;
  // Sixteen runs: seconds here, minutes in the VM lane's emulated CPU.
  for (int i = 0; i < 12000 && ::waitpid(pid, &status, WNOHANG) == 0; ++i) std::this_thread::sleep_for(50ms);
  if (::waitpid(pid, &status, WNOHANG) == 0) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
    FAIL() << "the spawner did not stop after its front end ended: " << slurp(log);
  }
  const std::string results = slurp(out);
  ASSERT_FALSE(results.empty()) << "the probe wrote nothing (it runs as the front end user); log:\n" << slurp(log);
  std::map<std::string, std::string> got;
  std::istringstream in(results);
  for (std::string line; std::getline(in, line);) {
    auto sp = line.find(' ');
    got[line.substr(0, sp)] = sp == std::string::npos ? "" : line.substr(sp + 1);
  }
  EXPECT_EQ(got["hello"], "ok");
  // Refusal codes (daemon/wire/wire.h): 1 malformed, 2 unknown policy, 3 out of bounds.
  const std::map<std::string, std::string> refused = {
      {"empty", "refused:1"},           {"unknown-type", "refused:1"},     {"truncated", "refused:1"},
      {"trailing", "refused:1"},        {"huge-length", "refused:1"},      {"bad-mode", "refused:1"},
      {"unknown-policy", "refused:2"},  {"wrong-fingerprint", "refused:2"}, {"timeout-zero", "refused:3"},
      {"timeout-above-policy", "refused:3"}, {"env-fixed-name", "refused:3"}, {"env-not-allowed", "refused:3"},
      {"env-bad-name", "refused:3"},    {"env-nul-value", "refused:3"},
  };
  for (const auto& [name, want] : refused) {
    EXPECT_EQ(got[name], want) << name;
    // The valid order after it ran, as the sandbox's own uid 1000.
    EXPECT_EQ(got[name + ".after"], "ended:exited:0 hello 1000|") << name;
  }
  EXPECT_EQ(got["baseline.after"], "ended:exited:0 hello 1000|");
  EXPECT_EQ(got["kill-unknown.after"], "ended:exited:0 hello 1000|");
  // Sending the spawner a descriptor ends the front end that did.
  EXPECT_EQ(got.count("descriptor-sent"), 0u) << "the probe outlived sending a descriptor: " << got["descriptor-sent"];
  const std::string l = slurp(log);
  EXPECT_NE(l.find("sent descriptors: ending it"), std::string::npos) << l;
  EXPECT_NE(l.find("the front end ended before it was ready"), std::string::npos) << l;
  if (!HasFailure()) (void)!std::system(("rm -rf " + dir).c_str());
  else ADD_FAILURE() << "kept " << dir;
}

TEST_F(EngineTest, PrivsepKilledFrontEndEndsItsRunsAndServiceResumes) {
  // No warm sandboxes (no uid slot beyond the runs' ones): the sandbox
  // processes counted below are then the runs' alone.
  Daemon d(json{{"max_concurrent_runs", 8}, {"engine", {{"uid_slots", 8}}}});
  ASSERT_TRUE(d.status().is_object()) << d.log_text();
  const pid_t fe = front_end_of(d.pid());
  ASSERT_GT(fe, 0);
  // Runs of earlier tests end within moments of their daemons.
  for (int i = 0; i < 200 && sandbox_processes() != 0; ++i) std::this_thread::sleep_for(50ms);
  ASSERT_EQ(sandbox_processes(), 0) << "sandboxes of another test are still running";
  // A run that would last a minute, its client waiting.
  int c = d.connect();
  ASSERT_GE(c, 0);
  Daemon::send_all(c, tsb::testing::execute_request("import time\ntime.sleep(60)\n").dump() + "\n");
  for (int i = 0; i < 1200 && sandbox_processes() == 0; ++i) std::this_thread::sleep_for(50ms);
  ASSERT_GT(sandbox_processes(), 0) << "the run did not start";
  ASSERT_EQ(::kill(fe, SIGKILL), 0);
  // Its client sees the connection end, without an answer.
  EXPECT_TRUE(Daemon::read_line(c).is_null());
  ::close(c);
  // Its run is killed.
  int left = -1;
  for (int i = 0; i < 400 && (left = sandbox_processes()) != 0; ++i) std::this_thread::sleep_for(50ms);
  EXPECT_EQ(left, 0) << "processes of the front end's run are still alive";
  // A new front end serves, under the same spawner.
  const pid_t fe2 = wait_front_end(d.pid(), fe, 30s);
  ASSERT_GT(fe2, 0) << d.log_text();
  ASSERT_TRUE(tsb::testing::wait_for_daemon(d.socket_path(), d.pid(), 30s)) << d.log_text();
  auto r = d.request(tsb::testing::execute_request("print('again')\n"));
  ASSERT_TRUE(r.value("ok", false)) << r.dump() << d.log_text();
  EXPECT_EQ(r["result"]["status"], "success");
  EXPECT_TRUE(d.alive());
  const std::string l = d.log_text();
  EXPECT_NE(l.find("killed 1 runs of the front end that ended"), std::string::npos) << l;
}
