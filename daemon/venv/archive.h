// The venv archive: how a venv built inside a sandbox reaches the cache.
//
// A build sandbox makes its venv in a tmpfs of its own and writes it to
// stdout in this format (isolate/runner/toolsandbox_venv_builder.py makes
// it); the front end extracts it, as it reads, into a directory of its own.
// The writer is a sandbox that ran pip and the packages' code, so the
// stream is hostile input: every path is checked, nothing is ever
// followed, overwritten or made writable, and the sizes are capped.
//
//   archive := "TSBVENV1" record* end
//   record  := kind:u8 path_len:u16 path mode:u16 size:u64 payload[size]
//              (integers big-endian)
//   kind    'd' a directory (size 0), 'f' a regular file (payload: its
//           bytes), 'l' a symbolic link (payload: its target, at most 4096
//           bytes, no NUL), 'm' the manifest (empty path; payload: JSON
//           text, at most once); end := 'e', empty path, mode 0, size 0
//   path    relative: at most 64 components of 1 to 255 bytes joined by
//           "/", none "." or "..", no NUL, at most 4096 bytes; its parent a directory of
//           an earlier record (or the root), and no path twice
//   mode    only the execute bits count: a file becomes 0444, or 0555 when
//           the mode has any execute bit; a directory 0555 once the
//           archive is complete. Nothing is writable, setuid or setgid.
//
// What decides which interpreter starts and where its standard library
// comes from is never taken from the archive (reserved_path): the runner's
// parent process, which holds the run's nonce, is started from
// /venv/bin/python3 (-I -S), and a pyvenv.cfg, an interpreter link or a
// ._pth file written by the build would choose its code. finish() writes
// them itself, pointing at the host's interpreter.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "isolate/base/result.h"
#include "isolate/base/unique_fd.h"

namespace tsb::venv {

inline constexpr std::string_view kArchiveMagic = "TSBVENV1";

struct ArchiveLimits {
  std::uint64_t max_file_bytes = 1ull << 30;  // file payloads together
  std::uint64_t max_entries = 200000;         // directories, files and links
  std::uint64_t max_meta_bytes = 32u << 20;   // paths and link targets together
  std::size_t max_manifest = 1u << 20;
};

// Whether `name` is one of a venv's interpreter names: python, python3 or
// python3.N (what the daemon links in bin/, and a policy with "packages"
// may name as its interpreter).
inline bool is_python_name(std::string_view n) {
  if (n == "python" || n == "python3") return true;
  if (!n.starts_with("python3.") || n.size() == 8) return false;
  return n.substr(8).find_first_not_of("0123456789") == std::string_view::npos;
}

// Whether the archive may not hold `path`: pyvenv.cfg (at the root or in
// bin/), lib64, and in bin/ python, python3, python3.N and any *._pth.
bool reserved_path(std::string_view path);

// The interpreter a venv's frame points at: `python` (an absolute path, as
// the sandbox sees it) and its "X.Y" version.
struct Interpreter {
  std::string python = "/usr/bin/python3";
  std::string version;  // "3.11"; empty: no python3.N link, no version line
};

class Extractor {
 public:
  // Extracts into `root`, an empty directory the caller made and owns.
  Extractor(UniqueFd root, ArchiveLimits limits);
  Extractor(const Extractor&) = delete;
  Extractor& operator=(const Extractor&) = delete;

  // The next bytes of the stream, in any cut. The first error is final:
  // every later call returns it too.
  Status feed(std::string_view chunk);
  // After the last byte: the end record must have been seen. Writes the
  // venv's frame for `py` (pyvenv.cfg; bin/python3 -> py.python,
  // bin/python and bin/python3.N -> python3; lib64 -> lib) and makes every
  // directory read-only (0555).
  Status finish(const Interpreter& py);
  // After the last byte, for a tree with no interpreter frame (a
  // TypeScript tool's node_modules): the end record must have been seen;
  // every directory made read-only (0555).
  Status finish_tree();

  std::uint64_t file_bytes() const noexcept { return file_bytes_; }
  std::uint64_t entries() const noexcept { return entries_; }
  const std::string& manifest() const noexcept { return manifest_; }
  const ArchiveLimits& limits() const noexcept { return limits_; }

 private:
  enum class State { Magic, Header, Payload, Done };
  Status fail(std::string why);
  Status header(std::string_view& in);
  Status payload(std::string_view& in);
  Status finish_entry();

  UniqueFd root_;
  ArchiveLimits limits_;
  State state_ = State::Magic;
  std::string pending_;  // a header (or the magic) cut between chunks
  std::string error_;
  // The entry being read.
  char kind_ = 0;
  std::string path_;
  std::uint16_t mode_ = 0;
  std::uint64_t left_ = 0;
  UniqueFd file_;
  UniqueFd parent_;
  std::string name_;
  std::string small_;  // a link's target or the manifest, as it arrives
  std::uint64_t file_bytes_ = 0, entries_ = 0, meta_bytes_ = 0;
  bool have_manifest_ = false;
  std::string manifest_;
};

// Removes `name` in `parent` and everything below it, following no
// symbolic link and making the front end's own read-only directories
// writable on the way. A missing `name` is not an error; a `name` with a
// "/", ".", ".." or "" is.
Status remove_tree(int parent, const std::string& name);

}  // namespace tsb::venv
