// Letta compatibility: what letta-server computes around a sandboxed tool run,
// reproduced exactly, plus the result frame of our own runner.
//
// Reference: the public letta-ai/letta source (letta 0.16.8, the last release
// of the server): letta/services/tool_sandbox/ (base.py: the current script
// generator and its binary frame; local_sandbox.py: the frame's parser and the
// result of a local run; e2b_sandbox.py), letta/services/tool_executor/
// (tool_execution_sandbox.py: the legacy generator and its text markers),
// letta/schemas/sandbox_config.py (SandboxConfig.fingerprint) and
// letta/utils.py (the error strings). Each part below names what it follows.
// Everything here is pure logic: no I/O, no processes.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "isolate/base/result.h"

namespace tsb::letta {

// ---------------------------------------------------------------------------
// Sandbox config fingerprint (SandboxConfig.fingerprint, letta/schemas/sandbox_config.py)
// ---------------------------------------------------------------------------

// str(int.from_bytes(bytes, "big")): the decimal value of a big-endian
// unsigned integer of any length, without leading zeros ("0" for all zeros).
std::string big_endian_to_decimal(std::string_view bytes);

// SandboxConfig.fingerprint():
//   str(int.from_bytes(sha256(json.dumps({"type": type, "organization_id":
//       organization_id, "config": config}, sort_keys=True,
//       separators=(",", ":")).encode()).digest(), "big"))
// Fails only when a string is not valid UTF-8 or config holds something
// json.dumps could not have serialized (see dumps_compact_sorted).
// organization_id nullopt: a config without one (Letta's None, JSON null).
Result<std::string> sandbox_config_fingerprint(std::string_view type, std::optional<std::string_view> organization_id,
                                               const nlohmann::json& config);

// ---------------------------------------------------------------------------
// Letta's result framings, for stdout produced by Letta-generated scripts: the
// legacy text markers (tool_execution_sandbox.py) and the binary frame
// (tool_sandbox/base.py, parsed by local_sandbox.py)
// ---------------------------------------------------------------------------

// Legacy text markers: str(uuid5(NAMESPACE_DNS, "local-sandbox-result-{start,end}-marker")).
inline constexpr std::string_view kLegacyStartMarker = "92c8e498-43d3-5fb3-919d-a69eb3e5c5c6";
inline constexpr std::string_view kLegacyEndMarker = "34aa1e30-8090-58d0-a72a-e5545c067875";
// Binary frame marker: the 16 bytes of the start-marker UUID.
inline constexpr std::string_view kBinaryMarker{
    "\x92\xc8\xe4\x98\x43\xd3\x5f\xb3\x91\x9d\xa6\x9e\xb3\xe5\xc5\xc6", 16};
// Binary frame: MARKER(16) | u32 big-endian payload length | 32 hex md5 | payload.
inline constexpr std::size_t kBinaryHeaderSize = 16 + 4 + 32;
// The exception text Letta reports when the frame checksum does not match.
inline constexpr std::string_view kCorruptedOutputMessage = "Function ran, but output is corrupted.";

enum class Framing {
  kNone,        // no marker in stdout
  kLegacyText,  // START + base64(payload) + END, parsed with str.index()
  kBinary,      // length-prefixed frame with md5
};
std::string_view framing_name(Framing f);

struct ParsedOutput {
  Framing framing = Framing::kNone;
  [[nodiscard]] bool found() const { return framing != Framing::kNone; }

  // Letta would raise while extracting or decoding the frame and report an
  // internal error (AsyncToolSandboxLocal.run in local_sandbox.py): status
  // "error", func_return = get_friendly_error_msg(name, error_name,
  // error_message), stderr = [error_message], stdout = [""] (stdout_text below
  // still holds the whole stdout, so the caller can choose).
  // error_name/error_message are what Letta's exception would carry; for an
  // md5 mismatch that is exactly ("Exception", kCorruptedOutputMessage). Other
  // cases give Letta's exception type and a message close to Python's (the
  // exact text of e.g. a JSONDecodeError is not reproduced).
  bool corrupted = false;
  // Binary framing: the frame's md5 matched, so Letta went on to decode the
  // stdout around it before it read the payload (a decode error comes first).
  bool frame_verified = false;
  std::string error_name;
  std::string error_message;

