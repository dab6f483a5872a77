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

#include "isolate/engine/engine.h"
#include "isolate/supervise/outcome.h"
#include "isolate/engine/spec.h"

namespace tsb::isolate {

// `sandbox` is shared so the caller can cancel() the run from elsewhere
// (a client that went away, shutdown). stdin_data is written then closed.
asio::awaitable<RunResult> supervise(std::shared_ptr<Sandbox> sandbox, std::string stdin_data);


}  // namespace tsb::isolate
