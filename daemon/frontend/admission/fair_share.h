// Per-peer fairness of the front end's shared pools (docs/SECURITY.md,
// "Per-peer fairness"): open connections (max_connections), request bytes
// held (max_buffered_bytes), run slots (max_concurrent_runs) and places in
// the run queue (max_queued_runs).
//
// A peer is a uid (SO_PEERCRED) with a connection open; N is how many there
// are (at least 1). Each peer's share of a pool of size P is max(P / N,
// floor), rounded up for run slots. A peer within its share is never
// refused for what another peer holds over its own share:
//   - connections and request bytes: when the pool is full, the peer most
//     over its share gives back one connection that is reading a request
//     (the one holding least for connections, most for bytes): it is
//     closed with `busy`, saying it was its share. A peer at or over its
//     share is refused itself, as it was when the pool was full;
//   - run slots: a peer at its share waits in the queue, even while slots
//     are free for other peers; a free slot goes to the waiting peer with
//     the fewest runs, among equals the one served least recently, oldest
//     first within a peer. A run in flight is never stopped to make room;
//   - queue places: a peer at its share is answered `busy` at once; when
//     the queue is full, the peer most over its share loses its newest
//     queued run (answered `busy`, never started).
// Within a uid, each connection holds at most one request at a time, and
// what a uid gives back is its connection holding most (bytes) or least
// (connections).
//
// Pure accounting, single-threaded (the front end's event loop); the
// server and the local backend act on its answers.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>

namespace tsb::core {

struct PoolLimits {
  std::size_t buffered_bytes = 256u << 20;  // max_buffered_bytes, charged beyond each connection's allowance
  std::size_t byte_floor = 32u << 20;       // max_frame_bytes: a share always holds one maximal request
  std::size_t allowance = 64u << 10;        // kConnectionAllowance: not charged
  unsigned connections = 256;               // max_connections
  unsigned running = 8;                     // max_concurrent_runs
  unsigned queued = 32;                     // max_queued_runs
};

class FairShare;

// One open connection's place in the pools; gives everything back when
// destroyed. Made by FairShare::open.
class PeerConn {
 public:
  ~PeerConn();
  PeerConn(const PeerConn&) = delete;
  PeerConn& operator=(const PeerConn&) = delete;

  enum class Take { Taken, OverShare, Full };
  // n more request bytes: taken, or refused because this peer holds its
  // share (OverShare), or because the pool is full of what peers within
  // their shares hold (Full). Taking may close other peers' connections
  // that hold more than their share.
  Take try_take(std::size_t n);
  // n more bytes even past every limit (an answer: its run happened).
  void take(std::size_t n);
  void release(std::size_t n);
  // Reading a request (true): nothing of a run is held, so the connection
  // may be closed to make room for another peer.
  void set_reading(bool reading) { reading_ = reading; }

  uid_t uid() const noexcept { return uid_; }
  std::size_t bytes() const noexcept { return bytes_; }
  // Closed to make room for another peer's connection or request line:
  // what it held is given back already; the server closes it with `busy`.
  enum class GaveUp { No, Connection, RequestLine };
  GaveUp gave_up() const noexcept { return gave_up_; }

 private:
  friend class FairShare;
  PeerConn(FairShare& f, uid_t uid, std::function<void()> close) : f_(f), uid_(uid), close_(std::move(close)) {}
  std::size_t charged_for(std::size_t b) const;
  std::size_t charged() const { return charged_for(bytes_); }

  FairShare& f_;
  uid_t uid_;
  std::function<void()> close_;
  std::size_t bytes_ = 0;
  bool reading_ = false;
  GaveUp gave_up_ = GaveUp::No;
};

class FairShare {
 public:
  explicit FairShare(PoolLimits limits) : limits_(limits) {}
  void set_limits(PoolLimits limits) { limits_ = limits; }
  const PoolLimits& limits() const noexcept { return limits_; }

