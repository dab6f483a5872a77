// Policies: the loader's file checks and engine contract, includes, backend
// placement (place_run), the explain model and page, lint's tables, and the
// schemas and README against the loader. The golden corpora are in
// policy_golden_test.cc.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "daemon/policy/policy.h"
#include "daemon/policy/policy_explain.h"
#include "daemon/policy/policy_lint.h"
#include "daemon/policy/registry.h"
#include "daemon/policy/jsonc.h"
#include "isolate/engine/plan.h"
#include "daemon/policy/seccomp_profile.h"
#include "daemon/policy/syscall_groups.h"
#include "daemon/compile/spawn_policy.h"

namespace tsb::core {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::string kSource = TSB_SOURCE_DIR;

// The syscalls every inline profile in these tests allows (the engine needs them).
constexpr const char* kEngineAllow =
    R"({ "names": ["read", "write", "exit", "exit_group", "execve"], "action": "SCMP_ACT_ALLOW" })";

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A temporary directory; files are written with an exact mode, whatever the umask.
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/tsb-policy-test-XXXXXX";
    if (const char* d = ::mkdtemp(tmpl)) dir_ = d;
    ::chmod(dir_.c_str(), 0755);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  const std::string& path() const { return dir_; }
  std::string write(const std::string& rel, const std::string& text, mode_t mode = 0644) const {
    const std::string p = dir_ + "/" + rel;
    fs::create_directories(fs::path(p).parent_path());
    const int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    EXPECT_GE(fd, 0) << p;
    if (fd < 0) return p;
    EXPECT_EQ(::write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
    EXPECT_EQ(::fchmod(fd, mode), 0);
    ::close(fd);
    return p;
  }

 private:
  std::string dir_;
};

PolicyContext no_binds() { return PolicyContext{}; }

std::string inline_policy(const std::string& entries, const std::string& defaults = R"("defaultAction": "SCMP_ACT_ERRNO")") {
  return "{\n  \"version\": 1,\n  \"seccomp\": { \"inline\": {\n    " + defaults + ",\n    \"syscalls\": [\n      " +
         entries + "\n    ]\n  } }\n}\n";
}

bool root() { return ::geteuid() == 0; }

#define SKIP_UNLESS_ROOT()                                                                                \
  do {                                                                                                    \
    if (!root())                                                                                          \
      GTEST_SKIP() << "\n\n    *** SKIPPED: the owner and mode checks apply only when loading as root\n"; \
  } while (0)

// ---------------------------------------------------------------------------
// Files: who may have written them.

TEST(PolicyFiles, RootOwnedFilesNotWritableByOthersLoad) {
  TempDir t;
  for (mode_t mode : {0644, 0600, 0444}) {
    const std::string p = t.write("p.json", R"({"version": 1})", mode);
    auto r = load_policy(p, no_binds());
    EXPECT_TRUE(r.ok()) << std::oct << mode << ": " << r.error().message;
  }
}

TEST(PolicyFiles, GroupOrWorldWritablePolicyIsRefused) {
  SKIP_UNLESS_ROOT();
  TempDir t;
  for (mode_t mode : {0664, 0646, 0666}) {
    const std::string p = t.write("p.json", R"({"version": 1})", mode);
    auto r = load_policy(p, no_binds());
    ASSERT_FALSE(r.ok());
    char m[8];
    std::snprintf(m, sizeof m, "%04o", static_cast<unsigned>(mode));
    EXPECT_EQ(r.error().message, "policy: refusing '" + p + "': owned by uid 0 with mode " + m +
                                     "; a policy file must be owned by root and writable by no one else");
    EXPECT_EQ(r.error().code, EPERM);
  }
}

TEST(PolicyFiles, FileOwnedBySomeoneElseIsRefused) {
  SKIP_UNLESS_ROOT();
  TempDir t;
  const std::string p = t.write("p.json", R"({"version": 1})", 0644);
  ASSERT_EQ(::chown(p.c_str(), 65534, 65534), 0);
  auto r = load_policy(p, no_binds());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("owned by uid 65534 with mode 0644"), std::string::npos) << r.error().message;
}

TEST(PolicyFiles, WritableIncludeIsRefusedWhereItIsNamed) {
  SKIP_UNLESS_ROOT();
  TempDir t;
  t.write("base.json", R"({"version": 1})", 0666);
  const std::string p = t.write("p.json", "{\n  \"version\": 1,\n  \"include\": \"base.json\"\n}\n");
  auto r = load_policy(p, no_binds());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message.rfind(p + ":3:14: refusing '" + t.path() + "/base.json'", 0), 0u) << r.error().message;
}

// A refused seccomp/default.json next to the policy must not quietly give
// way to the built-in profile: the author meant that file.
TEST(PolicyFiles, RefusedDefaultProfileIsAnErrorNotAFallback) {
  SKIP_UNLESS_ROOT();
  TempDir t;
  t.write("seccomp/default.json", read_file(kSource + "/policies/seccomp/default.json"), 0664);
  const std::string p = t.write("p.json", R"({"version": 1})");
  auto r = load_policy(p, no_binds());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("seccomp profile: refusing '" + t.path() + "/seccomp/default.json'"),
            std::string::npos)
      << r.error().message;
  // Missing is fine: then the built-in profile applies.
  fs::remove(t.path() + "/seccomp/default.json");
  auto ok = load_policy(p, no_binds());
  ASSERT_TRUE(ok.ok()) << ok.error().message;
  EXPECT_EQ(ok->seccomp_source, "embedded:seccomp/default.json");
}

TEST(PolicyFiles, OnlyRegularFilesAreRead) {
  TempDir t;
  const std::string fifo = t.path() + "/fifo.json";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  auto r = load_policy(fifo, no_binds());  // must not block
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message, "policy: '" + fifo + "' is not a regular file");
  auto d = load_policy(t.path(), no_binds());
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.error().message, "policy: '" + t.path() + "' is not a regular file");
}

// Without root there is nothing to protect that the caller could not
// change anyway, so a non-root `policy check` reads its own files.
TEST(PolicyFiles, ChecksApplyOnlyWhenRunningAsRoot) {
  SKIP_UNLESS_ROOT();
  TempDir t;
  const std::string p = t.write("p.json", R"({"version": 1})", 0666);
  ASSERT_FALSE(read_policy_text(p).ok());
  struct EuidGuard {
    ~EuidGuard() { EXPECT_EQ(::seteuid(0), 0); }
  } guard;
  ASSERT_EQ(::seteuid(65534), 0);
  auto text = read_policy_text(p);
  EXPECT_TRUE(text.ok()) << text.error().message;
}

TEST(PolicyFiles, EmbeddedFilesAreNotSubjectToTheFileChecks) {
  auto r = load_named_policy("default", "", no_binds());
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->source, "embedded:default.json");
}

// ---------------------------------------------------------------------------
// The engine's own syscalls.

TEST(PolicyEngineSyscalls, EachOneIsRequired) {
  TempDir t;
  const std::vector<std::string> needed = {"execve", "exit", "exit_group", "read", "write"};
  for (const auto& missing : needed) {
    std::string names;
    for (const auto& n : needed)
      if (n != missing) names += (names.empty() ? "\"" : ", \"") + n + "\"";
    const std::string p = t.write("p.json", inline_policy(R"({ "names": [)" + names + R"(], "action": "SCMP_ACT_ALLOW" })"));
    auto r = load_policy(p, no_binds());
    ASSERT_FALSE(r.ok()) << missing;
    EXPECT_NE(r.error().message.find("the profile refuses \"" + missing + "\" by its default action (SCMP_ACT_ERRNO(1))"),
              std::string::npos)
        << r.error().message;
    EXPECT_NE(r.error().message.find(p + ":4:22: "), std::string::npos) << "points at defaultAction: " << r.error().message;
  }
}

TEST(PolicyEngineSyscalls, LogAndDefaultAllowCountAsAllowedExecveatDoesNotMatter) {
  TempDir t;
  auto logged = load_policy(
      t.write("a.json", inline_policy(R"({ "names": ["read", "write", "exit", "exit_group", "execve"], "action": "SCMP_ACT_LOG" },
      { "names": ["execveat"], "action": "SCMP_ACT_ERRNO" })")),
      no_binds());
  EXPECT_TRUE(logged.ok()) << logged.error().message;
  auto deny_list = load_policy(t.write("b.json", inline_policy(R"({ "names": ["ptrace"], "action": "SCMP_ACT_ERRNO" })",
                                                               R"("defaultAction": "SCMP_ACT_ALLOW")")),
                               no_binds());
  EXPECT_TRUE(deny_list.ok()) << deny_list.error().message;
  auto refused = load_policy(t.write("c.json", inline_policy(R"({ "names": ["read"], "action": "SCMP_ACT_TRAP" })",
                                                             R"("defaultAction": "SCMP_ACT_ALLOW")")),
                             no_binds());
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("the profile refuses \"read\" (SCMP_ACT_TRAP)"), std::string::npos)
      << refused.error().message;
}

// ---------------------------------------------------------------------------
// Inline profiles and includes.

TEST(PolicyInline, RulePositionsAreThoseOfThePolicyFile) {
  TempDir t;
  const std::string p = t.write("p.json", inline_policy(std::string(kEngineAllow) + R"(,
      { "names": ["getpid"], "action": "SCMP_ACT_ALLOW" })"));
  auto r = load_policy(p, no_binds());
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_EQ(r->seccomp_profile->rules.size(), 2u);
  EXPECT_EQ(r->seccomp_profile->rules[0].where, p + ":6:7");
  EXPECT_EQ(r->seccomp_profile->rules[1].where, p + ":7:7");
  EXPECT_EQ(r->seccomp_source, p + "#/seccomp/inline");
}

TEST(PolicyInclude, SeccompIsReplacedWholeNotMerged) {
  TempDir t;
  t.write("base.json", R"({"version": 1, "seccomp": {"profile": "seccomp/default.json"}, "limits": {"pids": 100, "memory": "1GiB"}})");
  t.write("seccomp/default.json", read_file(kSource + "/policies/seccomp/default.json"));
  const std::string p = t.write("p.json", R"({
  "version": 1,
  "include": "base.json",
  "limits": {"pids": 200},
  "seccomp": {"inline": {"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [)" + std::string(kEngineAllow) + R"(]}}
})");
  auto r = load_policy(p, no_binds());
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->seccomp_source, p + "#/seccomp/inline");
  EXPECT_EQ(r->limits.pids, 200u);                 // objects merge key by key
  EXPECT_EQ(r->limits.memory_bytes, 1ull << 30);  // ... keeping the included keys
  EXPECT_EQ(r->include, t.path() + "/base.json");
}

// A profile named in the included file is found next to that file, as its
// author wrote it, not next to the including one.
TEST(PolicyInclude, IncludedProfileResolvesFromTheIncludedFilesDirectory) {
  TempDir t;
  const std::string strict = R"({"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [)" + std::string(kEngineAllow) + "]}";
  t.write("base/base.json", R"({"version": 1, "seccomp": {"profile": "strict.json"}})");
  t.write("base/strict.json", strict);
  t.write("strict.json", R"({"defaultAction": "SCMP_ACT_ALLOW"})");  // a decoy
  const std::string p = t.write("p.json", R"({"version": 1, "include": "base/base.json"})");
  auto r = load_policy(p, no_binds());
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->seccomp_source, t.path() + "/base/strict.json");
  EXPECT_EQ(r->seccomp_profile->default_action, policy::SeccompAction::Errno);
}

TEST(PolicyInclude, ErrorsInAnIncludedInlineProfilePointAtTheIncludedFile) {
  TempDir t;
  t.write("base.json", inline_policy(R"({ "names": ["read", "nosuchcall"], "action": "SCMP_ACT_ALLOW" })"));
  const std::string p = t.write("p.json", R"({"version": 1, "include": "base.json"})");
  auto r = load_policy(p, no_binds());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find(t.path() + "/base.json:6:27: unknown syscall \"nosuchcall\""), std::string::npos)
      << r.error().message;
}

TEST(PolicyInclude, ArraysAreReplaced) {
  TempDir t;
  t.write("base.json", R"({"version": 1, "environment": {"allow": ["A", "B"], "set": {"X": "1"}}})");
  const std::string p = t.write("p.json", R"({"version": 1, "include": "base.json", "environment": {"allow": ["C"]}})");
  auto r = load_policy(p, no_binds());
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->env_allow, std::vector<std::string>{"C"});
  EXPECT_EQ(r->env_set.at("X"), "1");
}

