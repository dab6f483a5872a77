// How a run ended: what the supervisor observed (the root spawner's, or the
// blocking one of isolate/supervise.h), and the end reason and sentence
// made of it. The spawner sends the observations; the front end (or the
// command line) classifies them: the root process names no end reason.
#pragma once

#include <cstdint>
#include <string>

#include "isolate/base/result.h"
#include "isolate/spec.h"

namespace tsb::isolate {

// What ended the run, from what was observed.
struct Observations {
  bool have_tool_status = false;
  int tool_status = 0;  // raw wait status of the tool
  bool have_setup_error = false;
  int setup_stage = 0;
  int setup_errno = 0;
  bool timed_out = false;
  bool output_exceeded = false;
  bool cpu_exceeded = false;
  bool cancelled = false;
  bool backstop = false;     // the sandbox's init ended the run at its own wall-clock fence
  int backstop_s = 0;
  std::uint64_t oom_kills = 0;
  std::uint64_t pids_max_hits = 0;
  bool socket_limit_reached = false;  // v1: socket buffers reached the run's memory limit
  std::string engine_error;  // the engine could not start the run: why (nothing ran)
  int engine_errno = 0;
  std::string cleanup_error;  // the run's cgroup leaf could not be removed: why
};
void classify(const Observations& o, RunResult& r);

// A RunResult for a run that never started (spawn failed).
RunResult setup_failure_result(const Error& err);

}  // namespace tsb::isolate
