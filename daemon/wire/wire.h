// The spawner's two closed formats, shared by the root spawner and the
// unprivileged front end (docs/ARCHITECTURE.md, "Privilege separation"):
//
//   messages   over the SOCK_SEQPACKET socketpair between them, one message
//              per packet: a type byte, then the fields in a fixed order;
//              descriptors (a run's stdio, the E2B key) ride along as
//              SCM_RIGHTS;
//   compiled   the policy set the compile helper writes for the spawner
//              (daemon/wire/compiled.h).
//
// Both use the base's codec (isolate/base/wire.h).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "isolate/base/result.h"
#include "isolate/base/unique_fd.h"
#include "isolate/base/wire.h"

namespace tsb::spawn {

using tsb::Reader;
using tsb::Writer;

// A message's reader, past its type byte (which must be `type`), and its
// end: valid only when read to its last byte.
template <typename M>
Reader open_message(std::string_view b, M type) {
  Reader r(b);
  if (static_cast<M>(r.u8()) != type) r.fail();
  return r;
}
template <typename T>
Result<T> finish_message(const Reader& r, T v, std::string_view what) {
  if (!r.done()) return Error::invalid("malformed " + std::string(what) + " message", EPROTO);
  return v;
}

// Message types. Front end -> spawner: Run, Kill, Notify, Pools (a
// question). Spawner -> front end: Hello (first), Started, Refused, Ended,
// Reload, PoolState (the answer to Pools).
enum class Msg : std::uint8_t {
  Hello = 1, Run = 2, Started = 3, Refused = 4, Ended = 5, Kill = 6, Reload = 7, Notify = 8, Pools = 9, PoolState = 10
};

// The largest message either side sends or accepts (a Run carries the tool's
// environment: at most 4096 variables, which execve bounds far below this).
inline constexpr std::size_t kMaxMessage = 8u << 20;
// The largest name, path or label in a message.
inline constexpr std::size_t kMaxName = 4096;
// A request's 4096 variables (protocol::kMaxEnvVariables) plus
// LETTA_AGENT_ID and LETTA_PROJECT_ID, which the front end adds.
inline constexpr std::size_t kMaxEnvVars = 4096 + 2;
// The largest value (an environment value, a message).
inline constexpr std::size_t kMaxValue = 1u << 20;
// The first bytes of a compiled set: its format and version.
inline constexpr std::string_view kSetMagic = "TSBSET4\n";

// What a run is: the trusted tool runner reading a request on stdin, or a
// Python script on stdin to the script launcher (script_launcher,
// daemon/policy/policy.h).
enum class RunMode : std::uint8_t { Script = 0, Tool = 1 };

// Refusal codes, mapped by the front end to protocol errors.
enum class RefuseCode : std::uint8_t {
  Malformed = 1,      // not a valid message
  UnknownPolicy = 2,  // no such policy (or not this fingerprint) in the spawner's set
  OutOfBounds = 3,    // a value the policy does not allow (environment, timeout)
  Busy = 4,           // max_concurrent_runs reached
  Unavailable = 5,    // the spawner is stopping
};

// Sends one message with up to four descriptors; MSG_NOSIGNAL, plus `flags`
// (MSG_DONTWAIT: EAGAIN instead of waiting for room).
Status send_message(int sock, const std::string& bytes, const int* fds = nullptr, std::size_t nfds = 0, int flags = 0);
// Receives one message and the descriptors that came with it (at most 4).
// 0 bytes and no error: the peer closed. EAGAIN on a non-blocking socket
// with nothing to read. A message cut short (MSG_TRUNC) is an error; one
// with more
// descriptors than the receiver could take (MSG_CTRUNC: out of descriptors)
// arrives with fewer descriptors, which the caller checks.
Result<std::string> receive_message(int sock, std::vector<UniqueFd>* fds, int flags = 0);

}  // namespace tsb::spawn
