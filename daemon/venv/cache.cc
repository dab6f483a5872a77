#include "daemon/venv/cache.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <set>
#include <cerrno>
#include <cstdio>
#include <utility>

#include "daemon/venv/manifest.h"
#include "isolate/base/random.h"

namespace tsb::venv {
namespace {

using nlohmann::json;
constexpr std::uint64_t kBlock = 4096;  // what an entry costs besides its bytes, roughly

Result<std::string> read_at(int dir, const std::string& name, std::size_t max) {
  UniqueFd f(::openat(dir, name.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK));
  if (!f) return Error::from_errno(name);
  struct stat st{};
  if (::fstat(f.get(), &st) != 0 || !S_ISREG(st.st_mode)) return Error::invalid(name + ": not a regular file");
  if (static_cast<std::uint64_t>(st.st_size) > max) return Error::invalid(name + ": too large");
  std::string out(static_cast<std::size_t>(st.st_size), '\0');
  std::size_t off = 0;
  while (off < out.size()) {
    ssize_t n = ::read(f.get(), out.data() + off, out.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    off += static_cast<std::size_t>(n);
  }
  out.resize(off);
  return out;
}

// Manifests are 0644: a removal's write lock needs a descriptor open for
// writing (the directory is the owner's alone, 0755).
Status write_new(int dir, const std::string& name, const std::string& data) {
  UniqueFd f(::openat(dir, name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644));
  if (!f) return Error::from_errno("creating " + name);
  if (::fchmod(f.get(), 0644) != 0) return Error::from_errno("chmod " + name);  // whatever the umask
  std::size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::write(f.get(), data.data() + off, data.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Error::from_errno("writing " + name);
    off += static_cast<std::size_t>(n);
  }
  return {};
}

// An open file description lock on all of `fd`: F_RDLCK (a hold),
// F_WRLCK (a removal); false when another description holds a conflicting
// one.
bool lock(int fd, short type) {
  struct flock l{};
  l.l_type = type;
  l.l_whence = SEEK_SET;
  return ::fcntl(fd, F_OFD_SETLK, &l) == 0;
}

// Out of the way first (a name no run can ask for), then removed.
Status remove_venv_dir(int dir, const std::string& name) {
  const std::string gone = ".tmp-gone-" + random_hex(8);
  if (::renameat(dir, name.c_str(), dir, gone.c_str()) != 0) {
    if (errno == ENOENT) return {};
    return Error::from_errno("renaming " + name);
  }
  return remove_tree(dir, gone);
}

}  // namespace

std::string kind_of(const json& m) {
  if (m.is_object())
    if (auto k = m.find("kind"); k != m.end() && k->is_string() && *k == kNodeModulesKind) return std::string(kNodeModulesKind);
  return std::string(kVenvKind);
}

bool is_key(std::string_view s) {
  return s.size() == 64 && s.find_first_not_of("0123456789abcdef") == std::string_view::npos;
}

Result<std::unique_ptr<Cache>> Cache::open(const std::string& dir, std::uint64_t max_bytes, bool owner) {
  UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW));
  if (!fd) return Error::from_errno("the venv cache " + dir);
  struct stat st{};
  if (::fstat(fd.get(), &st) != 0) return Error::from_errno("the venv cache " + dir);
  if (st.st_uid != ::geteuid())
    return Error::invalid("the venv cache " + dir + " is owned by uid " + std::to_string(st.st_uid) + ", not by this daemon's uid " +
                          std::to_string(::geteuid()) + " (systemd-tmpfiles --create makes it)", EPERM);
  if (st.st_mode & (S_IWGRP | S_IWOTH)) return Error::invalid("the venv cache " + dir + " is writable by others", EPERM);
  std::unique_ptr<Cache> c(new Cache(dir, std::move(fd), max_bytes));
  c->owner_ = owner;
  TSB_TRY(c->scan(), "the venv cache " + dir);
  if (owner) c->evict();
  return c;
}

