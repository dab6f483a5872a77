// Shared fixture of the root integration tests: one Engine per test binary,
// the default policy from the source tree, and the in-sandbox probe bound
// read-only at /opt/tsb/tsb-probe.
//
// These tests create real sandboxes and run hostile payloads (fork bombs,
// memory hogs, kill(-1)). Run them only inside the outer guard
// (tests/guard/run-guarded), which scripts/test.sh does.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "daemon/policy/policy.h"
#include "isolate/engine/engine.h"
#include "isolate/supervise/outcome.h"

namespace tsb::testing {

inline constexpr const char* kProbeDir = "/opt/tsb";
inline constexpr const char* kProbe = "/opt/tsb/tsb-probe";
// A Python program that queues argv[1] bytes in loopback TCP connections
// nobody reads, prints how many it queued, and exits, or with argv[2]
// "hold" sleeps 30 s keeping them queued (the socket-buffer limit tests).
inline constexpr const char* kQueueLoopbackTcp = R"PY(
import socket, sys, errno, time
target, hold = int(sys.argv[1]), sys.argv[2] == "hold"
srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(256)
conns, queued, chunk = [], 0, b"x" * 65536
try:
    for i in range(400):
        c = socket.create_connection(srv.getsockname())
        a, _ = srv.accept()
        c.setblocking(False)
        conns.append((c, a))
        while queued < target:
            try:
                queued += c.send(chunk[:target - queued])
            except (BlockingIOError, InterruptedError):
                break
            except OSError as e:
                if e.errno in (errno.ENOBUFS, errno.ENOMEM): break
                raise
        if queued >= target: break
except OSError as e:
    print("stopped", e.errno, file=sys.stderr)
print(queued, flush=True)
if hold: time.sleep(30)
)PY";
// The host directory holding a copy of the probe (made by EngineTest).
std::string probe_dir();

// True when skipping is not allowed (CI=true, or TOOLSANDBOXD_TESTS_MUST_RUN
// lists "root"): a missing prerequisite is then a failure.
bool must_run_root();

class EngineTest : public ::testing::Test {
 public:
  static void SetUpTestSuite();
  static void TearDownTestSuite();

 protected:
  void SetUp() override;

  // A spec from the default policy, running argv, with the probe bound in;
  // `edit_fs` changes what its file-system table is built from.
  isolate::RunSpec spec(std::vector<std::string> argv,
                        const std::function<void(isolate::FsInputs&)>& edit_fs = nullptr) const;
  isolate::RunSpec probe_spec(std::vector<std::string> args,
                              const std::function<void(isolate::FsInputs&)>& edit_fs = nullptr) const;
  isolate::RunResult run(const isolate::RunSpec& s) const { return engine_->run(s); }
  // Runs the probe and parses each stdout line as JSON.
  std::vector<nlohmann::json> probe(std::vector<std::string> args) const;
  nlohmann::json probe1(std::vector<std::string> args) const;

  static std::unique_ptr<isolate::Engine> engine_;
  static std::unique_ptr<core::Policy> policy_;
  static std::string skip_reason_;
};

std::vector<nlohmann::json> parse_lines(const std::string& out);

// Talking to a daemon under test over its Unix socket.
int connect_unix(const std::string& socket_path);  // -1 when refused
void send_all(int fd, const std::string& bytes);
nlohmann::json read_json_line(int fd);               // null on EOF before a newline
nlohmann::json request_once(const std::string& socket_path, const nlohmann::json& req);
// Protocol v1 requests for organization "org-a"; `extra` fields are merged in.
nlohmann::json run_tool_request(const std::string& src, const std::string& name, nlohmann::json args,
                                nlohmann::json extra = nlohmann::json::object());
nlohmann::json execute_request(const std::string& script, nlohmann::json extra = nlohmann::json::object());
// Host processes whose real uid falls in [lo, hi).
std::vector<pid_t> host_pids_with_uid_in(std::uint32_t lo, std::uint32_t hi);
std::string describe(const isolate::RunResult& r);

// Waits until a daemon answers a status request on socket_path. The socket
// file existing is not enough (a daemon that binds before it listens
// refuses connections in between), nor is a connect alone (the daemon may
// not serve yet). False after `max`, or as soon as process `pid` has exited.
bool wait_for_daemon(const std::string& socket_path, pid_t pid, std::chrono::milliseconds max);

// How TestDaemon starts the daemon process.
struct DaemonOptions {
  std::string cgroup_procs;  // a cgroup.procs file the daemon joins before exec ("": stays)
  unsigned long open_files = 0;  // RLIMIT_NOFILE, soft and hard, for the daemon (0: inherited)
  bool wait_ready = true;    // wait_for_daemon in the constructor (a failure is reported)
};

// The real toolsandboxd (TSB_BIN_DIR) on a temporary socket, with a
// configuration for the test machine (the source tree's policies, a test
// cgroup parent and state directory), with `extra` merged in (RFC 7396:
// objects key by key, a null removes a key). Stopped with SIGTERM when destroyed; its directory is removed
// unless TSB_TEST_KEEP=1.
class TestDaemon {
 public:
  explicit TestDaemon(nlohmann::json extra = nlohmann::json::object(), DaemonOptions opts = {});
  ~TestDaemon();
  TestDaemon(const TestDaemon&) = delete;
  TestDaemon& operator=(const TestDaemon&) = delete;

  int connect() const { return connect_unix(socket_); }
  static void send_all(int fd, const std::string& s) { tsb::testing::send_all(fd, s); }
  static nlohmann::json read_line(int fd) { return read_json_line(fd); }
  nlohmann::json request(const nlohmann::json& req) const { return request_once(socket_, req); }
  nlohmann::json status() const;  // the status payload, or null
  // Sends `bytes` on a new connection (then shutdown(SHUT_WR) if asked) and
  // returns the first answer line.
  nlohmann::json raw(const std::string& bytes, bool shut_write = false) const;
  std::string log_text() const;
  pid_t pid() const { return pid_; }
  bool alive() const;  // not exited (checked without reaping)
  void stop();         // SIGTERM and wait; idempotent
  const std::string& config_path() const { return config_; }
  const std::string& socket_path() const { return socket_; }
  const std::string& dir() const { return dir_; }
  const nlohmann::json& config() const { return cfg_; }
  void write_config(const nlohmann::json& cfg);  // the file only: SIGHUP to apply

 private:
  std::string dir_, socket_, config_;
  nlohmann::json cfg_;
  pid_t pid_ = -1;
};

}  // namespace tsb::testing
