#include "daemon/frontend/local/spawner_link.h"
#include "daemon/frontend/local/capped_output.h"
#include "daemon/frontend/egress/proxy.h"
#include "daemon/frontend/letta/letta.h"

#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/read.hpp>
#include <asio/write.hpp>
#include <cstdlib>

namespace tsb::core {
namespace {

using stream = asio::posix::stream_descriptor;
constexpr auto tuple_awaitable = asio::experimental::as_tuple(asio::use_awaitable);

// A warm sandbox's hand-over on its stdin socket (nothing for a cold one):
// its ready line read, then `environ_part` written. False when the sandbox
// is not there to take it (it ended; its Ended says why).
asio::awaitable<bool> hand_over(stream& sd, const std::string& environ_part) {
  if (environ_part.empty()) co_return true;
  std::string ready(letta::kChannelReady.size(), '\0');
  auto [ec, n] = co_await asio::async_read(sd, asio::buffer(ready), tuple_awaitable);
  if (ec || ready != letta::kChannelReady) co_return false;
  co_return !std::get<0>(co_await asio::async_write(sd, asio::buffer(environ_part), tuple_awaitable));
}

}  // namespace

// One run in flight: what the spawner said so far, and the run's own
// coroutines (stdin writer, two readers). `wake` is cancelled whenever any
// of it changes; the run's coroutine checks and waits again.
struct SpawnerLink::Pending {
  explicit Pending(asio::io_context& io) : wake(io, std::chrono::steady_clock::time_point::max()) {}
  asio::steady_timer wake;
  bool answered = false;  // Started, Refused or Ended (a spawn that failed) came
  bool ended = false;
  std::optional<spawn::Refused> refused;
  std::vector<UniqueFd> fds;  // stdin, stdout, stderr
  UniqueFd egress;            // network egress: where the sandbox's listener arrives
  isolate::RunResult result;
  int readers = 0;
  bool kill_sent = false;
  bool no_stdio = false;  // Started came without its descriptors
  bool warm = false;      // Started said: a warm sandbox
  std::chrono::nanoseconds warm_start_cpu{0};  // Ended said
  // run() gave up on it (the spawner overdue) and returned: what it lent
  // the run's coroutines (the request, the stdout sink) may be gone.
  bool abandoned = false;
  void poke() { wake.cancel(); }
};

struct SpawnerLink::PoolQuestion {
  std::chrono::steady_clock::time_point asked = std::chrono::steady_clock::now();
  std::vector<asio::steady_timer*> waiting;  // the status requests waiting for it, woken by the answer
  bool answered = false;
  std::optional<spawn::PoolState> answer;
};

asio::awaitable<std::optional<spawn::PoolState>> SpawnerLink::pool_state() {
  // One question at a time, whatever the number of status requests: those
  // that come while it is asked share its answer (the spawner's answers
  // never pile up in the socket).
  std::shared_ptr<PoolQuestion> q = pool_questions_.empty() ? nullptr : pool_questions_.back();
  if (!q || q->answered || std::chrono::steady_clock::now() >= q->asked + std::chrono::seconds(2)) {
    q = std::make_shared<PoolQuestion>();
    if (!sd_.is_open() || !send(spawn::encode_pools_question()).ok()) co_return std::nullopt;
    // Stays queued even when the wait runs out: the answer that comes
    // later is its own, not the next question's.
    pool_questions_.push_back(q);
  }
  asio::steady_timer wait(io_, q->asked + std::chrono::seconds(2));
  q->waiting.push_back(&wait);
  co_await wait.async_wait(tuple_awaitable);
  std::erase(q->waiting, &wait);
  co_return q->answer;
}

SpawnerLink::SpawnerLink(asio::io_context& io, UniqueFd control) : io_(io), control_(std::move(control)), sd_(io) {}

SpawnerLink::~SpawnerLink() = default;

Status SpawnerLink::handshake() {
  std::vector<UniqueFd> fds;
  auto m = spawn::receive_message(control_.get(), &fds);
  if (!m.ok()) return std::move(m).error().wrap("the spawner's hello");
  if (m->empty()) return Error::invalid("the spawner closed its socket before its hello", EPIPE);
  auto h = spawn::decode_hello(*m);
  if (!h.ok()) return std::move(h).error().wrap("the spawner's hello");
  hello_ = std::move(h).value();
  return {};
}

void SpawnerLink::start() {
  int size = 0;
  socklen_t len = sizeof size;
  if (::getsockopt(control_.get(), SOL_SOCKET, SO_SNDBUF, &size, &len) == 0 && size > 0) sndbuf_ = size;
  sd_.assign(control_.release());
  asio::co_spawn(io_, receive_loop(), asio::detached);
}

Status SpawnerLink::send(std::string msg, std::uint64_t run) {
  // The descriptor is non-blocking (asio makes it so for its waits): a
  // full socket answers EAGAIN, and the message waits its turn. EMSGSIZE:
  // larger than the socket's buffer allows (a huge environment); any other
  // failure means the spawner is gone, which the receive loop handles.
  if (!sd_.is_open()) return Error::invalid("the spawner's socket is closed", EPIPE);
  // What the kernel refuses whatever the room (unix(7): a datagram larger
  // than the send buffer, less its overhead), refused before it is queued.
  if (msg.size() > spawn::kMaxMessage || msg.size() + 32 > sndbuf_)
    return Error::invalid("message too large for the spawner socket", EMSGSIZE);
  if (unsent_.empty()) {
    auto st = spawn::send_message(sd_.native_handle(), msg, nullptr, 0, MSG_DONTWAIT);
    if (st.ok() || st.error().code != EAGAIN) {
      if (!st.ok() && st.error().code != EMSGSIZE) spdlog::error("spawner socket: {}", st.error().message);
      return st;
    }
    // (Queued first: co_spawn may start the flush right here.)
    unsent_.emplace_back(run, std::move(msg));
    asio::co_spawn(io_, flush_queued(), asio::detached);
    return {};
  }
  unsent_.emplace_back(run, std::move(msg));
  return {};
}

asio::awaitable<void> SpawnerLink::flush_queued() {
  // A unix socket is writable again once a quarter of its buffer is free;
  // sendmsg then takes any message the buffer's size allows.
  while (!unsent_.empty()) {
    auto [ec] = co_await sd_.async_wait(stream::wait_write, tuple_awaitable);
    if (ec) co_return;  // closed: the spawner is gone, and this process ends
    while (!unsent_.empty()) {
      auto st = spawn::send_message(sd_.native_handle(), unsent_.front().second, nullptr, 0, MSG_DONTWAIT);
      if (!st.ok() && st.error().code == EAGAIN) break;
      if (!st.ok()) {
        // (The spawner gone, or no kernel memory for the message.) A run
        // whose order this was is refused now, not left to its deadline.
        spdlog::error("spawner socket: {}", st.error().message);
        if (auto it = pending_.find(unsent_.front().first); it != pending_.end() && !it->second->answered) {
          it->second->answered = true;
          it->second->refused = spawn::Refused{it->first, spawn::RefuseCode::Unavailable,
                                               "the sandbox spawner is not reachable: " + st.error().message};
          it->second->poke();
        }
      }
      unsent_.pop_front();
    }
  }
}

void SpawnerLink::notify_ready(std::string_view status) {
  if (sd_.is_open()) (void)send(spawn::encode_notify(status));
}

asio::awaitable<void> SpawnerLink::receive_loop() {
  for (;;) {
    auto [ec] = co_await sd_.async_wait(stream::wait_read, tuple_awaitable);
    if (ec) break;
    std::vector<UniqueFd> fds;
    auto m = spawn::receive_message(sd_.native_handle(), &fds, MSG_DONTWAIT);
    if (!m.ok()) {
      if (m.error().code == EAGAIN) continue;
      spdlog::critical("spawner socket: {}", m.error().message);
      break;
    }
    if (m->empty()) break;
    switch (spawn::message_type(*m)) {
      case spawn::Msg::Started: {
        auto s = spawn::decode_started(*m);
        auto it = s.ok() ? pending_.find(s->id) : pending_.end();
        if (it == pending_.end()) {
          // A run no one waits for any more (its request's coroutine ended
          // before its Started came): it must not run on unread.
          spdlog::error("spawner: an unexpected or malformed Started message");
          if (s.ok()) (void)send(spawn::encode(spawn::Kill{s->id}));
          break;
        }
        // A fourth: network egress (isolate/engine/plan.h).
        if (fds.size() == 4) {
          it->second->egress = std::move(fds[3]);
          fds.pop_back();
        }
        if (fds.size() != 3) {
          // Out of descriptors here: the run cannot be fed or read. It is
          // ended, and its result says why.
          spdlog::error("run {}: its pipes could not be received (out of descriptors?): ending it", s->run_id);
          it->second->no_stdio = true;
          it->second->kill_sent = true;
          (void)send(spawn::encode(spawn::Kill{s->id}));
          fds.clear();
        }
        it->second->answered = true;
        it->second->warm = s->warm;
        warm_runs_ += s->warm ? 1 : 0;
        it->second->result.run_id = s->run_id;
        it->second->result.host_uid = s->host_uid;
        it->second->fds = std::move(fds);
        it->second->poke();
        break;
      }
      case spawn::Msg::Refused: {
        auto r = spawn::decode_refused(*m);
        auto it = r.ok() ? pending_.find(r->id) : pending_.end();
        if (it == pending_.end()) {
          spdlog::error("spawner refused a message: {}", r.ok() ? r->message : r.error().message);
          break;
        }
        it->second->answered = true;
        it->second->refused = std::move(r).value();
        it->second->poke();
        break;
      }
      case spawn::Msg::Ended: {
        auto e = spawn::decode_ended(*m);
        auto it = e.ok() ? pending_.find(e->id) : pending_.end();
        if (it == pending_.end()) {
          spdlog::error("spawner: an unexpected or malformed Ended message");
          break;
        }
        it->second->answered = true;
        it->second->ended = true;
        it->second->result = spawn::run_result_from(*e);
        it->second->warm_start_cpu = e->warm_start_cpu;
        it->second->poke();
        break;
      }
      case spawn::Msg::Reload: {
        auto applied = spawn::decode_reload(*m);
        if (!applied.ok()) {
          spdlog::error("spawner: a malformed Reload message");
          break;
        }
        // Applied: the record of the files, then the E2B key file if any.
        if (on_reload)
          on_reload(*applied, fds.size() > 0 ? std::move(fds[0]) : UniqueFd(),
                    fds.size() > 1 ? std::move(fds[1]) : UniqueFd());
        break;
      }
      case spawn::Msg::PoolState: {
        auto st = spawn::decode_pool_state(*m);
        if (!st.ok() || pool_questions_.empty()) {
          spdlog::error("spawner: an unexpected or malformed PoolState message");
          break;
        }
        auto q = std::move(pool_questions_.front());
        pool_questions_.pop_front();
        q->answer = std::move(st).value();
        q->answered = true;
        for (asio::steady_timer* t : q->waiting) t->cancel();
        break;
      }
      default: spdlog::error("spawner: unknown message type {}", static_cast<int>(spawn::message_type(*m)));
    }
  }
  // The spawner is gone: it was root and held every run; nothing here can
  // go on. Its death already ends every sandbox (their init watches it).
  spdlog::critical("the spawner went away: the front end ends");
  spdlog::shutdown();
  std::_Exit(1);
}

// However a run's coroutine ends (an exception on the way too), the run
// is forgotten, and one that started and has not ended is killed: it must
// not run on, counted by the spawner, with no one reading it. (A Started
// that comes after this is killed by the receive loop: its id is unknown
// then.)
struct SpawnerLink::Forget {
  SpawnerLink& l;
  std::uint64_t id;
  const std::shared_ptr<Pending>& p;
  ~Forget() {
    if (p->answered && !p->refused && !p->ended) l.kill_once(id, *p);
    l.warm_runs_ -= p->warm ? 1 : 0;
    l.pending_.erase(id);
  }
};

// The readers of a run's stdout and stderr write into buffers of their own
// (the Ended message replaces the result), merged at the end; they hold
// them, so a reader that outlives its run (a pipe still open after 5 s)
// writes into nothing freed. stdout goes to `sink` instead, when there is
// one.
struct SpawnerLink::Output {
  std::array<CappedOutput, 2> streams;
  StdoutSink sink;
  bool sink_refused = false;

