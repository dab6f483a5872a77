#include "daemon/policy/policy_explain.h"
#include "daemon/policy/e2b_network.h"

#include <seccomp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <set>
#include <optional>
#include <sstream>

#include "daemon/policy/policy_lint.h"
#include "daemon/policy/units.h"
#include "isolate/engine/engine.h"
#include "daemon/policy/jsonc.h"
#include "daemon/policy/fs_table.h"
#include "isolate/engine/plan.h"
#include "daemon/policy/syscall_groups.h"

namespace tsb::core {
namespace {

using policy::SeccompAction;

// "a, b, c"; `empty` for none.
std::string comma_list(const std::vector<std::string>& items, const std::string& empty = "") {
  std::string s;
  for (const auto& i : items) s += (s.empty() ? "" : ", ") + i;
  return s.empty() ? empty : s;
}

// ---------------------------------------------------------------------------
// Names for syscall arguments and their values, so conditions read as the
// man pages write them. Values are the kernel's ABI numbers (the numbers a
// profile compares), named as in the man pages.

struct ValueName {
  std::uint64_t value;
  std::string_view name;
};

constexpr ValueName kFamilies[] = {
    {AF_UNSPEC, "AF_UNSPEC"},   {AF_UNIX, "AF_UNIX"},       {AF_INET, "AF_INET"},
    {AF_AX25, "AF_AX25"},       {AF_IPX, "AF_IPX"},         {AF_APPLETALK, "AF_APPLETALK"},
    {AF_NETROM, "AF_NETROM"},   {AF_BRIDGE, "AF_BRIDGE"},   {AF_ATMPVC, "AF_ATMPVC"},
    {AF_X25, "AF_X25"},         {AF_INET6, "AF_INET6"},     {AF_ROSE, "AF_ROSE"},
    {AF_DECnet, "AF_DECnet"},   {AF_NETBEUI, "AF_NETBEUI"}, {AF_SECURITY, "AF_SECURITY"},
    {AF_KEY, "AF_KEY"},         {AF_NETLINK, "AF_NETLINK"}, {AF_PACKET, "AF_PACKET"},
    {AF_RDS, "AF_RDS"},         {AF_CAN, "AF_CAN"},         {AF_TIPC, "AF_TIPC"},
    {AF_BLUETOOTH, "AF_BLUETOOTH"}, {AF_ALG, "AF_ALG"},     {AF_VSOCK, "AF_VSOCK"},
    {AF_KCM, "AF_KCM"},         {AF_XDP, "AF_XDP"},
};

// fcntl(2) commands (asm-generic/fcntl.h, linux/fcntl.h; x86-64 values).
constexpr ValueName kFcntlCommands[] = {
    {0, "F_DUPFD"},          {1, "F_GETFD"},         {2, "F_SETFD"},
    {3, "F_GETFL"},          {4, "F_SETFL"},         {5, "F_GETLK"},
    {6, "F_SETLK"},          {7, "F_SETLKW"},        {8, "F_SETOWN"},
    {9, "F_GETOWN"},         {10, "F_SETSIG"},       {11, "F_GETSIG"},
    {15, "F_SETOWN_EX"},     {16, "F_GETOWN_EX"},    {17, "F_GETOWNER_UIDS"},
    {36, "F_OFD_GETLK"},     {37, "F_OFD_SETLK"},    {38, "F_OFD_SETLKW"},
    {1024, "F_SETLEASE"},    {1025, "F_GETLEASE"},   {1026, "F_NOTIFY"},
    {1030, "F_DUPFD_CLOEXEC"}, {1031, "F_SETPIPE_SZ"}, {1032, "F_GETPIPE_SZ"},
    {1033, "F_ADD_SEALS"},   {1034, "F_GET_SEALS"},  {1035, "F_GET_RW_HINT"},
    {1036, "F_SET_RW_HINT"}, {1037, "F_GET_FILE_RW_HINT"}, {1038, "F_SET_FILE_RW_HINT"},
};

// clone(2)/unshare(2) flags and setns(2) namespace types (linux/sched.h).
constexpr ValueName kCloneFlags[] = {
    {0x00000100, "CLONE_VM"},           {0x00000200, "CLONE_FS"},
    {0x00000400, "CLONE_FILES"},        {0x00000800, "CLONE_SIGHAND"},
    {0x00001000, "CLONE_PIDFD"},        {0x00002000, "CLONE_PTRACE"},
    {0x00004000, "CLONE_VFORK"},        {0x00008000, "CLONE_PARENT"},
    {0x00010000, "CLONE_THREAD"},       {0x00020000, "CLONE_NEWNS"},
    {0x00040000, "CLONE_SYSVSEM"},      {0x00080000, "CLONE_SETTLS"},
    {0x00100000, "CLONE_PARENT_SETTID"}, {0x00200000, "CLONE_CHILD_CLEARTID"},
    {0x00400000, "CLONE_DETACHED"},     {0x00800000, "CLONE_UNTRACED"},
    {0x01000000, "CLONE_CHILD_SETTID"}, {0x02000000, "CLONE_NEWCGROUP"},
    {0x04000000, "CLONE_NEWUTS"},       {0x08000000, "CLONE_NEWIPC"},
    {0x10000000, "CLONE_NEWUSER"},      {0x20000000, "CLONE_NEWPID"},
    {0x40000000, "CLONE_NEWNET"},       {0x80000000, "CLONE_IO"},
};

// personality(2) (linux/personality.h); 0xffffffff only reads the domain.
constexpr ValueName kPersonalities[] = {
    {0x0000, "PER_LINUX"},
    {0x0008, "PER_LINUX32"},
    {0x20000, "UNAME26"},
    {0x20008, "PER_LINUX32|UNAME26"},
    {0xffffffff, "0xffffffff (query only)"},
};

constexpr ValueName kIoctlRequests[] = {
    {0x5412, "TIOCSTI"},
    {0x541C, "TIOCLINUX"},
    {0x5423, "TIOCSETD"},
};

struct ArgNames {
  std::string_view syscall;
  std::string_view args[6];
};
constexpr ArgNames kArgNames[] = {
    {"clone", {"flags", "stack", "parent_tid", "child_tid", "tls", ""}},
    {"fcntl", {"fd", "cmd", "arg", "", "", ""}},
    {"ioctl", {"fd", "request", "arg", "", "", ""}},
    {"kill", {"pid", "sig", "", "", "", ""}},
    {"mmap", {"addr", "length", "prot", "flags", "fd", "offset"}},
    {"mprotect", {"addr", "length", "prot", "", "", ""}},
    {"personality", {"persona", "", "", "", "", ""}},
    {"prctl", {"option", "arg2", "arg3", "arg4", "arg5", ""}},
    {"ptrace", {"request", "pid", "addr", "data", "", ""}},
    {"setns", {"fd", "nstype", "", "", "", ""}},
    {"socket", {"family", "type", "protocol", "", "", ""}},
    {"socketpair", {"family", "type", "protocol", "sv", "", ""}},
    {"unshare", {"flags", "", "", "", "", ""}},
};

struct ArgValues {
  std::string_view syscall;
  unsigned index;
  const ValueName* begin;
  const ValueName* end;
  bool flags;  // a bit set: masks are named bit by bit
};
constexpr ArgValues kArgValues[] = {
    {"clone", 0, std::begin(kCloneFlags), std::end(kCloneFlags), true},
    {"fcntl", 1, std::begin(kFcntlCommands), std::end(kFcntlCommands), false},
    {"ioctl", 1, std::begin(kIoctlRequests), std::end(kIoctlRequests), false},
    {"personality", 0, std::begin(kPersonalities), std::end(kPersonalities), false},
    {"setns", 1, std::begin(kCloneFlags), std::end(kCloneFlags), false},
    {"socket", 0, std::begin(kFamilies), std::end(kFamilies), false},
    {"socketpair", 0, std::begin(kFamilies), std::end(kFamilies), false},
    {"unshare", 0, std::begin(kCloneFlags), std::end(kCloneFlags), true},
};

std::string arg_label(std::string_view syscall, unsigned index) {
  const std::string n = "arg" + std::to_string(index);
  for (const auto& row : kArgNames) {
    if (row.syscall == syscall && index < 6 && !row.args[index].empty()) return std::string(row.args[index]) + " (" + n + ")";
  }
  return n;
}

const ArgValues* arg_values(std::string_view syscall, unsigned index) {
  for (const auto& row : kArgValues)
    if (row.syscall == syscall && row.index == index) return &row;
  return nullptr;
}

std::string hex(std::uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string number(std::uint64_t v) { return v < 0x10000 ? std::to_string(v) : hex(v); }

// A value of an argument: its name when the table knows it, else a number.
std::string value_text(std::string_view syscall, unsigned index, std::uint64_t v) {
  if (const ArgValues* t = arg_values(syscall, index)) {
    for (const ValueName* row = t->begin; row != t->end; ++row)
      if (row->value == v) return std::string(row->name);
  }
  return number(v);
}

// "CLONE_NEWNS, CLONE_NEWUTS" when every bit of `mask` has a name.
std::optional<std::string> flag_names(std::string_view syscall, unsigned index, std::uint64_t mask) {
  const ArgValues* t = arg_values(syscall, index);
  if (t == nullptr || !t->flags || mask == 0) return std::nullopt;
  std::string out;
  std::uint64_t named = 0;
  for (const ValueName* row = t->begin; row != t->end; ++row) {
    if ((mask & row->value) == row->value) {
      out += (out.empty() ? "" : ", ") + std::string(row->name);
      named |= row->value;
    }
  }
  if (named != mask) return std::nullopt;
  return out;
}

std::string describe_arg(std::string_view syscall, const policy::SeccompArg& a) {
  const std::string who = arg_label(syscall, a.index);
  const std::string& op = a.op;
  if (op == "SCMP_CMP_EQ") return who + " is " + value_text(syscall, a.index, a.value);
  if (op == "SCMP_CMP_NE") return who + " is not " + value_text(syscall, a.index, a.value);
  const auto cmp = [&](const char* sym) {
    std::string v = number(a.value);
    std::string name = value_text(syscall, a.index, a.value);
    return who + " " + sym + " " + v + (name != v ? " (" + name + ")" : "");
  };
  if (op == "SCMP_CMP_LT") return cmp("<");
  if (op == "SCMP_CMP_LE") return cmp("<=");
  if (op == "SCMP_CMP_GT") return cmp(">");
  if (op == "SCMP_CMP_GE") return cmp(">=");
  if (op == "SCMP_CMP_MASKED_EQ") {
    // OCI: `value` is the mask, `valueTwo` the datum.
    const std::uint64_t mask = a.value, datum = a.value_two;
    if (mask == 0xffffffffu) return who + " (low 32 bits) is " + value_text(syscall, a.index, datum);
    if (auto names = flag_names(syscall, a.index, mask)) {
      if (datum == 0) return who + " has none of " + *names;
      if (datum == mask) return who + " has all of " + *names;
    }
    return who + " & " + hex(mask) + " == " + hex(datum);
  }
  return who + " " + op + " " + number(a.value);
}

// ---------------------------------------------------------------------------
// Text layout.

std::string pad(std::string s, std::size_t width) {
  if (s.size() + 2 > width) return s + "  ";
  s.resize(width, ' ');
  return s;
}

// A line, flagged or not: "!" replaces the first column.
std::string line(bool flagged, const std::string& text) {
  std::string s = (flagged ? "!" : " ") + text;
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s + "\n";
}

std::string cpus_text(std::uint32_t millicpus) {
  std::string s = std::to_string(millicpus / 1000);
  if (millicpus % 1000 != 0) {
    char frac[8];
    std::snprintf(frac, sizeof frac, "%03u", millicpus % 1000);
    std::string f = frac;
    while (!f.empty() && f.back() == '0') f.pop_back();
    s += "." + f;
  }
  return s;
}

// ---------------------------------------------------------------------------
// File system: the rows of the one table (daemon/policy/fs_table.h).

// What the engine does with a host path on this machine, as it decides per
// run (isolate/engine/mounts.cc): a "[host]" sentence.
std::string host_fact(const isolate::FsEntry& e) {
  const std::string& path = e.kind == isolate::FsEntry::kSystem ? e.path : e.source;
  const std::string missing = e.optional ? "skipped" : "the run would fail";
  struct stat st{};
  if (e.kind == isolate::FsEntry::kSystem && ::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
    char target[4096];
    ssize_t n = ::readlink(path.c_str(), target, sizeof target - 1);
    if (n <= 0) return path + ": an unreadable symlink, skipped";
    target[n] = '\0';
    if (target[0] != '/' || std::string_view(target).starts_with("/usr/"))
      return path + " -> " + target + ": the symlink is recreated";
    char real[4096];
    if (::realpath(path.c_str(), real) == nullptr) return path + " -> " + target + ": dangling, skipped";
    return path + " -> " + target + ": shown as " + real + " (the host's symlink, resolved)";
  }
  if (::stat(path.c_str(), &st) != 0) return path + ": missing on this host (" + missing + ")";
  if (e.kind == isolate::FsEntry::kBind) return path + ": present on this host";
  if (S_ISDIR(st.st_mode)) return path + ": directory, read-only view";
  if (S_ISREG(st.st_mode) && static_cast<std::uint64_t>(st.st_size) <= isolate::kMaxCopiedFileBytes)
    return path + ": file, copied read-only";
  return path + ": bound read-only (mountinfo shows its host path)";
}

// The runner's host path is the daemon configuration's, not the policy's:
// the table is built with this stand-in, and the page names it in words.
constexpr const char* kRunnerStandIn = "/toolsandbox-runner";

}  // namespace

// ---------------------------------------------------------------------------
// Profile views.

bool action_runs_syscall(SeccompAction action) noexcept {
  return action == SeccompAction::Allow || action == SeccompAction::Log;
}

ProfileView view_profile(const policy::SeccompProfile& profile) {
  ProfileView v;
  v.default_action = profile.default_action;
  v.default_data = profile.default_errno;
  for (const auto& rule : profile.rules) {
    for (const auto& name : rule.names) {
      SyscallRuleView r;
      r.action = rule.action;
      r.data = rule.errno_ret;
      r.args = rule.args;
      r.where = rule.where;
      r.pointer = rule.pointer;
      v.syscalls[name].push_back(std::move(r));
    }
  }
  return v;
}

SyscallFate syscall_fate(const ProfileView& view, const std::string& name) {
  auto it = view.syscalls.find(name);
  if (it == view.syscalls.end())
    return action_runs_syscall(view.default_action) ? SyscallFate::Allowed : SyscallFate::Refused;
  bool some_allow = false;
  for (const auto& r : it->second) {
    // libseccomp keeps an unconditional rule over conditional ones, and the
    // parser refuses a conflicting pair, so an unconditional rule decides.
    if (r.args.empty()) return action_runs_syscall(r.action) ? SyscallFate::Allowed : SyscallFate::Refused;
    some_allow = some_allow || action_runs_syscall(r.action);
  }
  // Only conditional rules: the arguments none of them matches get the
  // default action.
  if (some_allow || action_runs_syscall(view.default_action)) return SyscallFate::AllowedSometimes;
  return SyscallFate::Refused;
}

std::string errno_label(int err) {
  if (err == 0) return "errno 0 (reports success without running)";
  const char* name = ::strerrorname_np(err);
  return (name ? std::string(name) : "errno") + " (" + std::to_string(err) + ")";
}

std::string action_effect(SeccompAction action, int data) {
  switch (action) {
    case SeccompAction::Allow: return "allowed";
    case SeccompAction::Log: return "allowed, logged";
    case SeccompAction::Errno: return errno_label(data);
    case SeccompAction::KillProcess: return "kills the process";
    case SeccompAction::KillThread: return "kills the thread";
    case SeccompAction::Trap: return "SIGSYS (trap)";
    case SeccompAction::Trace: return "trace " + std::to_string(data) + " (ENOSYS without a tracer)";
  }
  return "unknown action";
}

std::vector<std::string> describe_conditions(std::string_view syscall, const std::vector<SyscallRuleView>& rules) {
  std::map<unsigned, std::vector<std::uint64_t>> equal;  // single "arg == value" rules, by argument
  // Single-bit tests ("(arg & bit) == bit" or "== 0"), by argument.
  std::map<unsigned, std::vector<std::uint64_t>> bits_set, bits_clear;
  std::vector<std::string> other;
  for (const auto& r : rules) {
    if (r.args.empty()) continue;
    if (r.args.size() == 1 && r.args[0].op == "SCMP_CMP_EQ") {
      equal[r.args[0].index].push_back(r.args[0].value);
      continue;
    }
    const auto& a = r.args[0];
    if (r.args.size() == 1 && a.op == "SCMP_CMP_MASKED_EQ" && a.value != 0 && (a.value & (a.value - 1)) == 0 &&
        (a.value_two == 0 || a.value_two == a.value)) {
      (a.value_two != 0 ? bits_set : bits_clear)[a.index].push_back(a.value);
      continue;
    }
    std::vector<policy::SeccompArg> args = r.args;
    std::sort(args.begin(), args.end(), [](const auto& a, const auto& b) { return a.index < b.index; });
    std::string clause;
    for (const auto& a : args) clause += (clause.empty() ? "" : " and ") + describe_arg(syscall, a);
    other.push_back(std::move(clause));
  }
  std::vector<std::string> out;
  for (auto& [index, values] : equal) {
    std::sort(values.begin(), values.end());
    values.erase(std::unique(values.begin(), values.end()), values.end());
    std::string clause = arg_label(syscall, index) + " is ";
    for (std::size_t i = 0; i < values.size(); ++i) clause += (i ? ", " : "") + value_text(syscall, index, values[i]);
    out.push_back(std::move(clause));
  }
  for (auto* bits : {&bits_set, &bits_clear}) {
    const bool set = bits == &bits_set;
    for (auto& [index, values] : *bits) {
      std::sort(values.begin(), values.end());
      values.erase(std::unique(values.begin(), values.end()), values.end());
      std::uint64_t mask = 0;
      for (auto v : values) mask |= v;
      auto names = set ? flag_names(syscall, index, mask) : std::nullopt;
      std::string clause = arg_label(syscall, index) + " has ";
      if (names && values.size() == 1) {
        clause += *names;
      } else if (names) {
        clause += "any of " + *names;
      } else {
        clause += values.size() == 1 ? "bit " : "any of bits ";
        for (std::size_t i = 0; i < values.size(); ++i) clause += (i ? ", " : "") + std::to_string(__builtin_ctzll(values[i]));
        clause += set ? " set" : " clear";
      }
      out.push_back(std::move(clause));
    }
  }
  out.insert(out.end(), other.begin(), other.end());
  return out;
}

// ---------------------------------------------------------------------------
// Mount rows.

std::vector<MountRow> mount_rows(const Policy& p) {
  using E = isolate::FsEntry;
  std::vector<MountRow> rows;
  auto table = isolate::build_fs_table(fs_inputs_from(p, kRunnerStandIn));
  if (!table.ok()) return rows;
  std::string dev;  // the /dev row's path: the rows inside it are the engine's
  for (const E& e : **table) {
    MountRow r;
    r.path = e.path;
    r.note = e.reason;
    r.optional = e.optional;
    r.entry = e;
    r.inside_parent_mount = !dev.empty() && e.path.starts_with(dev + "/") && e.kind != E::kTmpfs;
    const std::string size = format_size(e.size);
    switch (e.kind) {
      case E::kRoot: r.type = "tmpfs", r.mode = "ro", r.source = size + " + copies"; break;
      case E::kSystem: r.type = "system", r.mode = "ro", r.source = "host " + e.path; break;
      case E::kHost: r.type = "view", r.mode = "ro", r.source = "host " + e.source; break;
      case E::kBind: r.type = "bind", r.mode = "rw", r.source = "host " + e.source; break;
      case E::kTmpfs: r.type = "tmpfs", r.mode = e.noexec ? "rw,noexec" : "rw", r.source = size; break;
      case E::kDev: r.type = "tmpfs", r.mode = "ro,noexec", r.source = size, dev = e.path; break;
      case E::kDevNode: r.type = "device", r.mode = "rw,noexec", r.source = "like host " + e.source; break;
      case E::kDir: r.type = "dir", r.mode = r.inside_parent_mount ? "-" : "ro", r.source = "mode " + mode_string(e.mode); break;
      case E::kSymlink: r.type = "symlink", r.mode = "-", r.source = "-> " + e.source; break;
      case E::kFile: r.type = "file", r.mode = "ro", r.source = "generated"; break;
      case E::kProc: r.type = "proc", r.mode = "rw,noexec", r.source = "new instance"; break;
      case E::kBootId:
      case E::kMask:
        r.type = "masked", r.mode = "ro";
        r.source = e.kind == E::kBootId ? "random per run" : S_ISDIR(e.mode) ? "empty directory" : "empty file";
        break;
      case E::kReadOnly: r.type = "bind", r.mode = "ro", r.source = "itself"; break;
    }
    if (e.path == isolate::kRunnerSandboxPath) r.source = "the daemon's runner";
    if (e.kind == E::kHost || e.kind == E::kBind) {
      if (auto why = sensitive_host_path_reason(e.source); why && e.source != kRunnerStandIn) {
        r.note += "; sensitive host path: " + std::string(*why);
        r.flagged = true;
      }
      r.flagged = r.flagged || e.kind == E::kBind;
    }
    rows.push_back(std::move(r));
  }
  return rows;
}

// ---------------------------------------------------------------------------
// The page.

namespace {

// One "  key            value" line of the page's key-value blocks.
void kv(std::ostream& out, const char* key, const std::string& value) { out << "  " << pad(key, 15) << value << "\n"; }

// The heading: which policy, where it came from, and how to read the
// flags the lines below carry.
void explain_header(std::ostream& out, const Policy& p) {
  out << "Policy " << p.name << "\n";
  kv(out, "source", p.source);
  kv(out, "fingerprint", p.fingerprint);
  kv(out, "description", p.description.empty() ? "(none)" : p.description);
  kv(out, "backend", p.backend == Backend::E2B
                         ? "e2b: runs in an E2B sandbox; the namespaces, file system and seccomp below are not what E2B enforces"
                         : "local: runs on the daemon's host, in the sandbox described below");
  kv(out, "include", p.include.empty() ? "(none)" : p.include);
  kv(out, "interpreter", p.interpreter);
  out << "\n"
      << "Lines starting with \"!\" are dangerous grants, all listed again at the end.\n";
  out << "Lines starting with \"[host]\" describe the machine this ran on, not the policy (--no-host omits them).\n";
}

// Namespaces: every one is new for each run; only network "host" shares
// the host's, and that line is flagged.
void explain_namespaces(std::ostream& out, const Policy& p) {
  const bool host_net = p.network == isolate::NetworkMode::Host;
  const std::string uid = std::to_string(p.uid), gid = std::to_string(p.gid);
  out << "\nNamespaces (all new for each run unless flagged)\n";
  out << "  user    sandbox ids 0-65535 map to 65536 host ids reserved for the run (engine uid_base +\n"
         "          slot * 65536, never host root); setgroups is denied\n"
         "          tool: uid " << uid << ", gid " << gid
      << ", no capabilities, no_new_privs, securebits locked\n"
         "          init (pid 1): uid 0 inside the namespace only, no capabilities\n";
  out << "  pid     the sandbox init is pid 1; host processes are invisible\n";
  out << "  mount   built as listed under \"File system\", then pivot_root; nothing propagates to the host\n";
  if (host_net)
    out << line(true, " net     host: shares the host's network namespace (every interface, services on the host's localhost, abstract Unix sockets)");
  else if (p.network == isolate::NetworkMode::Egress)
    out << "  net     loopback (lo) only, no route out; the daemon's proxy listens on 127.0.0.1:"
        << isolate::kEgressProxyPort << " (see \"Egress\")\n";
  else
    out << "  net     loopback (lo) only; no route out of the sandbox\n";
  out << "  ipc     System V IPC and POSIX message queues private to the run\n";
  out << "  uts     hostname " << quoted_for_message(p.hostname) << "\n";
  out << "  cgroup  rooted at the run's own cgroup leaf\n";
}

// Egress (network "egress" only): the proxy's rules in the order it
// applies them, and what it denies whatever they say. The "public" line
// is flagged when the lint flags it, so the page and the lint agree.
void explain_egress(std::ostream& out, const Policy& p, const std::vector<PolicyRisk>& risks) {
  if (p.network != isolate::NetworkMode::Egress) return;
  const EgressRules& e = p.egress;
  const auto ports_text = [](const std::vector<std::uint16_t>& ports) {
    std::string t;
    for (auto port : ports) t += (t.empty() ? "" : ", ") + std::to_string(port);
    return t;
  };
  out << "\nEgress (network \"egress\": out through the daemon's proxy only, in this order)\n";
  out << "  proxy     127.0.0.1:" << isolate::kEgressProxyPort
      << " in the sandbox: HTTP_PROXY, HTTPS_PROXY, ALL_PROXY and their lower-case\n"
         "            forms name it; CONNECT host:port (HTTPS) and http://host/ requests; anything else\n"
         "            (UDP and DNS, ICMP, raw sockets, TCP not through the proxy) has no route\n";
  if (e.allow.empty() && e.public_ports.empty()) out << "  allow     (nothing: every request is refused)\n";
  for (const auto& r : e.allow) {
    out << "  allow     " << comma_list(r.hosts) << " on port " << ports_text(r.ports) << "\n";
  }
  bool public_flagged = false;
  for (const auto& r : risks) public_flagged = public_flagged || r.pointer == "/egress/public";
  if (!e.public_ports.empty())
    out << line(public_flagged, " public    any public address on port " + ports_text(e.public_ports));
  out << "  names     resolved by the daemon; each address is checked, and only one that passes is\n"
         "            connected to (no DNS answer, rebinding or redirect reaches a denied one); an address\n"
         "            in a request, however spelled (0x7f.1, 2130706433, [::ffff:a.b.c.d]), is allowed\n"
         "            only by \"public\"\n";
  out << "  denied    always, whatever the rules say: loopback; the daemon host's own addresses (its\n"
         "            interfaces' and its local routes'); 10/8, 172.16/12, 192.168/16, fc00::/7 (private);\n"
         "            100.64/10 (CGNAT); 169.254/16 (the cloud metadata service) and fe80::/10\n"
         "            (link-local); 168.63.129.16 (Azure's host platform); multicast; 0/8 and ::\n"
         "            (unspecified); reserved and broadcast; IPv6 forms that carry any of these\n"
         "            (IPv4-mapped, IPv4-compatible, IPv4-translated, NAT64, 6to4)\n";
  out << "  caps      " << e.max_connections << " connections and " << format_size(e.max_bytes)
      << " (both ways together) per run; 128 open at once; closed after 120 s idle\n";
  out << "  audit     one line per connection: run, host, port, address, bytes each way, verdict\n";
}

// Packages (when enabled): what a run may ask pip for, where the builds
// get it from, and how the venvs they make are kept. Source builds are
// flagged when the lint flags them.
void explain_packages(std::ostream& out, const Policy& p, const std::vector<PolicyRisk>& risks) {
  if (!p.packages.enabled) return;
  const PackagesPolicy& k = p.packages;
  const std::string allow = comma_list(k.allow);
  bool src_flagged = false;
  for (const auto& r : risks) src_flagged = src_flagged || r.pointer == "/packages/source_builds";
  out << "\nPackages (a run with pip requirements gets a venv of its own at /venv)\n";
  out << "  allow     " << allow << " (fnmatch over normalised names); at most " << k.max_requirements
      << " per run; plain PEP 508 only (no options, URLs, paths or markers)\n";
  if (!k.wheels.empty())
    out << "  source    the wheel directory " << k.wheels << " (read-only to builds only); builds have no network\n";
  else
    out << "  source    the index " << k.index << "; builds reach " << k.index_host
        << [&] {
             std::string more;
             for (const auto& h : k.index_hosts) more += ", " + h;
             return more;
           }()
        << " on port " << k.index_port << " through the daemon's proxy, nothing else\n";
  out << line(src_flagged, std::string(" builds    ") + (k.source_builds ? "sdists allowed: their build code runs in the build sandbox"
                                                                        : "binary wheels only (pip --only-binary=:all:)"));
  out << "  sandbox   the engine's, with this policy's seccomp filter and user; a writable /venv tmpfs of "
      << format_size(k.venv_size) << "; " << format_duration(k.build_timeout) << " and " << format_size(k.build_memory)
      << "\n";
  out << "  cache     keyed by the host's Python, this source and the canonical set; published read-only and\n"
         "            bound read-only; least recently used venvs no run holds are removed past the cache's cap\n";
}

// TypeScript (when enabled): what runs a TypeScript tool, from where.
void explain_typescript(std::ostream& out, const Policy& p) {
  if (!p.typescript.enabled) return;
  const TypeScriptPolicy& t = p.typescript;
  out << "\nTypeScript (Letta's source_type \"typescript\", both modes, on this host)\n";
  out << "  runtime   " << t.node << ", the runner /opt/toolsandbox/runner/toolsandbox_ts_runner.js read-only\n";
  out << "  types     stripped by " << (t.strip_types == "esbuild" ? "esbuild " : "node-typescript ") << t.stripper()
      << "; parsed with " << kAcornPath << "\n";
  out << "  sandbox   this policy's: its file system (all of the above from the host's read-only /usr), seccomp\n"
         "            filter, user, limits and network; always cold (no warm pool)\n";
  const NpmPackagesPolicy& k = p.npm_packages;
  if (!k.enabled) {
    out << "  npm       none: a run with npm_requirements is refused\n";
    return;
  }
  out << "  npm       " << comma_list(k.allow, "none") << " (fnmatch over names); at most " << k.max_requirements
      << " per run; registry packages only (no URLs, git, paths or aliases)\n";
  if (!k.tarballs.empty())
    out << "  source    the tarball directory " << k.tarballs << " (read-only to builds only); builds have no network\n";
  else
    out << "  source    the registry " << k.registry << "; builds reach " << k.registry_host << " on port "
        << k.registry_port << " through the daemon's proxy, nothing else\n";
  out << "  builds    npm " << (k.install_scripts ? "runs packages' install scripts, in the build sandbox only"
                                                  : "runs no install script (--ignore-scripts)")
      << "; a writable /build tmpfs of " << format_size(k.size) << "; " << format_duration(k.build_timeout) << " and "
      << format_size(k.build_memory) << "\n";
  out << "  cache     a node_modules per set, beside the venvs, bound read-only at /node_modules for its run\n";
}

// Warm pool (when it has a size): how many sandboxes wait, and what they
// hold before their request arrives.
void explain_warm_pool(std::ostream& out, const Policy& p) {
  if (p.warm.max == 0) return;
  out << "\nWarm pool (sandboxes made before their request, each used by one run)\n";
  out << "  size      up to " << p.warm.max << " per mode, at least " << p.warm.min << "; one fewer for every "
      << format_duration(p.warm.idle) << " without a run, and none older\n";
  out << "  waiting   the policy's fixed environment only: the request's variables, code, arguments and\n"
         "            agent_state arrive at the hand-over; timeout and CPU time count from it\n";
  out << "  preload   scripts: " << comma_list(p.warm.preload, "nothing") << "\n"
      << "            tools: " << comma_list(p.warm.tool_preload, "nothing") << "\n"
      << "            imported before the hand-over, with the policy's fixed environment only\n"
         "            (a run that imports them pays nothing)\n";
  out << "  scripts   see the runner read-only at /opt/toolsandbox/runner, cold or warm, with or without a pool\n";
}

// Sessions (when enabled): what a session may start, for how long, and
// what it shares with the policy's runs.
void explain_sessions(std::ostream& out, const Policy& p) {
  if (!p.sessions.enabled) return;
  const SessionsPolicy& k = p.sessions;
  out << "\nSessions (one command each, an MCP server over stdio, on this host)\n";
  out << "  commands  " << comma_list(k.commands, "none") << "\n"
      << "            (a request names one by its path or its last component; nothing else starts)\n";
  out << "  limits    memory " << format_size(k.memory) << ", " << k.pids << " processes, CPU time "
      << format_duration(k.cpu_time) << ", at most " << format_duration(k.max_lifetime) << ", ended after "
      << format_duration(k.idle_timeout) << " without a byte, " << format_size(k.stream_bytes)
      << " through the stream\n";
  out << "  sandbox   this policy's: its file system, network, environment rules, seccomp filter and user;\n"
         "            its writable directories are tmpfs that end with the session (a workspace's with it); the tree is\n"
         "            killed when the client goes away, at any limit and at the daemon's stop\n";
  const std::string& node = p.typescript.node;
  const bool npx = p.npm_packages.enabled && std::find(k.commands.begin(), k.commands.end(), node) != k.commands.end();
  const bool uvx = p.packages.enabled && std::find(k.commands.begin(), k.commands.end(),
                                                   std::string(isolate::kVenvPath) + "/bin/python3") != k.commands.end();
  out << "  packages  " << (npx ? "`npx -y PACKAGE`: its node_modules as a TypeScript tool's, its bin run by " + node
                                : std::string("`npx`: refused (no typescript.packages, or its node is not a command)"))
      << "\n            "
      << (uvx ? std::string("`uvx PACKAGE`: its venv as a tool's, its console script run by /venv/bin/python3")
              : std::string("`uvx`: refused (no packages, or /venv/bin/python3 is not a command)"))
      << "\n            built before the session in a build sandbox, cached, read-only; npx and uvx never run\n";
  if (!k.workspace) {
    out << "  workspace none: a request that names one is refused\n";
    return;
  }
  out << "  workspace a request may name one: the organization's sandbox of that name, kept between its\n"
         "            sessions (one at a time), its /work (" << format_size(k.workspace_size)
      << ", counted in memory), /tmp and /dev/shm outliving each command;\n"
         "            every process of a session is killed at its end; the sandbox, its files and its CPU time\n"
         "            go on, until "
      << format_duration(k.workspace_idle_ttl) << " without a session, " << format_duration(k.max_lifetime)
      << " after its start, a limit or the daemon's stop\n";
}

// What every run gets from the engine, whatever the policy says, and
// what depends on the kernel of the host.
void explain_every_run(std::ostream& out, const Policy& p, const ExplainOptions& options) {
  out << "\nEvery run (engine, not policy)\n";
  const bool memfd_refused_by_profile =
      p.seccomp_profile && syscall_fate(view_profile(*p.seccomp_profile), "memfd_create") == SyscallFate::Refused;
  if (memfd_refused_by_profile)
    out << "  memfd   memfd_create is refused by the profile: no memfd exists to execute\n";
  else
    out << "  memfd   a binary written to a memfd cannot be executed: vm.memfd_noexec=2 in the run's pid\n"
           "          namespace (Linux 6.3+); on older kernels it can, unless the profile refuses memfd_create\n";
  if (options.host_facts && !memfd_refused_by_profile)
    out << "  [host] " << (::access("/proc/sys/vm/memfd_noexec", F_OK) == 0
                               ? "this kernel has vm.memfd_noexec: memfd execution is refused"
                               : "this kernel has no vm.memfd_noexec: memfd execution is NOT refused")
        << "\n";
  out << "  socket  socket buffers count toward the run's memory (v2: memory.max; v1: memory.kmem.tcp.limit_in_bytes); at it the run ends as memory_limit\n";
  out << "  oom     oom_score_adj 1000 (engine.sandbox_oom_score_adj): under memory pressure runs die first\n";
  out << "  death   a run ends within a second of the daemon's death (death signal; init watches the daemon's\n"
         "          pipe), and init ends it itself 5 s (or 10 %) after the wall timeout if the daemon does not\n";
  out << "  hidden  /proc/cmdline masked; boot_id random per run; mountinfo names no host path, device or uid\n";
}

// File system: the rows of the one table the sandbox is built from, each
// host path followed by what this host has there (unless --no-host).
void explain_file_system(std::ostream& out, const Policy& p, const ExplainOptions& options) {
  out << "\nFile system (the table the sandbox is built from, in order; every mount is nosuid and nodev except\n"
         "/dev. system: a host path as the host has it (a symlink recreated, a directory a view, a small file a\n"
         "copy); view: a read-only overlay of a host directory, or a read-only copy of a small host file, so\n"
         "mountinfo names no host path; rows inside /dev are made by the engine before /dev turns read-only)\n";
  out << "  " << pad("PATH", 24) << pad("TYPE", 9) << pad("MODE", 11) << pad("SOURCE", 32) << "NOTE\n";
  for (const auto& r : mount_rows(p)) {
    out << line(r.flagged, " " + pad(r.path, 24) + pad(r.type, 9) + pad(r.mode, 11) + pad(r.source, 32) + r.note);
    using E = isolate::FsEntry;
    const E& e = r.entry;
    if (options.host_facts && (e.kind == E::kSystem || e.kind == E::kHost || e.kind == E::kBind) &&
        e.source != kRunnerStandIn)
      out << "  [host] " << host_fact(e) << "\n";
  }
}

// Limits: each with what enforces it; a limit the lint flags is flagged
// here too.
void explain_limits(std::ostream& out, const Policy& p, const std::vector<PolicyRisk>& risks) {
  out << "\nLimits\n";
  const auto limit = [&](const char* key, const std::string& value, const std::string& note) {
    bool flagged = false;
    for (const auto& r : risks)
      if (r.anchor == PolicyRisk::Anchor::PolicyKey && r.pointer == std::string("/limits/") + key) flagged = true;
    out << line(flagged, " " + pad(key, 14) + pad(value, 9) + note);
  };
  const isolate::Limits& l = p.limits;
  limit("wall_timeout", format_duration(l.wall_timeout), "the whole run; then every process of the run is killed");
  limit("cpu_time", format_duration(l.cpu_time),
        l.cpu_time.count() == 0 ? "no CPU-time limit (only the wall clock ends a busy run)"
                                : "CPU time of all processes of the run together");
  limit("memory", format_size(l.memory_bytes), "cgroup memory.max, no swap; tmpfs contents count; OOM ends the run");
  limit("pids", std::to_string(l.pids), "processes and threads of the run (pids.max and RLIMIT_NPROC)");
  limit("cpus", cpus_text(l.cpu_quota_millicpus), "CPU quota (cpu.max)");
  limit("tmp_size", format_size(l.tmp_bytes), "tmpfs /tmp; /dev/shm gets the same, at most 64MiB");
  limit("work_size", format_size(l.work_bytes), "tmpfs " + p.workdir);
  limit("stdout", format_size(l.stdout_bytes), "captured; past it the run ends");
  limit("stderr", format_size(l.stderr_bytes), "captured; past it the run ends");
  limit("result", format_size(p.result_bytes), "largest result a tool returns (tool mode, a pickle's decoding)");
  limit("file_size", format_size(l.file_size_bytes), "largest file a process may write (RLIMIT_FSIZE)");
  limit("open_files", std::to_string(l.open_files), "descriptors per process (RLIMIT_NOFILE)");
  out << "  " << pad("core dumps", 14) << pad("none", 9) << "RLIMIT_CORE 0 (not a policy setting)\n";
}

// Environment: what the policy fixes and what a request may add; "*"
// (any name) is flagged.
void explain_environment(std::ostream& out, const Policy& p) {
  out << "\nEnvironment (the daemon's own environment never reaches the tool)\n";
  out << "  fixed by the policy; a request cannot change them:\n";
  if (p.env_set.empty()) out << "    (none)\n";
  for (const auto& [k, v] : p.env_set) out << "    " << k << "=" << v << "\n";
  out << "  a request may set:\n";
  std::vector<std::string> allow = p.env_allow;
  std::sort(allow.begin(), allow.end());
  if (allow.empty()) out << "    (nothing)\n";
  for (const auto& a : allow) {
    if (a == "*") out << line(true, "   * (any name the policy does not fix)");
    else out << "    " << a << (a.back() == '*' ? " (any name with this prefix)" : "") << "\n";
  }
}

// One allowed syscall's line, with the argument conditions it runs under
// (or the ones that refuse it) on lines of their own; flagged when it is
// dangerous and not inert in this sandbox.
void explain_allowed_syscall(std::ostream& out, const ProfileView& view, const std::string& name) {
  const auto& rules = view.syscalls.at(name);
  const SyscallFate fate = syscall_fate(view, name);
  std::vector<SyscallRuleView> allowing, refusing;
  for (const auto& r : rules) (action_runs_syscall(r.action) ? allowing : refusing).push_back(r);
  std::vector<std::string> clauses;
  std::string lead;
  if (fate == SyscallFate::AllowedSometimes && !allowing.empty()) {
    clauses = describe_conditions(name, allowing);
    lead = "only when ";
  } else if (fate == SyscallFate::AllowedSometimes) {
    clauses = describe_conditions(name, refusing);
    lead = "except when ";
  }
  const bool logged = std::any_of(allowing.begin(), allowing.end(),
                                  [](const auto& r) { return r.action == SeccompAction::Log; });
  const bool conditional = fate == SyscallFate::AllowedSometimes;
  const bool dangerous = dangerous_syscall_reason(name, conditional).has_value() && !inert_syscall_reason(name);
  std::string text = "     " + name + (logged ? " [logged]" : "");
  if (clauses.empty()) {
    out << line(dangerous, text);
    return;
  }
  out << line(dangerous, text + ": " + lead + clauses[0]);
  const std::string indent(6 + name.size() + 2 + (logged ? 9 : 0) + lead.size() - 3, ' ');
  for (std::size_t i = 1; i < clauses.size(); ++i) out << indent << "or " << clauses[i] << "\n";
}

// The syscalls the profile lets run, each under the first group that
// lists it (groups in their table's order), then those in no group.
void explain_allowed_syscalls(std::ostream& out, const ProfileView& view, bool default_runs) {
  std::map<std::string, std::vector<std::string>> by_group;  // group name -> syscalls
  std::size_t n_allowed = 0, n_some = 0;
  for (const auto& [name, rules] : view.syscalls) {
    const SyscallFate fate = syscall_fate(view, name);
    if (fate == SyscallFate::Refused) continue;
    ++n_allowed;
    if (fate == SyscallFate::AllowedSometimes) ++n_some;
    const auto groups = policy::syscall_groups_of(name);
    by_group[groups.empty() ? std::string() : std::string(groups.front())].push_back(name);
  }
  out << "  allowed: " << n_allowed << " syscalls (" << n_some << " only for some arguments)"
      << (default_runs ? ", and every syscall not listed" : "") << "; each under its first group\n";
  for (const auto& g : policy::syscall_groups()) {
    auto it = by_group.find(std::string(g.name));
    if (it == by_group.end()) continue;
    out << "    " << g.name << ": " << g.help << "\n";
    for (const auto& name : it->second) explain_allowed_syscall(out, view, name);
  }
  if (auto it = by_group.find(""); it != by_group.end()) {
    out << "    (in no group)\n";
    for (const auto& name : it->second) explain_allowed_syscall(out, view, name);
  }
}

// A refused syscall under one effect: its name, and the argument
// conditions that refuse it (none: refused always).
struct Refusal {
  std::string name;
  std::vector<std::string> clauses;
};

// Where an effect's block comes on the page: the mildest first (an errno
// a program can handle), the process kill last.
int refusal_order(SeccompAction a) {
  switch (a) {
    case SeccompAction::Errno: return 0;
    case SeccompAction::Trace: return 1;
    case SeccompAction::Trap: return 2;
    case SeccompAction::KillThread: return 3;
    case SeccompAction::KillProcess: return 4;
    default: return 5;
  }
}

// The syscalls the profile names to refuse, grouped by what the caller
// gets (each errno its own block), so a reader sees what a program meets.
void explain_refused_syscalls(std::ostream& out, const ProfileView& view) {
  std::map<std::pair<int, int>, std::pair<std::string, std::vector<Refusal>>> refused;  // (order, data) -> label, rows
  std::size_t n_refused = 0, n_refused_some = 0;
  for (const auto& [name, rules] : view.syscalls) {
    std::map<std::pair<int, int>, std::vector<SyscallRuleView>> by_effect;
    for (const auto& r : rules) {
      if (action_runs_syscall(r.action)) continue;
      by_effect[{refusal_order(r.action), r.data}].push_back(r);
    }
    if (!by_effect.empty()) ++(syscall_fate(view, name) == SyscallFate::Refused ? n_refused : n_refused_some);
    for (auto& [key, rs] : by_effect) {
      auto& slot = refused[key];
      slot.first = action_effect(rs.front().action, rs.front().data);
      const bool unconditional = std::any_of(rs.begin(), rs.end(), [](const auto& r) { return r.args.empty(); });
      slot.second.push_back({name, unconditional ? std::vector<std::string>{} : describe_conditions(name, rs)});
    }
  }
  out << "  refused: " << n_refused << " syscalls (and " << n_refused_some
      << " more for some arguments); by what the caller gets\n";
  for (const auto& [key, slot] : refused) {
    out << "    " << slot.first << "\n";
    for (const auto& r : slot.second) {
      if (r.clauses.empty()) {
        out << "      " << r.name << "\n";
        continue;
      }
      out << "      " << r.name << ": when " << r.clauses[0] << "\n";
      const std::string indent(6 + r.name.size() + 2 + 5 - 3, ' ');
      for (std::size_t i = 1; i < r.clauses.size(); ++i) out << indent << "or " << r.clauses[i] << "\n";
    }
  }
}

// Seccomp: the profile's default action (flagged when it lets syscalls
// run: a deny-list), its architectures, then what it allows and refuses.
void explain_seccomp(std::ostream& out, const Policy& p) {
  out << "\nSeccomp\n";
  const policy::SeccompProfile* prof = p.seccomp_profile.get();
  if (prof == nullptr) {
    out << "  (no profile loaded)\n";
    return;
  }
  const ProfileView view = view_profile(*prof);
  const bool default_runs = action_runs_syscall(view.default_action);
  kv(out, "profile", p.seccomp_source);
  out << line(default_runs, " " + pad("default", 15) + policy::seccomp_action_name(view.default_action, view.default_data) +
                                ": every syscall not listed below " +
                                (default_runs ? "is ALLOWED (a deny-list)" : "gets " + action_effect(view.default_action, view.default_data)));
  kv(out, "architectures", comma_list(prof->architectures) + "; a syscall from any other ABI kills the process");
  explain_allowed_syscalls(out, view, default_runs);
  explain_refused_syscalls(out, view);
  out << line(default_runs, " every other syscall: " + action_effect(view.default_action, view.default_data));
}

// The end of the page: every warning of the lint again (each flagged
// line above is one of them), then the notes of grants accepted as inert.
void explain_dangerous_grants(std::ostream& out, const std::vector<PolicyRisk>& risks) {
  out << "\nDangerous grants\n";
  std::size_t warnings = 0;
  for (const auto& r : risks) {
    if (r.severity != LintSeverity::Warning) continue;
    ++warnings;
    out << line(true, " " + r.message);
  }
  if (warnings == 0) out << "  (none)\n";
  std::string accepted;
  for (const auto& r : risks)
    if (r.severity == LintSeverity::Note) accepted += "  " + r.message + "\n";
  if (!accepted.empty()) out << "\nAccepted (from dangerous groups, inert in every toolsandboxd sandbox)\n" << accepted;
}

// What an E2B sandbox of the policy may reach: where it runs (backend
// "e2b", or an organization delegated to E2B), exactly what is sent and
// what E2B enforces of it (daemon/policy/e2b_network.h).
void explain_e2b_network(std::ostream& out, const Policy& p) {
  out << "\nOn E2B (" << (p.backend == Backend::E2B ? "backend \"e2b\": every run of this policy"
                                                    : "runs of organizations delegated to E2B")
      << "; docs/E2B.md, \"Networks\")\n";
  // A line of e2b_network_lines that starts with "! " is a grant to flag.
  for (const auto& l : e2b_network_lines(e2b_network(p)))
    out << (l.starts_with("! ") ? "! " + l.substr(2) : "  " + l) << "\n";
}

}  // namespace

// The page, section by section in the order a reviewer reads it; the
// lint's findings are computed once, for the sections that flag lines.
std::string explain_policy(const Policy& p, const ExplainOptions& options) {
  std::ostringstream out;
  const std::vector<PolicyRisk> risks = assess_policy(p);
  explain_header(out, p);
  explain_namespaces(out, p);
  explain_egress(out, p, risks);
  explain_e2b_network(out, p);
  explain_packages(out, p, risks);
  explain_typescript(out, p);
  explain_warm_pool(out, p);
  explain_sessions(out, p);
  explain_every_run(out, p, options);
  explain_file_system(out, p, options);
  explain_limits(out, p, risks);
  explain_environment(out, p);
  explain_seccomp(out, p);
  explain_dangerous_grants(out, risks);
  return out.str();
}

// ---------------------------------------------------------------------------
// Comparison.

namespace {

struct Verdict {
  SyscallFate fate = SyscallFate::Refused;
  std::string allow;   // "always", or the allowing conditions
  std::string refuse;  // what the refused calls get, with conditions
  bool named = false;  // false: the default action decides

