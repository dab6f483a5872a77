/*
 * tsb-probe: answers questions from inside a sandbox.
 *
 *   tsb-probe QUERY [ARGS]... [QUERY [ARGS]...]...
 *
 * Each query prints exactly one JSON object on its own line, always with a
 * "query" member; failures are reported as members ("errno", "errname",
 * "error"), never by crashing. Exceptions, all deliberate: mem-hog prints a
 * "progress":true line per MiB before its final line (the last progress line
 * is what survives an OOM kill); flood writes its BYTES of 'x' and a newline
 * before its line; spin prints when it starts and never ends. fork-bomb and
 * daemonize leave processes behind for the caller's teardown to collect.
 *
 * The program is static, uses only glibc and never uses stdio for output:
 * every line is built in memory and written with write(2), so nothing is
 * buffered twice across fork() (fork-bomb, daemonize, try-syscall).
 *
 * Exit status: 0 when every query ran (whatever it found), 2 on a usage
 * error (unknown query, missing or malformed argument).
 *
 * Run `tsb-probe help` for the list of queries.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/personality.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/types.h>
#include <sys/un.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#ifndef AF_ALG
#define AF_ALG 38
#endif
#ifndef AF_VSOCK
#define AF_VSOCK 40
#endif
#ifndef NETLINK_ROUTE
#define NETLINK_ROUTE 0
#endif
#ifndef UFFD_USER_MODE_ONLY
#define UFFD_USER_MODE_ONLY 1
#endif
#ifndef READ_IMPLIES_EXEC
#define READ_IMPLIES_EXEC 0x0400000
#endif
#ifndef PR_GET_SECUREBITS
#define PR_GET_SECUREBITS 27
#endif
#ifndef CLONE_NEWCGROUP
#define CLONE_NEWCGROUP 0x02000000
#endif
#define X32_SYSCALL_BIT 0x40000000L

/* A pointer the kernel will refuse to dereference: page 0 is never mapped. */
#define BAD_PTR ((void *)1)

static int g_usage_errors;

/* ------------------------------------------------------------------------ */
/* Output: one JSON object per line, built in a growable buffer.            */

static char g_static_buf[1 << 16];
static char *g_buf = g_static_buf;
static size_t g_len, g_cap = sizeof(g_static_buf);
static bool g_truncated;
/* has_items[d] tells whether the container at depth d already has a member,
 * so the next one needs a comma. */
static bool g_has_items[64];
static int g_depth;

static void buf_put(const char *s, size_t n) {
  if (g_len + n + 2 > g_cap) {
    /* Keep two bytes for the closing "}\n" of a truncated line. */
    size_t want = g_cap;
    while (g_len + n + 2 > want) want *= 2;
    char *nb = (g_buf == g_static_buf) ? malloc(want) : realloc(g_buf, want);
    if (nb == NULL) {
      g_truncated = true;
      return;
    }
    if (g_buf == g_static_buf) memcpy(nb, g_static_buf, g_len);
    g_buf = nb;
    g_cap = want;
  }
  memcpy(g_buf + g_len, s, n);
  g_len += n;
}

static void buf_puts(const char *s) { buf_put(s, strlen(s)); }

static void buf_printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void buf_printf(const char *fmt, ...) {
  char tmp[256];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
  va_end(ap);
  if (n < 0) return;
  if ((size_t)n >= sizeof(tmp)) n = (int)sizeof(tmp) - 1;
  buf_put(tmp, (size_t)n);
}

/* Length of the valid UTF-8 sequence at s (at most n bytes), 0 if invalid. */
static size_t utf8_seq_len(const unsigned char *s, size_t n) {
  unsigned char c = s[0];
  size_t len;
  uint32_t cp;
  if (c >= 0xc2 && c <= 0xdf) { len = 2; cp = c & 0x1f; }
  else if (c >= 0xe0 && c <= 0xef) { len = 3; cp = c & 0x0f; }
  else if (c >= 0xf0 && c <= 0xf4) { len = 4; cp = c & 0x07; }
  else return 0;
  if (n < len) return 0;
  for (size_t i = 1; i < len; i++) {
    if ((s[i] & 0xc0) != 0x80) return 0;
    cp = (cp << 6) | (s[i] & 0x3f);
  }
  if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10ffff))) return 0;
  if (cp >= 0xd800 && cp <= 0xdfff) return 0;
  return len;
}

/* JSON string escaping. Valid UTF-8 passes through; control characters and
 * bytes that are not valid UTF-8 are written as \u00XX (so an invalid byte
 * 0xNN reads back as U+00NN). The output is always valid JSON. */
static void buf_json_string(const char *s, size_t n) {
  buf_put("\"", 1);
  const unsigned char *p = (const unsigned char *)s;
  size_t i = 0;
  while (i < n) {
    unsigned char c = p[i];
    if (c == '"') { buf_put("\\\"", 2); i++; }
    else if (c == '\\') { buf_put("\\\\", 2); i++; }
    else if (c == '\n') { buf_put("\\n", 2); i++; }
    else if (c == '\t') { buf_put("\\t", 2); i++; }
    else if (c == '\r') { buf_put("\\r", 2); i++; }
    else if (c < 0x20 || c == 0x7f) { buf_printf("\\u%04x", c); i++; }
    else if (c < 0x80) { buf_put((const char *)&p[i], 1); i++; }
    else {
      size_t l = utf8_seq_len(p + i, n - i);
      if (l == 0) { buf_printf("\\u%04x", c); i++; }
      else { buf_put((const char *)&p[i], l); i += l; }
    }
  }
  buf_put("\"", 1);
}

static void j_sep(const char *key) {
  if (g_has_items[g_depth]) buf_put(",", 1);
  g_has_items[g_depth] = true;
  if (key != NULL) {
    buf_json_string(key, strlen(key));
    buf_put(":", 1);
  }
}

static void j_push(const char *key, const char *open) {
  j_sep(key);
  buf_puts(open);
  if (g_depth < (int)(sizeof(g_has_items) / sizeof(g_has_items[0])) - 1) g_depth++;
  g_has_items[g_depth] = false;
}

static void j_pop(const char *close) {
  buf_puts(close);
  if (g_depth > 0) g_depth--;
}

static void j_obj(const char *key) { j_push(key, "{"); }
static void j_obj_end(void) { j_pop("}"); }
static void j_arr(const char *key) { j_push(key, "["); }
static void j_arr_end(void) { j_pop("]"); }

static void j_strn(const char *key, const char *v, size_t n) {
  j_sep(key);
  buf_json_string(v, n);
}
static void j_str(const char *key, const char *v) {
  if (v == NULL) {
    j_sep(key);
    buf_puts("null");
  } else {
    j_strn(key, v, strlen(v));
  }
}
static void j_int(const char *key, long long v) {
  j_sep(key);
  buf_printf("%lld", v);
}
static void j_uint(const char *key, unsigned long long v) {
  j_sep(key);
  buf_printf("%llu", v);
}
static void j_bool(const char *key, bool v) {
  j_sep(key);
  buf_puts(v ? "true" : "false");
}

/* Symbolic errno name ("EPERM"); NULL (JSON null) for 0. */
static const char *errname(int e) {
  static char tmp[32];
  if (e == 0) return NULL;
  const char *n = strerrorname_np(e);
  if (n != NULL) return n;
  snprintf(tmp, sizeof(tmp), "E%d", e);
  return tmp;
}

static const char *signame(int s) {
  static char tmp[32];
  const char *n = sigabbrev_np(s);
  if (n != NULL) snprintf(tmp, sizeof(tmp), "SIG%s", n);
  else snprintf(tmp, sizeof(tmp), "SIG%d", s);
  return tmp;
}

/* "errno":N,"errname":"ENAME" with an optional prefix ("open_errno"). */
static void j_errno_p(const char *prefix, int e) {
  char k1[64], k2[64];
  snprintf(k1, sizeof(k1), "%serrno", prefix);
  snprintf(k2, sizeof(k2), "%serrname", prefix);
  j_int(k1, e);
  j_str(k2, errname(e));
}
static void j_errno(int e) { j_errno_p("", e); }

static void write_all(int fd, const char *p, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return;
    }
    p += w;
    n -= (size_t)w;
  }
}

static void j_begin(const char *query) {
  g_len = 0;
  g_depth = 0;
  g_truncated = false;
  g_has_items[0] = false;
  buf_put("{", 1);
  j_str("query", query);
}

static void j_end(void) {
  if (g_truncated) {
    /* The line could not grow: say so instead of printing broken JSON. */
    static const char msg[] = "{\"error\":\"output line too large\"}\n";
    write_all(STDOUT_FILENO, msg, sizeof(msg) - 1);
    return;
  }
  buf_put("}\n", 2);
  write_all(STDOUT_FILENO, g_buf, g_len);
}

