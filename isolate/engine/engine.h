// The engine: builds one sandbox per run and hands it to the supervisor.
//
//   Engine::create   once per process: checks privileges, sets up cgroups,
//                    finds toolsandbox-init.
//   Engine::spawn    per run: uid slot, cgroup leaf, pipes, the mounts and
//                    the plan (isolate/engine/mounts.h, isolate/engine/plan.h), clone3, id
//                    maps, sync; toolsandbox-init builds the sandbox.
//   supervise()      per run (isolate/supervise/supervise.h): I/O, limits, result.
//   Engine::run      blocking spawn + supervise, for the command line.
//
// Engine::spawn may run on several threads at once (the spawner makes warm
// sandboxes on a thread of their own, docs/ARCHITECTURE.md): the engine's
// shared state is locked, and the clone3 child (child.h) takes no lock and
// allocates nothing, so a lock another thread held at clone3 never matters
// to it. A Sandbox is used by one thread at a time.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "isolate/engine/cgroup.h"
#include "isolate/base/result.h"
#include "isolate/engine/seccomp.h"
#include "isolate/engine/spec.h"
#include "isolate/base/unique_fd.h"

namespace tsb::isolate {

struct EngineConfig {
  // cgroup subtree the engine owns; every run gets a leaf below it.
  std::string cgroup_parent = "/toolsandbox";
  // Where run leaves go, prepared by the caller (daemon/compile/prepare.h): the
  // engine creates no cgroup of its own but the leaves.
  CgroupPlacement cgroups;
  // Runtime state, prepared by the caller (daemon/compile/prepare.h): the
  // uid-slot lock file, the staging mount point, the engines' locks.
  std::string state_dir = "/run/toolsandbox";
  // Host ids for sandboxes: run slot k maps sandbox ids 0..65535 to host
  // ids uid_base + k*65536 .. +65535. Never 0; must not overlap real users
  // or /etc/subuid ranges.
  std::uint32_t uid_base = 1u << 30;
  std::uint32_t uid_slots = 1024;  // also the most runs at once on this host
  // toolsandbox-init, an absolute path (the caller finds it:
  // daemon/compile/prepare.h, find_init).
  std::string init_path;
  // cgroup leaf names are "<prefix>.<engine pid>.<instance>-<n>": the random
  // instance tag names the engine, whose lock file
  // (<state_dir>/engines/<instance>.lock) says whether it is alive.
  std::string leaf_prefix = "run";
  // Leaves of engines that are gone, found by the caller
  // (daemon/compile/prepare.h): Engine::create kills and removes them.
  std::vector<std::string> stale_leaves;
  // Read-only host directories are shown through overlays made by the
  // engine, so /proc/self/mountinfo in a sandbox names no host path, device
  // or file system (isolate/engine/mounts.h). Needs overlayfs; false binds them
  // directly, and mountinfo shows where they come from.
  bool hide_host_paths = true;
  // oom_score_adj of every sandbox process (-1000..1000): under memory
  // pressure the kernel kills runs before the daemon or anything else.
  int sandbox_oom_score_adj = 1000;
  // The tool's Landlock ruleset, as far as the kernel's ABI goes (docs/SECURITY.md,
  // "Landlock"); false: none (engine.landlock "off").
  bool landlock = true;
};

// What this kernel lets the engine do, probed once by Engine::create.
struct EngineFeatures {
  bool memfd_noexec = false;  // vm.memfd_noexec (Linux 6.3+): memfds of a run cannot be executed
  bool overlay_views = false; // read-only host directories shown through overlays
  bool tcp_memory_limit = false;  // v1: memory.kmem.tcp.limit_in_bytes; v2 charges sockets to memory.max
  bool oom_score_floor = false;   // CAP_SYS_RESOURCE: a run's oom_score_adj is also its floor
  int landlock_abi = 0;           // the Landlock ABI runs get (0: the kernel has none; -1: turned off)
};

// What the supervisor (the root spawner's loop, or isolate/supervise/supervise.h)
// observed of a run: the facts the end reason is classified from, outside
// the root process (isolate/supervise/outcome.h).
struct Observations {
  bool have_tool_status = false;
  int tool_status = 0;  // raw wait status of the tool
  bool have_setup_error = false;
  int setup_stage = 0;
  int setup_errno = 0;
  std::string setup_path;  // the sandbox path of the plan's step that failed, when a step did
  std::vector<std::string> moved_aside;  // what the set-up moved out of mount points' way, where it went
  bool timed_out = false;
  bool output_exceeded = false;
  bool cpu_exceeded = false;
  bool cancelled = false;
  bool backstop = false;     // the sandbox's init ended the run at its own wall-clock fence
  int backstop_s = 0;
  int landlock = -1;  // the tool's Landlock report (isolate/engine/stage.h); -1: none came
  std::uint64_t oom_kills = 0;
  std::uint64_t pids_max_hits = 0;
  bool socket_limit_reached = false;  // v1: socket buffers reached the run's memory limit
  std::string engine_error;  // the engine could not start the run: why (nothing ran)
  int engine_errno = 0;
};
struct RunResult;  // isolate/supervise/outcome.h
struct EngineCore;  // shared by the engine and its sandboxes (engine.cc)

class Engine;

// One live sandbox, from clone3 until it is reaped. Owns every resource of
// the run (commit-on-success: nothing leaks on any path). The destructor
// never blocks: it kills the whole tree and hands what is not yet gone (an
// unreaped init, a busy cgroup leaf, with the uid-slot lease, which is held
// until then) to the engine's retired list, collected later by
// Engine::collect_retired.
class Sandbox {
 public:
  ~Sandbox();
  Sandbox(const Sandbox&) = delete;
  Sandbox& operator=(const Sandbox&) = delete;

