// Drives one sandbox to its end on an Asio event loop: feeds stdin,
// collects stdout/stderr under their caps, enforces the wall-clock and CPU
// limits, watches pid 1 through its pidfd (no SIGCHLD), then reaps, reads
// the reports and the cgroup's counters, removes the leaf, and returns the
// RunResult. Single-threaded io_context; nothing here blocks for long.
#pragma once

#include <asio/awaitable.hpp>
#include <asio/any_io_executor.hpp>
#include <memory>
#include <string>

#include "isolate/engine.h"
#include "isolate/spec.h"

namespace tsb::isolate {

// `sandbox` is shared so the caller can cancel() the run from elsewhere
// (a client that went away, shutdown). stdin_data is written then closed.
asio::awaitable<RunResult> supervise(std::shared_ptr<Sandbox> sandbox, std::string stdin_data);

// Pure part of the result: what ended the run, from what was observed.
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

}  // namespace tsb::isolate
