// Plain data in and out of the engine: what to run (RunSpec) and what
// happened (RunResult). No behaviour lives here.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "isolate/fs.h"
#include "isolate/stage.h"

namespace tsb::isolate {

struct SeccompProgram;  // isolate/seccomp.h

enum class NetworkMode { None, Host };

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
  // The file system, row by row (isolate/fs_table.h builds it): required.
  std::shared_ptr<const FsTable> fs;
  NetworkMode network = NetworkMode::None;
  std::shared_ptr<const SeccompProgram> seccomp;  // required: compiled once per policy
  std::uint32_t sandbox_uid = 1000;  // the tool's ids inside the sandbox
  std::uint32_t sandbox_gid = 1000;
  std::string hostname = "sandbox";
  std::string workdir = "/work";
  Limits limits;
  std::string label;  // free text for logs and the cgroup leaf name suffix (sanitised)
};

enum class EndReason {
  Exited,       // the tool exited on its own (see exit_code)
  Signaled,     // the tool was killed by a signal it did not get from us
  Timeout,      // wall-clock limit reached; the whole tree was killed
  MemoryLimit,  // the cgroup OOM killer fired
  PidsLimit,    // the tool failed after hitting pids.max
  CpuLimit,     // CPU time limit reached
  OutputLimit,  // stdout or stderr went past its cap; the run was ended
  SetupFailed,  // the sandbox could not be built; see setup_stage/setup_errno
  Cancelled,    // the caller asked to stop the run (client gone, shutdown)
};

std::string_view to_string(EndReason r) noexcept;

struct RunResult {
  std::string run_id;
  EndReason reason = EndReason::SetupFailed;
  int exit_code = -1;  // valid when the tool exited
  int signal = 0;      // valid when the tool was killed by a signal
  Stage setup_stage = Stage::None;
  int setup_errno = 0;
  std::string error;   // human sentence for SetupFailed and engine errors
  std::chrono::nanoseconds wall{0};
  std::chrono::nanoseconds cpu{0};     // whole cgroup, user + system
  std::uint64_t peak_memory_bytes = 0; // 0 when the kernel cannot tell
  std::string stdout_data;
  std::string stderr_data;
  bool stdout_truncated = false;
  bool stderr_truncated = false;
  std::uint64_t stdout_total_bytes = 0;  // bytes the tool wrote (up to the end of the run)
  std::uint64_t stderr_total_bytes = 0;
  std::uint32_t host_uid = 0;            // base of the host id range the run used
};

// Fixed paths inside every sandbox.
inline constexpr std::string_view kVenvPath = "/venv";

}  // namespace tsb::isolate
