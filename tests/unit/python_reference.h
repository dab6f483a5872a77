// Cross-checks against the reference interpreter: unit tests that compare
// our output with what CPython computes run /usr/bin/python3. Without it
// they skip loudly, or fail when TOOLSANDBOXD_TESTS_MUST_RUN names python.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstring>
#include <stdexcept>
#include <string>

namespace tsb::testing {

inline constexpr const char* kPython = "/usr/bin/python3";

inline bool python_must_run() {
  const char* v = std::getenv("TOOLSANDBOXD_TESTS_MUST_RUN");
  return v != nullptr && std::strstr(v, "python") != nullptr;
}

#define TSB_REQUIRE_PYTHON()                                                                            \
  do {                                                                                                  \
    if (access(::tsb::testing::kPython, X_OK) != 0) {                                                   \
      if (::tsb::testing::python_must_run())                                                            \
        FAIL() << ::tsb::testing::kPython << " is required (TOOLSANDBOXD_TESTS_MUST_RUN)";               \
      GTEST_SKIP() << ::tsb::testing::kPython << " not found; cross-check against CPython skipped";      \
    }                                                                                                   \
  } while (0)

// A temporary file holding `content`, removed on destruction.
class TempFile {
 public:
  explicit TempFile(const std::string& content) {
    char tmpl[] = "/tmp/tsb-unit-test-XXXXXX";
    const int fd = mkstemp(tmpl);
    if (fd < 0) throw std::runtime_error("mkstemp failed");
    path_ = tmpl;
    std::size_t off = 0;
    while (off < content.size()) {
      const ssize_t n = write(fd, content.data() + off, content.size() - off);
      if (n <= 0) break;
      off += static_cast<std::size_t>(n);
    }
    close(fd);
  }
  ~TempFile() { unlink(path_.c_str()); }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace tsb::testing
