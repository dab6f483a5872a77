// Seccomp profiles: strict parsing with file:line:col diagnostics, the
// includes/excludes semantics, compilation, and the behaviour of the shipped
// default profile and the init filter seen from inside a filtered process.
#include "daemon/policy/seccomp_profile.h"

#include <fcntl.h>
#include <linux/seccomp.h>
#include <pthread.h>
#include <sched.h>
#include <seccomp.h>
#include <signal.h>
#include <poll.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/personality.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "daemon/policy/jsonc.h"
#include "daemon/policy/syscall_groups.h"
#include "isolate/base/unique_fd.h"

namespace tsb::policy {
namespace {

const std::string kDefaultProfile = TSB_SOURCE_DIR "/policies/seccomp/default.json";
const std::string kMobyProfile = TSB_SOURCE_DIR "/tests/policies/reference/moby-default-seccomp.json";

// "libseccomp 2.5.4": messages name the version that could not resolve a name.
std::string lsc() {
  const scmp_version* v = seccomp_version();
  return "libseccomp " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->micro);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Fixed machine facts, so the expected messages do not depend on the host.
SeccompParseOptions x86_64_options() {
  SeccompParseOptions o;
  o.native_arch = "SCMP_ARCH_X86_64";
  o.kernel_release = "6.1.0-18-amd64";
  return o;
}

SeccompProfile parse_ok(std::string_view text, const SeccompParseOptions& o = x86_64_options()) {
  auto r = parse_seccomp_profile(text, "p.json", o);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
  if (!r.ok()) return {};
  return std::move(r).value();
}

std::string parse_error(std::string_view text, const SeccompParseOptions& o = x86_64_options()) {
  auto r = parse_seccomp_profile(text, "p.json", o);
  EXPECT_FALSE(r.ok()) << "parsed unexpectedly:\n" << text;
  if (r.ok()) return {};
  EXPECT_EQ(r.error().code, EINVAL) << r.error().message;
  return r.error().message;
}

// A profile whose one syscalls entry is `entry` (written on line 3, from
// column 5), so expected positions are easy to count.
std::string with_entry(std::string_view entry) {
  return "{\"defaultAction\": \"SCMP_ACT_ERRNO\",\n"
         "  \"syscalls\": [\n"
         "    " + std::string(entry) + "\n"
         "  ]\n"
         "}\n";
}

std::vector<std::string> all_names(const SeccompProfile& p) {
  std::vector<std::string> names;
  for (const auto& rule : p.rules) names.insert(names.end(), rule.names.begin(), rule.names.end());
  return names;
}

bool has_name(const SeccompProfile& p, std::string_view name) {
  const auto names = all_names(p);
  return std::find(names.begin(), names.end(), name) != names.end();
}

// ---------------------------------------------------------------------------
// Parsing: accepted forms and their meaning.

TEST(SeccompParse, MinimalProfileDefaultsToEpermAndNativeArch) {
  const auto p = parse_ok(R"({"defaultAction": "SCMP_ACT_ERRNO"})");
  EXPECT_EQ(p.source, "p.json");
  EXPECT_EQ(p.default_action, SeccompAction::Errno);
  EXPECT_EQ(p.default_errno, EPERM);
  EXPECT_EQ(p.architectures, std::vector<std::string>{"SCMP_ARCH_X86_64"});
  EXPECT_TRUE(p.rules.empty());
}

TEST(SeccompParse, ReadsRulesArgsAndComments) {
  const auto p = parse_ok(with_entry(
      R"({"names": ["personality"], "action": "SCMP_ACT_ALLOW", "comment": "why",)"
      R"( "args": [{"index": 0, "value": 18446744073709551615, "op": "SCMP_CMP_EQ"}]})"));
  ASSERT_EQ(p.rules.size(), 1u);
  const auto& r = p.rules[0];
  EXPECT_EQ(r.names, std::vector<std::string>{"personality"});
  EXPECT_EQ(r.action, SeccompAction::Allow);
  EXPECT_EQ(r.comment, "why");
  EXPECT_EQ(r.pointer, "/syscalls/0");
  EXPECT_EQ(r.where, "p.json:3:5");
  ASSERT_EQ(r.args.size(), 1u);
  EXPECT_EQ(r.args[0].value, UINT64_MAX);
  EXPECT_EQ(r.args[0].op, "SCMP_CMP_EQ");
}

TEST(SeccompParse, LegacyNameAndNullMeaningAbsent) {
  const auto p = parse_ok(with_entry(
      R"({"name": "getpid", "action": "SCMP_ACT_ALLOW", "args": null, "includes": {}, "excludes": null})"));
  ASSERT_EQ(p.rules.size(), 1u);
  EXPECT_EQ(p.rules[0].names, std::vector<std::string>{"getpid"});
}

TEST(SeccompParse, ActionsAndErrnoRet) {
  const auto p = parse_ok(R"({"defaultAction": "SCMP_ACT_KILL", "syscalls": [
      {"names": ["ptrace"], "action": "SCMP_ACT_ERRNO", "errnoRet": 38},
      {"names": ["bpf"], "action": "SCMP_ACT_ERRNO"},
      {"names": ["read"], "action": "SCMP_ACT_LOG"},
      {"names": ["write"], "action": "SCMP_ACT_TRACE", "errnoRet": 7},
      {"names": ["mount"], "action": "SCMP_ACT_KILL_PROCESS"},
      {"names": ["umount2"], "action": "SCMP_ACT_TRAP"}]})");
  EXPECT_EQ(p.default_action, SeccompAction::KillThread);  // OCI: SCMP_ACT_KILL kills the thread
  ASSERT_EQ(p.rules.size(), 6u);
  EXPECT_EQ(p.rules[0].errno_ret, 38);
  EXPECT_EQ(p.rules[1].errno_ret, EPERM);
  EXPECT_EQ(p.rules[2].action, SeccompAction::Log);
  EXPECT_EQ(p.rules[3].action, SeccompAction::Trace);
  EXPECT_EQ(p.rules[3].errno_ret, 7);
  EXPECT_EQ(p.rules[4].action, SeccompAction::KillProcess);
  EXPECT_EQ(p.rules[5].action, SeccompAction::Trap);
  EXPECT_EQ(seccomp_action_name(SeccompAction::Errno, 38), "SCMP_ACT_ERRNO(38)");
  EXPECT_EQ(seccomp_action_name(SeccompAction::KillThread), "SCMP_ACT_KILL_THREAD");
}

TEST(SeccompParse, CapsIncludesDroppedExcludesKept) {
  // The tool holds no capabilities.
  const auto p = parse_ok(R"({"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [
      {"names": ["mount"], "action": "SCMP_ACT_ALLOW", "includes": {"caps": ["CAP_SYS_ADMIN"]}},
      {"names": ["getpid"], "action": "SCMP_ACT_ALLOW", "excludes": {"caps": ["CAP_SYS_ADMIN"]}},
      {"names": ["gettid"], "action": "SCMP_ACT_ALLOW", "includes": {"caps": []}}]})");
  EXPECT_FALSE(has_name(p, "mount"));
  EXPECT_TRUE(has_name(p, "getpid"));
  EXPECT_TRUE(has_name(p, "gettid"));
}

TEST(SeccompParse, ArchesMatchTheNativeArchitecture) {
  const std::string text = R"({"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [
      {"names": ["arch_prctl"], "action": "SCMP_ACT_ALLOW", "includes": {"arches": ["amd64", "x32"]}},
      {"names": ["getpid"], "action": "SCMP_ACT_ALLOW", "includes": {"arches": ["arm64"]}},
      {"names": ["gettid"], "action": "SCMP_ACT_ALLOW", "excludes": {"arches": ["x86_64"]}},
      {"names": ["getppid"], "action": "SCMP_ACT_ALLOW", "excludes": {"arches": ["aarch64", "s390x"]}}]})";
  const auto x86 = parse_ok(text);
  EXPECT_TRUE(has_name(x86, "arch_prctl"));
  EXPECT_FALSE(has_name(x86, "getpid"));
  EXPECT_FALSE(has_name(x86, "gettid"));
  EXPECT_TRUE(has_name(x86, "getppid"));

  // The same text on an aarch64 machine. arch_prctl does not exist there,
  // but its entry is dropped before names are resolved.
  SeccompParseOptions arm = x86_64_options();
  arm.native_arch = "SCMP_ARCH_AARCH64";
  const auto a = parse_ok(text, arm);
  EXPECT_EQ(a.architectures, std::vector<std::string>{"SCMP_ARCH_AARCH64"});
  EXPECT_FALSE(has_name(a, "arch_prctl"));
  EXPECT_TRUE(has_name(a, "getpid"));
  EXPECT_TRUE(has_name(a, "gettid"));
  EXPECT_FALSE(has_name(a, "getppid"));
}

TEST(SeccompParse, MinKernelComparedWithRelease) {
  const std::string text = R"({"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [
      {"names": ["getpid"], "action": "SCMP_ACT_ALLOW", "includes": {"minKernel": "5.10"}},
      {"names": ["gettid"], "action": "SCMP_ACT_ALLOW", "includes": {"minKernel": "6.2"}},
      {"names": ["getppid"], "action": "SCMP_ACT_ALLOW", "excludes": {"minKernel": "6.1"}}]})";
  const auto p = parse_ok(text);  // kernel 6.1
  EXPECT_TRUE(has_name(p, "getpid"));
  EXPECT_FALSE(has_name(p, "gettid"));
  EXPECT_FALSE(has_name(p, "getppid"));
  SeccompParseOptions old = x86_64_options();
  old.kernel_release = "5.4.0";
  const auto q = parse_ok(text, old);
  EXPECT_FALSE(has_name(q, "getpid"));
  EXPECT_TRUE(has_name(q, "getppid"));
}

