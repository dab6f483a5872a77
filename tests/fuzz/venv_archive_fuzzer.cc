// The venv archive extractor (daemon/venv/archive.h) and the cache's publish
// (daemon/venv/cache.h): the stream is written by a build sandbox that ran
// packages' code.
//
// Input: one byte, the size of the pieces the stream is fed in (1 to 256
// bytes), then the stream. Each input is extracted twice, into a private
// directory of TMPDIR: through the cache (stage, feed in pieces, publish:
// the builder's manifest read too) and by a bare Extractor fed the whole
// stream at once. Invariants, besides "no crash, no sanitizer report":
//   - the cut does not matter: both succeed or both fail with the same
//     message, and succeed with the same tree;
//   - a published venv is what archive.h promises: directories 0555, files
//     0444 or 0555 with one link each, nothing setuid, the frame (pyvenv.cfg,
//     bin/python3, bin/python, bin/python3.N, lib64) the daemon's own, and
//     no entry outside the venv's directory;
//   - its stored manifest reads back (manifest.h) with the sizes the tree
//     has, and the venv can be removed;
//   - a refused stream leaves nothing in the cache, and says why.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "daemon/venv/archive.h"
#include "daemon/venv/cache.h"
#include "daemon/venv/manifest.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

namespace fs = std::filesystem;
namespace v = tsb::venv;

std::string g_dir;                   // the private directory
std::string g_cache_dir, g_bare_dir;  // the cache; the bare extractor's
tsb::UniqueFd g_bare_fd;
std::unique_ptr<v::Cache> g_cache;
const std::string kKey(64, 'a');
const v::Interpreter kPython{"/usr/bin/python3", "3.11"};

// Small enough that every limit is within reach of an input of -max_len.
v::ArchiveLimits limits() {
  v::ArchiveLimits l;
  l.max_file_bytes = 16u << 10;
  l.max_entries = 256;
  l.max_meta_bytes = 8u << 10;
  l.max_manifest = 16u << 10;
  return l;
}

void remove_dir() {
  g_cache.reset();
  g_bare_fd.reset();
  std::error_code ec;
  // Read-only directories of a failed run: writable again first.
  for (auto it = fs::recursive_directory_iterator(g_dir, ec); !ec && it != fs::recursive_directory_iterator(); it.increment(ec))
    if (it->is_directory(ec) && !it->is_symlink(ec)) fs::permissions(it->path(), fs::perms::owner_all, fs::perm_options::add, ec);
  if (!g_dir.empty()) fs::remove_all(g_dir, ec);
}

struct Entry {
  char type;  // d f l
  unsigned mode;
  std::string content;  // a file's bytes, a link's target
  bool operator==(const Entry&) const = default;
};
using Tree = std::map<std::string, Entry>;

// Every entry below `root`, following nothing.
Tree list(const fs::path& root) {
  Tree t;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(root, ec); it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (ec) tsb::fuzz::fail("cannot list the extracted venv", ec.message());
    const std::string rel = it->path().lexically_relative(root).string();  // relative() would follow links
    struct stat st {};
    if (::lstat(it->path().c_str(), &st) != 0) tsb::fuzz::fail("lstat failed", rel);
    Entry e{'?', static_cast<unsigned>(st.st_mode & 07777), ""};
    if (S_ISDIR(st.st_mode)) {
      e.type = 'd';
    } else if (S_ISLNK(st.st_mode)) {
      e.type = 'l';
      e.content = fs::read_symlink(it->path()).string();
    } else if (S_ISREG(st.st_mode)) {
      e.type = 'f';
      TSB_FUZZ_CHECK(st.st_nlink == 1, rel);
      const int fd = ::open(it->path().c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
      if (fd < 0) tsb::fuzz::fail("cannot read an extracted file", rel);
      e.content.resize(static_cast<std::size_t>(st.st_size));
      TSB_FUZZ_CHECK(::read(fd, e.content.data(), e.content.size()) == st.st_size, rel);
      ::close(fd);
    }
    TSB_FUZZ_CHECK(e.type != '?', "an entry that is neither a directory, a file nor a link: " + rel);
    t.emplace(rel, std::move(e));
  }
  return t;
}

std::string describe(const Tree& t) {
  std::string s;
  for (const auto& [path, e] : t) s += path + " " + e.type + " " + std::to_string(e.mode) + " " + e.content.substr(0, 64) + "\n";
  return s;
}

void check_venv(const Tree& t) {
  for (const auto& [path, e] : t) {
    if (e.type == 'd') TSB_FUZZ_CHECK(e.mode == 0555, path);
    if (e.type == 'f') TSB_FUZZ_CHECK(e.mode == 0444 || e.mode == 0555, path);
  }
  const auto at = [&](const std::string& p) { return t.contains(p) ? t.at(p) : Entry{'-', 0, ""}; };
  TSB_FUZZ_CHECK(at("bin").type == 'd');
  TSB_FUZZ_CHECK((at("bin/python3") == Entry{'l', 0777, "/usr/bin/python3"}), describe(t));
  TSB_FUZZ_CHECK((at("bin/python") == Entry{'l', 0777, "python3"}));
  TSB_FUZZ_CHECK((at("bin/python3.11") == Entry{'l', 0777, "python3"}));
  TSB_FUZZ_CHECK((at("lib64") == Entry{'l', 0777, "lib"}));
  TSB_FUZZ_CHECK((at("pyvenv.cfg") ==
                  Entry{'f', 0444, "home = /usr/bin\ninclude-system-site-packages = false\nversion = 3.11\n"}));
  // Nothing else in bin/ that chooses the interpreter's code.
  for (const auto& [path, e] : t)
    if (path.starts_with("bin/") && path.find('/', 4) == std::string::npos)
      TSB_FUZZ_CHECK(!path.ends_with("._pth") && path != "bin/pyvenv.cfg", path);
}

