#include "daemon/frontend/local/capped_output.h"

#include <algorithm>

namespace tsb::core {

CappedOutput::CappedOutput(std::uint64_t cap, std::vector<std::string> frame_tokens, std::uint64_t frame_cap)
    : cap_(cap), frame_cap_(frame_cap ? frame_cap : cap), tokens_(std::move(frame_tokens)) {
  std::erase_if(tokens_, [](const std::string& t) { return t.empty(); });
  for (const auto& t : tokens_) longest_ = std::max(longest_, t.size());
}

void CappedOutput::feed(std::string_view chunk) {
  total_ += chunk.size();
  if (head_.size() < cap_) {
    const auto take = static_cast<std::size_t>(std::min<std::uint64_t>(chunk.size(), cap_ - head_.size()));
    head_.append(chunk.substr(0, take));
    chunk.remove_prefix(take);
    if (chunk.empty()) return;
  }
  if (!truncated_) {
    // The first byte past the cap: a token may have begun in the head's
    // last bytes.
    truncated_ = true;
    // A frame may also have begun well inside the head: then what follows
    // the head is its continuation, kept unless a token turns up later.
    for (const auto& t : tokens_) head_has_token_ = head_has_token_ || head_.find(t) != std::string::npos;
    const std::size_t keep = longest_ > 0 ? std::min(head_.size(), longest_ - 1) : 0;
    carry_.assign(head_, head_.size() - keep, keep);
    carry_head_bytes_ = keep;
  }
  if (found_) {
    const auto room = static_cast<std::size_t>(frame_cap_ - std::min<std::uint64_t>(frame_cap_, tail_.size()));
    tail_.append(chunk.substr(0, std::min(room, chunk.size())));
    return;
  }
  search(chunk);
  if (!found_ && head_has_token_) {
    const auto room =
        static_cast<std::size_t>(frame_cap_ - std::min<std::uint64_t>(frame_cap_, continuation_.size()));
    continuation_.append(chunk.substr(0, std::min(room, chunk.size())));
  }
}

void CappedOutput::search(std::string_view chunk) {
  if (tokens_.empty()) return;
  // Search carry + chunk, so a token split across reads is found.
  std::string window = std::move(carry_);
  window.append(chunk);
  std::size_t at = std::string::npos;
  for (const auto& t : tokens_) at = std::min(at, window.find(t));
  if (at == std::string::npos) {
    const std::size_t keep = std::min(window.size(), longest_ - 1);
    const std::size_t dropped = window.size() - keep;
    carry_head_bytes_ = carry_head_bytes_ > dropped ? carry_head_bytes_ - dropped : 0;
    carry_.assign(window, dropped, keep);
    return;
  }
  found_ = true;
  continuation_ = std::string();
  // Keep from the token's start, but not the bytes the head holds already:
  // a token that began in the head goes on right after it.
  const std::size_t from = std::max(at, carry_head_bytes_);
  const std::string_view rest = std::string_view(window).substr(from);
  tail_.assign(rest.substr(0, static_cast<std::size_t>(std::min<std::uint64_t>(rest.size(), frame_cap_))));
  carry_.clear();
}

std::string CappedOutput::take() && {
  std::string out = std::move(head_);
  out += found_ ? tail_ : continuation_;
  return out;
}

}  // namespace tsb::core
