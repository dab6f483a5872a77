// The seccomp table, in the manner of Firecracker's seccomp validation: every
// rule of the default policy's compiled profile is asked, inside a real
// sandbox under that policy, with the arguments it allows and with each
// perturbation of them (every bit of every compared argument flipped, values
// just outside an equality, high bits the kernel ignores), and so is every
// syscall number of the architecture. The cases are generated here from the
// profile the policy compiled (policy_->seccomp_profile), so a new rule is
// covered without editing this file; what the filter should answer for each
// case is worked out here from the profile's rules (libseccomp's meaning of
// each comparison), and what it does answer is measured in the sandbox by
// tsb-seccomp-table (tests/probe/seccomp_table.c).
//
// That program asks the filter without running anything: a second thread
// stacks a filter that hands every call to a user-space listener, which
// answers errno 4000. The sandbox's ERRNO outranks that hand-over and the
// hand-over outranks the sandbox's ALLOW, so a refusal comes back with the
// filter's own errno (EPERM and ENOSYS are never ambiguous with the kernel's)
// and an allowed call reaches the listener, which also checks that its
// arguments arrived as sent. No syscall is skipped for being unsafe to
// call: exit, execve, fork, pause and calls with bad pointers are asked the
// same way and never run.
//
// On top of the generated cases, a hand-kept list names what must stay
// refused whatever the profile says (the surfaces docs/SECURITY.md names:
// MSG_OOB, MSG_ZEROCOPY, SO_PEEK_OFF, TIOCSTI and the other tty ioctls,
// personality flags, socket families, namespace flags, the refused syscalls)
// and what Python tools need to stay allowed: a profile edited to let one of
// them through fails here even though the generated cases agree with it.
#include <gtest/gtest.h>
#include <seccomp.h>
#include <sys/stat.h>

#include <array>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "daemon/policy/seccomp_profile.h"
#include "tests/integration/harness.h"

using namespace tsb::testing;
using tsb::isolate::EndReason;
using tsb::policy::SeccompAction;
using tsb::policy::SeccompArg;
using tsb::policy::SeccompProfile;
using tsb::policy::SeccompRule;