TEST(PolicyFingerprint, CoversTheEffectivePolicyNotItsSpelling) {
  TempDir t;
  auto a = load_policy(t.write("a.json", R"({"version": 1, "limits": {"memory": "512MiB"}})"), no_binds());
  auto b = load_policy(t.write("b.json", "// same policy, other spelling\n{\"limits\": {\"memory\": 536870912}, \"version\": 1}"),
                       no_binds());
  auto c = load_policy(t.write("c.json", R"({"version": 1, "limits": {"memory": "513MiB"}})"), no_binds());
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(a->fingerprint, b->fingerprint);
  EXPECT_NE(a->fingerprint, c->fingerprint);
  EXPECT_EQ(a->fingerprint.rfind("sha256:", 0), 0u);
  EXPECT_EQ(a->fingerprint.size(), 7u + 64u);
}

// ---------------------------------------------------------------------------
// Backend placement: daemon/policy/registry.cc place_run.

class PlaceRun : public testing::Test {
 protected:
  void SetUp() override {
    PolicyContext ctx;
    ctx.compile = false;
    for (const char* n : {"default", "privileged"}) {
      auto p = load_named_policy(n, "", ctx);
      ASSERT_TRUE(p.ok()) << p.error().message;
      set_.policies[n] = std::make_shared<const Policy>(std::move(p).value());
    }
    Policy remote = *set_.policies.at("default");
    remote.name = "remote";
    remote.backend = Backend::E2B;
    set_.policies["remote"] = std::make_shared<const Policy>(remote);

    set_.orgs.fallback = OrgEntry{};  // not privileged, "default" only
    set_.orgs.orgs["org-privileged"] = OrgEntry{true, "privileged", {"privileged", "default", "remote"}, ""};
    set_.orgs.orgs["org-plain"] = OrgEntry{false, "default", {"default", "privileged", "ghost"}, ""};
  }
  PolicySet set_;
};

TEST_F(PlaceRun, PrivilegedOrganizationRunsLocallyEvenWithE2B) {
  for (bool e2b : {false, true}) {
    auto r = place_run(set_, "org-privileged", std::nullopt, e2b);
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(r->backend, Backend::Local);
    EXPECT_TRUE(r->privileged);
    EXPECT_EQ(r->policy->name, "privileged");
  }
}

TEST_F(PlaceRun, UnprivilegedOrganizationGoesToE2BWhenConfigured) {
  auto r = place_run(set_, "org-plain", std::nullopt, true);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->backend, Backend::E2B);
  EXPECT_FALSE(r->privileged);
  EXPECT_EQ(r->policy->name, "default");
}

TEST_F(PlaceRun, UnprivilegedOrganizationWithoutE2BRunsLocallyUnderItsPolicy) {
  auto r = place_run(set_, "org-plain", std::nullopt, false);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->backend, Backend::Local);
  EXPECT_EQ(r->policy->name, "default");
  auto asked = place_run(set_, "org-plain", std::string("privileged"), false);
  ASSERT_TRUE(asked.ok()) << asked.error().message;
  EXPECT_EQ(asked->policy->name, "privileged");
  EXPECT_EQ(asked->backend, Backend::Local);
}

TEST_F(PlaceRun, PolicyNotAllowedForTheOrganizationIsRefusedWithEperm) {
  auto r = place_run(set_, "org-plain", std::string("remote"), false);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, EPERM);
  EXPECT_EQ(r.error().message, "policy \"remote\" is not allowed for organization \"org-plain\"");
  auto ghost = place_run(set_, "org-plain", std::string("ghost"), false);  // allowed, not loaded
  ASSERT_FALSE(ghost.ok());
  EXPECT_EQ(ghost.error().code, EPERM);
  EXPECT_EQ(ghost.error().message, "policy \"ghost\" is not loaded");
}

TEST_F(PlaceRun, UnknownOrganizationGetsTheDefaultEntry) {
  auto r = place_run(set_, "org-nobody-listed", std::nullopt, false);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->policy->name, "default");
  EXPECT_FALSE(r->privileged);
  EXPECT_EQ(r->backend, Backend::Local);
  auto e2b = place_run(set_, "org-nobody-listed", std::nullopt, true);
  ASSERT_TRUE(e2b.ok());
  EXPECT_EQ(e2b->backend, Backend::E2B);
  auto denied = place_run(set_, "org-nobody-listed", std::string("privileged"), false);
  ASSERT_FALSE(denied.ok());
  EXPECT_EQ(denied.error().code, EPERM);
}

TEST_F(PlaceRun, AnE2BPolicyAlwaysGoesToE2B) {
  auto r = place_run(set_, "org-privileged", std::string("remote"), false);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->backend, Backend::E2B);
}

// A warm pool that can never fill (every warm sandbox holds a uid slot,
// and runs keep max_concurrent_runs of them) is said, not left silent.
TEST_F(PlaceRun, WarmPoolWithoutSpareUidSlotsIsWarnedAbout) {
  DaemonConfig cfg;
  cfg.max_concurrent_runs = 56;
  cfg.max_sessions = 8;  // sessions hold uid slots too
  cfg.engine.uid_slots = 64;
  // The shipped policies have pools.
  EXPECT_EQ(policy_set_warning(cfg, set_),
            "the warm pools of \"default\", \"privileged\" stay empty: engine.uid_slots (64) leaves no uid slot "
            "beyond max_concurrent_runs plus max_sessions (64), and every warm sandbox holds one; raise "
            "engine.uid_slots");
  for (const char* name : {"default", "privileged"}) {
    Policy cold = *set_.policies.at(name);
    cold.warm.max = 0;
    set_.policies[name] = std::make_shared<const Policy>(cold);
  }
  EXPECT_EQ(policy_set_warning(cfg, set_), "") << "no policy has a pool";
  Policy warm = *set_.policies.at("default");
  warm.name = "warm";
  warm.warm.max = 4;
  set_.policies["warm"] = std::make_shared<const Policy>(warm);
  EXPECT_EQ(policy_set_warning(cfg, set_),
            "the warm pools of \"warm\" stay empty: engine.uid_slots (64) leaves no uid slot beyond "
            "max_concurrent_runs plus max_sessions (64), and every warm sandbox holds one; raise engine.uid_slots");
  cfg.engine.uid_slots = 65;
  EXPECT_EQ(policy_set_warning(cfg, set_), "");
  cfg.max_sessions = 9;
  EXPECT_NE(policy_set_warning(cfg, set_), "") << "the slots sessions hold are no warm sandbox's";
}

TEST(Organizations, StrictWithPositions) {
  TempDir t;
  auto ok = load_organizations(t.write("o.json", R"({"version": 1, "organizations": {"a": {"privileged": true, "policy": "privileged"}}})"));
  ASSERT_TRUE(ok.ok()) << ok.error().message;
  // The entry's own policy is always among its allowed ones.
  EXPECT_EQ(ok->orgs.at("a").allowed_policies, (std::vector<std::string>{"default", "privileged"}));
  EXPECT_EQ(&ok->lookup("zzz"), &ok->fallback);
  const std::string bad = t.write("bad.json", "{\n  \"version\": 1,\n  \"default\": {\"priviledged\": true}\n}\n");
  auto r = load_organizations(bad);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message,
            bad + ":3:15: unknown key \"priviledged\" (known here: privileged, policy, allowed_policies, e2b_policy)");
  auto nov = load_organizations(t.write("nov.json", R"({"default": {}})"));
  ASSERT_FALSE(nov.ok());
}

// ---------------------------------------------------------------------------
// The explain model.

std::vector<SyscallRuleView> rules_from(const std::string& syscalls_json) {
  auto prof = policy::parse_seccomp_profile(
      R"({"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [)" + syscalls_json + "]}", "t.json");
  EXPECT_TRUE(prof.ok()) << prof.error().message;
  if (!prof.ok()) return {};
  std::vector<SyscallRuleView> out;
  for (auto& [name, rules] : view_profile(*prof).syscalls) out.insert(out.end(), rules.begin(), rules.end());
  return out;
}

std::string eq(const char* name, int index, unsigned long long value, const char* action = "SCMP_ACT_ALLOW") {
  return std::string(R"({"names": [")") + name + R"("], "action": ")" + action + R"(", "args": [{"index": )" +
         std::to_string(index) + R"(, "value": )" + std::to_string(value) + R"(, "op": "SCMP_CMP_EQ"}]})";
}

TEST(PolicyExplainConditions, EqualityTestsOfOneArgumentMerge) {
  const auto rules = rules_from(eq("socket", 0, 1) + "," + eq("socket", 0, 2) + "," + eq("socket", 0, 10) + "," +
                                eq("socket", 0, 16));
  EXPECT_EQ(describe_conditions("socket", rules),
            std::vector<std::string>{"family (arg0) is AF_UNIX, AF_INET, AF_INET6, AF_NETLINK"});
}

TEST(PolicyExplainConditions, EachOperatorReads) {
  const auto one = [](const std::string& syscall, const std::string& args) {
    return describe_conditions(syscall, rules_from(R"({"names": [")" + syscall +
                                                   R"("], "action": "SCMP_ACT_ALLOW", "args": [)" + args + "]}"));
  };
  EXPECT_EQ(one("clone", R"({"index": 0, "value": 2114060288, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"})"),
            std::vector<std::string>{"flags (arg0) has none of CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, "
                                     "CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET"});
  EXPECT_EQ(one("ioctl", R"({"index": 1, "value": 4294967295, "valueTwo": 21522, "op": "SCMP_CMP_MASKED_EQ"})"),
            std::vector<std::string>{"request (arg1) (low 32 bits) is TIOCSTI"});
  EXPECT_EQ(one("socket", R"({"index": 0, "value": 40, "op": "SCMP_CMP_NE"})"),
            std::vector<std::string>{"family (arg0) is not AF_VSOCK"});
  EXPECT_EQ(one("socket", R"({"index": 0, "value": 16, "op": "SCMP_CMP_GT"})"),
            std::vector<std::string>{"family (arg0) > 16 (AF_NETLINK)"});
  EXPECT_EQ(one("getpid", R"({"index": 2, "value": 65536, "op": "SCMP_CMP_LE"})"),
            std::vector<std::string>{"arg2 <= 0x10000"});
  EXPECT_EQ(one("socket", R"({"index": 0, "value": 16, "op": "SCMP_CMP_EQ"}, {"index": 2, "value": 0, "op": "SCMP_CMP_EQ"})"),
            std::vector<std::string>{"family (arg0) is AF_NETLINK and protocol (arg2) is 0"});
  EXPECT_EQ(one("ioctl", R"({"index": 1, "value": 12, "valueTwo": 4, "op": "SCMP_CMP_MASKED_EQ"})"),
            std::vector<std::string>{"request (arg1) & 0xc == 0x4"});
}

TEST(PolicyExplainConditions, SingleBitTestsMerge) {
  std::string rules;
  for (int bit : {0, 3}) {
    rules += std::string(rules.empty() ? "" : ",") + R"({"names": ["ioctl"], "action": "SCMP_ACT_ALLOW", "args": [{"index": 1, "value": )" +
             std::to_string(1 << bit) + R"(, "valueTwo": )" + std::to_string(1 << bit) + R"(, "op": "SCMP_CMP_MASKED_EQ"}]})";
  }
  rules += R"(,{"names": ["ioctl"], "action": "SCMP_ACT_ALLOW", "args": [{"index": 1, "value": 2, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}]})";
  EXPECT_EQ(describe_conditions("ioctl", rules_from(rules)),
            (std::vector<std::string>{"request (arg1) has any of bits 0, 3 set", "request (arg1) has bit 1 clear"}));
}

TEST(PolicyExplainModel, ErrnoNamesAndEffects) {
  EXPECT_EQ(errno_label(1), "EPERM (1)");
  EXPECT_EQ(errno_label(38), "ENOSYS (38)");
  EXPECT_EQ(errno_label(0), "errno 0 (reports success without running)");
  EXPECT_EQ(action_effect(policy::SeccompAction::KillProcess, 0), "kills the process");
  EXPECT_EQ(action_effect(policy::SeccompAction::Log, 0), "allowed, logged");
}

TEST(PolicyExplainModel, SyscallFates) {
  auto prof = policy::parse_seccomp_profile(
      R"({"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [{"names": ["read"], "action": "SCMP_ACT_ALLOW"},
          {"names": ["ptrace"], "action": "SCMP_ACT_ERRNO"},)" +
          eq("socket", 0, 1) + "," + eq("kill", 1, 9, "SCMP_ACT_ERRNO") + "]}",
      "t.json");
  ASSERT_TRUE(prof.ok()) << prof.error().message;
  const auto v = view_profile(*prof);
  EXPECT_EQ(syscall_fate(v, "read"), SyscallFate::Allowed);
  EXPECT_EQ(syscall_fate(v, "ptrace"), SyscallFate::Refused);
  EXPECT_EQ(syscall_fate(v, "socket"), SyscallFate::AllowedSometimes);
  EXPECT_EQ(syscall_fate(v, "kill"), SyscallFate::Refused);  // refused for SIGKILL, the default for the rest
  EXPECT_EQ(syscall_fate(v, "getpid"), SyscallFate::Refused);
}