  // The payload is not JSON at all: most likely a pickle from a script
  // generated before Letta PR #3343. It is never unpickled; the raw payload
  // bytes are returned base64-encoded for diagnostics. Unusable as a result.
  bool opaque_pickle = false;
  std::string opaque_payload_base64;

  // The frame carried an empty payload; Letta returns (None, None).
  bool empty_payload = false;

  // The decoded payload: payload["results"] (null when missing) and
  // payload["agent_state"] when it is truthy in Python's sense (a non-empty
  // object; Letta validates it into an AgentState), else null.
  nlohmann::json results;
  nlohmann::json agent_state;
  // The same two values as the exact JSON text Python wrote (integers of
  // any size, NaN/Infinity tokens, lone surrogate escapes), for a reply
  // that returns them exactly; empty when absent.
  std::string results_text;
  std::string agent_state_text;

  // Python's json.loads accepts NaN/Infinity/-Infinity and lone surrogate
  // escapes; nlohmann does not. Such tokens are rewritten to null and U+FFFD
  // before parsing, and this flag says that happened.
  bool payload_lossy = false;

  // Legacy framing only: END occurred before START. Letta's str.index() finds
  // each marker from the start of the text, so the payload is empty and the
  // returned stdout repeats the text between the two markers. Reproduced.
  bool legacy_end_before_start = false;

  // stdout without the frame (bytes before it plus bytes after it), as UTF-8.
  // Letta decodes strictly and fails the run on invalid UTF-8; each invalid
  // sequence is replaced with U+FFFD here and stdout_invalid_utf8 set, and
  // stdout_decode_error holds what Python's strict decode of those bytes
  // raises (str(UnicodeDecodeError)), for a caller that answers as Letta does.
  std::string stdout_text;
  bool stdout_invalid_utf8 = false;
  std::optional<std::string> stdout_decode_error;

