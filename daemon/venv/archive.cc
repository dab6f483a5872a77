#include "daemon/venv/archive.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "daemon/common/quote.h"
#include <string>
#include <vector>

namespace tsb::venv {

namespace {

constexpr std::size_t kHeaderFixed = 1 + 2;     // kind, path_len
constexpr std::size_t kHeaderTail = 2 + 8;      // mode, size
constexpr std::size_t kMaxPath = 4096;
constexpr std::size_t kMaxComponent = 255;
constexpr std::size_t kMaxLink = 4096;
constexpr std::size_t kMaxDepth = 64;

std::uint64_t be(std::string_view b) {
  std::uint64_t v = 0;
  for (unsigned char c : b) v = v << 8 | c;
  return v;
}

// Why `path` is not a relative path of plain components, or "".
std::string path_problem(std::string_view path) {
  if (path.empty()) return "an empty path";
  if (path.size() > kMaxPath) return "a path longer than 4096 bytes";
  std::size_t start = 0, depth = 0;
  for (;;) {
    if (++depth > kMaxDepth) return "a path deeper than 64 components";
    const std::size_t slash = path.find('/', start);
    const std::string_view c = path.substr(start, slash == std::string_view::npos ? std::string_view::npos : slash - start);
    if (c.empty()) return "an empty path component (a leading, doubled or trailing \"/\")";
    if (c == "." || c == "..") return "a \".\" or \"..\" component";
    if (c.size() > kMaxComponent) return "a path component longer than 255 bytes";
    if (c.find('\0') != std::string_view::npos) return "a NUL byte in a path";
    if (slash == std::string_view::npos) return "";
    start = slash + 1;
  }
}

// The directory `dir` below `root` (root itself for ""), reached without
// following any symbolic link or leaving root.
int open_beneath(int root, const std::string& dir) {
  if (dir.empty()) return ::fcntl(root, F_DUPFD_CLOEXEC, 3);
  struct open_how how {};
  how.flags = O_PATH | O_DIRECTORY | O_CLOEXEC;
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV;
  return static_cast<int>(::syscall(SYS_openat2, root, dir.c_str(), &how, sizeof how));
}

Status write_all(int fd, std::string_view b) {
  while (!b.empty()) {
    const ssize_t n = ::write(fd, b.data(), b.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Error::from_errno("writing a venv file");
    b.remove_prefix(static_cast<std::size_t>(n));
  }
  return {};
}

// Makes `dir` and every directory below it read-only (0555), depth first.
// Only the extractor made anything here (the staging directory is the
// front end's, 0700), so what it finds is what the archive made; links
// are not followed.
Status make_read_only(int dir, unsigned depth) {
  if (depth > kMaxDepth + 1) return Error::invalid("a directory deeper than the archive allows");
  std::vector<std::string> subdirs;
  {
    DIR* d = ::fdopendir(::fcntl(dir, F_DUPFD_CLOEXEC, 3));
    if (!d) return Error::from_errno("reading a venv directory");
    while (const dirent* e = ::readdir(d)) {
      const std::string_view n = e->d_name;
      if (n == "." || n == "..") continue;
      struct stat st {};
      if (e->d_type == DT_DIR || (e->d_type == DT_UNKNOWN && ::fstatat(dir, e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
                                  S_ISDIR(st.st_mode)))
        subdirs.emplace_back(n);
    }
    ::closedir(d);
  }
  for (const auto& n : subdirs) {
    const UniqueFd sub(::openat(dir, n.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!sub) return Error::from_errno("opening " + n);
    if (auto s = make_read_only(sub.get(), depth + 1); !s.ok()) return Error::invalid(n + "/" + s.error().message);
  }
  if (::fchmod(dir, 0555) != 0) return Error::from_errno("making a directory read-only");
  return {};
}

}  // namespace

bool reserved_path(std::string_view path) {
  if (path == "pyvenv.cfg" || path == "lib64") return true;
  if (!path.starts_with("bin/")) return false;
  const std::string_view n = path.substr(4);
  if (n.find('/') != std::string_view::npos) return false;
  return n == "pyvenv.cfg" || is_python_name(n) || n.ends_with("._pth");
}

Extractor::Extractor(UniqueFd root, ArchiveLimits limits) : root_(std::move(root)), limits_(limits) {}

// Every refusal of the extractor comes here, and many name a path the
// build wrote (a package's file names, or names a process left behind
// in /venv chose): escaped once, here, for every message that carries
// it (the build's error its client sees, the daemon's log, the command
// line), so a name cannot add a line or start a terminal sequence.
Status Extractor::fail(std::string why) {
  if (error_.empty()) error_ = "venv archive: " + escaped(why);
  file_.reset();
  return Error::invalid(error_, EPROTO);
}

Status Extractor::feed(std::string_view in) {
  if (!error_.empty()) return Error::invalid(error_, EPROTO);
  while (!in.empty()) {
    switch (state_) {
      case State::Magic: {
        const std::size_t want = kArchiveMagic.size() - pending_.size();
        pending_.append(in.substr(0, want));
        in.remove_prefix(std::min(want, in.size()));
        if (pending_.size() < kArchiveMagic.size()) return {};
        if (pending_ != kArchiveMagic) return fail("not a venv archive (no TSBVENV1 at its start)");
        pending_.clear();
        state_ = State::Header;
        break;
      }
      case State::Header:
        if (auto s = header(in); !s.ok()) return s;
        break;
      case State::Payload:
        if (auto s = payload(in); !s.ok()) return s;
        break;
      case State::Done:
        return fail("bytes after the end record");
    }
  }
  return {};
}

Status Extractor::header(std::string_view& in) {
  // Gather the fixed part, then the path and the tail, across chunks.
  auto gather = [&](std::size_t total) {
    const std::size_t want = total > pending_.size() ? total - pending_.size() : 0;
    const std::size_t take = std::min(want, in.size());
    pending_.append(in.substr(0, take));
    in.remove_prefix(take);
    return pending_.size() >= total;
  };
  if (!gather(kHeaderFixed)) return {};
  const std::size_t path_len = be(std::string_view(pending_).substr(1, 2));
  if (path_len > kMaxPath) return fail("a path longer than 4096 bytes");
  if (!gather(kHeaderFixed + path_len + kHeaderTail)) return {};
  kind_ = pending_[0];
  path_ = pending_.substr(kHeaderFixed, path_len);
  mode_ = static_cast<std::uint16_t>(be(std::string_view(pending_).substr(kHeaderFixed + path_len, 2)));
  left_ = be(std::string_view(pending_).substr(kHeaderFixed + path_len + 2, 8));
  pending_.clear();
  small_.clear();

  if (kind_ == 'e') {
    if (!path_.empty() || mode_ != 0 || left_ != 0) return fail("a malformed end record");
    state_ = State::Done;
    return {};
  }
  if (kind_ == 'm') {
    if (!path_.empty()) return fail("a manifest with a path");
    if (have_manifest_) return fail("a second manifest");
    if (left_ > limits_.max_manifest) return fail("a manifest over " + std::to_string(limits_.max_manifest) + " bytes");
    have_manifest_ = true;
    state_ = State::Payload;
    return left_ == 0 ? finish_entry() : Status{};
  }
  if (kind_ != 'd' && kind_ != 'f' && kind_ != 'l') return fail("an unknown record kind");
  if (auto why = path_problem(path_); !why.empty()) return fail(why);
  if (reserved_path(path_)) return fail(path_ + " is the daemon's to write (it decides which interpreter starts)");
  if (kind_ == 'l' && left_ > kMaxLink) return fail("a link target longer than 4096 bytes");
  meta_bytes_ += path_.size() + (kind_ == 'l' ? left_ : 0);
  if (meta_bytes_ > limits_.max_meta_bytes)
    return fail("more than " + std::to_string(limits_.max_meta_bytes) + " bytes of paths and link targets");
  if (++entries_ > limits_.max_entries) return fail("more than " + std::to_string(limits_.max_entries) + " entries");
  const std::size_t slash = path_.rfind('/');
  name_ = slash == std::string::npos ? path_ : path_.substr(slash + 1);
  parent_.reset(open_beneath(root_.get(), slash == std::string::npos ? std::string() : path_.substr(0, slash)));
  if (!parent_) return fail("the parent of " + path_ + " is not a directory of the archive");

  if (kind_ == 'd') {
    if (left_ != 0) return fail("a directory with content");
    if (::mkdirat(parent_.get(), name_.c_str(), 0700) != 0)
      return fail(errno == EEXIST ? path_ + " appears twice" : "cannot make " + path_ + ": " + std::strerror(errno));
    return {};
  }
  if (kind_ == 'f') {
    if (left_ > limits_.max_file_bytes - file_bytes_)
      return fail("more than " + std::to_string(limits_.max_file_bytes) + " bytes of files");
    file_.reset(::openat(parent_.get(), name_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (!file_) return fail(errno == EEXIST ? path_ + " appears twice" : "cannot create " + path_ + ": " + std::strerror(errno));
    file_bytes_ += left_;
  }
  state_ = State::Payload;
  return left_ == 0 ? finish_entry() : Status{};
}

Status Extractor::payload(std::string_view& in) {
  const std::size_t take = static_cast<std::size_t>(std::min<std::uint64_t>(left_, in.size()));
  const std::string_view part = in.substr(0, take);
  in.remove_prefix(take);
  left_ -= take;
  if (kind_ == 'f') {
    if (auto s = write_all(file_.get(), part); !s.ok()) return fail(path_ + ": " + s.error().message);
  } else {
    small_.append(part);
  }
  return left_ == 0 ? finish_entry() : Status{};
}

Status Extractor::finish_entry() {
  state_ = State::Header;
  if (kind_ == 'm') {
    manifest_ = std::move(small_);
    return {};
  }
  if (kind_ == 'l') {
    if (small_.empty() || small_.find('\0') != std::string::npos) return fail("a link with an empty target or a NUL byte");
    if (::symlinkat(small_.c_str(), parent_.get(), name_.c_str()) != 0)
      return fail(errno == EEXIST ? path_ + " appears twice" : "cannot make the link " + path_ + ": " + std::strerror(errno));
    return {};
  }
  // A file: read-only, executable when the writer said so.
  const mode_t mode = (mode_ & 0111) ? 0555 : 0444;
  if (::fchmod(file_.get(), mode) != 0) return fail("cannot set the mode of " + path_ + ": " + std::strerror(errno));
  if (::close(file_.release()) != 0) return fail("cannot write " + path_ + ": " + std::strerror(errno));
  return {};
}

Status Extractor::finish_tree() {
  if (!error_.empty()) return Error::invalid(error_, EPROTO);
  if (state_ != State::Done) return fail("the archive ends before its end record");
  if (auto s = make_read_only(root_.get(), 0); !s.ok()) return fail("cannot make the tree read-only: " + s.error().message);
  return {};
}

Status Extractor::finish(const Interpreter& py) {
  if (!error_.empty()) return Error::invalid(error_, EPROTO);
  if (state_ != State::Done) return fail("the archive ends before its end record");
  // The frame: bin/ may be missing from the archive, nothing else of it
  // can be there (reserved_path).
  if (py.python.empty() || py.python[0] != '/' || py.python.find('\n') != std::string::npos)
    return fail("no interpreter to point the venv at");
  if (!py.version.empty() && !(py.version.starts_with("3.") && is_python_name("python" + py.version)))
    return fail("a malformed interpreter version");
  if (::mkdirat(root_.get(), "bin", 0700) != 0 && errno != EEXIST) return fail(std::string("cannot make bin: ") + std::strerror(errno));
  const UniqueFd bin(::openat(root_.get(), "bin", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!bin) return fail("bin is not a directory");
  const std::size_t slash = py.python.rfind('/');
  std::string cfg = "home = " + (slash == 0 ? std::string("/") : py.python.substr(0, slash)) +
                    "\ninclude-system-site-packages = false\n";
  if (!py.version.empty()) cfg += "version = " + py.version + "\n";
  {
    UniqueFd f(::openat(root_.get(), "pyvenv.cfg", O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0444));
    if (!f) return fail(std::string("cannot create pyvenv.cfg: ") + std::strerror(errno));
    if (auto s = write_all(f.get(), cfg); !s.ok()) return fail("pyvenv.cfg: " + s.error().message);
    if (::fchmod(f.get(), 0444) != 0) return fail(std::string("cannot set the mode of pyvenv.cfg: ") + std::strerror(errno));
  }
  struct Link {
    int dir;
    std::string name, target;
  };
  std::vector<Link> links = {{bin.get(), "python3", py.python}, {bin.get(), "python", "python3"}, {root_.get(), "lib64", "lib"}};
  if (!py.version.empty()) links.push_back({bin.get(), "python" + py.version, "python3"});
  for (const auto& l : links)
    if (::symlinkat(l.target.c_str(), l.dir, l.name.c_str()) != 0)
      return fail("cannot make the link " + l.name + ": " + std::strerror(errno));
  if (auto s = make_read_only(root_.get(), 0); !s.ok()) return fail("cannot make the venv read-only: " + s.error().message);
  return {};
}

Status remove_tree(int parent, const std::string& name) {
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos)
    return Error::invalid("remove_tree takes a name, not a path: \"" + name + "\"");
  struct stat st {};
  if (::fstatat(parent, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0)
    return errno == ENOENT ? Status{} : Error::from_errno("stat " + name);
  if (!S_ISDIR(st.st_mode)) {
    if (::unlinkat(parent, name.c_str(), 0) != 0 && errno != ENOENT) return Error::from_errno("remove " + name);
    return {};
  }
  UniqueFd dir(::openat(parent, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!dir) return Error::from_errno("open " + name);
  if ((st.st_mode & 0700) != 0700 && ::fchmod(dir.get(), 0700) != 0) return Error::from_errno("make " + name + " writable");
  // Names first, then removal: a directory stream is not read while it changes.
  std::vector<std::string> names;
  {
    DIR* d = ::fdopendir(::fcntl(dir.get(), F_DUPFD_CLOEXEC, 3));
    if (!d) return Error::from_errno("read " + name);
    while (const dirent* e = ::readdir(d))
      if (std::string_view(e->d_name) != "." && std::string_view(e->d_name) != "..") names.emplace_back(e->d_name);
    ::closedir(d);
  }
  for (const auto& n : names)
    if (auto s = remove_tree(dir.get(), n); !s.ok()) return s;
  if (::unlinkat(parent, name.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT) return Error::from_errno("remove " + name);
  return {};
}

}  // namespace tsb::venv