TEST(SeccompParse, ArchitecturesNativeFirstAndArchMapPicksTheNativeEntry) {
  const auto listed = parse_ok(
      R"({"defaultAction": "SCMP_ACT_ERRNO", "architectures": ["SCMP_ARCH_X86", "SCMP_ARCH_X86_64"]})");
  EXPECT_EQ(listed.architectures, (std::vector<std::string>{"SCMP_ARCH_X86_64", "SCMP_ARCH_X86"}));

  const auto mapped = parse_ok(R"({"defaultAction": "SCMP_ACT_ERRNO", "archMap": [
      {"architecture": "SCMP_ARCH_AARCH64", "subArchitectures": ["SCMP_ARCH_ARM"]},
      {"architecture": "SCMP_ARCH_X86_64", "subArchitectures": ["SCMP_ARCH_X86", "SCMP_ARCH_X32"]},
      {"architecture": "SCMP_ARCH_LOONGARCH64", "subArchitectures": null}]})");
  EXPECT_EQ(mapped.architectures,
            (std::vector<std::string>{"SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"}));
}

TEST(SeccompParse, OtherArchitecturesOnlyNamesAreAcceptedInMultiArchProfiles) {
  // chown32 exists on x86 (i386) only; with that ABI in the filter it means
  // something, so it is accepted and libseccomp places it per architecture.
  const auto p = parse_ok(R"({"defaultAction": "SCMP_ACT_ERRNO", "architectures": ["SCMP_ARCH_X86"],
      "syscalls": [{"names": ["chown32"], "action": "SCMP_ACT_ALLOW"}]})");
  EXPECT_TRUE(has_name(p, "chown32"));
}

