// A session's relay (session.h): the client's bytes to the command's stdin,
// its stdout and stderr to the client as frames, the session's watches, and
// its end.
#include "daemon/frontend/session/session.h"
#include "daemon/frontend/session/packages.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/posix/stream_descriptor.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/write.hpp>
#include <cstring>
#include <deque>
#include <utility>

#include "daemon/common/quote.h"
#include "daemon/compile/spawn_policy.h"
#include "daemon/frontend/egress/proxy.h"
#include "daemon/frontend/local/spawner_link.h"
#include "daemon/frontend/session/workspace.h"
#include "protocol/messages.h"
#include "protocol/record.h"

namespace tsb::core {

using protocol::ErrorCode;

namespace {

using stream = asio::posix::stream_descriptor;
using namespace asio::experimental::awaitable_operators;
constexpr auto tuple_awaitable = asio::experimental::as_tuple(asio::use_awaitable);
constexpr std::size_t kChunk = protocol::kMaxSessionFrame;
// Frames waiting for the client: past this, the command's pipes are not
// read until the client takes some (the command then waits on its pipe).
constexpr std::size_t kQueueBytes = 256u << 10;

}  // namespace

// One open session: its pipes, its frames waiting for the client, its
// counts, and why it ended. Shared by its coroutines; the last one's
// release frees it. Only the writer writes to the client, and Sessions::run
// returns (the client's socket is then closed by its owner) only once the
// writer and the client's reader have ended.
struct Sessions::Session {
  Session(asio::io_context& io, Sessions::ClientSocket& c, SessionOpen o)
      : io(io), client(c), open(std::move(o)), wake(io, std::chrono::steady_clock::time_point::max()),
        room(io, std::chrono::steady_clock::time_point::max()),
        exited(io, std::chrono::steady_clock::time_point::max()), stdin_pipe(io) {}
  asio::io_context& io;
  Sessions::ClientSocket& client;
  const SessionOpen open;  // a copy: the coroutines may outlive the request's
  CancelSignal cancel;
  std::string run_id;
  asio::steady_timer wake;    // cancelled: a frame was queued, or the end is
  asio::steady_timer room;    // cancelled: the queue has room again
  asio::steady_timer exited;  // cancelled: a task of the session (the writer, a reader, a pump) ended
  stream stdin_pipe;
  std::deque<std::string> queue;
  std::size_t queued = 0;
  std::uint64_t bytes_in = 0, bytes_out = 0, bytes_err = 0;
  std::chrono::steady_clock::time_point last = std::chrono::steady_clock::now();
  const std::chrono::steady_clock::time_point opened = last;
  const std::chrono::system_clock::time_point opened_at = std::chrono::system_clock::now();
  std::string ended_by;        // the first reason the daemon ended it for; "" when the command did
  bool started = false;        // Started came: the relay runs
  bool over = false;           // the run ended (its Ended came): the watches stop
  bool end_queued = false;     // the end frame is queued (or will never be sent): the writer ends once the queue is out
  bool client_failed = false;  // a write to the client failed or timed out
  int readers = 0;             // stdout and stderr pumps still reading
  bool writing = false, reading = false;  // the writer, the client's reader (pump_in) run
  std::weak_ptr<Workspace> keeper;  // the sandbox whose keeper runs its command, once started

