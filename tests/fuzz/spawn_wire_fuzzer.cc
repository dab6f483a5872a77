// The root spawner's decoders (daemon/wire/compiled.h): everything the
// spawner reads from a process it does not trust. The first byte picks the
// decoder: 0 the compiled set (the compile helper's output), 1 a message
// from the front end (Run, Kill or Notify, by its own type byte).
//
// Invariants, besides "no crash, no sanitizer report":
//   - what a decoder accepts encodes to bytes it accepts again, as the same
//     value (the format has one meaning per value);
//   - an accepted run order keeps within the limits the decoder promises
//     (names, environment size);
//   - an accepted compiled set has a loadable filter for every policy (never
//     an empty program) and no front end uid 0.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "daemon/compile/set_codec.h"
#include "daemon/frontend/local/front_codec.h"
#include "tests/fuzz/fuzz_check.h"

namespace s = tsb::spawn;

namespace {

void run_order(std::string_view b) {
  auto r = s::decode_run(b);
  if (!r.ok()) return;
  TSB_FUZZ_CHECK(r->policy.size() <= s::kMaxName && r->fingerprint.size() <= s::kMaxName);
  TSB_FUZZ_CHECK(r->env.size() <= s::kMaxEnvVars);
  auto again = s::decode_run(s::encode(*r));
  TSB_FUZZ_CHECK(again.ok(), "a run order does not survive its own encoding");
  TSB_FUZZ_CHECK(again->id == r->id && again->policy == r->policy && again->fingerprint == r->fingerprint &&
                 again->mode == r->mode && again->env == r->env && again->timeout == r->timeout);
}

void compiled_set(std::string_view b) {
  auto r = s::decode_compiled_set(b);
  if (!r.ok()) return;
  TSB_FUZZ_CHECK(r->front_end_uid != 0);
  TSB_FUZZ_CHECK(r->init_filter && !r->init_filter->insns.empty());
  for (const auto& p : r->policies) {
    TSB_FUZZ_CHECK(p.seccomp && !p.seccomp->insns.empty(), p.name);
    // The interpreter: script mode's command, absolute.
    TSB_FUZZ_CHECK(!p.modes[0].argv.empty() && !p.modes[0].argv[0].empty() && p.modes[0].argv[0][0] == '/', p.name);
  }
  auto again = s::decode_compiled_set(s::encode_compiled_set(*r));
  TSB_FUZZ_CHECK(again.ok(), "a compiled set does not survive its own encoding");
  TSB_FUZZ_CHECK(again->policies.size() == r->policies.size());
  TSB_FUZZ_CHECK(s::encode_compiled_set(*again) == s::encode_compiled_set(*r));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::string_view b(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] == 0) {
    compiled_set(b);
    return 0;
  }
  switch (s::message_type(b)) {
    case s::Msg::Run: run_order(b); break;
    case s::Msg::Kill: {
      auto k = s::decode_kill(b);
      if (k.ok()) TSB_FUZZ_CHECK(s::encode(*k) == b, "a kill message is not canonical");
      break;
    }
    case s::Msg::Notify: {
      auto n = s::decode_notify(b);
      if (n.ok()) TSB_FUZZ_CHECK(s::encode_notify(*n) == b, "a notify message is not canonical");
      break;
    }
    default:
      // Every decoder refuses a message of another type.
      TSB_FUZZ_CHECK(!s::decode_run(b).ok() && !s::decode_kill(b).ok() && !s::decode_notify(b).ok());
  }
  return 0;
}