/* ------------------------------------------------------------------------ */
/* Small utilities.                                                          */

/* Reads up to cap-1 bytes of a file into buf (NUL-terminated). Returns the
 * byte count, or -errno. */
static ssize_t read_file(const char *path, char *buf, size_t cap) {
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) return -errno;
  size_t len = 0;
  while (len + 1 < cap) {
    ssize_t r = read(fd, buf + len, cap - 1 - len);
    if (r < 0) {
      if (errno == EINTR) continue;
      int e = errno;
      close(fd);
      return -e;
    }
    if (r == 0) break;
    len += (size_t)r;
  }
  close(fd);
  buf[len] = '\0';
  return (ssize_t)len;
}

/* Value of "Key:" in /proc/self/status (trimmed), or NULL. */
static const char *status_field(const char *status, const char *key, char *out, size_t cap) {
  size_t kl = strlen(key);
  const char *p = status;
  while (p != NULL && *p != '\0') {
    if (strncmp(p, key, kl) == 0 && p[kl] == ':') {
      const char *v = p + kl + 1;
      while (*v == ' ' || *v == '\t') v++;
      size_t n = strcspn(v, "\n");
      if (n >= cap) n = cap - 1;
      memcpy(out, v, n);
      out[n] = '\0';
      return out;
    }
    p = strchr(p, '\n');
    if (p != NULL) p++;
  }
  return NULL;
}

static bool parse_ull(const char *s, unsigned long long *out) {
  if (s == NULL || *s == '\0' || *s == '-') return false;
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 0);
  if (errno != 0 || end == s) return false;
  unsigned long long mul = 1;
  if (*end != '\0') {
    switch (*end) {
      case 'k': case 'K': mul = 1ull << 10; break;
      case 'm': case 'M': mul = 1ull << 20; break;
      case 'g': case 'G': mul = 1ull << 30; break;
      case 't': case 'T': mul = 1ull << 40; break;
      default: return false;
    }
    end++;
    if (*end == 'i' || *end == 'I') end++;
    if (*end == 'b' || *end == 'B') end++;
    if (*end != '\0') return false;
  }
  if (v != 0 && mul > ULLONG_MAX / v) return false;
  *out = v * mul;
  return true;
}

static void usage_error(const char *query, const char *msg) {
  j_begin(query);
  j_str("error", msg);
  j_end();
  g_usage_errors++;
}

static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ------------------------------------------------------------------------ */
/* Posture queries.                                                          */

static char g_status[16384];

static bool load_status(void) {
  ssize_t n = read_file("/proc/self/status", g_status, sizeof(g_status));
  if (n < 0) {
    j_str("error", "cannot read /proc/self/status");
    j_errno((int)-n);
    return false;
  }
  return true;
}

static void q_caps(void) {
  static const char *const keys[] = {"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"};
  j_begin("caps");
  if (load_status()) {
    char v[64];
    for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
      j_str(keys[i], status_field(g_status, keys[i], v, sizeof(v)));
  }
  j_end();
}

static void id_map(const char *key, const char *path) {
  char buf[8192];
  ssize_t n = read_file(path, buf, sizeof(buf));
  if (n < 0) {
    char k[64];
    snprintf(k, sizeof(k), "%s_", key);
    j_sep(key);
    buf_puts("null");
    j_errno_p(k, (int)-n);
    return;
  }
  j_arr(key);
  char *save = NULL;
  for (char *line = strtok_r(buf, "\n", &save); line != NULL; line = strtok_r(NULL, "\n", &save)) {
    unsigned long long a, b, c;
    if (sscanf(line, "%llu %llu %llu", &a, &b, &c) == 3) {
      j_arr(NULL);
      j_uint(NULL, a);
      j_uint(NULL, b);
      j_uint(NULL, c);
      j_arr_end();
    }
  }
  j_arr_end();
}

static void q_ids(void) {
  uid_t ru, eu, su;
  gid_t rg, eg, sg;
  j_begin("ids");
  if (getresuid(&ru, &eu, &su) == 0) {
    j_obj("uid");
    j_uint("real", ru);
    j_uint("effective", eu);
    j_uint("saved", su);
    j_obj_end();
  }
  if (getresgid(&rg, &eg, &sg) == 0) {
    j_obj("gid");
    j_uint("real", rg);
    j_uint("effective", eg);
    j_uint("saved", sg);
    j_obj_end();
  }
  gid_t groups[4096];
  int ng = getgroups((int)(sizeof(groups) / sizeof(groups[0])), groups);
  if (ng < 0) {
    j_errno_p("groups_", errno);
  } else {
    j_arr("groups");
    for (int i = 0; i < ng; i++) j_uint(NULL, groups[i]);
    j_arr_end();
  }
  id_map("uid_map", "/proc/self/uid_map");
  id_map("gid_map", "/proc/self/gid_map");
  char sg_buf[64];
  ssize_t n = read_file("/proc/self/setgroups", sg_buf, sizeof(sg_buf));
  if (n >= 0) {
    sg_buf[strcspn(sg_buf, "\n")] = '\0';
    j_str("setgroups", sg_buf);
  }
  j_end();
}

static void q_nnp(void) {
  j_begin("nnp");
  int r = prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0);
  if (r < 0) j_errno(errno);
  else j_int("prctl", r);
  if (load_status()) {
    char v[32];
    const char *s = status_field(g_status, "NoNewPrivs", v, sizeof(v));
    if (s != NULL) j_int("NoNewPrivs", atoi(s));
    else j_str("NoNewPrivs", NULL);
  }
  j_end();
}

static void q_seccomp_mode(void) {
  static const char *const modes[] = {"disabled", "strict", "filter"};
  j_begin("seccomp-mode");
  if (load_status()) {
    char v[32];
    const char *s = status_field(g_status, "Seccomp", v, sizeof(v));
    if (s != NULL) {
      int m = atoi(s);
      j_int("Seccomp", m);
      j_str("mode", (m >= 0 && m <= 2) ? modes[m] : "unknown");
    } else {
      j_str("Seccomp", NULL);
    }
    s = status_field(g_status, "Seccomp_filters", v, sizeof(v));
    if (s != NULL) j_int("Seccomp_filters", atoi(s));
  }
  j_end();
}

static void q_securebits(void) {
  j_begin("securebits");
  int r = prctl(PR_GET_SECUREBITS, 0, 0, 0, 0);
  if (r < 0) {
    j_errno(errno);
  } else {
    char hex[32];
    snprintf(hex, sizeof(hex), "0x%x", (unsigned)r);
    j_int("securebits", r);
    j_str("hex", hex);
  }
  j_end();
}

static void q_fds(void) {
  j_begin("fds");
  DIR *d = opendir("/proc/self/fd");
  j_arr("fds");
  if (d != NULL) {
    int self = dirfd(d);
    struct dirent *de;
    /* Collect first: readdir order is not numeric. */
    int fds[4096];
    int n = 0;
    while ((de = readdir(d)) != NULL && n < (int)(sizeof(fds) / sizeof(fds[0]))) {
      if (de->d_name[0] == '.') continue;
      int fd = atoi(de->d_name);
      if (fd != self) fds[n++] = fd;
    }
    for (int i = 1; i < n; i++)
      for (int j = i; j > 0 && fds[j - 1] > fds[j]; j--) {
        int t = fds[j]; fds[j] = fds[j - 1]; fds[j - 1] = t;
      }
    for (int i = 0; i < n; i++) {
      char p[64], target[PATH_MAX];
      snprintf(p, sizeof(p), "/proc/self/fd/%d", fds[i]);
      ssize_t l = readlink(p, target, sizeof(target) - 1);
      int e = errno;
      j_obj(NULL);
      j_int("fd", fds[i]);
      if (l >= 0) j_strn("target", target, (size_t)l);
      else j_errno_p("readlink_", e);
      int fl = fcntl(fds[i], F_GETFD);
      if (fl >= 0) j_bool("cloexec", (fl & FD_CLOEXEC) != 0);
      j_obj_end();
    }
    j_arr_end();
    closedir(d);
    j_str("source", "/proc/self/fd");
  } else {
    /* No /proc: fall back to probing descriptors one by one. */
    int e = errno;
    for (int fd = 0; fd < 1024; fd++) {
      int fl = fcntl(fd, F_GETFD);
      if (fl < 0) continue;
      j_obj(NULL);
      j_int("fd", fd);
      j_bool("cloexec", (fl & FD_CLOEXEC) != 0);
      j_obj_end();
    }
    j_arr_end();
    j_str("source", "fcntl");
    j_errno_p("proc_", e);
  }
  j_end();
}

