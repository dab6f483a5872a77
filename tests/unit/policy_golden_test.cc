// Golden tests of the policy tooling, driven by the files in tests/policies/:
//
//   bad/NAME.json + bad/NAME.expected   a policy the loader must refuse, and
//                                       the exact message it must give;
//   lint/NAME.json + lint/NAME.expected what `toolsandbox policy lint NAME.json`
//                                       prints (notes left out, as without
//                                       --notes), then "exit N";
//   golden/explain-*.txt                `policy explain` of the shipped
//                                       policies, without "[host]" lines;
//   golden/compare-default-moby.txt     `policy explain default --compare`
//                                       against Moby's default profile, the
//                                       copy in reference/ (see its README);
//   check/NAME.cmd + check/NAME.expected  a `toolsandbox policy` command line
//                                       (the verb and its operands, "*.json"
//                                       expanded as a shell would) run by the
//                                       built binary in a copy of check/, or
//                                       of policies/ when it starts with
//                                       "@shipped"; its exit status, stdout
//                                       and stderr.
//
// Each corpus is copied into a fresh directory owned by root with modes 0644
// and 0755 (whatever the checkout's owner and umask), and the loader runs
// there with that directory as its working directory, so every path in a
// message is relative and the expectations hold in any checkout. A file whose
// name contains ".group-writable." is given mode 0664 after the copy.
//
// Regenerate the expectations after an intended change with
//   TSB_UPDATE_GOLDEN=1 build/bin/unit_tests --gtest_filter='*PolicyGolden*'
// and review the diff like code: every line of it is behaviour.
#include <fcntl.h>
#include <fnmatch.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "daemon/policy/policy.h"
#include "daemon/policy/policy_explain.h"
#include "daemon/policy/policy_lint.h"
#include "daemon/policy/registry.h"
#include "daemon/policy/seccomp_profile.h"

namespace tsb::core {
namespace {

namespace fs = std::filesystem;

const std::string kCorpus = TSB_SOURCE_DIR "/tests/policies";
const std::string kShipped = TSB_SOURCE_DIR "/policies";
const std::string kMobyProfile = TSB_SOURCE_DIR "/tests/policies/reference/moby-default-seccomp.json";

// The allow-lists the corpora are written for.
const std::vector<std::string> kBadAllowlist = {"/srv/tools"};
const std::vector<std::string> kLintAllowlist = {"/"};

bool updating() {
  const char* v = std::getenv("TSB_UPDATE_GOLDEN");
  return v != nullptr && std::string(v) == "1";
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  ASSERT_TRUE(out.good()) << "cannot write " << path;
}

// Compares `actual` with the golden file, or rewrites it under
// TSB_UPDATE_GOLDEN=1.
void expect_golden(const std::string& golden_path, const std::string& actual) {
  if (updating()) {
    write_file(golden_path, actual);
    std::printf("updated %s\n", golden_path.c_str());
    return;
  }
  const std::string expected = read_file(golden_path);
  ASSERT_FALSE(expected.empty()) << golden_path << " is missing; run with TSB_UPDATE_GOLDEN=1 to create it";
  EXPECT_EQ(actual, expected) << "differs from " << golden_path
                              << " (if the change is intended: TSB_UPDATE_GOLDEN=1, then review the diff)";
}

// A private copy of a corpus directory, normalised to root:root 0644/0755.
class CorpusCopy {
 public:
  explicit CorpusCopy(const std::string& source) {
    char tmpl[] = "/tmp/tsb-policy-golden-XXXXXX";
    const char* dir = ::mkdtemp(tmpl);
    if (dir == nullptr) return;
    dir_ = dir;
    fs::copy(source, dir_, fs::copy_options::recursive);
    for (const auto& e : fs::recursive_directory_iterator(dir_)) {
      const bool is_dir = e.is_directory();
      ::chmod(e.path().c_str(), is_dir ? 0755 : 0644);
      if (!is_dir && e.path().filename().string().find(".group-writable.") != std::string::npos)
        ::chmod(e.path().c_str(), 0664);
    }
    ::chmod(dir_.c_str(), 0755);
  }
  ~CorpusCopy() {
    if (!dir_.empty()) {
      std::error_code ec;
      fs::remove_all(dir_, ec);
    }
  }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
};

// Runs the loader with `dir` as the working directory, restoring the old
// one afterwards.
class InDirectory {
 public:
  explicit InDirectory(const std::string& dir) : old_(::open(".", O_RDONLY | O_DIRECTORY | O_CLOEXEC)) {
    ok_ = old_ >= 0 && ::chdir(dir.c_str()) == 0;
  }
  ~InDirectory() {
    if (old_ >= 0) {
      (void)!::fchdir(old_);
      ::close(old_);
    }
  }
  bool ok() const { return ok_; }

