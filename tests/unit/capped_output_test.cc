// daemon/frontend/local/capped_output: the head of a stream up to its cap, and past it
// only the result frame, whatever the read boundaries.
#include "daemon/frontend/local/capped_output.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

namespace tsb::core {
namespace {

const std::string kToken = "<<TSB-RESULT-0123>>";

// Feeds `text` in pieces of the given sizes (cycled).
CappedOutput feed(std::uint64_t cap, const std::string& text, const std::vector<std::size_t>& pieces,
                  std::vector<std::string> tokens = {kToken}, std::uint64_t frame_cap = 0) {
  CappedOutput c(cap, std::move(tokens), frame_cap);
  std::size_t at = 0, i = 0;
  while (at < text.size()) {
    const std::size_t n = std::min(pieces[i++ % pieces.size()], text.size() - at);
    c.feed(std::string_view(text).substr(at, n));
    at += n;
  }
  return c;
}

TEST(CappedOutput, UnderTheCapEverythingIsKept) {
  auto c = feed(100, "hello " + kToken + "frame", {3});
  EXPECT_FALSE(c.truncated());
  EXPECT_EQ(c.total(), 6 + kToken.size() + 5);
  EXPECT_EQ(std::move(c).take(), "hello " + kToken + "frame");
}

TEST(CappedOutput, PastTheCapOnlyTheFrameIsKeptWhateverTheReads) {
  const std::string head(50, 'h');
  const std::string noise(5000, 'n');
  const std::string frame = kToken + "payload<<END>>\n";
  const std::string text = head + noise + frame;
  for (std::size_t piece : {1u, 2u, 7u, 19u, 20u, 64u, 4096u, 100000u}) {
    SCOPED_TRACE(piece);
    auto c = feed(50, text, {piece});
    EXPECT_TRUE(c.truncated());
    EXPECT_EQ(c.total(), text.size());
    EXPECT_EQ(std::move(c).take(), head + frame);
  }
}

TEST(CappedOutput, ATokenThatBeginsInTheHeadContinuesAfterIt) {
  // The cap falls inside the token: head + tail must be the original bytes.
  for (std::size_t split = 1; split < kToken.size(); ++split) {
    SCOPED_TRACE(split);
    const std::string text = std::string(10, 'h') + kToken + "payload";
    const std::uint64_t cap = 10 + split;
    for (std::size_t piece : {1u, 3u, 100u}) {
      auto c = feed(cap, text, {piece});
      EXPECT_TRUE(c.truncated());
      const std::string kept = std::move(c).take();
      EXPECT_EQ(kept, text.substr(0, std::min<std::size_t>(text.size(), 2 * cap)));
    }
  }
}

TEST(CappedOutput, AFrameThatBeganWellInsideTheHeadIsKeptWhole) {
  // Printed output, then a frame that straddles the cap: head + what
  // follows it are the original bytes, whatever the reads.
  const std::string frame = kToken + std::string(600, 'p') + "<<END>>\n";
  const std::string text = std::string(924, 'o') + frame;
  for (std::size_t piece : {1u, 7u, 4096u}) {
    SCOPED_TRACE(piece);
    auto c = feed(1024, text, {piece});
    EXPECT_TRUE(c.truncated());
    EXPECT_EQ(std::move(c).take(), text);
  }
}

TEST(CappedOutput, ATokenPastTheCapWinsOverOneInTheHead) {
  // A token printed early, then noise past the cap, then the frame: the
  // frame is what is kept after the head.
  const std::string text = "x" + kToken + std::string(200, 'n') + kToken + "real<<END>>";
  for (std::size_t piece : {1u, 5u, 1000u}) {
    SCOPED_TRACE(piece);
    auto c = feed(40, text, {piece});
    EXPECT_EQ(std::move(c).take(), text.substr(0, 40) + kToken + "real<<END>>");
  }
}

TEST(CappedOutput, TheFrameIsBoundedByTheCapToo) {
  auto c = feed(10, std::string(10, 'h') + std::string(100, 'n') + kToken + std::string(100, 'p'), {33});
  const std::string kept = std::move(c).take();
  EXPECT_EQ(kept.size(), 20u);
  EXPECT_EQ(kept, std::string(10, 'h') + kToken.substr(0, 10));
}

// The frame's own allowance (the policy's limits.result) may be larger
// than the head's: a result larger than stdout's cap stays whole, both when
// the frame starts past the cap and inside the head.
TEST(CappedOutput, TheFrameHasItsOwnCap) {
  const std::string frame = kToken + std::string(500, 'p') + "<<END>>";
  for (std::size_t piece : {3u, 4096u}) {
    SCOPED_TRACE(piece);
    auto past = feed(10, std::string(10, 'h') + std::string(100, 'n') + frame, {piece}, {kToken}, 1000);
    EXPECT_EQ(std::move(past).take(), std::string(10, 'h') + frame);
    auto inside = feed(10, "ab" + frame, {piece}, {kToken}, 1000);
    EXPECT_EQ(std::move(inside).take(), "ab" + frame);
    auto bounded = feed(10, "ab" + frame, {piece}, {kToken}, 100);
    EXPECT_EQ(std::move(bounded).take().size(), 110u);
  }
}

TEST(CappedOutput, WithoutATokenOnlyTheHead) {
  auto c = feed(8, std::string(1000, 'x'), {7}, {});
  EXPECT_TRUE(c.truncated());
  EXPECT_EQ(std::move(c).take(), std::string(8, 'x'));
  auto d = feed(8, std::string(1000, 'x'), {7});
  EXPECT_EQ(std::move(d).take(), std::string(8, 'x'));
}

TEST(CappedOutput, TheFirstOfSeveralTokensWins) {
  const std::string a = "<<A>>", b = "<<BB>>";
  auto c = feed(4, "head....." + b + "x" + a + "y", {2}, {a, b});
  EXPECT_EQ(std::move(c).take(), "head<<BB");  // the frame bounded by the cap too
}

TEST(CappedOutput, RandomSplitsAgreeWithOneRead) {
  std::mt19937 rng(7);
  for (int round = 0; round < 300; ++round) {
    const std::size_t cap = 1 + rng() % 40;
    std::string text(rng() % 120, 'a');
    for (auto& ch : text) ch = "ab<T>"[rng() % 5];
    if (rng() % 2) text.insert(rng() % (text.size() + 1), "<T>");
    auto whole = feed(cap, text, {text.size() + 1}, {"<T>"});
    std::vector<std::size_t> pieces;
    for (int i = 0; i < 5; ++i) pieces.push_back(1 + rng() % 9);
    auto split = feed(cap, text, pieces, {"<T>"});
    EXPECT_EQ(whole.truncated(), split.truncated());
    EXPECT_EQ(std::move(whole).take(), std::move(split).take()) << text << " cap " << cap;
  }
}

}  // namespace
}  // namespace tsb::core
