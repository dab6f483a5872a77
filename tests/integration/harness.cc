#include "daemon/compile/spawn_policy.h"
#include "tests/integration/harness.h"
#include "daemon/policy/seccomp_profile.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "isolate/base/random.h"
#include "daemon/compile/host.h"

namespace tsb::testing {

std::unique_ptr<isolate::Engine> EngineTest::engine_;
std::unique_ptr<core::Policy> EngineTest::policy_;
std::string EngineTest::skip_reason_;

std::string probe_dir() { return "/run/toolsandbox-test-probe"; }

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
  auto e = policy::create_engine(cfg);
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
  // The probe is shown to sandboxes through its own directory (a view, like
  // any read-only host directory), not as a file bind: a bind would show
  // its host path in the sandbox's mountinfo, which the posture tests check.
  {
    const std::string dir = probe_dir();
    ::mkdir(dir.c_str(), 0755);
    ::chmod(dir.c_str(), 0755);
    std::ifstream src(std::string(TSB_BIN_DIR) + "/tsb-probe", std::ios::binary);
    std::ofstream dst(dir + "/tsb-probe", std::ios::binary | std::ios::trunc);
    dst << src.rdbuf();
    dst.close();
    ::chmod((dir + "/tsb-probe").c_str(), 0755);
  }
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

isolate::RunSpec EngineTest::spec(std::vector<std::string> argv,
                                   const std::function<void(isolate::FsInputs&)>& edit_fs) const {
  isolate::RunSpec s = core::run_spec_from(*policy_);
  auto env = core::build_environment(*policy_, {});
  s.env = *env;
  s.argv = std::move(argv);
  isolate::FsInputs in = core::fs_inputs_from(*policy_);
  in.binds.push_back({probe_dir(), kProbeDir, false, false});
  if (edit_fs) edit_fs(in);
  auto table = isolate::build_fs_table(in);
  EXPECT_TRUE(table.ok()) << table.error().message;
  if (table.ok()) s.fs = std::move(table).value();
  return s;
}

isolate::RunSpec EngineTest::probe_spec(std::vector<std::string> args,
                                         const std::function<void(isolate::FsInputs&)>& edit_fs) const {
  args.insert(args.begin(), kProbe);
  return spec(std::move(args), edit_fs);
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

namespace {

bool exited_without_reaping(pid_t pid) {
  siginfo_t si{};
  return ::waitid(P_PID, static_cast<id_t>(pid), &si, WEXITED | WNOHANG | WNOWAIT) == 0 && si.si_pid == pid;
}

// One status exchange with a deadline for the answer. Any answer counts
// (a daemon that refuses this peer answers `unauthorized`).
bool answers_status(const std::string& socket_path, std::chrono::milliseconds max) {
  int fd = connect_unix(socket_path);
  if (fd < 0) return false;
  send_all(fd, "{\"v\":1,\"id\":\"ready\",\"type\":\"status\"}\n");
  std::string got;
  auto until = std::chrono::steady_clock::now() + max;
  while (got.find('\n') == std::string::npos) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
    pollfd p{fd, POLLIN, 0};
    if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0) break;
    char b[4096];
    ssize_t n = ::read(fd, b, sizeof b);
    if (n <= 0) break;
    got.append(b, static_cast<std::size_t>(n));
  }
  ::close(fd);
  auto j = nlohmann::json::parse(got.substr(0, got.find('\n')), nullptr, false);
  return j.is_object() && j.contains("ok");
}

}  // namespace

bool wait_for_daemon(const std::string& socket_path, pid_t pid, std::chrono::milliseconds max) {
  auto until = std::chrono::steady_clock::now() + max;
  while (std::chrono::steady_clock::now() < until) {
    if (pid > 0 && exited_without_reaping(pid)) return false;
    struct stat st{};
    if (::stat(socket_path.c_str(), &st) == 0 && answers_status(socket_path, std::chrono::seconds(5))) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

TestDaemon::TestDaemon(nlohmann::json extra, DaemonOptions opts) {
  dir_ = "/tmp/tsb-e2e-" + random_hex(4);
  ::mkdir(dir_.c_str(), 0755);
  socket_ = dir_ + "/d.sock";
  const char* parent = std::getenv("TSB_CGROUP_PARENT");
  cfg_ = {{"version", 1},
          {"socket", {{"path", socket_}}},
          {"request_timeout", "5s"},
          {"shutdown_grace", "2s"},
          {"engine", {{"state_dir", "/run/tsb-e2e"},
                      {"cgroup_parent", std::string(parent ? parent : "/toolsandbox-test") + "-e2e"},
                      {"init", std::string(TSB_BIN_DIR) + "/toolsandbox-init"}}},
          // The shipped policies, from the source tree.
          {"policies_dir", std::string(TSB_SOURCE_DIR) + "/policies"},
          {"organizations", std::string(TSB_SOURCE_DIR) + "/policies/organizations.json"}};
  cfg_.merge_patch(extra);  // objects merge key by key; a null removes a key
  config_ = dir_ + "/config.json";
  write_config(cfg_);
  std::string log = dir_ + "/log";
  std::string bin = std::string(TSB_BIN_DIR) + "/toolsandboxd";
  pid_ = ::fork();
  if (pid_ == 0) {
    if (!opts.cgroup_procs.empty()) {
      int cg = ::open(opts.cgroup_procs.c_str(), O_WRONLY | O_CLOEXEC);
      if (cg < 0 || ::write(cg, "0", 1) != 1) ::_exit(126);
      ::close(cg);
    }
    if (opts.open_files) {
      rlimit rl{opts.open_files, opts.open_files};
      if (::setrlimit(RLIMIT_NOFILE, &rl) != 0) ::_exit(126);
    }
    int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    ::execl(bin.c_str(), bin.c_str(), "--config", config_.c_str(), nullptr);
    ::_exit(127);
  }
  // Up to 30 s: the VM lane is slow.
  if (opts.wait_ready && !wait_for_daemon(socket_, pid_, std::chrono::seconds(30)))
    ADD_FAILURE() << "daemon did not start: " << log_text();
}

TestDaemon::~TestDaemon() {
  stop();
  const char* keep = std::getenv("TSB_TEST_KEEP");
  if (!(keep && std::string(keep) == "1")) (void)!std::system(("rm -rf " + dir_).c_str());
}

void TestDaemon::stop() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGTERM);
  int st;
  ::waitpid(pid_, &st, 0);
  pid_ = -1;
}

bool TestDaemon::alive() const { return pid_ > 0 && !exited_without_reaping(pid_); }

nlohmann::json TestDaemon::status() const {
  auto r = request({{"v", 1}, {"id", "s"}, {"type", "status"}});
  return r.is_object() && r.contains("status") ? r["status"] : nlohmann::json();
}

nlohmann::json TestDaemon::raw(const std::string& bytes, bool shut_write) const {
  int fd = connect();
  if (fd < 0) return nlohmann::json();
  send_all(fd, bytes);
  if (shut_write) ::shutdown(fd, SHUT_WR);
  nlohmann::json r = read_line(fd);
  ::close(fd);
  return r;
}

std::string TestDaemon::log_text() const {
  std::ifstream in(dir_ + "/log");
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void TestDaemon::write_config(const nlohmann::json& cfg) {
  std::string tmp = config_ + ".new";
  std::ofstream(tmp) << cfg.dump(2);
  ::rename(tmp.c_str(), config_.c_str());
  if (&cfg != &cfg_) cfg_ = cfg;
}

}  // namespace tsb::testing
