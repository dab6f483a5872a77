#include "daemon/spawner/spawn_thread.h"

#include <signal.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <system_error>

namespace tsb::spawn {

Result<std::unique_ptr<SpawnThread>> SpawnThread::start(isolate::Engine& engine) {
  UniqueFd wake(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake) return Error::from_errno("eventfd (the spawn thread)");
  std::unique_ptr<SpawnThread> t(new SpawnThread(engine, std::move(wake)));
  // Created with every signal blocked, which it keeps: the loop's signalfd
  // takes them all.
  sigset_t all, old;
  sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &old);
  std::error_code failed;
  try {
    t->thread_ = std::thread([p = t.get()] { p->serve(); });
  } catch (const std::system_error& e) {
    failed = e.code();
  }
  ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
  if (failed) return Error::from_errno(failed.value(), "starting the spawn thread");
  return t;
}

SpawnThread::~SpawnThread() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void SpawnThread::submit(std::uint64_t tag, isolate::RunSpec spec) {
  {
    std::lock_guard lock(mu_);
    job_.emplace(tag, std::move(spec));
  }
  busy_ = true;
  cv_.notify_one();
}

std::optional<SpawnThread::Done> SpawnThread::take() {
  std::uint64_t n;
  if (::read(wake_.get(), &n, sizeof n) < 0) {
    // EAGAIN: nothing was signalled (a spurious wake); done_ says
  }
  std::lock_guard lock(mu_);
  std::optional<Done> d = std::move(done_);
  done_.reset();
  if (d) busy_ = false;
  return d;
}

void SpawnThread::serve() {
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return stop_ || job_; });
    if (stop_) return;
    auto [tag, spec] = std::move(*job_);
    job_.reset();
    lock.unlock();
    auto made = engine_.spawn(spec);
    lock.lock();
    done_.emplace(Done{tag, std::move(made)});
    const std::uint64_t one = 1;
    if (::write(wake_.get(), &one, sizeof one) < 0) {
      // Cannot fail: the loop reads the counter back to 0 at every take.
    }
  }
}

}  // namespace tsb::spawn