TEST(SeccompParse, SkipInAllowRulesDropsOnlyFromAllowRules) {
  SeccompParseOptions o = x86_64_options();
  o.unresolvable_syscalls = SeccompParseOptions::UnresolvableSyscalls::SkipInAllowRules;
  const auto p = parse_ok(with_entry(R"({"names": ["getpid", "no_such_call"], "action": "SCMP_ACT_ALLOW"})"), o);
  EXPECT_EQ(all_names(p), std::vector<std::string>{"getpid"});
  EXPECT_EQ(p.skipped_syscalls, std::vector<std::string>{"p.json:3:26: no_such_call"});
  // Dropping a name from a deny rule would loosen the filter: still an error.
  EXPECT_EQ(parse_error(with_entry(R"({"names": ["no_such_call"], "action": "SCMP_ACT_KILL_PROCESS"})"), o),
            "p.json:3:16: unknown syscall \"no_such_call\" (" + lsc() + " cannot resolve it)");
  // So would dropping an allow rule from a profile whose default allows.
  EXPECT_EQ(parse_error(R"({"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [{"names": ["no_such_call"], )"
                        R"("action": "SCMP_ACT_LOG"}]})",
                        o),
            "p.json:1:61: unknown syscall \"no_such_call\" (" + lsc() + " cannot resolve it)");
}

// ---------------------------------------------------------------------------
// Parsing: every error class, with its exact message.

TEST(SeccompParseError, JsonSyntaxErrorsKeepTheirLocation) {
  EXPECT_EQ(parse_error("{\"defaultAction\": \"SCMP_ACT_ERRNO\",}"), "p.json:1:36: trailing comma before '}'");
}

TEST(SeccompParseError, MissingDefaultAction) {
  EXPECT_EQ(parse_error("// no default\n{\"syscalls\": []}"), "p.json:2:1: missing \"defaultAction\"");
}

TEST(SeccompParseError, NotAnObject) {
  EXPECT_EQ(parse_error("[]"), "p.json:1:1: a seccomp profile must be an object, not an array");
}

TEST(SeccompParseError, UnknownKeys) {
  EXPECT_EQ(parse_error("{\"defaultAction\": \"SCMP_ACT_ERRNO\",\n \"defaultaction\": 1}"),
            "p.json:2:2: unknown key \"defaultaction\" (known here: defaultAction, "
            "defaultErrnoRet, architectures, archMap, syscalls, flags, listenerPath, listenerMetadata)");
  EXPECT_EQ(parse_error(with_entry(R"({"names": ["getpid"], "action": "SCMP_ACT_ALLOW", "errno": 1})")),
            "p.json:3:55: unknown key \"errno\" (known here: names, name, action, "
            "errnoRet, args, comment, includes, excludes)");
  EXPECT_EQ(parse_error(with_entry(R"({"names": ["getpid"], "action": "SCMP_ACT_ALLOW", )"
                                   R"("args": [{"index": 0, "value": 1, "op": "SCMP_CMP_EQ", "mask": 1}]})")),
            "p.json:3:110: unknown key \"mask\" (known here: index, value, valueTwo, op)");
  EXPECT_EQ(parse_error(with_entry(R"({"names": ["getpid"], "action": "SCMP_ACT_ALLOW", )"
                                   R"("includes": {"capabilities": ["CAP_SYS_ADMIN"]}})")),
            "p.json:3:68: unknown key \"capabilities\" (known here: caps, arches, minKernel)");
}

TEST(SeccompParseError, UnsupportedOciFeatures) {
  EXPECT_EQ(parse_error(R"({"defaultAction": "SCMP_ACT_ERRNO", "listenerPath": "/run/listener.sock"})"),
            "p.json:1:37: \"listenerPath\" is not supported by toolsandboxd");
  EXPECT_EQ(parse_error(R"({"defaultAction": "SCMP_ACT_ERRNO", "flags": ["SECCOMP_FILTER_FLAG_LOG"]})"),
            "p.json:1:37: \"flags\" is not supported by toolsandboxd");
  parse_ok(R"({"defaultAction": "SCMP_ACT_ERRNO", "flags": [], "listenerPath": ""})");
}

TEST(SeccompParseError, WrongTypes) {
  EXPECT_EQ(parse_error(R"({"defaultAction": 1})"), "p.json:1:19: action must be a string, not a number");
  EXPECT_EQ(parse_error(R"({"defaultAction": "SCMP_ACT_ERRNO", "syscalls": {}})"),
            "p.json:1:49: \"syscalls\" must be an array, not an object");
  EXPECT_EQ(parse_error(with_entry(R"({"names": "getpid", "action": "SCMP_ACT_ALLOW"})")),
            "p.json:3:15: \"names\" must be an array, not a string");
  EXPECT_EQ(parse_error(with_entry(R"({"names": [42], "action": "SCMP_ACT_ALLOW"})")),
            "p.json:3:16: a syscall name must be a string, not a number");
  EXPECT_EQ(parse_error(with_entry(R"({"names": ["getpid"], "action": "SCMP_ACT_ALLOW", )"
                                   R"("args": [{"index": "0", "value": 1, "op": "SCMP_CMP_EQ"}]})")),
            "p.json:3:74: argument index must be a non-negative integer, not a string");
  EXPECT_EQ(parse_error(with_entry(R"({"names": ["getpid"], "action": "SCMP_ACT_ALLOW", )"
                                   R"("args": [{"index": 0, "value": -1, "op": "SCMP_CMP_EQ"}]})")),
            "p.json:3:86: value must be a non-negative integer, not -1");
  EXPECT_EQ(parse_error(with_entry(R"({"names": ["getpid"], "action": "SCMP_ACT_ALLOW", )"
                                   R"("args": [{"index": 0, "value": 1.0, "op": "SCMP_CMP_EQ"}]})")),
            "p.json:3:86: value must be a non-negative integer, not a fractional number");
  EXPECT_EQ(parse_error(R"({"defaultAction": "SCMP_ACT_ERRNO", "defaultErrnoRet": true})"),
            "p.json:1:56: defaultErrnoRet must be a non-negative integer, not a boolean");
}

TEST(SeccompParseError, UnknownActions) {
  EXPECT_EQ(parse_error(R"({"defaultAction": "SCMP_ACT_DENY"})"), "p.json:1:19: unknown action \"SCMP_ACT_DENY\"");
  EXPECT_EQ(parse_error(with_entry(R"({"names": ["getpid"], "action": "scmp_act_allow"})")),
            "p.json:3:37: unknown action \"scmp_act_allow\"");
  EXPECT_EQ(parse_error(with_entry(R"({"names": ["getpid"], "action": "SCMP_ACT_NOTIFY"})")),
            "p.json:3:37: action SCMP_ACT_NOTIFY is not supported (it needs a seccomp notification listener; toolsandboxd runs none)");
}

TEST(SeccompParseError, ErrnoRetOnlyWithErrnoOrTraceAndInRange) {
  EXPECT_EQ(parse_error(with_entry(R"({"names": ["getpid"], "action": "SCMP_ACT_ALLOW", "errnoRet": 1})")),
            "p.json:3:55: errnoRet is only valid with SCMP_ACT_ERRNO or SCMP_ACT_TRACE, not SCMP_ACT_ALLOW");
  EXPECT_EQ(parse_error(R"({"defaultAction": "SCMP_ACT_KILL_PROCESS", "defaultErrnoRet": 1})"),
            "p.json:1:44: defaultErrnoRet is only valid with SCMP_ACT_ERRNO or SCMP_ACT_TRACE, not "
            "SCMP_ACT_KILL_PROCESS");
  EXPECT_EQ(parse_error(R"({"defaultAction": "SCMP_ACT_ERRNO", "defaultErrnoRet": 4096})"),
            "p.json:1:56: defaultErrnoRet 4096 is out of range (at most 4095)");
}

TEST(SeccompParseError, UnknownOperator) {
  EXPECT_EQ(parse_error(with_entry(R"({"names": ["getpid"], "action": "SCMP_ACT_ALLOW", )"
                                   R"("args": [{"index": 0, "value": 1, "op": "SCMP_CMP_MASKED_NE"}]})")),
            "p.json:3:95: unknown comparison operator \"SCMP_CMP_MASKED_NE\"");
}

TEST(SeccompParseError, ArgIndexAboveFive) {
  EXPECT_EQ(parse_error(with_entry(R"({"names": ["getpid"], "action": "SCMP_ACT_ALLOW", )"
                                   R"("args": [{"index": 6, "value": 1, "op": "SCMP_CMP_EQ"}]})")),
            "p.json:3:74: argument index 6 is out of range (at most 5)");
}

TEST(SeccompParseError, MissingArgFields) {
  EXPECT_EQ(parse_error(with_entry(R"({"names": ["getpid"], "action": "SCMP_ACT_ALLOW", )"
                                   R"("args": [{"index": 0, "op": "SCMP_CMP_EQ"}]})")),
            "p.json:3:64: args entry without \"value\"");
}

TEST(SeccompParseError, SameArgumentComparedTwice) {
  EXPECT_EQ(parse_error(with_entry(R"({"names": ["socket"], "action": "SCMP_ACT_ALLOW", "args": [)"
                                   R"({"index": 0, "value": 1, "op": "SCMP_CMP_GE"}, )"
                                   R"({"index": 0, "value": 9, "op": "SCMP_CMP_LE"}]})")),
            "p.json:3:111: argument 0 is already compared at p.json:3:64; libseccomp allows one comparison per "
            "argument in a rule, so write a separate syscalls entry for each alternative");
}

TEST(SeccompParseError, MaskedCompareThatCanNeverMatch) {
  EXPECT_EQ(parse_error(with_entry(R"({"names": ["clone"], "action": "SCMP_ACT_ALLOW", "args": [)"
                                   R"({"index": 0, "value": 255, "valueTwo": 256, "op": "SCMP_CMP_MASKED_EQ"}]})")),
            "p.json:3:63: valueTwo has bits outside the mask in value, so this comparison can never match");
  EXPECT_EQ(parse_error(with_entry(R"({"names": ["clone"], "action": "SCMP_ACT_ALLOW", "args": [)"
                                   R"({"index": 0, "value": 1, "valueTwo": 2, "op": "SCMP_CMP_EQ"}]})")),
            "p.json:3:100: valueTwo is only used by SCMP_CMP_MASKED_EQ");
}

TEST(SeccompParseError, UnknownArchitectures) {
  EXPECT_EQ(parse_error(R"({"defaultAction": "SCMP_ACT_ERRNO", "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_Z80"]})"),
            "p.json:1:75: unknown architecture \"SCMP_ARCH_Z80\"");
  EXPECT_EQ(parse_error(R"({"defaultAction": "SCMP_ACT_ERRNO", "archMap": [{"architecture": "SCMP_ARCH_X86_64", )"
                        R"("subArchitectures": ["x86"]}]})"),
            "p.json:1:107: unknown architecture \"x86\"");
  EXPECT_EQ(parse_error(with_entry(R"({"names": ["getpid"], "action": "SCMP_ACT_ALLOW", )"
                                   R"("includes": {"arches": ["amd64", "sparc"]}})")),
            "p.json:3:88: unknown architecture \"sparc\"");
  EXPECT_EQ(parse_error(R"({"defaultAction": "SCMP_ACT_ERRNO", "architectures": ["SCMP_ARCH_X86", "SCMP_ARCH_X86"]})"),
            "p.json:1:72: architecture SCMP_ARCH_X86 listed twice");
  EXPECT_EQ(parse_error(R"({"defaultAction": "SCMP_ACT_ERRNO", "architectures": [], "archMap": []})"),
            "p.json:1:58: use either \"architectures\" or \"archMap\", not both");
}

TEST(SeccompParseError, UnknownCapabilityAndKernelVersion) {
  EXPECT_EQ(parse_error(with_entry(R"({"names": ["getpid"], "action": "SCMP_ACT_ALLOW", )"
                                   R"("includes": {"caps": ["CAP_SYS_GOD"]}})")),
            "p.json:3:77: unknown capability \"CAP_SYS_GOD\"");
  EXPECT_EQ(parse_error(with_entry(R"({"names": ["getpid"], "action": "SCMP_ACT_ALLOW", )"
                                   R"("includes": {"minKernel": "5"}})")),
            "p.json:3:81: invalid minKernel \"5\" (expected \"<major>.<minor>\")");
}

TEST(SeccompParseError, UnresolvableSyscallNames) {
  EXPECT_EQ(parse_error(with_entry(R"({"names": ["getpid", "no_such_call"], "action": "SCMP_ACT_ALLOW"})")),
            "p.json:3:26: unknown syscall \"no_such_call\" (" + lsc() + " cannot resolve it)");
  // Exists in libseccomp's tables, but only for 32-bit ABIs the profile does not list.
  EXPECT_EQ(parse_error(with_entry(R"({"names": ["chown32"], "action": "SCMP_ACT_ALLOW"})")),
            "p.json:3:16: syscall \"chown32\" does not exist on SCMP_ARCH_X86_64 and the profile lists no other "
            "architecture");
  EXPECT_EQ(parse_error(with_entry(R"({"names": ["GetPid"], "action": "SCMP_ACT_ALLOW"})")),
            "p.json:3:16: invalid syscall name \"GetPid\"");
  EXPECT_EQ(parse_error(with_entry(R"({"names": ["get\u001bpid"], "action": "SCMP_ACT_ALLOW"})")),
            "p.json:3:16: invalid syscall name \"get\\u001Bpid\"");
}

TEST(SeccompParseError, EntryShape) {
  EXPECT_EQ(parse_error(with_entry(R"({"names": [], "action": "SCMP_ACT_ALLOW"})")),
            "p.json:3:15: \"names\" is empty");
  EXPECT_EQ(parse_error(with_entry(R"({"action": "SCMP_ACT_ALLOW"})")),
            "p.json:3:5: syscalls entry without \"names\"");
  EXPECT_EQ(parse_error(with_entry(R"({"names": ["getpid"]})")), "p.json:3:5: syscalls entry without \"action\"");
  EXPECT_EQ(parse_error(with_entry(R"({"names": ["getpid"], "name": "getpid", "action": "SCMP_ACT_ALLOW"})")),
            "p.json:3:27: use either \"names\" or \"name\", not both");
  EXPECT_EQ(parse_error(with_entry(R"({"names": ["getpid", "gettid", "getpid"], "action": "SCMP_ACT_ALLOW"})")),
            "p.json:3:36: syscall \"getpid\" listed twice in this entry; first at p.json:3:16");
}

TEST(SeccompParseError, ConflictingRedefinitions) {
  // Unconditional rules with different actions: libseccomp would keep the first.
  EXPECT_EQ(parse_error("{\"defaultAction\": \"SCMP_ACT_ERRNO\", \"syscalls\": [\n"
                        "  {\"names\": [\"getpid\", \"ptrace\"], \"action\": \"SCMP_ACT_ALLOW\"},\n"
                        "  {\"names\": [\"ptrace\"], \"action\": \"SCMP_ACT_ERRNO\", \"errnoRet\": 1}]}"),
            "p.json:3:14: syscall \"ptrace\" redefined here with SCMP_ACT_ERRNO(1); previous definition at "
            "p.json:2:24 has SCMP_ACT_ALLOW");
  // A conditional rule next to an unconditional one with another action:
  // libseccomp would silently let the unconditional rule win.
  EXPECT_EQ(parse_error("{\"defaultAction\": \"SCMP_ACT_ERRNO\", \"syscalls\": [\n"
                        "  {\"names\": [\"socket\"], \"action\": \"SCMP_ACT_ERRNO\", \"errnoRet\": 13},\n"
                        "  {\"names\": [\"socket\"], \"action\": \"SCMP_ACT_ALLOW\",\n"
                        "   \"args\": [{\"index\": 0, \"value\": 1, \"op\": \"SCMP_CMP_EQ\"}]}]}"),
            "p.json:3:14: syscall \"socket\" redefined here with SCMP_ACT_ALLOW; previous definition at "
            "p.json:2:14 has SCMP_ACT_ERRNO(13)");
  // Identical conditions with different actions.
  EXPECT_EQ(parse_error("{\"defaultAction\": \"SCMP_ACT_ERRNO\", \"syscalls\": [\n"
                        "  {\"names\": [\"socket\"], \"action\": \"SCMP_ACT_ALLOW\",\n"
                        "   \"args\": [{\"index\": 0, \"value\": 1, \"op\": \"SCMP_CMP_EQ\"}]},\n"
                        "  {\"names\": [\"socket\"], \"action\": \"SCMP_ACT_LOG\",\n"
                        "   \"args\": [{\"index\": 0, \"value\": 1, \"op\": \"SCMP_CMP_EQ\"}]}]}"),
            "p.json:4:14: syscall \"socket\" redefined here with SCMP_ACT_LOG; previous definition at "
            "p.json:2:14 has SCMP_ACT_ALLOW");
  // Same action twice, or different actions on different conditions: fine.
  parse_ok("{\"defaultAction\": \"SCMP_ACT_ERRNO\", \"syscalls\": [\n"
           "  {\"names\": [\"getpid\"], \"action\": \"SCMP_ACT_ALLOW\"},\n"
           "  {\"names\": [\"getpid\"], \"action\": \"SCMP_ACT_ALLOW\"},\n"
           "  {\"names\": [\"socket\"], \"action\": \"SCMP_ACT_ALLOW\",\n"
           "   \"args\": [{\"index\": 0, \"value\": 1, \"op\": \"SCMP_CMP_EQ\"}]},\n"
           "  {\"names\": [\"socket\"], \"action\": \"SCMP_ACT_ERRNO\",\n"
           "   \"args\": [{\"index\": 0, \"value\": 1, \"op\": \"SCMP_CMP_GT\"}]}]}");
  // An entry dropped by includes/excludes defines nothing.
  parse_ok("{\"defaultAction\": \"SCMP_ACT_ERRNO\", \"syscalls\": [\n"
           "  {\"names\": [\"ptrace\"], \"action\": \"SCMP_ACT_ALLOW\", \"includes\": {\"caps\": [\"CAP_SYS_PTRACE\"]}},\n"
           "  {\"names\": [\"ptrace\"], \"action\": \"SCMP_ACT_ERRNO\"}]}");
}

TEST(SeccompParseError, FileErrors) {
  auto missing = load_seccomp_profile_file("/nonexistent/profile.json");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code, ENOENT);
  EXPECT_EQ(missing.error().message, "open '/nonexistent/profile.json': No such file or directory");
  auto dir = load_seccomp_profile_file("/");
  ASSERT_FALSE(dir.ok());
  EXPECT_EQ(dir.error().message, "'/' is not a regular file");
}

