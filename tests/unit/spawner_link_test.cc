// The front end's link to the root spawner (daemon/frontend/local/spawner_link.h),
// against a fake spawner on the other end of a SOCK_SEQPACKET pair: what
// it sends when the socket is full.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "daemon/frontend/local/spawner_link.h"
#include "daemon/wire/compiled.h"
#include "daemon/frontend/local/front_codec.h"

namespace tsb::core {
namespace {

// A link on one end of a SOCK_SEQPACKET pair whose send buffer holds
// 128 KiB (the kernel doubles the 64 KiB asked for: four 40 KiB orders, as
// a send needs only the buffer not yet full), a fake spawner on the other
// end that has sent its Hello. Each test starts the link.
struct SpawnerLinkTest : ::testing::Test {
  void SetUp() override {
    int sv[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
    spawner = UniqueFd(sv[1]);
    const int small = 65536;
    ASSERT_EQ(::setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &small, sizeof small), 0);
    ASSERT_TRUE(spawn::send_message(spawner.get(), spawn::encode(spawn::Hello{})).ok());
    link = std::make_unique<SpawnerLink>(io, UniqueFd(sv[0]));
    ASSERT_TRUE(link->handshake().ok());
  }
  UniqueFd spawner;
  asio::io_context io;
  std::unique_ptr<SpawnerLink> link;
};

// Orders with large environments that find the socket full (the spawner
// busy spawning, reading nothing) wait their turn: none is refused as
// "not reachable", none overtakes another, and a cancel's Kill that comes
// meanwhile is not lost but follows its run's order.
TEST_F(SpawnerLinkTest, MessagesThatFindTheSocketFullWaitTheirTurn) {
  link->start();

  constexpr int kRuns = 6;
  constexpr std::size_t kEnvBytes = 40000;
  CancelSignal cancels[kRuns];
  std::vector<LinkRun> outs(kRuns);
  int done = 0;
  for (int i = 0; i < kRuns; ++i)
    asio::co_spawn(io, [&, i]() -> asio::awaitable<void> {
      spawn::RunOrder o;
      o.policy = "p";
      o.fingerprint = "f";
      o.env = {{"BIG", std::string(kEnvBytes, static_cast<char>('a' + i))}};
      o.timeout = std::chrono::seconds(1);
      outs[i] = co_await link->run(std::move(o), "", 1024, 1024, {}, cancels[i]);
      ++done;
    }, asio::detached);
  auto pump = [&](auto until, int rounds) {
    for (int k = 0; k < rounds && !until(); ++k) io.run_one_for(std::chrono::milliseconds(5));
  };
  pump([] { return false; }, 40);  // every order sent or queued; the spawner reads nothing yet
  ASSERT_EQ(done, 0) << "a run was answered before the spawner read anything";
  cancels[4].request();  // its order is still queued: the Kill goes after it
  pump([] { return false; }, 20);

  // The spawner reads: every order, in order, whole; the Kill after run 5's.
  std::vector<std::uint64_t> ids;
  std::uint64_t killed = 0;
  std::size_t kill_at = 0;
  for (int k = 0; k < 400 && (ids.size() < kRuns || killed == 0); ++k) {
    std::vector<UniqueFd> fds;
    auto m = spawn::receive_message(spawner.get(), &fds, MSG_DONTWAIT);
    if (!m.ok()) {
      ASSERT_EQ(m.error().code, EAGAIN) << m.error().message;
      io.run_one_for(std::chrono::milliseconds(5));  // room now: the link sends what it queued
      continue;
    }
    if (spawn::message_type(*m) == spawn::Msg::Kill) {
      auto kill = spawn::decode_kill(*m);
      ASSERT_TRUE(kill.ok());
      killed = kill->id, kill_at = ids.size();
      continue;
    }
    auto order = spawn::decode_run(*m);
    ASSERT_TRUE(order.ok()) << order.error().message;
    ASSERT_EQ(order->env.at("BIG"), std::string(kEnvBytes, static_cast<char>('a' + ids.size())));
    ids.push_back(order->id);
  }
  ASSERT_EQ(ids.size(), static_cast<std::size_t>(kRuns));
  for (int i = 1; i < kRuns; ++i) EXPECT_LT(ids[i - 1], ids[i]);
  EXPECT_EQ(killed, ids[4]);
  EXPECT_GE(kill_at, 5u);

  // The spawner answers each; every run sees its own answer.
  for (int i = 0; i < kRuns; ++i)
    ASSERT_TRUE(spawn::send_message(spawner.get(), spawn::encode(spawn::Refused{ids[i], spawn::RefuseCode::Busy,
                                                                                "busy " + std::to_string(i)}))
                    .ok());
  pump([&] { return done == kRuns; }, 400);
  ASSERT_EQ(done, kRuns);
  for (int i = 0; i < kRuns; ++i) {
    ASSERT_TRUE(outs[i].refused);
    EXPECT_EQ(outs[i].refused->code, spawn::RefuseCode::Busy) << outs[i].refused->message;
    EXPECT_EQ(outs[i].refused->message, "busy " + std::to_string(i));
  }
}

// A message larger than the socket can ever take is refused at once, even
// behind queued ones (where the kernel would never see it), and says so
// (EMSGSIZE): the front end answers that run "too large" instead of
// waiting for a send that cannot happen.
TEST_F(SpawnerLinkTest, AnOrderLargerThanTheSocketIsRefusedAtOnce) {
  link->start();
  CancelSignal cancel[7];
  std::optional<LinkRun> out[7];
  for (int i = 0; i < 7; ++i)  // six that fill the socket and the queue, then one too large
    asio::co_spawn(io, [&, i]() -> asio::awaitable<void> {
      spawn::RunOrder o;
      o.policy = "p";
      o.fingerprint = "f";
      o.timeout = std::chrono::seconds(1);
      o.env = {{"BIG", std::string(i < 6 ? 40000 : 200000, 'x')}};
      out[i] = co_await link->run(std::move(o), "", 1024, 1024, {}, cancel[i]);
    }, asio::detached);
  for (int k = 0; k < 100 && !out[6]; ++k) io.run_one_for(std::chrono::milliseconds(5));
  ASSERT_TRUE(out[6] && out[6]->refused);
  EXPECT_EQ(out[6]->refused->code, spawn::RefuseCode::OutOfBounds) << out[6]->refused->message;
  for (int i = 0; i < 6; ++i) EXPECT_FALSE(out[i]) << i;  // waiting for the spawner's answer
  // The spawner sees the six, and nothing else.
  std::vector<UniqueFd> fds;
  int orders = 0;
  for (int k = 0; k < 400; ++k) {
    auto m = spawn::receive_message(spawner.get(), &fds, MSG_DONTWAIT);
    if (!m.ok()) {
      ASSERT_EQ(m.error().code, EAGAIN);
      if (orders == 6) break;
      io.run_one_for(std::chrono::milliseconds(5));
      continue;
    }
    auto o = spawn::decode_run(*m);
    ASSERT_TRUE(o.ok());
    EXPECT_EQ(o->env.at("BIG").size(), 40000u);
    ++orders;
    ASSERT_TRUE(spawn::send_message(spawner.get(), spawn::encode(spawn::Refused{o->id, spawn::RefuseCode::Busy, "b"})).ok());
  }
  EXPECT_EQ(orders, 6);
  // Every run answered before the link and the loop go.
  auto all = [&] { return std::all_of(std::begin(out), std::end(out), [](const auto& o) { return o.has_value(); }); };
  for (int k = 0; k < 400 && !all(); ++k) io.run_one_for(std::chrono::milliseconds(5));
  ASSERT_TRUE(all());
}

// A spawner that never answers (hung): the run is given up a margin past
// its timeout, said so, and killed should the spawner come back; the
// client is not left waiting for ever. One it had started is a run (its
// record kept), cancelled; one it never answered is refused.
TEST_F(SpawnerLinkTest, ARunTheSpawnerNeverEndsIsGivenUpPastItsTimeout) {
  link->set_overdue_margin(std::chrono::milliseconds(200));
  link->start();
  for (bool started : {false, true}) {
    SCOPED_TRACE(started ? "after Started" : "before any answer");
    CancelSignal cancel;
    std::optional<LinkRun> out;
    const auto t0 = std::chrono::steady_clock::now();
    asio::co_spawn(io, [&]() -> asio::awaitable<void> {
      spawn::RunOrder o;
      o.policy = "p";
      o.fingerprint = "f";
      o.timeout = std::chrono::milliseconds(100);
      out = co_await link->run(std::move(o), "", 1024, 1024, {}, cancel);
    }, asio::detached);
    for (int k = 0; k < 10; ++k) io.run_one_for(std::chrono::milliseconds(5));
    std::vector<UniqueFd> fds;
    auto m = spawn::receive_message(spawner.get(), &fds, MSG_DONTWAIT);
    ASSERT_TRUE(m.ok());
    auto order = spawn::decode_run(*m);
    ASSERT_TRUE(order.ok());
    if (started) {  // stdio as the spawner sends it; then nothing more
      int a[2], b[2], c[2];
      ASSERT_EQ(::pipe2(a, O_CLOEXEC), 0);
      ASSERT_EQ(::pipe2(b, O_CLOEXEC), 0);
      ASSERT_EQ(::pipe2(c, O_CLOEXEC), 0);
      UniqueFd keep[] = {UniqueFd(a[0]), UniqueFd(b[1]), UniqueFd(c[1])};  // the run's ends, held open
      const int give[] = {a[1], b[0], c[0]};
      ASSERT_TRUE(spawn::send_message(spawner.get(), spawn::encode(spawn::Started{order->id, "run", 1, false}), give, 3)
                      .ok());
      for (int fd : give) ::close(fd);
      for (int k = 0; k < 400 && !out; ++k) io.run_one_for(std::chrono::milliseconds(5));
    } else {
      for (int k = 0; k < 400 && !out; ++k) io.run_one_for(std::chrono::milliseconds(5));
    }
    ASSERT_TRUE(out);
    EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(300));  // its timeout and the margin
    if (!started) {
      ASSERT_TRUE(out->refused);
      EXPECT_EQ(out->refused->code, spawn::RefuseCode::Unavailable);
      EXPECT_NE(out->refused->message.find("did not answer the run in time"), std::string::npos)
          << out->refused->message;
    } else {  // it ran: a run with its record, cancelled
      ASSERT_FALSE(out->refused) << out->refused->message;
      EXPECT_EQ(out->result.run_id, "run");
      EXPECT_EQ(out->result.reason, isolate::EndReason::Cancelled);
      EXPECT_NE(out->result.error.find("given up and killed"), std::string::npos) << out->result.error;
    }
    m = spawn::receive_message(spawner.get(), &fds, MSG_DONTWAIT);
    ASSERT_TRUE(m.ok()) << "no Kill";
    auto kill = spawn::decode_kill(*m);
    ASSERT_TRUE(kill.ok());
    EXPECT_EQ(kill->id, order->id);
  }
}

}  // namespace
}  // namespace tsb::core
