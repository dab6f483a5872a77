#include "daemon/policy/seccomp_profile.h"

#include <fcntl.h>
#include <seccomp.h>
#include <sys/capability.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <exception>
#include <map>
#include <new>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "isolate/base/file.h"
#include "daemon/common/hash.h"
#include "daemon/policy/jsonc.h"
#include "isolate/base/unique_fd.h"

namespace tsb::policy {
namespace {

using nlohmann::json;

// Profiles are small (Moby's is about 20 KiB); a bigger file is a mistake or
// an attempt to make the daemon allocate.
constexpr std::size_t kMaxProfileBytes = 4u << 20;
// Largest errno a filter may return: the kernel treats -1..-4095 as errors
// (MAX_ERRNO), anything else would read as a successful return value.
constexpr std::uint64_t kMaxErrno = 4095;
// SECCOMP_RET_DATA is 16 bits: the most a TRACE action can pass to a tracer.
constexpr std::uint64_t kMaxTraceData = 0xFFFF;

// OCI architecture names (runtime-spec config-linux.md) and the name
// libseccomp resolves. A name libseccomp 2.5.4 does not know (LoongArch)
// still parses; it only fails if a profile asks to add it to a filter.
struct ArchRow {
  std::string_view oci;
  const char* libseccomp;
};
constexpr ArchRow kArches[] = {
    {"SCMP_ARCH_X86", "x86"},
    {"SCMP_ARCH_X86_64", "x86_64"},
    {"SCMP_ARCH_X32", "x32"},
    {"SCMP_ARCH_ARM", "arm"},
    {"SCMP_ARCH_AARCH64", "aarch64"},
    {"SCMP_ARCH_MIPS", "mips"},
    {"SCMP_ARCH_MIPS64", "mips64"},
    {"SCMP_ARCH_MIPS64N32", "mips64n32"},
    {"SCMP_ARCH_MIPSEL", "mipsel"},
    {"SCMP_ARCH_MIPSEL64", "mipsel64"},
    {"SCMP_ARCH_MIPSEL64N32", "mipsel64n32"},
    {"SCMP_ARCH_PPC", "ppc"},
    {"SCMP_ARCH_PPC64", "ppc64"},
    {"SCMP_ARCH_PPC64LE", "ppc64le"},
    {"SCMP_ARCH_S390", "s390"},
    {"SCMP_ARCH_S390X", "s390x"},
    {"SCMP_ARCH_PARISC", "parisc"},
    {"SCMP_ARCH_PARISC64", "parisc64"},
    {"SCMP_ARCH_RISCV64", "riscv64"},
    {"SCMP_ARCH_LOONGARCH64", "loongarch64"},
};

// Names used in includes/excludes "arches": Moby writes Go's GOARCH names
// ("amd64", "arm64") plus "x86" and "x32"; the kernel spellings are accepted
// as synonyms. Each maps to the OCI architecture it means.
struct ArchAlias {
  std::string_view alias;
  std::string_view oci;
};
constexpr ArchAlias kArchAliases[] = {
    {"386", "SCMP_ARCH_X86"},          {"i386", "SCMP_ARCH_X86"},
    {"x86", "SCMP_ARCH_X86"},          {"amd64", "SCMP_ARCH_X86_64"},
    {"x86_64", "SCMP_ARCH_X86_64"},    {"x32", "SCMP_ARCH_X32"},
    {"arm", "SCMP_ARCH_ARM"},          {"arm64", "SCMP_ARCH_AARCH64"},
    {"aarch64", "SCMP_ARCH_AARCH64"},  {"mips", "SCMP_ARCH_MIPS"},
    {"mipsle", "SCMP_ARCH_MIPSEL"},    {"mipsel", "SCMP_ARCH_MIPSEL"},
    {"mips64", "SCMP_ARCH_MIPS64"},    {"mips64le", "SCMP_ARCH_MIPSEL64"},
    {"mipsel64", "SCMP_ARCH_MIPSEL64"}, {"mips64n32", "SCMP_ARCH_MIPS64N32"},
    {"mipsel64n32", "SCMP_ARCH_MIPSEL64N32"}, {"ppc", "SCMP_ARCH_PPC"},
    {"ppc64", "SCMP_ARCH_PPC64"},      {"ppc64le", "SCMP_ARCH_PPC64LE"},
    {"s390", "SCMP_ARCH_S390"},        {"s390x", "SCMP_ARCH_S390X"},
    {"parisc", "SCMP_ARCH_PARISC"},    {"parisc64", "SCMP_ARCH_PARISC64"},
    {"riscv64", "SCMP_ARCH_RISCV64"},  {"loong64", "SCMP_ARCH_LOONGARCH64"},
    {"loongarch64", "SCMP_ARCH_LOONGARCH64"},
};

struct ActionRow {
  std::string_view name;
  SeccompAction action;
};
// SCMP_ACT_KILL is the OCI spelling of kill-thread (it predates
// SECCOMP_RET_KILL_PROCESS). SCMP_ACT_NOTIFY is refused separately: it needs
// a user-space notification listener, and toolsandboxd runs none.
constexpr ActionRow kActions[] = {
    {"SCMP_ACT_KILL", SeccompAction::KillThread},
    {"SCMP_ACT_KILL_THREAD", SeccompAction::KillThread},
    {"SCMP_ACT_KILL_PROCESS", SeccompAction::KillProcess},
    {"SCMP_ACT_TRAP", SeccompAction::Trap},
    {"SCMP_ACT_ERRNO", SeccompAction::Errno},
    {"SCMP_ACT_TRACE", SeccompAction::Trace},
    {"SCMP_ACT_ALLOW", SeccompAction::Allow},
    {"SCMP_ACT_LOG", SeccompAction::Log},
};

struct OpRow {
  std::string_view name;
  scmp_compare op;
};
constexpr OpRow kOps[] = {
    {"SCMP_CMP_NE", SCMP_CMP_NE}, {"SCMP_CMP_LT", SCMP_CMP_LT},
    {"SCMP_CMP_LE", SCMP_CMP_LE}, {"SCMP_CMP_EQ", SCMP_CMP_EQ},
    {"SCMP_CMP_GE", SCMP_CMP_GE}, {"SCMP_CMP_GT", SCMP_CMP_GT},
    {"SCMP_CMP_MASKED_EQ", SCMP_CMP_MASKED_EQ},
};

const ArchRow* find_arch(std::string_view oci) {
  for (const auto& row : kArches) {
    if (row.oci == oci) return &row;
  }
  return nullptr;
}

const ArchAlias* find_arch_alias(std::string_view alias) {
  for (const auto& row : kArchAliases) {
    if (row.alias == alias) return &row;
  }
  return nullptr;
}

const OpRow* find_op(std::string_view name) {
  for (const auto& row : kOps) {
    if (row.name == name) return &row;
  }
  return nullptr;
}

// 0 when libseccomp does not support the architecture.
std::uint32_t arch_token(const ArchRow& row) { return seccomp_arch_resolve_name(row.libseccomp); }

std::string libseccomp_version() {
  const scmp_version* v = seccomp_version();
  if (v == nullptr) return "libseccomp";
  return "libseccomp " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
         std::to_string(v->micro);
}

bool valid_syscall_name(std::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
  });
}