// ---------------------------------------------------------------------------
// Compilation.

TEST(SeccompCompile, SmallProfileCompiles) {
  const auto p = parse_ok(R"({"defaultAction": "SCMP_ACT_ERRNO", "defaultErrnoRet": 38, "syscalls": [
      {"names": ["getpid"], "action": "SCMP_ACT_ALLOW"},
      {"names": ["ptrace"], "action": "SCMP_ACT_ERRNO", "errnoRet": 38}]})",
                          SeccompParseOptions{});
  auto prog = compile_seccomp(p);
  ASSERT_TRUE(prog.ok()) << prog.error().message;
  EXPECT_EQ((*prog)->name, "p.json");
  EXPECT_GT((*prog)->insns.size(), 3u);
  EXPECT_EQ((*prog)->fprog().len, (*prog)->insns.size());
  EXPECT_EQ((*prog)->sha256.size(), 64u);
}

TEST(SeccompCompile, ProfileResolvedForAnotherMachineIsRefused) {
  SeccompParseOptions arm;
  arm.native_arch = seccomp_native_arch() == "SCMP_ARCH_AARCH64" ? "SCMP_ARCH_X86_64" : "SCMP_ARCH_AARCH64";
  const auto p = parse_ok(R"({"defaultAction": "SCMP_ACT_ERRNO"})", arm);
  auto prog = compile_seccomp(p);
  ASSERT_FALSE(prog.ok());
  EXPECT_EQ(prog.error().message, "compiling seccomp profile \"p.json\": profile was resolved for " +
                                      arm.native_arch + " but this machine is " + seccomp_native_arch());
}

TEST(SeccompCompile, ArchitectureUnknownToLibseccompFailsAtCompileTime) {
  if (seccomp_native_arch() != "SCMP_ARCH_X86_64") GTEST_SKIP() << "message names x86_64";
  if (seccomp_arch_resolve_name("loongarch64") != 0) GTEST_SKIP() << "this libseccomp supports LoongArch";
  const auto p = parse_ok(R"({"defaultAction": "SCMP_ACT_ERRNO", "archMap": [
      {"architecture": "SCMP_ARCH_X86_64", "subArchitectures": ["SCMP_ARCH_LOONGARCH64"]}]})",
                          SeccompParseOptions{});
  auto prog = compile_seccomp(p);
  ASSERT_FALSE(prog.ok());
  EXPECT_EQ(prog.error().message,
            "compiling seccomp profile \"p.json\": architecture \"SCMP_ARCH_LOONGARCH64\" is not supported by " +
                lsc());
}

TEST(SeccompCompile, BadNameInAHandBuiltProfileIsAnError) {
  SeccompProfile p;
  p.source = "<test>";
  p.architectures = {seccomp_native_arch()};
  SeccompRule rule;
  rule.names = {"getpid", "no_such_call"};
  rule.where = "<test rule>";
  p.rules.push_back(rule);
  auto prog = compile_seccomp(p);
  ASSERT_FALSE(prog.ok());
  EXPECT_EQ(prog.error().message,
            "compiling seccomp profile \"<test>\": <test rule>: unknown syscall \"no_such_call\" (" + lsc() +
                " cannot resolve it)");
}

TEST(SeccompCompile, DefaultProfileParsesAndCompiles) {
  auto p = load_seccomp_profile_file(kDefaultProfile);
  ASSERT_TRUE(p.ok()) << p.error().message;
  EXPECT_EQ(p->default_action, SeccompAction::Errno);
  EXPECT_EQ(p->default_errno, ENOSYS);
  EXPECT_EQ(p->architectures, std::vector<std::string>{"SCMP_ARCH_X86_64"});
  EXPECT_TRUE(p->skipped_syscalls.empty());
  auto prog = compile_seccomp(*p);
  ASSERT_TRUE(prog.ok()) << prog.error().message;
  EXPECT_LE((*prog)->insns.size(), static_cast<std::size_t>(BPF_MAXINSNS));
  // Deterministic: the same profile gives the same program.
  auto again = compile_seccomp(*p);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*prog)->sha256, (*again)->sha256);
  std::printf("default.json: %zu rules, %zu BPF instructions, sha256 %s\n", p->rules.size(),
              (*prog)->insns.size(), (*prog)->sha256.c_str());
}

TEST(SeccompCompile, DefaultProfileRefusesWhatItMust) {
  auto p = load_seccomp_profile_file(kDefaultProfile);
  ASSERT_TRUE(p.ok()) << p.error().message;
  std::map<std::string, std::set<std::string>> by_action;  // name -> actions
  for (const auto& rule : p->rules) {
    for (const auto& name : rule.names) {
      by_action[name].insert(rule.args.empty() ? seccomp_action_name(rule.action, rule.errno_ret)
                                               : "conditional");
    }
  }
  for (const char* name :
       {"ptrace", "process_vm_readv", "process_vm_writev", "mount", "umount2", "pivot_root", "move_mount",
        "open_tree", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr", "unshare", "setns", "keyctl",
        "add_key", "request_key", "bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter",
        "io_uring_register", "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
        "reboot", "swapon", "swapoff", "settimeofday", "clock_settime", "clock_adjtime", "adjtimex",
        "open_by_handle_at", "name_to_handle_at", "iopl", "ioperm", "acct", "quotactl", "lookup_dcookie",
        "syslog", "vhangup", "chroot", "setdomainname", "sethostname", "pidfd_getfd", "kcmp", "fanotify_init",
        "mbind", "set_mempolicy", "move_pages"}) {
    EXPECT_EQ(by_action[name], std::set<std::string>{"SCMP_ACT_ERRNO(1)"}) << name;
  }
  EXPECT_EQ(by_action["clone3"], std::set<std::string>{"SCMP_ACT_ERRNO(38)"});
  for (const char* name : {"clone", "socket", "socketpair", "ioctl", "fcntl", "personality"}) {
    EXPECT_EQ(by_action[name], std::set<std::string>{"conditional"}) << name;
  }
}

// Moby's profile is third-party input: it must parse and compile, and it is
// the best available test of format coverage.
TEST(SeccompCompile, MobyProfile) {
  const std::string text = read_file(kMobyProfile);
  ASSERT_FALSE(text.empty()) << "cannot read the Moby reference profile " << kMobyProfile
                             << " (it is part of the repository: tests/policies/reference/)";
  if (seccomp_native_arch() != "SCMP_ARCH_X86_64") GTEST_SKIP() << "expectations are for x86_64";
  SeccompParseOptions strict;
  strict.kernel_release = "6.1.0";
  // Moby lists syscalls newer than libseccomp 2.5.4; strict loading names the first.
  const std::size_t at = text.find("\"getxattrat\"");
  ASSERT_NE(at, std::string::npos);
  const auto line = 1 + std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(at), '\n');
  const auto col = at - text.rfind('\n', at);
  auto r = parse_seccomp_profile(text, "moby.json", strict);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message, "moby.json:" + std::to_string(line) + ":" + std::to_string(col) +
                                   ": unknown syscall \"getxattrat\" (" + lsc() + " cannot resolve it)");

  SeccompParseOptions lenient = strict;
  lenient.unresolvable_syscalls = SeccompParseOptions::UnresolvableSyscalls::SkipInAllowRules;
  auto p = parse_seccomp_profile(text, "moby.json", lenient);
  ASSERT_TRUE(p.ok()) << p.error().message;
  std::set<std::string> skipped;
  for (const auto& s : p->skipped_syscalls) skipped.insert(s.substr(s.rfind(' ') + 1));
  EXPECT_EQ(skipped, (std::set<std::string>{"getxattrat", "listmount", "listxattrat", "mseal", "removexattrat",
                                            "riscv_hwprobe", "setxattrat", "statmount", "uretprobe"}));
  EXPECT_EQ(p->architectures, (std::vector<std::string>{"SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"}));
  EXPECT_EQ(p->default_errno, EPERM);
  EXPECT_FALSE(has_name(*p, "mount"));       // CAP_SYS_ADMIN only
  EXPECT_TRUE(has_name(*p, "ptrace"));       // Moby allows it from kernel 4.8 on, caps or not
  EXPECT_TRUE(has_name(*p, "arch_prctl"));   // amd64 only
  EXPECT_FALSE(has_name(*p, "s390_pci_mmio_read"));
  EXPECT_TRUE(has_name(*p, "clone3"));       // ENOSYS without CAP_SYS_ADMIN
  auto prog = compile_seccomp(*p);
  ASSERT_TRUE(prog.ok()) << prog.error().message;
  std::printf("moby profile: %zu rules, %zu BPF instructions\n", p->rules.size(), (*prog)->insns.size());
}

// ---------------------------------------------------------------------------
// Behaviour from inside a filtered process.

// One observation made inside the child, sent through a pipe.
struct Observation {
  char what[48];
  long ret;
  int err;
};