  void merge_into(isolate::RunResult& r) {
    r.stdout_truncated = streams[0].truncated();
    r.stdout_total_bytes = streams[0].total();
    r.stdout_data = std::move(streams[0]).take();
    r.stderr_truncated = streams[1].truncated();
    r.stderr_total_bytes = streams[1].total();
    r.stderr_data = std::move(streams[1]).take();
  }
};

// Kill: the client is gone, the output sink refused more, or the spawner
// is overdue. Sent once, whoever asks again.
void SpawnerLink::kill_once(std::uint64_t id, Pending& p) {
  if (p.kill_sent) return;
  p.kill_sent = true;
  (void)send(spawn::encode(spawn::Kill{id}));
}

asio::awaitable<bool> SpawnerLink::wait_for_spawner(Pending& p, bool until_end) {
  // `wake` expires at the deadline; every poke before only cancels the
  // wait. An expiry that raced an answer (its completion already queued
  // when the answer's poke came) is no expiry.
  const auto waiting = [&] { return until_end ? !p.ended : !p.answered; };
  while (waiting())
    if (!std::get<0>(co_await p.wake.async_wait(tuple_awaitable)) && waiting()) co_return false;
  co_return true;
}

// The spawner has not answered or ended the run a margin past its timeout:
// it may be hung. The run is killed (should the spawner come back) and
// abandoned: its coroutines may outlive what run() lent them.
LinkRun SpawnerLink::give_up(std::uint64_t id, Pending& p) {
  spdlog::critical("run {}: the sandbox spawner has not ended it {} s past its timeout: it may be hung", id,
                   overdue_margin_.count() / 1000);
  kill_once(id, p);
  const bool started = p.answered && !p.refused;
  p.abandoned = p.ended = true;  // (ended: the channel's second part is not asked for)
  LinkRun out;
  if (!started) {
    out.refused = spawn::Refused{id, spawn::RefuseCode::Unavailable,
                                 "the sandbox spawner did not answer the run in time (it may be hung)"};
    return out;
  }
  // It ran: a run, with its record (its output up to now is not waited for).
  out.warm = p.warm;
  out.result.run_id = p.result.run_id;
  out.result.host_uid = p.result.host_uid;
  out.result.reason = isolate::EndReason::Cancelled;
  out.result.error = "the sandbox spawner did not end the run " + std::to_string(overdue_margin_.count() / 1000) +
                     " s past its timeout (it may be hung): the run was given up and killed";
  return out;
}

namespace {

// stdin: written, then closed (EOF). EPIPE when the tool never reads it
// is fine (the front end ignores SIGPIPE: daemon/frontend/main.cc). A
// warm sandbox's is a socket: shut for writing, for its EOF.
asio::awaitable<void> write_stdin(asio::io_context& io, UniqueFd fd, std::string data, std::string handover) {
  stream sd(io, fd.release());
  if (!co_await hand_over(sd, handover)) co_return;
  if (!data.empty()) co_await asio::async_write(sd, asio::buffer(data), tuple_awaitable);
  if (!handover.empty()) ::shutdown(sd.native_handle(), SHUT_WR);
}

}  // namespace

// The result channel on the run's stdin socket (a warm sandbox's hand-over
// first): the first part, the runner's declaration, then the second part,
// and what the runner sends back, up to the cap. Counted as a reader.
asio::awaitable<void> SpawnerLink::exchange_channel(asio::io_context& io, UniqueFd fd, ChannelExchange ex,
                                                    std::shared_ptr<Pending> p, std::shared_ptr<ChannelOutcome> o,
                                                    std::string handover) {
  stream sd(io, fd.release());
  std::string declaration(letta::kChannelDeclarationSize, '\0');
  if (co_await hand_over(sd, handover) &&
      !std::get<0>(co_await asio::async_write(sd, asio::buffer(ex.first), tuple_awaitable)) &&
      !std::get<0>(co_await asio::async_read(sd, asio::buffer(declaration), tuple_awaitable)))
    o->declared = letta::parse_channel_declaration(declaration);
  std::string().swap(ex.first);  // freed, not only emptied
  // Once Ended came nothing reads a second part, and run() may have
  // returned (with the request `second` reads from).
  if (o->declared && !p->ended) {
    std::string second = ex.second(*o->declared);
    auto [ec, n] = co_await asio::async_write(sd, asio::buffer(second), tuple_awaitable);
    std::string().swap(second);  // not held while the tool runs
    ::shutdown(sd.native_handle(), SHUT_WR);  // the runner reads no more
    std::array<char, 65536> buf;
    while (!ec) {
      std::tie(ec, n) = co_await sd.async_read_some(asio::buffer(buf), tuple_awaitable);
      if (o->result.size() < ex.cap) o->result.append(buf.data(), std::min<std::uint64_t>(n, ex.cap - o->result.size()));
      o->result_total += n;
    }
  }
  --p->readers;
  p->poke();
}

// stdout (i 0) or stderr (i 1), read to its end: fed to its capped
// buffer, or stdout to the sink, whose refusal kills the run (and the rest
// is read and dropped).
asio::awaitable<void> SpawnerLink::read_output(std::uint64_t id, UniqueFd fd, std::shared_ptr<Pending> p,
                                               std::shared_ptr<Output> o, int i) {
  stream sd(io_, fd.release());
  std::array<char, 65536> buf;
  for (;;) {
    auto [ec, n] = co_await sd.async_read_some(asio::buffer(buf), tuple_awaitable);
    if (ec) break;  // EOF or error: this stream is over
    const std::string_view chunk(buf.data(), n);
    if (i == 0 && o->sink) {
      if (p->abandoned) continue;
      if (!o->sink_refused && !o->sink(chunk)) {
        o->sink_refused = true;
        if (!p->ended) kill_once(id, *p);
      }
      continue;
    }
    o->streams[i].feed(chunk);
  }
  --p->readers;
  p->poke();
}

asio::awaitable<LinkRun> SpawnerLink::run(spawn::RunOrder order, std::string stdin_data, std::uint64_t stdout_cap,
                                          std::uint64_t stderr_cap, std::vector<std::string> stdout_frame_tokens,
                                          CancelSignal& cancel, egress::RunProxy* egress,
                                          StdoutSink stdout_sink, std::optional<ChannelExchange> channel,
                                          std::uint64_t frame_cap, TakeStdio take_stdio) {
  // 1. The run is known under its id until this ends (Forget).
  auto p = std::make_shared<Pending>(io_);
  const std::uint64_t id = order.id = ++next_id_;
  pending_.emplace(id, p);
  const Forget forget{*this, id, p};
  // 2. The order goes out; one that cannot is refused here.
  if (auto st = send(spawn::encode(order), id); !st.ok()) {
    LinkRun out;
    out.refused = spawn::Refused{id, st.error().code == EMSGSIZE ? spawn::RefuseCode::OutOfBounds : spawn::RefuseCode::Unavailable,
                                 st.error().code == EMSGSIZE
                                     ? "the run's environment is too large to hand to the sandbox spawner"
                                     : "the sandbox spawner is not reachable: " + st.error().message};
    co_return out;
  }
  // 3. The run's cancel signal asks the spawner to kill it. The spawner
  // ends every run by its timeout, which it enforces itself: a run with no
  // end a margin past it means a spawner that hangs. The client is told so
  // rather than left waiting for ever (give_up), and the run is killed
  // should the spawner come back.
  CancelHook hook(cancel, [this, p, id] {
    if (!p->ended) kill_once(id, *p);
  });
  p->wake.expires_at(std::chrono::steady_clock::now() + order.timeout + overdue_margin_);
  // 4. The spawner's answer: Started, Refused, or Ended (its spawn failed).
  if (!co_await wait_for_spawner(*p, false)) co_return give_up(id, *p);
  LinkRun out;
  if (p->refused) {
    out.refused = std::move(p->refused);
    co_return out;
  }
  isolate::RunResult& r = p->result;
  if (egress && p->egress) egress->start(std::move(p->egress), r.run_id);
  out.warm = p->warm;
  if (p->fds.empty()) {
    // Ended without Started (the spawn failed; nothing ran), or Started
    // without its pipes (ended at once).
    if (!co_await wait_for_spawner(*p, true)) co_return give_up(id, *p);
    if (p->no_stdio) {
      r.reason = isolate::EndReason::SetupFailed;
      r.exit_code = -1;
      r.error = "the daemon could not take the run's pipes (out of file descriptors)";
    }
    out.result = std::move(r);
    co_return out;
  }
  // 5-6, a session's: its stdio goes to the session's relay.
  std::shared_ptr<Output> output;
  std::shared_ptr<ChannelOutcome> outcome;
  if (take_stdio) {
    take_stdio(r.run_id, std::move(p->fds));
    p->fds.clear();
  } else {
    start_stdio(p, id, order, std::move(stdin_data), stdout_cap, stderr_cap, std::move(stdout_frame_tokens),
                std::move(stdout_sink), std::move(channel), frame_cap, output, outcome);
  }
  // 7. The spawner's Ended; then the readers' last bytes. Every writer is
  // gone once pid 1 has exited: the pipes reach EOF at once. Bounded anyway
  // (a pipe held open by something that escaped).
  if (!co_await wait_for_spawner(*p, true)) co_return give_up(id, *p);
  if (p->readers > 0) {
    p->wake.expires_after(std::chrono::seconds(5));
    while (p->readers > 0) {
      auto [ec] = co_await p->wake.async_wait(tuple_awaitable);
      if (!ec) break;  // the 5 s ran out
    }
  }
  // 8. What the readers kept, into the result Ended brought.
  if (output) output->merge_into(r);
  if (outcome) out.channel = std::move(*outcome);
  out.result = std::move(r);
  out.warm_start_cpu = p->warm_start_cpu;
  co_return out;
}

void SpawnerLink::start_stdio(const std::shared_ptr<Pending>& p, std::uint64_t id, const spawn::RunOrder& order,
                              std::string stdin_data, std::uint64_t stdout_cap, std::uint64_t stderr_cap,
                              std::vector<std::string> stdout_frame_tokens, StdoutSink stdout_sink,
                              std::optional<ChannelExchange> channel, std::uint64_t frame_cap,
                              std::shared_ptr<Output>& output, std::shared_ptr<ChannelOutcome>& outcome) {
  // 5. stdin: a warm sandbox's hand-over comes first (the run's
  // environment, once its runner said it is ready), then what a cold run's
  // stdin gets; or the result channel, a reader like stdout and stderr.
  // Any failure of the channel (the runner died, it sent something else)
  // ends the exchange; what came so far is what the shaping sees.
  std::string handover = p->warm ? runner_environ_part(order.env) : std::string();
  if (channel) {
    outcome = std::make_shared<ChannelOutcome>();
    ++p->readers;
    asio::co_spawn(io_, exchange_channel(io_, std::move(p->fds[0]), std::move(*channel), p, outcome, std::move(handover)),
                   asio::detached);
  } else {
    asio::co_spawn(io_, write_stdin(io_, std::move(p->fds[0]), std::move(stdin_data), std::move(handover)), asio::detached);
  }
  // 6. stdout, stderr: the first `cap` bytes kept, and past them only a
  // result frame (capped_output.h); the run goes on, and the rest is read
  // and dropped, so this process's memory stays bounded.
  output = std::make_shared<Output>(Output{{CappedOutput(stdout_cap, std::move(stdout_frame_tokens), frame_cap),
                                            CappedOutput(stderr_cap, {})},
                                           std::move(stdout_sink)});
  p->readers += 2;
  for (int i = 0; i < 2; ++i)
    asio::co_spawn(io_, read_output(id, std::move(p->fds[1 + i]), p, output, i), asio::detached);
  p->fds.clear();
}

}  // namespace tsb::core
