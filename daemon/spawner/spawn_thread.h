// The spawner's second thread, which makes warm sandboxes. A spawn blocks
// for milliseconds (clone3, the detached mounts; on cgroup v1 the move into
// the run's cgroup waits for an RCU grace period, 9-23 ms after a quiet
// moment): made on the poll loop, a refill held every run's Started and
// Ended behind it. Here the loop hands over a RunSpec and goes on; the
// eventfd wakes it when the sandbox (or why there is none) can be taken.
//
// One spawn at a time, of warm sandboxes only: a cold run's spawn is the
// run's own start and stays on the loop. The thread takes no message, no
// descriptor of the front end and no policy: only the RunSpec, which owns
// what it names. Every signal is blocked on it. The children it makes have
// their death signal tied to it (PR_SET_PDEATHSIG follows the thread that
// cloned): it lives as long as the spawner's loop, whose end ends them all.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "isolate/base/result.h"
#include "isolate/base/unique_fd.h"
#include "isolate/engine/engine.h"

namespace tsb::spawn {

class SpawnThread {
 public:
  struct Done {
    std::uint64_t tag = 0;  // the caller's, from submit
    Result<std::unique_ptr<isolate::Sandbox>> sandbox;
  };

  // The thread, with every signal blocked; the engine outlives it.
  static Result<std::unique_ptr<SpawnThread>> start(isolate::Engine& engine);
  // Waits for a spawn under way; a sandbox not taken is destroyed (killed,
  // its clean-up left to the engine).
  ~SpawnThread();
  SpawnThread(const SpawnThread&) = delete;
  SpawnThread& operator=(const SpawnThread&) = delete;

  int fd() const noexcept { return wake_.get(); }  // readable: take() has a result
  bool busy() const noexcept { return busy_; }     // submitted and not yet taken (the loop's view)
  // Only when not busy.
  void submit(std::uint64_t tag, isolate::RunSpec spec);
  // The finished spawn, if there is one.
  std::optional<Done> take();

 private:
  SpawnThread(isolate::Engine& engine, UniqueFd wake) : engine_(engine), wake_(std::move(wake)) {}
  void serve();

  isolate::Engine& engine_;
  UniqueFd wake_;      // eventfd
  bool busy_ = false;  // the loop's thread only
  std::mutex mu_;      // guards what follows
  std::condition_variable cv_;
  bool stop_ = false;
  std::optional<std::pair<std::uint64_t, isolate::RunSpec>> job_;
  std::optional<Done> done_;
  std::thread thread_;
};

}  // namespace tsb::spawn
