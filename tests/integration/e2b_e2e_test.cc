// End-to-end tests of the E2B backend: the real toolsandboxd binary on a
// temporary socket, talking to tests/fakes/e2b_fake.py on 127.0.0.1.
// Privileged organizations still run locally (real sandboxes), hence the
// root tier fixture.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <thread>

#include "daemon/frontend/e2b/e2b.h"
#include "daemon/policy/e2b_network.h"
#include "isolate/base/random.h"
#include "daemon/frontend/letta/letta.h"
#include "tests/integration/harness.h"

using nlohmann::json;
using namespace std::chrono_literals;

namespace {

const std::string kApiKey = "e2b_test_" + std::string(40, 'k') + "_" + "SECRETKEY";

std::string read_file(const std::string& p) {
  std::ifstream in(p);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A plain HTTP/1.1 exchange with Connection: close, for the fake's control API.
json http_call(int port, const std::string& method, const std::string& path, const std::string& body = "",
               const std::vector<std::string>& headers = {}) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return json();
  }
  std::string req = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Length: " +
                    std::to_string(body.size()) + "\r\n";
  for (const auto& h : headers) req += h + "\r\n";
  req += "\r\n" + body;
  ::send(fd, req.data(), req.size(), MSG_NOSIGNAL);
  std::string resp;
  char buf[65536];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) > 0) resp.append(buf, static_cast<std::size_t>(n));
  ::close(fd);
  auto sep = resp.find("\r\n\r\n");
  if (sep == std::string::npos) return json();
  std::string b = resp.substr(sep + 4);
  return b.empty() ? json::object() : json::parse(b, nullptr, false);
}

class Fake {
 public:
  Fake() {
    dir_ = "/tmp/tsb-e2b-fake-" + tsb::random_hex(4);
    ::mkdir(dir_.c_str(), 0700);
    key_file_ = dir_ + "/api-key";
    {
      std::ofstream(key_file_) << kApiKey << "\n";
    }
    ::chmod(key_file_.c_str(), 0600);
    std::string port_file = dir_ + "/port";
    pid_ = ::fork();
    if (pid_ == 0) {
      int fd = ::open((dir_ + "/fake.log").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      std::string script = std::string(TSB_SOURCE_DIR) + "/tests/fakes/e2b_fake.py";
      ::execl("/usr/bin/python3", "python3", script.c_str(), "--api-key-file", key_file_.c_str(), "--port-file",
              port_file.c_str(), "--page-size", "1", nullptr);
      ::_exit(127);
    }
    // Up to 30 s: python3 starts slowly in the VM lane on a loaded host.
    for (int i = 0; i < 1500 && port_ == 0; ++i) {
      std::string p = read_file(port_file);
      if (!p.empty()) port_ = std::atoi(p.c_str());
      else std::this_thread::sleep_for(20ms);
    }
  }
  ~Fake() {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      int st;
      ::waitpid(pid_, &st, 0);
    }
    if (std::system(("rm -rf " + dir_).c_str()) != 0) std::fprintf(stderr, "could not remove %s\n", dir_.c_str());
  }
  int port() const { return port_; }
  const std::string& key_file() const { return key_file_; }
  const std::string& dir() const { return dir_; }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  json e2b_config() const {
    return {{"api_key_file", key_file_}, {"api_url", url()}, {"sandbox_url", url() + "/sbx/{id}/{port}"}};
  }
  json get(const std::string& path) const { return http_call(port_, "GET", path); }
  void fault(const json& f) const { http_call(port_, "POST", "/_control/faults", f.dump()); }
  // Every request but the test's own control calls.
  json requests() const {
    json out = json::array();
    for (const auto& r : get("/_control/requests"))
      if (r["plane"] != "test") out.push_back(r);
    return out;
  }
  json sandboxes() const { return get("/_control/sandboxes"); }
  json pip() const { return get("/_control/pip"); }
  std::vector<json> requests_where(const std::string& method, const std::string& path_prefix) const {
    std::vector<json> out;
    for (const auto& r : requests())
      if (r["method"] == method && r["path"].get<std::string>().rfind(path_prefix, 0) == 0) out.push_back(r);
    return out;
  }
  std::size_t creates() const { return requests_where("POST", "/sandboxes").size() - timeouts(); }
  std::size_t timeouts() const {
    std::size_t n = 0;
    for (const auto& r : requests_where("POST", "/sandboxes/"))
      if (r["path"].get<std::string>().find("/timeout") != std::string::npos) ++n;
    return n;
  }
  json sandbox(const std::string& id) const {
    for (const auto& s : sandboxes())
      if (s["sandboxID"] == id) return s;
    return json();
  }
  // Waits until the fake saw the sandbox end (killed or expired).
  bool wait_ended(const std::string& id, std::chrono::milliseconds max = 5s) const {
    auto until = std::chrono::steady_clock::now() + max;
    while (std::chrono::steady_clock::now() < until) {
      if (sandbox(id).value("killed", false)) return true;
      std::this_thread::sleep_for(50ms);
    }
    return false;
  }

 private:
  std::string dir_, key_file_;
  pid_t pid_ = -1;
  int port_ = 0;
};

// The daemon, as in daemon_e2e_test.cc, with an E2B section and our own
// organizations: org-priv is privileged (local), org-net is not and uses the
// "privileged" policy (egress to public hosts on 80 and 443: pip allowed),
// everyone else is not and uses "default" (no network).
class Daemon {
 public:
  Daemon(const Fake& fake, json extra = json::object(), bool expect_start = true) {
    dir_ = "/tmp/tsb-e2b-d-" + tsb::random_hex(4);
    ::mkdir(dir_.c_str(), 0755);
    socket_ = dir_ + "/d.sock";
    std::string orgs = dir_ + "/organizations.json";
    std::ofstream(orgs) << json{{"version", 1},
                                {"default", {{"privileged", false}, {"policy", "default"}, {"allowed_policies", {"default"}}}},
                                {"organizations",
                                 {{"org-priv", {{"privileged", true}, {"policy", "privileged"}, {"allowed_policies", {"privileged", "default"}}}},
                                  {"org-net", {{"privileged", false}, {"policy", "privileged"}, {"allowed_policies", {"privileged"}}}}}}}
                                .dump(2);
    const char* parent = std::getenv("TSB_CGROUP_PARENT");
    json cfg = {{"version", 1},
                {"socket", {{"path", socket_}}},
                {"request_timeout", "5s"},
                {"shutdown_grace", "2s"},
                {"engine", {{"state_dir", "/run/tsb-e2b"},
                            {"cgroup_parent", std::string(parent ? parent : "/toolsandbox-test") + "-e2b"},
                            {"init", std::string(TSB_BIN_DIR) + "/toolsandbox-init"}}},
                {"policies_dir", std::string(TSB_SOURCE_DIR) + "/policies"},
                {"organizations", orgs},
                {"e2b", fake.e2b_config()}};
    for (auto it = extra.begin(); it != extra.end(); ++it) {
      if (it.key() == "e2b")
        for (auto e = it->begin(); e != it->end(); ++e) cfg["e2b"][e.key()] = e.value();
      else cfg[it.key()] = it.value();
    }
    config_ = dir_ + "/config.json";
    std::ofstream(config_) << cfg.dump(2);
    std::string log = dir_ + "/log";
    pid_ = ::fork();
    if (pid_ == 0) {
      int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      std::string bin = std::string(TSB_BIN_DIR) + "/toolsandboxd";
      ::execl(bin.c_str(), bin.c_str(), "--config", config_.c_str(), nullptr);
      ::_exit(127);
    }
    if (!expect_start) return;
    // Ready once it answers, not as soon as the socket file exists.
    if (!tsb::testing::wait_for_daemon(socket_, pid_, 30s)) ADD_FAILURE() << "daemon did not start: " << log_text();
  }
  ~Daemon() {
    stop();
    if (std::system(("rm -rf " + dir_).c_str()) != 0) std::fprintf(stderr, "could not remove %s\n", dir_.c_str());
  }
  void stop() {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      int st;
      ::waitpid(pid_, &st, 0);
      pid_ = -1;
    }
  }
  // For a daemon expected to refuse to start: its exit status, or -1.
  int wait_exit(std::chrono::milliseconds max = 5s) {
    auto until = std::chrono::steady_clock::now() + max;
    while (std::chrono::steady_clock::now() < until) {
      int st;
      if (::waitpid(pid_, &st, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
      }
      std::this_thread::sleep_for(20ms);
    }
    return -1;
  }
  int connect() const { return tsb::testing::connect_unix(socket_); }
  static void send_all(int fd, const std::string& s) { tsb::testing::send_all(fd, s); }
  static json read_line(int fd) { return tsb::testing::read_json_line(fd); }
  json request(const json& req) const { return tsb::testing::request_once(socket_, req); }
  json status() const { return request({{"v", 1}, {"id", "s"}, {"type", "status"}}); }
  std::string log_text() const { return read_file(dir_ + "/log"); }
  pid_t pid() const { return pid_; }

 private:
  std::string dir_, socket_, config_;
  pid_t pid_ = -1;
};