  void end(const char* why) {
    if (over) return;  // it ended on its own first: the record says so
    if (ended_by.empty()) ended_by = why;
    cancel.request();
  }
  void push(char kind, std::string_view data) {
    std::string f = protocol::session_frame(kind, data);
    queued += f.size();
    queue.push_back(std::move(f));
    wake.cancel();
  }
  // Counted through the stream; past the policy's bound, the session ends.
  void count(std::uint64_t& c, std::size_t n) {
    c += n;
    last = std::chrono::steady_clock::now();
    if (bytes_in + bytes_out + bytes_err > open.policy->sessions.stream_bytes) end("stream_limit");
  }
  bool past_stream_limit() const { return ended_by == "stream_limit"; }
};

namespace {

// The client's bytes to stdin (after the command frame and what came with
// the request line); its shutdown(SHUT_WR) closes stdin, and a client gone
// entirely ends the session. Reads the client until the session is over.
asio::awaitable<void> pump_in(std::shared_ptr<Sessions::Session> s, std::string first) {
  struct Done {
    Sessions::Session& s;
    ~Done() {
      s.reading = false;
      s.exited.cancel();
    }
  } done{*s};
  std::array<char, kChunk> buf;
  if (auto [ec, n] = co_await asio::async_write(s->stdin_pipe, asio::buffer(first), tuple_awaitable); ec)
    s->stdin_pipe.close();
  while (!s->over) {
    auto [ec, n] = co_await s->client.async_read_some(asio::buffer(buf), tuple_awaitable);
    if (s->over) break;
    if (ec) {
      s->stdin_pipe.close();  // the command's EOF
      if (ec != asio::error::eof) s->end("client");
      break;
    }
    s->count(s->bytes_in, n);
    // Past stream_bytes, or once the command closed its stdin: dropped.
    if (s->stdin_pipe.is_open() && !s->past_stream_limit()) {
      auto [wec, wn] = co_await asio::async_write(s->stdin_pipe, asio::buffer(buf.data(), n), tuple_awaitable);
      if (wec) s->stdin_pipe.close();
    }
  }
}

// stdout (kind 'o') or stderr ('e') to the client, as frames.
asio::awaitable<void> pump_out(std::shared_ptr<Sessions::Session> s, UniqueFd fd, char kind) {
  stream sd(s->io, fd.release());
  std::array<char, kChunk> buf;
  for (;;) {
    while (s->queued >= kQueueBytes && !s->client_failed && !s->end_queued) co_await s->room.async_wait(tuple_awaitable);
    auto [ec, n] = co_await sd.async_read_some(asio::buffer(buf), tuple_awaitable);
    if (ec) break;
    s->count(kind == protocol::kSessionStdout ? s->bytes_out : s->bytes_err, n);
    // Past stream_bytes nothing more is read or goes out: the session is
    // being ended, and its command waits on a full pipe meanwhile.
    if (s->past_stream_limit()) break;
    if (!s->client_failed && !s->end_queued) s->push(kind, std::string_view(buf.data(), n));
  }
  --s->readers;
  s->wake.cancel();
  s->exited.cancel();
}

// One write to the client, within write_timeout.
asio::awaitable<bool> write_client(Sessions::Session& s, std::string_view bytes) {
  asio::steady_timer deadline(s.io, s.open.write_timeout);
  auto r = co_await (asio::async_write(s.client, asio::buffer(bytes), tuple_awaitable) ||
                     deadline.async_wait(tuple_awaitable));
  co_return r.index() == 0 && !std::get<0>(std::get<0>(r));
}

// The queue to the client, in order, the only writer of the client's
// socket; it ends once the end frame is out (or the client failed). A
// client that does not take a frame in time ends the session.
asio::awaitable<void> writer(std::shared_ptr<Sessions::Session> s) {
  struct Done {
    Sessions::Session& s;
    ~Done() {
      s.writing = false;
      s.exited.cancel();
    }
  } done{*s};
  for (;;) {
    while (!s->queue.empty() && !s->client_failed) {
      std::string f = std::move(s->queue.front());
      s->queue.pop_front();
      if (!co_await write_client(*s, f)) {
        s->client_failed = true;
        s->end("client");
        s->exited.cancel();  // run() may be waiting for the pumps, which now drop what they read
      } else {
        s->last = std::chrono::steady_clock::now();  // output still going out is not idle
      }
      s->queued -= f.size();
      if (s->queued < kQueueBytes) s->room.cancel();
    }
    if (s->client_failed) {
      s->queue.clear();
      s->queued = 0;
      s->room.cancel();
    }
    if (s->end_queued && s->queue.empty()) break;
    s->wake.expires_at(std::chrono::steady_clock::time_point::max());
    if (s->queue.empty()) co_await s->wake.async_wait(tuple_awaitable);
  }
}

// Before the start, the client's going away; after it, idle (no byte
// either way for idle_timeout) and the client's going away too (a reader
// blocked on a full stdin pipe does not see it).
asio::awaitable<void> watch(std::shared_ptr<Sessions::Session> s) {
  asio::steady_timer t(s->io);
  const auto idle = s->open.policy->sessions.idle_timeout;
  while (!s->over) {
    const auto now = std::chrono::steady_clock::now();
    if (s->open.client_gone()) {
      s->end("client");
      break;
    }
    if (s->started && now >= s->last + idle) {
      s->end("idle");
      break;
    }
    t.expires_after(std::chrono::milliseconds(500));  // the client and idleness, looked at twice a second
    co_await t.async_wait(tuple_awaitable);
  }
}

// Until `done` holds (looked at whenever a task of the session ends: the
// session's `exited` is cancelled then), or until `deadline`; whether it
// holds.
template <typename Pred>
asio::awaitable<bool> wait_until(Sessions::Session& s, Pred done, std::chrono::steady_clock::time_point deadline) {
  while (!done() && std::chrono::steady_clock::now() < deadline) {
    s.exited.expires_at(deadline);
    if (done()) break;
    co_await s.exited.async_wait(tuple_awaitable);
  }
  co_return done();
}

}  // namespace

unsigned Sessions::open_of(const std::string& org) const {
  auto it = reg_->orgs.find(org);
  return it == reg_->orgs.end() ? 0 : it->second;
}

nlohmann::json Sessions::status() const {
  return {{"open", reg_->open.size()},
          {"workspaces", reg_->workspaces.size()},
          {"preparing", reg_->preparing.size()},
          {"max", limits_.max},
          {"max_per_organization", limits_.per_organization},
          {"total", total_},
          {"refused_busy", refused_}};
}

namespace {

// The end record (PROTOCOL.md, section 6.8; protocol/schema/session-record.json).
nlohmann::json end_record(const Sessions::Session& s, const Policy& pol, const isolate::RunResult& r,
                          const std::string& ended_by, const Workspace* ws) {
  nlohmann::json record = run_record_json(r);
  for (const char* k : {"run_id", "stdout_truncated", "stderr_truncated", "stdout_bytes", "stderr_bytes"}) record.erase(k);
  record["session_id"] = s.run_id;
  record["ended_by"] = ended_by;
  record["policy"] = pol.name;
  record["policy_fingerprint"] = pol.fingerprint;
  record["bytes_in"] = s.bytes_in;
  record["bytes_out"] = s.bytes_out;
  record["bytes_err"] = s.bytes_err;
  if (ws) {
    // The sandbox's memory and Landlock are the workspace's, in its own
    // audit line; the CPU is what the keeper saw its command's tree use.
    record.erase("peak_memory_bytes");
    record["workspace"] = {{"name", ws->name}, {"workspace_id", ws->id}};
  } else {
    record["landlock"] = isolate::landlock_summary(r.landlock);
  }
  if (!s.open.packages.is_null()) record["packages"] = s.open.packages;
  return record;
}

// The relay of a session whose pipes are ready: the answer line (with
// `answer`'s members), then `first` on stdin and the client's bytes after
// it, the command's output as frames, and the writer.
void start_relay(asio::io_context& io, const std::shared_ptr<Sessions::Session>& s, const std::string& session_id,
                 std::vector<UniqueFd> fds, std::string first, nlohmann::json answer) {
  s->run_id = session_id;
  asio::error_code ec;
  s->stdin_pipe.assign(fds[0].get(), ec);
  if (ec) {  // (the event loop cannot watch one more descriptor)
    spdlog::error("session {}: its stdin cannot be relayed: {}", session_id, ec.message());
    s->end("daemon");
    return;  // the pipes close here; the end is on its way
  }
  (void)fds[0].release();
  s->started = true;
  s->last = std::chrono::steady_clock::now();
  const Policy& pol = *s->open.policy;
  answer["session_id"] = session_id;
  answer["policy"] = pol.name;
  answer["policy_fingerprint"] = pol.fingerprint;
  answer["command"] = s->open.argv;
  if (!s->open.packages.is_null()) answer["packages"] = s->open.packages;
  std::string line = protocol::encode_ok(s->open.request_id, "session", answer);
  s->queued += line.size();
  s->queue.push_back(std::move(line));
  s->writing = s->reading = true;
  s->readers = 2;
  asio::co_spawn(io, pump_in(s, std::move(first)), asio::detached);
  asio::co_spawn(io, pump_out(s, std::move(fds[1]), protocol::kSessionStdout), asio::detached);
  asio::co_spawn(io, pump_out(s, std::move(fds[2]), protocol::kSessionStderr), asio::detached);
  asio::co_spawn(io, writer(s), asio::detached);
}

// Until the workspace started or ended (its `changed`), or `deadline`.
asio::awaitable<void> wait_for_workspace(Workspace& ws, bool until_ended, std::chrono::steady_clock::time_point deadline) {
  while (!(until_ended ? ws.ended : ws.started || ws.ended) && std::chrono::steady_clock::now() < deadline) {
    ws.changed.expires_at(deadline);
    co_await ws.changed.async_wait(tuple_awaitable);
  }
}

// A session in a workspace: its command started by the keeper on pipes
// made here, the relay, and the keeper's answer once the command and the
// rest of the session's processes are gone. `message` (keeper_session_message, its
// size checked) goes to the keeper. `result` gets what the record
// says of the command; the refusal when the session did not start.
asio::awaitable<std::optional<Refusal>> run_in_workspace(asio::io_context& io, std::shared_ptr<Sessions::Session> s,
                                                         std::shared_ptr<Workspace> ws, std::string early_input,
                                                         const std::string& message, isolate::RunResult& result) {
  const bool made = ws->sessions == 0 && !ws->started;
  ws->ending = false;
  // A workspace made for a session that then did not start (its client
  // gone, a refusal) is not kept: it would hold a slot for idle_ttl.
  struct Unused {
    Workspace& ws;
    ~Unused() {
      if (ws.sessions == 0) ws.end("unused");
    }
  } unused{*ws};
  ws->end_if_client_gone = [weak = std::weak_ptr<Sessions::Session>(s)] {
    auto held = weak.lock();
    if (!held || !held->open.client_gone()) return false;
    held->end("client");
    return true;
  };
  co_await wait_for_workspace(*ws, false, std::chrono::steady_clock::time_point::max());
  if (ws->ended || !ws->started || ws->cancel.requested())
    co_return ws->refused.value_or(Refusal{ErrorCode::Unavailable, "the workspace ended before the session started; retry"});
  // A client gone while the workspace started: nothing runs for it.
  if (s->cancel.requested()) co_return Refusal{ErrorCode::Unavailable, "the session ended before it started"};
  int p[6];
  if (::pipe2(p, O_CLOEXEC) != 0 || ::pipe2(p + 2, O_CLOEXEC) != 0 || ::pipe2(p + 4, O_CLOEXEC) != 0)
    co_return Refusal{ErrorCode::Busy, std::string("the session's pipes could not be made: ") + std::strerror(errno)};
  UniqueFd in_r(p[0]), in_w(p[1]), out_r(p[2]), out_w(p[3]), err_r(p[4]), err_w(p[5]);
  const int theirs[3] = {in_r.get(), out_w.get(), err_w.get()};
  if (!co_await send_session_to_keeper(*ws, message, theirs)) {
    ws->end("keeper");  // a keeper that does not take a session is not kept
    co_return Refusal{ErrorCode::Internal, "the workspace's keeper did not take the session"};
  }
  in_r.reset(), out_w.reset(), err_w.reset();
  s->keeper = ws;
  const auto t0 = std::chrono::steady_clock::now();
  ++ws->sessions;
  const std::string session_id = ws->one_shot ? ws->id : ws->id + "." + std::to_string(ws->sessions);
  s->count(s->bytes_in, early_input.size());
  std::vector<UniqueFd> fds;
  fds.push_back(std::move(in_w)), fds.push_back(std::move(out_r)), fds.push_back(std::move(err_r));
  start_relay(io, s, session_id, std::move(fds), std::move(early_input),
              ws->one_shot ? nlohmann::json::object()
                           : nlohmann::json{{"workspace", {{"name", ws->name}, {"workspace_id", ws->id}, {"new", made}}}});
  const bool relayed = s->started;  // else the relay could not start: the keeper ends the command at once
  // Whatever ends the session (the client, idle, the stream's bound, the
  // operator, the stop) has the keeper end the command and the rest.
  // A keeper that does not answer within 2 s (a command stopped it, say)
  // ends its workspace: the session ends all the same.
  auto answered = std::make_shared<bool>(false);
  const int hook = s->cancel.add_hook([ws, answered] {
    ws->ending = true;
    if (!send_end_to_keeper(*ws)) return ws->end("keeper");
    asio::co_spawn(
        ws->keeper.get_executor(),
        [ws, answered]() -> asio::awaitable<void> {
          asio::steady_timer t(ws->keeper.get_executor(), std::chrono::seconds(2));
          co_await t.async_wait(tuple_awaitable);
          if (!*answered) ws->end("keeper");
        },
        asio::detached);
  });
  auto st = co_await read_keeper_status(*ws);
  *answered = true;
  ws->ending = true;
  s->cancel.remove_hook(hook);
  result.wall = std::chrono::steady_clock::now() - t0;
  if (!relayed) co_return Refusal{ErrorCode::Internal, "the session's stdio could not be relayed (the log says why)"};
  if (st) {
    result.reason = st->signal ? isolate::EndReason::Signaled : isolate::EndReason::Exited;
    result.exit_code = st->exit_code;
    result.signal = st->signal;
    result.cpu = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::duration<double, std::milli>(st->cpu_ms));
    co_return std::nullopt;
  }
  // The sandbox ended under the session (its lifetime, a limit, the
  // daemon's stop: the spawner's Ended follows, and says which), or its
  // keeper broke the protocol: then the workspace ends.
  co_await wait_for_workspace(*ws, true, std::chrono::steady_clock::now() + std::chrono::seconds(2));
  if (!ws->ended) ws->end("keeper");
  co_await wait_for_workspace(*ws, true, std::chrono::steady_clock::now() + std::chrono::seconds(10));
  const std::string why = ws->ended_by;
  result.reason = isolate::EndReason::Cancelled;
  if (s->ended_by.empty())
    s->ended_by = why == "lifetime" || why == "limit" || why == "shutdown" || why == "operator" ? why : "daemon";
  co_return std::nullopt;
}

// A session in a sandbox of its own: a one-shot workspace (its keeper,
// the same path), ended after the session. `result` is then the sandbox's
// end (its CPU, peak memory, Landlock; a limit that ended it) with the
// command's status as the keeper saw it.
asio::awaitable<std::optional<Refusal>> run_alone(asio::io_context& io, SpawnerLink& link, egress::Service& egress,
                                                  std::shared_ptr<Sessions::Session> s, std::string early_input,
                                                  const std::string& message, isolate::RunResult& result,
                                                  std::shared_ptr<Workspace>& ws) {
  const SessionOpen& open = s->open;
  ws = std::make_shared<Workspace>(io);
  ws->one_shot = true;
  ws->organization_id = open.organization_id;
  ws->request_id = open.request_id;
  ws->peer_uid = open.peer.uid;
  ws->policy = open.policy;
  ws->venv = open.venv;
  ws->node_modules = open.node_modules;
  asio::co_spawn(io, keep_workspace(ws, link, egress, [](Workspace&) {}), asio::detached);
  // However this ends, the sandbox ends with the session, and is waited for.
  struct End {
    Workspace& ws;
    ~End() { ws.end("session"); }
  } end{*ws};
  isolate::RunResult command;
  auto refused = co_await run_in_workspace(io, s, ws, std::move(early_input), message, command);
  // The command has ended: nothing of the daemon's ends it any more.
  const std::string by_daemon = s->ended_by;
  s->over = true;
  // The keeper's socket closed: it exits as its command did, and the
  // sandbox's end says how (an OOM kill, the pids limit, the CPU limit are
  // the sandbox's to tell). One that does not exit within 2 s is ended.
  asio::error_code ignored;
  ws->keeper.close(ignored);
  co_await wait_for_workspace(*ws, true, std::chrono::steady_clock::now() + std::chrono::seconds(2));
  ws->end("session");
  co_await wait_for_workspace(*ws, true, std::chrono::steady_clock::time_point::max());
  if (refused) co_return refused;
  // The sandbox's CPU, memory and Landlock; its end when a limit ended it
  // (an OOM kill of the command, the pids or CPU limit, its lifetime);
  // else the command's status as the keeper saw it, or, when the daemon
  // ended the session, cancelled.
  result = ws->result;
  using isolate::EndReason;
  const EndReason r = result.reason;
  const bool limit = r != EndReason::Exited && r != EndReason::Signaled && r != EndReason::Cancelled;
  const bool on_its_own = command.reason != EndReason::Cancelled && by_daemon.empty();
  if (limit && (on_its_own || by_daemon == "limit" || by_daemon == "lifetime" || by_daemon == "daemon")) {
    s->ended_by = r == EndReason::Timeout ? "lifetime" : "limit";
  } else if (on_its_own) {
    result.reason = command.reason;
    result.exit_code = command.exit_code;
    result.signal = command.signal;
  } else {
    result.reason = EndReason::Cancelled;  // ended_by says why
    result.exit_code = -1;
    result.signal = 0;
  }
  result.wall = command.wall;
  co_return std::nullopt;
}

}  // namespace