/* Undoes the octal escapes of /proc/self/mountinfo (\040 for a space, ...). */
static void unescape_octal(char *s) {
  char *w = s;
  for (char *r = s; *r != '\0'; r++) {
    if (r[0] == '\\' && r[1] >= '0' && r[1] <= '7' && r[2] >= '0' && r[2] <= '7' &&
        r[3] >= '0' && r[3] <= '7') {
      *w++ = (char)(((r[1] - '0') << 6) | ((r[2] - '0') << 3) | (r[3] - '0'));
      r += 3;
    } else {
      *w++ = *r;
    }
  }
  *w = '\0';
}

static bool has_option(const char *opts, const char *opt) {
  size_t ol = strlen(opt);
  for (const char *p = opts; p != NULL && *p != '\0';) {
    size_t l = strcspn(p, ",");
    if (l == ol && strncmp(p, opt, ol) == 0) return true;
    p += l;
    if (*p == ',') p++;
  }
  return false;
}

static void q_mounts(void) {
  j_begin("mounts");
  int fd = open("/proc/self/mountinfo", O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    j_str("error", "cannot open /proc/self/mountinfo");
    j_errno(errno);
    j_end();
    return;
  }
  /* mountinfo can be large; read it whole into a heap buffer. */
  size_t cap = 1 << 16, len = 0;
  char *all = malloc(cap);
  for (;;) {
    if (all == NULL) break;
    if (len + 4096 > cap) {
      char *n = realloc(all, cap * 2);
      if (n == NULL) break;
      all = n;
      cap *= 2;
    }
    ssize_t r = read(fd, all + len, cap - len - 1);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    len += (size_t)r;
  }
  close(fd);
  if (all == NULL) {
    j_str("error", "out of memory");
    j_end();
    return;
  }
  all[len] = '\0';
  j_arr("mounts");
  char *save = NULL;
  for (char *line = strtok_r(all, "\n", &save); line != NULL; line = strtok_r(NULL, "\n", &save)) {
    /* id parent maj:min root mountpoint options [optional...] - fstype source superopts */
    char *f[64];
    int nf = 0;
    char *s2 = NULL;
    for (char *tok = strtok_r(line, " ", &s2); tok != NULL && nf < 64; tok = strtok_r(NULL, " ", &s2))
      f[nf++] = tok;
    if (nf < 6) continue;
    char *fstype = NULL, *source = NULL, *super = NULL;
    for (int k = 6; k < nf; k++) {
      if (strcmp(f[k], "-") == 0) {
        if (k + 1 < nf) fstype = f[k + 1];
        if (k + 2 < nf) source = f[k + 2];
        if (k + 3 < nf) super = f[k + 3];
        break;
      }
    }
    unescape_octal(f[3]);
    unescape_octal(f[4]);
    if (source != NULL) unescape_octal(source);
    j_obj(NULL);
    j_str("target", f[4]);
    j_str("fstype", fstype);
    j_str("source", source);
    j_str("root", f[3]);
    j_str("options", f[5]);
    j_str("super", super);
    j_bool("ro", has_option(f[5], "ro"));
    j_bool("nosuid", has_option(f[5], "nosuid"));
    j_bool("nodev", has_option(f[5], "nodev"));
    j_bool("noexec", has_option(f[5], "noexec"));
    j_obj_end();
  }
  j_arr_end();
  free(all);
  j_end();
}

static void q_hostname(void) {
  j_begin("hostname");
  char h[256];
  if (gethostname(h, sizeof(h)) == 0) {
    h[sizeof(h) - 1] = '\0';
    j_str("hostname", h);
  } else {
    j_errno(errno);
  }
  struct utsname u;
  if (uname(&u) == 0) {
    j_str("nodename", u.nodename);
    j_str("domainname", u.domainname);
    j_str("release", u.release);
  }
  j_end();
}

static void q_pid(void) {
  j_begin("pid");
  j_int("pid", getpid());
  j_int("ppid", getppid());
  j_int("pgid", getpgid(0));
  j_int("sid", getsid(0));
  char buf[4096];
  ssize_t n = read_file("/proc/1/cmdline", buf, sizeof(buf));
  if (n < 0) {
    j_sep("init_cmdline");
    buf_puts("null");
    j_errno_p("init_cmdline_", (int)-n);
  } else {
    j_arr("init_cmdline");
    for (ssize_t off = 0; off < n;) {
      size_t l = strnlen(buf + off, (size_t)(n - off));
      j_strn(NULL, buf + off, l);
      off += (ssize_t)l + 1;
    }
    j_arr_end();
  }
  /* Which pids this process can see: outside pids must not show up. */
  DIR *d = opendir("/proc");
  if (d != NULL) {
    int count = 0;
    struct dirent *de;
    j_arr("visible_pids");
    while ((de = readdir(d)) != NULL) {
      char *end;
      long p = strtol(de->d_name, &end, 10);
      if (*end != '\0' || p <= 0) continue;
      if (count < 1000) j_int(NULL, p);
      count++;
    }
    j_arr_end();
    j_int("nr_visible_pids", count);
    closedir(d);
  }
  j_end();
}

static void q_netdevs(void) {
  j_begin("netdevs");
  char buf[16384];
  ssize_t n = read_file("/proc/net/dev", buf, sizeof(buf));
  if (n < 0) {
    j_errno((int)-n);
  } else {
    j_arr("netdevs");
    char *save = NULL;
    int lineno = 0;
    for (char *line = strtok_r(buf, "\n", &save); line != NULL; line = strtok_r(NULL, "\n", &save)) {
      if (++lineno <= 2) continue;  /* two header lines */
      char *colon = strchr(line, ':');
      if (colon == NULL) continue;
      *colon = '\0';
      while (*line == ' ') line++;
      j_str(NULL, line);
    }
    j_arr_end();
  }
  j_end();
}

static void q_cgroup(void) {
  j_begin("cgroup");
  char buf[8192];
  ssize_t n = read_file("/proc/self/cgroup", buf, sizeof(buf));
  if (n < 0) {
    j_errno((int)-n);
  } else {
    j_arr("cgroups");
    char *save = NULL;
    for (char *line = strtok_r(buf, "\n", &save); line != NULL; line = strtok_r(NULL, "\n", &save)) {
      char *c1 = strchr(line, ':');
      char *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
      if (c2 == NULL) continue;
      *c1 = '\0';
      *c2 = '\0';
      j_obj(NULL);
      j_int("hierarchy", atoi(line));
      j_str("controllers", c1 + 1);
      j_str("path", c2 + 1);
      j_obj_end();
    }
    j_arr_end();
  }
  j_end();
}

static void j_rlim(const char *key, rlim_t v) {
  if (v == RLIM_INFINITY) j_str(key, "unlimited");
  else j_uint(key, (unsigned long long)v);
}

static void q_rlimits(void) {
  static const struct { const char *name; int res; } lims[] = {
      {"AS", RLIMIT_AS},         {"CORE", RLIMIT_CORE},
      {"CPU", RLIMIT_CPU},       {"DATA", RLIMIT_DATA},
      {"FSIZE", RLIMIT_FSIZE},   {"LOCKS", RLIMIT_LOCKS},
      {"MEMLOCK", RLIMIT_MEMLOCK}, {"MSGQUEUE", RLIMIT_MSGQUEUE},
      {"NICE", RLIMIT_NICE},     {"NOFILE", RLIMIT_NOFILE},
      {"NPROC", RLIMIT_NPROC},   {"RSS", RLIMIT_RSS},
      {"RTPRIO", RLIMIT_RTPRIO}, {"RTTIME", RLIMIT_RTTIME},
      {"SIGPENDING", RLIMIT_SIGPENDING}, {"STACK", RLIMIT_STACK},
  };
  j_begin("rlimits");
  for (size_t i = 0; i < sizeof(lims) / sizeof(lims[0]); i++) {
    struct rlimit rl;
    j_obj(lims[i].name);
    if (getrlimit((__rlimit_resource_t)lims[i].res, &rl) == 0) {
      j_rlim("soft", rl.rlim_cur);
      j_rlim("hard", rl.rlim_max);
    } else {
      j_errno(errno);
    }
    j_obj_end();
  }
  j_end();
}

static void q_getenv(void) {
  extern char **environ;
  j_begin("getenv");
  j_arr("env");
  for (char **e = environ; e != NULL && *e != NULL; e++) j_str(NULL, *e);
  j_arr_end();
  j_end();
}

static void q_cwd(void) {
  j_begin("cwd");
  char buf[PATH_MAX];
  if (getcwd(buf, sizeof(buf)) != NULL) j_str("cwd", buf);
  else j_errno(errno);
  j_end();
}

/* ------------------------------------------------------------------------ */
/* File system queries.                                                      */