struct KernelVersion {
  int major = 0;
  int minor = 0;
  friend bool operator<(const KernelVersion& a, const KernelVersion& b) {
    return a.major != b.major ? a.major < b.major : a.minor < b.minor;
  }
};

// Leading "major.minor" of a version string; `exact` demands nothing after it
// (minKernel), otherwise anything may follow (a uname release "6.1.0-18-amd64").
std::optional<KernelVersion> parse_kernel_version(std::string_view s, bool exact) {
  KernelVersion v;
  int* fields[] = {&v.major, &v.minor};
  std::size_t i = 0;
  for (int f = 0; f < 2; ++f) {
    if (f == 1) {
      if (i >= s.size() || s[i] != '.') return std::nullopt;
      ++i;
    }
    const std::size_t start = i;
    long value = 0;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9' && i - start < 6) value = value * 10 + (s[i++] - '0');
    if (i == start || (i - start > 1 && s[start] == '0')) return std::nullopt;
    *fields[f] = static_cast<int>(value);
  }
  if (exact && i != s.size()) return std::nullopt;
  if (!exact && i < s.size() && s[i] >= '0' && s[i] <= '9') return std::nullopt;
  return v;
}

// The effective action of a rule: what a caller of the syscall observes.
struct ActionKey {
  SeccompAction action;
  int data;
  friend bool operator==(const ActionKey&, const ActionKey&) = default;
};

ActionKey action_key(SeccompAction action, int errno_ret) {
  const bool has_data = action == SeccompAction::Errno || action == SeccompAction::Trace;
  return {action, has_data ? errno_ret : 0};
}

std::uint32_t to_scmp_action(SeccompAction action, int data) {
  switch (action) {
    case SeccompAction::Allow: return SCMP_ACT_ALLOW;
    case SeccompAction::Errno: return SCMP_ACT_ERRNO(static_cast<std::uint32_t>(data));
    case SeccompAction::KillProcess: return SCMP_ACT_KILL_PROCESS;
    case SeccompAction::KillThread: return SCMP_ACT_KILL_THREAD;
    case SeccompAction::Trap: return SCMP_ACT_TRAP;
    case SeccompAction::Log: return SCMP_ACT_LOG;
    case SeccompAction::Trace: return SCMP_ACT_TRACE(static_cast<std::uint32_t>(data));
  }
  return SCMP_ACT_KILL_PROCESS;
}

bool same_args(std::vector<SeccompArg> a, std::vector<SeccompArg> b) {
  if (a.size() != b.size()) return false;
  const auto by_index = [](const SeccompArg& x, const SeccompArg& y) { return x.index < y.index; };
  std::sort(a.begin(), a.end(), by_index);
  std::sort(b.begin(), b.end(), by_index);
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i].index != b[i].index || a[i].value != b[i].value || a[i].value_two != b[i].value_two ||
        a[i].op != b[i].op) {
      return false;
    }
  }
  return true;
}

// Why a name cannot go into the filter, or "" when it can. `native_only`: the
// filter holds only the native architecture, so a name that exists only on
// other architectures (libseccomp's negative pseudo numbers, e.g. "chown32"
// on x86_64) could never match and is a mistake.
std::string unresolvable_reason(const std::string& name, std::uint32_t native_token,
                                std::string_view native_oci, bool native_only) {
  const int nr = seccomp_syscall_resolve_name_arch(native_token, name.c_str());
  if (nr == __NR_SCMP_ERROR) {
    return "unknown syscall " + quoted_for_message(name) + " (" + libseccomp_version() +
           " cannot resolve it)";
  }
  if (nr < 0 && native_only) {
    return "syscall " + quoted_for_message(name) + " does not exist on " + std::string(native_oci) +
           " and the profile lists no other architecture";
  }
  return {};
}

struct SyscallDefinition {
  ActionKey action;
  std::vector<SeccompArg> args;
  std::string where;  // of the name inside its entry
};

class ProfileParser {
 public:
  ProfileParser(const LocatedJson& doc, const SeccompParseOptions& options)
      : doc_(doc), options_(options) {}

