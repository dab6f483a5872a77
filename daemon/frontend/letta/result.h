// Shapes an engine RunResult into Letta's ToolExecutionResult, exactly as
// letta-server's local sandbox would (AsyncToolSandboxLocal.run in
// letta-ai/letta's letta/services/tool_sandbox/local_sandbox.py), for
// both the script mode (Letta's framings) and the tool mode (our runner's
// nonce frame). Pure: no I/O.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "isolate/supervise/outcome.h"
#include "daemon/frontend/letta/letta.h"
#include "protocol/messages.h"

namespace tsb::core {

struct ShapeContext {
  std::string tool_name;
  double timeout_s = 60;                  // the effective wall-clock limit, for messages
  std::optional<std::string> fingerprint; // sandbox_config_fingerprint, when computable
  bool tool_mode = false;                 // run_tool: the runner's result
  // Tool mode: the result came on the result channel (a local sandbox:
  // ChannelOutcome), at most result_cap bytes of it; else in the frame
  // carrying `nonce` on stdout (an E2B cell).
  bool channel = false;
  std::uint64_t result_cap = 0;
  std::string nonce;
  // A TypeScript tool (source_type "typescript"). In a local sandbox both
  // modes answer on the result channel (the TypeScript runner: framing
  // "typescript-json"), and output that is not UTF-8 is replaced, as E2B's
  // kernel hands Letta text, never failed.
  bool typescript = false;
  // Nonce mode: the tool's source names agent_state, so the request
  // carried it (runner_request_text) and a frame may carry it back; a
  // frame with one from a source that cannot declare it is not the runner's.
  bool may_declare = false;
  // Script mode: which of Letta's generators wrote the script (its parser is
  // the one that applies). Letta's current one, and tool mode, which stands
  // for it: output that is not UTF-8 fails as it fails in Letta.
  letta::ScriptGeneration generation = letta::ScriptGeneration::kUnknown;
  // Script mode: one of Letta's JSON generators wrote it (a pickle payload
  // is then not decoded: Letta's parser fails on it).
  bool json_result_script = false;
  std::uint64_t memory_limit = 0;         // for messages
  std::uint64_t pids_limit = 0;
};

struct Shaped {
  nlohmann::json result;  // ToolExecutionResult fields
  nlohmann::json extra;   // framing details for the run record
  // When set, result's func_return / agent_state as the exact JSON text the
  // tool's Python wrote (letta::ParsedOutput::results_text): the reply
  // carries them so, not the approximate document values.
  std::string func_return_text;
  std::string agent_state_text;
};

// A script-mode run's pickle payload (a script Letta generated before it
// switched to JSON), decoded into plain data by the trusted runner in a
// sandbox of its own under the run's policy (LocalBackend): the runner's
// answer, or why there is none. Never decoded in the daemon.
struct DecodedPickle {
  std::optional<letta::NonceFrame> frame;
  std::string failure;  // without a frame
};

// What came back on a run's result channel (daemon/frontend/letta/letta.h, "The result
// channel"; daemon/frontend/local/spawner_link.h carries it).
struct ChannelOutcome {
  std::optional<bool> declared;  // no (valid) declaration came: nullopt
  std::string result;            // the first result_cap bytes sent
  std::uint64_t result_total = 0;
};

// A run whose tool did not answer because a step before it failed: a
// per-tool venv build (the local backend), a pip install or E2B itself (the
// E2B backend). The exception Letta's manager would have reported, and its
// message; what the step printed is the run's stdout_data / stderr_data.
struct RunFailure {
  std::string exception = "RuntimeError";
  std::string message;
};

// A script run in an E2B sandbox's Jupyter kernel, as the kernel reported
// it: the text of the execution's main result (when it had one), the
// chunks written to stdout and stderr, and the error the cell raised.
struct CellOutcome {
  struct Raised {
    std::string name, value, traceback;
  };
  std::optional<std::string> main_result;
  std::vector<std::string> out, err;
  std::optional<Raised> error;
  // A TypeScript tool's script (Letta's run_code(language="ts")): the main
  // result is read by Letta's parse_typescript_result.
  bool typescript = false;
};

// `decoded`: for a run whose payload is a pickle, its decoding, if any.
// `channel`: a channel-mode tool run's channel (null: nothing came).
Shaped shape_tool_result(const ShapeContext& ctx, const isolate::RunResult& run,
                         const DecodedPickle* decoded = nullptr, const ChannelOutcome* channel = nullptr);

// The ToolExecutionResult of a run that failed before its tool answered:
// status "error", Letta's friendly message of the exception, and what the
// failed step printed, with "Exception: message" last on stderr.
Shaped shape_failure(const ShapeContext& ctx, const isolate::RunResult& run, const RunFailure& failure);

// The ToolExecutionResult of a script run in an E2B kernel: the result
// from the main result (the base64 payload Letta's E2B script returns) or
// from a frame on stdout, as Letta's E2B sandbox reads them; the record's
// framing in `extra`.
Shaped shape_cell(const ShapeContext& ctx, const CellOutcome& cell);

// Script mode: the pickle payload (base64) that shape_tool_result would
// answer from a decoding of, when there is one: the shaping itself decides
// (end reason, Letta's UTF-8 checks, the frame, the script's generator).
std::optional<std::string> pickle_payload_to_decode(const ShapeContext& ctx, const isolate::RunResult& run);

// Whether a tool's source can declare agent_state (it names it): else its
// request carries none, and its result may carry none.
bool source_may_declare_agent_state(std::string_view source);

// The request the trusted runner reads on its stdin in an E2B cell: the
// tool's source, its arguments as data and a fresh nonce
// (isolate/runner/toolsandbox_runner.py documents the fields; absent ones
// are null). One JSON object, built by concatenation: the strings
// JSON-escaped, args, json_schema and agent_state spliced in as the client
// sent them, so no value is re-encoded (numbers stay as written) and the
// text is about the size of the request it comes from.
// `env`: variables the runner sets for the tool only (its "env" member).
std::string runner_request_text(const protocol::RunToolRequest& t, std::string_view nonce,
                                const std::map<std::string, std::string>& env = {});
// The same request in a local sandbox, as the result channel's two parts
// (daemon/frontend/letta/letta.h), each with its header: tool_name and source_code; then
// the rest, with agent_state only when the runner declared it.
std::string runner_channel_first(const protocol::RunToolRequest& t);
std::string runner_channel_second(const protocol::RunToolRequest& t, bool declared,
                                  const std::map<std::string, std::string>& env = {});
// A TypeScript execute's first part: the script Letta generated; its second
// is channel_part_header(2) + "{}".
std::string runner_channel_script(std::string_view script);
// An unpickle request's first part; its second is channel_part_header(2) + "{}".
std::string runner_channel_unpickle(std::string_view payload_base64);
// A warm sandbox's first part (daemon/frontend/letta/letta.h, kChannelReady): the
// variables of the run's environment beyond the policy's fixed ones.
std::string runner_environ_part(const std::map<std::string, std::string>& environ);

// Python's str() of a float, for Letta's timeout message ("180.0", "1.5").
std::string python_float_str(double v);

}  // namespace tsb::core