// The page prints the one table (daemon/policy/fs_table.h) the sandbox is built
// from: every row, in its order, with its reason, and nothing else.
void expect_rows_are_the_table(const Policy& p) {
  auto table = isolate::build_fs_table(fs_inputs_from(p, "/toolsandbox-runner"));
  ASSERT_TRUE(table.ok()) << table.error().message;
  const auto rows = mount_rows(p);
  ASSERT_EQ(rows.size(), (*table)->size()) << p.name;
  const std::string page = explain_policy(p, {.host_facts = false});
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const isolate::FsEntry& e = (**table)[i];
    EXPECT_EQ(rows[i].path, e.path) << p.name << " row " << i;
    EXPECT_EQ(rows[i].note.substr(0, e.reason.size()), e.reason) << p.name << " row " << i;
    EXPECT_NE(page.find(" " + e.path + " "), std::string::npos) << p.name << ": the page has no row " << e.path;
  }
}

TEST(PolicyExplainPage, MountRowsAreTheTable) {
  TempDir t;
  PolicyContext ctx;
  ctx.bind_allowlist = {"/srv"};
  for (const char* n : {"default", "privileged"}) {
    auto p = load_named_policy(n, "", ctx);
    ASSERT_TRUE(p.ok()) << p.error().message;
    expect_rows_are_the_table(*p);
  }
  auto binds = load_policy(t.write("b.json", R"({"version": 1, "filesystem": {"venv": null, "workdir": "/home/tool",
      "binds": [{"source": "/srv/a", "target": "/data/a", "writable": true}, {"source": "/srv/b", "target": "/b", "optional": true}]}})"),
                           ctx);
  ASSERT_TRUE(binds.ok()) << binds.error().message;
  expect_rows_are_the_table(*binds);
  const auto rows = mount_rows(*binds);
  auto rw = std::find_if(rows.begin(), rows.end(), [](const MountRow& r) { return r.path == "/data/a"; });
  ASSERT_NE(rw, rows.end());
  EXPECT_TRUE(rw->flagged) << "a writable bind is a dangerous grant";
  EXPECT_EQ(rw->source, "host /srv/a");
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  std::string l;
  while (std::getline(in, l)) out.push_back(l);
  return out;
}

// The section of a page that starts with the line `heading`.
std::vector<std::string> section(const std::string& page, const std::string& heading) {
  std::vector<std::string> out;
  bool in = false;
  for (const auto& l : lines_of(page)) {
    if (l == heading) {
      in = true;
      continue;
    }
    if (in && l.empty()) break;
    if (in) out.push_back(l);
  }
  return out;
}

// A host path the sandbox is built from may not lie inside a writable bind
// (a tool could replace it for every later run); beside it, or the bind's
// own directory again, it may.
TEST(PolicyBinds, NoSourceInsideAWritableBind) {
  TempDir t;
  PolicyContext ctx;
  ctx.bind_allowlist = {"/srv"};
  auto inside = load_policy(t.write("in.json", R"({"version": 1, "filesystem": {"venv": null, "binds": [
      {"source": "/srv/data", "target": "/data", "writable": true}, {"source": "/srv/data/app.json", "target": "/etc-app.json"}]}})"),
                            ctx);
  ASSERT_FALSE(inside.ok());
  EXPECT_NE(inside.error().message.find("\"/srv/data/app.json\" lies inside the writable bind \"/srv/data\""),
            std::string::npos)
      << inside.error().message;
  auto venv = load_policy(t.write("venv.json", R"({"version": 1, "filesystem": {"venv": "/srv/data/venv", "binds": [
      {"source": "/srv/data", "target": "/data", "writable": true}]}})"),
                          ctx);
  ASSERT_FALSE(venv.ok());
  EXPECT_NE(venv.error().message.find("the venv"), std::string::npos) << venv.error().message;
  auto beside = load_policy(t.write("ok.json", R"({"version": 1, "filesystem": {"venv": null, "binds": [
      {"source": "/srv/data", "target": "/data", "writable": true}, {"source": "/srv/data", "target": "/data-ro"},
      {"source": "/srv/dataset", "target": "/dataset"}, {"source": "/srv", "target": "/srv-all"}]}})"),
                            ctx);
  EXPECT_TRUE(beside.ok()) << beside.error().message;
}

TEST(PolicyExplainPage, DangerousGrantsAreFlaggedWhereTheyAppearAndListedAtTheEnd) {
  TempDir t;
  PolicyContext ctx;
  ctx.bind_allowlist = {"/srv", "/etc"};
  const std::string p = t.write("risky.json", R"({
  "version": 1,
  "network": "host",
  "filesystem": {"binds": [{"source": "/srv/data", "target": "/data", "writable": true},
                           {"source": "/etc/pki", "target": "/pki"}]},
  "environment": {"allow": ["*"]},
  "limits": {"cpu_time": 0},
  "seccomp": {"inline": {"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [)" + std::string(kEngineAllow) + R"(,
    {"names": ["ptrace", "chown"], "action": "SCMP_ACT_ALLOW"}]}}
})");
  auto r = load_policy(p, ctx);
  ASSERT_TRUE(r.ok()) << r.error().message;
  ExplainOptions portable;
  portable.host_facts = false;
  const std::string page = explain_policy(*r, portable);
  std::vector<std::string> flagged;
  for (const auto& l : lines_of(page))
    if (!l.empty() && l[0] == '!') flagged.push_back(l);
  const auto grants = section(page, "Dangerous grants");
  const auto has = [&](const std::vector<std::string>& v, const std::string& s) {
    return std::any_of(v.begin(), v.end(), [&](const std::string& l) { return l.find(s) != std::string::npos; });
  };
  EXPECT_TRUE(has(flagged, "! net     host: shares the host's network namespace"));
  EXPECT_TRUE(has(flagged, "! /data "));
  EXPECT_TRUE(has(flagged, "! /pki "));
  EXPECT_TRUE(has(flagged, "!   * (any name the policy does not fix)"));
  EXPECT_TRUE(has(flagged, "! cpu_time "));
  EXPECT_TRUE(has(flagged, "!     ptrace"));
  EXPECT_FALSE(has(flagged, "chown"));  // inert here: listed under Accepted
  EXPECT_TRUE(has(section(page, "Accepted (from dangerous groups, inert in every toolsandboxd sandbox)"), "\"chown\""));
  // The end section says what lint says, line for line.
  const LintReport lint = lint_policy_file(p, ctx);
  std::vector<std::string> warnings;
  for (const auto& f : lint.findings)
    if (f.severity == LintSeverity::Warning) warnings.push_back("! " + f.message);
  EXPECT_EQ(grants, warnings);
  EXPECT_EQ(lint.exit_status(), 1);
}

TEST(PolicyExplainPage, StableAndFreeOfBuildPaths) {
  auto p = load_named_policy("privileged", "", PolicyContext{});
  ASSERT_TRUE(p.ok()) << p.error().message;
  const std::string page = explain_policy(*p);
  EXPECT_EQ(page, explain_policy(*p));
  EXPECT_EQ(page.find(TSB_SOURCE_DIR), std::string::npos);
  for (const auto& l : lines_of(page)) {
    EXPECT_TRUE(l.empty() || l.back() != ' ') << "trailing space: " << l;
    EXPECT_EQ(l.find('\t'), std::string::npos) << l;
  }
}

TEST(PolicyExplainPage, EachAllowedSyscallOnceUnderItsFirstGroup) {
  auto p = load_named_policy("default", "", PolicyContext{});
  ASSERT_TRUE(p.ok()) << p.error().message;
  ExplainOptions portable;
  portable.host_facts = false;
  const auto seccomp = section(explain_policy(*p, portable), "Seccomp");
  std::map<std::string, int> seen;
  std::string group;
  bool in_allowed = false;
  for (const auto& l : seccomp) {
    if (l.rfind("  allowed:", 0) == 0) in_allowed = true;
    else if (l.rfind("  refused:", 0) == 0) in_allowed = false;
    else if (in_allowed && l.rfind("    ", 0) == 0 && l.size() > 4 && l[4] != ' ') group = l.substr(4, l.find(':') - 4);
    else if (in_allowed && l.size() > 6 && l.compare(0, 6, "      ") == 0 && l[6] != ' ') {
      const std::string name = l.substr(6, l.find(':') == std::string::npos ? std::string::npos : l.find(':') - 6);
      ++seen[name];
      const auto groups = policy::syscall_groups_of(name);
      EXPECT_EQ(group, groups.empty() ? std::string("(in no group)") : std::string(groups.front())) << name;
    }
  }
  EXPECT_GT(seen.size(), 100u);
  for (const auto& [name, n] : seen) EXPECT_EQ(n, 1) << name;
  EXPECT_EQ(seen.count("ptrace"), 0u);
  EXPECT_EQ(seen.count("socket"), 1u);
}

TEST(PolicyExplainCompare, EachKindOfDifferenceIsReportedAndCounted) {
  TempDir t;
  const std::string p = t.write("p.json", inline_policy(std::string(kEngineAllow) + R"(,
      {"names": ["ptrace"], "action": "SCMP_ACT_ALLOW"},
      {"names": ["kcmp"], "action": "SCMP_ACT_ERRNO", "errnoRet": 1},)" +
                                                       eq("socket", 0, 1) + "," + eq("socket", 0, 2)));
  auto mine = load_policy(p, no_binds());
  ASSERT_TRUE(mine.ok()) << mine.error().message;
  auto other = policy::parse_seccomp_profile(R"({"defaultAction": "SCMP_ACT_ERRNO", "defaultErrnoRet": 38, "syscalls": [)" +
                                                  std::string(kEngineAllow) + R"(,
      {"names": ["mount"], "action": "SCMP_ACT_ALLOW"},)" + eq("socket", 0, 1) + "]}",
                                              "other.json");
  ASSERT_TRUE(other.ok()) << other.error().message;
  const std::string page = compare_profiles(*mine, *other, "other.json");
  const auto has = [&](const std::string& s) { return page.find(s) != std::string::npos; };
  EXPECT_TRUE(has("\n  kcmp: refused in both, with a different errno or action\n    here:  EPERM (1)\n"
                  "    there: ENOSYS (38) by default\n"));
  EXPECT_TRUE(has("\n  mount: refused here (EPERM (1) by default), allowed there\n"));
  EXPECT_TRUE(has("\n  ptrace: allowed here, refused there (ENOSYS (38) by default)\n"));
  EXPECT_TRUE(has("\n  socket: allowed in both, with different argument conditions\n"
                  "    here:  only when family (arg0) is AF_UNIX, AF_INET\n"
                  "    there: only when family (arg0) is AF_UNIX\n"));
  EXPECT_TRUE(has("default action differs (every syscall neither names): here EPERM (1), there ENOSYS (38)"));
  EXPECT_TRUE(has("\n4 differences: 1 allowed here but refused there, 1 refused here but allowed there, "
                  "1 with different argument conditions, 1 with a different errno or action\n"));
  // Sorted by name.
  EXPECT_LT(page.find("  kcmp:"), page.find("  mount:"));
  EXPECT_LT(page.find("  mount:"), page.find("  ptrace:"));
  EXPECT_LT(page.find("  ptrace:"), page.find("  socket:"));
}

// ---------------------------------------------------------------------------
// Lint.

TEST(PolicyLint, ShippedPoliciesWarnOnlyAboutWhatTheyGrantOnPurpose) {
  const std::map<std::string, std::vector<std::string>> expected = {
      {"default", {"environment allow \"*\": a request may set any variable the policy does not fix"}},
      {"privileged",
       {"egress \"public\": a tool may connect to any public address on port 80, 443 (anything it holds can leave "
        "for any server on the internet; the host and its private networks stay denied)",
        "packages allow \"*\" with an index: a tool may have any project of \"https://pypi.org/simple\" installed and "
        "imported (name the projects tools need instead)",
        "environment allow \"*\": a request may set any variable the policy does not fix"}},
      {"e2b",
       {"backend e2b with network \"egress\": E2B allows the rules' hosts by name on ports 80 and 443 only, but does "
        "not apply max_connections or max_bytes, and its sandbox reaches E2B's resolver 8.8.8.8 on any port (DNS "
        "queries can carry data out)",
        "egress \"public\": a tool may connect to any public address on port 80, 443 (anything it holds can leave "
        "for any server on the internet; the host and its private networks stay denied)",
        "environment allow \"*\": a request may set any variable the policy does not fix"}},
  };
  for (const auto& [name, warnings] : expected) {
    const LintReport r = lint_policy_file("embedded:" + name + ".json", PolicyContext{});
    std::vector<std::string> got;
    std::size_t notes = 0;
    for (const auto& f : r.findings) {
      if (f.severity == LintSeverity::Warning) got.push_back(f.message);
      if (f.severity == LintSeverity::Note) ++notes;
    }
    EXPECT_EQ(got, warnings) << name;
    EXPECT_GT(notes, 0u) << name << ": chown and the set*id calls are noted as inert";
    EXPECT_EQ(r.exit_status(), 1) << name;
  }
}