  Result<SeccompProfile> run() {
    profile_.source = doc_.source;
    if (Status s = parse_root(); !s) return std::move(s).error();
    return std::move(profile_);
  }

 private:
  const LocatedJson& doc_;
  const SeccompParseOptions& options_;
  SeccompProfile profile_;
  std::string native_oci_;
  std::uint32_t native_token_ = 0;
  KernelVersion kernel_;
  bool listed_native_ = false;
  std::map<std::string, std::vector<SyscallDefinition>> definitions_;

  [[nodiscard]] Error at(const std::string& ptr, std::string_view sentence) const {
    return Error::invalid(doc_.where(ptr) + ": " + std::string(sentence));
  }
  [[nodiscard]] Error at_key(const std::string& ptr, std::string_view sentence) const {
    return Error::invalid(doc_.where_key(ptr) + ": " + std::string(sentence));
  }

  // Go encodes an empty optional list or object as null; read it as absent.
  static bool absent(const json& obj, std::string_view key) {
    const auto it = obj.find(key);
    return it == obj.end() || it->is_null();
  }

  // No member but `allowed` (the one object reader says which, where).
  Status check_keys(const json& obj, const std::string& ptr, const std::vector<std::string_view>& allowed) const {
    ObjectReader r(doc_, obj, ptr);
    for (auto key : allowed) (void)r.get(key);
    return r.done();
  }

  Status expect_type(const json& v, const std::string& ptr, json::value_t type, std::string_view what) const {
    const bool ok = type == json::value_t::number_unsigned ? v.is_number_integer() : v.type() == type;
    if (ok) return {};
    const char* want = "";
    switch (type) {
      case json::value_t::object: want = "an object"; break;
      case json::value_t::array: want = "an array"; break;
      case json::value_t::string: want = "a string"; break;
      case json::value_t::number_unsigned: want = "a non-negative integer"; break;
      default: want = "another type"; break;
    }
    const char* got = "";
    switch (v.type()) {
      case json::value_t::object: got = "an object"; break;
      case json::value_t::array: got = "an array"; break;
      case json::value_t::string: got = "a string"; break;
      case json::value_t::boolean: got = "a boolean"; break;
      case json::value_t::null: got = "null"; break;
      case json::value_t::number_float: got = "a fractional number"; break;
      default: got = "a number"; break;
    }
    return at(ptr, std::string(what) + " must be " + want + ", not " + got);
  }

  Status read_u64(const json& v, const std::string& ptr, std::string_view what, std::uint64_t max,
                  std::uint64_t& out) const {
    if (Status s = expect_type(v, ptr, json::value_t::number_unsigned, what); !s) return s;
    if (v.is_number_integer() && !v.is_number_unsigned() && v.get<std::int64_t>() < 0) {
      return at(ptr, std::string(what) + " must be a non-negative integer, not " + v.dump());
    }
    out = v.is_number_unsigned() ? v.get<std::uint64_t>() : static_cast<std::uint64_t>(v.get<std::int64_t>());
    if (out > max) {
      return at(ptr, std::string(what) + " " + std::to_string(out) + " is out of range (at most " +
                         std::to_string(max) + ")");
    }
    return {};
  }

  Status read_action(const json& v, const std::string& ptr, SeccompAction& out) const {
    if (Status s = expect_type(v, ptr, json::value_t::string, "action"); !s) return s;
    const auto& name = v.get_ref<const std::string&>();
    for (const auto& row : kActions) {
      if (row.name == name) {
        out = row.action;
        return {};
      }
    }
    if (name == "SCMP_ACT_NOTIFY") {
      return at(ptr, "action SCMP_ACT_NOTIFY is not supported (it needs a seccomp notification listener; toolsandboxd runs none)");
    }
    return at(ptr, "unknown action " + quoted_for_message(name));
  }

  Status read_arch(const json& v, const std::string& ptr, const ArchRow*& out) const {
    if (Status s = expect_type(v, ptr, json::value_t::string, "architecture"); !s) return s;
    const auto& name = v.get_ref<const std::string&>();
    out = find_arch(name);
    if (out == nullptr) return at(ptr, "unknown architecture " + quoted_for_message(name));
    return {};
  }

  // Read an errno-style datum: defaultErrnoRet / errnoRet.
  Status read_errno_ret(const json& obj, const std::string& ptr, std::string_view key, SeccompAction action,
                        int& out) const {
    if (absent(obj, key)) return {};
    const std::string p = json_pointer_append(ptr, key);
    if (action != SeccompAction::Errno && action != SeccompAction::Trace) {
      return at_key(p, std::string(key) + " is only valid with SCMP_ACT_ERRNO or SCMP_ACT_TRACE, not " +
                           seccomp_action_name(action));
    }
    std::uint64_t value = 0;
    const std::uint64_t max = action == SeccompAction::Errno ? kMaxErrno : kMaxTraceData;
    if (Status s = read_u64(obj.at(key), p, key, max, value); !s) return s;
    out = static_cast<int>(value);
    return {};
  }