json run_tool(const std::string& src, const std::string& name, json args = json::object(), json extra = json::object()) {
  return tsb::testing::run_tool_request(src, name, std::move(args), std::move(extra));
}

json execute(const std::string& script, json extra = json::object()) {
  return tsb::testing::execute_request(script, std::move(extra));
}

json e2b_config(const std::string& tag) { return {{"type", "e2b"}, {"config", {{"timeout", 300}, {"tag", tag}}}}; }

// A script as Letta generates it for E2B: the last expression is the base64
// of the JSON payload (_render_sandbox_code in Letta's
// letta/services/tool_sandbox/base.py, without the binary frame).
std::string letta_e2b_script(const std::string& payload_json, const std::string& before = "print('before')\n") {
  return "import base64, json\n" + before + "_p = " + json(payload_json).dump() +
         "\nbase64.b64encode(_p.encode('utf-8')).decode('utf-8')\n";
}

const json& rec(const json& r) { return r["result"]["record"]; }

// tsb_network of a sandbox created for a policy without network.
const std::string kNoNetwork = tsb::core::e2b_network(tsb::core::Policy{}).digest;

using tsb::testing::EngineTest;

class E2BTest : public EngineTest {
 protected:
  void SetUp() override {
    EngineTest::SetUp();
    if (IsSkipped()) return;
    fake_ = std::make_unique<Fake>();
    ASSERT_GT(fake_->port(), 0) << "the fake E2B service did not start: " << read_file(fake_->dir() + "/fake.log");
  }
  std::unique_ptr<Fake> fake_;
};

}  // namespace

TEST_F(E2BTest, E2BPlacementPrivilegedLocalOthersRemote) {
  Daemon d(*fake_);
  auto r = d.request(run_tool("def add(a: int, b: int) -> int:\n    print('adding')\n    return a + b\n", "add", {{"a", 2}, {"b", 40}}));
  ASSERT_TRUE(r.value("ok", false)) << r.dump() << d.log_text();
  EXPECT_EQ(r["result"]["status"], "success") << r.dump();
  EXPECT_EQ(r["result"]["func_return"], 42) << r.dump();
  EXPECT_EQ(r["result"]["stdout"], json::array({"adding\n"}));
  EXPECT_EQ(rec(r)["backend"], "e2b");
  EXPECT_EQ(rec(r)["end_reason"], "exited");
  EXPECT_EQ(rec(r)["framing"], "nonce");
  EXPECT_EQ(rec(r)["policy"], "default");
  ASSERT_TRUE(rec(r)["sandbox_id"].is_string());
  EXPECT_EQ(fake_->creates(), 1u);

  // What the sandbox was created with (POST /sandboxes in E2B's OpenAPI spec).
  auto creates = fake_->requests_where("POST", "/sandboxes");
  ASSERT_FALSE(creates.empty());
  json body = json::parse(creates[0]["body"].get<std::string>());
  EXPECT_EQ(body["templateID"], "code-interpreter-v1");
  EXPECT_EQ(body["secure"], true);
  EXPECT_EQ(body["allow_internet_access"], false) << "the default policy has no network";
  EXPECT_FALSE(body.contains("network")) << body.dump();
  EXPECT_EQ(body["envVars"], json::object());
  EXPECT_TRUE(body["metadata"].contains("config_state"));
  EXPECT_EQ(body["metadata"]["tsb_network"], kNoNetwork);
  EXPECT_EQ(body["metadata"]["tsb_org"], "org-a");
  EXPECT_GE(body["timeout"].get<int>(), 300);

  // A tool error comes back like a local one.
  r = d.request(run_tool("def boom():\n    return 1 / 0\n", "boom"));
  EXPECT_EQ(r["result"]["status"], "error");
  EXPECT_EQ(r["result"]["func_return"], "Error executing function boom: ZeroDivisionError: division by zero") << r.dump();
  EXPECT_EQ(rec(r)["error_kind"], "tool");

  // Privileged organizations stay local.
  r = d.request(run_tool("def add(a, b):\n    return a + b\n", "add", {{"a", 1}, {"b", 2}}, {{"organization_id", "org-priv"}}));
  ASSERT_TRUE(r.value("ok", false)) << r.dump();
  EXPECT_EQ(r["result"]["func_return"], 3) << r.dump();
  EXPECT_EQ(rec(r)["backend"], "local");
  EXPECT_FALSE(rec(r).contains("sandbox_id"));

  auto st = d.status();
  EXPECT_EQ(st["status"]["e2b_configured"], true);
  EXPECT_EQ(st["status"]["e2b"]["runs_in_flight"], 0);
}