static void q_readfile(const char *path, const char *max_arg) {
  unsigned long long max = 256;
  if (max_arg != NULL && !parse_ull(max_arg, &max)) max = 256;
  if (max > 65536) max = 65536;
  j_begin("readfile");
  j_str("path", path);
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0) {
    j_bool("ok", false);
    j_errno(errno);
    j_end();
    return;
  }
  static char data[65536];
  ssize_t r;
  do {
    r = read(fd, data, (size_t)max);
  } while (r < 0 && errno == EINTR);
  int e = errno;
  close(fd);
  if (r < 0) {
    j_bool("ok", false);
    j_str("stage", "read");
    j_errno(e);
  } else {
    j_bool("ok", true);
    j_int("bytes", r);
    j_strn("data", data, (size_t)r);
  }
  j_end();
}

static void q_writefile(const char *path, const char *content) {
  if (content == NULL) content = "tsb-probe\n";
  /* SIGXFSZ would kill the probe at RLIMIT_FSIZE; we want EFBIG instead. */
  signal(SIGXFSZ, SIG_IGN);
  j_begin("writefile");
  j_str("path", path);
  /* Create if absent; otherwise append, so an unexpectedly writable file is
   * never truncated. */
  bool created = true;
  int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOCTTY, 0644);
  if (fd < 0 && errno == EEXIST) {
    created = false;
    fd = open(path, O_WRONLY | O_APPEND | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  }
  if (fd < 0) {
    j_bool("ok", false);
    j_str("stage", "open");
    j_errno(errno);
    j_end();
    return;
  }
  j_bool("created", created);
  ssize_t w;
  do {
    w = write(fd, content, strlen(content));
  } while (w < 0 && errno == EINTR);
  int e = errno;
  close(fd);
  if (w < 0) {
    j_bool("ok", false);
    j_str("stage", "write");
    j_errno(e);
  } else {
    j_bool("ok", true);
    j_int("bytes", w);
  }
  j_end();
}

static const char *file_type(mode_t m) {
  if (S_ISREG(m)) return "file";
  if (S_ISDIR(m)) return "dir";
  if (S_ISLNK(m)) return "symlink";
  if (S_ISCHR(m)) return "chr";
  if (S_ISBLK(m)) return "blk";
  if (S_ISFIFO(m)) return "fifo";
  if (S_ISSOCK(m)) return "sock";
  return "unknown";
}

static void q_stat(const char *path) {
  j_begin("stat");
  j_str("path", path);
  struct stat st;
  struct stat lst;
  if (lstat(path, &lst) != 0) {
    j_bool("ok", false);
    j_errno(errno);
    j_end();
    return;
  }
  if (S_ISLNK(lst.st_mode)) {
    char t[PATH_MAX];
    ssize_t l = readlink(path, t, sizeof(t) - 1);
    j_bool("symlink", true);
    if (l >= 0) j_strn("link_target", t, (size_t)l);
  } else {
    j_bool("symlink", false);
  }
  if (stat(path, &st) != 0) {
    j_bool("ok", false);
    j_errno(errno);
    j_end();
    return;
  }
  char mode[16], dev[32];
  snprintf(mode, sizeof(mode), "%04o", (unsigned)(st.st_mode & 07777));
  snprintf(dev, sizeof(dev), "%u:%u", major(st.st_dev), minor(st.st_dev));
  j_bool("ok", true);
  j_str("type", file_type(st.st_mode));
  j_str("mode", mode);
  j_uint("uid", st.st_uid);
  j_uint("gid", st.st_gid);
  j_int("size", (long long)st.st_size);
  j_uint("nlink", (unsigned long long)st.st_nlink);
  j_uint("ino", (unsigned long long)st.st_ino);
  j_str("dev", dev);
  if (S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode)) {
    char rdev[32];
    snprintf(rdev, sizeof(rdev), "%u:%u", major(st.st_rdev), minor(st.st_rdev));
    j_str("rdev", rdev);
  }
  struct statvfs sv;
  if (statvfs(path, &sv) == 0) {
    j_obj("mount_flags");
    j_bool("ro", (sv.f_flag & ST_RDONLY) != 0);
    j_bool("nosuid", (sv.f_flag & ST_NOSUID) != 0);
    j_bool("nodev", (sv.f_flag & ST_NODEV) != 0);
    j_bool("noexec", (sv.f_flag & ST_NOEXEC) != 0);
    j_obj_end();
  }
  j_end();
}

static void q_exists(const char *path) {
  j_begin("exists");
  j_str("path", path);
  struct stat st;
  if (lstat(path, &st) == 0) {
    j_bool("exists", true);
    j_str("type", file_type(st.st_mode));
  } else {
    int e = errno;
    /* Only ENOENT and ENOTDIR prove absence; after EACCES or ELOOP the
     * answer is null: unknown. */
    if (e == ENOENT || e == ENOTDIR) j_bool("exists", false);
    else j_str("exists", NULL);
    j_errno(e);
  }
  j_end();
}

static void q_fill(const char *path, const char *max_arg) {
  unsigned long long max = ULLONG_MAX;
  if (max_arg != NULL && !parse_ull(max_arg, &max)) {
    usage_error("fill", "MAX_BYTES must be a byte count");
    return;
  }
  signal(SIGXFSZ, SIG_IGN);
  int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOCTTY, 0644);
  if (fd < 0) {
    int e = errno;
    j_begin("fill");
    j_str("path", path);
    j_bool("ok", false);
    j_str("stage", "open");
    j_errno(e);
    j_end();
    return;
  }
  static char chunk[1 << 16];
  memset(chunk, 'f', sizeof(chunk));
  unsigned long long total = 0;
  int e = 0;
  uint64_t t0 = now_ns();
  while (total < max) {
    size_t want = sizeof(chunk);
    if (max - total < want) want = (size_t)(max - total);
    ssize_t w = write(fd, chunk, want);
    if (w < 0) {
      if (errno == EINTR) continue;
      e = errno;
      break;
    }
    if (w == 0) {
      e = ENOSPC;
      break;
    }
    total += (unsigned long long)w;
  }
  /* Delayed allocation errors (quota, ENOSPC) can surface only here. */
  int fe = 0;
  if (fsync(fd) != 0 && errno != EINVAL && errno != EROFS) fe = errno;
  close(fd);
  j_begin("fill");
  j_str("path", path);
  j_uint("bytes", total);
  j_bool("ok", e == 0 && fe == 0);
  if (e != 0) j_errno(e);
  if (fe != 0) j_errno_p("fsync_", fe);
  j_int("ms", (long long)((now_ns() - t0) / 1000000ull));
  j_end();
}

/* ------------------------------------------------------------------------ */
/* Process and resource queries.                                             */

static void q_fork_bomb(const char *n_arg) {
  unsigned long long max;
  if (!parse_ull(n_arg, &max)) {
    usage_error("fork-bomb", "N must be a count");
    return;
  }
  unsigned long long count = 0;
  int e = 0;
  while (count < max) {
    pid_t p = fork();
    if (p < 0) {
      e = errno;
      break;
    }
    if (p == 0) {
      /* The child holds nothing the caller waits on (a pipe kept open would
       * turn this into a stdout test), and stays until the teardown. */
      for (int fd = 0; fd < 3; fd++) close(fd);
      for (;;) pause();
    }
    count++;
  }
  j_begin("fork-bomb");
  j_uint("requested", max);
  j_uint("forked", count);
  j_bool("ok", e == 0);
  if (e != 0) j_errno(e);
  j_end();
}

static void q_mem_hog(const char *mb_arg) {
  unsigned long long max;
  if (!parse_ull(mb_arg, &max)) {
    usage_error("mem-hog", "MB must be a count of MiB (0: until failure)");
    return;
  }
  if (max == 0) max = ULLONG_MAX;
  unsigned long long mb = 0;
  int e = 0;
  while (mb < max) {
    void *p = mmap(NULL, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      e = errno;
      break;
    }
    /* Touch every page so the memory is really charged. */
    memset(p, 0x5a, 1 << 20);
    mb++;
    j_begin("mem-hog");
    j_bool("progress", true);
    j_uint("mb", mb);
    j_end();
  }
  j_begin("mem-hog");
  j_uint("mb", mb);
  j_bool("ok", e == 0);
  if (e != 0) j_errno(e);
  j_end();
}

static void q_spin(void) {
  j_begin("spin");
  j_bool("started", true);
  j_end();
  volatile unsigned long long x = 0;
  for (;;) x++;
}

