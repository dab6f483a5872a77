// The one mount table: what every sandbox's file system is made of, with a
// reason per row (isolate/engine/fs.h says who executes which row). Pure: it reads
// nothing of the host, so the table, and `policy explain`'s page of it,
// depend only on the policy.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "isolate/base/result.h"
#include "isolate/engine/fs.h"
#include "isolate/engine/spec.h"

namespace tsb::isolate {

// What a policy (or `toolsandbox run`'s options) says about the file system.
struct FsInputs {
  std::string venv;              // host venv directory, shown read-only at kVenvPath ("" = none)
  std::vector<BindMount> binds;  // extra host paths, after the system ones
  std::string runner;            // host path of the trusted tool runner ("" = none), at kRunnerSandboxPath
  // Host paths of the runner's other files, each below the runner's own
  // directory: the modules of its package and every module's compiled
  // bytecode (<dir>/__pycache__/<stem>.<tag>.pyc beside the module), .py
  // and .pyc files only. Each is shown at its path below that directory
  // under kRunnerSandboxDir.
  std::vector<std::string> runner_files;
  std::string workdir = "/work";
  std::string hostname = "sandbox";
  std::uint32_t uid = 1000, gid = 1000;  // the tool's ids inside the sandbox
  NetworkMode network = NetworkMode::None;  // which /etc files TLS and name resolution need
  std::uint64_t root_bytes = 1u << 20;   // the root tmpfs, before the copies
  std::uint64_t tmp_bytes = 64ull << 20;
  std::uint64_t work_bytes = 64ull << 20;
};

// The table for `in`, or why the inputs cannot make one (a path that is not
// absolute and normalised, a hostname of the wrong size).
Result<std::shared_ptr<const FsTable>> build_fs_table(const FsInputs& in);

// Validate a sandbox-side path: absolute, normalised, no "..", no "//".
Status check_sandbox_path(const std::string& p, const char* what);

// Where the trusted tool runner appears inside a sandbox.
inline constexpr std::string_view kRunnerSandboxDir = "/opt/toolsandbox/runner";
inline constexpr std::string_view kRunnerSandboxPath = "/opt/toolsandbox/runner/toolsandbox_runner.py";

}  // namespace tsb::isolate
