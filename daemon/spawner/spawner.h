// The root spawner: the only part of toolsandboxd that keeps root. It holds
// the compiled policy set (daemon/wire/compiled.h), the engine, its
// cgroups and uid slots, and the listening socket; it starts the
// unprivileged front end and serves its run requests over a socketpair.
//
//   Run      checked against the spawner's own copy of the policy (never the
//            front end's word): the policy exists with that fingerprint and
//            runs locally, every environment name is allowed and none is
//            fixed, the timeout is at most the policy's. Then spawn, and the
//            run's stdin, stdout and stderr go to the front end (SCM_RIGHTS).
//   Kill     the front end wants a run ended (client gone, output over cap).
//   Ended    sent when pid 1 of the run has exited: the engine's RunResult.
//   Pools    the warm pools as they are (PoolState).
//
// Warm sandboxes: a policy with a warm_pool gets, per mode, up to its max
// sandboxes made before any request, on the spawn thread (spawn_thread.h) (with the policy's own venv: a
// per-tool venv's run is always cold), with the policy's fixed environment
// only, each waiting on its stdin socket. A Run that allows it takes a
// ready one still alive (Started says so) and its wall-clock and CPU-time
// limits count from then; none is ever used twice. They are made one at a
// time, when no run has been in flight for a moment (or, for a pool short
// for a while, at a slow pace), never past max_concurrent_runs in all nor
// so many that runs would lack a uid slot. How long a pool has been short
// counts from the run that took from it, not from a turn of the loop.
// A reload or a stop ends them all.
//
// The wall-clock and CPU-time limits and the kill are enforced here, in one
// poll loop; its only other thread is the spawn thread. A front end that dies
// has its runs killed and is started again; one that cannot start ends the
// spawner.
#pragma once

#include <sys/types.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "daemon/spawner/spawn_thread.h"
#include "daemon/wire/compiled.h"
#include "isolate/base/result.h"
#include "isolate/base/unique_fd.h"
#include "isolate/engine/engine.h"

namespace tsb::spawn {

struct SpawnerOptions {
  std::string front_end;    // path of toolsandboxd-frontend
  std::string config_path;  // passed to the front end and the compile helper
};

// Runs the compile helper (uid 0, every capability dropped, no_new_privs)
// and reads its compiled set. `optional`: a missing configuration file
// gives the embedded defaults. kSetup (the start): the helper also prepares
// what the engine needs on the host (daemon/compile/prepare.h); kCheck: the helper
// prints what it loaded and nothing is read back. `sources` (not with
// kCheck) gets the helper's record of the files it read, in a memfd the
// helper sealed, which this process passes to the front end and never reads.
enum class Compile { kSetup, kPolicies, kCheck };
Result<CompiledSet> compile_policies(const SpawnerOptions& o, bool optional, Compile what, UniqueFd* sources);

class Spawner {
 public:
  Spawner(SpawnerOptions opts, CompiledSet set, UniqueFd sources, std::unique_ptr<isolate::Engine> engine);
  ~Spawner();

  // The socket systemd passed, or one bound at the compiled socket path.
  Status open_listener();
  // Starts the front end and serves until it has exited after a stop
  // request (SIGTERM, SIGINT), or it could not be kept running. Returns the
  // exit status for main().
  int run();

 private:
  struct Live {
    std::uint64_t id = 0;
    std::unique_ptr<isolate::Sandbox> sb;
    isolate::Observations obs;
    std::chrono::steady_clock::time_point started;  // the spawn, or a warm sandbox's hand-over
    std::chrono::nanoseconds cpu_before{0};         // a warm sandbox's CPU time before its hand-over
    std::chrono::steady_clock::time_point wall_deadline;
    std::chrono::steady_clock::time_point next_cpu_check;
    bool cpu_limited = false;
    bool socket_limited = false;
    bool orphan = false;  // its front end is gone: no one to tell
  };

  // A warm sandbox (see above), and its pool.
  struct Pooled {
    std::uint64_t seq = 0;
    std::unique_ptr<isolate::Sandbox> sb;
    UniqueFd in, out, err, egress;
    bool ready = false;  // its runner wrote on the socket: it waits for the hand-over
  };
  struct Pool {
    std::string key;                      // in pools_
    const SpawnPolicy* policy = nullptr;  // in set_ (pools end at a reload)
    RunMode mode = RunMode::Tool;
    std::vector<Pooled> idle;
    std::uint32_t target = 0;
    std::chrono::steady_clock::time_point last_run, paused_until;
    std::chrono::steady_clock::time_point full_at;  // the last time it had its target
    std::uint64_t hits = 0, misses = 0, lost = 0;
    unsigned lost_in_a_row = 0;
  };
  Pool* pool_for(const SpawnPolicy& p, RunMode mode);
  void tend_pools(std::chrono::steady_clock::time_point now, bool quiet);
  void lose(Pool& pool, std::chrono::steady_clock::time_point now);  // one ended before its use
  // The pool to refill now, if any; `due`: when the next refill may start
  // (max: none wanted).
  Pool* next_to_fill(std::chrono::steady_clock::time_point now, std::chrono::steady_clock::time_point& due);
  void fill(Pool& pool);
  void take_filled(std::chrono::steady_clock::time_point now);  // the spawn thread's sandbox into its pool
  void end_pools();  // a reload or the stop: every warm sandbox ends