  const std::string& run_id() const noexcept { return run_id_; }
  pid_t pid() const noexcept { return pid_; }
  int pidfd() const noexcept { return pidfd_.get(); }
  // Readable when init has reported: its last report is the tool's status,
  // after which it only exits (isolate/init/init.cc).
  int report_fd() const noexcept { return report_r_.get(); }
  std::uint32_t host_uid() const noexcept { return host_uid_; }
  const Limits& limits() const noexcept { return limits_; }
  std::chrono::steady_clock::time_point started() const noexcept { return started_; }
  CgroupLeaf& cgroup() noexcept { return *leaf_; }
  // cgroup v1 with memory.kmem.tcp: the run's socket buffers are limited
  // apart from its memory (supervise() ends the run when they hit it).
  bool socket_memory_is_limited() const noexcept;

  // The parent's ends of the pipes; the supervisor takes them over.
  UniqueFd take_stdin() noexcept { return std::move(stdin_w_); }
  UniqueFd take_stdout() noexcept { return std::move(stdout_r_); }
  UniqueFd take_stderr() noexcept { return std::move(stderr_r_); }
  // Network egress: the socket the proxy's listener arrives on (plan.h).
  UniqueFd take_egress() noexcept { return std::move(egress_); }
  // What the sandbox's init and its clone3 child reported so far
  // (isolate/engine/stage.h), added to `o`; never blocks.
  void read_reports(Observations& o) const;

  // SIGKILL the whole tree now (pid namespace and cgroup). Idempotent.
  void kill() noexcept;
  // The caller (client gone, shutdown) wants the run stopped: kill, and
  // remember why, so the result says "cancelled".
  void cancel() noexcept;
  bool cancelled() const noexcept { return cancelled_; }

  // After the pidfd became readable: reap init (waitid) and return its raw
  // wait status. Safe to call once; later calls return the same status.
  Result<int> reap();
  // One non-blocking attempt to remove the cgroup leaf (after reap): kills
  // what is left in it, then rmdir. False while processes are still exiting
  // (EBUSY): try again later. The destructor hands a leaf that is still
  // there to the engine, which removes it later without blocking anyone.
  Result<bool> try_remove_cgroup();

