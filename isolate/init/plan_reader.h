// toolsandbox-init's reader of the plan (isolate/engine/plan.h). The plan comes
// from the engine, which is trusted; the reader still checks every length,
// count and value, so that a plan it accepts is one the steps can use
// (every text NUL-terminated with no NUL inside, every op and stage known,
// nothing left over). Strings stay in the plan's buffer; the arrays are
// allocated once (init is a fresh process: it may allocate).
//
// Header only, libc only: included by the static init and by the unit tests.
#pragma once

#include <linux/filter.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "isolate/engine/plan.h"
#include "isolate/engine/stage.h"

namespace tsb::isolate::init {

struct Step {
  Op op;
  Stage stage;
  bool dir;
  bool optional;
  bool writable;  // kAttach: a writable mount (kStepWritable)
  bool noexec;    // kAttach: a noexec mount (kStepNoExec)
  uint32_t mode;
  int fd;
  int err;
  const char* path;
  const char* source;
  const char* data;
  size_t len;  // of data
};

struct Filter {
  sock_filter* insns;  // copied out of the buffer (aligned)
  unsigned short len;
};

struct Plan {
  int report_fd, stdin_fd, stdout_fd, stderr_fd, sync_fd, watch_fd, lease_fd, root_fd;
  int egress_fd;  // network kNetworkEgress only; -1 otherwise
  uint32_t backstop_s;
  uint8_t network;  // kNetworkHost, kNetworkOwn, kNetworkEgress
  uint8_t landlock;  // 0 (off) or kLandlockAuto
  uint8_t end_note;  // 1: the tool's fd 3 is a pipe to pid 1 (init.cc, "end note")
  const char* staging;
  const char* hostname;
  const char* workdir;
  uint32_t tool_uid, tool_gid;
  uint64_t file_size, open_files, pids, cpu_time_ms;
  const char** argv;  // NULL-terminated
  const char** envp;  // NULL-terminated
  Filter tool_filter, init_filter;
  Step* steps;
  uint32_t nsteps;
};

class PlanCursor {
 public:
  PlanCursor(const char* p, size_t n) : p_(p), end_(p + n) {}
  bool ok() const { return ok_; }
  bool done() const { return ok_ && p_ == end_; }
  uint8_t u8() { return static_cast<uint8_t>(get(1)); }
  uint32_t u32() { return static_cast<uint32_t>(get(4)); }
  uint64_t u64() { return get(8); }
  int i32() { return static_cast<int>(static_cast<int32_t>(u32())); }
  // A cstr; `text`: no NUL inside. Its length goes to *len when asked.
  const char* cstr(bool text, size_t* len = nullptr) {
    uint32_t n = u32();
    if (!ok_ || n >= static_cast<size_t>(end_ - p_) || p_[n] != '\0' || (text && memchr(p_, '\0', n) != nullptr)) {
      ok_ = false;
      return "";
    }
    const char* s = p_;
    p_ += n + 1;
    if (len) *len = n;
    return s;
  }
  // `count` of at most `max`, each taking at least `min_bytes` of what is left.
  uint32_t count(uint32_t max, size_t min_bytes) {
    uint32_t n = u32();
    if (!ok_ || n > max || n > static_cast<size_t>(end_ - p_) / min_bytes) {
      ok_ = false;
      return 0;
    }
    return n;
  }