  Status parse_root() {
    const json& root = doc_.value;
    if (Status s = expect_type(root, "", json::value_t::object, "a seccomp profile"); !s) return s;
    if (Status s = check_keys(root, "",
                              {"defaultAction", "defaultErrnoRet", "architectures", "archMap", "syscalls",
                               "flags", "listenerPath", "listenerMetadata"});
        !s) {
      return s;
    }
    // Parsed by the OCI format, but toolsandboxd loads filters with fixed
    // flags and runs no notification listener; accepting them would mean ignoring them.
    for (const std::string_view key : {"flags", "listenerPath", "listenerMetadata"}) {
      if (absent(root, key)) continue;
      const json& v = root.at(key);
      if ((v.is_array() && v.empty()) || (v.is_string() && v.get_ref<const std::string&>().empty())) continue;
      return at_key(json_pointer_append("", key), quoted_for_message(key) + " is not supported by toolsandboxd");
    }

    if (absent(root, "defaultAction")) return at("", "missing \"defaultAction\"");
    if (Status s = read_action(root.at("defaultAction"), "/defaultAction", profile_.default_action); !s) return s;
    profile_.default_errno = profile_.default_action == SeccompAction::Errno ? EPERM : 0;
    if (Status s = read_errno_ret(root, "", "defaultErrnoRet", profile_.default_action, profile_.default_errno); !s) {
      return s;
    }

    if (Status s = resolve_machine(); !s) return s;
    if (Status s = parse_architectures(root); !s) return s;

    if (absent(root, "syscalls")) return {};
    const json& syscalls = root.at("syscalls");
    if (Status s = expect_type(syscalls, "/syscalls", json::value_t::array, "\"syscalls\""); !s) return s;
    for (std::size_t i = 0; i < syscalls.size(); ++i) {
      if (Status s = parse_entry(syscalls[i], json_pointer_append("/syscalls", i)); !s) return s;
    }
    return {};
  }

  Status resolve_machine() {
    native_oci_ = options_.native_arch.empty() ? seccomp_native_arch() : options_.native_arch;
    const ArchRow* native = find_arch(native_oci_);
    if (native == nullptr || arch_token(*native) == 0) {
      return Error::invalid(doc_.source + ": native architecture " + quoted_for_message(native_oci_) +
                            " is not supported by " + libseccomp_version());
    }
    native_token_ = arch_token(*native);

    std::string release = options_.kernel_release;
    if (release.empty()) {
      utsname u{};
      if (::uname(&u) != 0) return Error::from_errno("uname");
      release = u.release;
    }
    const auto v = parse_kernel_version(release, false);
    if (!v) return Error::invalid("cannot read a kernel version from " + quoted_for_message(release));
    kernel_ = *v;
    return {};
  }

  // The native architecture is always in the filter; naming it once is fine.
  Status add_architecture(const ArchRow& arch, const std::string& ptr) {
    auto& list = profile_.architectures;
    const bool twice = arch.oci == native_oci_ ? listed_native_
                                               : std::find(list.begin(), list.end(), arch.oci) != list.end();
    if (twice) return at(ptr, "architecture " + std::string(arch.oci) + " listed twice");
    if (arch.oci == native_oci_) {
      listed_native_ = true;
    } else {
      list.emplace_back(arch.oci);
    }
    return {};
  }

  Status parse_architectures(const json& root) {
    // The native architecture is always in the filter and always first.
    profile_.architectures.push_back(native_oci_);
    const bool has_list = !absent(root, "architectures");
    const bool has_map = !absent(root, "archMap");
    if (has_list && has_map) {
      return at_key("/archMap", "use either \"architectures\" or \"archMap\", not both");
    }
    if (has_list) {
      const json& list = root.at("architectures");
      if (Status s = expect_type(list, "/architectures", json::value_t::array, "\"architectures\""); !s) return s;
      for (std::size_t i = 0; i < list.size(); ++i) {
        const std::string p = json_pointer_append("/architectures", i);
        const ArchRow* arch = nullptr;
        if (Status s = read_arch(list[i], p, arch); !s) return s;
        if (Status s = add_architecture(*arch, p); !s) return s;
      }
      return {};
    }
    if (!has_map) return {};
    const json& map = root.at("archMap");
    if (Status s = expect_type(map, "/archMap", json::value_t::array, "\"archMap\""); !s) return s;
    std::map<std::string_view, std::string> seen;  // architecture -> where
    for (std::size_t i = 0; i < map.size(); ++i) {
      const std::string p = json_pointer_append("/archMap", i);
      const json& entry = map[i];
      if (Status s = expect_type(entry, p, json::value_t::object, "an archMap entry"); !s) return s;
      if (Status s = check_keys(entry, p, {"architecture", "subArchitectures"}); !s) return s;
      if (absent(entry, "architecture")) return at(p, "archMap entry without \"architecture\"");
      const std::string ap = p + "/architecture";
      const ArchRow* arch = nullptr;
      if (Status s = read_arch(entry.at("architecture"), ap, arch); !s) return s;
      if (const auto it = seen.find(arch->oci); it != seen.end()) {
        return at(ap, "architecture " + std::string(arch->oci) + " mapped twice; previous entry at " + it->second);
      }
      seen.emplace(arch->oci, doc_.where(ap));
      std::vector<const ArchRow*> subs;
      if (!absent(entry, "subArchitectures")) {
        const std::string sp = p + "/subArchitectures";
        const json& list = entry.at("subArchitectures");
        if (Status s = expect_type(list, sp, json::value_t::array, "\"subArchitectures\""); !s) return s;
        for (std::size_t k = 0; k < list.size(); ++k) {
          const ArchRow* sub = nullptr;
          if (Status s = read_arch(list[k], json_pointer_append(sp, k), sub); !s) return s;
          subs.push_back(sub);
        }
      }
      // Only the entry for this machine matters: it says which other ABIs a
      // native process can reach (x86 via int 0x80, x32) and so must filter.
      if (arch->oci != native_oci_) continue;
      for (std::size_t k = 0; k < subs.size(); ++k) {
        if (Status s = add_architecture(*subs[k], json_pointer_append(p + "/subArchitectures", k)); !s) return s;
      }
    }
    return {};
  }

