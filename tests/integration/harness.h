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

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "daemon/core/policy.h"
#include "isolate/engine.h"

namespace tsb::testing {

inline constexpr const char* kProbe = "/opt/tsb/tsb-probe";

// True when skipping is not allowed (CI=true, or TOOLSANDBOXD_TESTS_MUST_RUN
// lists "root"): a missing prerequisite is then a failure.
bool must_run_root();

class EngineTest : public ::testing::Test {
 public:
  static void SetUpTestSuite();
  static void TearDownTestSuite();

 protected:
  void SetUp() override;

  // A spec from the default policy, running argv, with the probe bound in.
  isolate::RunSpec spec(std::vector<std::string> argv) const;
  isolate::RunSpec probe_spec(std::vector<std::string> args) const;
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

}  // namespace tsb::testing
