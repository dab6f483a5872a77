/*
 * tsb-seccomp-table: asks the sandbox's seccomp filter one question per line
 * of a table, from inside the sandbox, and prints its answer to each.
 *
 *   tsb-seccomp-table TABLE
 *
 * TABLE has one case per line: "ID NR A0 A1 A2 A3 A4 A5", the id a decimal
 * number, the syscall number and its six arguments in hexadecimal
 * (tests/integration/seccomp_table_test.cc writes it from the compiled
 * default profile). For each case the program prints one line:
 *
 *   ID allow         the filter let the call through to the kernel
 *   ID errno N       the filter answered with errno N
 *   ID mismatch      the call reached the kernel with other arguments
 *
 * then "done COUNT". Any other failure prints one "error ..." line and exits
 * with status 1; a malformed table exits with status 2.
 *
 * How a call is seen to pass the filter without running it: a second thread
 * (the "caller") stacks a filter of its own that answers every syscall with
 * SECCOMP_RET_USER_NOTIF, and this thread (the "listener") receives the
 * notification and answers with errno 4000, which no filter uses. The kernel
 * runs every filter of the caller and keeps the action of the highest
 * precedence (seccomp(2)): the sandbox's ERRNO wins over USER_NOTIF, which
 * wins over its ALLOW. So a call the sandbox's filter refuses returns that
 * filter's errno, exactly, and a call it allows reaches the listener with its
 * number and arguments, and never runs. Nothing is executed for real: exit,
 * execve, fork, pause, blocking reads and calls with garbage pointers are all
 * asked the same harmless way. Only the caller carries the extra filter (no
 * SECCOMP_FILTER_FLAG_TSYNC); the listener keeps the sandbox's filter alone.
 *
 * Static, glibc only; output through write(2).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

/* The answer the listener gives to a call that reached it: above every errno
 * the kernel defines, below MAX_ERRNO (4095). */
#define REACHED_ERRNO 4000

struct probe_case {
  unsigned long id;
  long nr;
  uint64_t args[6];
  long ret;
  int err;
  int reached;   /* the listener saw it */
  int mismatch;  /* the listener saw other arguments */
};

static struct probe_case* cases;
static size_t ncases;
/* Which case the caller is in; ncases once it is done. */
static volatile size_t current;
static volatile int listener_fd = -1;
static volatile int caller_errno;

static void out(const char* s, size_t n) {
  while (n > 0) {
    ssize_t w = write(1, s, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) _exit(1);
    s += w;
    n -= (size_t)w;
  }
}

static void line(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
static void line(const char* fmt, ...) {
  char buf[256];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf, sizeof buf - 1, fmt, ap);
  va_end(ap);
  if (n < 0) n = 0;
  if ((size_t)n > sizeof buf - 2) n = sizeof buf - 2;
  buf[n++] = '\n';
  out(buf, (size_t)n);
}

static char* slurp(const char* path, size_t* len) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return NULL;
  size_t cap = 1 << 16, n = 0;
  char* buf = malloc(cap + 1);
  for (;;) {
    if (buf == NULL) return NULL;
    if (n == cap) {
      cap *= 2;
      buf = realloc(buf, cap + 1);
      continue;
    }
    ssize_t r = read(fd, buf + n, cap - n);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      free(buf);
      close(fd);
      return NULL;
    }
    if (r == 0) break;
    n += (size_t)r;
  }
  close(fd);
  buf[n] = '\0';
  *len = n;
  return buf;
}

static int parse_table(char* text) {
  size_t cap = 1024;
  cases = calloc(cap, sizeof *cases);
  for (char* save = NULL, *l = strtok_r(text, "\n", &save); l != NULL; l = strtok_r(NULL, "\n", &save)) {
    if (cases == NULL) return -1;
    if (ncases == cap) {
      cap *= 2;
      cases = realloc(cases, cap * sizeof *cases);
      if (cases == NULL) return -1;
    }
    struct probe_case* c = &cases[ncases];
    memset(c, 0, sizeof *c);
    unsigned long long a[6], nr;
    int used = 0;
    if (sscanf(l, "%lu %llx %llx %llx %llx %llx %llx %llx%n", &c->id, &nr, &a[0], &a[1], &a[2], &a[3], &a[4],
               &a[5], &used) != 8 ||
        l[used] != '\0')
      return -1;
    c->nr = (long)nr;
    for (int i = 0; i < 6; i++) c->args[i] = a[i];
    ncases++;
  }
  return 0;
}