TEST(PolicyLint, RiskTables) {
  EXPECT_FALSE(dangerous_syscall_reason("clone", true).has_value());  // a flag mask makes clone fine
  EXPECT_TRUE(dangerous_syscall_reason("clone", false).has_value());
  EXPECT_TRUE(dangerous_syscall_reason("ptrace", true).has_value());  // ptrace is not
  for (const char* s : {"ptrace", "mount", "bpf", "unshare", "setns", "keyctl", "perf_event_open", "userfaultfd",
                        "io_uring_setup", "kexec_load", "init_module", "clock_settime", "pivot_root", "clone3"})
    EXPECT_TRUE(dangerous_syscall_reason(s, false).has_value()) << s;
  for (const char* s : {"read", "write", "openat", "getpid", "socket", "execve", "futex"})
    EXPECT_FALSE(dangerous_syscall_reason(s, false).has_value()) << s;
  EXPECT_EQ(*dangerous_syscall_reason("kexec_load", false), "Rebooting the machine or loading a new kernel (@reboot)");
  EXPECT_TRUE(inert_syscall_reason("chown").has_value());
  EXPECT_TRUE(inert_syscall_reason("setuid").has_value());
  EXPECT_FALSE(inert_syscall_reason("ptrace").has_value());
  // Every inert syscall is one lint would otherwise flag.
  for (const char* s : {"capset", "chown", "fchown", "fchownat", "lchown", "setfsuid", "setgroups", "setresuid",
                        "setreuid", "setuid"})
    EXPECT_TRUE(dangerous_syscall_reason(s, false).has_value()) << s;

  for (const char* p : {"/", "/etc", "/etc/ssl", "/root", "/home/alice", "/run", "/var/run/docker.sock",
                        "/srv/x/containerd.sock", "/var", "/proc", "/sys/fs", "/dev", "/boot"})
    EXPECT_TRUE(sensitive_host_path_reason(p).has_value()) << p;
  for (const char* p : {"/srv/tools", "/opt/models", "/var/lib/toolsandbox/venv", "/etcetera", "/homes"})
    EXPECT_FALSE(sensitive_host_path_reason(p).has_value()) << p;
  EXPECT_EQ(*sensitive_host_path_reason("/var"), "contains /var/lib/containerd, /var/lib/docker, /var/log, /var/run");
}

TEST(PolicyLint, FindingFormat) {
  LintFinding f;
  f.file = "p.json";
  f.message = "m";
  EXPECT_EQ(f.format(), "p.json: warning: m");
  f.line = 3;
  f.col = 14;
  f.severity = LintSeverity::Error;
  EXPECT_EQ(f.format(), "p.json:3:14: error: m");
  LintReport r;
  EXPECT_EQ(r.exit_status(), 0);
  r.findings.push_back({LintSeverity::Note, "a", 0, 0, "n"});
  EXPECT_EQ(r.exit_status(), 0);
  r.findings.push_back({LintSeverity::Warning, "a", 0, 0, "w"});
  EXPECT_EQ(r.exit_status(), 1);
  r.findings.push_back({LintSeverity::Error, "a", 0, 0, "e"});
  EXPECT_EQ(r.exit_status(), 2);
}

// ---------------------------------------------------------------------------
// Schemas and README against the loader.

json load_schema(const std::string& name) {
  auto doc = parse_jsonc(read_file(kSource + "/policies/schema/" + name), name);
  EXPECT_TRUE(doc.ok()) << (doc.ok() ? "" : doc.error().message);
  return doc.ok() ? doc->value : json();
}

std::set<std::string> keys_of(const json& schema_object) {
  std::set<std::string> out;
  if (schema_object.contains("properties"))
    for (auto it = schema_object["properties"].begin(); it != schema_object["properties"].end(); ++it) out.insert(it.key());
  return out;
}

// The loader's known keys at one place, read from its unknown-key message.
std::set<std::string> loader_keys(const std::string& policy_text) {
  TempDir t;
  PolicyContext ctx;
  ctx.bind_allowlist = {"/srv"};
  auto r = load_policy(t.write("k.json", policy_text), ctx);
  EXPECT_FALSE(r.ok());
  if (r.ok()) return {};
  static const std::regex re(R"(unknown key "zz_unknown" \(known here: ([^)]*)\))");
  std::smatch m;
  EXPECT_TRUE(std::regex_search(r.error().message, m, re)) << r.error().message;
  std::set<std::string> out;
  std::string list = m[1];
  std::size_t pos = 0;
  while (pos <= list.size()) {
    const auto comma = list.find(", ", pos);
    out.insert(list.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos));
    if (comma == std::string::npos) break;
    pos = comma + 2;
  }
  return out;
}

TEST(PolicySchema, DeclaresDraft202012AndTheLoadersKeys) {
  const json s = load_schema("policy.schema.json");
  ASSERT_TRUE(s.is_object());
  EXPECT_EQ(s["$schema"], "https://json-schema.org/draft/2020-12/schema");
  EXPECT_EQ(s["additionalProperties"], false);
  const json& defs = s["$defs"];
  EXPECT_EQ(keys_of(s), loader_keys(R"({"version": 1, "zz_unknown": 1})"));
  EXPECT_EQ(keys_of(defs["limits"]), loader_keys(R"({"version": 1, "limits": {"zz_unknown": 1}})"));
  EXPECT_EQ(keys_of(defs["filesystem"]), loader_keys(R"({"version": 1, "filesystem": {"zz_unknown": 1}})"));
  EXPECT_EQ(keys_of(defs["filesystem"]["properties"]["binds"]["items"]),
            loader_keys(R"({"version": 1, "filesystem": {"binds": [{"source": "/srv/a", "target": "/a", "zz_unknown": 1}]}})"));
  EXPECT_EQ(keys_of(defs["environment"]), loader_keys(R"({"version": 1, "environment": {"zz_unknown": 1}})"));
  EXPECT_EQ(keys_of(defs["seccomp"]), loader_keys(R"({"version": 1, "seccomp": {"zz_unknown": 1}})"));
  EXPECT_EQ(keys_of(s["properties"]["user"]), loader_keys(R"({"version": 1, "user": {"zz_unknown": 1}})"));
  EXPECT_EQ(keys_of(defs["egress"]),
            loader_keys(R"({"version": 1, "network": "egress", "egress": {"zz_unknown": 1}})"));
  EXPECT_EQ(keys_of(defs["egress"]["properties"]["allow"]["items"]),
            loader_keys(R"({"version": 1, "network": "egress", "egress": {"allow": [{"hosts": ["a.test"], "ports": [443], "zz_unknown": 1}]}})"));
  EXPECT_EQ(keys_of(defs["egress"]["properties"]["public"]),
            loader_keys(R"({"version": 1, "network": "egress", "egress": {"public": {"ports": [443], "zz_unknown": 1}}})"));
  EXPECT_EQ(keys_of(defs["packages"]),
            loader_keys(R"({"version": 1, "packages": {"allow": ["*"], "wheels": "/srv/w", "zz_unknown": 1}})"));
  EXPECT_EQ(keys_of(defs["packages"]["properties"]["build"]),
            loader_keys(R"({"version": 1, "packages": {"allow": ["*"], "wheels": "/srv/w", "build": {"zz_unknown": 1}}})"));
  EXPECT_EQ(keys_of(defs["typescript"]), loader_keys(R"({"version": 1, "typescript": {"zz_unknown": 1}})"));
  EXPECT_EQ(keys_of(defs["npm_packages"]),
            loader_keys(R"({"version": 1, "typescript": {"packages": {"allow": ["*"], "tarballs": "/srv/n", "zz_unknown": 1}}})"));
  EXPECT_EQ(keys_of(defs["npm_packages"]["properties"]["build"]),
            loader_keys(R"({"version": 1, "typescript": {"packages": {"allow": ["*"], "tarballs": "/srv/n", "build": {"zz_unknown": 1}}}})"));
  // The embedded OCI profile schema names what daemon/policy/seccomp_profile.cc accepts.
  EXPECT_EQ(keys_of(defs["seccompProfile"]),
            (std::set<std::string>{"defaultAction", "defaultErrnoRet", "architectures", "archMap", "syscalls", "flags",
                                   "listenerPath", "listenerMetadata"}));
  EXPECT_EQ(keys_of(defs["seccompProfile"]["properties"]["syscalls"]["items"]),
            (std::set<std::string>{"names", "name", "action", "errnoRet", "args", "comment", "includes", "excludes"}));
  // Every property says what it means.
  std::function<void(const json&, const std::string&)> documented = [&](const json& node, const std::string& where) {
    if (!node.is_object()) return;
    if (node.contains("properties")) {
      for (auto it = node["properties"].begin(); it != node["properties"].end(); ++it) {
        const json& prop = it.value();
        const bool has_doc = prop.contains("description") ||
                             (prop.contains("$ref") && defs.contains(prop["$ref"].get<std::string>().substr(8)) &&
                              defs[prop["$ref"].get<std::string>().substr(8)].contains("description"));
        const bool internal = where.find("seccompProfile") != std::string::npos || where.find("seccompFilter") != std::string::npos;
        if (!internal) {
          EXPECT_TRUE(has_doc) << where << "/" << it.key();
        }
        documented(prop, where + "/" + it.key());
      }
    }
    for (const char* k : {"items", "additionalProperties"})
      if (node.contains(k)) documented(node[k], where + "/" + k);
  };
  documented(s, "");
  for (auto it = defs.begin(); it != defs.end(); ++it) documented(it.value(), "$defs/" + it.key());
}

TEST(PolicySchema, OrganizationsSchemaMatchesTheRegistry) {
  const json s = load_schema("organizations.schema.json");
  ASSERT_TRUE(s.is_object());
  EXPECT_EQ(s["$schema"], "https://json-schema.org/draft/2020-12/schema");
  EXPECT_EQ(keys_of(s), (std::set<std::string>{"version", "default", "organizations"}));
  EXPECT_EQ(keys_of(s["$defs"]["entry"]), (std::set<std::string>{"privileged", "policy", "allowed_policies", "e2b_policy"}));
  // ... and the registry accepts exactly those.
  TempDir t;
  EXPECT_TRUE(load_organizations(t.write("o.json", R"({"version": 1, "default": {"privileged": false, "policy": "default",
      "allowed_policies": ["default"]}, "organizations": {}})")).ok());
  EXPECT_FALSE(load_organizations(t.write("o.json", R"({"version": 1, "extra": 1})")).ok());
  EXPECT_FALSE(load_organizations(t.write("o.json", R"({"version": 1, "default": {"extra": 1}})")).ok());
}

// A key in a shipped file that the schema does not declare would mean the
// schema (or the file) is wrong.
void expect_declared(const json& value, const json& schema, const json& defs, const std::string& where) {
  const json* s = &schema;
  while (s->contains("$ref")) s = &defs[(*s)["$ref"].get<std::string>().substr(8)];
  if (!value.is_object() || !s->contains("properties")) return;
  for (auto it = value.begin(); it != value.end(); ++it) {
    ASSERT_TRUE((*s)["properties"].contains(it.key())) << where << "/" << it.key() << " is not in the schema";
    expect_declared(it.value(), (*s)["properties"][it.key()], defs, where + "/" + it.key());
  }
}

TEST(PolicySchema, ShippedPoliciesUseOnlyDeclaredKeys) {
  const json s = load_schema("policy.schema.json");
  for (const char* f : {"default.json", "privileged.json", "e2b.json"}) {
    auto doc = parse_jsonc(read_file(kSource + "/policies/" + f), f);
    ASSERT_TRUE(doc.ok()) << doc.error().message;
    expect_declared(doc->value, s, s["$defs"], f);
  }
  auto prof = parse_jsonc(read_file(kSource + "/policies/seccomp/default.json"), "seccomp/default.json");
  ASSERT_TRUE(prof.ok());
  expect_declared(prof->value, s["$defs"]["seccompProfile"], s["$defs"], "seccomp/default.json");
}