  // --- peers and connections ---------------------------------------------
  // A new connection of `uid`, or nothing when it is refused (the pool is
  // full and `uid` holds its share, or no peer is over its share). `close`
  // is called when the connection gives its place up for another peer.
  std::unique_ptr<PeerConn> open(uid_t uid, std::function<void()> close);
  unsigned peers() const noexcept { return peers_ ? peers_ : 1; }
  unsigned connections() const noexcept { return connections_; }
  unsigned connections(uid_t uid) const;
  // Called when the peers change (a uid's first connection or last one):
  // every share changes with them.
  std::function<void()> on_peers_changed;

  // --- shares ----------------------------------------------------------
  std::size_t byte_share() const;
  unsigned connection_share() const { return share(limits_.connections, 1); }
  // Rounded up: with slots that do not divide evenly, no slot stays idle
  // while every peer waits at a rounded-down share (8 slots, 3 peers: 3).
  unsigned run_share() const { return limits_.running ? share(limits_.running + peers() - 1, 1) : 0; }
  unsigned queue_share() const { return share(limits_.queued, 1); }

  // --- request bytes ---------------------------------------------------
  std::size_t charged() const noexcept { return charged_; }  // what max_buffered_bytes applies to
  std::size_t charged(uid_t uid) const;
  std::size_t held() const noexcept { return held_; }        // allowances included (status)

  // --- runs --------------------------------------------------------------
  enum class Admit { Start, Queue, BusyShare, BusyFull };
  struct Admission {
    Admit admit = Admit::BusyFull;
    std::optional<std::uint64_t> dropped;  // the queued run that gave its place up (answered busy)
  };
  // A new run of `uid`, known by `id` from now on: it starts now, or
  // queues (perhaps in the place of another peer's newest queued run), or
  // is refused.
  Admission admit_run(uid_t uid, std::uint64_t id);
  // The queued run to start next, counted as running; nothing while no
  // slot is free or every waiting peer holds its share of slots.
  std::optional<std::uint64_t> next_run();
  // A queued run that leaves the queue without starting (its client went,
  // shutdown).
  void leave_queue(std::uint64_t id);
  void run_ended(uid_t uid);
  unsigned running() const noexcept { return running_; }
  unsigned running(uid_t uid) const;
  std::size_t queued() const noexcept { return queue_.size(); }
  unsigned queued(uid_t uid) const;

  // Counters for status.
  std::uint64_t connections_given_up() const noexcept { return connections_given_up_; }
  std::uint64_t lines_given_up() const noexcept { return lines_given_up_; }
  std::uint64_t queued_runs_given_up() const noexcept { return queued_runs_given_up_; }

 private:
  friend class PeerConn;
  struct Use {
    unsigned connections = 0;
    std::size_t charged = 0;
    unsigned running = 0;
    unsigned queued = 0;
    std::uint64_t last_start = 0;  // when a run of this peer last took a slot (0: never)
  };
  struct Waiting {
    std::uint64_t id;
    uid_t uid;
  };
  // max(pool / peers, floor); 0 for an empty pool.
  unsigned share(unsigned pool, unsigned floor, unsigned peers) const;
  unsigned share(unsigned pool, unsigned floor) const { return share(pool, floor, peers()); }
  // The next queued run to start: its place in queue_, or none.
  std::optional<std::size_t> pick() const;
  Use& use(uid_t uid) { return use_[uid]; }
  const Use* find(uid_t uid) const;
  void forget_if_unused(uid_t uid);
  // The peer, other than `except`, most over its share by `over`, among
  // those with a connection `pick` returns; that connection.
  PeerConn* over_share(uid_t except, const std::function<std::size_t(const Use&)>& over,
                       const std::function<PeerConn*(uid_t)>& pick) const;
  void give_up(PeerConn& c, PeerConn::GaveUp why);
  void connection_closed(PeerConn& c);

  PoolLimits limits_;
  std::map<uid_t, Use> use_;
  std::set<PeerConn*> conns_;
  std::deque<Waiting> queue_;  // arrival order
  unsigned peers_ = 0;         // uids with a connection open
  unsigned connections_ = 0;
  std::size_t charged_ = 0;
  std::size_t held_ = 0;
  unsigned running_ = 0;
  std::uint64_t starts_ = 0;
  std::uint64_t connections_given_up_ = 0;
  std::uint64_t lines_given_up_ = 0;
  std::uint64_t queued_runs_given_up_ = 0;
};

}  // namespace tsb::core