TEST_F(E2BTest, E2BReuseByFingerprintRefreshesTimeout) {
  Daemon d(*fake_);
  json cfg = e2b_config("reuse");
  auto r1 = d.request(run_tool("def f():\n    return 'one'\n", "f", json::object(), {{"sandbox_config", cfg}}));
  auto r2 = d.request(run_tool("def f():\n    return 'two'\n", "f", json::object(), {{"sandbox_config", cfg}}));
  ASSERT_EQ(r1["result"]["func_return"], "one") << r1.dump();
  ASSERT_EQ(r2["result"]["func_return"], "two") << r2.dump();
  EXPECT_EQ(rec(r1)["sandbox_id"], rec(r2)["sandbox_id"]);
  EXPECT_EQ(rec(r1)["sandbox_reused"], false);
  EXPECT_EQ(rec(r2)["sandbox_reused"], true);
  EXPECT_EQ(fake_->creates(), 1u) << "two runs with one sandbox_config must share one sandbox";
  EXPECT_GE(fake_->sandbox(rec(r1)["sandbox_id"])["refreshes"].get<int>(), 1) << "the TTL is refreshed on reuse";

  // The metadata is Letta's fingerprint of that config.
  auto fp = tsb::letta::sandbox_config_fingerprint("e2b", "org-a", cfg["config"]);
  ASSERT_TRUE(fp.ok());
  EXPECT_EQ(r1["result"]["sandbox_config_fingerprint"], *fp);
  EXPECT_EQ(fake_->sandbox(rec(r1)["sandbox_id"])["metadata"]["config_state"], *fp);

  // Another config (or another organization) never shares it.
  auto r3 = d.request(run_tool("def f():\n    return 3\n", "f", json::object(), {{"sandbox_config", e2b_config("other")}}));
  EXPECT_NE(rec(r3)["sandbox_id"], rec(r1)["sandbox_id"]);
  auto r4 = d.request(run_tool("def f():\n    return 4\n", "f", json::object(),
                               {{"sandbox_config", cfg}, {"organization_id", "org-b"}}));
  EXPECT_NE(rec(r4)["sandbox_id"], rec(r1)["sandbox_id"]);
  EXPECT_EQ(fake_->creates(), 3u);
  // A config naming its own organization has one fingerprint for every
  // requester, but two organizations still never share a sandbox.
  json named = cfg;
  named["organization_id"] = "org-config";
  auto r6 = d.request(run_tool("def f():\n    return 6\n", "f", json::object(), {{"sandbox_config", named}}));
  auto r7 = d.request(run_tool("def f():\n    return 7\n", "f", json::object(),
                               {{"sandbox_config", named}, {"organization_id", "org-b"}}));
  EXPECT_EQ(r6["result"]["sandbox_config_fingerprint"], r7["result"]["sandbox_config_fingerprint"]) << r7.dump();
  EXPECT_NE(rec(r6)["sandbox_id"], rec(r7)["sandbox_id"]) << "organizations share no sandbox";
  EXPECT_EQ(fake_->creates(), 5u);

  // A reused sandbox that vanished (TTL) is replaced transparently.
  http_call(fake_->port(), "POST", "/_control/expire/" + rec(r1)["sandbox_id"].get<std::string>());
  auto r5 = d.request(run_tool("def f():\n    return 5\n", "f", json::object(), {{"sandbox_config", cfg}}));
  EXPECT_EQ(r5["result"]["func_return"], 5) << r5.dump();
  EXPECT_NE(rec(r5)["sandbox_id"], rec(r1)["sandbox_id"]);
}

// Letta resolves a separate E2B config for E2B runs; the request's "e2b"
// member carries it, and only a run placed on E2B uses it.
TEST_F(E2BTest, E2BRunsUseTheE2BAlternative) {
  Daemon d(*fake_);
  const std::string src = "import os\ndef f():\n    return os.environ.get('WHERE')\n";
  json local = {{"type", "local"}, {"config", {{"sandbox_dir", "/x"}}}};
  json alt = e2b_config("alt");
  alt["organization_id"] = "org-of-config";
  alt["config"]["pip_requirements"] = json::array({"six==1.16.0"});
  json extra = {{"sandbox_config", local},
                {"env", {{"WHERE", "local"}}},
                {"e2b", {{"sandbox_config", alt}, {"env", {{"WHERE", "e2b"}}}}}};
  extra["organization_id"] = "org-net";
  auto r = d.request(run_tool(src, "f", json::object(), extra));
  ASSERT_TRUE(r.value("ok", false)) << r.dump() << d.log_text();
  EXPECT_EQ(rec(r)["backend"], "e2b");
  EXPECT_EQ(r["result"]["func_return"], "e2b") << "the E2B env replaces the local one";
  auto fp = tsb::letta::sandbox_config_fingerprint("e2b", "org-of-config", alt["config"]);
  ASSERT_TRUE(fp.ok());
  EXPECT_EQ(r["result"]["sandbox_config_fingerprint"], *fp) << "the E2B config's fingerprint, with its own organization";
  EXPECT_EQ(fake_->sandbox(rec(r)["sandbox_id"])["metadata"]["config_state"], *fp);
  EXPECT_EQ(rec(r)["pip_installed"], json::array({"six==1.16.0"})) << "the E2B config's pip requirements";

  // A run that stays local ignores the member.
  extra["organization_id"] = "org-priv";
  r = d.request(run_tool(src, "f", json::object(), extra));
  ASSERT_TRUE(r.value("ok", false)) << r.dump();
  EXPECT_EQ(rec(r)["backend"], "local");
  EXPECT_EQ(r["result"]["func_return"], "local");
  auto local_fp = tsb::letta::sandbox_config_fingerprint("local", "org-priv", local["config"]);
  ASSERT_TRUE(local_fp.ok());
  EXPECT_EQ(r["result"]["sandbox_config_fingerprint"], *local_fp);

  // Without the member, an E2B run keeps the request's own config and env.
  extra.erase("e2b");
  extra["organization_id"] = "org-net";
  r = d.request(run_tool(src, "f", json::object(), extra));
  ASSERT_TRUE(r.value("ok", false)) << r.dump();
  EXPECT_EQ(rec(r)["backend"], "e2b");
  EXPECT_EQ(r["result"]["func_return"], "local");
  local_fp = tsb::letta::sandbox_config_fingerprint("local", "org-net", local["config"]);
  EXPECT_EQ(r["result"]["sandbox_config_fingerprint"], *local_fp);

  // A bad alternative is named as such.
  extra["e2b"] = {{"sandbox_config", {{"type", "e2b"}, {"config", {{"pip_requirements", "six"}}}}}};
  r = d.request(run_tool(src, "f", json::object(), extra));
  EXPECT_EQ(r["error"]["code"], "bad_request") << r.dump();
  EXPECT_NE(r["error"]["message"].get<std::string>().find("e2b.sandbox_config.config.pip_requirements"), std::string::npos)
      << r.dump();
}

TEST_F(E2BTest, E2BConcurrentRunsNeverShareASandbox) {
  Daemon d(*fake_);
  json cfg = e2b_config("concurrent");
  const std::string src = "import time\ndef nap():\n    time.sleep(1.5)\n    return 'z'\n";
  int a = d.connect(), b = d.connect();
  Daemon::send_all(a, run_tool(src, "nap", json::object(), {{"sandbox_config", cfg}}).dump() + "\n");
  Daemon::send_all(b, run_tool(src, "nap", json::object(), {{"sandbox_config", cfg}}).dump() + "\n");
  json ra = Daemon::read_line(a), rb = Daemon::read_line(b);
  ::close(a);
  ::close(b);
  ASSERT_EQ(ra["result"]["func_return"], "z") << ra.dump();
  ASSERT_EQ(rb["result"]["func_return"], "z") << rb.dump();
  EXPECT_NE(rec(ra)["sandbox_id"], rec(rb)["sandbox_id"]) << "one kernel serves one run at a time";
  // Both are idle now: the next two runs reuse them.
  auto r = d.request(run_tool("def f():\n    return 1\n", "f", json::object(), {{"sandbox_config", cfg}}));
  EXPECT_EQ(rec(r)["sandbox_reused"], true);
  EXPECT_EQ(fake_->creates(), 2u);
}