  std::string refusal_text() const { return named ? refuse : refuse + " by default"; }
};

std::string join_clauses(std::vector<std::string> clauses, const char* sep) {
  std::sort(clauses.begin(), clauses.end());
  std::string s;
  for (const auto& c : clauses) s += (s.empty() ? "" : sep) + c;
  return s;
}

Verdict verdict_of(const ProfileView& view, const std::string& name) {
  Verdict v;
  v.fate = syscall_fate(view, name);
  auto it = view.syscalls.find(name);
  const std::string dflt = action_effect(view.default_action, view.default_data);
  if (it == view.syscalls.end()) {
    if (v.fate == SyscallFate::Allowed) v.allow = "always" + std::string(view.default_action == SeccompAction::Log ? ", logged" : "");
    else v.refuse = dflt;
    return v;
  }
  v.named = true;
  const auto& rules = it->second;
  for (const auto& r : rules) {
    if (!r.args.empty()) continue;
    if (action_runs_syscall(r.action)) v.allow = r.action == SeccompAction::Log ? "always, logged" : "always";
    else v.refuse = action_effect(r.action, r.data);
    return v;
  }
  std::vector<SyscallRuleView> allowing;
  std::map<std::string, std::vector<SyscallRuleView>> refusing;  // effect -> rules
  for (const auto& r : rules) {
    if (action_runs_syscall(r.action)) allowing.push_back(r);
    else refusing[action_effect(r.action, r.data)].push_back(r);
  }
  if (!allowing.empty()) {
    v.allow = "only when " + join_clauses(describe_conditions(name, allowing), "; or ");
  } else if (action_runs_syscall(view.default_action)) {
    std::vector<SyscallRuleView> all;
    for (const auto& [e, rs] : refusing) all.insert(all.end(), rs.begin(), rs.end());
    v.allow = "except when " + join_clauses(describe_conditions(name, all), "; or ");
  }
  std::string refuse;
  for (const auto& [effect, rs] : refusing)
    refuse += (refuse.empty() ? "" : "; ") + effect + " when " + join_clauses(describe_conditions(name, rs), " or ");
  if (!action_runs_syscall(view.default_action)) refuse += (refuse.empty() ? "" : "; ") + dflt + " otherwise";
  v.refuse = refuse;
  return v;
}

bool runs(const Verdict& v) { return v.fate != SyscallFate::Refused; }

}  // namespace

std::string compare_profiles(const Policy& p, const policy::SeccompProfile& other, const std::string& other_label) {
  std::ostringstream out;
  const policy::SeccompProfile* mine = p.seccomp_profile.get();
  out << "Policy " << p.name << " compared with " << other_label << "\n";
  out << "  policy fingerprint  " << p.fingerprint << "\n";
  if (mine == nullptr) {
    out << "  (the policy has no profile loaded)\n";
    return out.str();
  }
  const ProfileView here = view_profile(*mine), there = view_profile(other);
  out << "  here                " << p.seccomp_source << ": default "
      << policy::seccomp_action_name(here.default_action, here.default_data) << "; " << comma_list(mine->architectures) << "\n";
  out << "  there               " << other_label << ": default "
      << policy::seccomp_action_name(there.default_action, there.default_data) << "; " << comma_list(other.architectures) << "\n";
  if (!other.skipped_syscalls.empty()) {
    out << "  skipped from there: names this libseccomp does not know, dropped from allow rules (only stricter):\n";
    std::vector<std::string> skipped = other.skipped_syscalls;
    std::sort(skipped.begin(), skipped.end(), [](const std::string& a, const std::string& b) {
      return a.substr(a.rfind(' ') + 1) < b.substr(b.rfind(' ') + 1);
    });
    for (const auto& s : skipped) out << "    " << s << "\n";
  }
  const std::string dh = action_effect(here.default_action, here.default_data);
  const std::string dt = action_effect(there.default_action, there.default_data);
  if (dh != dt) out << "  default action differs (every syscall neither names): here " << dh << ", there " << dt << "\n";
  out << "\n";

  std::set<std::string> names;
  for (const auto& [n, r] : here.syscalls) names.insert(n);
  for (const auto& [n, r] : there.syscalls) names.insert(n);
  const std::uint32_t native = seccomp_arch_native();
  std::size_t allowed_here = 0, allowed_there = 0, conditions = 0, errnos = 0;
  for (const auto& name : names) {
    const Verdict h = verdict_of(here, name), t = verdict_of(there, name);
    // A name of another ABI only (chown32 on x86_64): under a filter that
    // lists only the native architecture, that ABI kills the process.
    std::string foreign;
    if (seccomp_syscall_resolve_name_arch(native, name.c_str()) < 0)
      foreign = " [not a " + policy::seccomp_native_arch() + " syscall" +
                (mine->architectures.size() == 1 ? "; here every other ABI kills the process]" : "]");
    if (runs(h) && !runs(t)) {
      ++allowed_here;
      out << "  " << name << ": allowed here" << (h.fate == SyscallFate::AllowedSometimes ? " (" + h.allow + ")" : "")
          << ", refused there (" << t.refusal_text() << ")" << foreign << "\n";
    } else if (!runs(h) && runs(t)) {
      ++allowed_there;
      out << "  " << name << ": refused here (" << h.refusal_text() << "), allowed there"
          << (t.fate == SyscallFate::AllowedSometimes ? " (" + t.allow + ")" : "") << foreign << "\n";
    } else if (runs(h) && runs(t) && h.allow != t.allow) {
      ++conditions;
      out << "  " << name << ": allowed in both, with different argument conditions" << foreign << "\n"
          << "    here:  " << h.allow << "\n"
          << "    there: " << t.allow << "\n";
    } else if (h.refuse != t.refuse && !(h.fate == SyscallFate::Allowed && t.fate == SyscallFate::Allowed)) {
      ++errnos;
      out << "  " << name << ": "
          << (runs(h) ? "allowed in both for the same arguments; the others are refused differently"
                      : "refused in both, with a different errno or action")
          << foreign << "\n"
          << "    here:  " << h.refusal_text() << "\n"
          << "    there: " << t.refusal_text() << "\n";
    }
  }
  const std::size_t total = allowed_here + allowed_there + conditions + errnos;
  out << "\n"
      << total << " differences: " << allowed_here << " allowed here but refused there, " << allowed_there
      << " refused here but allowed there, " << conditions << " with different argument conditions, " << errnos
      << " with a different errno or action\n";
  return out.str();
}

std::string check_summary(const std::string& argument, const Policy& p) {
  return argument + ": ok: policy '" + p.name + "', backend " + to_string(p.backend) + ", network " +
         to_string(p.network) + ", " +
         std::to_string(p.seccomp_profile ? p.seccomp_profile->rules.size() : 0) + " syscall rules, " + p.fingerprint;
}

}  // namespace tsb::core
