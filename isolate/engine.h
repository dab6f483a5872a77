// The engine: builds one sandbox per run and hands it to the supervisor.
//
//   Engine::create   once per process: checks privileges, detects cgroups,
//                    compiles the init filter, finds toolsandbox-init.
//   Engine::spawn    per run: cgroup leaf, pipes, clone3, id maps, sync.
//   supervise()      per run (isolate/supervise.h): I/O, limits, result.
//   Engine::run      blocking spawn + supervise, for the command line.
//
// Single-threaded by design: clone3 must be called from a process with one
// thread (the child inherits only the calling thread, and locks held by
// others would stay held forever in the child).
#pragma once

#include <sys/capability.h>
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "isolate/cgroup.h"
#include "isolate/result.h"
#include "isolate/seccomp.h"
#include "isolate/spec.h"
#include "isolate/unique_fd.h"

namespace tsb::isolate {

struct EngineConfig {
  // cgroup subtree the engine owns; every run gets a leaf below it.
  std::string cgroup_parent = "/toolsandbox";
  // Runtime state: the uid-slot lock file and the staging mount point.
  std::string state_dir = "/run/toolsandbox";
  // Host ids for sandboxes: run slot k maps sandbox ids 0..65535 to host
  // ids uid_base + k*65536 .. +65535. Never 0; must not overlap real users
  // or /etc/subuid ranges.
  std::uint32_t uid_base = 1u << 30;
  std::uint32_t uid_slots = 1024;  // also the most runs at once on this host
  // toolsandbox-init; empty = next to the running program, then libexec.
  std::string init_path;
  // cgroup leaf names are "<prefix>.<engine pid>.<instance>-<n>"; leaves with a
  // dead owner pid are reclaimed by Engine::create.
  std::string leaf_prefix = "run";
  // The root tmpfs of a sandbox (skeleton and /etc stubs only).
  std::uint64_t root_tmpfs_bytes = 1u << 20;
};

class Engine;

// One live sandbox, from clone3 until it is reaped. Owns every resource of
// the run; the destructor kills the whole tree, reaps it, removes the cgroup
// leaf and frees the uid slot (commit-on-success: nothing leaks on any path).
class Sandbox {
 public:
  ~Sandbox();
  Sandbox(const Sandbox&) = delete;
  Sandbox& operator=(const Sandbox&) = delete;

  const std::string& run_id() const noexcept { return run_id_; }
  pid_t pid() const noexcept { return pid_; }
  int pidfd() const noexcept { return pidfd_.get(); }
  std::uint32_t host_uid() const noexcept { return host_uid_; }
  const Limits& limits() const noexcept { return limits_; }
  std::chrono::steady_clock::time_point started() const noexcept { return started_; }
  CgroupLeaf& cgroup() noexcept { return *leaf_; }

  // The parent's ends of the pipes; the supervisor takes them over.
  UniqueFd take_stdin() noexcept { return std::move(stdin_w_); }
  UniqueFd take_stdout() noexcept { return std::move(stdout_r_); }
  UniqueFd take_stderr() noexcept { return std::move(stderr_r_); }
  int report_fd() const noexcept { return report_r_.get(); }

  // SIGKILL the whole tree now (pid namespace and cgroup). Idempotent.
  void kill() noexcept;
  // Ask for a graceful stop: SIGTERM to init, which forwards it to the tool.
  void terminate() noexcept;
  // The caller (client gone, shutdown) wants the run stopped: kill, and
  // remember why, so the result says "cancelled".
  void cancel() noexcept;
  bool cancelled() const noexcept { return cancelled_; }

  // After the pidfd became readable: reap init (waitid) and return its raw
  // wait status. Safe to call once; later calls return the same status.
  Result<int> reap();
  // Remove the cgroup leaf now (after reap); the destructor does it otherwise.
  Status destroy_cgroup();

 private:
  friend class Engine;
  Sandbox() = default;

  std::string run_id_;
  pid_t pid_ = -1;
  UniqueFd pidfd_;
  bool reaped_ = false;
  int init_status_ = 0;
  bool cancelled_ = false;
  std::uint32_t host_uid_ = 0;
  Limits limits_;
  std::chrono::steady_clock::time_point started_;
  UniqueFd stdin_w_, stdout_r_, stderr_r_, report_r_;
  UniqueFd uid_slot_;  // an OFD lock on the slot's byte of the lock file
  std::unique_ptr<CgroupLeaf> leaf_;
};

class Engine {
 public:
  static Result<std::unique_ptr<Engine>> create(EngineConfig config);
  ~Engine();

  // Build the sandbox and start the tool. Returns once the child is in its
  // cgroup with its id maps; set-up errors inside the sandbox arrive later
  // on the report pipe and are turned into the result by supervise().
  Result<std::unique_ptr<Sandbox>> spawn(const RunSpec& spec);

  // Blocking: spawn, feed stdin, collect output, enforce limits, clean up.
  RunResult run(const RunSpec& spec);

  const EngineConfig& config() const noexcept { return config_; }
  Cgroups& cgroups() noexcept { return *cgroups_; }

 private:
  Engine() = default;
  Result<UniqueFd> lease_uid_slot(std::uint32_t* slot);

  EngineConfig config_;
  std::unique_ptr<Cgroups> cgroups_;
  std::string staging_root_;
  std::string slot_lock_path_;
  UniqueFd init_exe_;        // O_PATH
  UniqueFd init_filter_;     // sealed memfd
  cap_t empty_caps_ = nullptr;
  std::uint64_t seq_ = 0;
  std::string instance_;     // random tag in leaf names (see spawn)
  std::uint32_t next_slot_ = 0;
};

// A RunResult for a run that never started (spawn failed).
RunResult setup_failure_result(const Error& err);

}  // namespace tsb::isolate