  // Reads includes/excludes and tells whether the filter matches this
  // sandbox. The tool holds no capabilities, so a caps condition is never met.
  // An absent filter matches for includes and does not for excludes.
  Status parse_filter(const json& entry, const std::string& ptr, std::string_view key, bool& matched) {
    matched = key == "includes";
    if (absent(entry, key)) return {};
    const std::string p = json_pointer_append(ptr, key);
    const json& f = entry.at(key);
    const std::string what = "\"" + std::string(key) + "\"";
    if (Status s = expect_type(f, p, json::value_t::object, what); !s) return s;
    if (Status s = check_keys(f, p, {"caps", "arches", "minKernel"}); !s) return s;
    // Whether each listed condition holds for this sandbox.
    const bool caps = false;  // the tool's capability sets are empty
    bool arches = false, kernel = false;
    bool has_caps = false, has_arches = false, has_kernel = false;
    if (!absent(f, "caps")) {
      const std::string cp = p + "/caps";
      const json& list = f.at("caps");
      if (Status s = expect_type(list, cp, json::value_t::array, "\"caps\""); !s) return s;
      for (std::size_t i = 0; i < list.size(); ++i) {
        const std::string ip = json_pointer_append(cp, i);
        if (Status s = expect_type(list[i], ip, json::value_t::string, "a capability"); !s) return s;
        const auto& name = list[i].get_ref<const std::string&>();
        cap_value_t value = 0;
        const bool well_formed = name.size() > 4 && name.compare(0, 4, "CAP_") == 0 &&
                                 std::all_of(name.begin(), name.end(), [](char c) {
                                   return (c >= 'A' && c <= 'Z') || c == '_';
                                 });
        if (!well_formed || cap_from_name(name.c_str(), &value) != 0) {
          return at(ip, "unknown capability " + quoted_for_message(name));
        }
      }
      has_caps = !list.empty();
    }
    if (!absent(f, "arches")) {
      const std::string ap = p + "/arches";
      const json& list = f.at("arches");
      if (Status s = expect_type(list, ap, json::value_t::array, "\"arches\""); !s) return s;
      for (std::size_t i = 0; i < list.size(); ++i) {
        const std::string ip = json_pointer_append(ap, i);
        if (Status s = expect_type(list[i], ip, json::value_t::string, "an architecture"); !s) return s;
        const auto& name = list[i].get_ref<const std::string&>();
        const ArchAlias* alias = find_arch_alias(name);
        if (alias == nullptr) return at(ip, "unknown architecture " + quoted_for_message(name));
        if (alias->oci == native_oci_) arches = true;
      }
      has_arches = !list.empty();
    }
    if (!absent(f, "minKernel")) {
      const std::string kp = p + "/minKernel";
      const json& v = f.at("minKernel");
      if (Status s = expect_type(v, kp, json::value_t::string, "\"minKernel\""); !s) return s;
      const auto min = parse_kernel_version(v.get_ref<const std::string&>(), true);
      if (!min) {
        return at(kp, "invalid minKernel " + quoted_for_message(v.get_ref<const std::string&>()) +
                          " (expected \"<major>.<minor>\")");
      }
      has_kernel = true;
      kernel = !(kernel_ < *min);
    }
    if (key == "includes") {
      // Every listed condition must hold (Moby semantics).
      matched = (!has_caps || caps) && (!has_arches || arches) && (!has_kernel || kernel);
    } else {
      // Any listed condition excludes the entry.
      matched = (has_caps && caps) || (has_arches && arches) || (has_kernel && kernel);
    }
    return {};
  }

  Status parse_args(const json& entry, const std::string& ptr, std::vector<SeccompArg>& out) const {
    if (absent(entry, "args")) return {};
    const std::string p = ptr + "/args";
    const json& list = entry.at("args");
    if (Status s = expect_type(list, p, json::value_t::array, "\"args\""); !s) return s;
    std::map<unsigned, std::string> seen;  // index -> where
    for (std::size_t i = 0; i < list.size(); ++i) {
      const std::string ap = json_pointer_append(p, i);
      const json& a = list[i];
      if (Status s = expect_type(a, ap, json::value_t::object, "an args entry"); !s) return s;
      if (Status s = check_keys(a, ap, {"index", "value", "valueTwo", "op"}); !s) return s;
      for (const std::string_view key : {"index", "value", "op"}) {
        if (absent(a, key)) return at(ap, "args entry without " + quoted_for_message(key));
      }
      SeccompArg arg;
      std::uint64_t index = 0;
      if (Status s = read_u64(a.at("index"), ap + "/index", "argument index", 5, index); !s) return s;
      arg.index = static_cast<unsigned>(index);
      if (Status s = read_u64(a.at("value"), ap + "/value", "value", UINT64_MAX, arg.value); !s) return s;
      if (!absent(a, "valueTwo")) {
        if (Status s = read_u64(a.at("valueTwo"), ap + "/valueTwo", "valueTwo", UINT64_MAX, arg.value_two); !s) {
          return s;
        }
      }
      const std::string op_ptr = ap + "/op";
      if (Status s = expect_type(a.at("op"), op_ptr, json::value_t::string, "op"); !s) return s;
      arg.op = a.at("op").get<std::string>();
      if (find_op(arg.op) == nullptr) return at(op_ptr, "unknown comparison operator " + quoted_for_message(arg.op));
      if (arg.op == "SCMP_CMP_MASKED_EQ") {
        if ((arg.value_two & ~arg.value) != 0) {
          return at(ap, "valueTwo has bits outside the mask in value, so this comparison can never match");
        }
      } else if (arg.value_two != 0) {
        return at(ap + "/valueTwo", "valueTwo is only used by SCMP_CMP_MASKED_EQ");
      }
      // libseccomp compares each argument at most once per rule (and
      // rejects a second comparison with EINVAL); runc splits such entries
      // into several rules, which silently turns AND into OR. Say so instead.
      if (const auto it = seen.find(arg.index); it != seen.end()) {
        return at(ap, "argument " + std::to_string(arg.index) + " is already compared at " + it->second +
                          "; libseccomp allows one comparison per argument in a rule, so write a separate "
                          "syscalls entry for each alternative");
      }
      seen.emplace(arg.index, doc_.where(ap));
      out.push_back(std::move(arg));
    }
    return {};
  }