TEST(PolicyReadme, NamesEveryKeyAndVerb) {
  const std::string readme = read_file(kSource + "/policies/README.md");
  ASSERT_FALSE(readme.empty());
  const json s = load_schema("policy.schema.json");
  std::set<std::string> keys = keys_of(s);
  for (const char* d : {"limits", "filesystem", "environment", "seccomp", "egress", "packages"})
    for (const auto& k : keys_of(s["$defs"][d])) keys.insert(k);
  for (const auto& k : keys_of(s["$defs"]["packages"]["properties"]["build"])) keys.insert(k);
  for (const auto& k : keys_of(s["$defs"]["filesystem"]["properties"]["binds"]["items"])) keys.insert(k);
  for (const auto& k : keys_of(s["properties"]["user"])) keys.insert(k);
  for (const auto& k : keys_of(s["$defs"]["egress"]["properties"]["allow"]["items"])) keys.insert(k);
  for (const auto& k : keys_of(s["$defs"]["seccompProfile"])) keys.insert(k);
  for (const auto& k : keys_of(s["$defs"]["seccompProfile"]["properties"]["syscalls"]["items"])) keys.insert(k);
  for (const char* k : {"privileged", "policy", "allowed_policies", "e2b_policy", "organizations", "bind_allowlist"})
    keys.insert(k);
  for (const auto& k : keys) EXPECT_NE(readme.find("`" + k + "`"), std::string::npos) << "README does not explain `" << k << "`";
  for (const char* verb : {"policy check", "policy fingerprint", "policy explain", "policy lint", "--compare", "--no-host",
                           "--notes", "--e2b", "--bind-allow", "--config", "TSB_UPDATE_GOLDEN"})
    EXPECT_NE(readme.find(verb), std::string::npos) << verb;
}

// ---------------------------------------------------------------------------
// Packages: per-tool venvs.

Result<Policy> load_text(const TempDir& t, const std::string& text) {
  return load_policy(t.write("p.json", text), no_binds());
}

