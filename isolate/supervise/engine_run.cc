// Engine::run: the blocking form of spawn + supervise, on a private
// io_context. Used by `toolsandbox run` and the tests.
#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>

#include "isolate/engine/engine.h"
#include "isolate/supervise/supervise.h"

namespace tsb::isolate {

RunResult Engine::run(const RunSpec& spec) {
  auto sb = spawn(spec);
  if (!sb.ok()) return setup_failure_result(sb.error());
  asio::io_context ctx(1);
  RunResult result;
  std::shared_ptr<Sandbox> shared(std::move(sb).value());
  asio::co_spawn(ctx, supervise(shared, spec.stdin_data), [&](std::exception_ptr ep, RunResult r) {
    if (ep) {
      result.reason = EndReason::SetupFailed;
      try {
        std::rethrow_exception(ep);
      } catch (const std::exception& e) {
        result.error = std::string("supervising the run: ") + e.what();
      }
      return;
    }
    result = std::move(r);
  });
  ctx.run();
  shared.reset();
  // Blocking is fine here (the command line, tests): finish any clean-up the
  // run left pending, so the caller sees nothing left behind.
  (void)drain_retired(std::chrono::seconds(2));
  return result;
}

}  // namespace tsb::isolate
