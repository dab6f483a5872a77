// Letta's legacy text framing (letta::parse_letta_stdout): stdout that
// carries START-marker + base64(payload) + END-marker somewhere.
//
// Each input is parsed twice: as raw stdout (the seeds are real frames and
// the text around them), and split into prefix, payload and suffix and
// reassembled into a well-formed frame, so that mutations reach the payload
// decoding behind the base64 instead of breaking the frame. Invariants for
// the reassembled frame (letta.h):
//   - when the START marker occurs before any binary marker, the framing is
//     the legacy one ("the marker that starts earlier wins");
//   - when the frame is the first one and its END the first END, a payload
//     Letta would accept gives a usable result.
// Also: base64 round-trips (b64decode_validate of b64encode), and Letta's
// error text (friendly_error_msg) is UTF-8 and at most 1000 characters.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "tests/fuzz/letta_common.h"

namespace p = tsb::letta;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view raw(reinterpret_cast<const char*>(data), size);
  const auto [prefix, payload, suffix] = tsb::fuzz::parse_whole_then_split(data, size);

  const std::string b64 = p::b64encode(payload);
  auto back = p::b64decode_validate(b64);
  TSB_FUZZ_CHECK(back.ok() && *back == payload, "base64 does not round-trip");

  std::string text = prefix;
  text += p::kLegacyStartMarker;
  text += b64;
  text += p::kLegacyEndMarker;
  text += suffix;
  const auto out = p::parse_letta_stdout(text);
  tsb::fuzz::check_parsed(out);
  const std::size_t start = text.find(p::kLegacyStartMarker);
  if (start < text.find(p::kBinaryMarker)) {
    TSB_FUZZ_CHECK(out.framing == p::Framing::kLegacyText, "the earlier legacy marker did not win");
    const bool ours = start == prefix.size() && text.find(p::kLegacyEndMarker) == start + p::kLegacyStartMarker.size() + b64.size();
    if (ours && tsb::fuzz::letta_accepts_payload(payload))
      TSB_FUZZ_CHECK(out.usable() && !out.empty_payload, "a valid legacy frame gave no result: " + out.error_name + ": " + out.error_message);
  }

  const std::string msg = p::friendly_error_msg(prefix, suffix.substr(0, 64), payload);
  TSB_FUZZ_CHECK(tsb::fuzz::is_utf8(msg), "friendly_error_msg is not UTF-8");
  std::size_t chars = 0;
  for (unsigned char c : msg) chars += (c & 0xc0) != 0x80;
  TSB_FUZZ_CHECK(chars <= p::kMaxErrorMessageChars, "friendly_error_msg is longer than 1000 characters");
  (void)p::parse_stderr_error_msg(raw, static_cast<int>(size % 7) - 1);
  return 0;
}