namespace {

using Args = std::array<std::uint64_t, 6>;

constexpr std::uint64_t kHigh = std::uint64_t{1} << 32;
constexpr std::uint64_t kHighAll = 0xffffffff00000000;
// Every number probed: the highest x86_64 syscall is below 500; the rest up
// to here are unassigned numbers (and the x32 ABI's, which without bit 30
// are plain unknown numbers to the native ABI).
constexpr long kLastNumber = 1023;

// Numbers the kernel runs without asking seccomp at all (the passthrough
// list in kernel/seccomp.c, on kernels that have these syscalls): uretprobe
// and uprobe act only when called from the trampoline of a uprobe that root
// placed, and otherwise end the caller with SIGILL (uretprobe) or return
// ENXIO (uprobe). No filter can refuse them, so the table does not ask them;
// docs/SECURITY.md says so.
const std::map<long, const char*> kNotFiltered = {{335, "uretprobe"}, {336, "uprobe"}};

// Where the table and the program are shown in the sandbox (the probe's
// directory, see harness.h).
constexpr const char* kTableProgram = "/opt/tsb/tsb-seccomp-table";
constexpr const char* kTableFile = "/opt/tsb/seccomp-table.txt";

std::string hex(std::uint64_t v) {
  char b[24];
  std::snprintf(b, sizeof b, "%llx", static_cast<unsigned long long>(v));
  return b;
}

// The answer as the probe prints it: "allow" or "errno N".
std::string verdict(SeccompAction action, int err) {
  switch (action) {
    case SeccompAction::Allow:
    case SeccompAction::Log:
      return "allow";
    case SeccompAction::Errno:
      return "errno " + std::to_string(err);
    default:
      return tsb::policy::seccomp_action_name(action, err);
  }
}

// libseccomp's meaning of one comparison, on the 64-bit argument (x86_64).
bool holds(const SeccompArg& a, std::uint64_t v) {
  if (a.op == "SCMP_CMP_EQ") return v == a.value;
  if (a.op == "SCMP_CMP_NE") return v != a.value;
  if (a.op == "SCMP_CMP_LT") return v < a.value;
  if (a.op == "SCMP_CMP_LE") return v <= a.value;
  if (a.op == "SCMP_CMP_GT") return v > a.value;
  if (a.op == "SCMP_CMP_GE") return v >= a.value;
  if (a.op == "SCMP_CMP_MASKED_EQ") return (v & a.value) == a.value_two;
  ADD_FAILURE() << "comparison " << a.op << " unknown to the table test";
  return false;
}

// A value the comparison accepts.
std::uint64_t matching(const SeccompArg& a) {
  if (a.op == "SCMP_CMP_NE" || a.op == "SCMP_CMP_GT") return a.value + 1;
  if (a.op == "SCMP_CMP_LT") return a.value - 1;
  if (a.op == "SCMP_CMP_MASKED_EQ") return a.value_two;
  return a.value;  // EQ, LE, GE
}

// Values near the one a comparison looks at: every bit of it flipped (for a
// mask, each forbidden bit and each ignored one), its neighbours, high bits
// set or cleared, the extremes.
std::vector<std::uint64_t> perturbations(const SeccompArg& a) {
  const std::uint64_t v = a.op == "SCMP_CMP_MASKED_EQ" ? a.value_two : a.value;
  std::vector<std::uint64_t> out = {v - 1, v + 1, v | kHigh, v | kHighAll, v & 0xffffffffull, 0, ~0ull};
  for (int b = 0; b < 64; ++b) out.push_back(v ^ (1ull << b));
  if (a.op == "SCMP_CMP_MASKED_EQ") out.push_back(a.value_two | ~a.value);
  return out;
}

struct Case {
  long nr;
  Args args;
  std::string label;
};

// The profile as a function of (number, arguments).
class Oracle {
 public:
  explicit Oracle(const SeccompProfile& p) : profile_(p) {
    for (const auto& rule : p.rules) {
      for (const auto& name : rule.names) {
        const int nr = seccomp_syscall_resolve_name(name.c_str());
        if (nr < 0) {
          ADD_FAILURE() << "the profile's " << name << " (" << rule.where << ") is no native syscall";
          continue;
        }
        by_nr_[nr].push_back(&rule);
      }
    }
  }

  // What the filter must answer; "ambiguous: ..." when rules with different
  // actions match (libseccomp would keep one of them silently).
  std::string expect(long nr, const Args& args) const {
    std::set<std::string> answers;
    const auto it = by_nr_.find(nr);
    if (it != by_nr_.end()) {
      for (const SeccompRule* rule : it->second) {
        bool all = true;
        for (const auto& a : rule->args) all = all && holds(a, args[a.index]);
        if (all) answers.insert(verdict(rule->action, rule->errno_ret));
      }
    }
    if (answers.empty()) return verdict(profile_.default_action, profile_.default_errno);
    if (answers.size() == 1) return *answers.begin();
    std::string s = "ambiguous:";
    for (const auto& a : answers) s += " " + a;
    return s;
  }

  const std::map<long, std::vector<const SeccompRule*>>& by_nr() const { return by_nr_; }

