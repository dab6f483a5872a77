#include "tests/integration/harness.h"

#include <dirent.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/stat.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

namespace tsb::testing {

std::unique_ptr<isolate::Engine> EngineTest::engine_;
std::unique_ptr<core::Policy> EngineTest::policy_;
std::string EngineTest::skip_reason_;

bool must_run_root() {
  const char* ci = std::getenv("CI");
  const char* must = std::getenv("TOOLSANDBOXD_TESTS_MUST_RUN");
  return (ci && std::string(ci) == "true") || (must && std::string(must).find("root") != std::string::npos);
}

void EngineTest::SetUpTestSuite() {
  if (engine_ || !skip_reason_.empty()) return;
  if (::geteuid() != 0) {
    skip_reason_ = "the root integration tier needs root (namespaces, cgroups, id maps); run scripts/test.sh as root";
    return;
  }
  if (!std::getenv("TSB_GUARD"))
    std::fprintf(stderr, "WARNING: integration tests running outside the outer guard (tests/guard/run-guarded)\n");
  isolate::EngineConfig cfg;
  const char* parent = std::getenv("TSB_CGROUP_PARENT");
  cfg.cgroup_parent = parent ? parent : "/toolsandbox-test";
  cfg.state_dir = "/run/toolsandbox-test";
  cfg.init_path = std::string(TSB_BIN_DIR) + "/toolsandbox-init";
  auto e = isolate::Engine::create(cfg);
  if (!e.ok()) {
    skip_reason_ = "cannot create the engine: " + e.error().message;
    return;
  }
  engine_ = std::move(e).value();
  core::PolicyContext ctx;
  auto p = core::load_policy(std::string(TSB_SOURCE_DIR) + "/policies/default.json", ctx);
  if (!p.ok()) {
    skip_reason_ = "cannot load policies/default.json: " + p.error().message;
    engine_.reset();
    return;
  }
  policy_ = std::make_unique<core::Policy>(std::move(p).value());
  struct stat st{};
  if (::stat(policy_->venv.c_str(), &st) != 0) {
    skip_reason_ = "the default venv " + policy_->venv + " is missing (scripts/test.sh creates it)";
    engine_.reset();
  }
}

void EngineTest::TearDownTestSuite() {}

void EngineTest::SetUp() {
  if (!skip_reason_.empty()) {
    if (must_run_root()) FAIL() << "root tier must run here but cannot: " << skip_reason_;
    GTEST_SKIP() << "SKIPPED root integration test: " << skip_reason_;
  }
}

isolate::RunSpec EngineTest::spec(std::vector<std::string> argv) const {
  isolate::RunSpec s = core::run_spec_from(*policy_);
  auto env = core::build_environment(*policy_, {});
  s.env = *env;
  s.argv = std::move(argv);
  s.binds.push_back({std::string(TSB_BIN_DIR) + "/tsb-probe", kProbe, false, false});
  return s;
}

isolate::RunSpec EngineTest::probe_spec(std::vector<std::string> args) const {
  args.insert(args.begin(), kProbe);
  return spec(std::move(args));
}

std::vector<nlohmann::json> parse_lines(const std::string& out) {
  std::vector<nlohmann::json> v;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded()) v.push_back(std::move(j));
  }
  return v;
}

std::vector<nlohmann::json> EngineTest::probe(std::vector<std::string> args) const {
  auto r = run(probe_spec(std::move(args)));
  EXPECT_EQ(r.reason, isolate::EndReason::Exited) << describe(r);
  return parse_lines(r.stdout_data);
}

nlohmann::json EngineTest::probe1(std::vector<std::string> args) const {
  auto v = probe(std::move(args));
  EXPECT_EQ(v.size(), 1u);
  return v.empty() ? nlohmann::json() : v[0];
}

std::vector<pid_t> host_pids_with_uid_in(std::uint32_t lo, std::uint32_t hi) {
  std::vector<pid_t> out;
  DIR* d = ::opendir("/proc");
  if (!d) return out;
  while (dirent* e = ::readdir(d)) {
    pid_t pid = std::atoi(e->d_name);
    if (pid <= 0) continue;
    std::ifstream st(std::string("/proc/") + e->d_name + "/status");
    std::string line;
    while (std::getline(st, line)) {
      if (line.rfind("Uid:", 0) == 0) {
        std::uint32_t uid = static_cast<std::uint32_t>(std::stoul(line.substr(4)));
        if (uid >= lo && uid < hi) out.push_back(pid);
        break;
      }
    }
  }
  ::closedir(d);
  return out;
}

int connect_unix(const std::string& socket_path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  if (fd < 0 || socket_path.size() >= sizeof a.sun_path) {
    if (fd >= 0) ::close(fd);
    return -1;
  }
  std::memcpy(a.sun_path, socket_path.c_str(), socket_path.size() + 1);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

void send_all(int fd, const std::string& bytes) {
  std::size_t off = 0;
  while (off < bytes.size()) {
    ssize_t n = ::send(fd, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return;
    off += static_cast<std::size_t>(n);
  }
}

nlohmann::json read_json_line(int fd) {
  std::string out;
  char c;
  while (::read(fd, &c, 1) == 1) {
    if (c == '\n') return nlohmann::json::parse(out, nullptr, false);
    out += c;
  }
  return nlohmann::json();
}

nlohmann::json request_once(const std::string& socket_path, const nlohmann::json& req) {
  int fd = connect_unix(socket_path);
  if (fd < 0) return nlohmann::json();
  send_all(fd, req.dump() + "\n");
  nlohmann::json r = read_json_line(fd);
  ::close(fd);
  return r;
}

nlohmann::json run_tool_request(const std::string& src, const std::string& name, nlohmann::json args,
                                nlohmann::json extra) {
  nlohmann::json r = {{"v", 1}, {"id", "t1"}, {"type", "run_tool"}, {"tool_name", name}, {"organization_id", "org-a"},
                      {"source_code", src}, {"args", args}};
  for (auto it = extra.begin(); it != extra.end(); ++it) r[it.key()] = it.value();
  return r;
}

nlohmann::json execute_request(const std::string& script, nlohmann::json extra) {
  nlohmann::json r = {{"v", 1}, {"id", "e1"}, {"type", "execute"}, {"tool_name", "t"}, {"organization_id", "org-a"},
                      {"script", script}};
  for (auto it = extra.begin(); it != extra.end(); ++it) r[it.key()] = it.value();
  return r;
}

std::string describe(const isolate::RunResult& r) {
  std::ostringstream s;
  s << "end=" << isolate::to_string(r.reason) << " exit=" << r.exit_code << " signal=" << r.signal
    << " error='" << r.error << "' stdout='" << r.stdout_data.substr(0, 2000) << "' stderr='"
    << r.stderr_data.substr(0, 2000) << "'";
  return s.str();
}

}  // namespace tsb::testing