class Reporter {
 public:
  explicit Reporter(int fd) : fd_(fd) {}
  // Records a raw syscall result. Only async-signal-safe calls here.
  void record(const char* what, long ret) {
    Observation o{};
    const int err = ret < 0 ? errno : 0;
    std::strncpy(o.what, what, sizeof o.what - 1);
    o.ret = ret;
    o.err = err;
    (void)!::write(fd_, &o, sizeof o);
  }

 private:
  int fd_;
};

struct ChildOutcome {
  std::map<std::string, Observation> seen;
  int status = 0;
};

// Forks; the child runs `body` with a pipe to report through; the parent
// collects every observation and the wait status.
template <class F>
ChildOutcome run_child(F body) {
  int fds[2];
  EXPECT_EQ(::pipe2(fds, O_CLOEXEC), 0);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    ::alarm(60);  // a hung child must not hang the test run
    Reporter rep(fds[1]);
    body(rep);
    ::_exit(0);
  }
  ::close(fds[1]);
  ChildOutcome out;
  Observation o{};
  while (true) {
    const ssize_t n = ::read(fds[0], &o, sizeof o);
    if (n == static_cast<ssize_t>(sizeof o)) {
      out.seen[o.what] = o;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    break;
  }
  ::close(fds[0]);
  EXPECT_EQ(::waitpid(pid, &out.status, 0), pid);
  return out;
}

// The child side: no_new_privs, then the filter. Returns false on failure.
bool load_filter(const SeccompProgram& prog) {
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return false;
  sock_fprog fprog = prog.fprog();
  return ::syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &fprog) == 0;
}

std::shared_ptr<const SeccompProgram> default_program() {
  auto p = load_seccomp_profile_file(kDefaultProfile);
  EXPECT_TRUE(p.ok()) << p.error().message;
  if (!p.ok()) return nullptr;
  auto prog = compile_seccomp(*p);
  EXPECT_TRUE(prog.ok()) << prog.error().message;
  return prog.ok() ? *prog : nullptr;
}

void* thread_body(void*) { return reinterpret_cast<void*>(42); }

