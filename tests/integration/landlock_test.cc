// Landlock behind the mounts (docs/SECURITY.md, "Landlock: a second wall
// behind the mounts"), asserted from inside real sandboxes: what the mount
// plan leaves open by accident is refused, TCP under egress reaches only
// the proxy's port, abstract Unix sockets of the host stay out of reach,
// and what was applied is in the run record, the audit line and status.
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstddef>
#include <cstring>
#include <fstream>
#include <iterator>

#include "isolate/base/random.h"
#include "isolate/engine/plan.h"
#include "tests/integration/harness.h"

using namespace tsb::testing;
using nlohmann::json;
using tsb::isolate::EndReason;
using tsb::isolate::NetworkMode;

namespace {

// The running kernel's Landlock ABI (0: none).
int kernel_abi() {
  const long v = ::syscall(SYS_landlock_create_ruleset, nullptr, 0, 1u);
  return v < 0 ? 0 : static_cast<int>(v);
}

#define NEED_LANDLOCK_ABI(n)                                                                          \
  do {                                                                                                \
    if (kernel_abi() < (n)) GTEST_SKIP() << "this kernel's Landlock ABI is " << kernel_abi() << " (< " << (n) << ")"; \
  } while (0)

}  // namespace

// The mount plan makes /proc a proc mount the tool's own files in are
// writable through: /proc/self/mem (its own memory, past every mapping's
// protection) and /proc/self/oom_score_adj (without CAP_SYS_RESOURCE in
// the daemon, a run could lower its score to the engine's own). The plan
// lists /proc read-only; Landlock refuses the writes. /dev/null, /tmp and
// the working dir stay writable, as the plan says.
TEST_F(EngineTest, LandlockRefusesWritesThePlanDoesNotList) {
  NEED_LANDLOCK_ABI(1);
  auto r = run(probe_spec({"open-rw", "/proc/self/mem", "open-rw", "/proc/self/oom_score_adj", "open-rw",
                           "/proc/self/comm", "open-rw", "/dev/null", "writefile", "/tmp/x", "writefile", "/work/x",
                           "readfile", "/etc/passwd", "readfile", "/proc/self/status", "128"}));
  ASSERT_EQ(r.reason, EndReason::Exited) << describe(r);
  auto lines = parse_lines(r.stdout_data);
  ASSERT_EQ(lines.size(), 8u) << r.stdout_data;
  for (int i = 0; i < 3; ++i) {
    EXPECT_FALSE(lines[i]["ok"].get<bool>()) << lines[i].dump();
    EXPECT_EQ(lines[i]["errname"], "EACCES") << lines[i].dump();
  }
  for (int i = 3; i < 8; ++i) EXPECT_TRUE(lines[i]["ok"].get<bool>()) << lines[i].dump();
  EXPECT_EQ(tsb::isolate::landlock_summary(r.landlock).rfind("abi" + std::to_string(kernel_abi()) + ":fs", 0), 0u)
      << tsb::isolate::landlock_summary(r.landlock);
}

// Network egress: the only TCP port a tool may connect to is the proxy's.
// A server of its own on another loopback port cannot even be bound; under
// network "none" the same server works (its own namespace is the wall).
TEST_F(EngineTest, LandlockEgressConnectsOnlyToTheProxy) {
  NEED_LANDLOCK_ABI(4);
  auto s = probe_spec({"tcp-self", "8080", "net-connect", "127.0.0.1", std::to_string(tsb::isolate::kEgressProxyPort),
                       "net-connect", "127.0.0.1", "8081"});
  s.network = NetworkMode::Egress;
  auto r = run(s);
  ASSERT_EQ(r.reason, EndReason::Exited) << describe(r);
  auto lines = parse_lines(r.stdout_data);
  ASSERT_EQ(lines.size(), 3u) << r.stdout_data;
  EXPECT_FALSE(lines[0]["ok"].get<bool>()) << lines[0].dump();
  EXPECT_EQ(lines[0]["errname"], "EACCES") << lines[0].dump();
  EXPECT_TRUE(lines[1]["ok"].get<bool>()) << "the proxy's port: " << lines[1].dump();
  EXPECT_EQ(lines[2]["errname"], "EACCES") << "refused by Landlock, not by an empty port: " << lines[2].dump();
  EXPECT_NE(tsb::isolate::landlock_summary(r.landlock).find("net"), std::string::npos)
      << tsb::isolate::landlock_summary(r.landlock);

  auto none = probe_spec({"tcp-self", "8080"});
  auto rn = run(none);
  ASSERT_EQ(rn.reason, EndReason::Exited) << describe(rn);
  auto j = parse_lines(rn.stdout_data).at(0);
  EXPECT_TRUE(j["ok"].get<bool>()) << "network none keeps a tool's own server: " << j.dump();
  EXPECT_EQ(tsb::isolate::landlock_summary(rn.landlock).find("net"), std::string::npos);
}