// The names in a directory.
std::size_t count(const std::string& dir) {
  std::size_t n = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir)) ++n;
  return n;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* tmp = std::getenv("TMPDIR");
  std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/tsb-fuzz-venv-XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) tsb::fuzz::fail("mkdtemp failed", tmpl);
  g_dir = tmpl;
  std::atexit(remove_dir);
  g_cache_dir = g_dir + "/cache";
  g_bare_dir = g_dir + "/bare";
  if (::mkdir(g_cache_dir.c_str(), 0755) != 0 || ::mkdir(g_bare_dir.c_str(), 0700) != 0) tsb::fuzz::fail("mkdir failed", g_dir);
  g_bare_fd.reset(::open(g_bare_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!g_bare_fd) tsb::fuzz::fail("cannot open", g_bare_dir);
  auto c = v::Cache::open(g_cache_dir, 1ull << 40);
  if (!c.ok()) tsb::fuzz::fail("cannot open the cache", c.error().message);
  g_cache = std::move(c).value();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::size_t cut = std::size_t{data[0]} + 1;
  const std::string_view stream(reinterpret_cast<const char*>(data) + 1, size - 1);

  // Through the cache, in pieces.
  tsb::Status published = tsb::Error::invalid("not published");
  {
    auto s = g_cache->stage(kKey, limits());
    if (!s.ok()) tsb::fuzz::fail("cannot stage", s.error().message);
    for (std::size_t i = 0; i < stream.size(); i += cut)
      if (!(*s)->feed(stream.substr(i, cut)).ok()) break;
    published = g_cache->publish(**s, {{"requirements", {"x"}}, {"policy", "default"}}, kPython);
  }

  // The bare extractor, all at once.
  std::string whole_error, manifest;
  Tree whole;
  {
    if (::mkdirat(g_bare_fd.get(), "out", 0700) != 0) tsb::fuzz::fail("mkdir out failed");
    v::Extractor x(tsb::UniqueFd(::openat(g_bare_fd.get(), "out", O_RDONLY | O_DIRECTORY | O_CLOEXEC)), limits());
    auto st = x.feed(stream);
    if (st.ok()) st = x.finish(kPython);
    if (!st.ok()) {
      whole_error = "the venv archive: " + st.error().message;
    } else if (x.manifest().empty()) {
      whole_error = "the venv archive has no manifest";
    } else if (auto m = v::read_builder_manifest(x.manifest(), limits().max_manifest); !m.ok()) {
      whole_error = "the venv archive: " + m.error().message;
    } else {
      whole = list(g_bare_dir + "/out");
      TSB_FUZZ_CHECK(x.file_bytes() <= limits().max_file_bytes && x.entries() <= limits().max_entries);
    }
    if (auto r = v::remove_tree(g_bare_fd.get(), "out"); !r.ok())
      tsb::fuzz::fail("cannot remove the bare extraction", r.error().message);
  }

  if (!published.ok()) {
    TSB_FUZZ_CHECK(!whole_error.empty(), "refused in pieces, published whole: " + published.error().message);
    TSB_FUZZ_CHECK(published.error().message == whole_error, published.error().message + " | whole: " + whole_error);
    TSB_FUZZ_CHECK(!g_cache->has(kKey) && count(g_cache_dir) == 0, "a refused venv left something in the cache");
    return 0;
  }
  TSB_FUZZ_CHECK(whole_error.empty(), "published in pieces, refused whole: " + whole_error);
  const Tree t = list(g_cache_dir + "/" + kKey);
  TSB_FUZZ_CHECK(t == whole, "the cut changed the venv");
  check_venv(t);
  TSB_FUZZ_CHECK(count(g_cache_dir) == 2, "more than the venv and its manifest in the cache");

  const nlohmann::json m = g_cache->manifest(kKey);
  TSB_FUZZ_CHECK(m.is_object() && m.value("key", "") == kKey, m.dump());
  std::uint64_t files = 0, entries = 0;
  for (const auto& [path, e] : t) {
    if (path == "pyvenv.cfg" || path == "bin/python3" || path == "bin/python" || path == "bin/python3.11" || path == "lib64")
      continue;
    ++entries;
    if (e.type == 'f') files += e.content.size();
  }
  TSB_FUZZ_CHECK(m["files_bytes"] == files, m.dump());
  // bin/ is the archive's, or finish() made it.
  TSB_FUZZ_CHECK(m["entries"] == entries || m["entries"] == entries - 1, m.dump());
  TSB_FUZZ_CHECK(m["freeze"].is_null() || m["freeze"].is_array());
  if (auto st = g_cache->remove(kKey); !st.ok()) tsb::fuzz::fail("cannot remove a published venv", st.error().message);
  TSB_FUZZ_CHECK(count(g_cache_dir) == 0, "a removed venv left something");
  return 0;
}