/* The caller: stack the notifying filter on this thread only, then make
 * every call of the table. Between them it makes no syscall at all (syscall()
 * sets errno in thread-local storage), so every notification is a case. */
static void* caller(void* unused) {
  (void)unused;
  struct sock_filter insns[] = {BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_USER_NOTIF)};
  struct sock_fprog prog = {.len = 1, .filter = insns};
  long fd = syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_NEW_LISTENER, &prog);
  if (fd < 0) {
    caller_errno = errno;
    __atomic_store_n(&listener_fd, -2, __ATOMIC_SEQ_CST);
    return NULL;
  }
  __atomic_store_n(&listener_fd, (int)fd, __ATOMIC_SEQ_CST);
  for (size_t i = 0; i < ncases; i++) {
    struct probe_case* c = &cases[i];
    __atomic_store_n(&current, i, __ATOMIC_SEQ_CST);
    errno = 0;
    c->ret = syscall(c->nr, c->args[0], c->args[1], c->args[2], c->args[3], c->args[4], c->args[5]);
    c->err = errno;
  }
  /* The end: one more notified call, which the listener does not answer. */
  __atomic_store_n(&current, ncases, __ATOMIC_SEQ_CST);
  syscall(SYS_getppid);
  return NULL;
}

int main(int argc, char** argv) {
  if (argc != 2) {
    line("error usage: tsb-seccomp-table TABLE");
    return 2;
  }
  size_t len = 0;
  char* text = slurp(argv[1], &len);
  if (text == NULL) {
    line("error cannot read the table: errno %d", errno);
    return 1;
  }
  if (parse_table(text) != 0) {
    line("error malformed table line %zu", ncases + 1);
    return 2;
  }

  pthread_t t;
  int rc = pthread_create(&t, NULL, caller, NULL);
  if (rc != 0) {
    line("error pthread_create: errno %d", rc);
    return 1;
  }
  int fd;
  while ((fd = __atomic_load_n(&listener_fd, __ATOMIC_SEQ_CST)) == -1) sched_yield();
  if (fd == -2) {
    line("error seccomp(SECCOMP_FILTER_FLAG_NEW_LISTENER): errno %d", caller_errno);
    return 1;
  }

  for (;;) {
    struct seccomp_notif req;
    struct seccomp_notif_resp resp;
    memset(&req, 0, sizeof req);
    if (ioctl(fd, SECCOMP_IOCTL_NOTIF_RECV, &req) != 0) {
      if (errno == EINTR) continue;
      line("error SECCOMP_IOCTL_NOTIF_RECV: errno %d", errno);
      return 1;
    }
    size_t i = __atomic_load_n(&current, __ATOMIC_SEQ_CST);
    if (i >= ncases) break;  /* the caller's end mark; it stays blocked */
    struct probe_case* c = &cases[i];
    c->reached = 1;
    c->mismatch = req.data.nr != c->nr || memcmp(req.data.args, c->args, sizeof c->args) != 0;
    memset(&resp, 0, sizeof resp);
    resp.id = req.id;
    resp.error = -REACHED_ERRNO;
    if (ioctl(fd, SECCOMP_IOCTL_NOTIF_SEND, &resp) != 0) {
      line("error SECCOMP_IOCTL_NOTIF_SEND: errno %d", errno);
      return 1;
    }
  }

  for (size_t i = 0; i < ncases; i++) {
    const struct probe_case* c = &cases[i];
    if (c->reached && c->mismatch)
      line("%lu mismatch", c->id);
    else if (c->reached && c->ret == -1 && c->err == REACHED_ERRNO)
      line("%lu allow", c->id);
    else if (!c->reached && c->ret == -1)
      line("%lu errno %d", c->id, c->err);
    else
      line("%lu error ret %ld errno %d reached %d", c->id, c->ret, c->err, c->reached);
  }
  line("done %zu", ncases);
  /* The caller is still blocked in its end mark: leave with every thread. */
  syscall(SYS_exit_group, 0);
  return 0;
}