  Status start_front_end();
  // The steps of one turn of run()'s loop, in the order it takes them.
  // A sandbox joins the epoll set: its pidfd and `second`.
  Status watch(const isolate::Sandbox& sb, int second);
  void take_signals(std::chrono::steady_clock::time_point now);  // SIGHUP reloads, SIGTERM and SIGINT stop
  void read_front_end();  // the front end's messages, at most 64
  // Runs whose pid 1 exited (finish); warm sandboxes ended or ready.
  void watch_sandboxes(std::chrono::steady_clock::time_point now);
  // The front end has exited: reaped, its runs killed; another one is due
  // at restart_at_, or the spawner stops (one that never became ready, or
  // too many ends in a minute).
  void front_end_gone(std::chrono::steady_clock::time_point now);
  void handle_message(const std::string& msg, std::vector<UniqueFd>& fds);
  void handle_run(const std::string& msg);
  void refuse(std::uint64_t id, RefuseCode code, const std::string& why);
  void finish(Live& l);
  std::size_t live_runs() const {  // not orphans
    return std::count_if(runs_.begin(), runs_.end(), [](const auto& r) { return !r.second.orphan; });
  }
  void check_limits(std::chrono::steady_clock::time_point now);
  void reload();
  void send(const std::string& msg, const int* fds = nullptr, std::size_t nfds = 0);
  std::chrono::milliseconds poll_timeout(std::chrono::steady_clock::time_point now);
  const SpawnPolicy* find_policy(const std::string& name, const std::string& fingerprint) const;
  UniqueFd open_key_file() const;

  SpawnerOptions opts_;
  CompiledSet set_;
  UniqueFd sources_;  // the record of the files set_ was compiled from
  // The set before the last reload, for kPreviousSetLifetime: a run the
  // front end prepared under it (queued while the reload happened) still
  // starts under the policy it was placed with.
  std::vector<SpawnPolicy> previous_;
  std::chrono::steady_clock::time_point previous_until_{};
  static constexpr std::chrono::seconds kPreviousSetLifetime{60};
  std::unique_ptr<isolate::Engine> engine_;
  std::unique_ptr<SpawnThread> spawn_thread_;  // after engine_: ends first
  UniqueFd listener_;
  bool owns_socket_file_ = false;
  dev_t socket_dev_ = 0;
  ino_t socket_ino_ = 0;
  UniqueFd signals_;  // signalfd: SIGTERM, SIGINT, SIGHUP
  UniqueFd epoll_;    // the sandboxes' descriptors (watch)
  UniqueFd control_;  // our end of the current front end's socketpair
  UniqueFd fe_pidfd_;
  pid_t fe_pid_ = -1;
  bool fe_ready_ = false;  // the current front end said READY=1
  bool stopping_ = false;
  std::chrono::steady_clock::time_point stop_deadline_{};
  std::chrono::steady_clock::time_point next_socket_sweep_{};  // v1: the runs' socket checks, together
  int fe_exit_ = 0;
  std::vector<std::chrono::steady_clock::time_point> restarts_;
  std::chrono::steady_clock::time_point restart_at_{};  // when the next front end may start
  std::map<std::uint64_t, Live> runs_;  // by the front end's id; orphans keep theirs
  std::uint64_t orphan_seq_ = 0;
  std::map<std::string, Pool> pools_;  // by fingerprint and mode
  std::uint64_t pools_generation_ = 0;  // end_pools: a spawn under way is for pools that are gone
  std::string filling_;                 // the key of the pool the spawn thread works for
  std::uint64_t pooled_seq_ = 0;
  std::chrono::steady_clock::time_point last_fill_{};
  std::chrono::steady_clock::time_point last_activity_{};  // a Run received, an Ended sent
  static constexpr std::chrono::milliseconds kRefillQuiet{20};
  static constexpr std::chrono::milliseconds kRefillUnderLoad{250};
  static constexpr std::chrono::seconds kMaxStart{30};  // a warm sandbox not ready by then is lost
};

}  // namespace tsb::spawn