Status Cache::scan() {
  const int dfd = ::dup(fd_.get());
  if (dfd < 0) return Error::from_errno("dup");
  DIR* d = ::fdopendir(dfd);
  if (!d) {
    ::close(dfd);
    return Error::from_errno("reading the directory");
  }
  std::vector<std::string> names;
  while (dirent* e = ::readdir(d)) {
    std::string n = e->d_name;
    if (n != "." && n != "..") names.push_back(std::move(n));
  }
  ::closedir(d);
  std::vector<std::string> leftovers;
  for (const std::string& n : names) {
    if (n.starts_with(".tmp-")) {
      leftovers.push_back(n);
      continue;
    }
    if (!is_key(n)) continue;  // not ours: left alone
    struct stat st{};
    auto m = read_at(fd_.get(), n + ".json", kMaxStoredManifest);
    auto read = m.ok() ? read_stored_manifest(*m) : Result<json>(m.error());
    const json doc = read.ok() ? std::move(read).value() : json();
    if (::fstatat(fd_.get(), n.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISDIR(st.st_mode) || !doc.is_object()) {
      leftovers.push_back(n);  // a crash between the two renames, or damaged
      continue;
    }
    CacheEntry ce;
    ce.key = n;
    const json& b = doc.contains("bytes") ? doc["bytes"] : json();
    ce.bytes = b.is_number_unsigned() ? b.get<std::uint64_t>() : 0;
    struct stat ms{};
    if (::fstatat(fd_.get(), (n + ".json").c_str(), &ms, AT_SYMLINK_NOFOLLOW) == 0)
      ce.last_used = std::chrono::system_clock::time_point(std::chrono::seconds(ms.st_mtim.tv_sec));
    total_ += ce.bytes;
    entries_.emplace(n, std::move(ce));
  }
  if (!owner_) return {};  // leftovers are the front end's to remove
  for (const std::string& n : names) {
    // A manifest whose venv is gone.
    if (n.size() == 69 && n.ends_with(".json") && is_key(n.substr(0, 64)) && !entries_.contains(n.substr(0, 64)))
      (void)::unlinkat(fd_.get(), n.c_str(), 0);
  }
  for (const std::string& n : leftovers) (void)remove_tree(fd_.get(), n);
  return {};
}

void Cache::touch(const std::string& key) {
  auto it = entries_.find(key);
  if (it == entries_.end()) return;
  it->second.last_used = std::chrono::system_clock::now();
  (void)::utimensat(fd_.get(), (key + ".json").c_str(), nullptr, AT_SYMLINK_NOFOLLOW);
}

Cache::Hold& Cache::Hold::operator=(Hold&& o) noexcept {
  if (this != &o) {
    release();
    c_ = std::exchange(o.c_, nullptr);
    key_ = std::move(o.key_);
  }
  return *this;
}

void Cache::Hold::release() {
  if (!c_) return;
  auto it = c_->entries_.find(key_);
  if (it != c_->entries_.end() && it->second.in_use > 0 && --it->second.in_use == 0) it->second.lock.reset();
  c_ = nullptr;
}

Cache::Hold Cache::hold(const std::string& key) {
  auto it = entries_.find(key);
  if (it == entries_.end()) return {};
  if (it->second.in_use == 0) {
    // The first hold read-locks the manifest: a removal by another process
    // (which write-locks it first) is then refused. One that came first
    // leaves a manifest that is write-locked or unlinked: then the venv is
    // gone. (Only removals take write locks; asking takes none.)
    auto fd = std::make_shared<UniqueFd>(::openat(fd_.get(), (key + ".json").c_str(),
                                                  O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK));
    struct stat st{};
    if (!*fd || !lock(fd->get(), F_RDLCK) || ::fstat(fd->get(), &st) != 0 || st.st_nlink == 0) {
      total_ -= std::min(total_, it->second.bytes);
      entries_.erase(it);
      return {};
    }
    it->second.lock = std::move(fd);
  }
  ++it->second.in_use;
  touch(key);
  return Hold(this, key);
}

Cache::Staging::~Staging() {
  if (c_ && !published_) {
    extractor_.reset();
    (void)remove_tree(c_->fd_.get(), name_);
  }
}

Result<std::unique_ptr<Cache::Staging>> Cache::stage(const std::string& key, const ArchiveLimits& limits) {
  if (!is_key(key)) return Error::invalid("not a venv key");
  std::unique_ptr<Staging> s(new Staging());
  s->c_ = this;
  s->key_ = key;
  s->name_ = ".tmp-" + key.substr(0, 16) + "-" + random_hex(8);
  if (::mkdirat(fd_.get(), s->name_.c_str(), 0700) != 0) {
    s->c_ = nullptr;
    return Error::from_errno("making " + s->name_);
  }
  UniqueFd root(::openat(fd_.get(), s->name_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW));
  if (!root) return Error::from_errno("opening " + s->name_);
  s->extractor_ = std::make_unique<Extractor>(std::move(root), limits);
  return s;
}

Status Cache::publish(Staging& s, const json& extra, const Interpreter& py) {
  if (!s.extractor_) return Error::invalid("venv " + s.key_ + " is already published");
  TSB_TRY(s.extractor_->finish(py), "the venv archive");
  return publish_finished(s, extra, kVenvKind);
}

Status Cache::publish_tree(Staging& s, const json& extra) {
  if (!s.extractor_) return Error::invalid("node_modules " + s.key_ + " is already published");
  TSB_TRY(s.extractor_->finish_tree(), "the node_modules archive");
  return publish_finished(s, extra, kNodeModulesKind);
}

Status Cache::publish_finished(Staging& s, const json& extra, std::string_view kind) {
  const std::string archive = kind == kVenvKind ? "the venv archive" : "the node_modules archive";
  if (s.extractor_->manifest().empty()) return Error::invalid(archive + " has no manifest", EPROTO);
  auto built = read_builder_manifest(s.extractor_->manifest(), s.extractor_->limits().max_manifest);
  if (!built.ok()) return std::move(built).error().wrap(archive);
  json manifest = json::object();
  if (kind == kVenvKind) {
    manifest["freeze"] = std::move(built->freeze);
    manifest["python"] = std::move(built->python);
  } else {
    manifest["packages"] = std::move(built->packages);
    manifest["node"] = std::move(built->node);
  }
  for (auto it = extra.begin(); it != extra.end(); ++it) manifest[it.key()] = it.value();
  manifest["kind"] = kind;
  const std::uint64_t bytes = s.extractor_->file_bytes() + s.extractor_->entries() * kBlock;
  manifest["key"] = s.key_;
  manifest["bytes"] = bytes;
  manifest["files_bytes"] = s.extractor_->file_bytes();
  manifest["entries"] = s.extractor_->entries();
  s.extractor_.reset();
  if (::fchmodat(fd_.get(), s.name_.c_str(), 0555, 0) != 0) return Error::from_errno("chmod " + s.name_);
  const std::string tmp_manifest = s.name_ + ".json";
  // Invalid UTF-8 (pip's output, a package's name) is replaced, not thrown.
  TSB_TRY(write_new(fd_.get(), tmp_manifest, manifest.dump(2, ' ', false, json::error_handler_t::replace) + "\n"),
          "the venv's manifest");
  bool renamed = ::renameat(fd_.get(), s.name_.c_str(), fd_.get(), s.key_.c_str()) == 0;
  if (!renamed && (errno == ENOTEMPTY || errno == EEXIST)) {
    // The key's directory is there: either a venv another process is
    // removing (its manifest already gone), taken out of the way here too;
    // or a complete one (this process builds a key only when it has none,
    // but a hold can fail while a removal is refused): kept, and this
    // build dropped.
    struct stat st{};
    if (::fstatat(fd_.get(), (s.key_ + ".json").c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) {
      (void)::unlinkat(fd_.get(), tmp_manifest.c_str(), 0);
      if (!entries_.contains(s.key_)) {
        auto m = this->manifest(s.key_);
        CacheEntry ce;
        ce.key = s.key_;
        ce.bytes = m.contains("bytes") && m["bytes"].is_number_unsigned() ? m["bytes"].get<std::uint64_t>() : bytes;
        ce.last_used = std::chrono::system_clock::now();
        total_ += ce.bytes;
        entries_[s.key_] = std::move(ce);
      }
      return {};  // the staging directory goes with `s`
    }
    (void)remove_venv_dir(fd_.get(), s.key_);
    renamed = ::renameat(fd_.get(), s.name_.c_str(), fd_.get(), s.key_.c_str()) == 0;
  }
  if (!renamed) {
    const int err = errno;
    (void)::unlinkat(fd_.get(), tmp_manifest.c_str(), 0);
    return Error::from_errno(err, "publishing venv " + s.key_);
  }
  s.published_ = true;
  if (::renameat(fd_.get(), tmp_manifest.c_str(), fd_.get(), (s.key_ + ".json").c_str()) != 0) {
    const int err = errno;
    (void)remove_venv_dir(fd_.get(), s.key_);
    (void)::unlinkat(fd_.get(), tmp_manifest.c_str(), 0);
    return Error::from_errno(err, "publishing the manifest of venv " + s.key_);
  }
  CacheEntry ce;
  ce.key = s.key_;
  ce.bytes = bytes;
  ce.last_used = std::chrono::system_clock::now();
  total_ -= std::min(total_, entries_.contains(s.key_) ? entries_[s.key_].bytes : 0);
  total_ += bytes;
  entries_[s.key_] = std::move(ce);
  evict();
  return {};
}

std::vector<std::string> Cache::evict(std::uint64_t target) {
  refresh();
  std::vector<std::string> gone;
  std::set<std::string> busy;  // held by another process
  const std::uint64_t limit = std::min(target, max_bytes_);
  while (total_ > limit) {
    const CacheEntry* oldest = nullptr;
    for (const auto& [k, e] : entries_)
      if (e.in_use == 0 && !busy.contains(k) && (!oldest || e.last_used < oldest->last_used)) oldest = &e;
    if (!oldest) break;  // everything left is in use
    const std::string key = oldest->key;
    if (auto st = remove(key); !st.ok()) {
      if (st.error().code != EBUSY) break;
      busy.insert(key);
      continue;
    }
    gone.push_back(key);
  }
  return gone;
}

void Cache::refresh() {
  for (auto it = entries_.begin(); it != entries_.end();) {
    struct stat st{};
    if (it->second.in_use == 0 && ::fstatat(fd_.get(), (it->first + ".json").c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 &&
        errno == ENOENT) {
      total_ -= std::min(total_, it->second.bytes);
      it = entries_.erase(it);
    } else {
      ++it;
    }
  }
}

bool Cache::held_anywhere(const std::string& key) const {
  auto it = entries_.find(key);
  if (it != entries_.end() && it->second.in_use > 0) return true;
  UniqueFd f(::openat(fd_.get(), (key + ".json").c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK));
  if (!f) return false;
  // Asked, not taken: a probe never makes a hold fail.
  struct flock l{};
  l.l_type = F_WRLCK;
  l.l_whence = SEEK_SET;
  return ::fcntl(f.get(), F_OFD_GETLK, &l) == 0 && l.l_type != F_UNLCK;
}

Status Cache::remove(const std::string& key) {
  auto it = entries_.find(key);
  if (it == entries_.end()) return Error::invalid("no venv " + key, ENOENT);
  if (it->second.in_use > 0) return Error::invalid("venv " + key + " is in use by " + std::to_string(it->second.in_use) + " runs", EBUSY);
  // Write-locked, then unlinked: a hold taken meanwhile sees the lock,
  // and one taken after sees the manifest gone.
  const std::string manifest = key + ".json";
  {
    UniqueFd fd(::openat(fd_.get(), manifest.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK));
    if (!fd && errno == EACCES && ::fchmodat(fd_.get(), manifest.c_str(), 0644, 0) == 0)  // an older 0444 one
      fd.reset(::openat(fd_.get(), manifest.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK));
    if (!fd && errno != ENOENT) return Error::from_errno("opening the manifest of " + key);
    if (fd && !lock(fd.get(), F_WRLCK)) {
      if (errno != EAGAIN && errno != EACCES) return Error::from_errno("locking the manifest of " + key);
      return Error::invalid("venv " + key + " is in use by a run", EBUSY);
    }
    if (::unlinkat(fd_.get(), manifest.c_str(), 0) != 0 && errno != ENOENT)
      return Error::from_errno("removing the manifest of " + key);
  }  // the lock goes with the name: nothing can take the venv now
  total_ -= std::min(total_, it->second.bytes);
  entries_.erase(it);
  return remove_venv_dir(fd_.get(), key);
}

json Cache::manifest(const std::string& key) const {
  if (!is_key(key)) return json();
  auto m = read_at(fd_.get(), key + ".json", kMaxStoredManifest);
  if (!m.ok()) return json();
  auto doc = read_stored_manifest(*m);
  return doc.ok() ? std::move(doc).value() : json();
}

}  // namespace tsb::venv