static void q_sleep(const char *secs_arg) {
  char *end = NULL;
  double secs = secs_arg ? strtod(secs_arg, &end) : -1;
  if (secs_arg == NULL || end == secs_arg || *end != '\0' || secs < 0) {
    usage_error("sleep", "SECS must be a non-negative number");
    return;
  }
  uint64_t t0 = now_ns();
  sleep_ms((long)(secs * 1000.0));
  j_begin("sleep");
  j_int("slept_ms", (long long)((now_ns() - t0) / 1000000ull));
  j_end();
}

static void q_daemonize(const char *mode) {
  bool keep_stdio = mode != NULL && strcmp(mode, "keep-stdio") == 0;
  int pfd[2];
  j_begin("daemonize");
  if (pipe2(pfd, O_CLOEXEC) != 0) {
    j_bool("ok", false);
    j_errno(errno);
    j_end();
    return;
  }
  pid_t child = fork();
  if (child < 0) {
    int e = errno;
    close(pfd[0]);
    close(pfd[1]);
    j_bool("ok", false);
    j_str("stage", "fork");
    j_errno(e);
    j_end();
    return;
  }
  if (child == 0) {
    close(pfd[0]);
    setsid();
    pid_t g = fork();
    if (g < 0) {
      int e = -errno;
      write_all(pfd[1], (const char *)&e, sizeof(e));
      _exit(1);
    }
    if (g > 0) _exit(0);
    /* The grandchild: a classic daemon, reparented away from the probe. */
    int me = (int)getpid();
    write_all(pfd[1], (const char *)&me, sizeof(me));
    close(pfd[1]);
    if (!keep_stdio) {
      for (int fd = 0; fd < 3; fd++) close(fd);
    }
    for (;;) pause();
  }
  close(pfd[1]);
  int v = 0;
  ssize_t r;
  do {
    r = read(pfd[0], &v, sizeof(v));
  } while (r < 0 && errno == EINTR);
  close(pfd[0]);
  int st;
  while (waitpid(child, &st, 0) < 0 && errno == EINTR) {
  }
  if (r != (ssize_t)sizeof(v) || v <= 0) {
    j_bool("ok", false);
    j_str("stage", "second fork");
    if (r == (ssize_t)sizeof(v)) j_errno(-v);
  } else {
    j_bool("ok", true);
    j_int("grandchild", v);
    j_bool("keep_stdio", keep_stdio);
  }
  j_end();
}

static void q_flood(const char *bytes_arg) {
  unsigned long long max;
  if (!parse_ull(bytes_arg, &max)) {
    usage_error("flood", "BYTES must be a byte count");
    return;
  }
  signal(SIGPIPE, SIG_IGN);
  static char chunk[1 << 16];
  memset(chunk, 'x', sizeof(chunk));
  unsigned long long total = 0;
  int e = 0;
  uint64_t t0 = now_ns();
  while (total < max) {
    size_t want = sizeof(chunk);
    if (max - total < want) want = (size_t)(max - total);
    ssize_t w = write(STDOUT_FILENO, chunk, want);
    if (w < 0) {
      if (errno == EINTR) continue;
      e = errno;
      break;
    }
    total += (unsigned long long)w;
  }
  write_all(STDOUT_FILENO, "\n", 1);
  j_begin("flood");
  j_uint("requested", max);
  j_uint("bytes", total);
  j_bool("ok", e == 0);
  if (e != 0) j_errno(e);
  j_int("ms", (long long)((now_ns() - t0) / 1000000ull));
  j_end();
  signal(SIGPIPE, SIG_DFL);
}

static void q_kill_all(void) {
  j_begin("kill-all");
  int r = kill(-1, SIGKILL);
  int e = errno;
  j_int("ret", r);
  j_bool("ok", r == 0);
  if (r != 0) j_errno(e);
  j_end();
}

/* PORT of a query, 0-65535; otherwise the query's object says so, is
 * closed, and counts as a usage error. */
static int parse_port(const char *arg, unsigned long long *port) {
  if (parse_ull(arg, port) && *port <= 65535) return 1;
  j_str("error", "PORT must be 0-65535");
  g_usage_errors++;
  j_end();
  return 0;
}

static void q_net_connect(const char *host, const char *port_arg) {
  j_begin("net-connect");
  j_str("host", host);
  j_str("port", port_arg);
  unsigned long long port;
  if (!parse_port(port_arg, &port)) return;
  struct sockaddr_storage ss;
  socklen_t sl;
  memset(&ss, 0, sizeof(ss));
  struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;
  struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&ss;
  if (inet_pton(AF_INET, host, &s4->sin_addr) == 1) {
    s4->sin_family = AF_INET;
    s4->sin_port = htons((uint16_t)port);
    sl = sizeof(*s4);
  } else if (inet_pton(AF_INET6, host, &s6->sin6_addr) == 1) {
    s6->sin6_family = AF_INET6;
    s6->sin6_port = htons((uint16_t)port);
    sl = sizeof(*s6);
  } else {
    j_str("error", "HOST must be a numeric IPv4 or IPv6 address");
    g_usage_errors++;
    j_end();
    return;
  }
  int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    j_bool("ok", false);
    j_str("stage", "socket");
    j_errno(errno);
    j_end();
    return;
  }
  int r = connect(fd, (struct sockaddr *)&ss, sl);
  int e = r == 0 ? 0 : errno;
  if (r != 0 && e == EINPROGRESS) {
    struct pollfd p = {fd, POLLOUT, 0};
    int pr;
    do {
      pr = poll(&p, 1, 3000);
    } while (pr < 0 && errno == EINTR);
    if (pr == 0) {
      e = ETIMEDOUT;
    } else {
      socklen_t el = sizeof(e);
      if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &el) != 0) e = errno;
    }
  }
  close(fd);
  j_bool("ok", e == 0);
  if (e != 0) {
    j_str("stage", "connect");
    j_errno(e);
  }
  j_end();
}

/* open-rw PATH: open an existing file for reading and writing (no create,
 * no truncation); the file is closed again without a byte written. */