TEST_F(E2BTest, E2BAdoptsRunningSandboxByMetadataWithPaging) {
  json cfg = e2b_config("adopt");
  auto fp = tsb::letta::sandbox_config_fingerprint("e2b", "org-a", cfg["config"]);
  ASSERT_TRUE(fp.ok());
  // Two sandboxes with our metadata exist already (left by an earlier
  // daemon); the fake lists one per page.
  json create = {{"templateID", "code-interpreter-v1"}, {"timeout", 300}, {"secure", true},
                 {"metadata", {{"config_state", *fp}, {"tsb_network", kNoNetwork}, {"tsb_org", "org-a"}}},
                 {"envVars", json::object()}};
  for (int i = 0; i < 2; ++i) http_call(fake_->port(), "POST", "/sandboxes", create.dump(), {"X-API-KEY: " + kApiKey});
  // And one with the same fingerprint but another network setting.
  create["metadata"]["tsb_network"] = "host";
  http_call(fake_->port(), "POST", "/sandboxes", create.dump(), {"X-API-KEY: " + kApiKey});
  std::set<std::string> existing;
  for (const auto& s : fake_->sandboxes()) existing.insert(s["sandboxID"].get<std::string>());
  ASSERT_EQ(existing.size(), 3u);

  Daemon d(*fake_);
  auto r = d.request(run_tool("def f():\n    return 1\n", "f", json::object(), {{"sandbox_config", cfg}}));
  ASSERT_EQ(r["result"]["func_return"], 1) << r.dump() << d.log_text();
  EXPECT_EQ(rec(r)["sandbox_reused"], true);
  EXPECT_TRUE(existing.count(rec(r)["sandbox_id"].get<std::string>()));
  EXPECT_EQ(fake_->sandboxes().size(), 3u) << "no new sandbox when one is running with the same metadata";
  EXPECT_NE(fake_->sandbox(rec(r)["sandbox_id"])["metadata"]["tsb_network"], "host");

  // The list query, encoded exactly as the Python SDK encodes it, followed
  // through x-next-token.
  auto lists = fake_->requests_where("GET", "/v2/sandboxes");
  ASSERT_GE(lists.size(), 2u);
  std::string want =
      "/v2/sandboxes?metadata=config_state%3D" + *fp + "%26tsb_network%3D" + kNoNetwork +
      "%26tsb_org%3Dorg-a&state=running&limit=100";
  EXPECT_EQ(lists[0]["path"], want);
  EXPECT_EQ(lists[1]["path"], want + "&nextToken=1");
}

TEST_F(E2BTest, E2BScriptModeLettaConventions) {
  Daemon d(*fake_);
  // The base64 main result (Letta's E2B scripts).
  auto r = d.request(execute(letta_e2b_script(R"({"results": {"x": 1}, "agent_state": null})")));
  ASSERT_TRUE(r.value("ok", false)) << r.dump();
  EXPECT_EQ(r["result"]["status"], "success") << r.dump();
  EXPECT_EQ(r["result"]["func_return"], json({{"x", 1}}));
  EXPECT_EQ(r["result"]["stdout"], json::array({"before\n"}));
  EXPECT_EQ(rec(r)["framing"], "e2b-result");
  EXPECT_EQ(rec(r)["backend"], "e2b");

  // Python's JSON comes back exactly (integers of any size, NaN), in the
  // python dialect, as for a local run: read from the raw answer line.
  {
    json req = execute(letta_e2b_script(R"({"results": [1180591620717411303424, NaN, -Infinity, "\udcff"], "agent_state": null})"));
    req["json_dialect"] = "python";
    int fd = d.connect();
    ASSERT_GE(fd, 0);
    timeval tv{30, 0};  // never hang the suite on a daemon that does not answer
    ASSERT_EQ(::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv), 0);
    tsb::testing::send_all(fd, req.dump() + "\n");
    std::string line;
    char ch;
    while (::read(fd, &ch, 1) == 1 && ch != '\n') line += ch;
    ::close(fd);
    EXPECT_NE(line.find(R"("func_return":[1180591620717411303424,NaN,-Infinity,"\udcff"])"), std::string::npos) << line;
  }

  // The main result wins over an earlier display_data result.
  fake_->fault({{"op", "execute"}, {"kind", "display_first"}});
  r = d.request(execute(letta_e2b_script(R"({"results": "real", "agent_state": null})")));
  EXPECT_EQ(r["result"]["func_return"], "real") << r.dump();
  EXPECT_EQ(rec(r)["display_results"], 1);

  // Letta's legacy text framing in stdout.
  std::string payload = R"({"results": "legacy", "agent_state": null})";
  std::string script = "import base64\nprint('x', end='')\nprint('" + std::string(tsb::letta::kLegacyStartMarker) +
                       "' + base64.b64encode(" + json(payload).dump() + ".encode()).decode() + '" +
                       std::string(tsb::letta::kLegacyEndMarker) + "', end='')\nprint('y')\n";
  r = d.request(execute(script));
  EXPECT_EQ(r["result"]["func_return"], "legacy") << r.dump();
  EXPECT_EQ(rec(r)["framing"], "legacy-text");
  EXPECT_EQ(r["result"]["stdout"], json::array({"xy\n"}));

  // A kernel error: the friendly message, and the traceback appended to stderr.
  r = d.request(execute("x = 1 / 0\n"));
  EXPECT_EQ(r["result"]["status"], "error");
  EXPECT_EQ(r["result"]["func_return"], "Error executing function t: ZeroDivisionError: division by zero") << r.dump();
  ASSERT_FALSE(r["result"]["stderr"].empty());
  EXPECT_NE(r["result"]["stderr"].back().get<std::string>().find("ZeroDivisionError"), std::string::npos);

  // No result and no error.
  r = d.request(execute("x = 1\n"));
  EXPECT_EQ(r["result"]["func_return"], "Error executing function t: ValueError: Tool t returned execution with None");

  // The environment reaches the script (through its own fixed cell, in a
  // fresh kernel), quotes and newlines included, and does not outlive the run.
  std::string tricky = "v'\"\n); import os; os.system('x') #";
  r = d.request(execute(letta_e2b_script(R"({"results": null})", "import os\nprint(repr(os.environ.get('MY_VAR')))\n"),
                        {{"env", {{"MY_VAR", tricky}}}}));
  EXPECT_EQ(r["result"]["stdout"], json::array({"'v\\'\"\\n); import os; os.system(\\'x\\') #'\n"})) << r.dump();
  r = d.request(execute(letta_e2b_script(R"({"results": null})", "import os\nprint(repr(os.environ.get('MY_VAR')))\n")));
  EXPECT_EQ(r["result"]["stdout"], json::array({"None\n"})) << r.dump();
  for (const auto& q : fake_->requests_where("POST", "/sbx/"))
    if (q["path"].get<std::string>().find("/execute") != std::string::npos) {
      json b = json::parse(q["body"].get<std::string>());
      EXPECT_TRUE(b["env_vars"].is_null()) << "env never goes through the interpreter's env_vars";
      EXPECT_EQ(b["code"].get<std::string>().find("os.environ['"), std::string::npos);
    }
}

