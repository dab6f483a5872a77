#include "daemon/frontend/admission/fair_share.h"

#include <algorithm>
#include <utility>
#include <vector>

namespace tsb::core {

// --- PeerConn --------------------------------------------------------------

std::size_t PeerConn::charged_for(std::size_t b) const {
  return b > f_.limits_.allowance ? b - f_.limits_.allowance : 0;
}

PeerConn::~PeerConn() {
  if (gave_up_ != GaveUp::No) return;  // given back and counted out already
  release(bytes_);
  f_.connection_closed(*this);
}

PeerConn::Take PeerConn::try_take(std::size_t n) {
  if (gave_up_ != GaveUp::No) return Take::Full;
  const std::size_t more = charged_for(bytes_ + n) - charged();
  // Within the connection's own allowance nothing is charged: always fits.
  if (more == 0) {
    take(n);
    return Take::Taken;
  }
  const std::size_t share = f_.byte_share();
  if (f_.use(uid_).charged + more > share) return Take::OverShare;
  // The pool is full of what others hold: the peer most over its share
  // gives back its largest line being read, until this fits.
  while (f_.charged_ + more > f_.limits_.buffered_bytes) {
    PeerConn* victim = f_.over_share(
        uid_, [share](const FairShare::Use& u) { return u.charged > share ? u.charged - share : 0; },
        [this](uid_t other) {
          PeerConn* best = nullptr;
          for (PeerConn* c : f_.conns_)
            if (c->uid_ == other && c->reading_ && c->charged() > 0 && (!best || c->charged() > best->charged()))
              best = c;
          return best;
        });
    if (!victim) return Take::Full;
    ++f_.lines_given_up_;
    f_.give_up(*victim, GaveUp::RequestLine);
  }
  take(n);
  return Take::Taken;
}

void PeerConn::take(std::size_t n) {
  const std::size_t more = charged_for(bytes_ + n) - charged();
  bytes_ += n;
  if (gave_up_ != GaveUp::No) return;
  f_.charged_ += more;
  f_.held_ += n;
  f_.use(uid_).charged += more;
}

void PeerConn::release(std::size_t n) {
  n = std::min(n, bytes_);
  const std::size_t less = charged() - charged_for(bytes_ - n);
  bytes_ -= n;
  if (gave_up_ != GaveUp::No) return;
  f_.charged_ -= less;
  f_.held_ -= n;
  f_.use(uid_).charged -= less;
  f_.forget_if_unused(uid_);
}

// --- FairShare ---------------------------------------------------------------

unsigned FairShare::share(unsigned pool, unsigned floor, unsigned peers) const {
  if (pool == 0) return 0;
  return std::max(pool / std::max(peers, 1u), floor);
}

std::size_t FairShare::byte_share() const {
  return std::max(limits_.buffered_bytes / peers(), std::min(limits_.byte_floor, limits_.buffered_bytes));
}

const FairShare::Use* FairShare::find(uid_t uid) const {
  auto it = use_.find(uid);
  return it == use_.end() ? nullptr : &it->second;
}

void FairShare::forget_if_unused(uid_t uid) {
  auto it = use_.find(uid);
  if (it == use_.end()) return;
  const Use& u = it->second;
  if (u.connections == 0 && u.charged == 0 && u.running == 0 && u.queued == 0) use_.erase(it);
}

unsigned FairShare::connections(uid_t uid) const {
  const Use* u = find(uid);
  return u ? u->connections : 0;
}

std::size_t FairShare::charged(uid_t uid) const {
  const Use* u = find(uid);
  return u ? u->charged : 0;
}

unsigned FairShare::running(uid_t uid) const {
  const Use* u = find(uid);
  return u ? u->running : 0;
}

unsigned FairShare::queued(uid_t uid) const {
  const Use* u = find(uid);
  return u ? u->queued : 0;
}

PeerConn* FairShare::over_share(uid_t except, const std::function<std::size_t(const Use&)>& over,
                                const std::function<PeerConn*(uid_t)>& pick) const {
  // Most over its share first; a peer with nothing that can be given back
  // is passed over.
  std::vector<std::pair<std::size_t, uid_t>> order;
  for (const auto& [uid, u] : use_)
    if (uid != except && over(u) > 0) order.emplace_back(over(u), uid);
  std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (const auto& [amount, uid] : order)
    if (PeerConn* c = pick(uid)) return c;
  return nullptr;
}

void FairShare::give_up(PeerConn& c, PeerConn::GaveUp why) {
  const std::size_t charged = c.charged();
  charged_ -= charged;
  held_ -= c.bytes_;
  use(c.uid_).charged -= charged;
  c.gave_up_ = why;
  connection_closed(c);
  c.close_();
}

void FairShare::connection_closed(PeerConn& c) {
  conns_.erase(&c);
  --connections_;
  Use& u = use(c.uid_);
  const bool last = --u.connections == 0;
  if (last) --peers_;
  forget_if_unused(c.uid_);
  if (last && on_peers_changed) on_peers_changed();
}

std::unique_ptr<PeerConn> FairShare::open(uid_t uid, std::function<void()> close) {
  const unsigned mine = connections(uid);
  if (connections_ >= limits_.connections) {
    // Shares as they are once this peer counts.
    const unsigned cshare = share(limits_.connections, 1, peers_ + (mine == 0 ? 1 : 0));
    if (mine >= cshare) return nullptr;
    // The peer most over its share closes its connection that holds least
    // and is reading (idle between requests, or in a line): no run is lost.
    PeerConn* victim = over_share(
        uid, [cshare](const Use& u) { return u.connections > cshare ? std::size_t{u.connections - cshare} : 0; },
        [this](uid_t other) {
          PeerConn* best = nullptr;
          for (PeerConn* c : conns_)
            if (c->uid_ == other && c->reading_ && (!best || c->bytes_ < best->bytes_)) best = c;
          return best;
        });
    if (!victim) return nullptr;
    ++connections_given_up_;
    give_up(*victim, PeerConn::GaveUp::Connection);
  }
  std::unique_ptr<PeerConn> c(new PeerConn(*this, uid, std::move(close)));
  conns_.insert(c.get());
  ++connections_;
  const bool first = use(uid).connections++ == 0;
  if (first) ++peers_;
  if (first && on_peers_changed) on_peers_changed();
  return c;
}

std::optional<std::size_t> FairShare::pick() const {
  if (running_ >= limits_.running) return std::nullopt;
  const unsigned rshare = run_share();
  // The waiting peer with the fewest runs, below its share; among equals
  // the one whose run took a slot least recently (round robin); within a
  // peer, its oldest waiter.
  std::optional<std::size_t> best;
  std::pair<unsigned, std::uint64_t> best_key{};
  for (std::size_t i = 0; i < queue_.size(); ++i) {
    const Use* u = find(queue_[i].uid);
    const std::pair<unsigned, std::uint64_t> key{u->running, u->last_start};
    if (key.first >= rshare) continue;
    if (!best || key < best_key) {
      best = i;
      best_key = key;
    }
  }
  return best;
}

FairShare::Admission FairShare::admit_run(uid_t uid, std::uint64_t id) {
  Admission a;
  Use& u = use(uid);
  if (running_ < limits_.running && u.running < run_share() && u.queued == 0 && !pick()) {
    ++running_;
    ++u.running;
    u.last_start = ++starts_;
    a.admit = Admit::Start;
    return a;
  }
  const unsigned qshare = queue_share();
  if (u.queued >= qshare) {
    a.admit = Admit::BusyShare;
    forget_if_unused(uid);
    return a;
  }
  if (queue_.size() >= limits_.queued) {
    // The peer most over its share of the queue gives its newest place up.
    std::optional<uid_t> victim;
    unsigned most = 0;
    for (const auto& [other, o] : use_)
      if (other != uid && o.queued > qshare && o.queued - qshare > most) {
        most = o.queued - qshare;
        victim = other;
      }
    if (!victim) {
      a.admit = Admit::BusyFull;
      forget_if_unused(uid);
      return a;
    }
    for (auto it = queue_.rbegin(); it != queue_.rend(); ++it)
      if (it->uid == *victim) {
        a.dropped = it->id;
        queue_.erase(std::next(it).base());
        break;
      }
    --use(*victim).queued;
    ++queued_runs_given_up_;
  }
  queue_.push_back({id, uid});
  ++use(uid).queued;
  a.admit = Admit::Queue;
  return a;
}

std::optional<std::uint64_t> FairShare::next_run() {
  auto i = pick();
  if (!i) return std::nullopt;
  const Waiting w = queue_[*i];
  queue_.erase(queue_.begin() + static_cast<std::ptrdiff_t>(*i));
  Use& u = use(w.uid);
  --u.queued;
  ++u.running;
  u.last_start = ++starts_;
  ++running_;
  return w.id;
}

void FairShare::leave_queue(std::uint64_t id) {
  auto it = std::find_if(queue_.begin(), queue_.end(), [id](const Waiting& w) { return w.id == id; });
  if (it == queue_.end()) return;
  const uid_t uid = it->uid;
  queue_.erase(it);
  --use(uid).queued;
  forget_if_unused(uid);
}

void FairShare::run_ended(uid_t uid) {
  if (running_ > 0) --running_;
  Use& u = use(uid);
  if (u.running > 0) --u.running;
  forget_if_unused(uid);
}

}  // namespace tsb::core