  // The engine's pending clean-up: reap sandboxes destroyed before their
  // end, remove leaves that were busy. Non-blocking; returns what is left.
  std::size_t collect_retired();

 private:
  friend class Engine;
  Sandbox() = default;

  std::shared_ptr<EngineCore> core_;
  std::string run_id_;
  pid_t pid_ = -1;
  UniqueFd pidfd_;
  bool reaped_ = false;
  int init_status_ = 0;
  bool cancelled_ = false;
  std::uint32_t host_uid_ = 0;
  Limits limits_;
  std::chrono::steady_clock::time_point started_;
  UniqueFd stdin_w_, stdout_r_, stderr_r_, report_r_, egress_;
  // The engine's end of the watch pipe: when the engine dies it closes, and
  // the sandbox's init ends the run (isolate/init/init.cc).
  UniqueFd watch_w_;
  UniqueFd uid_slot_;  // an OFD lock on the slot's record in the lock file (init holds it too)
  std::uint32_t slot_ = 0;
  std::unique_ptr<CgroupLeaf> leaf_;
  std::vector<std::string> step_paths_;  // the plan's steps' paths, which reports name by index
};

class Engine {
 public:
  // `init_filter`: the seccomp program toolsandbox-init loads on itself
  // (policy::compile_init_filter), required.
  static Result<std::unique_ptr<Engine>> create(EngineConfig config, std::shared_ptr<const SeccompProgram> init_filter);
  ~Engine();

  // Build the sandbox and start the tool. Returns once the child is in its
  // cgroup with its id maps; set-up errors inside the sandbox arrive later
  // on the report pipe and are turned into the result by supervise().
  Result<std::unique_ptr<Sandbox>> spawn(const RunSpec& spec);

  // Blocking: spawn, feed stdin, collect output, enforce limits, clean up.
  RunResult run(const RunSpec& spec);

  const EngineConfig& config() const noexcept { return config_; }
  Cgroups& cgroups() noexcept;
  const EngineFeatures& features() const noexcept { return features_; }
  // This engine's tag (leaf names, lock file).
  const std::string& instance() const noexcept { return instance_; }
  // What Engine::create found and did at start-up, one sentence each:
  // leaves of engines that are gone, killed and removed (or that could not
  // be), kernel features missing. For the daemon's log.
  const std::vector<std::string>& startup_notes() const noexcept { return startup_notes_; }

  // Pending clean-up (sandboxes destroyed early, leaves still busy): one
  // non-blocking pass; returns how many are left.
  std::size_t collect_retired();
  // Blocking: collect until nothing is left or `limit` passes.
  std::size_t drain_retired(std::chrono::milliseconds limit);


 private:
  Engine() = default;
  struct Launch;  // one spawn's steps (engine.cc)
  Result<UniqueFd> lease_uid_slot(std::uint32_t* slot);
  void reclaim_at_start();

  EngineConfig config_;
  EngineFeatures features_;
  std::shared_ptr<EngineCore> core_;
  std::string staging_root_;
  std::string slot_lock_path_;
  std::string engines_dir_;  // <state_dir>/engines: one lock file per live engine
  UniqueFd instance_lock_;   // flock'ed for this engine's lifetime
  UniqueFd init_exe_;        // O_PATH
  UniqueFd proc_;            // O_PATH of /proc, checked: the root of a procfs mount
  std::string init_filter_;  // its instructions, as each plan carries them
  UniqueFd empty_dir_;       // O_PATH of <state_dir>/empty, the overlays' lowest layer
  std::uint64_t seq_ = 0;
  std::string instance_;     // random tag in leaf names (see spawn)
  std::uint32_t next_slot_ = 0;     // with seq_: under reserve_mu_
  std::mutex reserve_mu_;
  std::vector<std::string> startup_notes_;
};


}  // namespace tsb::isolate