std::optional<Refusal> Sessions::admit(const SessionOpen& open, std::shared_ptr<Workspace>& ws, bool& own_slot,
                                       bool preparing) {
  if (stopping_) return Refusal{ErrorCode::Unavailable, "the daemon is shutting down"};
  // A kept workspace holds a slot of its own; a session in it takes none.
  const std::string key = workspace_key(open.peer.uid, open.organization_id, open.policy->name, open.workspace);
  if (!open.workspace.empty())
    if (auto it = reg_->workspaces.find(key); it != reg_->workspaces.end()) ws = it->second;
  // One being removed is none. One made under the policy before a reload
  // changed it is removed now (its files with it): a session runs under the
  // policy in force, and its answer names that one.
  if (ws && !ws->busy && ws->policy->fingerprint != open.policy->fingerprint) ws->end("policy_changed");
  if (ws && (ws->ended || ws->cancel.requested())) ws.reset();
  if (ws && ws->busy) {
    ++refused_;
    return Refusal{ErrorCode::Busy, "workspace " + quoted_for_message(open.workspace) +
                                        " has a session open (one at a time); retry when it ends"};
  }
  if (ws && (!open.venv.empty() || !open.node_modules.empty()) &&
      (ws->venv != open.venv || ws->node_modules != open.node_modules)) {
    ++refused_;
    return Refusal{ErrorCode::BadRequest, "workspace " + quoted_for_message(open.workspace) +
                                              " was made with other packages than this command's (a workspace keeps "
                                              "the packages of its first session): name another workspace, or "
                                              "start this one's command without npx or uvx"};
  }
  // (Sessions whose packages are being made hold slots too; this one's own
  // is given to it here.)
  const std::size_t taken = reg_->slots + reg_->preparing.size() - (preparing ? 1 : 0);
  const std::size_t of_org = open_of(open.organization_id) + reg_->preparing.count(open.organization_id) -
                             (preparing ? 1 : 0);
  if (!ws && (taken >= limits_.max || of_org >= limits_.per_organization)) {
    ++refused_;
    return Refusal{ErrorCode::Busy, taken >= limits_.max
                                           ? "max_sessions (" + std::to_string(limits_.max) +
                                                 ") are open or kept as workspaces; retry later"
                                           : "this organization has max_sessions_per_organization (" +
                                                 std::to_string(limits_.per_organization) +
                                                 ") open or kept as workspaces; retry later"};
  }
  own_slot = !ws && open.workspace.empty();
  if (!ws && !open.workspace.empty()) {
    ws = std::make_shared<Workspace>(io_);
    ws->key = key;
    ws->organization_id = open.organization_id;
    ws->peer_uid = open.peer.uid;
    ws->name = open.workspace;
    ws->policy = open.policy;
    ws->venv = open.venv;
    ws->node_modules = open.node_modules;
    ws->packages_hold = open.packages_hold;
    reg_->workspaces[key] = ws;  // (in place of one being removed)
    ++reg_->slots;
    ++reg_->orgs[open.organization_id];
    auto gone = [reg = reg_](Workspace& w) {
      if (auto it = reg->workspaces.find(w.key); it != reg->workspaces.end() && it->second.get() == &w)
        reg->workspaces.erase(it);
      --reg->slots;
      if (--reg->orgs[w.organization_id] == 0) reg->orgs.erase(w.organization_id);
    };
    asio::co_spawn(io_, keep_workspace(ws, link_, egress_, std::move(gone)), asio::detached);
  }
  return std::nullopt;
}

