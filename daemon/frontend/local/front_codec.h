// The front end's half of the spawner's formats (daemon/wire/compiled.h):
// what the front end writes, and what it reads from the spawner. Kept
// apart so that none of it is in the root spawner.
#pragma once

#include <string>
#include <string_view>

#include "daemon/wire/compiled.h"

namespace tsb::isolate {
struct RunResult;
}

namespace tsb::spawn {

std::string encode(const RunOrder& m);
std::string encode(const Kill& m);
// The front end is ready, with a status text for systemd ("" for none).
std::string encode_notify(std::string_view status);

// Each decoder checks the type byte and that the message is read exactly.
Result<Hello> decode_hello(std::string_view b);
Result<Started> decode_started(std::string_view b);
Result<Refused> decode_refused(std::string_view b);
Result<Ended> decode_ended(std::string_view b);
Result<bool> decode_reload(std::string_view b);
Result<PoolState> decode_pool_state(std::string_view b);
// The question the spawner answers with a PoolState.
std::string encode_pools_question();
// The front end's view of an end: the measurements, and the end reason and
// sentence classified from the observations (isolate/supervise/outcome.h).
isolate::RunResult run_result_from(const Ended& e);

}  // namespace tsb::spawn
