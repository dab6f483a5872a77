#include "isolate/supervise/outcome.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>

#include "isolate/engine/stage.h"

namespace tsb::isolate {

void classify(const Observations& o, RunResult& r) {
  r.landlock = o.landlock;
  // The engine could not start the run: nothing ran.
  if (!o.engine_error.empty()) {
    r.reason = EndReason::SetupFailed;
    r.setup_errno = o.engine_errno;
    r.error = o.engine_error;
    return;
  }
  r.moved_aside = o.moved_aside;
  if (o.have_tool_status) {
    if (WIFEXITED(o.tool_status)) r.exit_code = WEXITSTATUS(o.tool_status);
    if (WIFSIGNALED(o.tool_status)) r.signal = WTERMSIG(o.tool_status);
  }
  // A set-up error wins: the tool never ran (or ran no code of its own).
  if (o.have_setup_error) {
    r.reason = EndReason::SetupFailed;
    r.setup_stage = static_cast<Stage>(o.setup_stage);
    r.setup_errno = o.setup_errno;
    r.setup_path = o.setup_path;
    r.error = std::string("sandbox set-up failed at ") + stage_name(r.setup_stage) + ": " +
              std::strerror(o.setup_errno);
    r.exit_code = -1;
    return;
  }
  // Limits the engine enforced itself, in the order they were decided.
  if (o.cancelled) r.reason = EndReason::Cancelled;
  else if (o.timed_out) r.reason = EndReason::Timeout;
  else if (o.backstop) {
    // The engine's own timer did not fire in time (a stalled event loop):
    // init's fence did, a few seconds after the wall timeout.
    r.reason = EndReason::Timeout;
    r.error = "the sandbox's own wall-clock fence ended the run after " + std::to_string(o.backstop_s) + " s";
  }
  else if (o.cpu_exceeded) r.reason = EndReason::CpuLimit;
  else if (o.output_exceeded) r.reason = EndReason::OutputLimit;
  // Limits the kernel enforced.
  else if (o.oom_kills > 0) r.reason = EndReason::MemoryLimit;
  else if (o.socket_limit_reached) {
    r.reason = EndReason::MemoryLimit;
    r.error = "socket buffers reached the run's memory limit (cgroup v1: memory.kmem.tcp.limit_in_bytes)";
  }
  else if (o.have_tool_status && WIFSIGNALED(o.tool_status) &&
           (WTERMSIG(o.tool_status) == SIGXCPU))
    r.reason = EndReason::CpuLimit;
  else if (o.pids_max_hits > 0 && !(o.have_tool_status && WIFEXITED(o.tool_status) && WEXITSTATUS(o.tool_status) == 0))
    r.reason = EndReason::PidsLimit;
  else if (o.have_tool_status && WIFEXITED(o.tool_status)) r.reason = EndReason::Exited;
  else if (o.have_tool_status) r.reason = EndReason::Signaled;
  else {
    // pid 1 died without a report: killed from outside or by the kernel.
    r.reason = EndReason::Signaled;
    r.signal = SIGKILL;
    r.error = "the sandbox's init ended without reporting the tool's status";
  }
  if (r.reason != EndReason::Exited && r.reason != EndReason::Signaled) {
    if (!o.have_tool_status || WIFSIGNALED(o.tool_status)) r.exit_code = -1;
  }
}

RunResult setup_failure_result(const Error& err) {
  Observations o;
  o.engine_error = err.message;
  o.engine_errno = err.code;
  RunResult r;
  classify(o, r);
  return r;
}

}  // namespace tsb::isolate
