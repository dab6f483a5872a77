#include "daemon/policy/sources.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>

#include "daemon/policy/policy.h"
#include "isolate/base/wire.h"

namespace tsb::core {
namespace {

constexpr std::uint32_t kRecordMagic = 0x31637273;  // "src1"
constexpr std::size_t kMaxPath = 4096;
constexpr std::size_t kMaxText = 4u << 20;  // read_policy_text's own cap
constexpr std::uint32_t kMaxEntries = 4096;
constexpr std::size_t kMaxRecord = 256u << 20;

bool is_embedded(const std::string& p) { return p.starts_with("embedded:"); }

Error missing(const std::string& path) { return Error::from_errno(ENOENT, "open '" + path + "'"); }

}  // namespace

Result<std::string> SourceFiles::read(const std::string& path) {
  if (is_embedded(path)) return read_policy_text(path);
  if (replay_) {
    auto it = files_.find(path);
    if (it == files_.end())
      return Error::invalid("'" + path + "' is not among the files the compile helper read");
    if (!it->second) return missing(path);
    return *it->second;
  }
  auto text = read_policy_text(path);
  if (text.ok()) files_[path] = *text;
  else if (text.error().code == ENOENT) files_[path] = std::nullopt;
  return text;
}

Result<std::vector<std::string>> SourceFiles::policy_names(const std::string& dir) {
  if (replay_) {
    auto it = dirs_.find(dir);
    if (it == dirs_.end())
      return Error::invalid("policies directory '" + dir + "' is not among what the compile helper read");
    return it->second;
  }
  DIR* d = ::opendir(dir.c_str());
  if (!d) return Error::from_errno("policies directory '" + dir + "'");
  std::vector<std::string> names;
  while (dirent* e = ::readdir(d)) {
    std::string n = e->d_name;
    if (n.size() > 5 && n.ends_with(".json") && n != "organizations.json" && n[0] != '.')
      names.push_back(n.substr(0, n.size() - 5));
  }
  ::closedir(d);
  std::sort(names.begin(), names.end());
  dirs_[dir] = names;
  return names;
}

std::string SourceFiles::encode() const {
  Writer w;
  w.u32(kRecordMagic);
  w.u32(static_cast<std::uint32_t>(files_.size()));
  for (const auto& [path, text] : files_) {
    w.str(path);
    w.u8(text ? 1 : 0);
    w.str(text ? *text : "");
  }
  w.u32(static_cast<std::uint32_t>(dirs_.size()));
  for (const auto& [dir, names] : dirs_) {
    w.str(dir);
    w.strs(names);
  }
  return w.take();
}

Result<SourceFiles> SourceFiles::decode(std::string_view record) {
  Reader r(record);
  SourceFiles s;
  s.replay_ = true;
  if (r.u32() != kRecordMagic) r.fail();
  for (std::uint32_t i = 0, n = r.count(kMaxEntries, 9); i < n && r.ok(); ++i) {
    std::string path = r.str(kMaxPath);
    const bool present = r.flag();
    std::string text = r.str(kMaxText);
    if (present) s.files_[path] = std::move(text);
    else s.files_[path] = std::nullopt;
  }
  for (std::uint32_t i = 0, n = r.count(kMaxEntries, 8); i < n && r.ok(); ++i) {
    std::string dir = r.str(kMaxPath);
    s.dirs_[dir] = r.strs(kMaxEntries, kMaxPath);
  }
  if (!r.done()) return Error::invalid("a malformed record of the configuration and policy files");
  return s;
}

Result<SourceFiles> read_source_record(int fd) {
  // Sealed by the compile helper (write_source_record): no one can change
  // it while it is read, or after.
  const int seals = ::fcntl(fd, F_GET_SEALS);
  constexpr int kWanted = F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE;
  if (seals < 0 || (seals & kWanted) != kWanted)
    return Error::invalid("the record of the configuration and policy files is not a sealed memfd");
  struct stat st{};
  if (::fstat(fd, &st) != 0) return Error::from_errno("fstat (the record of the configuration and policy files)");
  if (st.st_size < 0 || static_cast<std::uint64_t>(st.st_size) > kMaxRecord)
    return Error::invalid("the record of the configuration and policy files is too large", EFBIG);
  std::string buf(static_cast<std::size_t>(st.st_size), '\0');
  std::size_t off = 0;
  while (off < buf.size()) {
    ssize_t n = ::pread(fd, buf.data() + off, buf.size() - off, static_cast<off_t>(off));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Error::from_errno("reading the record of the configuration and policy files");
    if (n == 0) return Error::invalid("the record of the configuration and policy files ended early");
    off += static_cast<std::size_t>(n);
  }
  return SourceFiles::decode(buf);
}

Status write_source_record(int fd, const SourceFiles& files) {
  const std::string b = files.encode();
  // What the front end could not read back (past the decoder's bounds)
  // fails here, in the helper: the spawner then keeps the set in force.
  if (b.size() > kMaxRecord || !SourceFiles::decode(b).ok())
    return Error::invalid("the configuration and policy files are too many or too large for one record", EFBIG);
  std::size_t off = 0;
  while (off < b.size()) {
    ssize_t n = ::pwrite(fd, b.data() + off, b.size() - off, static_cast<off_t>(off));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Error::from_errno("writing the record of the configuration and policy files");
    off += static_cast<std::size_t>(n);
  }
  // Sealed before the helper exits: from then on no one can change it, and
  // the front end checks the seals before it reads.
  if (::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) != 0)
    return Error::from_errno("sealing the record of the configuration and policy files");
  return {};
}

}  // namespace tsb::core