TEST_F(E2BTest, E2BPipRequirementsValidatedAndPassedAsArgv) {
  Daemon d(*fake_);
  const std::string src = "def f():\n    return 'ok'\n";
  auto code = [](const json& r) { return r.contains("error") ? r["error"].value("code", "") : std::string("<result>"); };
  auto before = fake_->requests().size();
  struct Case {
    const char* req;
    const char* code;
  } bad[] = {{"--index-url=http://x", "policy_denied"},
             {"-e .", "policy_denied"},
             {"requests; os.system('x')", "bad_request"},
             {"requests && rm -rf /", "bad_request"},
             {"$(id)", "bad_request"},
             {"git+https://example.com/x.git", "policy_denied"},
             {"pkg @ https://example.com/x.whl", "policy_denied"},
             {"../local/path", "policy_denied"},
             {"", "bad_request"},
             {"requests\n--pre", "bad_request"}};
  for (const auto& c : bad) {
    auto r = d.request(run_tool(src, "f", json::object(), {{"organization_id", "org-net"}, {"pip_requirements", {c.req}}}));
    EXPECT_EQ(code(r), c.code) << c.req << ": " << r.dump();
  }
  // Requirements on a policy without network are refused as well.
  auto r = d.request(run_tool(src, "f", json::object(), {{"pip_requirements", {"six"}}}));
  EXPECT_EQ(code(r), "policy_denied") << r.dump();
  EXPECT_EQ(fake_->requests().size(), before) << "refused before any call to E2B";

  // A valid one is installed through envd as argv, never a shell string.
  r = d.request(run_tool(src, "f", json::object(), {{"organization_id", "org-net"}, {"pip_requirements", {"six==1.16.0"}}}));
  ASSERT_EQ(r["result"]["func_return"], "ok") << r.dump() << d.log_text();
  EXPECT_EQ(rec(r)["pip_installed"], json::array({"six==1.16.0"}));
  json pip = fake_->pip();
  ASSERT_EQ(pip.size(), 1u) << pip.dump();
  EXPECT_EQ(pip[0]["argv"], json::array({"python3", "-m", "pip", "install", "--no-input", "--", "six==1.16.0"}));
  EXPECT_EQ(pip[0]["content_type"], "application/connect+json");
  // "privileged" is egress to public hosts on 80 and 443: E2B's name
  // wildcard, nothing else (daemon/policy/e2b_network.h).
  auto creates = fake_->requests_where("POST", "/sandboxes");
  json created = json::parse(creates.back()["body"].get<std::string>());
  EXPECT_EQ(created["allow_internet_access"], false) << created.dump();
  EXPECT_EQ(created["network"], json::parse(R"({"allowOut": ["*"], "denyOut": ["0.0.0.0/0"]})")) << created.dump();
  // Installed once per sandbox.
  r = d.request(run_tool(src, "f", json::object(), {{"organization_id", "org-net"}, {"pip_requirements", {"six==1.16.0"}}}));
  EXPECT_EQ(r["result"]["func_return"], "ok");
  EXPECT_EQ(fake_->pip().size(), 1u);

  // A failing install ends the run as setup_failed and the sandbox is killed.
  r = d.request(run_tool(src, "f", json::object(), {{"organization_id", "org-net"}, {"pip_requirements", {"no-such-pkg>=1"}}}));
  EXPECT_EQ(rec(r)["end_reason"], "setup_failed") << r.dump();
  EXPECT_EQ(rec(r)["detail"], "pip_install_failed");
  EXPECT_NE(r["result"]["func_return"].get<std::string>().find("RuntimeError: Failed to install no-such-pkg>=1 in E2B sandbox"),
            std::string::npos);
  EXPECT_TRUE(fake_->wait_ended(rec(r)["sandbox_id"]));

  // envd ending the command with deadline_exceeded.
  fake_->fault({{"op", "process"}, {"kind", "deadline_exceeded"}});
  r = d.request(run_tool(src, "f", json::object(), {{"organization_id", "org-net"}, {"pip_requirements", {"requests"}}}));
  EXPECT_EQ(rec(r)["end_reason"], "setup_failed") << r.dump();
  EXPECT_NE(rec(r)["error"].get<std::string>().find("deadline_exceeded"), std::string::npos);
}

// A policies directory of its own: the shipped files, and egress policies
// with rules of their own (warm pools off: these run on E2B only).
std::string policies_with(const std::string& dir, const std::map<std::string, json>& egress_allow) {
  namespace fs = std::filesystem;
  const std::string pol = dir + "/policies";
  fs::create_directories(pol + "/seccomp");
  for (const char* f : {"default.json", "privileged.json", "e2b.json", "seccomp/default.json"})
    fs::copy_file(std::string(TSB_SOURCE_DIR) + "/policies/" + f, pol + "/" + f);
  for (const auto& [name, allow] : egress_allow)
    std::ofstream(pol + "/" + name + ".json") << json{{"version", 1}, {"include", "default.json"}, {"network", "egress"},
                                                      {"egress", {{"allow", allow}}}, {"warm_pool", nullptr}}
                                                     .dump(2);
  return pol;
}

// An E2B sandbox is created with exactly its policy's network: none gives
// no internet; egress gives its hosts and no more; two policies with
// different rules never share a sandbox. The delegated default is the
// entry's e2b_policy.
TEST_F(E2BTest, E2BNetworkIsThePolicysRulesAndNoWider) {
  const std::string dir = "/tmp/tsb-e2b-n-" + tsb::random_hex(4);
  const std::string pol = policies_with(
      dir, {{"web-a", json::array({{{"hosts", {"api.example.com"}}, {"ports", {80, 443}}}})},
            {"web-b", json::array({{{"hosts", {"*.example.org", "b.example.net"}}, {"ports", {443, 80}}}})}});
  std::ofstream(pol + "/organizations.json")
      << json{{"version", 1},
              {"default", {{"policy", "default"}, {"allowed_policies", {"default", "web-a", "web-b"}}, {"e2b_policy", "web-a"}}}}
             .dump(2);
  Daemon d(*fake_, {{"policies_dir", pol}, {"organizations", pol + "/organizations.json"}});
  const json cfg = e2b_config("net");
  auto created = [&](std::size_t i) {  // the i-th create, not a TTL refresh
    std::vector<json> creates;
    for (const auto& r : fake_->requests_where("POST", "/sandboxes"))
      if (r["path"] == "/sandboxes") creates.push_back(json::parse(r["body"].get<std::string>()));
    return i < creates.size() ? creates[i] : json();
  };
  // Delegated and naming none: the entry's e2b_policy, its host only.
  auto a = d.request(run_tool("def f():\n    return 1\n", "f", json::object(), {{"sandbox_config", cfg}}));
  ASSERT_EQ(a["result"]["func_return"], 1) << a.dump() << d.log_text();
  EXPECT_EQ(rec(a)["policy"], "web-a");
  json body = created(0);
  EXPECT_EQ(body["allow_internet_access"], false) << body.dump();
  EXPECT_EQ(body["network"], json::parse(R"({"allowOut": ["api.example.com"], "denyOut": ["0.0.0.0/0"]})")) << body.dump();
  const std::string digest_a = body["metadata"]["tsb_network"];
  EXPECT_EQ(digest_a.size(), 64u);

  // Other rules: another sandbox, created with those rules.
  auto b = d.request(run_tool("def f():\n    return 2\n", "f", json::object(), {{"sandbox_config", cfg}, {"policy", "web-b"}}));
  ASSERT_EQ(b["result"]["func_return"], 2) << b.dump() << d.log_text();
  EXPECT_EQ(rec(b)["sandbox_reused"], false);
  EXPECT_NE(rec(b)["sandbox_id"], rec(a)["sandbox_id"]);
  body = created(1);
  EXPECT_EQ(body["network"], json::parse(R"({"allowOut": ["*.example.org", "b.example.net"], "denyOut": ["0.0.0.0/0"]})"))
      << body.dump();
  EXPECT_NE(body["metadata"]["tsb_network"], digest_a);

  // The first policy again: its own sandbox, reused.
  auto a2 = d.request(run_tool("def f():\n    return 3\n", "f", json::object(), {{"sandbox_config", cfg}, {"policy", "web-a"}}));
  ASSERT_EQ(a2["result"]["func_return"], 3) << a2.dump();
  EXPECT_EQ(rec(a2)["sandbox_id"], rec(a)["sandbox_id"]);
  EXPECT_EQ(rec(a2)["sandbox_reused"], true);

  // No network: no internet, no rules, and never a sandbox with rules.
  auto n = d.request(run_tool("def f():\n    return 4\n", "f", json::object(), {{"sandbox_config", cfg}, {"policy", "default"}}));
  ASSERT_EQ(n["result"]["func_return"], 4) << n.dump();
  EXPECT_EQ(rec(n)["sandbox_reused"], false);
  body = created(2);
  EXPECT_EQ(body["allow_internet_access"], false);
  EXPECT_FALSE(body.contains("network")) << body.dump();
  EXPECT_EQ(body["metadata"]["tsb_network"], kNoNetwork);
  EXPECT_EQ(fake_->creates(), 3u);
  d.stop();
  if (std::system(("rm -rf " + dir).c_str()) != 0) std::fprintf(stderr, "could not remove %s\n", dir.c_str());
}