 private:
  const SeccompProfile& profile_;
  std::map<long, std::vector<const SeccompRule*>> by_nr_;
};

long nr_of(const char* name) {
  const int nr = seccomp_syscall_resolve_name(name);
  EXPECT_GE(nr, 0) << name;
  return nr;
}

// The hand-kept list: what must stay refused (or allowed) whatever the
// profile says. x86_64 values.
enum class Must { Refuse, Allow };
struct Fixed {
  Must must;
  const char* name;
  Args args;
  const char* why;
};

std::vector<Fixed> fixed_cases() {
  std::vector<Fixed> v;
  auto refuse = [&](const char* name, Args a, const char* why) { v.push_back({Must::Refuse, name, a, why}); };
  auto allow = [&](const char* name, Args a, const char* why) { v.push_back({Must::Allow, name, a, why}); };

  // Syscalls refused outright (docs/SECURITY.md, "Seccomp").
  for (const char* name :
       {"ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd", "mount", "umount2", "pivot_root",
        "chroot", "move_mount", "open_tree", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr", "unshare",
        "setns", "keyctl", "add_key", "request_key", "bpf", "perf_event_open", "userfaultfd", "io_uring_setup",
        "io_uring_enter", "io_uring_register", "kexec_load", "kexec_file_load", "init_module", "finit_module",
        "delete_module", "reboot", "swapon", "swapoff", "settimeofday", "clock_settime", "clock_adjtime", "adjtimex",
        "open_by_handle_at", "name_to_handle_at", "iopl", "ioperm", "acct", "quotactl", "lookup_dcookie", "syslog",
        "vhangup", "setdomainname", "sethostname", "fanotify_init", "mbind", "set_mempolicy", "move_pages",
        "migrate_pages", "clone3", "vmsplice", "inotify_init1", "sync", "syncfs", "msgget", "shmget", "semget",
        "mq_open"}) {
    refuse(name, {}, "refused syscall");
  }
  // userfaultfd whatever its flags, UFFD_USER_MODE_ONLY (1) included.
  refuse("userfaultfd", {1}, "UFFD_USER_MODE_ONLY");
  refuse("userfaultfd", {0x80001}, "O_CLOEXEC | UFFD_USER_MODE_ONLY");

  // Out-of-band data on every send and receive (CVE-2025-38236), zero-copy
  // sends, whatever else the flags hold.
  const std::uint64_t oob = 0x1, zerocopy = 0x4000000, dontwait = 0x40, nosignal = 0x4000, peek = 0x2;
  for (const auto& [name, idx] : std::initializer_list<std::pair<const char*, int>>{
           {"sendto", 3}, {"sendmmsg", 3}, {"sendmsg", 2}, {"recvfrom", 3}, {"recvmmsg", 3}, {"recvmsg", 2}}) {
    const bool send = std::string(name).rfind("send", 0) == 0;
    for (std::uint64_t flags : std::initializer_list<std::uint64_t>{oob, oob | dontwait, oob | peek, oob | kHigh, oob | kHighAll}) {
      Args a{};
      a[idx] = flags;
      refuse(name, a, "MSG_OOB");
    }
    Args plain{};
    plain[idx] = send ? nosignal | dontwait : dontwait;
    allow(name, plain, "plain flags");
    plain[idx] = 0;
    allow(name, plain, "no flags");
    if (send) {
      for (std::uint64_t flags : std::initializer_list<std::uint64_t>{zerocopy, zerocopy | nosignal, zerocopy | kHigh}) {
        Args a{};
        a[idx] = flags;
        refuse(name, a, "MSG_ZEROCOPY");
      }
    } else {
      Args a{};
      a[idx] = peek | dontwait;
      allow(name, a, "MSG_PEEK");
    }
  }

  // setsockopt(SOL_SOCKET, SO_PEEK_OFF), whatever the high bits.
  refuse("setsockopt", {0, 1, 42}, "SO_PEEK_OFF");
  refuse("setsockopt", {0, 1 | kHigh, 42 | kHigh}, "SO_PEEK_OFF, high bits");
  allow("setsockopt", {0, 1, 2}, "SO_REUSEADDR");
  allow("setsockopt", {0, 1, 9}, "SO_KEEPALIVE");
  allow("setsockopt", {0, 6, 1}, "IPPROTO_TCP, TCP_NODELAY");
  allow("setsockopt", {0, 0, 42}, "level 0, option 42");
  allow("getsockopt", {0, 1, 42}, "getsockopt(SO_PEEK_OFF)");

  // tty ioctls: TIOCSTI pushes input, TIOCLINUX pastes a console selection,
  // TIOCSETD attaches a line discipline; whatever bits 32-63 hold.
  for (const auto& [cmd, what] : std::initializer_list<std::pair<std::uint64_t, const char*>>{
           {0x5412, "TIOCSTI"}, {0x541C, "TIOCLINUX"}, {0x5423, "TIOCSETD"}}) {
    refuse("ioctl", {0, cmd}, what);
    refuse("ioctl", {0, cmd | kHigh}, what);
    refuse("ioctl", {0, cmd | kHighAll}, what);
  }
  for (const auto& [cmd, what] : std::initializer_list<std::pair<std::uint64_t, const char*>>{
           {0x5401, "TCGETS"}, {0x5402, "TCSETS"}, {0x5413, "TIOCGWINSZ"}, {0x541B, "FIONREAD"},
           {0x5421, "FIONBIO"}, {0x5424, "TIOCGETD"}, {0x5451, "FIOCLEX"}, {0x80045430, "TIOCGPTN"},
           {0x40045431, "TIOCSPTLCK"}}) {
    allow("ioctl", {0, cmd}, what);
  }

  // personality: PER_LINUX and the query only.
  allow("personality", {0}, "PER_LINUX");
  allow("personality", {0xffffffff}, "query");
  for (const auto& [p, what] : std::initializer_list<std::pair<std::uint64_t, const char*>>{
           {0x0040000, "ADDR_NO_RANDOMIZE"}, {0x0400000, "READ_IMPLIES_EXEC"}, {0x0100000, "MMAP_PAGE_ZERO"},
           {0x0200000, "ADDR_COMPAT_LAYOUT"}, {0x0800000, "ADDR_LIMIT_32BIT"}, {0x8000000, "ADDR_LIMIT_3GB"},
           {0x0020000, "UNAME26"}, {0x0020008, "UNAME26 | PER_LINUX32"}, {0x0000008, "PER_LINUX32"},
           {0x0040008, "PER_LINUX32 | ADDR_NO_RANDOMIZE"}, {0x4000000, "STICKY_TIMEOUTS"},
           {0x0000001, "PER_SVR4"}, {0xfffffffe, "query - 1"}, {kHigh, "PER_LINUX with high bits"},
           {kHigh | 0xffffffff, "query with high bits"}}) {
    refuse("personality", {p}, what);
  }

  // Socket families: AF_UNIX, AF_INET, AF_INET6, AF_NETLINK/NETLINK_ROUTE.
  allow("socket", {1, 1, 0}, "AF_UNIX");
  allow("socket", {2, 1, 0}, "AF_INET");
  allow("socket", {10, 2, 0}, "AF_INET6");
  allow("socket", {16, 3, 0}, "AF_NETLINK, NETLINK_ROUTE");
  allow("socketpair", {1, 1, 0}, "AF_UNIX");
  for (const auto& [fam, proto, what] : std::initializer_list<std::tuple<std::uint64_t, std::uint64_t, const char*>>{
           {0, 0, "AF_UNSPEC"}, {15, 0, "AF_KEY"}, {16, 4, "NETLINK_SOCK_DIAG"}, {16, 9, "NETLINK_AUDIT"},
           {16, 15, "NETLINK_KOBJECT_UEVENT"}, {17, 0, "AF_PACKET"}, {21, 0, "AF_RDS"}, {29, 0, "AF_CAN"},
           {30, 0, "AF_TIPC"}, {31, 0, "AF_BLUETOOTH"}, {38, 0, "AF_ALG"}, {40, 0, "AF_VSOCK"}, {44, 0, "AF_XDP"},
           {2 | kHigh, 0, "AF_INET with high bits"}}) {
    refuse("socket", {fam, 1, proto}, what);
  }
  refuse("socketpair", {2, 1, 0}, "socketpair(AF_INET)");

  // clone: no namespace flag, whatever else (high bits included).
  allow("clone", {0x11}, "fork (SIGCHLD)");
  allow("clone", {0x3d0f00}, "pthread_create's flags");
  allow("clone", {0x4111}, "posix_spawn (CLONE_VM | CLONE_VFORK | SIGCHLD)");
  for (const auto& [flag, what] : std::initializer_list<std::pair<std::uint64_t, const char*>>{
           {0x20000, "CLONE_NEWNS"}, {0x2000000, "CLONE_NEWCGROUP"}, {0x4000000, "CLONE_NEWUTS"},
           {0x8000000, "CLONE_NEWIPC"}, {0x10000000, "CLONE_NEWUSER"}, {0x20000000, "CLONE_NEWPID"},
           {0x40000000, "CLONE_NEWNET"}}) {
    refuse("clone", {flag | 0x11}, what);
    refuse("clone", {flag | kHigh}, what);
  }

  // fcntl: leases and dnotify reach across sandboxes.
  refuse("fcntl", {0, 1024}, "F_SETLEASE");
  refuse("fcntl", {0, 1026}, "F_NOTIFY");
  refuse("fcntl", {0, 1 | kHigh}, "F_GETFD with high bits");
  allow("fcntl", {0, 3}, "F_GETFL");
  allow("fcntl", {0, 4}, "F_SETFL");
  allow("fcntl", {0, 6}, "F_SETLK");
  return v;
}

class SeccompTableTest : public EngineTest {
 protected:
  void SetUp() override {
    EngineTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    if (tsb::policy::seccomp_native_arch() != "SCMP_ARCH_X86_64")
      GTEST_SKIP() << "SKIPPED root integration test: the default profile and the fixed cases are for x86_64";
    // The program beside the probe, in the directory every sandbox sees.
    std::ifstream src(std::string(TSB_BIN_DIR) + "/tsb-seccomp-table", std::ios::binary);
    ASSERT_TRUE(src) << "tsb-seccomp-table is not built";
    const std::string dst = probe_dir() + "/tsb-seccomp-table";
    std::ofstream out(dst, std::ios::binary | std::ios::trunc);
    out << src.rdbuf();
    out.close();
    ASSERT_EQ(::chmod(dst.c_str(), 0755), 0);
  }

