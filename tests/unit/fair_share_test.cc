// The accounting of per-peer fairness (daemon/frontend/admission/fair_share.h):
// shares, what a peer over its share gives up, and for whom.
#include "daemon/frontend/admission/fair_share.h"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

namespace tsb::core {
namespace {

constexpr std::size_t kKiB = 1024, kMiB = 1024 * kKiB;
constexpr uid_t kHostile = 65534, kGood = 0;

PoolLimits limits() {
  return PoolLimits{.buffered_bytes = 4 * kMiB,
                    .byte_floor = 1 * kMiB,
                    .allowance = 64 * kKiB,
                    .connections = 8,
                    .running = 4,
                    .queued = 8};
}

// A connection and whether it was told to close.
struct Conn {
  std::shared_ptr<bool> closed = std::make_shared<bool>(false);
  std::unique_ptr<PeerConn> c;
};

Conn open(FairShare& f, uid_t uid, bool reading = true) {
  Conn k;
  k.c = f.open(uid, [closed = k.closed] { *closed = true; });
  if (k.c) k.c->set_reading(reading);
  return k;
}

TEST(FairShare, SharesDivideEachPoolByPeersAboveTheirFloors) {
  FairShare f(limits());
  EXPECT_EQ(f.peers(), 1u);  // never 0: the peer asking counts
  EXPECT_EQ(f.byte_share(), 4 * kMiB);
  Conn a = open(f, kHostile), a2 = open(f, kHostile);
  EXPECT_EQ(f.peers(), 1u);
  EXPECT_EQ(f.run_share(), 4u);
  Conn b = open(f, kGood);
  EXPECT_EQ(f.peers(), 2u);
  EXPECT_EQ(f.byte_share(), 2 * kMiB);
  EXPECT_EQ(f.connection_share(), 4u);
  EXPECT_EQ(f.run_share(), 2u);
  EXPECT_EQ(f.queue_share(), 4u);
  Conn c = open(f, 7), d = open(f, 8), e = open(f, 9);
  EXPECT_EQ(f.peers(), 5u);
  EXPECT_EQ(f.byte_share(), 1 * kMiB);  // the floor: one maximal request
  EXPECT_EQ(f.run_share(), 1u);
  e.c.reset();
  d.c.reset();
  c.c.reset();
  b.c.reset();
  EXPECT_EQ(f.peers(), 1u);
  // An empty pool is shared as nothing, not as its floor.
  PoolLimits l = limits();
  l.queued = 0;
  FairShare g(l);
  EXPECT_EQ(g.queue_share(), 0u);
}

TEST(FairShare, AllowanceIsNotChargedAndEverythingIsGivenBackAtClose) {
  FairShare f(limits());
  {
    Conn a = open(f, kHostile);
    EXPECT_EQ(a.c->try_take(64 * kKiB), PeerConn::Take::Taken);
    EXPECT_EQ(f.charged(), 0u);
    EXPECT_EQ(f.held(), 64 * kKiB);
    EXPECT_EQ(a.c->try_take(kMiB), PeerConn::Take::Taken);
    EXPECT_EQ(f.charged(), kMiB);
    EXPECT_EQ(f.charged(kHostile), kMiB);
    a.c->release(kMiB / 2);
    EXPECT_EQ(f.charged(), kMiB / 2);
    a.c->take(8 * kMiB);  // an answer: past every limit
    EXPECT_EQ(f.charged(kHostile), kMiB / 2 + 8 * kMiB);
  }
  EXPECT_EQ(f.charged(), 0u);
  EXPECT_EQ(f.held(), 0u);
  EXPECT_EQ(f.connections(), 0u);
  EXPECT_EQ(f.charged(kHostile), 0u);
}

TEST(FairShare, APeerAloneMayTakeTheWholeBudgetAndIsRefusedPastIt) {
  FairShare f(limits());
  Conn a = open(f, kHostile), b = open(f, kHostile);
  EXPECT_EQ(a.c->try_take(64 * kKiB + 3 * kMiB), PeerConn::Take::Taken);
  EXPECT_EQ(b.c->try_take(64 * kKiB + 1 * kMiB), PeerConn::Take::Taken);
  EXPECT_EQ(f.charged(), 4 * kMiB);
  // Its own lines are never given up for its own: it is refused.
  EXPECT_EQ(b.c->try_take(1), PeerConn::Take::OverShare);
  EXPECT_FALSE(*a.closed);
  EXPECT_EQ(f.lines_given_up(), 0u);
}

TEST(FairShare, APeerOverItsShareGivesUpItsLargestLineToAPeerWithinItsShare) {
  FairShare f(limits());
  Conn h1 = open(f, kHostile), h2 = open(f, kHostile), h3 = open(f, kHostile);
  ASSERT_EQ(h1.c->try_take(64 * kKiB + 1 * kMiB), PeerConn::Take::Taken);
  ASSERT_EQ(h2.c->try_take(64 * kKiB + 2 * kMiB), PeerConn::Take::Taken);
  ASSERT_EQ(h3.c->try_take(64 * kKiB + 1 * kMiB), PeerConn::Take::Taken);
  ASSERT_EQ(f.charged(), 4 * kMiB);
  // Another peer arrives: the shares are 2 MiB each. Its request line of
  // 1.5 MiB is within its share; the hostile peer holds 4 MiB, over its
  // own, and gives up its largest line being read.
  Conn g = open(f, kGood);
  EXPECT_EQ(g.c->try_take(64 * kKiB), PeerConn::Take::Taken);  // the allowance: nothing charged
  EXPECT_EQ(g.c->try_take(kMiB + kMiB / 2), PeerConn::Take::Taken);
  EXPECT_TRUE(*h2.closed);
  EXPECT_EQ(h2.c->gave_up(), PeerConn::GaveUp::RequestLine);
  EXPECT_FALSE(*h1.closed);
  EXPECT_FALSE(*h3.closed);
  EXPECT_EQ(f.lines_given_up(), 1u);
  EXPECT_EQ(f.charged(kHostile), 2 * kMiB);
  EXPECT_EQ(f.charged(), 2 * kMiB + kMiB + kMiB / 2);
  // A given-up connection counts for nothing any more, also when it goes.
  EXPECT_EQ(f.connections(kHostile), 2u);
  h2.c->release(kMiB);
  h2.c.reset();
  EXPECT_EQ(f.connections(kHostile), 2u);
  EXPECT_EQ(f.charged(), 2 * kMiB + kMiB + kMiB / 2);
  // The hostile peer, at its share, is refused more; the other peer still
  // has room up to its own.
  EXPECT_EQ(h1.c->try_take(1), PeerConn::Take::OverShare);
  EXPECT_EQ(g.c->try_take(kMiB / 2), PeerConn::Take::Taken);
  EXPECT_EQ(g.c->try_take(1), PeerConn::Take::OverShare);
}

TEST(FairShare, WhatIsHeldForARunIsNeverGivenUp) {
  FairShare f(limits());
  Conn h = open(f, kHostile);
  ASSERT_EQ(h.c->try_take(64 * kKiB + 4 * kMiB), PeerConn::Take::Taken);
  h.c->set_reading(false);  // a request being handled, or its answer
  Conn g = open(f, kGood);
  EXPECT_EQ(g.c->try_take(64 * kKiB + kMiB), PeerConn::Take::Full);
  EXPECT_FALSE(*h.closed);
  // Small requests are still read: the allowance needs no budget.
  EXPECT_EQ(g.c->try_take(64 * kKiB), PeerConn::Take::Taken);
}

TEST(FairShare, PeersWhoseFloorsOverlapAreNotGivenUp) {
  PoolLimits l = limits();
  l.byte_floor = 3 * kMiB;  // two peers' floors are more than the budget
  FairShare f(l);
  Conn h = open(f, kHostile), g = open(f, kGood);
  ASSERT_EQ(f.byte_share(), 3 * kMiB);
  ASSERT_EQ(h.c->try_take(64 * kKiB + 3 * kMiB), PeerConn::Take::Taken);  // within its share
  EXPECT_EQ(g.c->try_take(64 * kKiB + 2 * kMiB), PeerConn::Take::Full);
  EXPECT_FALSE(*h.closed);
}

TEST(FairShare, APeerHoldingEveryConnectionGivesOneUpForEachNewPeerConnection) {
  FairShare f(limits());
  std::vector<Conn> hostile;
  for (int i = 0; i < 8; ++i) hostile.push_back(open(f, kHostile));
  ASSERT_TRUE(hostile.back().c);
  hostile[0].c->try_take(10);  // holds a little: idle ones go first
  hostile[1].c->set_reading(false);  // a run in flight: never given up
  // Alone and at the cap: refused.
  Conn more = open(f, kHostile);
  EXPECT_FALSE(more.c);
  // Another peer: one of the hostile peer's idle connections gives its place up.
  Conn g = open(f, kGood);
  ASSERT_TRUE(g.c);
  EXPECT_EQ(f.connections_given_up(), 1u);
  int closed = 0;
  for (auto& h : hostile) closed += *h.closed;
  EXPECT_EQ(closed, 1);
  EXPECT_FALSE(*hostile[0].closed);
  EXPECT_FALSE(*hostile[1].closed);
  EXPECT_EQ(f.connections(kHostile), 7u);
  EXPECT_EQ(f.connections(), 8u);
  // The hostile peer, over its share of 4, cannot take one back.
  EXPECT_FALSE(open(f, kHostile).c);
  // The other peer takes up to its share, one hostile connection each.
  std::vector<Conn> good;
  for (int i = 0; i < 3; ++i) {
    good.push_back(open(f, kGood));
    EXPECT_TRUE(good.back().c);
  }
  EXPECT_EQ(f.connections(kHostile), 4u);
  EXPECT_EQ(f.connections(kGood), 4u);
  // Both at their share now: a fifth of the good peer's is refused, and
  // nothing of the hostile peer's is given up for it.
  EXPECT_FALSE(open(f, kGood).c);
  EXPECT_EQ(f.connections(kHostile), 4u);
}

TEST(FairShare, RunSlotsAreKeptForAConnectedPeerAndHandedOutFewestRunsFirst) {
  FairShare f(limits());  // 4 slots, 8 queue places
  Conn h = open(f, kHostile), g = open(f, kGood);
  // Two peers: 2 slots and 4 queue places each.
  EXPECT_EQ(f.admit_run(kHostile, 1).admit, FairShare::Admit::Start);
  EXPECT_EQ(f.admit_run(kHostile, 2).admit, FairShare::Admit::Start);
  // Slots are free, but the hostile peer holds its share of them: it waits.
  EXPECT_EQ(f.admit_run(kHostile, 3).admit, FairShare::Admit::Queue);
  EXPECT_EQ(f.admit_run(kHostile, 4).admit, FairShare::Admit::Queue);
  EXPECT_EQ(f.admit_run(kHostile, 5).admit, FairShare::Admit::Queue);
  EXPECT_EQ(f.admit_run(kHostile, 6).admit, FairShare::Admit::Queue);
  EXPECT_EQ(f.admit_run(kHostile, 7).admit, FairShare::Admit::BusyShare);
  EXPECT_EQ(f.next_run(), std::nullopt);
  // The other peer's runs start at once, in the slots kept for it.
  EXPECT_EQ(f.admit_run(kGood, 10).admit, FairShare::Admit::Start);
  EXPECT_EQ(f.admit_run(kGood, 11).admit, FairShare::Admit::Start);
  EXPECT_EQ(f.admit_run(kGood, 12).admit, FairShare::Admit::Queue);
  EXPECT_EQ(f.running(), 4u);
  // A slot the hostile peer frees goes to its own oldest waiter (it has
  // fewer runs than the other peer); one the good peer frees, to its own.
  f.run_ended(kHostile);
  EXPECT_EQ(f.next_run(), std::optional<std::uint64_t>(3));
  EXPECT_EQ(f.next_run(), std::nullopt);
  f.run_ended(kGood);
  EXPECT_EQ(f.next_run(), std::optional<std::uint64_t>(12));
  // The good peer goes: the hostile peer's share is every slot again.
  f.run_ended(kGood);
  f.run_ended(kGood);
  g.c.reset();
  EXPECT_EQ(f.run_share(), 4u);
  EXPECT_EQ(f.next_run(), std::optional<std::uint64_t>(4));
  EXPECT_EQ(f.next_run(), std::optional<std::uint64_t>(5));
  EXPECT_EQ(f.next_run(), std::nullopt);  // 4 running
  f.leave_queue(6);
  EXPECT_EQ(f.queued(), 0u);
  EXPECT_EQ(f.queued(kHostile), 0u);
}

// 4 slots, 3 peers: a share of 4 / 3 rounded down (1) would leave a slot
// idle while every peer waits; rounded up (2), all 4 run.
TEST(FairShare, NoRunSlotStaysIdleWhenThePoolDoesNotDivideEvenly) {
  FairShare f(limits());
  Conn a = open(f, kHostile), b = open(f, kGood), c = open(f, 7);
  ASSERT_EQ(f.peers(), 3u);
  EXPECT_EQ(f.run_share(), 2u);
  std::uint64_t id = 1;
  for (uid_t uid : {kHostile, kGood, uid_t{7}})
    for (int i = 0; i < 2; ++i) f.admit_run(uid, id++);
  while (f.next_run()) {
  }
  EXPECT_EQ(f.running(), 4u);
}

TEST(FairShare, AFullQueueTakesThePlaceOfThePeerMostOverItsShare) {
  PoolLimits l = limits();
  l.running = 1;
  l.queued = 4;
  FairShare f(l);
  Conn h = open(f, kHostile);
  // Alone, the hostile peer takes the slot and the whole queue.
  EXPECT_EQ(f.admit_run(kHostile, 1).admit, FairShare::Admit::Start);
  for (std::uint64_t id = 2; id <= 5; ++id) EXPECT_EQ(f.admit_run(kHostile, id).admit, FairShare::Admit::Queue);
  EXPECT_EQ(f.admit_run(kHostile, 6).admit, FairShare::Admit::BusyShare);  // its share: the whole queue
  // Another peer connects: 2 queue places each. Its run takes the place
  // of the hostile peer's newest queued run, which never starts.
  Conn g = open(f, kGood);
  FairShare::Admission a = f.admit_run(kGood, 10);
  EXPECT_EQ(a.admit, FairShare::Admit::Queue);
  EXPECT_EQ(a.dropped, std::optional<std::uint64_t>(5));
  EXPECT_EQ(f.queued_runs_given_up(), 1u);
  a = f.admit_run(kGood, 11);
  EXPECT_EQ(a.dropped, std::optional<std::uint64_t>(4));
  // Both at their share: the next is refused, and the hostile peer's
  // places stay.
  a = f.admit_run(kGood, 12);
  EXPECT_EQ(a.admit, FairShare::Admit::BusyShare);
  EXPECT_EQ(a.dropped, std::nullopt);
  EXPECT_EQ(f.queued(kHostile), 2u);
  EXPECT_EQ(f.queued(kGood), 2u);
  // Slots as they free go to each peer in turn: first the peer whose run
  // took one least recently.
  f.run_ended(kHostile);
  EXPECT_EQ(f.next_run(), std::optional<std::uint64_t>(10));
  f.run_ended(kGood);
  EXPECT_EQ(f.next_run(), std::optional<std::uint64_t>(2));
  f.run_ended(kHostile);
  EXPECT_EQ(f.next_run(), std::optional<std::uint64_t>(11));
  f.run_ended(kGood);
  EXPECT_EQ(f.next_run(), std::optional<std::uint64_t>(3));
}

TEST(FairShare, PeersChangingIsSaid) {
  FairShare f(limits());
  int changes = 0;
  f.on_peers_changed = [&] { ++changes; };
  Conn a = open(f, kHostile);
  Conn b = open(f, kHostile);
  EXPECT_EQ(changes, 1);
  Conn c = open(f, kGood);
  EXPECT_EQ(changes, 2);
  b.c.reset();
  EXPECT_EQ(changes, 2);
  a.c.reset();
  c.c.reset();
  EXPECT_EQ(changes, 4);
}

}  // namespace
}  // namespace tsb::core
