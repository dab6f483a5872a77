// The venv cache: per-tool venvs, by content key (requirements.h), in a
// directory the front end owns (config venvs.cache_dir); TypeScript tools'
// node_modules (npm_requirements.h, npm_key) share it, each entry's
// manifest naming its "kind", with the same cap, locks and eviction:
//
//   <key>/          the venv, read-only (archive.h made it); the spawner
//                   binds it at /venv for a run that names the key
//   <key>.json      its manifest: requirements, pip freeze, Python, sizes,
//                   build time, the build's log tail; its mtime is the
//                   venv's last use, and a read lock on it (an open file
//                   description lock, fcntl(2) F_OFD_SETLK) says a run
//                   holds the venv
//   .tmp-*          a build being extracted, or a venv being removed
//
// A venv is published by two renames (the directory, then the manifest), so
// a key with a manifest is complete; a directory without one is a crash's
// leftover, removed at open like every .tmp-* entry. Eviction removes the
// manifest first, so a half-removed venv never has a name a run can use.
//
// Two processes use a cache: the front end (builds, holds, evicts) and
// `toolsandbox venv list|show|gc` (reads, and removes venvs nobody holds).
// What they share is the file system: a venv in use has its manifest
// read-locked (by the front end, from before its run is started until the
// run has ended); removing one takes a write lock first and gives up when
// it cannot, and a hold taken on a manifest that is being or was removed
// (write-locked, or its link count 0) is no hold. Asking whether a venv is
// held (F_OFD_GETLK) takes no lock, so `toolsandbox venv list` never makes
// a run miss its venv. Only the front end publishes, and only it cleans up
// leftovers (at open).
//
// Not thread-safe: one event loop per process. Single-flight builds and
// waiting are the caller's (daemon/frontend/local/local_backend.cc).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "daemon/venv/archive.h"
#include "isolate/base/result.h"
#include "isolate/base/unique_fd.h"

namespace tsb::venv {

struct CacheEntry {
  std::string key;
  std::uint64_t bytes = 0;  // files, plus a block per entry
  std::chrono::system_clock::time_point last_used;
  unsigned in_use = 0;      // runs of this process holding it (never evicted while > 0)
  std::shared_ptr<UniqueFd> lock;  // the manifest, locked shared while in_use > 0
};

class Cache {
 public:
  // Opens `dir`: a directory owned by this process's uid, writable by no
  // one else, and reads the manifests. `owner` (the front end): also
  // removes leftovers of builds and removals, and evicts down to the cap.
  static Result<std::unique_ptr<Cache>> open(const std::string& dir, std::uint64_t max_bytes, bool owner = true);

  const std::string& dir() const noexcept { return dir_; }
  std::uint64_t max_bytes() const noexcept { return max_bytes_; }
  std::uint64_t total_bytes() const noexcept { return total_; }
  const std::map<std::string, CacheEntry>& entries() const noexcept { return entries_; }
  bool has(const std::string& key) const { return entries_.contains(key); }

  // A run's hold on a venv: it is not evicted until every hold is gone;
  // taking one marks it used now.
  class Hold {
   public:
    Hold() = default;
    Hold(Cache* c, std::string key) : c_(c), key_(std::move(key)) {}
    Hold(Hold&& o) noexcept : c_(std::exchange(o.c_, nullptr)), key_(std::move(o.key_)) {}
    Hold& operator=(Hold&& o) noexcept;
    ~Hold() { release(); }
    void release();
    explicit operator bool() const { return c_ != nullptr; }

   private:
    Cache* c_ = nullptr;
    std::string key_;
  };
  // A hold on `key`, or an empty one when the cache has no such venv.
  Hold hold(const std::string& key);

  // A build being received: its archive is extracted into a .tmp- directory
  // as it arrives; publish() makes it the venv of its key, and dropping it
  // unpublished removes what it extracted.
  class Staging {
   public:
    ~Staging();
    Status feed(std::string_view chunk) {
      return extractor_ ? extractor_->feed(chunk) : Error::invalid("the venv archive is already complete", EPROTO);
    }
    Extractor& extractor() { return *extractor_; }
    const std::string& key() const noexcept { return key_; }

   private:
    friend class Cache;
    Staging() = default;
    Cache* c_ = nullptr;
    std::string key_, name_;
    std::unique_ptr<Extractor> extractor_;
    bool published_ = false;
  };
  Result<std::unique_ptr<Staging>> stage(const std::string& key, const ArchiveLimits& limits);
  // Finishes the archive (its frame pointing at `py`) and publishes it, with
  // a manifest made of `extra` (the caller's: requirements, policy, build
  // time...), the sizes, and of the builder's only "freeze" (a list of
  // strings) and "python" (a string): the builder ran packages' code, so
  // nothing else it says is kept. Then evicts down to the cap.
  Status publish(Staging& s, const nlohmann::json& extra, const Interpreter& py = {});
  // The same for a tree with no interpreter frame (a TypeScript tool's
  // node_modules, bound at /node_modules): of the builder's manifest only
  // "packages" (a list of strings) and "node" (a string) are kept. The
  // manifest's "kind" says which of the two an entry is.
  Status publish_tree(Staging& s, const nlohmann::json& extra);

  // Removes least recently used venvs no run holds until the total is
  // within the cap (or `target` bytes, when given); the keys removed.
  std::vector<std::string> evict(std::uint64_t target = UINT64_MAX);
  // Removes one venv now, unless a run (of any process) holds it.
  Status remove(const std::string& key);
  // Whether a run of any process holds `key` now.
  bool held_anywhere(const std::string& key) const;
  // Forgets venvs whose manifest another process removed.
  void refresh();

  // The manifest of `key` as stored (null when unreadable).
  nlohmann::json manifest(const std::string& key) const;

 private:
  Cache(std::string dir, UniqueFd fd, std::uint64_t max_bytes) : dir_(std::move(dir)), fd_(std::move(fd)), max_bytes_(max_bytes) {}
  Status scan();
  void touch(const std::string& key);
  Status publish_finished(Staging& s, const nlohmann::json& extra, std::string_view kind);

  std::string dir_;
  UniqueFd fd_;
  std::uint64_t max_bytes_;
  bool owner_ = true;
  std::uint64_t total_ = 0;
  std::map<std::string, CacheEntry> entries_;
};

// An entry's "kind" in its manifest (absent: a venv, as written before
// node_modules shared the cache).
inline constexpr std::string_view kVenvKind = "venv";
inline constexpr std::string_view kNodeModulesKind = "node_modules";
// The kind of a manifest as read (cache.manifest(key)).
std::string kind_of(const nlohmann::json& manifest);

// Whether `s` is a venv key: 64 lower-case hex digits.
bool is_key(std::string_view s);

}  // namespace tsb::venv