  // True when the run has a usable decoded result (possibly null).
  [[nodiscard]] bool usable() const { return found() && !corrupted && !opaque_pickle; }
};

// Find and decode a Letta result frame in a tool's raw stdout.
//
// Both framings are recognised. When both markers occur, the framing whose
// marker starts EARLIER in the stream wins and the other is left in
// stdout_text as ordinary text. That mirrors Letta's own rule within one
// framing (the first marker wins) and keeps the result independent of which
// framing the parser tries first. Letta scripts emit exactly one frame, last;
// any earlier marker came from the tool's own output, which is why Letta's
// framings are only for compatibility and our runner uses extract_nonce_frame.
// Which of Letta's generators wrote a script: the current one
// (tool_sandbox/base.py) writes the binary marker as a bytes literal and
// parses only binary frames; the legacy one (tool_execution_sandbox.py)
// writes the text markers and parses only those. Unknown: neither literal.
enum class ScriptGeneration { kUnknown, kCurrent, kLegacy };
ScriptGeneration detect_script_generation(std::string_view script);
// Whether the script is one of Letta's JSON generators (the current one, and
// the legacy one since PR #3343), which encode the result with
// `_letta_json.dumps(result_ZQqiequkcFwRwwGQMqkt`; the generators before
// them pickled it. A frame of such a script whose payload is not JSON was
// forged by the tool, and Letta's parser fails on it.
bool script_writes_json_result(std::string_view script);

// kCurrent and kLegacy look only for their own framing, as Letta's parser for
// that generation does (a frame of the other kind the tool prints is plain
// stdout); kUnknown takes whichever marker comes first.
ParsedOutput parse_letta_stdout(std::string_view stdout_bytes, ScriptGeneration generation = ScriptGeneration::kUnknown);

// What Python's bytes.decode("utf-8") (strict) raises for `bytes`, as
// str(UnicodeDecodeError): "'utf-8' codec can't decode byte 0xff in position
// 3: invalid start byte"; nullopt when they are valid UTF-8.
std::optional<std::string> python_utf8_decode_error(std::string_view bytes);

// base64.b64decode(s, validate=True) of CPython 3.11 (binascii.a2b_base64 in
// strict mode), including its acceptance of padding after a complete quad
// ("QUFB=" decodes) and its error messages.
Result<std::string> b64decode_validate(std::string_view s);
// base64.b64encode: standard alphabet, with padding.
std::string b64encode(std::string_view bytes);

// ---------------------------------------------------------------------------
// Error strings (letta/utils.py: get_friendly_error_msg, parse_stderr_error_msg)
// ---------------------------------------------------------------------------

inline constexpr std::size_t kMaxErrorMessageChars = 1000;  // MAX_ERROR_MESSAGE_CHAR_LIMIT

// get_friendly_error_msg: f"Error executing function {function_name}:
// {exception_name}: {exception_message}" cut to the first 1000 characters.
// Characters are Python's (code points), so the cut never splits a UTF-8
// sequence. Invalid UTF-8 in the inputs is first replaced by U+FFFD (Python
// strings cannot hold it).
std::string friendly_error_msg(std::string_view function_name, std::string_view exception_name,
                               std::string_view message);

// parse_stderr_error_msg: over stderr.split("\n")[:-(last_n_lines + 1):-1]
// (the last last_n_lines lines, last first, Python slice semantics for any
// last_n_lines), the first line that contains "Error" or "Exception" and
// matches re.search(r"(\w+(?:Error|Exception)): (.+)$") gives (group 1,
// group 2); otherwise ("", ""). Note that a bare "Exception: boom" does not
// match (\w+ needs a character before the suffix).
//
// \w is Python's Unicode \w (str.isalnum() or "_"), from a table generated
// from CPython 3.11 (Unicode 14.0.0); a letta-server on a newer Python may
// classify characters added in later Unicode versions differently. Invalid
// UTF-8 in stderr is replaced by U+FFFD first (Letta would fail to decode).
std::pair<std::string, std::string> parse_stderr_error_msg(std::string_view stderr_text,
                                                           int last_n_lines = 3);

// Whether `cp` matches Python's re \w in a str pattern. Exposed for tests.
bool python_re_word_char(char32_t cp);

// ---------------------------------------------------------------------------
// Our runner's result frame (isolate/runner/toolsandbox_runner.py)
// ---------------------------------------------------------------------------
//
//   "\n" "<<TSB-RESULT-" nonce ">>" base64(payload JSON) "<<TSB-END-" nonce ">>" "\n"
//
// nonce: 32 lowercase hex characters (tsb::random_hex(16)), fresh per run,
// given to the runner on stdin only. The runner process that knows the nonce
// never runs tool code (it forks a child for that and is non-dumpable), so a
// tool cannot learn the nonce; text a tool prints, including forged frames
// with guessed or Letta markers, is just stdout. See the threat model at the
// top of the runner.
//
// payload (ASCII JSON object):
//   success: {"results": <json>, "agent_state": <object|null>}
//   failure: {"results": null, "agent_state": null,
//             "error": {"kind": "tool"|"request", "name": str, "message": str}}

inline constexpr std::string_view kNonceFrameStart = "<<TSB-RESULT-";
inline constexpr std::string_view kNonceFrameEnd = "<<TSB-END-";
inline constexpr std::string_view kNonceFrameClose = ">>";
inline constexpr std::size_t kNonceHexChars = 32;

bool is_valid_nonce(std::string_view nonce);

// Build a frame as the runner writes it (for tests and fake runners).
Result<std::string> make_nonce_frame(std::string_view nonce, const nlohmann::json& payload);

struct RunnerError {
  std::string kind;     // "tool": the tool raised or died; "request": the request was unusable
  std::string name;     // exception class name, e.g. "ZeroDivisionError"
  std::string message;  // str(exception)
  // The tool raised it (or exited with a non-zero code): its traceback is on
  // stderr, where Letta reads the error from (parse_stderr_error_msg).
  bool raised = false;
};

struct NonceFrame {
  nlohmann::json results;      // null on failure
  nlohmann::json agent_state;  // object or null
  std::string results_text;      // their exact text, as in ParsedOutput
  std::string agent_state_text;  // (empty: null or absent)
  std::optional<RunnerError> error;
  // A decoded pickle's result (an unpickle request): where `results` stands
  // for a Python type JSON lacks, checked against the shape PROTOCOL.md
  // 13.1 gives (record.pickle_types); null when none. types_omitted: there
  // were more than the runner sends.
  nlohmann::json types;
  bool types_omitted = false;
  // stdout without the frame (and without the frame's own leading and
  // trailing newline), invalid UTF-8 replaced as in ParsedOutput.
  std::string stdout_text;
  bool stdout_invalid_utf8 = false;
  std::optional<std::string> stdout_decode_error;  // as in ParsedOutput
};

// Find the frame for `nonce` in the runner's stdout.
//   - no frame with this nonce: nullopt (the runner died or was killed before
//     writing it; frames with other nonces are ordinary text);
//   - exactly one well-formed frame: its decoded contents;
//   - an error when the nonce is malformed, the frame occurs more than once
//     (only possible if the nonce leaked: neither copy is trusted), is
//     unterminated (e.g. cut by an output limit), carries invalid base64 or a
//     payload that does not follow the shape above.
// Uniqueness instead of "first" or "last": the first occurrence is what a
// forger printing before the runner would win, the last what a forger
// printing after it (a leftover grandchild) would win.
Result<std::optional<NonceFrame>> extract_nonce_frame(std::string_view stdout_bytes, std::string_view nonce);

// ---------------------------------------------------------------------------
// The result channel (local tool mode: the runner's run_channel)
// ---------------------------------------------------------------------------
//
// In a local sandbox the runner's stdin is one end of a stream socket pair,
// the front end holds the other, and the request and the result travel on
// it; stdout and stderr are the tool's alone. In order:
//   1. front end: the first part, header + {"tool_name", "source_code"}
//      (or {"unpickle": "<base64>"}), header = the part's size, 4 bytes
//      big-endian;
//   2. runner: a declaration, kChannelDeclaredYes when the function declares
//      agent_state (and for an unpickle request), else kChannelDeclaredNo,
//      written before any code but the runner's and the standard library's
//      runs in its process;
//   3. front end: the second part, header + {"args", "json_schema",
//      "agent_state", "agent_id", "env"} with agent_state null unless
//      declared ("{}" for an unpickle request), then shutdown(SHUT_WR);
//   4. runner: the payload (the frame payload's shape above, as JSON text),
//      then EOF when its process ends.
// The tool runs in the runner's own process, so it can write to the
// channel: that only does what returning a value does, as long as an
// agent_state is accepted back only when declared (shape_tool_result).
// A run with no declaration never gets the second part: the agent state
// and the environment's secrets never reach a runner that did not start.
inline constexpr std::string_view kChannelDeclaredNo = "TSB1 agent_state=0\n";
inline constexpr std::string_view kChannelDeclaredYes = "TSB1 agent_state=1\n";
inline constexpr std::size_t kChannelDeclarationSize = kChannelDeclaredNo.size();
static_assert(kChannelDeclaredYes.size() == kChannelDeclarationSize);

// Warm sandboxes (the runner's run_pooled and await_script): the runner
// starts before any request, with the policy's fixed environment only, and
// writes kChannelReady on its stdin socket once it waits. The hand-over
// starts with the front end's environ part, header + {"environ": {NAME:
// value}} (the request's variables a cold start would have had from
// execve), which the runner adopts (os.environ and /proc/self/environ);
// then tool mode goes on as above from step 1, and script mode sends the
// script and shutdown(SHUT_WR).
inline constexpr std::string_view kChannelReady = "TSB1 ready\n";

// true, false, or nullopt for anything but one of the two declarations.
std::optional<bool> parse_channel_declaration(std::string_view bytes);
// The 4-byte big-endian header of a part of `size` bytes (< 4 GiB):
// big_endian_u32 of it.
std::string channel_part_header(std::size_t size);
// n as 4 bytes, most significant first (the length of a part here, of a
// frame in Letta's binary framing, of a Connect envelope for E2B).
std::string big_endian_u32(std::uint32_t n);
// The payload read from the channel (the whole of it, to EOF), and the
// run's stdout, which is all the tool's (stdout_text): the shape checks of
// extract_nonce_frame, errors named "runner result: ...".
Result<NonceFrame> parse_channel_result(std::string_view payload, std::string_view stdout_bytes);

}  // namespace tsb::letta
