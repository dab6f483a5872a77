// Plain data into the engine: what to run (RunSpec). What happened is
// isolate/supervise/outcome.h (RunResult), made outside the root process.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "isolate/engine/fs.h"
#include "isolate/engine/stage.h"

namespace tsb::isolate {

struct SeccompProgram;  // isolate/engine/seccomp.h

// None: a network namespace of its own with only lo. Egress: the same, plus
// a listening socket in it (127.0.0.1:kEgressProxyPort, isolate/engine/plan.h)
// handed to the front end, whose proxy is the only way out. Host: the
// host's namespace.
enum class NetworkMode : std::uint8_t { None, Host, Egress };

struct BindMount {
  std::string source;  // absolute host path
  std::string target;  // absolute path inside the sandbox
  bool writable = false;
  bool optional = false;  // skip silently when the source does not exist
};

// Every limit is enforced; 0 never means "unlimited" except where noted.
struct Limits {
  std::uint64_t memory_bytes = 512ull << 20;  // cgroup memory.max, swap 0
  std::uint64_t pids = 64;                    // cgroup pids.max (all processes of the run)
  std::uint32_t cpu_quota_millicpus = 1000;   // cgroup cpu.max; 1000 = one CPU
  std::chrono::milliseconds cpu_time{60'000}; // CPU time of the whole run (0 = none)
  std::chrono::milliseconds wall_timeout{60'000};
  std::uint64_t tmp_bytes = 64ull << 20;      // tmpfs /tmp (the file-system table sizes it)
  std::uint64_t work_bytes = 64ull << 20;     // tmpfs working dir (likewise)
  std::uint64_t file_size_bytes = 64ull << 20;  // RLIMIT_FSIZE
  std::uint64_t open_files = 256;             // RLIMIT_NOFILE
  std::uint64_t stdout_bytes = 1ull << 20;    // capture cap; beyond it the run ends
  std::uint64_t stderr_bytes = 1ull << 20;
};

struct RunSpec {
  std::vector<std::string> argv;   // argv[0]: absolute, or searched in the env's PATH
  std::vector<std::string> env;    // exactly the tool's environment, "KEY=VALUE"
  std::string stdin_data;          // bytes fed to the tool's stdin, then EOF
  // stdin is one end of a stream socket pair instead of a pipe: the tool
  // mode's result channel (daemon/frontend/letta/letta.h), read and written both ways.
  // (Every tool-mode run has it: a venv build's builder too, which reads
  // its stdin to EOF as it would a pipe's.)
  bool stdin_socket = false;
  // The tool gets fd 3, the write end of a pipe to pid 1: one byte on it is
  // the tool's exit status, and the run ends then, before the process's
  // own teardown (isolate/init/init.cc, "end note"). The runner of a warm
  // sandbox, and script mode's launcher, write it
  // (isolate/runner/_toolsandbox_runner/lean_exit.py).
  bool end_note = false;
  // The file system, row by row (daemon/policy/fs_table.h builds it): required.
  std::shared_ptr<const FsTable> fs;
  NetworkMode network = NetworkMode::None;
  std::shared_ptr<const SeccompProgram> seccomp;  // required: compiled once per policy
  std::uint32_t sandbox_uid = 1000;  // the tool's ids inside the sandbox
  std::uint32_t sandbox_gid = 1000;
  std::string hostname = "sandbox";
  std::string workdir = "/work";
  Limits limits;
};

// Fixed paths inside every sandbox.
inline constexpr std::string_view kVenvPath = "/venv";
inline constexpr std::string_view kNodeModulesPath = "/node_modules";  // a TypeScript tool's own, read-only

}  // namespace tsb::isolate
