// The front end's side of the spawner socket (daemon/spawner/spawner.h):
// run orders out; Started (with the run's stdio), Refused and Ended back.
//
// A local run, seen from here: send the order; on Started, write the
// request to the run's stdin and read its stdout and stderr under the
// policy's caps (past a cap, ask the spawner to end the run as
// output_limit); on the run's cancel signal, ask it to kill the run; return
// once the spawner's Ended has arrived and both pipes are drained.
#pragma once

#include <asio/awaitable.hpp>
#include <asio/io_context.hpp>
#include <asio/posix/stream_descriptor.hpp>
#include <asio/steady_timer.hpp>
#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "daemon/frontend/pipeline/cancel.h"
#include "daemon/frontend/letta/result.h"
#include "daemon/frontend/local/front_codec.h"
#include "isolate/base/result.h"
#include "isolate/base/unique_fd.h"
#include "isolate/supervise/outcome.h"

namespace tsb::egress {
class RunProxy;
}

namespace tsb::core {

// A tool run's result channel (daemon/frontend/letta/letta.h, "The result channel"):
// the run's stdin is its socket. The first part is written at once, the
// second once the runner has declared whether its function takes
// agent_state; what the runner then sends is kept up to `cap` bytes.
struct ChannelExchange {
  std::string first;                              // with its header
  std::function<std::string(bool declared)> second;  // likewise
  std::uint64_t cap = 0;
};
struct LinkRun {
  std::optional<spawn::Refused> refused;  // the spawner did not run it
  isolate::RunResult result;              // otherwise: what happened, output included
  std::optional<ChannelOutcome> channel;  // with a ChannelExchange
  bool warm = false;                      // a warm sandbox of the policy's pool ran it
  std::chrono::nanoseconds warm_start_cpu{0};  // what that sandbox used before its hand-over
};

class SpawnerLink {
 public:
  SpawnerLink(asio::io_context& io, UniqueFd control);
  ~SpawnerLink();

  // Blocking, once at start: the spawner's Hello.
  Status handshake();
  const spawn::Hello& hello() const noexcept { return hello_; }
  // Starts reading the spawner's messages.
  void start();

  // stdout_frame_tokens: where a result frame starts in stdout, which is
  // kept even past stdout_cap (capped_output.h). A run of network egress
  // hands its proxy the socket the sandbox's listener arrives on; without
  // `egress` (a pickle's decoding) it stays unused until the run ends.
  // `stdout_sink` (a venv build, daemon/venv/cache.h): stdout is handed
  // to it as it arrives instead of being kept; when it returns false the
  // run is killed (and the rest read and dropped).
  // With `channel`, stdin is the run's result channel and stdin_data is
  // not used. A warm sandbox (the order allowed one and the spawner gave
  // one) first gets the hand-over: the order's environment, after its
  // runner said it is ready (daemon/frontend/letta/letta.h, kChannelReady).
  // `frame_cap`: what is kept of a frame past stdout's cap (capped_output.h).
  // `take_stdio` (a session, daemon/frontend/local/session.cc): the run's
  // stdin, stdout and stderr go to it once it started, with its run id,
  // instead of being written and read here; the run's end is as above,
  // without output.
  using StdoutSink = std::function<bool(std::string_view)>;
  using TakeStdio = std::function<void(const std::string& run_id, std::vector<UniqueFd> fds)>;
  asio::awaitable<LinkRun> run(spawn::RunOrder order, std::string stdin_data, std::uint64_t stdout_cap,
                               std::uint64_t stderr_cap, std::vector<std::string> stdout_frame_tokens,
                               CancelSignal& cancel, egress::RunProxy* egress = nullptr, StdoutSink stdout_sink = {},
                               std::optional<ChannelExchange> channel = std::nullopt, std::uint64_t frame_cap = 0,
                               TakeStdio take_stdio = {});
  // The spawner's warm pools as they are now; nullopt when it did not
  // answer within 2 s.
  asio::awaitable<std::optional<spawn::PoolState>> pool_state();
  // Runs in flight in a warm sandbox.
  unsigned warm_runs() const noexcept { return warm_runs_; }
  // How long past a run's timeout its end may take before the spawner
  // counts as hung for it (a minute; tests shorten it).
  void set_overdue_margin(std::chrono::milliseconds m) { overdue_margin_ = m; }

