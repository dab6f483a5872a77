#include "daemon/spawner/spawn_thread.h"

#include <signal.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <system_error>
#include <utility>

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
  int failed = 0;
  try {
    t->thread_ = std::thread([p = t.get()] { p->serve(); });
  } catch (const std::system_error& e) {
    failed = e.code().value();
  }
  ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
  if (failed) return Error::from_errno(failed, "starting the spawn thread");
  return t;
}

SpawnThread::~SpawnThread() {
  std::unique_lock lock(mu_);
  stop_ = true;
  lock.unlock();
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void SpawnThread::submit(std::uint64_t tag, isolate::RunSpec spec) {
  std::unique_lock lock(mu_);
  job_.emplace(tag, std::move(spec));
  busy_ = true;
  lock.unlock();
  cv_.notify_one();
}

std::optional<SpawnThread::Done> SpawnThread::take() {
  std::uint64_t n;
  [[maybe_unused]] const ssize_t got = ::read(wake_.get(), &n, sizeof n);  // back to 0; done_ says what is done
  std::lock_guard lock(mu_);
  std::optional<Done> d = std::exchange(done_, std::nullopt);
  busy_ = busy_ && !d;
  return d;
}

void SpawnThread::serve() {
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return stop_ || job_; });
    if (stop_) return;
    auto [tag, spec] = std::move(*std::exchange(job_, std::nullopt));
    lock.unlock();
    auto made = engine_.spawn(spec);
    lock.lock();
    done_.emplace(Done{tag, std::move(made)});
    const std::uint64_t one = 1;
    // Cannot fail: the loop reads the counter back to 0 at every take.
    [[maybe_unused]] const ssize_t put = ::write(wake_.get(), &one, sizeof one);
  }
}

}  // namespace tsb::spawn