// A delegated organization allowed a policy whose rules E2B cannot run as
// written: the daemon does not start, and says which rule and why.
TEST_F(E2BTest, E2BDaemonRefusesADelegatedPolicyE2BCannotRun) {
  const std::string dir = "/tmp/tsb-e2b-n-" + tsb::random_hex(4);
  const std::string pol = policies_with(dir, {{"narrow", json::array({{{"hosts", {"api.example.com"}}, {"ports", {443}}}})}});
  std::ofstream(pol + "/organizations.json")
      << json{{"version", 1}, {"default", {{"policy", "default"}, {"allowed_policies", {"default", "narrow"}}}}}.dump(2);
  Daemon d(*fake_, {{"policies_dir", pol}, {"organizations", pol + "/organizations.json"}}, /*expect_start=*/false);
  EXPECT_NE(d.wait_exit(10s), 0);
  EXPECT_NE(d.log_text().find("may run under policy \"narrow\", which E2B cannot run: " + pol +
                              "/narrow.json: /egress/allow/0/ports: egress allow[0] (hosts \"api.example.com\", ports 443)"),
            std::string::npos)
      << d.log_text();
  EXPECT_EQ(fake_->creates(), 0u);
  if (std::system(("rm -rf " + dir).c_str()) != 0) std::fprintf(stderr, "could not remove %s\n", dir.c_str());
}

// What E2B says (an error body's message, a command's stderr in the
// sandbox) reaches the run's error message and the daemon's log escaped:
// a newline and a forged log line, OSC and CSI sequences, BEL, CR, a C1
// control and bytes that are not UTF-8 never come through raw.
TEST_F(E2BTest, E2BMessagesReachTheClientAndTheLogEscaped) {
  Daemon d(*fake_);
  const std::string forged = "boom\n2024-01-01T00:00:00.000 info audit run_id=forged\x1b]0;pwned\x07\x1b[2J\r\xc2\x9b" "31m";
  const auto raw_free = [](const std::string& s) {
    for (char c : s) {
      const auto u = static_cast<unsigned char>(c);
      if ((u < 0x20 && c != '\n') || u == 0x7f || u == 0xff) return false;
    }
    return s.find("\xc2\x9b") == std::string::npos;
  };
  // An error body from the control plane.
  fake_->fault({{"op", "create"}, {"status", 500}, {"message", forged}});
  auto r = d.request(run_tool("def f():\n    return 1\n", "f", json::object(), {{"sandbox_config", e2b_config("esc-1")}}));
  ASSERT_TRUE(r.value("ok", false)) << r.dump();
  std::string msg = r["result"]["func_return"].get<std::string>();
  EXPECT_NE(msg.find("boom\\n2024-01-01T00:00:00.000 info audit run_id=forged\\u001B]0;pwned\\u0007\\u001B[2J\\r\\u009B31m"),
            std::string::npos)
      << msg;
  EXPECT_TRUE(raw_free(msg) && msg.find('\n') == std::string::npos) << msg;
  EXPECT_TRUE(raw_free(rec(r).value("error", ""))) << rec(r).dump();
  // A command's stderr in the sandbox (pip's, or a package's), with bytes
  // that are not UTF-8.
  const std::string noise = forged + "\xff\xfe tail\n";
  fake_->fault({{"op", "process"}, {"kind", "stderr"}, {"stderr_b64", tsb::letta::b64encode(noise)}});
  r = d.request(run_tool("def f():\n    return 1\n", "f", json::object(),
                         {{"organization_id", "org-net"}, {"pip_requirements", {"requests"}}}));
  ASSERT_TRUE(r.value("ok", false)) << r.dump();
  EXPECT_EQ(rec(r)["detail"], "pip_install_failed") << r.dump();
  msg = r["result"]["func_return"].get<std::string>();
  EXPECT_NE(msg.find("boom\\n2024-01-01T00:00:00.000 info audit run_id=forged\\u001B]0;pwned\\u0007"), std::string::npos) << msg;
  EXPECT_TRUE(raw_free(msg) && msg.find('\n') == std::string::npos) << msg;
  EXPECT_TRUE(raw_free(rec(r).value("error", ""))) << rec(r).dump();
  // The daemon's log: one line per event, nothing forged, no sequence.
  const std::string log = d.log_text();
  EXPECT_TRUE(raw_free(log)) << log;
  EXPECT_EQ(log.find("\n2024-01-01T00:00:00.000 info audit run_id=forged"), std::string::npos) << log;
}

