// Result shaping (core::shape_tool_result): an engine RunResult with fuzzed
// stdout, stderr, end reason, exit status and limits, turned into Letta's
// ToolExecutionResult in script mode (Letta's framings) or tool mode (our
// runner's nonce frame, or its result channel).
//
// The input is read with FuzzedDataProvider: first the fixed-size fields,
// then the tool name, stderr, and the stdout pieces. In tool mode stdout is
// prefix + (optionally) a nonce frame around a fuzzed payload, built with the
// run's real nonce, + suffix, so that mutations reach the payload checks of
// extract_nonce_frame; or, on the result channel, a fuzzed declaration and
// the payload as the channel's bytes. Invariants: the result has Letta's
// fields with their types, its status is "success" or "error", a run that
// did not exit on its own is never a success, and a channel run whose
// runner said its function does not declare agent_state returns none.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "daemon/frontend/letta/result.h"
#include "daemon/frontend/letta/letta.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

namespace p = tsb::protocol;
using tsb::isolate::EndReason;
using tsb::isolate::Stage;

constexpr std::string_view kNonce = "00112233445566778899aabbccddeeff";

void check_string_list(const nlohmann::json& v, const char* what) {
  TSB_FUZZ_CHECK(v.is_array(), what);
  for (const auto& s : v) TSB_FUZZ_CHECK(s.is_string(), what);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider fdp(data, size);
  tsb::core::ShapeContext ctx;
  tsb::isolate::RunResult run;
  ctx.tool_mode = fdp.ConsumeBool();
  ctx.channel = ctx.tool_mode && fdp.ConsumeBool();
  ctx.result_cap = fdp.ConsumeIntegralInRange<std::uint64_t>(0, 1 << 15);
  ctx.nonce = std::string(kNonce);
  tsb::core::ChannelOutcome channel;
  const int declared = fdp.ConsumeIntegralInRange<int>(0, 2);
  if (declared < 2) channel.declared = declared == 1;
  ctx.timeout_s = fdp.ConsumeFloatingPointInRange<double>(0.001, 86400.0);
  if (fdp.ConsumeBool()) ctx.fingerprint = "1234567890";
  ctx.memory_limit = fdp.ConsumeIntegral<std::uint64_t>();
  ctx.pids_limit = fdp.ConsumeIntegral<std::uint64_t>();
  run.reason = static_cast<EndReason>(fdp.ConsumeIntegralInRange<int>(0, static_cast<int>(EndReason::Cancelled)));
  run.exit_code = fdp.ConsumeIntegralInRange<int>(-1, 255);
  run.signal = fdp.ConsumeIntegralInRange<int>(0, 70);
  run.setup_stage = static_cast<Stage>(fdp.ConsumeIntegralInRange<int>(0, static_cast<int>(Stage::InitSeccomp)));
  run.setup_errno = fdp.ConsumeIntegralInRange<int>(0, 200);
  run.stdout_truncated = fdp.ConsumeBool();
  run.stderr_truncated = fdp.ConsumeBool();
  run.peak_memory_bytes = fdp.ConsumeIntegral<std::uint64_t>();
  const bool with_frame = fdp.ConsumeBool();
  ctx.tool_name = fdp.ConsumeRandomLengthString(64);
  run.error = fdp.ConsumeRandomLengthString(256);
  run.stderr_data = fdp.ConsumeRandomLengthString(1 << 14);
  std::string out = fdp.ConsumeRandomLengthString(1 << 14);
  if (ctx.channel && with_frame) {
    channel.result = fdp.ConsumeRandomLengthString(1 << 14);
    channel.result_total = channel.result.size();
  } else if (ctx.tool_mode && with_frame) {
    const std::string payload = fdp.ConsumeRandomLengthString(1 << 14);
    out += "\n";
    out += tsb::letta::kNonceFrameStart;
    out += kNonce;
    out += tsb::letta::kNonceFrameClose;
    out += tsb::letta::b64encode(payload);
    out += tsb::letta::kNonceFrameEnd;
    out += kNonce;
    out += tsb::letta::kNonceFrameClose;
    out += "\n";
  }
  out += fdp.ConsumeRemainingBytesAsString();
  run.stdout_data = std::move(out);
  run.stdout_total_bytes = run.stdout_data.size();
  run.stderr_total_bytes = run.stderr_data.size();

  const tsb::core::Shaped shaped = tsb::core::shape_tool_result(ctx, run, nullptr, ctx.channel ? &channel : nullptr);
  const nlohmann::json& r = shaped.result;
  TSB_FUZZ_CHECK(r.is_object(), "the result is not an object");
  TSB_FUZZ_CHECK(r.contains("status") && r["status"].is_string(), "no status");
  const std::string status = r["status"].get<std::string>();
  TSB_FUZZ_CHECK(status == "success" || status == "error", status);
  TSB_FUZZ_CHECK(r.contains("func_return") && r.contains("agent_state"), "func_return or agent_state is missing");
  check_string_list(r.value("stdout", nlohmann::json()), "stdout is not a list of strings");
  check_string_list(r.value("stderr", nlohmann::json()), "stderr is not a list of strings");
  // Success needs exit status 0: from a tool that exited, or one that hit
  // pids.max along the way and still exited 0.
  if (status == "success") {
    TSB_FUZZ_CHECK((run.reason == EndReason::Exited || run.reason == EndReason::PidsLimit) && run.exit_code == 0,
                   "a run that ended by " + std::string(tsb::isolate::to_string(run.reason)) + " with exit code " +
                       std::to_string(run.exit_code) + " is a success");
  }
  if (ctx.channel && channel.declared != true)
    TSB_FUZZ_CHECK(r["agent_state"].is_null(), "an agent_state from a runner that did not declare it");
  // What the daemon sends: encoded with invalid UTF-8 replaced, never thrown.
  (void)p::encode_ok("id", "result", r);
  (void)shaped.extra.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return 0;
}