  // Ready (READY=1), with a status text (STATUS=...; "" for none): passed
  // on to systemd by the spawner (the only process systemd listens to).
  void notify_ready(std::string_view status);

  // The spawner's reload: whether its new set is in force and, when it is,
  // the compile helper's record of the files (daemon/policy/sources.h) and
  // the new E2B key file's descriptor, if any.
  std::function<void(bool applied, UniqueFd sources, UniqueFd key)> on_reload;

 private:
  struct Pending;
  struct PoolQuestion;
  asio::awaitable<void> receive_loop();
  // Sends a message, or queues it behind those not sent yet when the
  // socket has no room (the spawner busy spawning while orders with large
  // environments wait): queued messages go out in order as room comes, so
  // none is lost and none overtakes another. Fails only for a message
  // larger than the socket can ever take (EMSGSIZE) or a spawner gone.
  // `run`: the run whose order it is (0: none), refused should its queued
  // order fail to go out.
  Status send(std::string msg, std::uint64_t run = 0);
  asio::awaitable<void> flush_queued();

  // The steps of run() and the coroutines it starts (spawner_link.cc).
  struct Forget;
  struct Output;
  // Asks the spawner to kill the run, once.
  void kill_once(std::uint64_t id, Pending& p);
  // Waits for the spawner's answer (until_end: its Ended); false when the
  // run's deadline came first.
  static asio::awaitable<bool> wait_for_spawner(Pending& p, bool until_end);
  // The spawner overdue for the run: it is killed, and what the client gets.
  LinkRun give_up(std::uint64_t id, Pending& p);
  // The result channel on the run's stdin socket: the first part, the
  // runner's declaration, the second part, then what the runner sends.
  static asio::awaitable<void> exchange_channel(asio::io_context& io, UniqueFd fd, ChannelExchange ex,
                                                std::shared_ptr<Pending> p, std::shared_ptr<ChannelOutcome> o,
                                                std::string handover);
  // Steps 5 and 6 of run(): stdin written (or the result channel), stdout
  // and stderr read, by coroutines of their own.
  void start_stdio(const std::shared_ptr<Pending>& p, std::uint64_t id, const spawn::RunOrder& order,
                   std::string stdin_data, std::uint64_t stdout_cap, std::uint64_t stderr_cap,
                   std::vector<std::string> stdout_frame_tokens, StdoutSink stdout_sink,
                   std::optional<ChannelExchange> channel, std::uint64_t frame_cap, std::shared_ptr<Output>& output,
                   std::shared_ptr<ChannelOutcome>& outcome);
  // Reads stdout (i 0) or stderr (i 1) to its end, into `o`.
  asio::awaitable<void> read_output(std::uint64_t id, UniqueFd fd, std::shared_ptr<Pending> p, std::shared_ptr<Output> o,
                                    int i);

  asio::io_context& io_;
  UniqueFd control_;
  asio::posix::stream_descriptor sd_;
  spawn::Hello hello_;
  std::uint64_t next_id_ = 0;
  std::map<std::uint64_t, std::shared_ptr<Pending>> pending_;
  std::deque<std::shared_ptr<PoolQuestion>> pool_questions_;
  std::deque<std::pair<std::uint64_t, std::string>> unsent_;  // (run, message) waiting for room, oldest first
  std::size_t sndbuf_ = 212992;     // the socket's send buffer (SO_SNDBUF), read at start
  unsigned warm_runs_ = 0;  // answered in the order asked
  std::chrono::milliseconds overdue_margin_{60'000};
};

}  // namespace tsb::core