class DefaultProfileBehaviour : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (seccomp_native_arch() != "SCMP_ARCH_X86_64") return;
    const auto prog = default_program();
    if (prog == nullptr) return;
    outcome_ = new ChildOutcome(run_child([&](Reporter& rep) {
      const long pid_before = ::getpid();
      if (!load_filter(*prog)) {
        rep.record("load", -1);
        ::_exit(1);
      }
      rep.record("load", 0);
      rep.record("getpid", ::getpid() == pid_before ? 0 : -1);

      // Refused with EPERM. Where possible the arguments are ones the kernel
      // would reject with another errno (bad flags, bad fd), so EPERM can only
      // have come from the filter, whatever the test's privileges.
      rep.record("ptrace", ::syscall(SYS_ptrace, 0x7fffffff, 0, 0, 0));
      rep.record("process_vm_readv", ::syscall(SYS_process_vm_readv, 0, nullptr, 0, nullptr, 0, ~0ul));
      rep.record("unshare(CLONE_NEWUSER)", ::syscall(SYS_unshare, CLONE_NEWUSER));
      rep.record("unshare(CLONE_NEWUSER|bad)", ::syscall(SYS_unshare, CLONE_NEWUSER | 0x1));
      // CLONE_SIGHAND without CLONE_VM is EINVAL for the kernel.
      for (const auto& [name, flag] : std::initializer_list<std::pair<const char*, unsigned long>>{
               {"clone(CLONE_NEWNS)", CLONE_NEWNS},     {"clone(CLONE_NEWCGROUP)", CLONE_NEWCGROUP},
               {"clone(CLONE_NEWUTS)", CLONE_NEWUTS},   {"clone(CLONE_NEWIPC)", CLONE_NEWIPC},
               {"clone(CLONE_NEWUSER)", CLONE_NEWUSER}, {"clone(CLONE_NEWPID)", CLONE_NEWPID},
               {"clone(CLONE_NEWNET)", CLONE_NEWNET}}) {
        rep.record(name, ::syscall(SYS_clone, flag | CLONE_SIGHAND, 0, 0, 0, 0));
      }
      rep.record("clone(CLONE_NEWUSER|high bits)",
                 ::syscall(SYS_clone, (1ul << 32) | CLONE_NEWUSER | CLONE_SIGHAND, 0, 0, 0, 0));
      {
        const long r = ::syscall(SYS_clone, CLONE_NEWNS | SIGCHLD, 0, 0, 0, 0);
        if (r == 0) ::_exit(0);  // the filter failed; the assertion will say so
        rep.record("clone(CLONE_NEWNS|SIGCHLD)", r);
      }
      rep.record("socket(AF_ALG)", ::syscall(SYS_socket, 38, 15, 0));  // type 15 is EINVAL for the kernel
      rep.record("socket(AF_VSOCK)", ::syscall(SYS_socket, 40, 15, 0));
      rep.record("socket(AF_PACKET)", ::syscall(SYS_socket, 17, 15, 0));
      rep.record("socket(AF_UNSPEC)", ::syscall(SYS_socket, 0, 15, 0));
      rep.record("socket(AF_KEY)", ::syscall(SYS_socket, 15, 15, 0));
      rep.record("socket(AF_MAX)", ::syscall(SYS_socket, 46, 15, 0));
      rep.record("socket(AF_INET|high bits)", ::syscall(SYS_socket, (1ul << 32) | AF_INET, 15, 0));
      rep.record("socket(AF_NETLINK, NETLINK_AUDIT)", ::syscall(SYS_socket, AF_NETLINK, 15, 9));
      rep.record("socket(AF_NETLINK, NETLINK_SOCK_DIAG)", ::syscall(SYS_socket, AF_NETLINK, 15, 4));
      rep.record("socketpair(AF_INET)", ::syscall(SYS_socketpair, AF_INET, 15, 0, nullptr));
      rep.record("keyctl", ::syscall(SYS_keyctl, -1, 0, 0, 0, 0));
      rep.record("add_key", ::syscall(SYS_add_key, nullptr, nullptr, nullptr, 0, 0));
      rep.record("bpf", ::syscall(SYS_bpf, -1, nullptr, 0));
      rep.record("perf_event_open", ::syscall(SYS_perf_event_open, nullptr, 0, -1, -1, 0));
      rep.record("userfaultfd", ::syscall(SYS_userfaultfd, ~0u));
      rep.record("io_uring_setup", ::syscall(SYS_io_uring_setup, 0, nullptr));
      rep.record("mount", ::syscall(SYS_mount, nullptr, nullptr, nullptr, 0, nullptr));
      rep.record("setns", ::syscall(SYS_setns, -1, 0));
      rep.record("pidfd_getfd", ::syscall(SYS_pidfd_getfd, -1, -1, 0));
      rep.record("open_by_handle_at", ::syscall(SYS_open_by_handle_at, -1, nullptr, 0));
      rep.record("fcntl(F_SETLEASE)", ::syscall(SYS_fcntl, -1, 1024, 0));
      rep.record("fcntl(F_NOTIFY)", ::syscall(SYS_fcntl, -1, 1026, 0));
      rep.record("ioctl(TIOCSTI)", ::syscall(SYS_ioctl, -1, TIOCSTI, nullptr));
      rep.record("ioctl(TIOCSTI|1<<32)", ::syscall(SYS_ioctl, -1, TIOCSTI | (1ul << 32), nullptr));
      rep.record("ioctl(TIOCSTI|0xffffffff<<32)",
                 ::syscall(SYS_ioctl, -1, TIOCSTI | 0xffffffff00000000ul, nullptr));
      rep.record("ioctl(TIOCLINUX)", ::syscall(SYS_ioctl, -1, TIOCLINUX, nullptr));
      rep.record("ioctl(TIOCLINUX|1<<32)", ::syscall(SYS_ioctl, -1, TIOCLINUX | (1ul << 32), nullptr));
      rep.record("ioctl(TIOCSETD)", ::syscall(SYS_ioctl, -1, TIOCSETD, nullptr));
      rep.record("ioctl(TIOCSETD|1<<32)", ::syscall(SYS_ioctl, -1, TIOCSETD | (1ul << 32), nullptr));
      rep.record("mbind", ::syscall(SYS_mbind, nullptr, 0, 0, nullptr, 0, 0));
      {
        // Out-of-band data and zero-copy sends on a real AF_UNIX pair (the
        // CVE-2025-38236 primitive), with high bits that the kernel's int
        // ignores; plain sends and receives on the same pair work.
        int sv[2] = {-1, -1};
        rep.record("oob: socketpair", ::syscall(SYS_socketpair, AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv));
        char b = 'x';
        iovec iov{&b, 1};
        msghdr mh{};
        mh.msg_iov = &iov;
        mh.msg_iovlen = 1;
        mmsghdr mm{};
        mm.msg_hdr = mh;
        const unsigned long hi = 1ul << 32;
        rep.record("sendto(MSG_OOB)", ::syscall(SYS_sendto, sv[0], &b, 1, MSG_OOB, nullptr, 0));
        rep.record("sendto(MSG_OOB|MSG_DONTWAIT|high bits)",
                   ::syscall(SYS_sendto, sv[0], &b, 1, hi | MSG_OOB | MSG_DONTWAIT, nullptr, 0));
        rep.record("sendmsg(MSG_OOB)", ::syscall(SYS_sendmsg, sv[0], &mh, MSG_OOB));
        rep.record("sendmmsg(MSG_OOB)", ::syscall(SYS_sendmmsg, sv[0], &mm, 1, MSG_OOB));
        rep.record("sendto(MSG_ZEROCOPY)", ::syscall(SYS_sendto, sv[0], &b, 1, MSG_ZEROCOPY, nullptr, 0));
        rep.record("sendmsg(MSG_ZEROCOPY)", ::syscall(SYS_sendmsg, sv[0], &mh, MSG_ZEROCOPY));
        rep.record("sendmmsg(MSG_ZEROCOPY)", ::syscall(SYS_sendmmsg, sv[0], &mm, 1, MSG_ZEROCOPY));
        rep.record("recvfrom(MSG_OOB)", ::syscall(SYS_recvfrom, sv[1], &b, 1, MSG_OOB | MSG_DONTWAIT, nullptr, nullptr));
        rep.record("recvmsg(MSG_OOB)", ::syscall(SYS_recvmsg, sv[1], &mh, MSG_OOB | MSG_DONTWAIT));
        rep.record("recvmmsg(MSG_OOB)", ::syscall(SYS_recvmmsg, sv[1], &mm, 1, MSG_OOB | MSG_DONTWAIT, nullptr));
        rep.record("sendto(plain|high bits)", ::syscall(SYS_sendto, sv[0], &b, 1, hi | MSG_NOSIGNAL, nullptr, 0));
        rep.record("sendmsg(plain)", ::syscall(SYS_sendmsg, sv[0], &mh, MSG_NOSIGNAL));
        rep.record("sendmmsg(plain)", ::syscall(SYS_sendmmsg, sv[0], &mm, 1, 0));
        rep.record("recvfrom(MSG_PEEK)", ::syscall(SYS_recvfrom, sv[1], &b, 1, MSG_PEEK | MSG_DONTWAIT, nullptr, nullptr));
        rep.record("recvmsg(plain)", ::syscall(SYS_recvmsg, sv[1], &mh, MSG_DONTWAIT));
        rep.record("recvmmsg(plain)", ::syscall(SYS_recvmmsg, sv[1], &mm, 1, MSG_DONTWAIT, nullptr));
        // setsockopt: SO_PEEK_OFF refused whatever the high bits of level and
        // option; neighbours of it on either argument reach the kernel.
        int off = 0;
        rep.record("setsockopt(SO_PEEK_OFF)", ::syscall(SYS_setsockopt, sv[1], SOL_SOCKET, SO_PEEK_OFF, &off, sizeof off));
        rep.record("setsockopt(SO_PEEK_OFF|high bits)",
                   ::syscall(SYS_setsockopt, sv[1], hi | SOL_SOCKET, hi | SO_PEEK_OFF, &off, sizeof off));
        int one = 1;
        rep.record("setsockopt(SO_KEEPALIVE)", ::syscall(SYS_setsockopt, sv[1], SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one));
        rep.record("setsockopt(SO_RCVBUF)", ::syscall(SYS_setsockopt, sv[1], SOL_SOCKET, SO_RCVBUF, &one, sizeof one));
        rep.record("setsockopt(level 0, option 42)", ::syscall(SYS_setsockopt, -1, 0, SO_PEEK_OFF, &off, sizeof off));
        rep.record("getsockopt(SO_PEEK_OFF)", [&] {
          socklen_t len = sizeof off;
          return ::syscall(SYS_getsockopt, sv[1], SOL_SOCKET, SO_PEEK_OFF, &off, &len);
        }());
      }

      // ENOSYS: clone3 (so glibc falls back to clone) and everything unlisted.
      rep.record("clone3", ::syscall(SYS_clone3, nullptr, 0));
      rep.record("vmsplice", ::syscall(SYS_vmsplice, -1, nullptr, 0, 0));
      rep.record("inotify_init1", ::syscall(SYS_inotify_init1, ~0));
      rep.record("syscall 1000", ::syscall(1000));
      rep.record("personality(ADDR_NO_RANDOMIZE)", ::syscall(SYS_personality, ADDR_NO_RANDOMIZE));
      rep.record("personality(READ_IMPLIES_EXEC)", ::syscall(SYS_personality, READ_IMPLIES_EXEC));
      rep.record("personality(PER_LINUX32)", ::syscall(SYS_personality, PER_LINUX32));
      rep.record("personality(UNAME26)", ::syscall(SYS_personality, UNAME26));
      rep.record("personality(query|1<<32)", ::syscall(SYS_personality, 0xfffffffful | (1ul << 32)));
      rep.record("fcntl(F_GETFD|1<<32)", ::syscall(SYS_fcntl, -1, (1ul << 32) | F_GETFD, 0));

      // Allowed: reaches the kernel, which answers EBADF for fd -1.
      rep.record("ioctl(TCGETS)", ::syscall(SYS_ioctl, -1, TCGETS, nullptr));
      rep.record("ioctl(FIONREAD)", ::syscall(SYS_ioctl, -1, FIONREAD, nullptr));
      rep.record("ioctl(TIOCSTI^1)", ::syscall(SYS_ioctl, -1, TIOCSTI ^ 1, nullptr));
      rep.record("ioctl(TIOCGETD)", ::syscall(SYS_ioctl, -1, TIOCGETD, nullptr));
      rep.record("ioctl(TIOCLINUX^1)", ::syscall(SYS_ioctl, -1, TIOCLINUX ^ 1, nullptr));
      rep.record("ioctl(TIOCSETD^0x20)", ::syscall(SYS_ioctl, -1, TIOCSETD ^ 0x20, nullptr));
      rep.record("ioctl(0xffffffff)", ::syscall(SYS_ioctl, -1, 0xfffffffful, nullptr));
      rep.record("fcntl(F_GETFD)", ::syscall(SYS_fcntl, -1, F_GETFD, 0));
      rep.record("fcntl(F_SETLK)", ::syscall(SYS_fcntl, -1, F_SETLK, nullptr));

      // Allowed and working.
      rep.record("personality(query)", ::syscall(SYS_personality, 0xffffffff));
      rep.record("personality(PER_LINUX)", ::syscall(SYS_personality, PER_LINUX));
      for (const auto& [name, family, protocol] :
           std::initializer_list<std::tuple<const char*, int, int>>{
               {"socket(AF_UNIX)", AF_UNIX, 0},
               {"socket(AF_INET)", AF_INET, 0},
               {"socket(AF_INET6)", AF_INET6, 0},
               {"socket(AF_NETLINK, NETLINK_ROUTE)", AF_NETLINK, 0}}) {
        const int type = family == AF_NETLINK ? SOCK_RAW : SOCK_STREAM;
        const long fd = ::syscall(SYS_socket, family, type | SOCK_CLOEXEC, protocol);
        rep.record(name, fd);
        if (fd >= 0) ::close(static_cast<int>(fd));
      }
      {
        int sv[2];
        const long r = ::syscall(SYS_socketpair, AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv);
        rep.record("socketpair(AF_UNIX)", r);
      }
      {
        const int fd = ::memfd_create("lock", MFD_CLOEXEC);
        rep.record("memfd_create", fd);
        rep.record("flock", ::flock(fd, LOCK_EX));
        struct flock fl {};
        fl.l_type = F_WRLCK;
        fl.l_whence = SEEK_SET;
        rep.record("fcntl(F_SETLK) on memfd", ::fcntl(fd, F_SETLK, &fl));
      }
      rep.record("seccomp(GET_ACTION_AVAIL)",
                 [] {
                   std::uint32_t action = SECCOMP_RET_ALLOW;
                   return ::syscall(SYS_seccomp, SECCOMP_GET_ACTION_AVAIL, 0, &action);
                 }());
      {
        const pid_t child = ::fork();
        if (child == 0) ::_exit(7);
        int status = 0;
        const long r = child < 0 ? -1 : ::waitpid(child, &status, 0);
        rep.record("fork+wait", r < 0 ? -1 : (WIFEXITED(status) ? WEXITSTATUS(status) : 100));
      }
      {
        // glibc tries clone3 first and falls back to clone on ENOSYS.
        pthread_t t;
        void* ret = nullptr;
        const int rc = ::pthread_create(&t, nullptr, thread_body, nullptr);
        if (rc == 0) ::pthread_join(t, &ret);
        errno = rc;
        rep.record("pthread_create", rc != 0 ? -1 : reinterpret_cast<long>(ret));
      }
      {
        const int fd = ::open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        rep.record("open", fd);
        if (fd >= 0) ::close(fd);
      }
    }));
  }
  static void TearDownTestSuite() {
    delete outcome_;
    outcome_ = nullptr;
  }
  void SetUp() override {
    if (seccomp_native_arch() != "SCMP_ARCH_X86_64") GTEST_SKIP() << "default.json is written for x86_64";
    ASSERT_NE(outcome_, nullptr);
    ASSERT_TRUE(WIFEXITED(outcome_->status) && WEXITSTATUS(outcome_->status) == 0)
        << "filtered child ended with status " << outcome_->status;
    ASSERT_TRUE(outcome_->seen.count("load")) << "child reported nothing";
    ASSERT_EQ(outcome_->seen.at("load").ret, 0) << "loading the filter failed: " << strerror(outcome_->seen.at("load").err);
  }

  // errno of a failed observation, 0 if it succeeded, -1 if it is missing.
  static int err(const std::string& what) {
    const auto it = outcome_->seen.find(what);
    if (it == outcome_->seen.end()) return -1;
    return it->second.ret < 0 ? it->second.err : 0;
  }
  static long ret(const std::string& what) {
    const auto it = outcome_->seen.find(what);
    return it == outcome_->seen.end() ? -999 : it->second.ret;
  }

  static ChildOutcome* outcome_;
};
ChildOutcome* DefaultProfileBehaviour::outcome_ = nullptr;

TEST_F(DefaultProfileBehaviour, BasicsWork) {
  EXPECT_EQ(ret("getpid"), 0);
  EXPECT_EQ(err("open"), 0);
  EXPECT_EQ(err("memfd_create"), 0);
  EXPECT_EQ(err("personality(query)"), 0);
  EXPECT_EQ(err("personality(PER_LINUX)"), 0);
  EXPECT_EQ(err("seccomp(GET_ACTION_AVAIL)"), 0);
}

