// End-to-end: the real toolsandboxd binary on a temporary socket.
#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <thread>

#include "isolate/base/random.h"
#include "daemon/frontend/letta/letta.h"
#include "tests/integration/harness.h"

using nlohmann::json;
using namespace std::chrono_literals;

namespace {

// The daemon under test (tests/integration/harness.h): it is ready once it
// answers on its socket, not as soon as the socket file exists.
using Daemon = tsb::testing::TestDaemon;

json execute(const std::string& script, json extra = json::object()) {
  return tsb::testing::execute_request(script, std::move(extra));
}

json run_tool(const std::string& src, const std::string& name, json args = json::object(), json extra = json::object()) {
  return tsb::testing::run_tool_request(src, name, std::move(args), std::move(extra));
}

// A script emitting Letta's binary frame, as letta-server's generator does.
std::string binary_frame_script(const std::string& payload_json) {
  return "import sys, struct, hashlib\n"
         "print('before')\n"
         "p = " + json(payload_json).dump() + ".encode('utf-8')\n"
         "sys.stdout.flush()\n"
         "sys.stdout.buffer.write(bytes.fromhex('92c8e49843d35fb3919da69eb3e5c5c6') + struct.pack('>I', len(p)) + "
         "hashlib.md5(p).hexdigest().encode('ascii') + p)\n"
         "sys.stdout.buffer.flush()\n";
}

// A copy of the source tree's policies in a directory of its own, and the
// text of its default.json (for the test to change and write back).
std::string copy_policies(const std::string& dir) {
  if (std::system(("cp -r " + std::string(TSB_SOURCE_DIR) + "/policies " + dir).c_str()) != 0) return "";
  std::ifstream in(dir + "/default.json");
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

using tsb::testing::EngineTest;

TEST_F(EngineTest, DaemonStatus) {
  Daemon d;
  auto r = d.request({{"v", 1}, {"id", "s"}, {"type", "status"}});
  ASSERT_TRUE(r.value("ok", false)) << r.dump() << d.log_text();
  EXPECT_EQ(r["id"], "s");
  EXPECT_TRUE(r["status"]["policies"].contains("default"));
  // The spawner's facts reach the front end's status: the hierarchies runs
  // are placed in, in this machine's cgroup version.
  const json& engine = r["status"]["engine"];
  const std::string mode = r["status"]["cgroup_mode"].get<std::string>();
  EXPECT_EQ(engine.value("cgroups", "").rfind("cgroup " + mode + ", parent ", 0), 0u) << engine.dump();
}

TEST_F(EngineTest, DaemonExecuteBinaryFraming) {
  Daemon d;
  auto r = d.request(execute(binary_frame_script(R"({"results": {"x": 1}, "agent_state": null})")));
  ASSERT_TRUE(r.value("ok", false)) << r.dump();
  const json& res = r["result"];
  EXPECT_EQ(res["status"], "success") << res.dump();
  EXPECT_EQ(res["func_return"], json({{"x", 1}}));
  EXPECT_EQ(res["stdout"], json::array({"before\n"}));
  EXPECT_EQ(res["record"]["framing"], "binary");
}

TEST_F(EngineTest, DaemonExecuteLegacyFraming) {
  Daemon d;
  std::string payload = R"({"results": "ok", "agent_state": null})";
  std::string script = "import base64\nprint('x', end='')\nprint('" + std::string(tsb::letta::kLegacyStartMarker) +
                       "' + base64.b64encode(" + json(payload).dump() + ".encode()).decode() + '" +
                       std::string(tsb::letta::kLegacyEndMarker) + "', end='')\nprint('y')\n";
  auto r = d.request(execute(script));
  ASSERT_TRUE(r.value("ok", false)) << r.dump();
  EXPECT_EQ(r["result"]["func_return"], "ok") << r.dump();
  EXPECT_EQ(r["result"]["stdout"], json::array({"xy\n"}));
  EXPECT_EQ(r["result"]["record"]["framing"], "legacy-text");
}

TEST_F(EngineTest, DaemonExecuteCorruptedFrame) {
  Daemon d;
  std::string script = binary_frame_script(R"({"results": 1})");
  script.replace(script.find("hashlib.md5(p).hexdigest()"), std::string("hashlib.md5(p).hexdigest()").size(), "('0'*32)");
  auto r = d.request(execute(script));
  ASSERT_TRUE(r.value("ok", false)) << r.dump();
  EXPECT_EQ(r["result"]["status"], "error");
  EXPECT_EQ(r["result"]["func_return"], "Error executing function t: Exception: Function ran, but output is corrupted.");
}

TEST_F(EngineTest, DaemonExecuteToolExceptionAndFingerprint) {
  Daemon d;
  json cfg = {{"type", "local"},
              {"config", {{"pip_requirements", json::array()}, {"sandbox_dir", "/root/.letta/tool_execution_dir"},
                          {"use_venv", false}, {"venv_name", "venv"}}}};
  json req = execute("x = 1 / 0\n", {{"sandbox_config", cfg}});
  req["organization_id"] = "org-00000000-0000-4000-8000-000000000000";
  auto r = d.request(req);
  ASSERT_TRUE(r.value("ok", false)) << r.dump();
  EXPECT_EQ(r["result"]["status"], "error");
  EXPECT_EQ(r["result"]["func_return"], "Error executing function t: ZeroDivisionError: division by zero");
  EXPECT_EQ(r["result"]["sandbox_config_fingerprint"],
            "48408990033679363701484527775310645901996820373321982248109825766489622234136");
}

TEST_F(EngineTest, DaemonRunToolSyncAsyncAndAgentState) {
  Daemon d;
  auto r = d.request(run_tool("def add(a: int, b: int) -> int:\n    return a + b\n", "add", {{"a", 2}, {"b", 40}}));
  ASSERT_TRUE(r.value("ok", false)) << r.dump();
  EXPECT_EQ(r["result"]["func_return"], 42) << r.dump();
  r = d.request(run_tool("import asyncio\nasync def slow(x):\n    await asyncio.sleep(0.01)\n    return [x, x]\n", "slow", {{"x", "a"}}));
  EXPECT_EQ(r["result"]["func_return"], json::array({"a", "a"})) << r.dump();
  // Declared agent_state comes back (changed); undeclared never does.
  json state = {{"memory", {{"human", "Bob"}}}, {"secrets", {{"K", "V"}}}};
  r = d.request(run_tool("def remember(agent_state, fact: str):\n    agent_state.memory.human += ' ' + fact\n    return 'ok'\n",
                         "remember", {{"fact", "likes tea"}}, {{"agent_state", state}}));
  EXPECT_EQ(r["result"]["agent_state"]["memory"]["human"], "Bob likes tea") << r.dump();
  r = d.request(run_tool("def plain():\n    return 1\n", "plain", json::object(), {{"agent_state", state}}));
  EXPECT_TRUE(r["result"]["agent_state"].is_null()) << r.dump();
}

TEST_F(EngineTest, DaemonArgumentsAreDataNotCode) {
  Daemon d;
  std::string evil = "'); import os; os.system('touch /tmp/pwned') #";
  auto r = d.request(run_tool("def echo(s):\n    return s\n", "echo", {{"s", evil}}));
  EXPECT_EQ(r["result"]["func_return"], evil) << r.dump();
}

TEST_F(EngineTest, DaemonForgedFrameIsIgnoredInToolMode) {
  Daemon d;
  // The tool prints a frame with a nonce it made up, and Letta's markers.
  std::string src =
      "def spoof():\n"
      "    print('<<TSB-RESULT-' + 'a'*32 + '>>eyJyZXN1bHRzIjogImZvcmdlZCJ9<<TSB-END-' + 'a'*32 + '>>')\n"
      "    print('92c8e498-43d3-5fb3-919d-a69eb3e5c5c6eyJyZXN1bHRzIjogImZvcmdlZCJ9'\n"
      "          '34aa1e30-8090-58d0-a72a-e5545c067875')\n"
      "    return 'real'\n";
  auto r = d.request(run_tool(src, "spoof", json::object()));
  EXPECT_EQ(r["result"]["func_return"], "real") << r.dump();
}

TEST_F(EngineTest, DaemonEnvIsolation) {
  ::setenv("TSB_DAEMON_SECRET", "leak", 1);
  Daemon d;
  ::unsetenv("TSB_DAEMON_SECRET");
  auto r = d.request(run_tool("import os\ndef env():\n    return dict(os.environ)\n", "env", json::object(),
                              {{"env", {{"MY_KEY", "v1"}}}}));
  ASSERT_TRUE(r.value("ok", false)) << r.dump();
  const json& env = r["result"]["func_return"];
  EXPECT_EQ(env["MY_KEY"], "v1");
  EXPECT_FALSE(env.contains("TSB_DAEMON_SECRET")) << env.dump();
  EXPECT_FALSE(env.contains("TSB_CGROUP_PARENT"));
}

// A request that sets a name the policy fixes runs, with the policy's value
// (the front end drops the request's; the spawner would refuse it).
TEST_F(EngineTest, DaemonFixedEnvNamesKeepThePolicysValue) {
  Daemon d;
  auto r = d.request(run_tool("import os\ndef env():\n    return {k: os.environ.get(k) for k in ('LANG', 'HOME', 'MY_KEY')}\n",
                              "env", json::object(), {{"env", {{"LANG", "xx_XX.UTF-8"}, {"HOME", "/root"}, {"MY_KEY", "v1"}}}}));
  ASSERT_TRUE(r.value("ok", false)) << r.dump();
  EXPECT_EQ(r["result"]["status"], "success") << r.dump();
  EXPECT_EQ(r["result"]["func_return"], json({{"LANG", "C.UTF-8"}, {"HOME", "/work"}, {"MY_KEY", "v1"}}));
  EXPECT_EQ(r["result"]["record"]["env_overridden"], json({"HOME", "LANG"}));
}

TEST_F(EngineTest, DaemonTimeoutUsesLettasMessage) {
  Daemon d;
  auto r = d.request(run_tool("def loop():\n    while True:\n        pass\n", "loop", json::object(), {{"timeout", 1}}));
  ASSERT_TRUE(r.value("ok", false)) << r.dump();
  EXPECT_EQ(r["result"]["status"], "error");
  EXPECT_EQ(r["result"]["func_return"], "Error executing function loop: TimeoutError: Executing tool loop timed out after 1.0 seconds.");
  EXPECT_EQ(r["result"]["record"]["end_reason"], "timeout");
  EXPECT_EQ(r["result"]["record"]["timeout_requested_s"], 1);
  EXPECT_EQ(r["result"]["record"]["timeout_applied_s"], 1.0);
}

TEST_F(EngineTest, DaemonBadInputGetsClearErrorsAndKeepsServing) {
  Daemon d(json{{"max_frame_bytes", "64KiB"}, {"request_timeout", "1s"}});
  auto code = [](const json& r) { return r.is_object() && r.contains("error") ? r["error"].value("code", "") : std::string("<none>"); };
  EXPECT_EQ(code(d.raw("{not json\n")), "bad_request");
  EXPECT_EQ(code(d.raw("[1,2]\n")), "bad_request");
  EXPECT_EQ(code(d.raw(R"({"v":1,"id":"a","type":"nope"})" "\n")), "bad_request");
  EXPECT_EQ(code(d.raw(R"({"v":1,"id":"a","type":"status","extra":1})" "\n")), "bad_request");
  EXPECT_EQ(code(d.raw(R"({"v":1,"id":"a","type":"execute","tool_name":5,"organization_id":"o","script":""})" "\n")), "bad_request");
  EXPECT_EQ(code(d.raw(R"({"v":2,"id":"a","type":"status"})" "\n")), "bad_request");
  EXPECT_EQ(code(d.raw(std::string("\xff\xfe\x00\x01garbage\x80\n", 14))), "bad_request");
  EXPECT_EQ(code(d.raw(std::string(70 * 1024, 'x') + "\n")), "too_large");
  EXPECT_EQ(code(d.raw(R"({"v":1,"id":"a","type":"sta)", true)), "bad_request");  // truncated, then EOF
  EXPECT_EQ(code(d.raw("")), "timeout");                                            // sends nothing
  auto ok = d.request({{"v", 1}, {"id", "s"}, {"type", "status"}});
  EXPECT_TRUE(ok.value("ok", false)) << "the daemon stopped serving: " << d.log_text();
}

TEST_F(EngineTest, DaemonUnauthorizedPeerIsRefused) {
  Daemon d(json{{"allowed_uids", json::array({12345})}});
  auto r = d.request({{"v", 1}, {"id", "s"}, {"type", "status"}});
  EXPECT_EQ(r["error"]["code"], "unauthorized") << r.dump();
}

TEST_F(EngineTest, DaemonBusyBeyondTheLimit) {
  Daemon d(json{{"max_concurrent_runs", 1}, {"max_queued_runs", 0}});
  int hold = d.connect();
  Daemon::send_all(hold, run_tool("import time\ndef nap():\n    time.sleep(5)\n", "nap", json::object()).dump() + "\n");
  std::this_thread::sleep_for(500ms);
  auto r = d.request(run_tool("def one():\n    return 1\n", "one", json::object()));
  EXPECT_EQ(r["error"]["code"], "busy") << r.dump();
  ::close(hold);
}

// The daemon's status once no run holds a slot, or after 5 s.
json status_once_no_run_in_flight(Daemon& d) {
  json st;
  for (int i = 0; i < 50; ++i) {
    st = d.request({{"v", 1}, {"id", "s"}, {"type", "status"}});
    if (st["status"]["runs_in_flight"] == 0) break;
    std::this_thread::sleep_for(100ms);
  }
  return st;
}

// A half-closed client still waits for its answer; when it then closes the
// connection entirely, its run is killed like any other client's.
TEST_F(EngineTest, DaemonHalfClosedClientThatLeavesLaterCancelsItsRun) {
  Daemon d;
  int fd = d.connect();
  Daemon::send_all(fd, run_tool("import time\ndef nap():\n    time.sleep(60)\n", "nap", json::object()).dump() + "\n");
  ASSERT_EQ(::shutdown(fd, SHUT_WR), 0);
  std::this_thread::sleep_for(1000ms);
  json st = d.request({{"v", 1}, {"id", "s"}, {"type", "status"}});
  EXPECT_EQ(st["status"]["runs_in_flight"], 1) << "a half-close is not going away: " << st.dump();
  ::close(fd);
  st = status_once_no_run_in_flight(d);
  EXPECT_EQ(st["status"]["runs_in_flight"], 0) << st.dump();
  EXPECT_EQ(st["status"]["totals"].value("cancelled", 0), 1) << st.dump();
}

TEST_F(EngineTest, DaemonClientDisconnectKillsTheRun) {
  Daemon d;
  int fd = d.connect();
  Daemon::send_all(fd, run_tool("import time\ndef nap():\n    time.sleep(60)\n", "nap", json::object()).dump() + "\n");
  std::this_thread::sleep_for(700ms);
  ::close(fd);
  json st = status_once_no_run_in_flight(d);
  EXPECT_EQ(st["status"]["runs_in_flight"], 0) << st.dump();
  EXPECT_EQ(st["status"]["totals"].value("cancelled", 0), 1) << st.dump();
}

// A run that ends before the front end has written its stdin: the write
// fails with EPIPE. The front end must answer, not die of SIGPIPE (a client
// that disconnects while its run starts did this, by the kill). The
// interpreter here never reads its input, and the script is larger than a
// pipe holds, so the front end is still writing when the reader goes away.
TEST_F(EngineTest, DaemonRunThatNeverReadsItsInputLeavesTheFrontEndUp) {
  std::string dir = "/tmp/tsb-e2e-epipe-" + tsb::random_hex(4);
  std::string text = copy_policies(dir);
  ASSERT_FALSE(text.empty());
  const std::string from = "\"interpreter\": \"/venv/bin/python3\"";
  auto at = text.find(from);
  ASSERT_NE(at, std::string::npos);
  text.replace(at, from.size(), "\"interpreter\": \"/bin/true\"");
  // Without its "packages" (an interpreter outside /venv has no use for
  // them), and alone (privileged.json, which includes it, installs some).
  ASSERT_EQ(::unlink((dir + "/privileged.json").c_str()), 0);
  const auto pk = text.find("  \"packages\": {");
  ASSERT_NE(pk, std::string::npos);
  text.erase(pk, text.find("\n  },\n", pk) + 5 - pk);
  std::ofstream(dir + "/default.json") << text;
  Daemon d(json{{"policies_dir", dir}, {"organizations", dir + "/organizations.json"}});
  const std::string script = "# " + std::string(512 << 10, 'x') + "\n";
  for (int i = 0; i < 3; ++i) {
    auto r = d.request(execute(script));
    ASSERT_TRUE(r.value("ok", false)) << r.dump().substr(0, 2000) << d.log_text();
    EXPECT_EQ(r["result"]["record"]["exit_code"], 0) << r.dump().substr(0, 2000);
  }
  const std::string log = d.log_text();
  EXPECT_EQ(log.find("front end (pid"), std::string::npos) << log;
  EXPECT_EQ(log.find("starting a new front end"), std::string::npos) << log;
  std::system(("rm -rf " + dir).c_str());
}

TEST_F(EngineTest, DaemonReloadWithBrokenPolicyKeepsTheOldSet) {
  std::string dir = "/tmp/tsb-e2e-pol-" + tsb::random_hex(4);
  std::string cmd = "cp -r " + std::string(TSB_SOURCE_DIR) + "/policies " + dir;
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  Daemon d(json{{"policies_dir", dir}, {"organizations", dir + "/organizations.json"}});
  auto before = d.request({{"v", 1}, {"id", "s"}, {"type", "status"}});
  std::ofstream(dir + "/default.json") << "{ \"version\": 1, \"limits\": { \"memory\": \"lots\" } }";
  ::kill(d.pid(), SIGHUP);
  // A reload runs the compile helper: well under a second here, seconds in
  // the VM lane's emulated CPU. Its outcome is in the log.
  bool kept = false;
  for (int i = 0; i < 1500 && !kept; ++i) {
    kept = d.log_text().find("keeping the current configuration and policies") != std::string::npos;
    if (!kept) std::this_thread::sleep_for(20ms);
  }
  auto after = d.request({{"v", 1}, {"id", "s"}, {"type", "status"}});
  EXPECT_EQ(before["status"]["policies"], after["status"]["policies"]);
  EXPECT_TRUE(kept) << d.log_text();
  auto r = d.request(run_tool("def one():\n    return 1\n", "one", json::object()));
  EXPECT_EQ(r["result"]["func_return"], 1) << r.dump();
  std::system(("rm -rf " + dir).c_str());
}

// A run whose loopback TCP buffers reach its memory limit and that then
// waits is ended through the daemon (not only by the engine alone,
// containment_test.cc), soon, not at its timeout: on v2 the kernel's OOM
// kill; on v1 the spawner's sweep of the runs' socket counters (once a
// second for all of them). Both say memory_limit.
TEST_F(EngineTest, DaemonEndsARunHeldAtItsSocketLimit) {
  std::string dir = "/tmp/tsb-e2e-sock-" + tsb::random_hex(4);
  std::string text = copy_policies(dir);
  ASSERT_FALSE(text.empty());
  for (const auto& [from, to] : {std::pair<std::string, std::string>{"\"memory\": \"512MiB\"", "\"memory\": \"48MiB\""},
                                 {"\"open_files\": 256", "\"open_files\": 1024"}}) {
    ASSERT_NE(text.find(from), std::string::npos) << from;
    text.replace(text.find(from), from.size(), to);
  }
  std::ofstream(dir + "/default.json") << text;
  Daemon d(json{{"policies_dir", dir}, {"organizations", dir + "/organizations.json"}});
  // The shared program (harness.h), its arguments set in the script.
  const std::string script = "import sys\nsys.argv = ['q', '" + std::to_string(4 * (48 << 20)) + "', 'hold']\n" +
                             tsb::testing::kQueueLoopbackTcp;
  const auto t0 = std::chrono::steady_clock::now();
  auto r = d.request(execute(script));
  const auto took = std::chrono::steady_clock::now() - t0;
  ASSERT_TRUE(r.value("ok", false)) << r.dump().substr(0, 2000) << d.log_text();
  EXPECT_EQ(r["result"]["record"]["end_reason"], "memory_limit") << r.dump().substr(0, 2000);
  EXPECT_LT(took, std::chrono::seconds(20)) << r.dump().substr(0, 2000);
  std::system(("rm -rf " + dir).c_str());
}

TEST_F(EngineTest, DaemonAuditLineHasNoSecrets) {
  Daemon d;
  auto r = d.request(run_tool("def f(x):\n    return 1\n", "f", {{"x", "ARG-SECRET"}},
                              {{"env", {{"API_KEY", "ENV-SECRET"}}}, {"agent_state", {{"s", "STATE-SECRET"}}}}));
  ASSERT_TRUE(r.value("ok", false));
  std::string log = d.log_text();
  EXPECT_NE(log.find("audit run_id="), std::string::npos) << log;
  for (const char* secret : {"ARG-SECRET", "ENV-SECRET", "STATE-SECRET"}) EXPECT_EQ(log.find(secret), std::string::npos) << secret;
}

// Warm sandboxes on this machine's cgroup version (the VM lane runs this on
// v2): made before their request, handed over once, limits and CPU time
// from the hand-over, the request's environment adopted as a cold start's.
TEST_F(EngineTest, DaemonWarmPoolHandsOverOnce) {
  std::string dir = "/tmp/tsb-e2e-warm-" + tsb::random_hex(4);
  std::string text = copy_policies(dir);
  ASSERT_FALSE(text.empty());
  // The shipped pool, made one sandbox per mode.
  const std::string at = "\"warm_pool\": { \"max\": 4, \"min\": 1, \"idle\": \"300s\" },";
  ASSERT_NE(text.find(at), std::string::npos);
  text.replace(text.find(at), at.size(), "\"warm_pool\": { \"max\": 1, \"min\": 1 },");
  std::ofstream(dir + "/default.json") << text;
  Daemon d(json{{"policies_dir", dir}, {"organizations", dir + "/organizations.json"}});
  // Both modes' pools of the default policy ready (privileged.json, which
  // includes it, has pools too): seconds under the VM lane's emulated CPU.
  auto ready = [&] {
    auto st = d.request({{"v", 1}, {"id", "s"}, {"type", "status"}});
    int n = 0;
    for (const auto& p : st["status"]["warm_pool"]["pools"]) n += p["policy"] == "default" && p.value("warm", 0) > 0;
    return n == 2;
  };
  auto wait_ready = [&] {
    for (int i = 0; i < 3000 && !ready(); ++i) std::this_thread::sleep_for(20ms);
  };
  wait_ready();
  ASSERT_TRUE(ready()) << d.log_text();
  const std::string tool =
      "import os\ndef f(n: int) -> dict:\n"
      "    return {'n': n, 'v': os.environ.get('LETTA_AGENT_ID'),\n"
      "            'proc': 'LETTA_AGENT_ID=agent-w' in open('/proc/self/environ').read().split('\\0')}\n";
  auto r1 = d.request(run_tool(tool, "f", {{"n", 1}}, {{"agent_id", "agent-w"}}));
  ASSERT_TRUE(r1.value("ok", false)) << r1.dump() << d.log_text();
  const json& rec = r1["result"]["record"];
  EXPECT_TRUE(rec.value("warm", false)) << rec.dump();
  EXPECT_EQ(r1["result"]["func_return"], (json{{"n", 1}, {"v", "agent-w"}, {"proc", true}})) << r1.dump();
  // The next run: a sandbox of its own (the used one is gone), warm again
  // once the pool refilled.
  wait_ready();
  auto r2 = d.request(run_tool(tool, "f", {{"n", 2}}));
  ASSERT_TRUE(r2.value("ok", false)) << r2.dump();
  EXPECT_TRUE(r2["result"]["record"].value("warm", false)) << r2.dump();
  EXPECT_NE(r2["result"]["record"]["run_id"], rec["run_id"]);
  EXPECT_EQ(r2["result"]["func_return"]["v"], nullptr) << r2.dump();
  // Script mode, warm: a cold start's argv and exit status.
  wait_ready();
  auto s = d.request(execute("import sys\nprint(__name__, sys.argv[0].endswith('.py'))\nsys.exit(4)\n"));
  ASSERT_TRUE(s.value("ok", false)) << s.dump();
  EXPECT_TRUE(s["result"]["record"].value("warm", false)) << s.dump();
  EXPECT_EQ(s["result"]["record"]["exit_code"], 4) << s.dump();
  EXPECT_EQ(s["result"]["stdout"], json::array({"__main__ True\n"})) << s.dump();
  auto st = d.request({{"v", 1}, {"id", "s"}, {"type", "status"}});
  EXPECT_EQ(st["status"]["warm_pool"].value("hits", 0), 3) << st.dump();
  std::system(("rm -rf " + dir).c_str());
}

namespace {

// A session's frames after its answer line (protocol/PROTOCOL.md, 6.8):
// (kind, payload), or kind 0 at the connection's end.
std::pair<char, std::string> read_frame(int fd) {
  auto read_n = [fd](std::size_t n, std::string& out) {
    out.resize(n);
    for (std::size_t got = 0; got < n;) {
      ssize_t r = ::read(fd, out.data() + got, n - got);
      if (r <= 0) return false;
      got += static_cast<std::size_t>(r);
    }
    return true;
  };
  std::string head, payload;
  if (!read_n(5, head)) return {0, ""};
  const std::uint32_t n = (std::uint32_t(std::uint8_t(head[1])) << 24) | (std::uint32_t(std::uint8_t(head[2])) << 16) |
                          (std::uint32_t(std::uint8_t(head[3])) << 8) | std::uint8_t(head[4]);
  if (n > (1u << 16) || !read_n(n, payload)) return {0, ""};
  return {head[0], payload};
}

json session_request(std::vector<std::string> command) {
  return {{"v", 1}, {"id", "s-1"}, {"type", "session"}, {"organization_id", "org-a"}, {"command", command}};
}

}  // namespace

// A session under the shipped default policy: the answer line, the command's
// stdout and stderr as frames, its stdin's end, the end record; then a
// session whose client goes away is killed, tree and all, and one the
// policy does not allow is refused.
TEST_F(EngineTest, DaemonSessionRelaysItsStdioAndEnds) {
  Daemon d;
  int fd = d.connect();
  Daemon::send_all(fd, session_request({"python3", "-c",
                                        "import sys\nfor l in sys.stdin:\n    print(l.strip()[::-1], flush=True)\n"
                                        "sys.stderr.write('done')\nsys.exit(5)"})
                           .dump() + "\n");
  json answer = Daemon::read_line(fd);
  ASSERT_TRUE(answer.value("ok", false)) << answer.dump();
  EXPECT_EQ(answer["session"]["command"][0], "/venv/bin/python3");
  Daemon::send_all(fd, "abc\nxyz\n");
  ASSERT_EQ(::shutdown(fd, SHUT_WR), 0);
  std::string out, err;
  json record;
  for (;;) {
    auto [kind, payload] = read_frame(fd);
    if (kind == 'o') out += payload;
    else if (kind == 'e') err += payload;
    else if (kind == 'x') record = json::parse(payload, nullptr, false);
    else break;
  }
  ::close(fd);
  EXPECT_EQ(out, "cba\nzyx\n");
  EXPECT_EQ(err, "done");
  EXPECT_EQ(record.value("ended_by", ""), "exit") << record.dump();
  EXPECT_EQ(record.value("exit_code", -1), 5) << record.dump();
  EXPECT_EQ(record.value("bytes_in", 0), 8) << record.dump();

  fd = d.connect();
  Daemon::send_all(fd, session_request({"python3", "-c", "import time\nprint('up', flush=True)\ntime.sleep(60)"}).dump() +
                           "\n");
  ASSERT_TRUE(Daemon::read_line(fd).value("ok", false));
  std::string up;  // (PYTHONUNBUFFERED: "up" and "\n" may come as two writes)
  while (up.size() < 3) {
    auto [kind, payload] = read_frame(fd);
    if (kind != 'o') break;
    up += payload;
  }
  EXPECT_EQ(up, "up\n");
  EXPECT_EQ(d.status()["sessions"]["open"], 1);
  ::close(fd);
  json st;
  for (int i = 0; i < 50; ++i) {
    st = d.status();
    if (st["sessions"]["open"] == 0) break;
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_EQ(st["sessions"]["open"], 0) << st.dump();
  EXPECT_NE(d.log_text().find("ended_by=client"), std::string::npos);

  json refused = d.raw(session_request({"/bin/sh", "-c", "id"}).dump() + "\n");
  EXPECT_EQ(refused["error"]["code"], "policy_denied") << refused.dump();
}