 private:
  int old_;
  bool ok_ = false;
};

// The NAME of every NAME.json directly in `dir`, sorted.
std::vector<std::string> cases_in(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.is_regular_file() && e.path().extension() == ".json") names.push_back(e.path().stem().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::string test_name(const testing::TestParamInfo<std::string>& info) {
  std::string s = info.param;
  for (char& c : s)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return s;
}

std::string chomp(std::string s) {
  while (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

// ---------------------------------------------------------------------------
// Bad policies: refused, with exactly the expected message.

TEST(PolicyGoldenCorpus, EveryBadPolicyHasItsExpectedMessage) {
  const auto names = cases_in(kCorpus + "/bad");
  EXPECT_GE(names.size(), 15u);
  for (const auto& n : names) EXPECT_TRUE(fs::exists(kCorpus + "/bad/" + n + ".expected")) << n;
  for (const auto& e : fs::directory_iterator(kCorpus + "/bad")) {
    if (e.path().extension() == ".expected") {
      EXPECT_TRUE(fs::exists(kCorpus + "/bad/" + e.path().stem().string() + ".json")) << e.path();
    }
  }
}

class PolicyGoldenBad : public testing::TestWithParam<std::string> {};

TEST_P(PolicyGoldenBad, RefusedWithTheExpectedMessage) {
  const std::string& name = GetParam();
  const std::string file = name + ".json";
  if (name.find("group-writable") != std::string::npos && ::geteuid() != 0) {
    GTEST_SKIP() << "\n\n    *** SKIPPED: " << file << " tests the owner and mode check, which applies only when the\n"
                 << "    *** loader runs as root; run the unit tests as root to cover it.\n";
  }
  CorpusCopy copy(kCorpus + "/bad");
  ASSERT_FALSE(copy.dir().empty());
  InDirectory cwd(copy.dir());
  ASSERT_TRUE(cwd.ok());
  PolicyContext ctx;
  ctx.bind_allowlist = kBadAllowlist;
  auto r = load_policy(file, ctx);
  ASSERT_FALSE(r.ok()) << file << " loaded, but it must be refused";
  EXPECT_NE(r.error().code, 0) << r.error().message;
  if (updating()) {
    write_file(kCorpus + "/bad/" + name + ".expected", r.error().message + "\n");
    return;
  }
  EXPECT_EQ(r.error().message, chomp(read_file(kCorpus + "/bad/" + name + ".expected")));
}

INSTANTIATE_TEST_SUITE_P(Corpus, PolicyGoldenBad, testing::ValuesIn(cases_in(kCorpus + "/bad")), test_name);

// ---------------------------------------------------------------------------
// Lint: warnings one per line with positions, then the exit status.

class PolicyGoldenLint : public testing::TestWithParam<std::string> {};

TEST_P(PolicyGoldenLint, PrintsTheExpectedFindings) {
  const std::string& name = GetParam();
  CorpusCopy copy(kCorpus + "/lint");
  ASSERT_FALSE(copy.dir().empty());
  InDirectory cwd(copy.dir());
  ASSERT_TRUE(cwd.ok());
  PolicyContext ctx;
  ctx.bind_allowlist = kLintAllowlist;
  const LintReport report = lint_policy_file(name + ".json", ctx);
  std::string out;
  for (const auto& f : report.findings)
    if (f.severity != LintSeverity::Note) out += f.format() + "\n";
  out += "exit " + std::to_string(report.exit_status()) + "\n";
  expect_golden(kCorpus + "/lint/" + name + ".expected", out);
}

INSTANTIATE_TEST_SUITE_P(Corpus, PolicyGoldenLint, testing::ValuesIn(cases_in(kCorpus + "/lint")), test_name);

// ---------------------------------------------------------------------------
// The shipped policies.

std::vector<std::string> shipped_policy_names() {
  std::vector<std::string> names;
  for (const auto& n : cases_in(kShipped))
    if (n != "organizations") names.push_back(n);
  return names;
}

TEST(PolicyGoldenShipped, EveryShippedPolicyPassesCheck) {
  CorpusCopy copy(kShipped);
  ASSERT_FALSE(copy.dir().empty());
  InDirectory cwd(copy.dir());
  ASSERT_TRUE(cwd.ok());
  const auto names = shipped_policy_names();
  ASSERT_FALSE(names.empty());
  for (const auto& n : names) {
    PolicyContext ctx;  // compiles seccomp, as the daemon does
    auto from_file = load_policy(n + ".json", ctx);
    ASSERT_TRUE(from_file.ok()) << n << ": " << from_file.error().message;
    ASSERT_NE(from_file->seccomp, nullptr);
    EXPECT_EQ(check_summary(n + ".json", *from_file).rfind(n + ".json: ok: policy '" + n + "'", 0), 0u);
    // The copy embedded in the binaries is the same policy (a stale build
    // would embed an old one).
    auto embedded = load_named_policy(n, "", ctx);
    ASSERT_TRUE(embedded.ok()) << n << ": " << embedded.error().message;
    EXPECT_EQ(embedded->fingerprint, from_file->fingerprint) << n;
  }
  auto orgs = load_organizations("organizations.json");
  ASSERT_TRUE(orgs.ok()) << orgs.error().message;
  DaemonConfig cfg;
  cfg.policies_dir = copy.dir();
  cfg.organizations_file = copy.dir() + "/organizations.json";
  auto set = load_policy_set(cfg);
  ASSERT_TRUE(set.ok()) << set.error().message;
  for (const auto& n : names) EXPECT_TRUE((*set)->policies.count(n)) << n;
}

// Lines of an explain page without the "[host]" ones.
std::string without_host_lines(const std::string& page) {
  std::istringstream in(page);
  std::string out, line;
  while (std::getline(in, line)) {
    const auto first = line.find_first_not_of(' ');
    if (first != std::string::npos && line.compare(first, 6, "[host]") == 0) continue;
    out += line + "\n";
  }
  return out;
}

class PolicyGoldenExplain : public testing::TestWithParam<std::string> {};

TEST_P(PolicyGoldenExplain, MatchesTheSnapshot) {
  if (policy::seccomp_native_arch() != "SCMP_ARCH_X86_64") GTEST_SKIP() << "the snapshots are for x86_64";
  PolicyContext ctx;
  auto p = load_named_policy(GetParam(), "", ctx);
  ASSERT_TRUE(p.ok()) << p.error().message;
  ExplainOptions portable;
  portable.host_facts = false;
  const std::string page = explain_policy(*p, portable);
  expect_golden(kCorpus + "/golden/explain-" + GetParam() + ".txt", page);
  // What this machine adds is on "[host]" lines only.
  EXPECT_EQ(without_host_lines(explain_policy(*p, ExplainOptions{})), page);
}

INSTANTIATE_TEST_SUITE_P(Shipped, PolicyGoldenExplain, testing::Values("default", "privileged", "e2b"), test_name);

// ---------------------------------------------------------------------------
// Moby's default profile: loads with unknown names skipped in allow rules,
// compiles, and compares with ours.

TEST(PolicyGoldenMoby, LoadsCompilesAndCompares) {
  const std::string text = read_file(kMobyProfile);
  ASSERT_FALSE(text.empty()) << "cannot read the Moby reference profile " << kMobyProfile
                             << " (it is part of the repository: tests/policies/reference/)";
  if (policy::seccomp_native_arch() != "SCMP_ARCH_X86_64") GTEST_SKIP() << "the snapshot is for x86_64";
  policy::SeccompParseOptions lenient;
  lenient.unresolvable_syscalls = policy::SeccompParseOptions::UnresolvableSyscalls::SkipInAllowRules;
  lenient.kernel_release = "6.1.0";  // Moby's minKernel entries, fixed for the snapshot
  auto moby = policy::parse_seccomp_profile(text, "moby-default-seccomp.json", lenient);
  ASSERT_TRUE(moby.ok()) << moby.error().message;
  EXPECT_FALSE(moby->skipped_syscalls.empty());
  auto prog = policy::compile_seccomp(*moby);
  ASSERT_TRUE(prog.ok()) << prog.error().message;

  PolicyContext ctx;
  auto p = load_named_policy("default", "", ctx);
  ASSERT_TRUE(p.ok()) << p.error().message;
  const std::string page = compare_profiles(*p, *moby, "moby-default-seccomp.json");
  expect_golden(kCorpus + "/golden/compare-default-moby.txt", page);
  // Every name Moby's profile lost is on the page.
  for (const auto& s : moby->skipped_syscalls) EXPECT_NE(page.find(s), std::string::npos) << s;
}

// ---------------------------------------------------------------------------
// The command line: `toolsandbox policy ...` as users run it, organizations
// files among the operands included.

std::vector<std::string> cases_with(const std::string& dir, const std::string& ext) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.is_regular_file() && e.path().extension() == ext) names.push_back(e.path().stem().string());
  std::sort(names.begin(), names.end());
  return names;
}

std::vector<std::string> words(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

// A word with '*' becomes the matching names in `dir`, sorted bytewise, as
// bash expands it under LC_ALL=C.
std::vector<std::string> expand_globs(const std::vector<std::string>& args, const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& a : args) {
    if (a.find('*') == std::string::npos) {
      out.push_back(a);
      continue;
    }
    std::vector<std::string> matches;
    for (const auto& e : fs::directory_iterator(dir)) {
      const std::string n = e.path().filename().string();
      if (e.is_regular_file() && ::fnmatch(a.c_str(), n.c_str(), FNM_PERIOD) == 0) matches.push_back(n);
    }
    std::sort(matches.begin(), matches.end());
    out.insert(out.end(), matches.begin(), matches.end());
  }
  return out;
}

// An empty private directory, removed afterwards.
class ScratchDir {
 public:
  ScratchDir() {
    char tmpl[] = "/tmp/tsb-policy-cmd-XXXXXX";
    if (const char* d = ::mkdtemp(tmpl)) dir_ = d;
  }
  ~ScratchDir() {
    std::error_code ec;
    if (!dir_.empty()) fs::remove_all(dir_, ec);
  }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
};

struct CommandOutput {
  int status = -1;
  std::string out, err;
};

// Runs `argv` in `cwd`, its output in files under `scratch`.
CommandOutput run_in(const std::string& cwd, const std::string& scratch, const std::vector<std::string>& argv) {
  const std::string out_path = scratch + "/stdout", err_path = scratch + "/stderr";
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int out = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    const int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (out < 0 || err < 0 || ::dup2(out, 1) < 0 || ::dup2(err, 2) < 0 || ::chdir(cwd.c_str()) != 0) ::_exit(126);
    std::vector<char*> av;
    for (const auto& a : argv) av.push_back(const_cast<char*>(a.c_str()));
    av.push_back(nullptr);
    ::execv(av[0], av.data());
    ::_exit(127);
  }
  CommandOutput r;
  int ws = 0;
  if (pid > 0 && ::waitpid(pid, &ws, 0) == pid) r.status = WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
  r.out = read_file(out_path);
  r.err = read_file(err_path);
  return r;
}

TEST(PolicyGoldenCheckCorpus, EveryCommandHasItsExpectation) {
  const auto names = cases_with(kCorpus + "/check", ".cmd");
  EXPECT_GE(names.size(), 10u);
  for (const auto& n : names) EXPECT_TRUE(fs::exists(kCorpus + "/check/" + n + ".expected")) << n;
  for (const auto& n : cases_with(kCorpus + "/check", ".expected"))
    EXPECT_TRUE(fs::exists(kCorpus + "/check/" + n + ".cmd")) << n;
}

class PolicyGoldenCommand : public testing::TestWithParam<std::string> {};

TEST_P(PolicyGoldenCommand, PrintsTheExpectedOutput) {
  const std::string& name = GetParam();
  std::vector<std::string> args = words(read_file(kCorpus + "/check/" + name + ".cmd"));
  ASSERT_FALSE(args.empty()) << name << ".cmd is empty";
  std::string source = kCorpus + "/check";
  if (args[0] == "@shipped") {
    source = kShipped;
    args.erase(args.begin());
  }
  CorpusCopy copy(source);
  ScratchDir scratch;
  ASSERT_FALSE(copy.dir().empty());
  ASSERT_FALSE(scratch.dir().empty());
  args = expand_globs(args, copy.dir());
  // No daemon configuration of this machine: an empty one, outside the
  // directory the command looks at.
  const std::string config = scratch.dir() + "/toolsandboxd.json";
  write_file(config, "{\"version\": 1}\n");
  std::vector<std::string> argv = {TSB_BIN_DIR "/toolsandbox", "policy"};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.insert(argv.end(), {"--config", config});
  const CommandOutput r = run_in(copy.dir(), scratch.dir(), argv);
  std::string shown = "$ toolsandbox policy";
  for (const auto& a : args) shown += " " + a;
  expect_golden(kCorpus + "/check/" + name + ".expected",
                shown + "\nexit " + std::to_string(r.status) + "\n--- stdout\n" + r.out + "--- stderr\n" + r.err);
}

INSTANTIATE_TEST_SUITE_P(Corpus, PolicyGoldenCommand, testing::ValuesIn(cases_with(kCorpus + "/check", ".cmd")), test_name);

}  // namespace
}  // namespace tsb::core