  // Runs the cases in a sandbox of the default policy: id -> answer.
  std::map<std::size_t, std::string> ask(const std::vector<Case>& cases, std::string* tail) const {
    {
      std::ofstream t(probe_dir() + "/seccomp-table.txt", std::ios::trunc);
      for (std::size_t i = 0; i < cases.size(); ++i) {
        t << i << ' ' << hex(static_cast<std::uint64_t>(cases[i].nr));
        for (auto a : cases[i].args) t << ' ' << hex(a);
        t << '\n';
      }
    }
    auto r = run(spec({kTableProgram, kTableFile}));
    EXPECT_EQ(r.reason, EndReason::Exited) << describe(r);
    EXPECT_EQ(r.exit_code, 0) << describe(r) << "\n" << r.stdout_data.substr(0, 2000);
    std::map<std::size_t, std::string> answers;
    std::istringstream in(r.stdout_data);
    std::string line;
    while (std::getline(in, line)) {
      const auto sp = line.find(' ');
      if (sp != std::string::npos && sp > 0 && std::isdigit(static_cast<unsigned char>(line[0])))
        answers[std::stoul(line.substr(0, sp))] = line.substr(sp + 1);
      else
        *tail += line + "\n";
    }
    return answers;
  }
};

TEST_F(SeccompTableTest, EveryRuleOfTheDefaultProfileAllowsItsArgumentsAndRefusesPerturbedOnes) {
  ASSERT_NE(policy_->seccomp_profile, nullptr);
  const SeccompProfile& profile = *policy_->seccomp_profile;
  const Oracle oracle(profile);

  std::vector<Case> cases;
  std::map<std::pair<long, Args>, std::size_t> index;  // each (number, arguments) asked once
  auto add = [&](long nr, const Args& a, std::string label) -> std::size_t {
    if (kNotFiltered.count(nr)) return SIZE_MAX;
    const auto [it, fresh] = index.emplace(std::pair{nr, a}, cases.size());
    if (fresh) cases.push_back({nr, a, std::move(label)});
    return it->second;
  };
  // Each rule: its own arguments must get its own action (else another rule
  // shadows it), then every perturbation, one argument at a time.
  std::size_t rule_index = 0;
  for (const auto& rule : profile.rules) {
    const std::string where = "rule " + std::to_string(rule_index++) + " (" + rule.where + ")";
    for (const auto& name : rule.names) {
      const long nr = seccomp_syscall_resolve_name(name.c_str());
      if (nr < 0) continue;  // reported by the oracle
      Args base{};
      for (const auto& a : rule.args) base[a.index] = matching(a);
      EXPECT_EQ(oracle.expect(nr, base), verdict(rule.action, rule.errno_ret))
          << name << ": the arguments " << where << " matches get another answer from the whole profile";
      add(nr, base, name + ", the arguments of " + where);
      if (rule.args.empty()) {
        Args junk;
        junk.fill(~0ull);
        add(nr, junk, name + ", every argument ~0, " + where);
      }
      for (const auto& a : rule.args) {
        for (std::uint64_t v : perturbations(a)) {
          Args p = base;
          p[a.index] = v;
          add(nr, p, name + ", argument " + std::to_string(a.index) + " = 0x" + hex(v) + ", perturbed from " + where);
        }
      }
    }
  }
  const std::size_t from_rules = cases.size();
  // Every number of the architecture, and beyond.
  for (long nr = 0; nr <= kLastNumber; ++nr) {
    const char* name = seccomp_syscall_resolve_num_arch(SCMP_ARCH_NATIVE, static_cast<int>(nr));
    add(nr, Args{}, std::string("syscall ") + std::to_string(nr) + (name ? std::string(" (") + name + ")" : ""));
    std::free(const_cast<char*>(name));
  }
  // The hand-kept surfaces.
  std::map<std::size_t, const Fixed*> fixed_ids;
  const auto fixed = fixed_cases();
  for (const auto& f : fixed) {
    const long nr = nr_of(f.name);
    const std::string want = oracle.expect(nr, f.args);
    const bool allowed = want == "allow";
    if (f.must == Must::Refuse)
      EXPECT_FALSE(allowed) << f.name << " (" << f.why << ") must be refused but the profile answers " << want;
    else
      EXPECT_TRUE(allowed) << f.name << " (" << f.why << ") must be allowed but the profile answers " << want;
    const std::size_t i = add(nr, f.args, "");
    if (i == SIZE_MAX) continue;
    fixed_ids[i] = &f;
    const std::string label =
        std::string(f.name) + " (" + f.why + ", must be " + (f.must == Must::Refuse ? "refused" : "allowed") + ")";
    cases[i].label = cases[i].label.empty() ? label : cases[i].label + "; " + label;
  }

  std::string tail;
  const auto answers = ask(cases, &tail);
  EXPECT_NE(tail.find("done " + std::to_string(cases.size())), std::string::npos) << "the probe did not finish:\n"
                                                                                  << tail;

  std::size_t allowed = 0, refused = 0, wrong = 0;
  std::ostringstream report;
  std::map<std::string, std::size_t> by_answer;
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const std::string want = oracle.expect(cases[i].nr, cases[i].args);
    const auto it = answers.find(i);
    const std::string got = it == answers.end() ? "(no answer)" : it->second;
    ++by_answer[got];
    (got == "allow" ? allowed : refused)++;
    const auto fx = fixed_ids.find(i);
    const bool fixed_bad = fx != fixed_ids.end() && ((fx->second->must == Must::Refuse) == (got == "allow"));
    if (got != want || fixed_bad) {
      if (++wrong <= 60) {
        report << "  " << cases[i].label << ": syscall " << cases[i].nr << " (";
        for (std::size_t k = 0; k < 6; ++k) report << (k ? ", " : "") << "0x" << hex(cases[i].args[k]);
        report << ") got " << got << ", the profile says " << want << "\n";
      }
    }
  }
  EXPECT_EQ(wrong, 0u) << wrong << " of " << cases.size() << " cases differ from the profile "
                       << profile.source << " (the first 60):\n"
                       << report.str() << tail;
  std::printf("seccomp table: %zu cases (%zu from %zu rules, the rest every number to %ld and %zu fixed ones): "
              "%zu allowed, %zu refused",
              cases.size(), from_rules, profile.rules.size(), kLastNumber, fixed.size(), allowed, refused);
  for (const auto& [answer, n] : by_answer) std::printf("; %s %zu", answer.c_str(), n);
  for (const auto& [nr, name] : kNotFiltered) std::printf("; not asked: %ld (%s), which seccomp never sees", nr, name);
  std::printf("\n");
  // The table is only worth something if both answers occur in quantity.
  EXPECT_GT(allowed, 1000u);
  EXPECT_GT(refused, 1000u);
}

}  // namespace
