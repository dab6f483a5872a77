// Letta's binary framing (letta::parse_letta_stdout): MARKER(16) | u32
// big-endian length | 32 hex md5 | payload, somewhere in stdout.
//
// Each input is parsed twice: as raw stdout (seeds: real frames, truncated
// and corrupted ones), and split into prefix, payload and suffix and
// reassembled into a frame with the right length and checksum, which a
// mutation alone would almost never produce. Invariants for the reassembled
// frame (letta.h):
//   - when the binary marker occurs before any legacy START marker, the
//     framing is the binary one and the checksum is not reported corrupted;
//   - when it is the first marker, a payload Letta would accept gives a
//     usable result.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "daemon/common/hash.h"
#include "tests/fuzz/letta_common.h"

namespace p = tsb::letta;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto [prefix, payload, suffix] = tsb::fuzz::parse_whole_then_split(data, size);

  std::string text = prefix;
  text += p::kBinaryMarker;
  const auto n = static_cast<std::uint32_t>(payload.size());
  for (int shift = 24; shift >= 0; shift -= 8) text += static_cast<char>((n >> shift) & 0xff);
  text += tsb::md5_hex(payload);
  text += payload;
  text += suffix;
  const auto out = p::parse_letta_stdout(text);
  tsb::fuzz::check_parsed(out);
  const std::size_t marker = text.find(p::kBinaryMarker);
  if (marker < text.find(p::kLegacyStartMarker)) {
    TSB_FUZZ_CHECK(out.framing == p::Framing::kBinary, "the earlier binary marker did not win");
    if (marker == prefix.size()) {
      TSB_FUZZ_CHECK(!(out.corrupted && out.error_message == p::kCorruptedOutputMessage),
                     "a frame with the right md5 was reported corrupted");
      if (tsb::fuzz::letta_accepts_payload(payload))
        TSB_FUZZ_CHECK(out.usable() && !out.empty_payload, "a valid binary frame gave no result: " + out.error_name + ": " + out.error_message);
    }
  }
  return 0;
}
