// Helpers for the child path only: allocation-free, async-signal-safe.
#pragma once

#include <errno.h>
#include <signal.h>
#include <sys/syscall.h>
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

// The id switch as raw system calls. glibc's setresuid/setresgid change the
// ids of every thread of the process ("setxid" broadcast): they signal the
// threads glibc knows of and wait for each on a futex. A clone3 child has
// one thread, but glibc's list is the parent's: with any other thread in
// the engine (a resolver thread of libcurl, say), the child waited forever.
// The kernel calls change the calling thread, which is all there is.
inline int set_resuid(uid_t r, uid_t e, uid_t s) noexcept { return static_cast<int>(::syscall(SYS_setresuid, r, e, s)); }
inline int set_resgid(gid_t r, gid_t e, gid_t s) noexcept { return static_cast<int>(::syscall(SYS_setresgid, r, e, s)); }

// Decimal text of v into buf (at least 21 bytes), NUL-terminated.
inline void format_unsigned(char* buf, unsigned long v) noexcept {
  char digits[24];
  int n = 0;
  do digits[n++] = static_cast<char>('0' + v % 10);
  while ((v /= 10) != 0 && n < 20);
  for (int i = 0; i < n; ++i) buf[i] = digits[n - 1 - i];
  buf[n] = '\0';
}

// Every signal back to its default action and nothing blocked: the engine's
// own dispositions (SIGPIPE ignored, handlers) must not reach the sandbox.
// Called with every signal still blocked (the engine blocks them across
// clone3): each disposition is first set to "ignore", which discards any
// instance already pending (one sent to the engine's process group in the
// moment after clone3, say), then to the default.
inline void reset_signals() noexcept {
  struct sigaction ign {}, dfl {};
  ign.sa_handler = SIG_IGN;
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&ign.sa_mask);
  sigemptyset(&dfl.sa_mask);
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sig == SIGKILL || sig == SIGSTOP) continue;
    // EINVAL for glibc-reserved signals: harmless.
    (void)::sigaction(sig, &ign, nullptr);
    (void)::sigaction(sig, &dfl, nullptr);
  }
  sigset_t none;
  sigemptyset(&none);
  (void)::sigprocmask(SIG_SETMASK, &none, nullptr);
}

}  // namespace tsb::isolate::child