// Network "host" shares the host's namespace, and with it every abstract
// Unix socket on the host (a session bus, X11, a container runtime's): a
// listener made here, outside the tool's Landlock domain, is out of reach.
TEST_F(EngineTest, LandlockKeepsHostAbstractSocketsOut) {
  NEED_LANDLOCK_ABI(6);
  const std::string name = "tsb-landlock-" + tsb::random_hex(6);
  int l = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(l, 0);
  sockaddr_un u{};
  u.sun_family = AF_UNIX;
  std::memcpy(u.sun_path + 1, name.data(), name.size());
  const auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  ASSERT_EQ(::bind(l, reinterpret_cast<sockaddr*>(&u), len), 0);
  ASSERT_EQ(::listen(l, 4), 0);
  auto s = probe_spec({"unix-abstract", name});
  s.network = NetworkMode::Host;
  auto r = run(s);
  ::close(l);
  ASSERT_EQ(r.reason, EndReason::Exited) << describe(r);
  auto j = parse_lines(r.stdout_data).at(0);
  EXPECT_FALSE(j["ok"].get<bool>()) << j.dump();
  EXPECT_EQ(j["errname"], "EPERM") << j.dump();
  EXPECT_NE(tsb::isolate::landlock_summary(r.landlock).find("scope"), std::string::npos);
}

// What a run got is in its record, its audit line and status; with
// engine.landlock "off" runs get nothing, and the record says so.
TEST_F(EngineTest, LandlockIsRecorded) {
  NEED_LANDLOCK_ABI(1);
  const std::string want = "abi" + std::to_string(kernel_abi()) + ":fs";
  {
    TestDaemon d;
    auto r = d.request(execute_request("print(open('/proc/self/comm', 'w'))\n"));
    ASSERT_TRUE(r.value("ok", false)) << r.dump() << d.log_text();
    const json& rec = r["result"]["record"];
    EXPECT_EQ(rec.value("landlock", "").rfind(want, 0), 0u) << rec.dump();
    EXPECT_NE(r["result"].dump().find("Permission denied"), std::string::npos) << r["result"].dump();
    const std::string log = d.log_text();
    EXPECT_NE(log.find(" landlock=" + want), std::string::npos) << log;
    const json st = d.status();
    const json& ll = st["engine"]["landlock"];
    EXPECT_EQ(ll["mode"], "auto") << st.dump();
    EXPECT_EQ(ll["abi"], kernel_abi()) << st.dump();
    EXPECT_EQ(ll.value("last_run", "").rfind(want, 0), 0u) << st.dump();
  }
  {
    TestDaemon d(json{{"engine", json{{"landlock", "off"}}}});
    auto r = d.request(execute_request("open('/proc/self/comm', 'w').write('x')\nprint('written')\n"));
    ASSERT_TRUE(r.value("ok", false)) << r.dump() << d.log_text();
    EXPECT_EQ(r["result"]["record"].value("landlock", ""), "off") << r["result"].dump();
    EXPECT_NE(r["result"].dump().find("written"), std::string::npos) << r["result"].dump();
    EXPECT_NE(d.log_text().find(" landlock=off"), std::string::npos);
    EXPECT_EQ(d.status()["engine"]["landlock"]["mode"], "off");
  }
}
