#include "isolate/supervise/supervise.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/posix/stream_descriptor.hpp>
#include <asio/redirect_error.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/write.hpp>
#include <csignal>
#include <cstring>

#include "isolate/engine/stage.h"

namespace tsb::isolate {
namespace {

using asio::use_awaitable;
using std::chrono::steady_clock;
using stream = asio::posix::stream_descriptor;

struct RunState {
  std::shared_ptr<Sandbox> sb;
  Observations obs;
  RunResult result;
  int open_readers = 0;
  bool finished = false;            // pid 1 was reaped; watchdogs must stop
  asio::steady_timer readers_done;  // cancelled when the last reader hits EOF
  asio::steady_timer wall;
  asio::steady_timer cpu;
  asio::steady_timer sockets;

  RunState(std::shared_ptr<Sandbox> s, const asio::any_io_executor& ex)
      : sb(std::move(s)), readers_done(ex, steady_clock::time_point::max()), wall(ex), cpu(ex), sockets(ex) {}

  void kill_for(bool Observations::*flag) {
    if (!(obs.*flag)) obs.*flag = true;
    sb->kill();
  }
};

// Reads one pipe to EOF. Keeps at most `cap` bytes; past the cap the run is
// ended (output_limit) and the rest is read and dropped, so the caller's
// memory stays flat whatever the tool writes.
asio::awaitable<void> read_pipe(std::shared_ptr<RunState> st, UniqueFd fd, std::string* sink, bool* truncated,
                                std::uint64_t* total, std::uint64_t cap) {
  auto ex = co_await asio::this_coro::executor;
  stream sd(ex, fd.release());
  std::array<char, 65536> buf;
  for (;;) {
    asio::error_code ec;
    std::size_t n = co_await sd.async_read_some(asio::buffer(buf), asio::redirect_error(use_awaitable, ec));
    if (ec) break;  // eof or error: either way this stream is over
    *total += n;
    if (sink->size() < cap) {
      std::size_t take = static_cast<std::size_t>(std::min<std::uint64_t>(n, cap - sink->size()));
      sink->append(buf.data(), take);
      if (take < n) *truncated = true;
    } else {
      *truncated = true;
    }
    if (*truncated && !st->obs.output_exceeded) st->kill_for(&Observations::output_exceeded);
  }
  if (--st->open_readers == 0) st->readers_done.cancel();
}

asio::awaitable<void> write_stdin(UniqueFd fd, std::string data) {
  auto ex = co_await asio::this_coro::executor;
  stream sd(ex, fd.release());
  if (!data.empty()) {
    asio::error_code ec;
    // EPIPE when the tool never reads its input is fine: SIGPIPE is ignored.
    co_await asio::async_write(sd, asio::buffer(data), asio::redirect_error(use_awaitable, ec));
  }
  // Closing gives the tool EOF.
}

asio::awaitable<void> wall_watchdog(std::shared_ptr<RunState> st) {
  asio::error_code ec;
  co_await st->wall.async_wait(asio::redirect_error(use_awaitable, ec));
  if (!ec && !st->finished) st->kill_for(&Observations::timed_out);
}

// CPU time of the whole cgroup. The earliest the budget can run out is
// remaining / quota, so the check sleeps that long: no polling loop.
asio::awaitable<void> cpu_watchdog(std::shared_ptr<RunState> st) {
  const auto limit = std::chrono::duration_cast<std::chrono::nanoseconds>(st->sb->limits().cpu_time);
  const double cpus = std::max(0.001, st->sb->limits().cpu_quota_millicpus / 1000.0);
  for (;;) {
    if (st->finished) co_return;
    auto used = st->sb->cgroup().cpu_usage();
    if (used >= limit) {
      st->kill_for(&Observations::cpu_exceeded);
      co_return;
    }
    auto wait = std::chrono::nanoseconds(static_cast<long long>((limit - used).count() / cpus));
    st->cpu.expires_after(std::max<std::chrono::nanoseconds>(wait, std::chrono::milliseconds(10)));
    asio::error_code ec;
    co_await st->cpu.async_wait(asio::redirect_error(use_awaitable, ec));
    if (ec || st->finished) co_return;  // cancelled: the run ended
  }
}

// cgroup v1 charges socket buffers to memory.kmem.tcp, not to the run's
// memory limit: at memory.kmem.tcp.limit_in_bytes (set to that limit) the
// kernel refuses them more memory, so sends stall instead of the run being
// OOM-killed as on v2. Such a run ends as memory_limit like on v2 (classify
// reads the high watermark at the end, whatever happened meanwhile), and one
// that keeps going is killed here. v1 has no notification for that counter
// (memory thresholds cover memory.usage_in_bytes only), so it is read every
// 100 ms.
asio::awaitable<void> socket_watchdog(std::shared_ptr<RunState> st) {
  for (;;) {
    st->sockets.expires_after(std::chrono::milliseconds(100));
    asio::error_code ec;
    co_await st->sockets.async_wait(asio::redirect_error(use_awaitable, ec));
    if (ec || st->finished) co_return;  // cancelled: the run ended
    if (st->sb->cgroup().socket_limit_reached()) {
      st->sb->kill();
      co_return;
    }
  }
}

}  // namespace

asio::awaitable<RunResult> supervise(std::shared_ptr<Sandbox> sandbox, std::string stdin_data) {
  auto ex = co_await asio::this_coro::executor;
  auto st = std::make_shared<RunState>(sandbox, ex);
  RunResult& r = st->result;
  r.run_id = sandbox->run_id();
  r.host_uid = sandbox->host_uid();
  const Limits& lim = sandbox->limits();

  st->open_readers = 2;
  asio::co_spawn(ex, read_pipe(st, sandbox->take_stdout(), &r.stdout_data, &r.stdout_truncated,
                               &r.stdout_total_bytes, lim.stdout_bytes), asio::detached);
  asio::co_spawn(ex, read_pipe(st, sandbox->take_stderr(), &r.stderr_data, &r.stderr_truncated,
                               &r.stderr_total_bytes, lim.stderr_bytes), asio::detached);
  asio::co_spawn(ex, write_stdin(sandbox->take_stdin(), std::move(stdin_data)), asio::detached);

  st->wall.expires_at(sandbox->started() + lim.wall_timeout);
  asio::co_spawn(ex, wall_watchdog(st), asio::detached);
  if (lim.cpu_time.count() > 0) asio::co_spawn(ex, cpu_watchdog(st), asio::detached);
  if (sandbox->socket_memory_is_limited()) asio::co_spawn(ex, socket_watchdog(st), asio::detached);

  // pid 1 exiting is the end of the run: the kernel has then killed every
  // other process of the pid namespace. The Sandbox's own pidfd is watched
  // (no duplicate to allocate or leak) and handed back before it returns.
  {
    stream pidfd(ex, sandbox->pidfd());
    struct Release {
      stream& s;
      ~Release() { (void)s.release(); }
    } give_back{pidfd};
    asio::error_code ec;
    co_await pidfd.async_wait(stream::wait_read, asio::redirect_error(use_awaitable, ec));
  }
  auto ended = steady_clock::now();
  st->finished = true;
  st->wall.cancel();
  st->cpu.cancel();
  st->sockets.cancel();
  (void)sandbox->reap();

  // Every writer is gone, so both pipes reach EOF promptly. Bounded anyway:
  // a pipe can only stay open if something outlived the namespace.
  if (st->open_readers > 0) {
    st->readers_done.expires_after(std::chrono::seconds(5));
    asio::error_code ec;
    co_await st->readers_done.async_wait(asio::redirect_error(use_awaitable, ec));
  }

  sandbox->read_reports(st->obs);
  CgroupStats cs = sandbox->cgroup().stats();
  st->obs.oom_kills = cs.oom_kills;
  st->obs.pids_max_hits = cs.pids_max_hits;
  st->obs.socket_limit_reached = sandbox->cgroup().socket_limit_reached();
  st->obs.cancelled = sandbox->cancelled();
  r.cpu = cs.cpu;
  r.peak_memory_bytes = cs.peak_memory_bytes;
  r.wall = ended - sandbox->started();
  classify(st->obs, r);
  // Remove the leaf without blocking the event loop: processes killed a
  // moment ago may keep it busy (EBUSY) for a little while. A leaf still
  // busy after that goes to the engine's pending clean-up with the Sandbox.
  {
    asio::steady_timer retry(ex);
    for (int attempt = 0; attempt < 100; ++attempt) {
      auto done = sandbox->try_remove_cgroup();
      if (!done.ok()) {
        if (r.error.empty()) r.error = done.error().message;
        break;
      }
      if (*done) break;
      retry.expires_after(attempt < 10 ? std::chrono::milliseconds(1) : std::chrono::milliseconds(20));
      asio::error_code ec;
      co_await retry.async_wait(asio::redirect_error(use_awaitable, ec));
    }
  }
  (void)sandbox->collect_retired();
  co_return std::move(r);
}

}  // namespace tsb::isolate
