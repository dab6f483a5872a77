// The spawner's two closed formats, shared by the root spawner and the
// unprivileged front end (docs/ARCHITECTURE.md, "Privilege separation"):
//
//   messages   over the SOCK_SEQPACKET socketpair between them, one message
//              per packet: a type byte, then the fields in a fixed order;
//              descriptors (a run's stdio, the E2B key) ride along as
//              SCM_RIGHTS;
//   compiled   the policy set the compile helper writes for the spawner
//              (daemon/spawner/compiled.h).
//
// Integers are little-endian and fixed-size; strings are a u32 length and
// the bytes. The reader never trusts a length: every read is checked against
// what is left, a failed read poisons the reader, and a message is valid only
// when it is read to its last byte.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "isolate/base/result.h"
#include "isolate/base/unique_fd.h"

namespace tsb::spawn {

class Writer {
 public:
  void u8(std::uint8_t v) { buf_.push_back(static_cast<char>(v)); }
  void u32(std::uint32_t v) { put(v); }
  void u64(std::uint64_t v) { put(v); }
  void i32(std::int32_t v) { put(static_cast<std::uint32_t>(v)); }
  void str(std::string_view s) {
    u32(static_cast<std::uint32_t>(s.size()));
    buf_.append(s);
  }
  void strs(const std::vector<std::string>& v) {
    u32(static_cast<std::uint32_t>(v.size()));
    for (const auto& s : v) str(s);
  }
  const std::string& bytes() const noexcept { return buf_; }
  std::string take() noexcept { return std::move(buf_); }

 private:
  template <typename T>
  void put(T v) {
    char b[sizeof v];
    for (std::size_t i = 0; i < sizeof v; ++i) b[i] = static_cast<char>((v >> (8 * i)) & 0xff);
    buf_.append(b, sizeof v);
  }
  std::string buf_;
};

class Reader {
 public:
  explicit Reader(std::string_view b) : p_(b.data()), end_(b.data() + b.size()) {}
  std::uint8_t u8() { return get<std::uint8_t>(); }
  std::uint32_t u32() { return get<std::uint32_t>(); }
  std::uint64_t u64() { return get<std::uint64_t>(); }
  std::int32_t i32() { return static_cast<std::int32_t>(get<std::uint32_t>()); }
  bool flag() {
    std::uint8_t v = u8();
    if (v > 1) ok_ = false;
    return v == 1;
  }
  // A string of at most `max` bytes.
  std::string str(std::size_t max) {
    std::uint32_t n = u32();
    if (!ok_ || n > max || n > left()) {
      ok_ = false;
      return {};
    }
    std::string s(p_, n);
    p_ += n;
    return s;
  }
  // At most `max_count` strings of at most `max` bytes each.
  std::vector<std::string> strs(std::size_t max_count, std::size_t max) {
    std::uint32_t n = u32();
    std::vector<std::string> v;
    if (n > max_count) ok_ = false;
    for (std::uint32_t i = 0; ok_ && i < n; ++i) v.push_back(str(max));
    return v;
  }
  // A count of at most `max` elements of at least `min_bytes` each.
  std::uint32_t count(std::uint32_t max, std::size_t min_bytes) {
    std::uint32_t n = u32();
    if (n > max || (min_bytes && n > left() / min_bytes)) ok_ = false;
    return ok_ ? n : 0;
  }
  void fail() noexcept { ok_ = false; }
  bool ok() const noexcept { return ok_; }
  // Everything read, nothing left, no read failed.
  bool done() const noexcept { return ok_ && p_ == end_; }

 private:
  std::size_t left() const noexcept { return static_cast<std::size_t>(end_ - p_); }
  template <typename T>
  T get() {
    if (!ok_ || left() < sizeof(T)) {
      ok_ = false;
      return 0;
    }
    T v = 0;
    for (std::size_t i = 0; i < sizeof(T); ++i) v |= static_cast<T>(static_cast<unsigned char>(p_[i])) << (8 * i);
    p_ += sizeof(T);
    return v;
  }
  const char* p_;
  const char* end_;
  bool ok_ = true;
};

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

// Message types. Front end -> spawner: Run, Kill, Notify. Spawner -> front
// end: Hello (first), Started, Refused, Ended, Reload.
enum class Msg : std::uint8_t { Hello = 1, Run = 2, Started = 3, Refused = 4, Ended = 5, Kill = 6, Reload = 7, Notify = 8 };

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
inline constexpr std::string_view kSetMagic = "TSBSET1\n";

// What a run is: the trusted tool runner reading a request on stdin, or a
// Python script on stdin to the script launcher (kScriptMain, compiled.h).
enum class RunMode : std::uint8_t { Script = 0, Tool = 1 };
// Why the front end asks for a run to be ended.
enum class KillWhy : std::uint8_t { Cancel = 0, OutputLimit = 1 };

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
