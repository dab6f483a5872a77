// How a run ended, from what was observed: shared by every supervisor
// (the blocking one of isolate/supervise.h and the root spawner's). No I/O
// but the read of the sandbox's report pipe.
#pragma once

#include <cstdint>

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
};
void classify(const Observations& o, RunResult& r);

// Reads the reports the sandbox's init and child wrote (isolate/stage.h) on
// the report pipe, after pid 1 has exited.
void read_reports(int fd, Observations& o);

}  // namespace tsb::isolate