TEST_F(DefaultProfileBehaviour, RefusedWithEperm) {
  for (const char* what :
       {"ptrace", "process_vm_readv", "unshare(CLONE_NEWUSER)", "unshare(CLONE_NEWUSER|bad)", "keyctl",
        "add_key", "bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "mount", "setns", "pidfd_getfd",
        "open_by_handle_at", "mbind", "fcntl(F_SETLEASE)", "fcntl(F_NOTIFY)"}) {
    EXPECT_EQ(err(what), EPERM) << what << " returned " << ret(what);
  }
}

TEST_F(DefaultProfileBehaviour, NamespaceCreatingCloneRefused) {
  for (const char* what : {"clone(CLONE_NEWNS)", "clone(CLONE_NEWCGROUP)", "clone(CLONE_NEWUTS)",
                           "clone(CLONE_NEWIPC)", "clone(CLONE_NEWUSER)", "clone(CLONE_NEWPID)",
                           "clone(CLONE_NEWNET)", "clone(CLONE_NEWUSER|high bits)", "clone(CLONE_NEWNS|SIGCHLD)"}) {
    EXPECT_EQ(err(what), EPERM) << what << " returned " << ret(what);
  }
}

TEST_F(DefaultProfileBehaviour, PlainForkAndThreadsWork) {
  EXPECT_EQ(ret("fork+wait"), 7);
  EXPECT_EQ(ret("pthread_create"), 42) << "errno " << err("pthread_create");
}

TEST_F(DefaultProfileBehaviour, Clone3AndUnlistedSyscallsGetEnosys) {
  for (const char* what : {"clone3", "vmsplice", "inotify_init1", "syscall 1000",
                           "personality(ADDR_NO_RANDOMIZE)", "personality(READ_IMPLIES_EXEC)",
                           "personality(PER_LINUX32)", "personality(UNAME26)", "personality(query|1<<32)",
                           "fcntl(F_GETFD|1<<32)"}) {
    EXPECT_EQ(err(what), ENOSYS) << what << " returned " << ret(what);
  }
}

TEST_F(DefaultProfileBehaviour, SocketFamilies) {
  for (const char* what : {"socket(AF_ALG)", "socket(AF_VSOCK)", "socket(AF_PACKET)", "socket(AF_UNSPEC)",
                           "socket(AF_KEY)", "socket(AF_MAX)", "socket(AF_INET|high bits)",
                           "socket(AF_NETLINK, NETLINK_AUDIT)", "socket(AF_NETLINK, NETLINK_SOCK_DIAG)",
                           "socketpair(AF_INET)"}) {
    EXPECT_EQ(err(what), EPERM) << what << " returned " << ret(what);
  }
  EXPECT_EQ(err("socket(AF_UNIX)"), 0);
  EXPECT_EQ(err("socket(AF_INET)"), 0);
  EXPECT_EQ(err("socket(AF_NETLINK, NETLINK_ROUTE)"), 0);
  EXPECT_EQ(err("socketpair(AF_UNIX)"), 0);
  // The kernel may lack IPv6; the filter must not be the one refusing.
  EXPECT_TRUE(err("socket(AF_INET6)") == 0 || err("socket(AF_INET6)") == EAFNOSUPPORT) << err("socket(AF_INET6)");
}

TEST_F(DefaultProfileBehaviour, IoctlTiocstiRefusedWhateverTheHighBits) {
  EXPECT_EQ(err("ioctl(TIOCSTI)"), EPERM);
  EXPECT_EQ(err("ioctl(TIOCSTI|1<<32)"), EPERM);
  EXPECT_EQ(err("ioctl(TIOCSTI|0xffffffff<<32)"), EPERM);
  for (const char* what : {"ioctl(TCGETS)", "ioctl(FIONREAD)", "ioctl(TIOCSTI^1)", "ioctl(0xffffffff)",
                           "ioctl(TIOCGETD)", "ioctl(TIOCLINUX^1)", "ioctl(TIOCSETD^0x20)"}) {
    EXPECT_EQ(err(what), EBADF) << what;
  }
}

TEST_F(DefaultProfileBehaviour, ConsolePasteAndLineDisciplineIoctlsRefusedWhateverTheHighBits) {
  for (const char* what : {"ioctl(TIOCLINUX)", "ioctl(TIOCLINUX|1<<32)", "ioctl(TIOCSETD)", "ioctl(TIOCSETD|1<<32)"})
    EXPECT_EQ(err(what), EPERM) << what << " returned " << ret(what);
}

TEST_F(DefaultProfileBehaviour, OutOfBandAndZeroCopyRefusedOnEverySendAndReceive) {
  ASSERT_EQ(err("oob: socketpair"), 0);
  for (const char* what : {"sendto(MSG_OOB)", "sendto(MSG_OOB|MSG_DONTWAIT|high bits)", "sendmsg(MSG_OOB)",
                           "sendmmsg(MSG_OOB)", "sendto(MSG_ZEROCOPY)", "sendmsg(MSG_ZEROCOPY)", "sendmmsg(MSG_ZEROCOPY)",
                           "recvfrom(MSG_OOB)", "recvmsg(MSG_OOB)", "recvmmsg(MSG_OOB)"}) {
    EXPECT_EQ(err(what), EPERM) << what << " returned " << ret(what);
  }
  // One byte each, in order: three plain sends, a peek, two receives.
  for (const char* what : {"sendto(plain|high bits)", "sendmsg(plain)", "sendmmsg(plain)", "recvfrom(MSG_PEEK)",
                           "recvmsg(plain)", "recvmmsg(plain)"})
    EXPECT_EQ(ret(what), 1) << what << " errno " << err(what);
}

TEST_F(DefaultProfileBehaviour, SetsockoptPeekOffsetRefusedOtherOptionsReachTheKernel) {
  EXPECT_EQ(err("setsockopt(SO_PEEK_OFF)"), EPERM);
  EXPECT_EQ(err("setsockopt(SO_PEEK_OFF|high bits)"), EPERM);
  EXPECT_EQ(err("setsockopt(SO_KEEPALIVE)"), 0);
  EXPECT_EQ(err("setsockopt(SO_RCVBUF)"), 0);
  EXPECT_EQ(err("setsockopt(level 0, option 42)"), EBADF);
  EXPECT_EQ(err("getsockopt(SO_PEEK_OFF)"), 0);
}

TEST_F(DefaultProfileBehaviour, LocksAllowedLeasesAndNotifyRefused) {
  EXPECT_EQ(err("flock"), 0);
  EXPECT_EQ(err("fcntl(F_SETLK) on memfd"), 0);
  EXPECT_EQ(err("fcntl(F_GETFD)"), EBADF);
  EXPECT_EQ(err("fcntl(F_SETLK)"), EBADF);
}

// Other ABIs are other architectures to seccomp; the profile lists only
// x86_64, so their syscalls hit the bad-architecture action: SIGSYS.
class OtherAbiKill : public ::testing::Test {
 protected:
  void SetUp() override {
    if (seccomp_native_arch() != "SCMP_ARCH_X86_64") GTEST_SKIP() << "x86_64 only";
    prog_ = default_program();
    ASSERT_NE(prog_, nullptr);
  }
  std::shared_ptr<const SeccompProgram> prog_;
};

#if defined(__x86_64__)
long int80_getpid() {
  long r;
  asm volatile("int $0x80" : "=a"(r) : "a"(20L) : "memory", "r8", "r9", "r10", "r11");
  return r;
}

TEST_F(OtherAbiKill, X32SyscallKills) {
  const auto out = run_child([&](Reporter& rep) {
    if (!load_filter(*prog_)) ::_exit(1);
    rep.record("x32 getpid", ::syscall(0x40000000L | SYS_getpid));
  });
  EXPECT_TRUE(WIFSIGNALED(out.status) && WTERMSIG(out.status) == SIGSYS) << "status " << out.status;
  EXPECT_EQ(out.seen.count("x32 getpid"), 0u);
}

TEST_F(OtherAbiKill, Int80Kills) {
  const auto probe = run_child([](Reporter& rep) { rep.record("int80", int80_getpid()); });
  if (!WIFEXITED(probe.status)) {
    GTEST_SKIP() << "this kernel has no i386 syscall entry (ia32 emulation off): int 0x80 ends the process with "
                    "signal " << (WIFSIGNALED(probe.status) ? WTERMSIG(probe.status) : 0) << " even unfiltered";
  }
  const auto out = run_child([&](Reporter& rep) {
    if (!load_filter(*prog_)) ::_exit(1);
    rep.record("int80", int80_getpid());
  });
  EXPECT_TRUE(WIFSIGNALED(out.status) && WTERMSIG(out.status) == SIGSYS) << "status " << out.status;
  EXPECT_EQ(out.seen.count("int80"), 0u);
}
#endif

TEST(InitFilterBehaviour, AllowsReapingAndKillsOnAnythingElse) {
  auto prog = compile_init_filter();
  ASSERT_TRUE(prog.ok()) << prog.error().message;
  EXPECT_EQ((*prog)->name, "<sandbox init filter>");
  const auto out = run_child([&](Reporter& rep) {
    const pid_t child = ::fork();  // before the filter: the init filter has no clone
    if (child == 0) ::_exit(3);
    if (!load_filter(**prog)) ::_exit(1);
    rep.record("loaded", 0);
    int status = 0;
    const long r = ::syscall(SYS_wait4, child, &status, 0, nullptr);
    rep.record("wait4", r == child && WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    struct pollfd pfd {-1, POLLIN, 0};
    rep.record("poll", ::syscall(SYS_poll, &pfd, 1, 0));
    // init signals nobody: kill is not on its list.
    rep.record("kill(self, 0)", ::syscall(SYS_kill, 1, 0));  // must not return
  });
  ASSERT_EQ(out.seen.count("loaded"), 1u) << "status " << out.status;
  EXPECT_EQ(out.seen.at("wait4").ret, 3);
  EXPECT_EQ(out.seen.at("poll").ret, 0);
  EXPECT_EQ(out.seen.count("kill(self, 0)"), 0u);
  EXPECT_TRUE(WIFSIGNALED(out.status) && WTERMSIG(out.status) == SIGSYS) << "status " << out.status;
}

TEST(InitFilterBehaviour, ExitGroupIsAllowed) {
  auto prog = compile_init_filter();
  ASSERT_TRUE(prog.ok()) << prog.error().message;
  const auto out = run_child([&](Reporter&) {
    if (!load_filter(**prog)) ::_exit(1);
    ::syscall(SYS_exit_group, 9);
  });
  EXPECT_TRUE(WIFEXITED(out.status) && WEXITSTATUS(out.status) == 9) << "status " << out.status;
}

TEST(InitFilter, ListIsTheDocumentedOne) {
  std::vector<std::string> names = init_filter_syscalls();
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"brk", "clock_gettime", "close", "exit", "exit_group", "mmap",
                                             "munmap", "poll", "ppoll", "read", "restart_syscall", "rt_sigreturn",
                                             "wait4", "waitid", "write"}));
}