static void q_open_rw(const char *path) {
  j_begin("open-rw");
  j_str("path", path);
  int fd = open(path, O_RDWR | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  j_bool("ok", fd >= 0);
  if (fd < 0) j_errno(errno);
  else close(fd);
  j_end();
}

/* tcp-self PORT: a TCP listener on 127.0.0.1:PORT and a connection to it,
 * as a tool talking to a server it started itself. */
static void q_tcp_self(const char *port_arg) {
  j_begin("tcp-self");
  unsigned long long port;
  if (!parse_port(port_arg, &port)) return;
  struct sockaddr_in a;
  memset(&a, 0, sizeof(a));
  a.sin_family = AF_INET;
  a.sin_port = htons((uint16_t)port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t al = sizeof(a);
  const char *stage = "socket";
  int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), c = -1, e = 0;
  if (l >= 0) stage = "bind";
  if (l >= 0 && bind(l, (struct sockaddr *)&a, sizeof(a)) == 0 && (stage = "listen", listen(l, 4) == 0) &&
      (stage = "getsockname", getsockname(l, (struct sockaddr *)&a, &al) == 0)) {
    stage = "connect";
    c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (c >= 0 && connect(c, (struct sockaddr *)&a, sizeof(a)) == 0) stage = NULL;
  }
  if (stage != NULL) e = errno;
  if (c >= 0) close(c);
  if (l >= 0) close(l);
  j_bool("ok", stage == NULL);
  if (stage != NULL) {
    j_str("stage", stage);
    j_errno(e);
  }
  j_end();
}

/* unix-abstract NAME: connect a stream socket to the abstract Unix address
 * NAME (the address a peer bound with a leading NUL). */
static void q_unix_abstract(const char *name) {
  j_begin("unix-abstract");
  j_str("name", name);
  struct sockaddr_un u;
  memset(&u, 0, sizeof(u));
  u.sun_family = AF_UNIX;
  size_t n = strlen(name);
  if (n + 1 > sizeof(u.sun_path)) {
    j_str("error", "NAME is too long");
    g_usage_errors++;
    j_end();
    return;
  }
  memcpy(u.sun_path + 1, name, n);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int r = fd < 0 ? -1 : connect(fd, (struct sockaddr *)&u, (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n));
  int e = errno;
  if (fd >= 0) close(fd);
  j_bool("ok", r == 0);
  if (r != 0) j_errno(e);
  j_end();
}

/* ------------------------------------------------------------------------ */
/* try-syscall: each call uses arguments that make it fail harmlessly when
 * the filter lets it through (bad fd -1, pointer 1, invalid flags), so the
 * errno tells whether the kernel or the filter answered. "if_allowed" lists
 * what the kernel gives a caller without capabilities when the call is not
 * filtered (kernel configuration decides between some of them: a kernel
 * without kexec answers ENOSYS). Where that list holds the policy's own errno
 * (often EPERM) the answer cannot tell the two apart; tests should compare
 * with a run under a policy that allows the call, or use a policy errno the
 * kernel does not give. clone3 is expected to answer ENOSYS so that glibc
 * falls back to clone.
 *
 * Each call runs in a forked child so that calls that succeed (unshare,
 * personality), and filters that kill (SIGSYS), leave the probe intact.
 * The child reports {ret, errno} through a pipe. */

struct sc_result {
  long ret;
  int err;
};

typedef long (*sc_fn)(void);

static long sc_ptrace(void) { return syscall(SYS_ptrace, 16 /* PTRACE_ATTACH */, -1, 0, 0); }
static long sc_process_vm_readv(void) {
  /* flags must be 0: checked before anything is read. */
  return syscall(SYS_process_vm_readv, getpid(), BAD_PTR, 1, BAD_PTR, 1, 1);
}
static long sc_process_vm_writev(void) {
  return syscall(SYS_process_vm_writev, getpid(), BAD_PTR, 1, BAD_PTR, 1, 1);
}
static long sc_keyctl(void) { return syscall(SYS_keyctl, 0x7fff /* no such operation */, 0, 0, 0, 0); }
static long sc_add_key(void) { return syscall(SYS_add_key, BAD_PTR, BAD_PTR, NULL, 0, -1); }
static long sc_request_key(void) { return syscall(SYS_request_key, BAD_PTR, BAD_PTR, NULL, -1); }
static long sc_bpf(void) { return syscall(SYS_bpf, 0x7fff /* no such command */, NULL, 0); }
static long sc_perf_event_open(void) { return syscall(SYS_perf_event_open, BAD_PTR, 0, -1, -1, 0); }
static long sc_userfaultfd(void) {
  /* UFFD_USER_MODE_ONLY passes the sysctl gate; the extra bit is invalid. */
  return syscall(SYS_userfaultfd, UFFD_USER_MODE_ONLY | 0x2);
}
static long sc_io_uring_setup(void) { return syscall(SYS_io_uring_setup, 1, BAD_PTR); }
static long sc_io_uring_enter(void) { return syscall(SYS_io_uring_enter, -1, 0, 0, 0, NULL, 0); }
static long sc_io_uring_register(void) { return syscall(SYS_io_uring_register, -1, 0, NULL, 0); }
static long sc_unshare_user(void) { return syscall(SYS_unshare, CLONE_NEWUSER); }
static long sc_unshare_ns(void) { return syscall(SYS_unshare, CLONE_NEWNS); }
static long sc_unshare_net(void) { return syscall(SYS_unshare, CLONE_NEWNET); }
static long sc_clone3(void) {
  /* A size the kernel accepts and a pointer it cannot read: EFAULT when
   * allowed, no process created. */
  return syscall(SYS_clone3, BAD_PTR, 88);
}
static long raw_clone_flags(unsigned long flags) {
  /* A fork-like raw clone (no new stack); the child leaves at once. */
  long r = syscall(SYS_clone, flags | SIGCHLD, NULL, NULL, NULL, 0);
  if (r == 0) syscall(SYS_exit_group, 0);
  if (r > 0) {
    int st;
    while (waitpid((pid_t)r, &st, 0) < 0 && errno == EINTR) {
    }
    /* Report success as 0: the pid means nothing to the caller. */
    r = 0;
  }
  return r;
}
static long sc_clone_newns(void) { return raw_clone_flags(CLONE_NEWNS); }
static long sc_clone_newuser(void) { return raw_clone_flags(CLONE_NEWUSER); }
static long sc_clone_newpid(void) { return raw_clone_flags(CLONE_NEWPID); }
static long sc_clone_newnet(void) { return raw_clone_flags(CLONE_NEWNET); }
static long sc_clone_newcgroup(void) { return raw_clone_flags(CLONE_NEWCGROUP); }
static long sc_mount(void) { return syscall(SYS_mount, "none", "/", BAD_PTR, 0, NULL); }
static long sc_umount2(void) { return syscall(SYS_umount2, "/", 0xff00 /* invalid flags */); }
static long sc_pivot_root(void) { return syscall(SYS_pivot_root, BAD_PTR, BAD_PTR); }
static long sc_setns(void) { return syscall(SYS_setns, -1, 0); }
static long sc_open_by_handle_at(void) { return syscall(SYS_open_by_handle_at, -1, BAD_PTR, 0); }
static long sc_name_to_handle_at(void) {
  return syscall(SYS_name_to_handle_at, -1, BAD_PTR, BAD_PTR, BAD_PTR, 0);
}
static long sc_kexec_load(void) {
  /* 0x8000 is not a kexec flag: EINVAL even for root. */
  return syscall(SYS_kexec_load, 0, 0, NULL, 0x8000);
}
static long sc_kexec_file_load(void) {
  return syscall(SYS_kexec_file_load, -1, -1, 0, NULL, 0x8000);
}
static long sc_init_module(void) { return syscall(SYS_init_module, NULL, 0, BAD_PTR); }
static long sc_finit_module(void) { return syscall(SYS_finit_module, -1, BAD_PTR, 0); }
static long sc_delete_module(void) { return syscall(SYS_delete_module, BAD_PTR, 0); }
static long sc_reboot(void) {
  /* Wrong magic numbers: EINVAL even for root. */
  return syscall(SYS_reboot, 0, 0, 0x1234567, NULL);
}
static long sc_swapon(void) { return syscall(SYS_swapon, BAD_PTR, 0x7fffffff /* invalid flags */); }
static long sc_swapoff(void) { return syscall(SYS_swapoff, BAD_PTR); }
static long sc_settimeofday(void) { return syscall(SYS_settimeofday, BAD_PTR, NULL); }
static long sc_clock_settime(void) { return syscall(SYS_clock_settime, CLOCK_REALTIME, BAD_PTR); }
static long sc_adjtimex(void) { return syscall(SYS_adjtimex, BAD_PTR); }
#if defined(__x86_64__) || defined(__i386__)
static long sc_iopl(void) { return syscall(SYS_iopl, 4 /* > 3: EINVAL */); }
static long sc_ioperm(void) { return syscall(SYS_ioperm, 0xffffffffUL, 1, 1); }
#endif
static long sc_personality(void) {
  long r = syscall(SYS_personality, READ_IMPLIES_EXEC);
  return r;
}
static long sc_socket(int domain, int type, int proto) {
  long r = syscall(SYS_socket, domain, type | SOCK_CLOEXEC, proto);
  if (r >= 0) {
    close((int)r);
    /* Report success as 0: the descriptor number means nothing. */
    r = 0;
  }
  return r;
}
static long sc_socket_alg(void) { return sc_socket(AF_ALG, SOCK_SEQPACKET, 0); }
static long sc_socket_vsock(void) { return sc_socket(AF_VSOCK, SOCK_STREAM, 0); }
static long sc_socket_packet(void) { return sc_socket(AF_PACKET, SOCK_RAW, 0); }
static long sc_socket_netlink(void) { return sc_socket(AF_NETLINK, SOCK_RAW, NETLINK_ROUTE); }
static long sc_socket_inet(void) { return sc_socket(AF_INET, SOCK_STREAM, 0); }
static long sc_socket_inet6(void) { return sc_socket(AF_INET6, SOCK_STREAM, 0); }
static long sc_socket_inet_raw(void) { return sc_socket(AF_INET, SOCK_RAW, IPPROTO_ICMP); }
static long sc_socket_unix(void) { return sc_socket(AF_UNIX, SOCK_STREAM, 0); }
static long sc_tiocsti(void) { return syscall(SYS_ioctl, -1, TIOCSTI, BAD_PTR); }
static long sc_tiocsti_high(void) {
  /* CVE-2019-10063: the kernel truncates cmd to 32 bits, so a filter that
   * compares all 64 bits misses this one. */
  return syscall(SYS_ioctl, -1, (unsigned long)TIOCSTI | (1ul << 32), BAD_PTR);
}
static long sc_tioclinux(void) { return syscall(SYS_ioctl, -1, TIOCLINUX, BAD_PTR); }
static long sc_chroot(void) { return syscall(SYS_chroot, BAD_PTR); }
static long sc_acct(void) { return syscall(SYS_acct, BAD_PTR); }
static long sc_syslog(void) { return syscall(SYS_syslog, 3 /* READ_ALL */, NULL, -1); }
static long sc_quotactl(void) { return syscall(SYS_quotactl, 0, BAD_PTR, 0, NULL); }
static long sc_flock(void) { return syscall(SYS_flock, -1, LOCK_EX); }
static long sc_fcntl_setlease(void) { return syscall(SYS_fcntl, -1, F_SETLEASE, F_WRLCK); }
static long sc_fcntl_setlk(void) { return syscall(SYS_fcntl, -1, F_SETLK, BAD_PTR); }
static long sc_fsopen(void) { return syscall(SYS_fsopen, BAD_PTR, 0); }
static long sc_fsmount(void) { return syscall(SYS_fsmount, -1, 0, 0); }
static long sc_fsconfig(void) { return syscall(SYS_fsconfig, -1, 0, NULL, NULL, 0); }
static long sc_open_tree(void) { return syscall(SYS_open_tree, -1, BAD_PTR, 0); }
static long sc_move_mount(void) { return syscall(SYS_move_mount, -1, BAD_PTR, -1, BAD_PTR, 0); }
static long sc_mount_setattr(void) { return syscall(SYS_mount_setattr, -1, BAD_PTR, 0, BAD_PTR, 0); }
static long sc_pidfd_getfd(void) { return syscall(SYS_pidfd_getfd, -1, 0, 0); }
static long sc_kcmp(void) { return syscall(SYS_kcmp, -1, -1, 0, 0, 0); }
static long sc_fanotify_init(void) { return syscall(SYS_fanotify_init, 0xffffffffu, 0); }
static long sc_lookup_dcookie(void) {
#ifdef SYS_lookup_dcookie
  return syscall(SYS_lookup_dcookie, 0, BAD_PTR, 0);
#else
  errno = ENOSYS;
  return -1;
#endif
}
static long sc_vm86(void) {
#ifdef SYS_vm86
  return syscall(SYS_vm86, 0, BAD_PTR);
#else
  errno = ENOSYS;
  return -1;
#endif
}
static long sc_seccomp(void) {
  /* SECCOMP_SET_MODE_FILTER with a bad program pointer. */
  return syscall(SYS_seccomp, 1, 0, BAD_PTR);
}
static long sc_memfd_secret(void) {
#ifdef SYS_memfd_secret
  return syscall(SYS_memfd_secret, 0xffffffffu);
#else
  errno = ENOSYS;
  return -1;
#endif
}
#if defined(__x86_64__)
static long sc_x32(void) {
  /* getpid through the x32 ABI: the filter must reject the X32 bit. */
  return syscall(SYS_getpid | X32_SYSCALL_BIT);
}
static long sc_int80(void) {
  /* getpid (20) through the 32-bit entry point; the filter must check the
   * architecture, since 32-bit numbers differ from 64-bit ones. */
  long ret;
  __asm__ volatile("int $0x80" : "=a"(ret) : "a"(20L) : "memory", "rcx", "r11", "r8", "r9", "r10");
  if (ret < 0 && ret > -4096) {
    errno = (int)-ret;
    return -1;
  }
  return ret;
}
#endif

static const struct {
  const char *name;
  sc_fn fn;
  /* What the kernel answers a caller without capabilities when the filter
   * lets the call through: errno names, "OK" for success, a signal name for
   * a fault; the first entry is the usual one. */
  const char *if_allowed;
} g_syscalls[] = {
    {"ptrace", sc_ptrace, "ESRCH"},
    {"process_vm_readv", sc_process_vm_readv, "EINVAL"},
    {"process_vm_writev", sc_process_vm_writev, "EINVAL"},
    {"keyctl", sc_keyctl, "EOPNOTSUPP"},
    {"add_key", sc_add_key, "EFAULT"},
    {"request_key", sc_request_key, "EFAULT"},
    {"bpf", sc_bpf, "EINVAL"},
    {"perf_event_open", sc_perf_event_open, "EFAULT"},
    {"userfaultfd", sc_userfaultfd, "EINVAL"},
    {"io_uring_setup", sc_io_uring_setup, "EFAULT"},
    {"io_uring_enter", sc_io_uring_enter, "EBADF"},
    {"io_uring_register", sc_io_uring_register, "EINVAL"},
    {"unshare", sc_unshare_user, "OK,EPERM,ENOSPC"},
    {"unshare-newns", sc_unshare_ns, "EPERM"},
    {"unshare-newnet", sc_unshare_net, "EPERM"},
    {"clone3", sc_clone3, "EFAULT"},
    {"clone-newns", sc_clone_newns, "EPERM"},
    {"clone-newuser", sc_clone_newuser, "OK,EPERM,ENOSPC"},
    {"clone-newpid", sc_clone_newpid, "EPERM"},
    {"clone-newnet", sc_clone_newnet, "EPERM"},
    {"clone-newcgroup", sc_clone_newcgroup, "EPERM"},
    {"mount", sc_mount, "EFAULT"},
    {"umount2", sc_umount2, "EINVAL"},
    {"pivot_root", sc_pivot_root, "EPERM"},
    {"setns", sc_setns, "EBADF"},
    {"open_by_handle_at", sc_open_by_handle_at, "EFAULT,EPERM"},
    {"name_to_handle_at", sc_name_to_handle_at, "EFAULT"},
    {"kexec_load", sc_kexec_load, "EPERM,ENOSYS"},
    {"kexec_file_load", sc_kexec_file_load, "EPERM,ENOSYS"},
    {"init_module", sc_init_module, "EPERM,ENOSYS"},
    {"finit_module", sc_finit_module, "EPERM,ENOSYS"},
    {"delete_module", sc_delete_module, "EPERM,ENOSYS"},
    {"reboot", sc_reboot, "EPERM"},
    {"swapon", sc_swapon, "EINVAL"},
    {"swapoff", sc_swapoff, "EPERM"},
    {"settimeofday", sc_settimeofday, "EFAULT"},
    {"clock_settime", sc_clock_settime, "EFAULT"},
    {"adjtimex", sc_adjtimex, "EFAULT"},
#if defined(__x86_64__) || defined(__i386__)
    {"iopl", sc_iopl, "EINVAL,ENOSYS"},
    {"ioperm", sc_ioperm, "EINVAL,ENOSYS"},
#endif
    {"personality", sc_personality, "OK"},
    {"socket-alg", sc_socket_alg, "OK,EAFNOSUPPORT"},
    {"socket-vsock", sc_socket_vsock, "OK,EAFNOSUPPORT"},
    {"socket-packet", sc_socket_packet, "EPERM"},
    {"socket-netlink", sc_socket_netlink, "OK"},
    {"socket-inet", sc_socket_inet, "OK"},
    {"socket-inet6", sc_socket_inet6, "OK,EAFNOSUPPORT"},
    {"socket-inet-raw", sc_socket_inet_raw, "EPERM"},
    {"socket-unix", sc_socket_unix, "OK"},
    {"tiocsti", sc_tiocsti, "EBADF"},
    {"tiocsti-high", sc_tiocsti_high, "EBADF"},
    {"tioclinux", sc_tioclinux, "EBADF"},
    {"chroot", sc_chroot, "EFAULT"},
    {"acct", sc_acct, "EPERM"},
    {"syslog", sc_syslog, "EPERM"},
    {"quotactl", sc_quotactl, "EFAULT"},
    {"flock", sc_flock, "EBADF"},
    {"fcntl-setlease", sc_fcntl_setlease, "EBADF"},
    {"fcntl-setlk", sc_fcntl_setlk, "EBADF"},
    {"fsopen", sc_fsopen, "EPERM"},
    {"fsmount", sc_fsmount, "EPERM"},
    {"fsconfig", sc_fsconfig, "EINVAL"},
    {"open_tree", sc_open_tree, "EFAULT"},
    {"move_mount", sc_move_mount, "EPERM"},
    {"mount_setattr", sc_mount_setattr, "EINVAL"},
    {"pidfd_getfd", sc_pidfd_getfd, "EBADF"},
    {"kcmp", sc_kcmp, "ESRCH"},
    {"fanotify_init", sc_fanotify_init, "EPERM"},
    {"lookup_dcookie", sc_lookup_dcookie, "ENOSYS"},
    {"vm86", sc_vm86, "ENOSYS"},
    {"seccomp", sc_seccomp, "EFAULT"},
    {"memfd_secret", sc_memfd_secret, "EINVAL,ENOSYS"},
#if defined(__x86_64__)
    {"x32", sc_x32, "ENOSYS,OK"},
    {"int80", sc_int80, "OK,SIGSEGV"},
#endif
};

static void q_try_syscall(const char *name) {
  size_t n = sizeof(g_syscalls) / sizeof(g_syscalls[0]);
  size_t i = 0;
  while (i < n && strcmp(g_syscalls[i].name, name) != 0) i++;
  if (i == n) {
    j_begin("try-syscall");
    j_str("syscall", name);
    j_str("error", "unknown syscall name (try: tsb-probe list-syscalls)");
    j_end();
    g_usage_errors++;
    return;
  }
  struct sc_result res = {0, 0};
  bool isolated = false;
  int sig = 0;
  int pfd[2];
  if (pipe2(pfd, O_CLOEXEC) == 0) {
    pid_t p = fork();
    if (p == 0) {
      close(pfd[0]);
      errno = 0;
      struct sc_result cr;
      cr.ret = g_syscalls[i].fn();
      cr.err = cr.ret < 0 ? errno : 0;
      write_all(pfd[1], (const char *)&cr, sizeof(cr));
      _exit(0);
    }
    close(pfd[1]);
    if (p > 0) {
      isolated = true;
      ssize_t r;
      do {
        r = read(pfd[0], &res, sizeof(res));
      } while (r < 0 && errno == EINTR);
      int st = 0;
      while (waitpid(p, &st, 0) < 0 && errno == EINTR) {
      }
      if (WIFSIGNALED(st)) sig = WTERMSIG(st);
      else if (r != (ssize_t)sizeof(res)) sig = -1;
    }
    close(pfd[0]);
  }
  if (!isolated) {
    /* No fork (pids exhausted?): run in-process, accepting the risk. */
    errno = 0;
    res.ret = g_syscalls[i].fn();
    res.err = res.ret < 0 ? errno : 0;
  }
  j_begin("try-syscall");
  j_str("syscall", name);
  if (sig > 0) {
    j_bool("killed", true);
    j_int("signal", sig);
    j_str("signame", signame(sig));
  } else if (sig < 0) {
    j_str("error", "child exited without a result");
  } else {
    j_int("ret", res.ret);
    j_int("errno", res.err);
    j_str("errname", errname(res.err));
  }
  j_arr("if_allowed");
  for (const char *p = g_syscalls[i].if_allowed; p != NULL && *p != '\0';) {
    size_t l = strcspn(p, ",");
    j_strn(NULL, p, l);
    p += l;
    if (*p == ',') p++;
  }
  j_arr_end();
  j_bool("isolated", isolated);
  j_end();
}

static void q_list_syscalls(void) {
  j_begin("list-syscalls");
  j_arr("syscalls");
  for (size_t i = 0; i < sizeof(g_syscalls) / sizeof(g_syscalls[0]); i++) j_str(NULL, g_syscalls[i].name);
  j_arr_end();
  j_end();
}

/* ------------------------------------------------------------------------ */
/* Dispatch.                                                                 */

enum { ARG_NONE, ARG_ONE, ARG_OPT, ARG_TWO, ARG_ONE_OPT };

typedef void (*fn0)(void);
typedef void (*fn1)(const char *);
typedef void (*fn2)(const char *, const char *);

static void q_help(void);

static const struct query {
  const char *name;
  int args;
  fn0 f0;  /* ARG_NONE */
  fn1 f1;  /* ARG_ONE, ARG_OPT */
  fn2 f2;  /* ARG_TWO, ARG_ONE_OPT */
  const char *help;
} g_queries[] = {
    {"caps", ARG_NONE, .f0 = q_caps, .help = "CapInh/CapPrm/CapEff/CapBnd/CapAmb from /proc/self/status"},
    {"ids", ARG_NONE, .f0 = q_ids, .help = "uids, gids, groups, uid_map, gid_map, setgroups"},
    {"nnp", ARG_NONE, .f0 = q_nnp, .help = "no_new_privs (prctl and /proc/self/status)"},
    {"seccomp-mode", ARG_NONE, .f0 = q_seccomp_mode, .help = "Seccomp and Seccomp_filters"},
    {"securebits", ARG_NONE, .f0 = q_securebits, .help = "prctl(PR_GET_SECUREBITS)"},
    {"fds", ARG_NONE, .f0 = q_fds, .help = "open descriptors with their targets"},
    {"mounts", ARG_NONE, .f0 = q_mounts, .help = "every mount from /proc/self/mountinfo"},
    {"hostname", ARG_NONE, .f0 = q_hostname, .help = "hostname and domainname"},
    {"pid", ARG_NONE, .f0 = q_pid, .help = "pid, ppid, /proc/1/cmdline, visible pids"},
    {"netdevs", ARG_NONE, .f0 = q_netdevs, .help = "interfaces from /proc/net/dev"},
    {"cgroup", ARG_NONE, .f0 = q_cgroup, .help = "/proc/self/cgroup"},
    {"rlimits", ARG_NONE, .f0 = q_rlimits, .help = "every resource limit"},
    {"getenv", ARG_NONE, .f0 = q_getenv, .help = "the environment, in order"},
    {"cwd", ARG_NONE, .f0 = q_cwd, .help = "working directory"},
    {"readfile", ARG_ONE_OPT, .f2 = q_readfile, .help = "PATH [MAX]: first bytes (default 256) or errno"},
    {"writefile", ARG_ONE_OPT, .f2 = q_writefile, .help = "PATH [TEXT]: create (or append to) a file"},
    {"stat", ARG_ONE, .f1 = q_stat, .help = "PATH: type, mode, owner, mount flags"},
    {"exists", ARG_ONE, .f1 = q_exists, .help = "PATH: whether lstat succeeds"},
    {"try-syscall", ARG_ONE, .f1 = q_try_syscall, .help = "NAME: harmless call, report ret/errno or signal"},
    {"list-syscalls", ARG_NONE, .f0 = q_list_syscalls, .help = "names accepted by try-syscall"},
    {"fork-bomb", ARG_ONE, .f1 = q_fork_bomb, .help = "N: fork until failure (at most N); children stay"},
    {"mem-hog", ARG_ONE, .f1 = q_mem_hog, .help = "MB: touch MB MiB (0: until failure), one line per MiB"},
    {"fill", ARG_ONE_OPT, .f2 = q_fill, .help = "PATH [MAX]: write until error, report bytes and errno"},
    {"spin", ARG_NONE, .f0 = q_spin, .help = "busy loop forever (prints once first)"},
    {"sleep", ARG_ONE, .f1 = q_sleep, .help = "SECS: sleep, then report"},
    {"daemonize", ARG_OPT, .f1 = q_daemonize, .help = "[keep-stdio]: double fork + setsid; grandchild sleeps"},
    {"flood", ARG_ONE, .f1 = q_flood, .help = "BYTES: write that many bytes to stdout, then a summary"},
    {"kill-all", ARG_NONE, .f0 = q_kill_all, .help = "kill(-1, SIGKILL)"},
    {"net-connect", ARG_TWO, .f2 = q_net_connect, .help = "HOST PORT: TCP connect to a numeric address"},
    {"open-rw", ARG_ONE, .f1 = q_open_rw, .help = "PATH: open an existing file read-write, or errno"},
    {"tcp-self", ARG_ONE, .f1 = q_tcp_self, .help = "PORT: listen on 127.0.0.1:PORT and connect to it"},
    {"unix-abstract", ARG_ONE, .f1 = q_unix_abstract, .help = "NAME: connect to the abstract Unix socket NAME"},
    {"help", ARG_NONE, .f0 = q_help, .help = "this list"},
};

static void q_help(void) {
  j_begin("help");
  j_obj("queries");
  for (size_t i = 0; i < sizeof(g_queries) / sizeof(g_queries[0]); i++) j_str(g_queries[i].name, g_queries[i].help);
  j_obj_end();
  j_end();
}

static const struct query *find_query(const char *name) {
  for (size_t i = 0; i < sizeof(g_queries) / sizeof(g_queries[0]); i++)
    if (strcmp(g_queries[i].name, name) == 0) return &g_queries[i];
  return NULL;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    q_help();
    return 2;
  }
  int i = 1;
  while (i < argc) {
    const char *name = argv[i++];
    const struct query *q = find_query(name);
    if (q == NULL) {
      usage_error(name, "unknown query (try: tsb-probe help)");
      continue;
    }
    /* An optional argument is taken only when it is not itself a query. */
    const char *a1 = NULL, *a2 = NULL;
    switch (q->args) {
      case ARG_NONE:
        q->f0();
        break;
      case ARG_ONE:
        if (i >= argc) {
          usage_error(name, "missing argument");
          break;
        }
        q->f1(argv[i++]);
        break;
      case ARG_OPT:
        if (i < argc && find_query(argv[i]) == NULL) a1 = argv[i++];
        q->f1(a1);
        break;
      case ARG_ONE_OPT:
        if (i >= argc) {
          usage_error(name, "missing argument");
          break;
        }
        a1 = argv[i++];
        if (i < argc && find_query(argv[i]) == NULL) a2 = argv[i++];
        q->f2(a1, a2);
        break;
      case ARG_TWO:
        if (i + 1 >= argc) {
          usage_error(name, "missing arguments");
          i = argc;
          break;
        }
        a1 = argv[i++];
        a2 = argv[i++];
        q->f2(a1, a2);
        break;
    }
  }
  return g_usage_errors ? 2 : 0;
}