struct Sessions::Prepared {
  Prepared(std::shared_ptr<Registry> r, const std::string& org) : reg(std::move(r)), at(reg->preparing.insert(org)) {}
  Prepared(const Prepared&) = delete;
  Prepared& operator=(const Prepared&) = delete;
  ~Prepared() { reg->preparing.erase(at); }
  std::shared_ptr<Registry> reg;
  std::multiset<std::string>::iterator at;
};

asio::awaitable<std::optional<Refusal>> Sessions::packages(SessionOpen& open, std::unique_ptr<Prepared>& prepared) {
  // Meanwhile the session holds a slot (in all and of its organization),
  // unless it goes to a kept workspace, which holds one.
  const std::string key = workspace_key(open.peer.uid, open.organization_id, open.policy->name, open.workspace);
  auto kept = open.workspace.empty() ? reg_->workspaces.end() : reg_->workspaces.find(key);
  if (kept == reg_->workspaces.end()) {
    const unsigned of_org = open_of(open.organization_id) + reg_->preparing.count(open.organization_id);
    if (reg_->slots + reg_->preparing.size() >= limits_.max || of_org >= limits_.per_organization) {
      ++refused_;
      co_return Refusal{ErrorCode::Busy, "max_sessions (" + std::to_string(limits_.max) + ", " +
                                             std::to_string(limits_.per_organization) +
                                             " per organization) are open, kept or having their packages made; "
                                             "retry later"};
    }
    prepared = std::make_unique<Prepared>(reg_, open.organization_id);
  }
  // A kept workspace's packages are known: another set is refused before
  // anything is built for it.
  std::weak_ptr<Workspace> in = kept == reg_->workspaces.end() ? nullptr : kept->second;
  auto check = [in](const std::string& venv, const std::string& node_modules) -> std::optional<Refusal> {
    auto w = in.lock();
    if (!w || w->ended || (w->venv == venv && w->node_modules == node_modules)) return std::nullopt;
    return Refusal{ErrorCode::BadRequest, "workspace " + quoted_for_message(w->name) +
                                              " was made with other packages than this command's (a workspace keeps "
                                              "the packages of its first session): name another workspace, or "
                                              "start this one's command without npx or uvx"};
  };
  if (auto refused = co_await prepare_session_packages(local_, open, reg_->stop_builds, check)) co_return refused;
  if (stopping_) co_return Refusal{ErrorCode::Unavailable, "the daemon is shutting down"};
  if (open.client_gone()) co_return Refusal{ErrorCode::Unavailable, "the client went away while its packages were made"};
  co_return std::nullopt;
}

