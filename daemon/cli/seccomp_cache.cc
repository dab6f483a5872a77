#include "daemon/cli/seccomp_cache.h"

#include <fcntl.h>
#include <seccomp.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "daemon/common/quote.h"
#include "isolate/base/file.h"
#include "daemon/common/hash.h"
#include "isolate/base/random.h"
#include "isolate/base/unique_fd.h"

namespace tsb::cli {
namespace {

constexpr std::string_view kMagic = "toolsandbox seccomp program 1\n";
constexpr std::size_t kMaxInsns = 4096;  // BPF_MAXINSNS
constexpr std::size_t kDigestHex = 64;

bool is_key(std::string_view key) {
  return key.size() == kDigestHex &&
         key.find_first_not_of("0123456789abcdef") == std::string_view::npos;
}

// Root's, and writable by no one else.
bool trusted(const struct stat& st) { return st.st_uid == 0 && (st.st_mode & 022) == 0; }

}  // namespace

std::string seccomp_cache_key(std::string_view what) {
  std::string id(what);
  struct utsname u{};
  if (::uname(&u) == 0) id += std::string("\nkernel ") + u.release + " " + u.machine;
  const scmp_version* v = seccomp_version();
  if (v) id += "\nlibseccomp " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->micro);
  struct stat exe{};
  if (::stat("/proc/self/exe", &exe) == 0)
    id += "\nexe " + std::to_string(exe.st_dev) + " " + std::to_string(exe.st_ino) + " " + std::to_string(exe.st_size) +
          " " + std::to_string(exe.st_mtim.tv_sec) + "." + std::to_string(exe.st_mtim.tv_nsec);
  return sha256_hex(id);
}

std::shared_ptr<const isolate::SeccompProgram> load_cached_program(const std::string& dir, const std::string& key) {
  if (!is_key(key)) return nullptr;
  UniqueFd d(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  struct stat dst{};
  if (!d || ::fstat(d.get(), &dst) != 0 || !trusted(dst)) return nullptr;
  UniqueFd f(::openat(d.get(), key.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK | O_NOCTTY));
  if (!f) return nullptr;
  ReadRules rules;
  rules.max_bytes = kMagic.size() + kDigestHex + kMaxInsns * sizeof(sock_filter);
  rules.regular_only = true;
  rules.check = [](const std::string& path, const struct stat& st) -> Status {
    if (!trusted(st)) return Error::invalid("'" + path + "' is not root's alone");
    return {};
  };
  auto text = read_opened_file(f.get(), dir + "/" + key, rules);
  if (!text.ok() || !text->starts_with(kMagic) || text->size() < kMagic.size() + kDigestHex) return nullptr;
  const std::string_view digest = std::string_view(*text).substr(kMagic.size(), kDigestHex);
  const std::string_view insns = std::string_view(*text).substr(kMagic.size() + kDigestHex);
  if (insns.empty() || insns.size() % sizeof(sock_filter) != 0 || sha256_hex(insns) != digest) return nullptr;
  auto p = std::make_shared<isolate::SeccompProgram>();
  p->name = dir + "/" + key;
  p->insns.resize(insns.size() / sizeof(sock_filter));
  std::memcpy(p->insns.data(), insns.data(), insns.size());
  p->sha256 = std::string(digest);
  return p;
}

Status store_cached_program(const std::string& dir, const std::string& key, const isolate::SeccompProgram& program) {
  if (!is_key(key)) return Error::invalid("not a cache key: '" + key + "'");
  if (program.insns.empty() || program.insns.size() > kMaxInsns) return Error::invalid("not a loadable program");
  // Its parent too (/var/cache/toolsandbox), as systemd/toolsandboxd.tmpfiles makes it.
  const std::size_t slash = dir.find_last_of('/');
  const std::string parent = slash == std::string::npos || slash == 0 ? std::string() : dir.substr(0, slash);
  if (!parent.empty() && ::mkdir(parent.c_str(), 0711) != 0 && errno != EEXIST)
    return Error::from_errno("mkdir '" + parent + "'");
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) return Error::from_errno("mkdir '" + dir + "'");
  UniqueFd d(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  struct stat dst{};
  if (!d || ::fstat(d.get(), &dst) != 0) return Error::from_errno("open '" + dir + "'");
  if (!trusted(dst)) return Error::invalid("'" + dir + "' is not root's alone (mode " + mode_string(dst.st_mode) + ")");
  const std::string_view insns(reinterpret_cast<const char*>(program.insns.data()),
                               program.insns.size() * sizeof(sock_filter));
  std::string text(kMagic);
  text += sha256_hex(insns);
  text += insns;
  const std::string tmp = ".tmp-" + key + "-" + random_hex(8);
  UniqueFd f(::openat(d.get(), tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!f) return Error::from_errno("create '" + dir + "/" + tmp + "'");
  std::string_view rest = text;
  while (!rest.empty()) {
    const ssize_t n = ::write(f.get(), rest.data(), rest.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const Error e = Error::from_errno("write '" + dir + "/" + tmp + "'");
      ::unlinkat(d.get(), tmp.c_str(), 0);
      return e;
    }
    rest.remove_prefix(static_cast<std::size_t>(n));
  }
  // Whole or absent: a program cut short is never what a later run loads.
  if (::fsync(f.get()) != 0 || ::renameat(d.get(), tmp.c_str(), d.get(), key.c_str()) != 0) {
    const Error e = Error::from_errno("keep '" + dir + "/" + key + "'");
    ::unlinkat(d.get(), tmp.c_str(), 0);
    return e;
  }
  return {};
}

Result<std::shared_ptr<const isolate::SeccompProgram>> cached_or_compiled(const std::string& dir, std::string_view what,
                                                                          const CompileFn& compile, const char* who,
                                                                          bool* hit) {
  const std::string key = seccomp_cache_key(what);
  if (auto p = load_cached_program(dir, key)) {
    if (hit) *hit = true;
    return p;
  }
  if (hit) *hit = false;
  auto compiled = compile();
  if (!compiled.ok()) return compiled;
  if (auto st = store_cached_program(dir, key, **compiled); !st.ok())
    print_line(stderr, "%s: not caching the compiled seccomp program: %s", who, st.error().message.c_str());
  return compiled;
}

}  // namespace tsb::cli