TEST_F(E2BTest, E2BFailureModesGiveTheirEndReasonAndTheDaemonKeepsServing) {
  Daemon d(*fake_);
  struct Case {
    json fault;
    const char* end_reason;
    const char* detail;
    const char* exc;
    bool sandbox_killed;
  } cases[] = {
      {{{"op", "create"}, {"status", 401}}, "backend_error", "unauthorized", "AuthenticationException", false},
      {{{"op", "create"}, {"status", 404}}, "backend_error", "not_found", "NotFoundException", false},
      {{{"op", "create"}, {"status", 429}}, "backend_error", "rate_limited", "RateLimitException", false},
      {{{"op", "create"}, {"status", 500}}, "backend_error", "server_error", "SandboxException", false},
      {{{"op", "create"}, {"status", 503}}, "backend_error", "server_error", "SandboxException", false},
      {{{"op", "list"}, {"status", 500}}, "backend_error", "server_error", "SandboxException", false},
      {{{"op", "execute"}, {"status", 502}}, "backend_error", "server_error", "SandboxException", true},
      {{{"op", "execute"}, {"kind", "midstream_502"}}, "backend_error", "stream_error", "SandboxException", true},
      {{{"op", "execute"}, {"kind", "truncate"}}, "backend_error", "stream_error", "SandboxException", true},
  };
  int i = 0;
  for (const auto& c : cases) {
    fake_->fault(c.fault);
    // A fresh config each time: no idle sandbox to reuse.
    auto r = d.request(run_tool("def f():\n    print('partial')\n    return 1\n", "f", json::object(),
                                {{"sandbox_config", e2b_config("fail-" + std::to_string(i++))}}));
    ASSERT_TRUE(r.value("ok", false)) << c.fault.dump() << r.dump();
    EXPECT_EQ(r["result"]["status"], "error") << c.fault.dump();
    EXPECT_EQ(rec(r)["end_reason"], c.end_reason) << c.fault.dump() << r.dump();
    EXPECT_EQ(rec(r)["detail"], c.detail) << c.fault.dump() << r.dump();
    EXPECT_EQ(rec(r)["backend"], "e2b");
    EXPECT_EQ(r["result"]["func_return"].get<std::string>().rfind(std::string("Error executing function f: ") + c.exc + ": ", 0), 0u)
        << r.dump();
    if (c.sandbox_killed) {
      ASSERT_TRUE(rec(r)["sandbox_id"].is_string()) << r.dump();
      EXPECT_TRUE(fake_->wait_ended(rec(r)["sandbox_id"])) << "a sandbox whose stream failed is killed";
    } else {
      EXPECT_TRUE(rec(r)["sandbox_id"].is_null()) << r.dump();
    }
    auto ok = d.request(run_tool("def g():\n    return 'still'\n", "g"));
    EXPECT_EQ(ok["result"]["func_return"], "still") << "after " << c.fault.dump() << ": " << ok.dump() << d.log_text();
  }
  auto st = d.status();
  EXPECT_EQ(st["status"]["totals"].value("backend_error", 0), static_cast<int>(std::size(cases))) << st.dump();
}

TEST_F(E2BTest, E2BConnectErrorWhenTheApiIsUnreachable) {
  // A port nothing listens on.
  int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(s);
  Daemon d(*fake_, {{"e2b", {{"api_url", "http://127.0.0.1:" + std::to_string(ntohs(a.sin_port))}}}});
  auto r = d.request(run_tool("def f():\n    return 1\n", "f"));
  ASSERT_TRUE(r.value("ok", false)) << r.dump();
  EXPECT_EQ(rec(r)["end_reason"], "backend_error");
  EXPECT_EQ(rec(r)["detail"], "connect_error") << r.dump();
  EXPECT_TRUE(d.status().value("ok", false));
}

TEST_F(E2BTest, E2BStalledStreamAndTimeoutKillTheSandbox) {
  Daemon d(*fake_);
  // A stream that goes silent: no heartbeat from the fixed cell either.
  fake_->fault({{"op", "execute"}, {"kind", "stall"}});
  auto t0 = std::chrono::steady_clock::now();
  auto r = d.request(run_tool("def f():\n    return 1\n", "f", json::object(), {{"timeout", 40}}));
  auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(rec(r)["end_reason"], "backend_error") << r.dump();
  EXPECT_EQ(rec(r)["detail"], "stalled");
  EXPECT_LT(took, 30s);
  EXPECT_TRUE(fake_->wait_ended(rec(r)["sandbox_id"]));

  // A tool that runs past its timeout: heartbeats keep the stream alive,
  // the run's deadline ends it with Letta's message.
  t0 = std::chrono::steady_clock::now();
  r = d.request(run_tool("import time\ndef nap():\n    time.sleep(60)\n", "nap", json::object(), {{"timeout", 4}}));
  took = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(rec(r)["end_reason"], "timeout") << r.dump();
  EXPECT_EQ(r["result"]["func_return"], "Error executing function nap: TimeoutError: Executing tool nap timed out after 4.0 seconds.");
  EXPECT_LT(took, 8s);
  EXPECT_TRUE(fake_->wait_ended(rec(r)["sandbox_id"]));

  // A slow tool within its timeout is not mistaken for a stall.
  r = d.request(run_tool("import time\ndef slow():\n    time.sleep(5)\n    return 'done'\n", "slow", json::object(), {{"timeout", 30}}));
  EXPECT_EQ(r["result"]["func_return"], "done") << r.dump();
  EXPECT_EQ(r["result"]["stderr"], json::array()) << "heartbeats never reach the result";
}

TEST_F(E2BTest, E2BOutputLimitAndClientDisconnect) {
  Daemon d(*fake_);
  auto r = d.request(run_tool("def loud():\n    print('x' * (3 << 20))\n", "loud"));
  EXPECT_EQ(rec(r)["end_reason"], "output_limit") << r.dump().substr(0, 2000);
  EXPECT_TRUE(fake_->wait_ended(rec(r)["sandbox_id"]));

  // A half-closed client still gets its answer.
  int hc = d.connect();
  Daemon::send_all(hc, run_tool("import time\ndef nap():\n    time.sleep(1)\n    return 'kept'\n", "nap").dump() + "\n");
  ::shutdown(hc, SHUT_WR);
  auto kept = Daemon::read_line(hc);
  ::close(hc);
  EXPECT_EQ(kept["result"]["func_return"], "kept") << kept.dump();

  int fd = d.connect();
  Daemon::send_all(fd, run_tool("import time\ndef nap():\n    time.sleep(60)\n", "nap").dump() + "\n");
  std::this_thread::sleep_for(1500ms);
  ::close(fd);
  json st;
  for (int i = 0; i < 50; ++i) {
    st = d.status();
    if (st["status"]["totals"].value("cancelled", 0) == 1) break;
    std::this_thread::sleep_for(100ms);
  }
  EXPECT_EQ(st["status"]["totals"].value("cancelled", 0), 1) << st.dump();
  EXPECT_EQ(st["status"]["e2b"]["runs_in_flight"], 0);
  bool killed = false;
  for (int i = 0; i < 50 && !killed; ++i) {
    for (const auto& s : fake_->sandboxes())
      // The napping run reused the half-closed run's sandbox.
      if (s["sandboxID"] == rec(kept)["sandbox_id"] && s["ended_by"] == "kill") killed = true;
    std::this_thread::sleep_for(100ms);
  }
  EXPECT_TRUE(killed) << fake_->sandboxes().dump();
}

TEST_F(E2BTest, E2BBusyBeyondMaxSandboxes) {
  Daemon d(*fake_, {{"e2b", {{"max_sandboxes", 1}}}});
  int hold = d.connect();
  Daemon::send_all(hold, run_tool("import time\ndef nap():\n    time.sleep(3)\n    return 'held'\n", "nap", json::object(),
                                  {{"sandbox_config", e2b_config("A")}})
                             .dump() + "\n");
  std::this_thread::sleep_for(1000ms);
  auto r = d.request(run_tool("def f():\n    return 1\n", "f", json::object(), {{"sandbox_config", e2b_config("B")}}));
  EXPECT_EQ(r["error"]["code"], "busy") << r.dump();
  auto held = Daemon::read_line(hold);
  ::close(hold);
  EXPECT_EQ(held["result"]["func_return"], "held") << held.dump();
  // The idle sandbox of config A makes room for B.
  r = d.request(run_tool("def f():\n    return 1\n", "f", json::object(), {{"sandbox_config", e2b_config("B")}}));
  EXPECT_EQ(r["result"]["func_return"], 1) << r.dump();
  EXPECT_TRUE(fake_->wait_ended(rec(held)["sandbox_id"])) << "evicted";
}