  Status parse_entry(const json& entry, const std::string& ptr) {
    if (Status s = expect_type(entry, ptr, json::value_t::object, "a syscalls entry"); !s) return s;
    if (Status s = check_keys(entry, ptr,
                              {"names", "name", "action", "errnoRet", "args", "comment", "includes", "excludes"});
        !s) {
      return s;
    }
    SeccompRule rule;
    rule.pointer = ptr;
    rule.where = doc_.where(ptr);

    // Each name with the JSON pointer where it is written.
    std::vector<std::pair<std::string, std::string>> names;
    const bool has_names = !absent(entry, "names");
    const bool has_name = !absent(entry, "name");
    if (has_names && has_name) return at_key(ptr + "/name", "use either \"names\" or \"name\", not both");
    if (!has_names && !has_name) return at(ptr, "syscalls entry without \"names\"");
    std::vector<std::pair<const json*, std::string>> raw;
    if (has_names) {
      const json& list = entry.at("names");
      if (Status s = expect_type(list, ptr + "/names", json::value_t::array, "\"names\""); !s) return s;
      if (list.empty()) return at(ptr + "/names", "\"names\" is empty");
      for (std::size_t i = 0; i < list.size(); ++i) raw.emplace_back(&list[i], json_pointer_append(ptr + "/names", i));
    } else {
      raw.emplace_back(&entry.at("name"), ptr + "/name");
    }
    std::map<std::string, std::string> in_entry;  // name -> where, for duplicates
    for (const auto& [v, name_ptr] : raw) {
      if (Status s = expect_type(*v, name_ptr, json::value_t::string, "a syscall name"); !s) return s;
      const auto& name = v->get_ref<const std::string&>();
      if (!valid_syscall_name(name)) return at(name_ptr, "invalid syscall name " + quoted_for_message(name));
      if (const auto it = in_entry.find(name); it != in_entry.end()) {
        return at(name_ptr, "syscall " + quoted_for_message(name) + " listed twice in this entry; first at " +
                                it->second);
      }
      in_entry.emplace(name, doc_.where(name_ptr));
      names.emplace_back(name, name_ptr);
    }

    if (absent(entry, "action")) return at(ptr, "syscalls entry without \"action\"");
    if (Status s = read_action(entry.at("action"), ptr + "/action", rule.action); !s) return s;
    rule.errno_ret = rule.action == SeccompAction::Errno ? EPERM : 0;
    if (Status s = read_errno_ret(entry, ptr, "errnoRet", rule.action, rule.errno_ret); !s) return s;
    if (Status s = parse_args(entry, ptr, rule.args); !s) return s;
    if (!absent(entry, "comment")) {
      if (Status s = expect_type(entry.at("comment"), ptr + "/comment", json::value_t::string, "\"comment\""); !s) {
        return s;
      }
      rule.comment = entry.at("comment").get<std::string>();
    }
    bool included = false, excluded = false;
    if (Status s = parse_filter(entry, ptr, "includes", included); !s) return s;
    if (Status s = parse_filter(entry, ptr, "excludes", excluded); !s) return s;
    // An entry meant for another architecture, kernel or capability set
    // is checked for syntax above but neither resolved nor compiled: its
    // names need not exist here.
    if (!included || excluded) return {};

    const bool native_only = profile_.architectures.size() == 1;
    const ActionKey action = action_key(rule.action, rule.errno_ret);
    const bool may_skip =
        options_.unresolvable_syscalls == SeccompParseOptions::UnresolvableSyscalls::SkipInAllowRules &&
        rule.action == SeccompAction::Allow && profile_.default_action != SeccompAction::Allow;
    for (const auto& [name, name_ptr] : names) {
      const std::string reason = unresolvable_reason(name, native_token_, native_oci_, native_only);
      if (!reason.empty()) {
        if (!may_skip) return at(name_ptr, reason);
        profile_.skipped_syscalls.push_back(doc_.where(name_ptr) + ": " + name);
        continue;
      }
      if (Status s = check_redefinition(name, action, rule.args, name_ptr); !s) return s;
      rule.names.push_back(name);
    }
    if (!rule.names.empty()) profile_.rules.push_back(std::move(rule));
    return {};
  }

  // libseccomp resolves conflicts silently: an unconditional rule replaces
  // every conditional rule of the syscall whatever their actions, and a
  // second unconditional rule with another action is dropped. Refuse every
  // case where the outcome would depend on that. Conditional rules with
  // different actions are allowed (that is how one syscall is allowed for
  // some arguments and denied for others); they must not overlap, which
  // the behavioural tests check for the shipped profile.
  Status check_redefinition(const std::string& name, const ActionKey& action, const std::vector<SeccompArg>& args,
                            const std::string& name_ptr) {
    auto& defs = definitions_[name];
    for (const auto& prev : defs) {
      if (prev.action == action) continue;
      const bool conflict = prev.args.empty() || args.empty() || same_args(prev.args, args);
      if (!conflict) continue;
      return at(name_ptr, "syscall " + quoted_for_message(name) + " redefined here with " +
                              seccomp_action_name(action.action, action.data) + "; previous definition at " +
                              prev.where + " has " + seccomp_action_name(prev.action.action, prev.action.data));
    }
    defs.push_back({action, args, doc_.where(name_ptr)});
    return {};
  }
};

