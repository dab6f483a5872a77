// The request decoder: one request line as a client sends it
// (protocol::decode_request), the error line the daemon answers a refused one
// with, and for run_tool the text handed to the trusted runner.
//
// Invariants, besides "no crash, no sanitizer report":
//   - a line the decoder accepts is JSON (the decoder scans it without
//     building a document; nlohmann's parser is the reference here);
//   - an accepted request has the id the decoder reported, within its limit;
//   - the runner's request built from an accepted run_tool is JSON;
//   - an error response is one line of JSON, whatever the id and message.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <variant>

#include "daemon/frontend/letta/result.h"
#include "protocol/messages.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

namespace p = tsb::protocol;

void check_error_line(std::string_view id, const p::ProtocolError& e) {
  const std::string line = p::encode_error(id, e.code, e.message);
  TSB_FUZZ_CHECK(!line.empty() && line.back() == '\n', line);
  TSB_FUZZ_CHECK(line.find('\n') == line.size() - 1, "an error response spans several lines: " + line);
  TSB_FUZZ_CHECK(tsb::fuzz::is_json(std::string_view(line).substr(0, line.size() - 1)), line);
  TSB_FUZZ_CHECK(!e.message.empty(), "an error without a message");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view line(reinterpret_cast<const char*>(data), size);
  std::string id;
  auto decoded = p::decode_request(line, &id);
  if (const auto* e = std::get_if<p::ProtocolError>(&decoded)) {
    check_error_line(id, *e);
    return 0;
  }
  const auto& req = std::get<p::Request>(decoded);
  TSB_FUZZ_CHECK(tsb::fuzz::is_json(line), "the decoder accepted a line that is not JSON");
  TSB_FUZZ_CHECK(req.id == id, "the id reported differs from the request's");
  TSB_FUZZ_CHECK(!req.id.empty() && req.id.size() <= p::kMaxIdLength, req.id);
  TSB_FUZZ_CHECK(!req.type_name().empty());
  if (const auto* t = std::get_if<p::RunToolRequest>(&req.body)) {
    const std::string runner = tsb::core::runner_request_text(*t, "0123456789abcdef0123456789abcdef");
    TSB_FUZZ_CHECK(tsb::fuzz::is_json(runner), "the runner's request is not JSON: " + runner);
  }
  // What the daemon answers when it refuses an accepted request later on
  // (a policy or an organization says no): the id comes from the client.
  check_error_line(req.id, p::ProtocolError{p::ErrorCode::PolicyDenied, "denied"});
  return 0;
}