TEST(PolicyPackages, WheelsOrIndexAndTheirDefaults) {
  TempDir t;
  auto w = load_text(t, R"({"version": 1, "packages": {"allow": ["requests", "types-*"], "wheels": "/srv/wheels"}})");
  ASSERT_TRUE(w.ok()) << w.error().message;
  EXPECT_TRUE(w->packages.enabled);
  EXPECT_EQ(w->packages.wheels, "/srv/wheels");
  EXPECT_EQ(w->packages.max_requirements, 16u);
  EXPECT_FALSE(w->packages.source_builds);
  EXPECT_EQ(w->packages.build_timeout, std::chrono::milliseconds(300'000));
  EXPECT_EQ(w->packages.index_settings(), "wheels=/srv/wheels");
  EXPECT_EQ(w->canonical["packages"]["build"]["venv_size"], "1GiB");
  auto i = load_text(t, R"({"version": 1, "packages": {"allow": ["*"], "index": "http://pypi.test:8080/simple",
      "index_hosts": ["files.test"], "source_builds": true, "max_requirements": 3,
      "build": {"wall_timeout": "20s", "memory": "256MiB", "venv_size": "64MiB"}}})");
  ASSERT_TRUE(i.ok()) << i.error().message;
  EXPECT_EQ(i->packages.index_host, "pypi.test");
  EXPECT_EQ(i->packages.index_port, 8080);
  EXPECT_EQ(i->packages.build_memory, 256ull << 20);
  EXPECT_EQ(i->packages.index_settings(), "index=http://pypi.test:8080/simple\nsource_builds");
  const EgressRules e = build_egress_rules(i->packages);
  ASSERT_EQ(e.allow.size(), 1u);
  EXPECT_EQ(e.allow[0].hosts, (std::vector<std::string>{"pypi.test", "files.test"}));
  EXPECT_EQ(e.allow[0].ports, (std::vector<std::uint16_t>{8080}));
  EXPECT_TRUE(e.public_ports.empty());
  auto https = load_text(t, R"({"version": 1, "packages": {"allow": ["*"], "index": "https://pypi.org/simple"}})");
  ASSERT_TRUE(https.ok()) << https.error().message;
  EXPECT_EQ(https->packages.index_port, 443);
  // The section is part of what the fingerprint covers.
  EXPECT_NE(w->fingerprint, i->fingerprint);
}

TEST(PolicyPackages, Refusals) {
  TempDir t;
  const std::pair<const char*, const char*> cases[] = {
      {R"({"version": 1, "packages": {"wheels": "/srv/w"}})", "/packages/allow: is required"},
      {R"({"version": 1, "packages": {"allow": ["*"]}})", "exactly one of"},
      {R"({"version": 1, "packages": {"allow": ["*"], "wheels": "/srv/w", "index": "https://a.test/"}})", "exactly one of"},
      {R"({"version": 1, "packages": {"allow": ["*"], "wheels": "srv/w"}})", "absolute"},
      {R"({"version": 1, "packages": {"allow": ["*"], "index": "ftp://a.test/"}})", "http:// or https://"},
      {R"({"version": 1, "packages": {"allow": ["*"], "index": "https://10.0.0.1/simple"}})",
       "\"10.0.0.1\" is a private network (RFC 1918): the egress proxy would refuse every connection to it"},
      // Every spelling of an address is read as the proxy reads it.
      {R"({"version": 1, "packages": {"allow": ["*"], "index": "http://127.1:8080/simple"}})", "is loopback: the egress proxy would refuse"},
      {R"({"version": 1, "packages": {"allow": ["*"], "index": "http://0177.0.0.1/simple"}})", "is loopback: the egress proxy would refuse"},
      {R"({"version": 1, "packages": {"allow": ["*"], "index": "http://0xa9fea9fe/simple"}})", "is link-local (169.254/16"},
      {R"({"version": 1, "packages": {"allow": ["*"], "index": "http://100.64.1.1/simple"}})", "CGNAT"},
      {R"({"version": 1, "packages": {"allow": ["*"], "index": "http://0.0.0.0/simple"}})", "unspecified"},
      {R"({"version": 1, "packages": {"allow": ["*"], "index": "http://224.0.0.1/simple"}})", "multicast"},
      {R"({"version": 1, "packages": {"allow": ["*"], "index": "http://[::1]/simple"}})", "loopback (::1): the egress proxy would refuse"},
      {R"({"version": 1, "packages": {"allow": ["*"], "index": "http://[fe80::1]:8080/simple"}})", "link-local (fe80::/10)"},
      {R"({"version": 1, "packages": {"allow": ["*"], "index": "http://[::ffff:192.168.1.5]/simple"}})", "a private network (RFC 1918)"},
      {R"({"version": 1, "packages": {"allow": ["*"], "index": "http://[64:ff9b::a00:1]/simple"}})", "NAT64"},
      // A public address: the build's rules allow the index by name only.
      {R"({"version": 1, "packages": {"allow": ["*"], "index": "https://198.51.100.7/simple"}})", "is an address: the egress proxy allows hosts by name"},
      {R"({"version": 1, "packages": {"allow": ["*"], "index": "https://-pypi.example.com/simple"}})", "not a host name the egress proxy takes"},
      {R"({"version": 1, "packages": {"allow": ["*"], "index": "https://a.test/", "index_hosts": ["10.1.2.3"]}})", "private network"},
      {R"({"version": 1, "packages": {"allow": ["*"], "index": "https://u:p@a.test/simple"}})", "plain URL"},
      {R"({"version": 1, "packages": {"allow": ["*"], "index": "http://localhost:8080/simple"}})", "loopback"},
      {R"({"version": 1, "packages": {"allow": ["*"], "index": "http://pypi.localhost/simple"}})", "loopback"},
      {R"({"version": 1, "packages": {"allow": ["*"], "index": "https://a.test/", "index_hosts": ["files.localhost"]}})", "loopback"},
      {R"({"version": 1, "packages": {"allow": ["*"], "index": "https://a.test:99999/"}})", "port"},
      {R"({"version": 1, "packages": {"allow": ["*"], "wheels": "/srv/w", "index_hosts": ["b.test"]}})", "index"},
      {R"({"version": 1, "packages": {"allow": ["a b"], "wheels": "/srv/w"}})", "not a name pattern"},
      {R"({"version": 1, "packages": {"allow": ["*"], "wheels": "/srv/w", "max_requirements": 65}})", "between 1 and 64"},
      {R"({"version": 1, "packages": {"allow": ["*"], "wheels": "/srv/w", "build": {"wall_timeout": "2h"}}})", "1s to 1h"},
      {R"({"version": 1, "packages": {"allow": ["*"], "wheels": "/srv/w", "build": {"venv_size": "1MiB"}}})", "16MiB"},
      {R"({"version": 1, "backend": "e2b", "packages": {"allow": ["*"], "wheels": "/srv/w"}})", "local backend"},
      {R"({"version": 1, "filesystem": {"venv": null}, "packages": {"allow": ["*"], "wheels": "/srv/w"}})", "filesystem"},
      {R"({"version": 1, "interpreter": "/usr/bin/python3", "packages": {"allow": ["*"], "wheels": "/srv/w"}})", "/venv/bin/python3"},
      {R"({"version": 1, "interpreter": "/venv/bin/mypython", "packages": {"allow": ["*"], "wheels": "/srv/w"}})", "/venv/bin/python3"},
      {R"({"version": 1, "interpreter": "/venv/bin/python3.x", "packages": {"allow": ["*"], "wheels": "/srv/w"}})", "/venv/bin/python3"},
  };
  for (const auto& [text, words] : cases) {
    auto r = load_text(t, text);
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_NE(r.error().message.find(words), std::string::npos) << text << "\n" << r.error().message;
  }
}

// An egress rule that names a host the proxy would always refuse (an
// address on its deny list, however spelled; any address, which only
// "public" reaches; localhost; a name the proxy does not read as one) is
// refused when the policy is read, with the proxy's reason; names it
// serves still load.
TEST(PolicyEgress, HostsTheProxyWouldRefuseAreRefusedWithItsReason) {
  TempDir t;
  const auto policy = [](const std::string& host) {
    return R"({"version": 1, "network": "egress", "egress": {"allow": [{"hosts": [")" + host + R"("], "ports": [443]}]}})";
  };
  const std::pair<const char*, const char*> refused[] = {
      {"127.0.0.1", "\"127.0.0.1\" is loopback: the egress proxy would refuse every connection to it"},
      {"2130706433", "is loopback"},
      {"0x7f.1", "is loopback"},
      {"10.0.0.1", "a private network (RFC 1918)"},
      {"172.16.5.4", "a private network (RFC 1918)"},
      {"169.254.169.254", "link-local (169.254/16: the cloud metadata service)"},
      {"[::1]", "loopback (::1)"},
      {"[fd12::1]", "a private network (ULA fc00::/7)"},
      {"[::ffff:169.254.169.254]", "link-local"},
      {"*.10.0.0.1", "a private network"},
      {"198.51.100.7", "is an address: the egress proxy allows hosts by name, and an address only through \"public\""},
      {"localhost", "is this host's loopback (RFC 6761)"},
      {"*.localhost", "is this host's loopback (RFC 6761)"},
      {"a.localhost", "is this host's loopback (RFC 6761)"},
      {"-a.example.com", "not a host name the egress proxy takes"},
      {"a-.example.com", "not a host name the egress proxy takes"},
  };
  for (const auto& [host, words] : refused) {
    auto r = load_text(t, policy(host));
    ASSERT_FALSE(r.ok()) << host;
    EXPECT_NE(r.error().message.find("p.json:1:68: "), std::string::npos) << r.error().message;  // the host's place
    EXPECT_NE(r.error().message.find(words), std::string::npos) << host << "\n" << r.error().message;
  }
  for (const char* host : {"api.example.com", "*.example.com", "a_b.example.com", "xn--bcher-kva.example", "localhost.example.com"}) {
    auto r = load_text(t, policy(host));
    EXPECT_TRUE(r.ok()) << host << ": " << r.error().message;
  }
}

// Tool mode imports the runner (its bytecode from __pycache__ beside it,
// when root owns it and no one else can write it) rather than compiling it.
TEST(PolicyRunner, ToolModeImportsTheRunnerAndShowsItsBytecode) {
  TempDir t;
  auto p = load_text(t, R"({"version": 1})");
  ASSERT_TRUE(p.ok()) << p.error().message;
  const std::string runner = t.write("runner/toolsandbox_runner.py", "def run(): pass\n");
  const std::string good = t.write("runner/__pycache__/toolsandbox_runner.cpython-311.pyc", "x");
  const std::string open = t.write("runner/__pycache__/toolsandbox_runner.cpython-312.pyc", "x", 0666);
  t.write("runner/__pycache__/other.cpython-311.pyc", "x");
  ::chmod(open.c_str(), 0666);  // whatever the umask
  const bool root = ::geteuid() == 0;
  EXPECT_EQ(find_runner_bytecode(runner), root ? std::vector<std::string>{good} : std::vector<std::string>{});
  auto sp = to_spawn_policy(*p, runner);
  ASSERT_TRUE(sp.ok()) << sp.error().message;
  const auto& tool = sp->modes[static_cast<int>(spawn::RunMode::Tool)];
  ASSERT_GE(tool.argv.size(), 2u);
  EXPECT_EQ(tool.argv[tool.argv.size() - 2], "-c");
  EXPECT_EQ(tool.argv.back(), std::string(kRunnerBoot));
  std::map<std::string, std::string> rows;
  for (const auto& e : *tool.fs) rows[e.path] = e.source;
  EXPECT_EQ(rows[std::string(isolate::kRunnerSandboxPath)], runner);
  EXPECT_EQ(rows.contains("/opt/toolsandbox/runner/__pycache__/toolsandbox_runner.cpython-311.pyc"), root);
  EXPECT_FALSE(rows.contains("/opt/toolsandbox/runner/__pycache__/toolsandbox_runner.cpython-312.pyc"));
  EXPECT_FALSE(rows.contains("/opt/toolsandbox/runner/__pycache__/other.cpython-311.pyc"));
  // Script mode shows the same rows, without a pool too: its launcher
  // takes a script's end from the runner (script_launcher).
  EXPECT_EQ(sp->modes[static_cast<int>(spawn::RunMode::Script)].fs, tool.fs);
}

// The runner's package beside it: each module shown at its path below the
// runner's directory, with its bytecode; what root does not own alone, a
// link, or a package without __init__.py makes it not whole, and a runner
// without a whole package is not installed (find_runner).
TEST(PolicyRunner, ThePackageBesideTheRunnerIsShownWithItsBytecode) {
  TempDir t;
  auto p = load_text(t, R"({"version": 1})");
  ASSERT_TRUE(p.ok()) << p.error().message;
  const std::string runner = t.write("runner/toolsandbox_runner.py", "import _toolsandbox_runner\n");
  const std::string pkg = t.path() + "/runner/_toolsandbox_runner";
  const std::string init = t.write("runner/_toolsandbox_runner/__init__.py", "");
  const std::string part = t.write("runner/_toolsandbox_runner/part.py", "X = 1\n");
  const std::string runner_pyc = t.write("runner/__pycache__/toolsandbox_runner.cpython-311.pyc", "x");
  const std::string init_pyc = t.write("runner/_toolsandbox_runner/__pycache__/__init__.cpython-311.pyc", "x");
  const std::string part_pyc = t.write("runner/_toolsandbox_runner/__pycache__/part.cpython-311.pyc", "x");
  t.write("runner/_toolsandbox_runner/__pycache__/partx.cpython-311.pyc", "x");  // of no module
  t.write("runner/_toolsandbox_runner/__pycache__/part.cpython-311.pyc.tmp", "x");
  t.write("runner/_toolsandbox_runner/notes.txt", "x");  // no module
  ::chmod(pkg.c_str(), 0755);  // whatever the umask
  if (!root()) {
    EXPECT_TRUE(find_runner_files(runner).empty());
    EXPECT_FALSE(runner_package_whole(runner));
    EXPECT_NE(find_runner(runner), runner);
    return;
  }
  EXPECT_EQ(find_runner_package(runner), (std::vector<std::string>{init, part}));
  EXPECT_EQ(find_runner_bytecode(runner), (std::vector<std::string>{runner_pyc, init_pyc, part_pyc}));
  EXPECT_EQ(find_runner_files(runner), (std::vector<std::string>{init, part, runner_pyc, init_pyc, part_pyc}));
  EXPECT_TRUE(runner_package_whole(runner));
  EXPECT_EQ(find_runner(runner), runner);
  auto sp = to_spawn_policy(*p, runner);
  ASSERT_TRUE(sp.ok()) << sp.error().message;
  std::map<std::string, std::string> rows;
  for (const auto& e : *sp->modes[static_cast<int>(spawn::RunMode::Tool)].fs) rows[e.path] = e.source;
  const std::string at = "/opt/toolsandbox/runner/";
  EXPECT_EQ(rows[at + "toolsandbox_runner.py"], runner);
  EXPECT_EQ(rows[at + "_toolsandbox_runner/__init__.py"], init);
  EXPECT_EQ(rows[at + "_toolsandbox_runner/part.py"], part);
  EXPECT_EQ(rows[at + "__pycache__/toolsandbox_runner.cpython-311.pyc"], runner_pyc);
  EXPECT_EQ(rows[at + "_toolsandbox_runner/__pycache__/__init__.cpython-311.pyc"], init_pyc);
  EXPECT_EQ(rows[at + "_toolsandbox_runner/__pycache__/part.cpython-311.pyc"], part_pyc);
  for (const auto& [path, source] : rows) {
    if (path.starts_with(at)) {
      EXPECT_TRUE(path.ends_with(".py") || path.ends_with(".pyc")) << path;
    }
  }
  EXPECT_FALSE(rows.contains(at + "_toolsandbox_runner/__pycache__/partx.cpython-311.pyc"));

  // A module others can write, or a link, is left out: the package is not whole.
  const std::string open = t.write("runner/_toolsandbox_runner/open.py", "", 0666);
  ::chmod(open.c_str(), 0666);
  EXPECT_EQ(find_runner_package(runner), (std::vector<std::string>{init, part}));
  EXPECT_FALSE(runner_package_whole(runner));
  EXPECT_NE(find_runner(runner), runner);
  ::unlink(open.c_str());
  ASSERT_EQ(::symlink(part.c_str(), (pkg + "/link.py").c_str()), 0);
  EXPECT_EQ(find_runner_package(runner), (std::vector<std::string>{init, part}));
  EXPECT_FALSE(runner_package_whole(runner));
  ::unlink((pkg + "/link.py").c_str());
  EXPECT_TRUE(runner_package_whole(runner));
  // No __init__.py: not a package.
  ASSERT_EQ(::rename(init.c_str(), (pkg + "/init.txt").c_str()), 0);
  EXPECT_FALSE(runner_package_whole(runner));
  ASSERT_EQ(::rename((pkg + "/init.txt").c_str(), init.c_str()), 0);
  // A directory others can write, or a link to one: nothing of it is shown.
  ::chmod(pkg.c_str(), 0777);
  EXPECT_TRUE(find_runner_package(runner).empty());
  EXPECT_FALSE(runner_package_whole(runner));
  ::chmod(pkg.c_str(), 0755);
  const std::string other = t.write("other/toolsandbox_runner.py", "");
  ASSERT_EQ(::symlink(pkg.c_str(), (t.path() + "/other/_toolsandbox_runner").c_str()), 0);
  EXPECT_TRUE(find_runner_package(other).empty());
  EXPECT_FALSE(runner_package_whole(other));
  // A runner that is a link: its package is the one beside the file it names.
  ASSERT_EQ(::symlink(runner.c_str(), (t.path() + "/runner.py").c_str()), 0);
  EXPECT_TRUE(runner_package_whole(t.path() + "/runner.py"));
}

// A warm pool: pooled commands for both modes, the runner shown to script
// runs too, the pool in the fingerprint; bounds refused where they are
// written.
TEST(PolicyWarmPool, PooledCommandsAndTheRunnerForScripts) {
  TempDir t;
  const std::string runner = t.write("runner/toolsandbox_runner.py", "def run(): pass\n");
  auto cold = load_text(t, R"({"version": 1})");
  auto p = load_text(t, R"({"version": 1, "warm_pool": {"max": 3, "min": 1, "idle": "90s"}})");
  ASSERT_TRUE(p.ok() && cold.ok()) << (p.ok() ? cold.error().message : p.error().message);
  EXPECT_EQ(p->warm.max, 3u);
  EXPECT_EQ(p->warm.min, 1u);
  EXPECT_EQ(p->warm.idle.count(), 90'000);
  EXPECT_NE(p->fingerprint, cold->fingerprint);
  EXPECT_EQ(p->canonical["warm_pool"], (nlohmann::json{{"max", 3}, {"min", 1}, {"idle", "90s"}, {"preload", kLettaPreload},
                                                      {"tool_preload", nlohmann::json::array()}}));
  EXPECT_FALSE(cold->canonical.contains("warm_pool")) << "no pool: the fingerprints of policies without one stay";
  auto sp = to_spawn_policy(*p, runner);
  ASSERT_TRUE(sp.ok()) << sp.error().message;
  EXPECT_EQ(sp->warm_max, 3u);
  const auto& tool = sp->modes[static_cast<int>(spawn::RunMode::Tool)];
  const auto& script = sp->modes[static_cast<int>(spawn::RunMode::Script)];
  // The program, then the modules to preload: by default Letta's imports
  // for scripts, none for tools (the runner replaces Letta's script).
  const std::size_t n = kLettaPreload.size();
  ASSERT_GT(script.pooled_argv.size(), n);
  EXPECT_EQ(tool.pooled_argv.back(), std::string(kRunnerPooledBoot));
  EXPECT_EQ(script.pooled_argv[script.pooled_argv.size() - n - 1], script_launcher(true));
  EXPECT_EQ(std::vector<std::string>(script.pooled_argv.end() - n, script.pooled_argv.end()), kLettaPreload);
  // A policy's own list goes to both modes.
  auto own = load_text(t, R"({"version": 1, "warm_pool": {"max": 1, "preload": ["json", "email.mime.text"]}})");
  ASSERT_TRUE(own.ok()) << own.error().message;
  auto own_sp = to_spawn_policy(*own, runner);
  ASSERT_TRUE(own_sp.ok()) << own_sp.error().message;
  const std::vector<std::string> listed = {"json", "email.mime.text"};
  for (const auto& m : own_sp->modes)
    EXPECT_EQ(std::vector<std::string>(m.pooled_argv.end() - 2, m.pooled_argv.end()), listed);
  EXPECT_NE(own->fingerprint, p->fingerprint);
  EXPECT_EQ(script.argv.back(), script_launcher(false));
  EXPECT_NE(script_launcher(true).find("await_script()"), std::string::npos);
  EXPECT_NE(script_launcher(false).find("sys.stdin.buffer.read()"), std::string::npos);
  bool runner_row = false;
  for (const auto& e : *script.fs) runner_row = runner_row || e.path == isolate::kRunnerSandboxPath;
  EXPECT_TRUE(runner_row) << "a pooled script takes its hand-over through the runner";
  // Without a pool: no pooled command; script runs see the runner all the
  // same (a cold script's end comes from there).
  auto csp = to_spawn_policy(*cold, runner);
  ASSERT_TRUE(csp.ok());
  EXPECT_TRUE(csp->modes[0].pooled_argv.empty() && csp->modes[1].pooled_argv.empty());
  EXPECT_EQ(csp->modes[0].fs, csp->modes[1].fs);
  // The end note: a warm sandbox's runner and script mode's launcher take
  // it; a cold tool run and a command of toolsandbox run get none.
  EXPECT_TRUE(spawn::run_spec_from(*sp, spawn::RunMode::Tool, "", /*pooled=*/true).end_note);
  EXPECT_TRUE(spawn::run_spec_from(*sp, spawn::RunMode::Script, "", /*pooled=*/true).end_note);
  EXPECT_TRUE(spawn::run_spec_from(*csp, spawn::RunMode::Script).end_note);
  EXPECT_FALSE(spawn::run_spec_from(*csp, spawn::RunMode::Tool).end_note);
  EXPECT_FALSE(run_spec_from(*cold).end_note);
  for (const char* bad : {R"({"version": 1, "warm_pool": {"max": 65}})", R"({"version": 1, "warm_pool": {"max": 2, "min": 3}})",
                          R"({"version": 1, "warm_pool": {"max": 2, "idle": "0.5s"}})",
                          R"({"version": 1, "warm_pool": {"max": 2, "size": 3}})",
                          R"({"version": 1, "backend": "e2b", "warm_pool": {"max": 2}})"})
    EXPECT_FALSE(load_text(t, bad).ok()) << bad;
  EXPECT_TRUE(load_text(t, R"({"version": 1, "warm_pool": null})").ok());
}

// warm_pool.preload: dotted module names only (they become the runner's
// arguments), each once, at most 64; [] preloads nothing; the list is in
// the fingerprint.
TEST(PolicyWarmPool, PreloadNamesModulesOnly) {
  TempDir t;
  const std::string runner = t.write("runner/toolsandbox_runner.py", "def run(): pass\n");
  auto p = load_text(t, R"({"version": 1, "warm_pool": {"max": 2, "preload": ["numpy", "email.mime.text", "_ssl"]}})");
  ASSERT_TRUE(p.ok()) << p.error().message;
  EXPECT_EQ(p->warm.preload, (std::vector<std::string>{"numpy", "email.mime.text", "_ssl"}));
  auto none = load_text(t, R"({"version": 1, "warm_pool": {"max": 2, "preload": []}})");
  auto dflt = load_text(t, R"({"version": 1, "warm_pool": {"max": 2}})");
  ASSERT_TRUE(none.ok() && dflt.ok());
  EXPECT_TRUE(none->warm.preload.empty());
  EXPECT_NE(none->fingerprint, dflt->fingerprint);
  EXPECT_NE(p->fingerprint, dflt->fingerprint);
  auto sp = to_spawn_policy(*none, runner);
  ASSERT_TRUE(sp.ok()) << sp.error().message;
  EXPECT_EQ(sp->modes[static_cast<int>(spawn::RunMode::Tool)].pooled_argv.back(), std::string(kRunnerPooledBoot));
  for (const char* bad : {"\"-c\"", "\"os; import x\"", "\"a..b\"", "\".a\"", "\"a.\"", "\"1abc\"", "\"a b\"",
                          "\"\"", "\"numpy\", \"numpy\"", "3", "\"caf\u00e9\""}) {
    const std::string doc = std::string(R"({"version": 1, "warm_pool": {"max": 2, "preload": [)") + bad + "]}}";
    auto r = load_text(t, doc);
    EXPECT_FALSE(r.ok()) << doc;
    if (!r.ok()) {
      EXPECT_NE(r.error().message.find("p.json:1:"), std::string::npos) << r.error().message;
    }
  }
  std::string many = R"({"version": 1, "warm_pool": {"max": 2, "preload": [)";
  for (int i = 0; i < 65; ++i) many += (i ? ", \"m" : "\"m") + std::to_string(i) + "\"";
  EXPECT_FALSE(load_text(t, many + "]}}").ok()) << "65 modules";
  EXPECT_FALSE(load_text(t, R"({"version": 1, "warm_pool": {"max": 2, "preload": [")" + std::string(129, 'a') + "\"]}}").ok());
}

// ---------------------------------------------------------------------------
// typescript.packages: TypeScript tools' node_modules.

TEST(PolicyNpmPackages, TarballsOrRegistryTheirRefusalsAndTheBuildPolicy) {
  TempDir t;
  auto w = load_text(t, R"({"version": 1, "typescript": {"packages": {"allow": ["tsb-*", "@types/*"], "tarballs": "/srv/npm",
      "build": {"wall_timeout": "30s", "memory": "1GiB", "size": "128MiB"}}}})");
  ASSERT_TRUE(w.ok()) << w.error().message;
  EXPECT_TRUE(w->npm_packages.enabled);
  EXPECT_FALSE(w->packages.enabled);
  EXPECT_FALSE(w->npm_packages.install_scripts);  // the default: --ignore-scripts
  EXPECT_EQ(w->npm_packages.max_requirements, 16u);
  EXPECT_EQ(w->npm_packages.source_settings(), "tarballs=/srv/npm");
  EXPECT_EQ(w->canonical["typescript"]["packages"]["build"]["size"], "128MiB");
  auto r = load_text(t, R"({"version": 1, "typescript": {"packages": {"allow": ["*"], "registry": "https://registry.npmjs.org/",
      "install_scripts": true}}})");
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->npm_packages.registry_host, "registry.npmjs.org");
  EXPECT_EQ(r->npm_packages.registry_port, 443);
  EXPECT_EQ(r->npm_packages.source_settings(), "registry=https://registry.npmjs.org/\ninstall_scripts");
  const EgressRules e = npm_build_egress_rules(r->npm_packages);
  ASSERT_EQ(e.allow.size(), 1u);
  EXPECT_EQ(e.allow[0].hosts, (std::vector<std::string>{"registry.npmjs.org"}));
  EXPECT_NE(w->fingerprint, r->fingerprint);
  for (const auto& [text, want] : std::vector<std::pair<std::string, std::string>>{
           {R"({"version": 1, "typescript": {"packages": {"tarballs": "/srv/npm"}}})", "allow"},
           {R"({"version": 1, "typescript": {"packages": {"allow": ["*"]}}})", "exactly one"},
           {R"({"version": 1, "typescript": {"packages": {"allow": ["*"], "tarballs": "/srv/npm", "registry": "https://r.test/"}}})", "exactly one"},
           {R"({"version": 1, "typescript": {"packages": {"allow": ["*"], "registry": "http://127.0.0.1:4873/"}}})", "loopback"},
           {R"({"version": 1, "typescript": {"packages": {"allow": ["*"], "registry": "http://npm.localhost/"}}})", "loopback"},
           {R"({"version": 1, "typescript": {"packages": {"allow": ["*"], "tarballs": "srv/npm"}}})", "absolute"},
           {R"({"version": 1, "typescript": {"packages": {"allow": ["*"], "tarballs": "/srv/npm", "scripts": true}}})", "scripts"},
           {R"({"version": 1, "typescript": {"packages": {"allow": ["*"], "tarballs": "/srv/npm", "build": {"size": "1MiB"}}}})", "size"},
           {R"({"version": 1, "typescript": {"runtime": 1}})", "runtime"},
       }) {
    auto p = load_text(t, text);
    ASSERT_FALSE(p.ok()) << text;
    EXPECT_NE(p.error().message.find(want), std::string::npos) << p.error().message;
  }

  // The build policy: the builder, a writable /build, the tarballs read-only, no network.
  w->name = "ts";
  auto bp = to_npm_build_spawn_policy(*w, "/usr/share/toolsandbox/runner/toolsandbox_venv_builder.py");
  ASSERT_TRUE(bp.ok()) << bp.error().message;
  EXPECT_EQ(bp->name, "ts/npm-build");
  EXPECT_EQ(bp->network, isolate::NetworkMode::None);
  EXPECT_EQ(bp->limits.wall_timeout, std::chrono::milliseconds(30'000));
  EXPECT_EQ(bp->limits.memory_bytes, 1ull << 30);
  const auto& tool = bp->modes[static_cast<int>(spawn::RunMode::Tool)];
  std::map<std::string, const isolate::FsEntry*> rows;
  for (const auto& e : *tool.fs) rows[e.path] = &e;
  ASSERT_TRUE(rows.contains("/build"));
  EXPECT_EQ(rows["/build"]->kind, isolate::FsEntry::kTmpfs);
  EXPECT_TRUE(rows["/build"]->tool_owned);
  EXPECT_EQ(rows["/build"]->size, 128ull << 20);
  ASSERT_TRUE(rows.contains("/tarballs"));
  EXPECT_EQ(rows["/tarballs"]->kind, isolate::FsEntry::kHost);
  EXPECT_FALSE(rows.contains("/venv"));
  auto rbp = to_npm_build_spawn_policy(*r, "/usr/share/toolsandbox/runner/toolsandbox_venv_builder.py");
  ASSERT_TRUE(rbp.ok());
  EXPECT_EQ(rbp->network, isolate::NetworkMode::Egress);
  EXPECT_EQ(rbp->env_set.at("HTTPS_PROXY"), "http://127.0.0.1:3128");

  // The run's /node_modules: keyed, optional, bound only for a run that names a key.
  auto sp = to_spawn_policy(*w, "/usr/share/toolsandbox/runner/toolsandbox_runner.py", "/var/cache/toolsandbox/venvs");
  ASSERT_TRUE(sp.ok()) << sp.error().message;
  const std::string key(64, 'b');
  auto spec = spawn::run_spec_from(*sp, spawn::RunMode::Tool, "", false, key);
  auto row = std::find_if(spec.fs->begin(), spec.fs->end(), [](const isolate::FsEntry& e) { return e.path == "/node_modules"; });
  ASSERT_NE(row, spec.fs->end());
  EXPECT_EQ(row->source, "/var/cache/toolsandbox/venvs/" + key);
  EXPECT_TRUE(row->keyed);
  EXPECT_TRUE(row->optional);
  EXPECT_EQ(row->kind, isolate::FsEntry::kHost);  // read-only
  auto plain = spawn::run_spec_from(*sp, spawn::RunMode::Tool, "", false);
  row = std::find_if(plain.fs->begin(), plain.fs->end(), [](const isolate::FsEntry& e) { return e.path == "/node_modules"; });
  ASSERT_NE(row, plain.fs->end());
  EXPECT_EQ(row->source, "/var/cache/toolsandbox/venvs/.none");  // not a key: never in the cache
  // A venv key alone does not move the node_modules row, nor the other way round.
  auto venv_only = spawn::run_spec_from(*sp, spawn::RunMode::Tool, std::string(64, 'c'), false);
  row = std::find_if(venv_only.fs->begin(), venv_only.fs->end(), [](const isolate::FsEntry& e) { return e.path == "/node_modules"; });
  EXPECT_EQ(row->source, "/var/cache/toolsandbox/venvs/.none");
}

TEST(PolicyPackages, TheVenvRowIsKeyedAndTheBuildPolicyIsItsOwn) {
  TempDir t;
  auto p = load_text(t, R"({"version": 1, "packages": {"allow": ["*"], "wheels": "/srv/wheels",
      "build": {"wall_timeout": "30s", "memory": "1GiB", "venv_size": "128MiB"}}})");
  ASSERT_TRUE(p.ok()) << p.error().message;
  p->name = "pkgs";
  auto sp = to_spawn_policy(*p, "/usr/share/toolsandbox/runner/toolsandbox_runner.py", "/var/cache/toolsandbox/venvs");
  ASSERT_TRUE(sp.ok()) << sp.error().message;
  for (const auto& m : sp->modes) {
    auto row = std::find_if(m.fs->begin(), m.fs->end(), [](const isolate::FsEntry& e) { return e.path == "/venv"; });
    ASSERT_NE(row, m.fs->end());
    EXPECT_TRUE(row->keyed);
    EXPECT_EQ(row->data, "/var/cache/toolsandbox/venvs");
    EXPECT_EQ(row->kind, isolate::FsEntry::kHost);
  }
  // A run naming a key gets <cache>/<key> there; one naming none, the policy's venv.
  const std::string key(64, 'a');
  auto spec = spawn::run_spec_from(*sp, spawn::RunMode::Tool, key);
  auto row = std::find_if(spec.fs->begin(), spec.fs->end(), [](const isolate::FsEntry& e) { return e.path == "/venv"; });
  ASSERT_NE(row, spec.fs->end());
  EXPECT_EQ(row->source, "/var/cache/toolsandbox/venvs/" + key);
  auto plain = spawn::run_spec_from(*sp, spawn::RunMode::Tool);
  row = std::find_if(plain.fs->begin(), plain.fs->end(), [](const isolate::FsEntry& e) { return e.path == "/venv"; });
  EXPECT_NE(row->source.find("/var/lib/toolsandbox/venv"), std::string::npos) << row->source;

  auto bp = to_build_spawn_policy(*p, "/usr/share/toolsandbox/runner/toolsandbox_venv_builder.py");
  ASSERT_TRUE(bp.ok()) << bp.error().message;
  EXPECT_EQ(bp->name, "pkgs/build");
  EXPECT_EQ(bp->fingerprint, p->fingerprint);
  EXPECT_EQ(bp->network, isolate::NetworkMode::None);
  EXPECT_EQ(bp->limits.wall_timeout, std::chrono::milliseconds(30'000));
  EXPECT_EQ(bp->limits.memory_bytes, 1ull << 30);
  EXPECT_TRUE(bp->env_allow.empty());
  const auto& tool = bp->modes[static_cast<int>(spawn::RunMode::Tool)];
  EXPECT_EQ(tool.argv, (std::vector<std::string>{"/usr/bin/python3", "-I", "-B", "-u", std::string(kBuilderSandboxPath)}));
  std::map<std::string, const isolate::FsEntry*> rows;
  for (const auto& e : *tool.fs) rows[e.path] = &e;
  ASSERT_TRUE(rows.contains("/venv"));
  EXPECT_EQ(rows["/venv"]->kind, isolate::FsEntry::kTmpfs);
  EXPECT_TRUE(rows["/venv"]->tool_owned);
  EXPECT_EQ(rows["/venv"]->size, 128ull << 20);
  ASSERT_TRUE(rows.contains("/wheels"));
  EXPECT_EQ(rows["/wheels"]->kind, isolate::FsEntry::kHost);  // read-only
  ASSERT_TRUE(rows.contains(std::string(kBuilderSandboxPath)));
  EXPECT_FALSE(rows.contains(std::string(isolate::kRunnerSandboxPath)));

  auto ip = load_text(t, R"({"version": 1, "packages": {"allow": ["*"], "index": "https://pypi.test/simple"}})");
  ASSERT_TRUE(ip.ok()) << ip.error().message;
  auto ib = to_build_spawn_policy(*ip, "/b.py");
  ASSERT_TRUE(ib.ok()) << ib.error().message;
  EXPECT_EQ(ib->network, isolate::NetworkMode::Egress);
  EXPECT_EQ(ib->env_set.at("HTTPS_PROXY"), "http://127.0.0.1:" + std::to_string(isolate::kEgressProxyPort));
  // Nothing bypasses the proxy: its refusals reach pip with their reason.
  EXPECT_FALSE(ib->env_set.contains("NO_PROXY"));
  EXPECT_FALSE(ib->env_set.contains("no_proxy"));
  // A policy without "packages" has neither.
  auto none = load_text(t, R"({"version": 1})");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(to_build_spawn_policy(*none, "/b.py").ok());
  auto nsp = to_spawn_policy(*none, "", "/var/cache/toolsandbox/venvs");
  ASSERT_TRUE(nsp.ok());
  for (const auto& e : *nsp->modes[0].fs) EXPECT_FALSE(e.keyed) << e.path;
}

}  // namespace
}  // namespace tsb::core

namespace tsb::core {
namespace {

// The policy language and the root spawner each check a variable's name
// (a policy's environment.set here; every run's environment there,
// spawn::valid_env_name): the two rules must agree, or a policy would load
// whose runs the spawner refuses.
// "typescript": its runs are a spawn policy of their own, under node with
// the TypeScript runner, the policy's file system otherwise, never warm.
TEST(PolicyTypeScript, TheRuntimeIsBelowUsrAndItsRunsAreTheirOwnPolicy) {
  TempDir t;
  auto p = load_text(t, R"({"version": 1, "typescript": {"strip_types": "typescript"},
      "warm_pool": {"max": 2, "min": 1}})");
  ASSERT_TRUE(p.ok()) << p.error().message;
  p->name = "ts";
  EXPECT_TRUE(p->typescript.enabled);
  EXPECT_EQ(p->typescript.node, "/usr/bin/node");
  EXPECT_EQ(p->typescript.stripper(), "/usr/share/nodejs/typescript");
  EXPECT_EQ(p->canonical["typescript"]["strip_types"], "typescript");
  const std::string runner = "/usr/share/toolsandbox/runner/toolsandbox_ts_runner.js";
  auto tp = to_typescript_spawn_policy(*p, runner);
  ASSERT_TRUE(tp.ok()) << tp.error().message;
  EXPECT_EQ(tp->name, "ts/typescript");
  EXPECT_EQ(tp->fingerprint, p->fingerprint);
  EXPECT_EQ(tp->warm_max, 0u);
  for (const auto& m : tp->modes) {
    EXPECT_EQ(m.argv, (std::vector<std::string>{"/usr/bin/node", std::string(kTsRunnerSandboxPath), "typescript",
                                                "/usr/share/nodejs/typescript"}));
    EXPECT_TRUE(m.pooled_argv.empty());
    std::map<std::string, const isolate::FsEntry*> rows;
    for (const auto& e : *m.fs) rows[e.path] = &e;
    ASSERT_TRUE(rows.contains(std::string(kTsRunnerSandboxPath)));
    EXPECT_EQ(rows[std::string(kTsRunnerSandboxPath)]->source, runner);
    EXPECT_EQ(rows[std::string(kTsRunnerSandboxPath)]->kind, isolate::FsEntry::kHost);  // read-only
    ASSERT_TRUE(rows.contains("/usr"));  // node, esbuild and acorn come from here, read-only
    EXPECT_FALSE(rows.contains(std::string(isolate::kRunnerSandboxPath)));
  }
  // Not below /usr, a stripper it does not know, on E2B: refused.
  for (const char* bad : {R"({"version": 1, "typescript": {"node": "/opt/node/bin/node"}})",
                          R"({"version": 1, "typescript": {"node": "/usr/../opt/node"}})",
                          R"({"version": 1, "typescript": {"esbuild": "/usr"}})",
                          R"({"version": 1, "typescript": {"strip_types": "babel"}})",
                          R"({"version": 1, "typescript": {"modules": "/node_modules"}})",
                          R"({"version": 1, "backend": "e2b", "typescript": {}})"})
    EXPECT_FALSE(load_text(t, bad).ok()) << bad;
  auto none = load_text(t, R"({"version": 1, "typescript": null})");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->typescript.enabled);
  EXPECT_FALSE(to_typescript_spawn_policy(*none, runner).ok());
}

TEST(PolicyEnvironment, NamesFollowTheSpawnersRule) {
  TempDir t;
  for (const std::string& name : std::vector<std::string>{"A", "_", "a_1", "_9", "PATH", "lower", "9A", "A-B", "A B", "A.B", "", "\xc3\xa9",
                                                          "A=B", std::string(256, 'A'), std::string(257, 'A')}) {
    SCOPED_TRACE(name);
    const nlohmann::json doc = {{"version", 1}, {"environment", {{"set", {{name, "v"}}}}}};
    auto p = load_policy(t.write("e.json", doc.dump()), no_binds());
    EXPECT_EQ(p.ok(), spawn::valid_env_name(name)) << (p.ok() ? "" : p.error().message);
  }
}

}  // namespace
}  // namespace tsb::core

namespace tsb::core {
namespace {

// "sessions": the programs a session may start (below /usr or /venv), its
// limits, in the fingerprint; its session policy runs the launcher with
// that list and nothing else, under the section's limits.
TEST(PolicySessions, CommandsLimitsAndTheSessionPolicy) {
  TempDir t;
  auto none = load_text(t, R"({"version": 1})");
  auto p = load_text(t, R"({"version": 1, "sessions": {"commands": ["/usr/bin/node", "/venv/bin/python3"],
      "memory": "256MiB", "pids": 32, "cpu_time": "2m", "idle_timeout": "30s", "max_lifetime": "10m",
      "stream_bytes": "8MiB"}})");
  ASSERT_TRUE(p.ok() && none.ok()) << (p.ok() ? none.error().message : p.error().message);
  p->name = "s";
  EXPECT_FALSE(none->sessions.enabled);
  EXPECT_FALSE(none->canonical.contains("sessions")) << "no sessions: the fingerprints of policies without them stay";
  EXPECT_NE(p->fingerprint, none->fingerprint);
  const SessionsPolicy& k = p->sessions;
  EXPECT_EQ(k.memory, 256ull << 20);
  EXPECT_EQ(k.pids, 32u);
  EXPECT_EQ(k.idle_timeout.count(), 30'000);
  EXPECT_EQ(p->canonical["sessions"]["max_lifetime"], "10m");
  EXPECT_EQ(resolve_session_command(k, "node"), "/usr/bin/node");
  EXPECT_EQ(resolve_session_command(k, "python3"), "/venv/bin/python3");
  EXPECT_EQ(resolve_session_command(k, "/usr/bin/node"), "/usr/bin/node");
  for (const char* no : {"", "sh", "/usr/bin/python3", "bin/node", "/usr/bin/../bin/node", "node "})
    EXPECT_EQ(resolve_session_command(k, no), "") << no;
  auto sp = to_session_spawn_policy(*p);
  ASSERT_TRUE(sp.ok()) << sp.error().message;
  EXPECT_EQ(sp->name, "s/session");
  EXPECT_EQ(sp->fingerprint, p->fingerprint);
  EXPECT_EQ(sp->warm_max, 0u);
  EXPECT_EQ(sp->limits.memory_bytes, 256ull << 20);
  EXPECT_EQ(sp->limits.pids, 32u);
  EXPECT_EQ(sp->limits.cpu_time.count(), 120'000);
  EXPECT_EQ(sp->limits.wall_timeout.count(), 600'000);
  // One mode: the keeper, given the allowed programs.
  const auto& keeper = sp->modes[static_cast<int>(spawn::RunMode::Tool)];
  ASSERT_EQ(keeper.argv.size(), 8u);
  EXPECT_EQ(keeper.argv[0], "/usr/bin/python3");
  EXPECT_NE(keeper.argv[5].find("kill(-1, signal.SIGKILL)"), std::string::npos) << "the keeper's program";
  EXPECT_EQ(std::vector<std::string>(keeper.argv.end() - 2, keeper.argv.end()), k.commands);
  EXPECT_FALSE(keeper.end_note);
  EXPECT_EQ(sp->modes[static_cast<int>(spawn::RunMode::Script)].argv, keeper.argv) << "never asked for: the keeper";
  EXPECT_FALSE(to_session_spawn_policy(*p, "", /*workspace=*/true).ok()) << "no workspace: no workspace policy";
  for (const char* bad : {R"({"version": 1, "sessions": {}})", R"({"version": 1, "sessions": {"commands": []}})",
                          R"({"version": 1, "sessions": {"commands": ["/opt/node"]}})",
                          R"({"version": 1, "sessions": {"commands": ["/usr/bin/../../bin/sh"]}})",
                          R"({"version": 1, "sessions": {"commands": ["node"]}})",
                          R"({"version": 1, "sessions": {"commands": ["/usr/bin/node", "/usr/bin/node"]}})",
                          R"({"version": 1, "sessions": {"commands": ["/usr/bin/node"], "memory": "1MiB"}})",
                          R"({"version": 1, "sessions": {"commands": ["/usr/bin/node"], "idle_timeout": "2h", "max_lifetime": "1h"}})",
                          R"({"version": 1, "sessions": {"commands": ["/usr/bin/node"], "workspace": "1GiB"}})",
                          R"({"version": 1, "backend": "e2b", "sessions": {"commands": ["/usr/bin/node"]}})"})
    EXPECT_FALSE(load_text(t, bad).ok()) << bad;
  EXPECT_TRUE(load_text(t, R"({"version": 1, "sessions": null})").ok());
}

// "sessions"."workspace": its size and idle TTL, in the fingerprint; the
// workspace policy is the keeper, with that list of programs and a /work of
// that size, and only with a workspace.
TEST(PolicySessions, WorkspaceKeeperAndItsWork) {
  TempDir t;
  auto none = load_text(t, R"({"version": 1, "sessions": {"commands": ["/usr/bin/node"]}})");
  auto p = load_text(t, R"({"version": 1, "sessions": {"commands": ["/usr/bin/node"], "max_lifetime": "10m",
      "workspace": {"size": "32MiB", "idle_ttl": "1h"}}})");
  auto dflt = load_text(t, R"({"version": 1, "sessions": {"commands": ["/usr/bin/node"], "workspace": {}}})");
  ASSERT_TRUE(p.ok() && none.ok() && dflt.ok()) << (p.ok() ? none.error().message : p.error().message);
  EXPECT_FALSE(none->sessions.workspace);
  EXPECT_TRUE(none->canonical["sessions"]["workspace"].is_null());
  EXPECT_TRUE(p->sessions.workspace);
  EXPECT_EQ(p->sessions.workspace_size, 32ull << 20);
  EXPECT_EQ(p->sessions.workspace_idle_ttl.count(), 3'600'000) << "longer than max_lifetime: allowed, never reached";
  EXPECT_EQ(p->canonical["sessions"]["workspace"], (nlohmann::json{{"size", "32MiB"}, {"idle_ttl", "1h"}}));
  EXPECT_EQ(dflt->sessions.workspace_size, 256ull << 20);
  EXPECT_EQ(dflt->sessions.workspace_idle_ttl.count(), 1'800'000);
  EXPECT_NE(p->fingerprint, none->fingerprint);
  EXPECT_NE(p->fingerprint, dflt->fingerprint);
  auto sp = to_session_spawn_policy(*p, "", /*workspace=*/true);
  auto own = to_session_spawn_policy(*p);
  ASSERT_TRUE(sp.ok() && own.ok());
  EXPECT_EQ(sp->name, workspace_policy_name(p->name));
  EXPECT_EQ(own->name, session_policy_name(p->name));
  const auto& keeper = sp->modes[static_cast<int>(spawn::RunMode::Tool)];
  ASSERT_EQ(keeper.argv.size(), 7u);
  EXPECT_EQ(std::vector<std::string>(keeper.argv.begin(), keeper.argv.begin() + 5),
            (std::vector<std::string>{"/usr/bin/python3", "-I", "-S", "-B", "-c"}));
  EXPECT_NE(keeper.argv[5].find("kill(-1, signal.SIGKILL)"), std::string::npos) << "the keeper's program";
  EXPECT_EQ(keeper.argv[5].find("toolsandbox_workspace.py: the keeper"), std::string::npos) << "without its comment";
  EXPECT_EQ(keeper.argv[6], "/usr/bin/node");
  auto work = [](const isolate::FsTable& fs) {
    for (const auto& e : fs)
      if (e.path == "/work") return e.size;
    return std::uint64_t{0};
  };
  EXPECT_EQ(work(*keeper.fs), 32ull << 20);
  EXPECT_NE(work(*own->modes[static_cast<int>(spawn::RunMode::Tool)].fs), 32ull << 20) << "a session's own /work";
  EXPECT_EQ(own->modes[static_cast<int>(spawn::RunMode::Tool)].argv, keeper.argv) << "the same keeper";
  for (const char* bad : {R"({"version": 1, "sessions": {"commands": ["/usr/bin/node"], "workspace": {"size": "512KiB"}}})",
                          R"({"version": 1, "sessions": {"commands": ["/usr/bin/node"], "workspace": {"size": "32GiB"}}})",
                          R"({"version": 1, "sessions": {"commands": ["/usr/bin/node"], "workspace": {"idle_ttl": "0s"}}})",
                          R"({"version": 1, "sessions": {"commands": ["/usr/bin/node"], "workspace": {"ttl": "1m"}}})",
                          R"({"version": 1, "sessions": {"commands": ["/usr/bin/node"], "workspace": true}})"})
    EXPECT_FALSE(load_text(t, bad).ok()) << bad;
  auto unknown = load_text(t, R"({"version": 1, "sessions": {"commands": ["/usr/bin/node"], "workspace": {"ttl": "1m"}}})");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.error().message.find("ttl"), std::string::npos) << unknown.error().message;
}

}  // namespace
}  // namespace tsb::core