struct ScmpCtxDeleter {
  void operator()(void* ctx) const noexcept { seccomp_release(ctx); }
};
using ScmpCtx = std::unique_ptr<void, ScmpCtxDeleter>;

// libseccomp returns -errno.
Status scmp_check(int rc, std::string_view what) {
  if (rc < 0) return Error::from_errno(-rc, what);
  return {};
}

// libseccomp 2.5.4 can only export to a file descriptor; a memfd keeps the
// program off the filesystem.
Result<std::vector<sock_filter>> export_program(void* ctx) {
  UniqueFd fd(::memfd_create("tsb-seccomp-bpf", MFD_CLOEXEC));
  if (!fd) return Error::from_errno("memfd_create");
  if (Status s = scmp_check(seccomp_export_bpf(ctx, fd.get()), "seccomp_export_bpf"); !s) {
    return std::move(s).error();
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return Error::from_errno("fstat of the exported filter");
  const auto bytes = static_cast<std::size_t>(st.st_size);
  if (bytes == 0 || bytes % sizeof(sock_filter) != 0 || bytes / sizeof(sock_filter) > BPF_MAXINSNS) {
    return Error::invalid("exported filter has an invalid size of " + std::to_string(bytes) +
                          " bytes (at most " + std::to_string(BPF_MAXINSNS) + " instructions)");
  }
  std::vector<sock_filter> insns(bytes / sizeof(sock_filter));
  auto* out = reinterpret_cast<char*>(insns.data());
  std::size_t done = 0;
  while (done < bytes) {
    const ssize_t n = ::pread(fd.get(), out + done, bytes - done, static_cast<off_t>(done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Error::from_errno("reading the exported filter");
    }
    if (n == 0) return Error::invalid("exported filter is shorter than reported", EIO);
    done += static_cast<std::size_t>(n);
  }
  return insns;
}

Result<std::shared_ptr<const SeccompProgram>> compile_impl(const SeccompProfile& profile) {
  const std::uint32_t native = seccomp_arch_native();
  const std::string native_oci = seccomp_native_arch();
  if (profile.architectures.empty() || profile.architectures.front() != native_oci) {
    return Error::invalid("profile was resolved for " +
                          (profile.architectures.empty() ? std::string("no architecture")
                                                         : profile.architectures.front()) +
                          " but this machine is " + native_oci);
  }
  const ActionKey default_key = action_key(profile.default_action, profile.default_errno);
  ScmpCtx ctx(seccomp_init(to_scmp_action(profile.default_action, profile.default_errno)));
  if (!ctx) return Error::invalid("seccomp_init failed (invalid default action or out of memory)", ENOMEM);

  // The sandbox sets PR_SET_NO_NEW_PRIVS itself, before the load, and treats
  // a failure as fatal; libseccomp must not do it behind our back.
  if (Status s = scmp_check(seccomp_attr_set(ctx.get(), SCMP_FLTATR_CTL_NNP, 0), "seccomp_attr_set(CTL_NNP)"); !s) {
    return std::move(s).error();
  }
  // A syscall from an ABI the filter does not list (int 0x80 from x86_64,
  // the x32 bit) is an escape attempt or a bug; either way end the process.
  if (Status s = scmp_check(seccomp_attr_set(ctx.get(), SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_KILL_PROCESS),
                            "seccomp_attr_set(ACT_BADARCH)");
      !s) {
    return std::move(s).error();
  }
  // Binary search over syscall numbers instead of a linear chain: a few
  // hundred allowed syscalls otherwise cost a comparison each on every call.
  if (Status s = scmp_check(seccomp_attr_set(ctx.get(), SCMP_FLTATR_CTL_OPTIMIZE, 2),
                            "seccomp_attr_set(CTL_OPTIMIZE)");
      !s) {
    return std::move(s).error();
  }

  for (std::size_t i = 1; i < profile.architectures.size(); ++i) {
    const ArchRow* row = find_arch(profile.architectures[i]);
    const std::uint32_t token = row == nullptr ? 0 : arch_token(*row);
    if (token == 0) {
      return Error::invalid("architecture " + quoted_for_message(profile.architectures[i]) +
                            " is not supported by " + libseccomp_version());
    }
    if (Status s = scmp_check(seccomp_arch_add(ctx.get(), token),
                              "seccomp_arch_add(" + profile.architectures[i] + ")");
        !s) {
      return std::move(s).error();
    }
  }
  const bool native_only = profile.architectures.size() == 1;

  for (const SeccompRule& rule : profile.rules) {
    const std::string where = rule.where.empty() ? profile.source : rule.where;
    // libseccomp refuses a rule whose action is the default action (EACCES);
    // such a rule changes nothing, so it is left out.
    if (action_key(rule.action, rule.errno_ret) == default_key) continue;
    if (rule.action == SeccompAction::Errno && (rule.errno_ret < 0 || rule.errno_ret > static_cast<int>(kMaxErrno))) {
      return Error::invalid(where + ": errno " + std::to_string(rule.errno_ret) + " out of range");
    }
    std::vector<scmp_arg_cmp> cmps;
    for (const SeccompArg& arg : rule.args) {
      const OpRow* op = find_op(arg.op);
      if (op == nullptr || arg.index > 5) {
        return Error::invalid(where + ": invalid argument comparison " + quoted_for_message(arg.op) + " on argument " +
                              std::to_string(arg.index));
      }
      cmps.push_back(scmp_arg_cmp{arg.index, op->op, arg.value, arg.value_two});
    }
    const std::uint32_t action = to_scmp_action(rule.action, rule.errno_ret);
    for (const std::string& name : rule.names) {
      const std::string reason = unresolvable_reason(name, native, native_oci, native_only);
      if (!reason.empty()) return Error::invalid(where + ": " + reason);
      const int nr = seccomp_syscall_resolve_name(name.c_str());
      const int rc = seccomp_rule_add_array(ctx.get(), action, nr, static_cast<unsigned>(cmps.size()),
                                            cmps.empty() ? nullptr : cmps.data());
      if (Status s = scmp_check(rc, where + ": seccomp_rule_add_array(" + name + ")"); !s) {
        return std::move(s).error();
      }
    }
  }

  auto insns = export_program(ctx.get());
  if (!insns) return std::move(insns).error();
  auto program = std::make_shared<SeccompProgram>();
  program->name = profile.source;
  program->insns = std::move(insns).value();
  program->sha256 = sha256_hex(std::string_view(reinterpret_cast<const char*>(program->insns.data()),
                                                program->insns.size() * sizeof(sock_filter)));
  return std::shared_ptr<const SeccompProgram>(std::move(program));
}

}  // namespace

std::string seccomp_action_name(SeccompAction action, int errno_ret) {
  switch (action) {
    case SeccompAction::Allow: return "SCMP_ACT_ALLOW";
    case SeccompAction::Errno: return "SCMP_ACT_ERRNO(" + std::to_string(errno_ret) + ")";
    case SeccompAction::KillProcess: return "SCMP_ACT_KILL_PROCESS";
    case SeccompAction::KillThread: return "SCMP_ACT_KILL_THREAD";
    case SeccompAction::Trap: return "SCMP_ACT_TRAP";
    case SeccompAction::Log: return "SCMP_ACT_LOG";
    case SeccompAction::Trace: return "SCMP_ACT_TRACE(" + std::to_string(errno_ret) + ")";
  }
  return "SCMP_ACT_UNKNOWN";
}

std::string seccomp_native_arch() {
  const std::uint32_t native = seccomp_arch_native();
  for (const auto& row : kArches) {
    if (arch_token(row) == native) return std::string(row.oci);
  }
  return "SCMP_ARCH_UNKNOWN";
}

Result<SeccompProfile> parse_seccomp_profile(const LocatedJson& doc, const SeccompParseOptions& options) {
  try {
    return ProfileParser(doc, options).run();
  } catch (const std::bad_alloc&) {
    return Error::invalid(doc.source + ": out of memory while parsing the profile", ENOMEM);
  } catch (const std::exception& e) {
    return Error::invalid(doc.source + ": " + e.what());
  }
}

// (parse_jsonc answers its own failures, out of memory included.)
Result<SeccompProfile> parse_seccomp_profile(std::string_view text, std::string_view source,
                                             const SeccompParseOptions& options) {
  auto doc = parse_jsonc(text, source);
  if (!doc) return std::move(doc).error();
  return parse_seccomp_profile(*doc, options);
}

Result<SeccompProfile> parse_seccomp_profile(std::string_view text, std::string_view source) {
  return parse_seccomp_profile(text, source, SeccompParseOptions{});
}

Result<SeccompProfile> load_seccomp_profile_file(const std::string& path, const SeccompParseOptions& options) {
  auto text = read_file(path, {.max_bytes = kMaxProfileBytes, .regular_only = true});
  if (!text.ok()) return std::move(text).error();
  return parse_seccomp_profile(*text, path, options);
}

Result<SeccompProfile> load_seccomp_profile_file(const std::string& path) {
  return load_seccomp_profile_file(path, SeccompParseOptions{});
}

Result<std::shared_ptr<const SeccompProgram>> compile_seccomp(const SeccompProfile& profile) {
  try {
    auto r = compile_impl(profile);
    if (!r) return std::move(r).error().wrap("compiling seccomp profile " + quoted_for_message(profile.source));
    return r;
  } catch (const std::bad_alloc&) {
    return Error::invalid("compiling seccomp profile: out of memory", ENOMEM);
  }
}

const std::vector<std::string>& init_filter_syscalls() {
  // What the sandbox init does after loading its filter (isolate/init/init.cc):
  // close `ready`, wait in poll on its signalfd, the engine's watch pipe and
  // the end note, read a signal or the note's byte, reap children, write one
  // report record, exit. The allocator-facing calls (brk, mmap, munmap) are
  // for libc internals of the static binary; mmap cannot gain anything that
  // execve would, and execve itself is absent. It signals nobody: it ends
  // the sandbox by exiting.
  static const std::vector<std::string> names = {
      "brk",   "clock_gettime", "close", "exit",    "exit_group",      "mmap",         "munmap",
      "poll",  "ppoll",         "read",  "restart_syscall", "rt_sigreturn", "wait4", "waitid", "write",
  };
  return names;
}

Result<std::shared_ptr<const SeccompProgram>> compile_init_filter() {
  SeccompProfile profile;
  profile.source = "<sandbox init filter>";
  // Anything else the init does is a bug or an exploited init: kill it, and
  // with it (pid 1) the whole sandbox.
  profile.default_action = SeccompAction::KillProcess;
  profile.default_errno = 0;
  profile.architectures = {seccomp_native_arch()};
  SeccompRule rule;
  rule.names = init_filter_syscalls();
  rule.action = SeccompAction::Allow;
  rule.comment = "sandbox init: reap, watch the engine, report, exit";
  rule.where = profile.source;
  profile.rules.push_back(std::move(rule));
  return compile_seccomp(profile);
}

}  // namespace tsb::policy
