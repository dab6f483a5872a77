// The one way files are read: bounded, checked on the opened descriptor
// (so the file checked is the file read), never blocking on a FIFO planted
// at the path. Header-only (base).
//
//   read_file(path, {.max_bytes = 4 << 20, .regular_only = true,
//                    .check = root_owned_unless_unprivileged})
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <functional>
#include <string>

#include "isolate/base/result.h"
#include "isolate/base/unique_fd.h"

namespace tsb {

struct ReadRules {
  // Past this the read fails with EFBIG (checked against the size fstat
  // gives and again while reading: /proc and /sys files report 0 or 4096).
  std::size_t max_bytes = 1u << 20;
  // Refuse anything but a regular file (a FIFO, a device, a directory).
  bool regular_only = false;
  // Refuse a symbolic link at the last component.
  bool no_follow = false;
  // Further checks on the opened file (owner, mode); an error refuses it.
  std::function<Status(const std::string& path, const struct stat&)> check = nullptr;
};

// "0600": a file's permission bits for messages.
inline std::string mode_string(mode_t mode) {
  char b[8];
  std::snprintf(b, sizeof b, "%04o", static_cast<unsigned>(mode & 07777));
  return b;
}

// The same rules for a descriptor opened elsewhere (by another process,
// passed over a socket); `path` names it in messages and for `check`. Reads
// from the descriptor's current offset.
inline Result<std::string> read_opened_file(int fd, const std::string& path, const ReadRules& rules = {}) {
  struct stat st{};
  if (rules.regular_only || rules.check) {
    if (::fstat(fd, &st) != 0) return Error::from_errno("fstat '" + path + "'");
    if (rules.regular_only && !S_ISREG(st.st_mode)) return Error::invalid("'" + path + "' is not a regular file");
    // context: a check's refusal names the file (ReadRules::check)
    if (auto ok = rules.check ? rules.check(path, st) : Status{}; !ok.ok()) return std::move(ok).error();
  }
  auto too_large = [&] {
    return Error::invalid("'" + path + "' is larger than " + std::to_string(rules.max_bytes) + " bytes", EFBIG);
  };
  if (S_ISREG(st.st_mode) && static_cast<std::size_t>(st.st_size) > rules.max_bytes) return too_large();
  std::string out;
  char buf[16384];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Error::from_errno("read '" + path + "'");
    }
    if (n == 0) return out;
    if (out.size() + static_cast<std::size_t>(n) > rules.max_bytes) return too_large();
    out.append(buf, static_cast<std::size_t>(n));
  }
}

inline Result<std::string> read_file(const std::string& path, const ReadRules& rules = {}) {
  // O_NONBLOCK: opening a FIFO does not wait for a writer, and reading one
  // that has a writer fails with EAGAIN instead of waiting (a FIFO is
  // refused outright when only regular files are allowed). Regular files,
  // /proc and cgroup files ignore it.
  const int flags = O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK | (rules.no_follow ? O_NOFOLLOW : 0);
  UniqueFd fd(::open(path.c_str(), flags));
  if (!fd) return Error::from_errno("open '" + path + "'");
  return read_opened_file(fd.get(), path, rules);
}

}  // namespace tsb