TEST_F(E2BTest, E2BApiKeyNeverLeaves) {
  Daemon d(*fake_);
  const std::string secret_env = "ENV-SECRET-VALUE-123";
  auto r = d.request(run_tool("import os\ndef env():\n    print(dict(os.environ))\n    return dict(os.environ)\n", "env",
                              json::object(), {{"env", {{"MY_SECRET", secret_env}}}}));
  ASSERT_TRUE(r.value("ok", false)) << r.dump();
  const json& env = r["result"]["func_return"];
  EXPECT_EQ(env["MY_SECRET"], secret_env) << r.dump();
  EXPECT_EQ(r.dump().find(kApiKey), std::string::npos) << "the tool saw the API key";
  r = d.request(execute(letta_e2b_script(R"({"results": 1})", "import os\nprint(dict(os.environ))\n"), {{"env", {{"MY_SECRET", secret_env}}}}));
  EXPECT_EQ(r.dump().find(kApiKey), std::string::npos);
  fake_->fault({{"op", "create"}, {"status", 401}});
  d.request(run_tool("def f():\n    return 1\n", "f", json::object(), {{"sandbox_config", e2b_config("401")}}));

  int control = 0, data = 0;
  for (const auto& q : fake_->requests()) {
    std::string plane = q["plane"];
    std::string all_headers = q["headers"].dump();
    if (plane == "control") {
      ++control;
      EXPECT_EQ(q["headers"].value("X-API-KEY", ""), kApiKey) << q.dump();
      EXPECT_EQ(q["body"].get<std::string>().find(kApiKey), std::string::npos);
    } else if (plane == "data") {
      ++data;
      EXPECT_EQ(all_headers.find(kApiKey), std::string::npos) << "the API key went to a sandbox: " << q.dump();
      EXPECT_EQ(q["body"].get<std::string>().find(kApiKey), std::string::npos) << q.dump();
      EXPECT_EQ(q["body"].get<std::string>().find(secret_env), std::string::npos) << "env values travel base64-encoded only";
      EXPECT_NE(q["headers"].value("X-Access-Token", ""), "");
    }
    EXPECT_EQ(q["path"].get<std::string>().find(kApiKey), std::string::npos);
  }
  EXPECT_GT(control, 0);
  EXPECT_GT(data, 0);
  for (const auto& s : fake_->sandboxes()) EXPECT_EQ(s["envVars"], json::object());
  std::string log = d.log_text();
  EXPECT_EQ(log.find(kApiKey), std::string::npos) << log;
  EXPECT_EQ(log.find(secret_env), std::string::npos) << log;
  EXPECT_EQ(log.find("tok_"), std::string::npos) << "an access token was logged: " << log;
}

TEST_F(E2BTest, E2BRefusesAnApiKeyFileOthersCanRead) {
  ::chmod(fake_->key_file().c_str(), 0644);
  {
    Daemon d(*fake_, json::object(), false);
    EXPECT_EQ(d.wait_exit(), 1) << d.log_text();
    std::string log = d.log_text();
    EXPECT_NE(log.find("must not be accessible by group or others"), std::string::npos) << log;
    EXPECT_EQ(log.find(kApiKey), std::string::npos);
  }
  // A reload re-reads the key file; a bad one keeps everything as it was.
  ::chmod(fake_->key_file().c_str(), 0600);
  {
    Daemon d(*fake_);
    // A reload runs the compile helper (seconds in the VM lane): wait for
    // its outcome in the log.
    const auto wait_log = [&](const std::string& needle) {
      for (int i = 0; i < 1500; ++i) {
        if (d.log_text().find(needle) != std::string::npos) return true;
        std::this_thread::sleep_for(20ms);
      }
      return false;
    };
    ::chmod(fake_->key_file().c_str(), 0640);
    ::kill(d.pid(), SIGHUP);
    EXPECT_TRUE(wait_log("keeping the current configuration and policies")) << d.log_text();
    // Refused by the compile helper, so the spawner keeps its set too (the
    // two never part ways on the policies).
    EXPECT_NE(d.log_text().find("e2b.api_key_file: '" + fake_->key_file() + "' must not be accessible"),
              std::string::npos) << d.log_text();
    auto r = d.request(run_tool("def f():\n    return 1\n", "f"));
    EXPECT_EQ(r["result"]["func_return"], 1) << r.dump();
    ::chmod(fake_->key_file().c_str(), 0600);
    ::kill(d.pid(), SIGHUP);
    EXPECT_TRUE(wait_log("e2b: API key reloaded")) << d.log_text();
  }
  ::chmod(fake_->key_file().c_str(), 0644);
  // Under $CREDENTIALS_DIRECTORY (systemd's LoadCredential=) the mode is systemd's business.
  ::setenv("CREDENTIALS_DIRECTORY", fake_->dir().c_str(), 1);
  {
    Daemon d(*fake_);
    ::unsetenv("CREDENTIALS_DIRECTORY");
    EXPECT_TRUE(d.status().value("ok", false)) << d.log_text();
  }
  ::unsetenv("CREDENTIALS_DIRECTORY");
  ::chmod(fake_->key_file().c_str(), 0600);
}

// Pure helpers of the backend; no daemon, no root needed.
TEST(E2BUnit, E2BMetadataQueryAndSandboxUrls) {
  // urlencode({"metadata": "&".join(f"{quote(k)}={quote(v)}")}), as the SDK's paginator builds it.
  EXPECT_EQ(tsb::core::e2b_metadata_param({{"config_state", "4840"}}), "metadata=config_state%3D4840");
  EXPECT_EQ(tsb::core::e2b_metadata_param({{"config_state", "1"}, {"tsb_network", "none"}}),
            "metadata=config_state%3D1%26tsb_network%3Dnone");
  EXPECT_EQ(tsb::core::e2b_metadata_param({{"k y", "a/b&c=d"}}), "metadata=k%2520y%3Da%2Fb%2526c%253Dd");
  tsb::core::E2BConfig cfg;
  EXPECT_EQ(tsb::core::e2b_sandbox_base_url(cfg, "sbx1", 49999, ""), "https://49999-sbx1.e2b.app");
  EXPECT_EQ(tsb::core::e2b_sandbox_base_url(cfg, "sbx1", 49983, "eu.e2b.dev"), "https://49983-sbx1.eu.e2b.dev");
  cfg.sandbox_url = "http://127.0.0.1:1234/sbx/{id}/{port}/";
  EXPECT_EQ(tsb::core::e2b_sandbox_base_url(cfg, "sbx1", 49999, "ignored"), "http://127.0.0.1:1234/sbx/sbx1/49999");
  // The tool cell is fixed code with one base64 literal.
  std::string cell = tsb::core::e2b_tool_cell("QUJD");
  EXPECT_NE(cell.find("_tsb_tool_cell(\"QUJD\")"), std::string::npos);
  EXPECT_EQ(cell.find("@BLOB@"), std::string::npos);
  EXPECT_EQ(cell.find("os.environ["), std::string::npos);
}
