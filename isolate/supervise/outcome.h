// How a run ended: what the supervisor observed (the root spawner's, or the
// blocking one of isolate/supervise/supervise.h), and the end reason and sentence
// made of it. The spawner sends the observations; the front end (or the
// command line) classifies them: the root process names no end reason.
#pragma once

#include <cstdint>
#include <string>

#include "isolate/base/result.h"
#include "isolate/engine/engine.h"
#include "isolate/engine/spec.h"

namespace tsb::isolate {

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

// Short stable name of a set-up stage (isolate/engine/stage.h), used in
// results and logs ("mount-proc").
const char* stage_name(Stage s) noexcept;

// What the tool's Landlock domain was, from its report (isolate/engine/stage.h):
// "abi7:fs,net,scope" (the kernel's ABI and the layers applied),
// "unavailable" (a kernel without Landlock), "off" (turned off), "-" (no
// report: the run ended before its tool was set up).
std::string landlock_summary(int report);

struct RunResult {
  std::string run_id;
  EndReason reason = EndReason::SetupFailed;
  int exit_code = -1;  // valid when the tool exited
  int signal = 0;      // valid when the tool was killed by a signal
  Stage setup_stage = Stage::None;
  int setup_errno = 0;
  std::string setup_path;  // the sandbox path of the set-up step that failed, when one did (raw: quote it to show it)
  std::vector<std::string> moved_aside;  // what the set-up moved out of mount points' way, and where
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
  int landlock = -1;                     // the tool's Landlock report (landlock_summary)
};

// The end reason and sentence, from what was observed.
void classify(const Observations& o, RunResult& r);

// A RunResult for a run that never started (spawn failed).
RunResult setup_failure_result(const Error& err);

}  // namespace tsb::isolate