 private:
  uint64_t get(int bytes) {
    if (!ok_ || end_ - p_ < bytes) {
      ok_ = false;
      return 0;
    }
    uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(static_cast<unsigned char>(p_[i])) << (8 * i);
    p_ += bytes;
    return v;
  }
  const char* p_;
  const char* end_;
  bool ok_ = true;
};

inline bool read_filter(PlanCursor& c, Filter* f) {
  size_t n = 0;
  const char* b = c.cstr(false, &n);
  if (!c.ok() || n == 0 || n % sizeof(sock_filter) != 0 || n / sizeof(sock_filter) > BPF_MAXINSNS) return false;
  f->insns = static_cast<sock_filter*>(malloc(n));
  if (f->insns == nullptr) return false;
  memcpy(f->insns, b, n);
  f->len = static_cast<unsigned short>(n / sizeof(sock_filter));
  return true;
}

inline const char** read_texts(PlanCursor& c, uint32_t max) {
  uint32_t n = c.count(max, 5);
  const char** v = static_cast<const char**>(calloc(n + 1, sizeof(char*)));
  if (v == nullptr) return nullptr;
  for (uint32_t i = 0; i < n && c.ok(); ++i) v[i] = c.cstr(true);
  return v;
}

// False when the plan is malformed (or memory ran out): init then reports
// Stage::Plan and ends.
inline bool read_plan(const char* buf, size_t len, Plan* p) {
  PlanCursor c(buf, len);
  if (c.u32() != kPlanMagic) return false;
  int* fds[] = {&p->report_fd, &p->stdin_fd, &p->stdout_fd, &p->stderr_fd,
                &p->sync_fd,   &p->watch_fd, &p->lease_fd,  &p->root_fd};
  for (int* fd : fds) {
    *fd = c.i32();
    if (*fd < 0) return false;
  }
  p->egress_fd = c.i32();
  p->backstop_s = c.u32();
  p->network = c.u8();
  p->landlock = c.u8();
  p->end_note = c.u8();
  p->staging = c.cstr(true);
  p->hostname = c.cstr(true);
  p->workdir = c.cstr(true);
  p->tool_uid = c.u32();
  p->tool_gid = c.u32();
  p->file_size = c.u64();
  p->open_files = c.u64();
  p->pids = c.u64();
  p->cpu_time_ms = c.u64();
  // The tool is never uid or gid 0 (pid 1's) or the overflow ids; the
  // backstop is at most about half a year, as the engine computes it.
  // An egress socket exactly when the network is egress.
  if (!c.ok() || p->network > kNetworkEgress || p->landlock > kLandlockAuto || p->end_note > 1 || (p->network == kNetworkEgress) != (p->egress_fd >= 0) ||
      p->egress_fd < -1 || p->staging[0] != '/' || p->workdir[0] != '/' || p->hostname[0] == '\0' ||
      p->tool_uid == 0 || p->tool_uid >= 65534 || p->tool_gid == 0 || p->tool_gid >= 65534 || p->backstop_s > (1u << 24))
    return false;
  p->argv = read_texts(c, 1u << 20);
  p->envp = read_texts(c, 1u << 20);
  if (!c.ok() || p->argv == nullptr || p->envp == nullptr || p->argv[0] == nullptr || p->argv[0][0] == '\0') return false;
  if (!read_filter(c, &p->tool_filter) || !read_filter(c, &p->init_filter)) return false;
  p->nsteps = c.count(1u << 16, 23);
  p->steps = static_cast<Step*>(calloc(p->nsteps + 1, sizeof(Step)));
  if (p->steps == nullptr) return false;
  for (uint32_t i = 0; i < p->nsteps && c.ok(); ++i) {
    Step& s = p->steps[i];
    const uint8_t op = c.u8(), stage = c.u8(), flags = c.u8();
    if (op > kOpLast || stage >= static_cast<uint8_t>(Stage::kCount) ||
        flags > (kStepDir | kStepOptional | kStepWritable | kStepNoExec))
      return false;
    s.op = static_cast<Op>(op);
    s.stage = static_cast<Stage>(stage);
    s.dir = flags & kStepDir;
    s.optional = flags & kStepOptional;
    s.writable = flags & kStepWritable;
    s.noexec = flags & kStepNoExec;
    s.mode = c.u32();
    s.fd = c.i32();
    s.err = c.i32();
    s.path = c.cstr(true);
    s.source = c.cstr(true);
    s.data = c.cstr(false, &s.len);
    if (c.ok() && (s.path[0] != '/' || (s.op == Op::kCopyFile && s.fd < 3))) return false;
  }
  return c.done();
}

// What read_plan allocated, also after it failed (for the unit tests: init
// keeps its plan until it exits).
inline void release_plan(Plan* p) {
  free(p->argv);
  free(p->envp);
  free(p->tool_filter.insns);
  free(p->init_filter.insns);
  free(p->steps);
  *p = Plan{};
}

}  // namespace tsb::isolate::init
