// Helpers for the child path only: allocation-free, async-signal-safe.
#pragma once

#include <errno.h>
#include <signal.h>
#include <unistd.h>

#include "isolate/stage.h"

namespace tsb::isolate::child {

// write(2) all of a small buffer, retrying on EINTR only.
inline bool write_all(int fd, const void* buf, unsigned long len) noexcept {
  const char* p = static_cast<const char*>(buf);
  while (len > 0) {
    ssize_t n = ::write(fd, p, len);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += n;
    len -= static_cast<unsigned long>(n);
  }
  return true;
}

// Every signal back to its default action and nothing blocked: the engine's
// own dispositions (SIGPIPE ignored, handlers) must not reach the sandbox.
inline void reset_signals() noexcept {
  struct sigaction sa {};
  sa.sa_handler = SIG_DFL;
  sigemptyset(&sa.sa_mask);
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sig == SIGKILL || sig == SIGSTOP) continue;
    (void)::sigaction(sig, &sa, nullptr);  // EINVAL for glibc-reserved signals: harmless
  }
  sigset_t none;
  sigemptyset(&none);
  (void)::sigprocmask(SIG_SETMASK, &none, nullptr);
}

}  // namespace tsb::isolate::child