// CPython itself, with the workloads the default profile promises to support.
constexpr const char* kPythonWorkload = R"PY(
import asyncio, concurrent.futures, fcntl, multiprocessing, os, socket, sqlite3, ssl
import subprocess, sys, tempfile, threading, time

def square(x):
    return x * x

async def echo_roundtrip():
    async def handle(r, w):
        w.write(await r.read(5)); await w.drain(); w.close()
    srv = await asyncio.start_server(handle, "127.0.0.1", 0)
    r, w = await asyncio.open_connection("127.0.0.1", srv.sockets[0].getsockname()[1])
    w.write(b"hello"); await w.drain()
    assert await r.read(5) == b"hello"
    w.close(); srv.close(); await srv.wait_closed()
    p = await asyncio.create_subprocess_exec(sys.executable, "-c", "print(1)", stdout=asyncio.subprocess.PIPE)
    assert (await p.communicate())[0].strip() == b"1"
    await asyncio.get_running_loop().run_in_executor(None, time.sleep, 0.001)

def main():
    with concurrent.futures.ThreadPoolExecutor(4) as ex:
        assert sum(ex.map(square, range(10))) == 285
    assert subprocess.run([sys.executable, "-c", "print(6*7)"], capture_output=True, text=True).stdout == "42\n"
    assert subprocess.run(["/bin/sh", "-c", "exit 3"]).returncode == 3
    a, b = socket.socketpair(); a.sendall(b"x"); assert b.recv(1) == b"x"
    srv = socket.create_server(("127.0.0.1", 0)); c = socket.create_connection(srv.getsockname())
    s, _ = srv.accept(); c.sendall(b"p"); assert s.recv(1) == b"p"
    socket.getaddrinfo("localhost", 80); socket.if_nameindex()
    for family in (socket.AF_ALG, socket.AF_PACKET, socket.AF_VSOCK):
        try:
            socket.socket(family, socket.SOCK_SEQPACKET)
            raise AssertionError(f"socket family {family} allowed")
        except PermissionError:
            pass
    ctx = ssl.create_default_context(); ctx.load_default_certs()
    asyncio.run(echo_roundtrip())
    with tempfile.TemporaryDirectory() as d:
        db = sqlite3.connect(os.path.join(d, "t.db")); db.execute("create table t(x)"); db.commit(); db.close()
        with open(os.path.join(d, "f"), "w") as f:
            fcntl.flock(f, fcntl.LOCK_EX); fcntl.lockf(f, fcntl.LOCK_EX)
    with multiprocessing.get_context("fork").Pool(2) as pool:
        assert pool.map(square, [1, 2, 3]) == [1, 4, 9]
    q = multiprocessing.get_context("spawn").SimpleQueue()
    pr = multiprocessing.get_context("spawn").Process(target=q.put, args=(5,)); pr.start(); pr.join()
    assert q.get() == 5
    t = threading.Timer(0.001, lambda: None); t.start(); t.join()
    print("ok")

if __name__ == "__main__":
    main()
)PY";

TEST(DefaultProfilePython, Cpython311WorkloadRunsUnderTheFilter) {
  const char* python = "/usr/bin/python3";
  if (::access(python, X_OK) != 0) {
    GTEST_SKIP() << "\n\n    *** SKIPPED: " << python << " not found; the CPython workload was not run\n";
  }
  if (seccomp_native_arch() != "SCMP_ARCH_X86_64") GTEST_SKIP() << "default.json is written for x86_64";
  const auto prog = default_program();
  ASSERT_NE(prog, nullptr);
  int out[2];
  ASSERT_EQ(::pipe2(out, O_CLOEXEC), 0);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(out[1], 1);
    ::dup2(out[1], 2);
    ::alarm(120);
    if (!load_filter(*prog)) ::_exit(126);
    const char* env[] = {"PATH=/usr/bin:/bin", "LC_ALL=C.UTF-8", "PYTHONDONTWRITEBYTECODE=1", nullptr};
    ::execle(python, python, "-I", "-c", kPythonWorkload, nullptr, env);
    ::_exit(127);
  }
  ::close(out[1]);
  std::string output;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(out[0], buf, sizeof buf)) != 0) {
    if (n < 0) {
      if (errno == EINTR) continue;
      break;
    }
    output.append(buf, static_cast<std::size_t>(n));
  }
  ::close(out[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status << ", output:\n" << output;
  EXPECT_EQ(output, "ok\n");
}

// ---------------------------------------------------------------------------
// The syscall group table (policy as data): invariants.

TEST(SyscallGroups, SortedDocumentedResolvableAcyclic) {
  const auto groups = syscall_groups();
  ASSERT_FALSE(groups.empty());
  for (std::size_t i = 0; i < groups.size(); ++i) {
    const SyscallGroup& g = groups[i];
    SCOPED_TRACE(std::string(g.name));
    // Each group checked on its own, not only the first.
    EXPECT_EQ(g.name.front(), '@');
    EXPECT_FALSE(g.help.empty());
    EXPECT_FALSE(g.members.empty());
    if (i > 0) {
      EXPECT_LT(groups[i - 1].name, g.name) << "groups must be sorted by name";
    }
    for (std::size_t k = 0; k < g.members.size(); ++k) {
      const std::string member(g.members[k]);
      if (k > 0) {
        EXPECT_LT(g.members[k - 1], g.members[k]) << "members sorted, no duplicates";
      }
      if (member.front() == '@') {
        EXPECT_NE(find_syscall_group(member), nullptr) << member;
      } else {
        EXPECT_NE(seccomp_syscall_resolve_name(member.c_str()), __NR_SCMP_ERROR) << member;
      }
    }
    auto expanded = expand_syscall_group(g.name);
    ASSERT_TRUE(expanded.ok()) << expanded.error().message;  // also proves there is no cycle
    EXPECT_TRUE(std::is_sorted(expanded->begin(), expanded->end()));
    EXPECT_EQ(std::adjacent_find(expanded->begin(), expanded->end()), expanded->end());
  }
}

TEST(SyscallGroups, LookupsAndExpansion) {
  ASSERT_NE(find_syscall_group("@mount"), nullptr);
  EXPECT_TRUE(find_syscall_group("@mount")->dangerous);
  EXPECT_FALSE(find_syscall_group("@basic-io")->dangerous);
  EXPECT_EQ(find_syscall_group("mount"), nullptr);
  EXPECT_EQ(find_syscall_group("@nope"), nullptr);
  auto privileged = expand_syscall_group("@privileged");
  ASSERT_TRUE(privileged.ok());
  // References are expanded: @privileged includes @module and @clock.
  EXPECT_TRUE(std::binary_search(privileged->begin(), privileged->end(), "init_module"));
  EXPECT_TRUE(std::binary_search(privileged->begin(), privileged->end(), "settimeofday"));
  auto missing = expand_syscall_group("@nope");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().message, "unknown syscall group \"@nope\"");
  const auto of_mount = syscall_groups_of("mount");
  EXPECT_EQ(of_mount, std::vector<std::string_view>{"@mount"});
  const auto of_settime = syscall_groups_of("settimeofday");
  EXPECT_EQ(of_settime, (std::vector<std::string_view>{"@clock", "@privileged"}));
}

TEST(SyscallGroups, DangerousGroupsAreTheAuditedOnes) {
  std::set<std::string_view> dangerous;
  for (const auto& g : syscall_groups()) {
    if (g.dangerous) dangerous.insert(g.name);
  }
  EXPECT_EQ(dangerous, (std::set<std::string_view>{"@aio", "@clock", "@cpu-emulation", "@debug", "@keyring",
                                                   "@module", "@mount", "@obsolete", "@privileged", "@raw-io",
                                                   "@reboot", "@swap"}));
}

// The default profile's refusals line up with the dangerous groups: nothing
// from @mount, @module, @reboot, @swap, @raw-io, @clock, @keyring or @debug is
// allowed outright.
TEST(SyscallGroups, DefaultProfileAllowsNothingFromDangerousGroups) {
  auto p = load_seccomp_profile_file(kDefaultProfile);
  ASSERT_TRUE(p.ok()) << p.error().message;
  std::set<std::string> allowed;
  for (const auto& rule : p->rules) {
    if (rule.action == SeccompAction::Allow) allowed.insert(rule.names.begin(), rule.names.end());
  }
  for (const char* group : {"@aio", "@clock", "@cpu-emulation", "@debug", "@keyring", "@module", "@mount",
                            "@obsolete", "@raw-io", "@reboot", "@swap"}) {
    auto members = expand_syscall_group(group);
    ASSERT_TRUE(members.ok());
    for (const auto& name : *members) EXPECT_EQ(allowed.count(name), 0u) << group << " " << name;
  }
}

}  // namespace
}  // namespace tsb::policy