asio::awaitable<std::optional<Refusal>> Sessions::run(SessionOpen open, ClientSocket& client) {
  const Policy& pol = *open.policy;
  std::string early_input = std::move(open.early_input);  // held by the reader alone, once started
  if (stopping_) co_return Refusal{ErrorCode::Unavailable, "the daemon is shutting down"};
  // The command's own packages (npx, uvx: packages.h), found or built
  // first, holding a slot meanwhile (until admitted).
  std::unique_ptr<Prepared> prepared;
  if (is_package_launcher(open.argv[0]))
    if (auto refused = co_await packages(open, prepared)) co_return refused;
  const std::string message = keeper_session_message(open.argv, open.env);  // to the keeper
  if (message.size() > kMaxKeeperMessage)
    co_return Refusal{ErrorCode::TooLarge, "a session takes a command and environment of at most " +
                                               std::to_string(kMaxKeeperMessage >> 20) + " MiB together"};
  if (!open.workspace.empty()) {
    const std::string key = workspace_key(open.peer.uid, open.organization_id, pol.name, open.workspace);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    asio::steady_timer tick(io_);
    for (auto it = reg_->workspaces.find(key); it != reg_->workspaces.end() && it->second->busy &&
                                               std::chrono::steady_clock::now() < deadline;
         it = reg_->workspaces.find(key)) {
      Workspace& w = *it->second;
      if (!w.ending && !(w.end_if_client_gone && w.end_if_client_gone())) break;  // in use: admit refuses
      tick.expires_after(std::chrono::milliseconds(5));
      co_await tick.async_wait(tuple_awaitable);
    }
  }
  std::shared_ptr<Workspace> ws;
  bool own_slot = false;
  if (auto refused = admit(open, ws, own_slot, prepared != nullptr)) co_return refused;
  prepared.reset();  // its slot is the session's now
  if (ws) ws->busy = true;
  auto s = std::make_shared<Session>(io_, client, open);
  // However this ends (an exception too), the session's watches stop.
  struct Over {
    Session& s;
    ~Over() { s.over = true; }
  } over_at_end{*s};
  reg_->open.insert(s.get());
  if (own_slot) {
    ++reg_->slots;
    ++reg_->orgs[open.organization_id];
  }
  ++total_;
  // (The registry, not this object: a frame destroyed with the event loop,
  // after the Sessions, still finds it.)
  struct Close {
    std::shared_ptr<Registry> reg;
    Session* s;
    std::string org;
    bool own_slot;
    std::shared_ptr<Workspace> ws;
    ~Close() {
      reg->open.erase(s);
      if (ws) {
        ws->busy = false;
        ws->end_if_client_gone = nullptr;
        ws->last_used = std::chrono::steady_clock::now();
      }
      if (!own_slot) return;
      --reg->slots;
      if (--reg->orgs[org] == 0) reg->orgs.erase(org);
    }
  } close{reg_, s.get(), open.organization_id, own_slot, ws};

  const auto t0 = std::chrono::steady_clock::now();
  asio::co_spawn(io_, watch(s), asio::detached);  // the client's going away, from now on
  isolate::RunResult result;
  std::shared_ptr<Workspace> own;  // a session's own sandbox (one-shot)
  if (ws) {
    auto refused = co_await run_in_workspace(io_, s, ws, std::move(early_input), message, result);
    s->over = true;
    if (refused) co_return refused;
  } else {
    auto refused = co_await run_alone(io_, link_, egress_, s, std::move(early_input), message, result, own);
    s->over = true;
    if (refused) co_return refused;
  }
  // 1. The pumps read the pipes to their end (every writer is gone with
  // the command's processes; bounded all the same): all the output is
  // queued, in order. A client that pauses holds the pumps (the queue is
  // full): as long as its writer may still be waiting for it, and 5 s for
  // the pipes.
  s->wake.cancel();
  co_await wait_until(*s, [&] { return s->readers == 0 || s->client_failed; },
                      std::chrono::steady_clock::now() + std::chrono::seconds(5) + open.write_timeout);
  // 2. The record and the audit line.
  const std::string ended_by = s->ended_by.empty() ? "exit" : s->ended_by;
  nlohmann::json record = end_record(*s, pol, result, ended_by, ws.get());
  if (own && !own->egress.is_null()) record["egress"] = own->egress;
  const auto ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  spdlog::info(
      "audit session_id={} request_id={} peer_uid={} peer_pid={} org={} agent={} command={} policy={} "
      "policy_fingerprint={} workspace={} duration_ms={:.1f} ended_by={} end_reason={} exit_code={} bytes_in={} "
      "bytes_out={} bytes_err={}{}",
      s->run_id.empty() ? "-" : s->run_id, quoted_for_message(open.request_id), open.peer.uid, open.peer.pid,
      quoted_for_message(open.organization_id), open.agent_id.empty() ? "-" : quoted_for_message(open.agent_id),
      quoted_for_message(open.argv[0]), quoted_for_message(pol.name), pol.fingerprint,
      ws ? quoted_for_message(ws->name) : std::string("-"), ms, ended_by, isolate::to_string(result.reason),
      result.exit_code, s->bytes_in, s->bytes_out, s->bytes_err,
      (open.packages.is_null() ? std::string() : " packages=" + open.packages["key"].get<std::string>().substr(0, 16)) +
          (own ? own->egress_audit : std::string()));
  // 3. The end frame, last in the writer's queue: the writer sends
  // everything before it, then ends. A client that does not take it all
  // within write_timeout (and a margin) is cut off.
  if (!s->client_failed)
    s->push(protocol::kSessionEnd, record.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  s->end_queued = true;
  s->wake.cancel();
  s->room.cancel();
  if (!co_await wait_until(*s, [&] { return !s->writing; },
                           std::chrono::steady_clock::now() + open.write_timeout + std::chrono::seconds(5))) {
    s->client_failed = true;
    asio::error_code ignored;  // (closed already at the daemon's stop)
    s->client.cancel(ignored);
    co_await wait_until(*s, [&] { return !s->writing; }, std::chrono::steady_clock::time_point::max());
  }
  // 4. The client's reader stops (its read, or its write to a stdin pipe
  // that no one reads any more). Nothing of the session touches the client
  // once this returns: its owner closes it.
  asio::error_code ignored;
  s->stdin_pipe.close(ignored);
  s->client.cancel(ignored);
  co_await wait_until(*s, [&] { return !s->reading; }, std::chrono::steady_clock::time_point::max());
  co_return std::nullopt;
}

nlohmann::json Sessions::list() const {
  using namespace std::chrono;
  nlohmann::json out = nlohmann::json::array();
  const auto now = steady_clock::now();
  for (const Session* s : reg_->open) {
    if (s->run_id.empty()) continue;  // not started yet
    out.push_back({{"session_id", s->run_id},
                   {"organization_id", s->open.organization_id},
                   {"agent_id", s->open.agent_id.empty() ? nlohmann::json() : nlohmann::json(s->open.agent_id)},
                   {"policy", s->open.policy->name},
                   {"program", s->open.argv[0]},
                   {"peer_uid", s->open.peer.uid},
                   {"opened_at", duration_cast<seconds>(s->opened_at.time_since_epoch()).count()},
                   {"age_s", duration<double>(now - s->opened).count()},
                   {"idle_s", duration<double>(now - s->last).count()},
                   {"bytes_in", s->bytes_in},
                   {"bytes_out", s->bytes_out},
                   {"bytes_err", s->bytes_err},
                   {"workspace", s->open.workspace.empty() ? nlohmann::json() : nlohmann::json(s->open.workspace)}});
  }
  return out;
}

nlohmann::json Sessions::list_workspaces() const {
  using namespace std::chrono;
  nlohmann::json out = nlohmann::json::array();
  const auto now = steady_clock::now();
  for (const auto& [key, w] : reg_->workspaces) {
    if (!w->started || w->ended) continue;
    out.push_back({{"workspace_id", w->id},
                   {"organization_id", w->organization_id},
                   {"peer_uid", w->peer_uid},
                   {"name", w->name},
                   {"policy", w->policy->name},
                   {"sessions", w->sessions},
                   {"in_use", w->busy},
                   {"age_s", duration<double>(now - w->created).count()},
                   {"idle_s", w->busy ? 0.0 : duration<double>(now - w->last_used).count()}});
  }
  return out;
}

bool Sessions::kill(const std::string& id) {
  for (Session* s : reg_->open)
    if (!s->run_id.empty() && s->run_id == id) {
      s->end("operator");
      return true;
    }
  for (const auto& [key, w] : reg_->workspaces)
    if (w->started && w->id == id) {
      w->end("operator");
      return true;
    }
  return false;
}

bool Sessions::signal(const std::string& id, int signal, std::uint32_t peer_uid) {
  for (Session* s : reg_->open)
    if (!s->run_id.empty() && s->run_id == id && (peer_uid == 0 || peer_uid == s->open.peer.uid) && !s->over) {
      auto ws = s->keeper.lock();
      return ws && !ws->ended && !ws->ending && send_signal_to_keeper(*ws, signal);
    }
  return false;
}

void Sessions::end_all() {
  stopping_ = true;
  reg_->stop_builds.request();
  for (Session* s : reg_->open) s->end("shutdown");
  std::vector<std::shared_ptr<Workspace>> kept;
  for (const auto& [key, w] : reg_->workspaces) kept.push_back(w);
  for (const auto& w : kept) w->end("shutdown");
}

}  // namespace tsb::core
