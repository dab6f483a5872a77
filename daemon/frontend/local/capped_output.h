// What the front end keeps of a run's stdout or stderr: the first `cap`
// bytes, and past them only the run's result frame.
//
// Letta returns a tool's result however much it printed; a plain cap would
// drop the frame, which comes last. So past the cap the stream is still read
// (and counted) to its end, and searched for the start token of a frame: the
// runner's, whose token carries the run's nonce (no tool can print it), or
// Letta's markers in script mode. From the first token found, up to
// `frame_cap` bytes (the policy's limits.result; `cap` when 0) are kept, so
// the frame can still be parsed from head + frame; what lies between the two
// is dropped and the output marked truncated. A frame that began inside the
// head (no token past the cap) keeps the `frame_cap` bytes that follow the
// head instead. At most cap + frame_cap bytes are held. A frame larger than
// frame_cap stays broken.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tsb::core {

class CappedOutput {
 public:
  CappedOutput(std::uint64_t cap, std::vector<std::string> frame_tokens, std::uint64_t frame_cap = 0);

  void feed(std::string_view chunk);

  // The kept bytes: the head, then (when one was found past the cap) the
  // frame and what followed it.
  std::string take() &&;
  bool truncated() const noexcept { return truncated_; }
  std::uint64_t total() const noexcept { return total_; }

 private:
  void search(std::string_view chunk);

  std::uint64_t cap_;
  std::uint64_t frame_cap_;
  std::vector<std::string> tokens_;
  std::size_t longest_ = 0;
  std::string head_;
  std::string tail_;
  std::string continuation_;  // the bytes right after the head, while no token was found past it
  bool head_has_token_ = false;
  std::string carry_;  // the last longest_-1 bytes seen, for tokens split across reads
  std::size_t carry_head_bytes_ = 0;  // how many of them are the head's last bytes
  bool found_ = false;
  bool truncated_ = false;
  std::uint64_t total_ = 0;
};

}  // namespace tsb::core
