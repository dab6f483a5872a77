// The policy loader (daemon/policy/policy.h) and the organizations loader
// (daemon/policy/registry.h), fed one file each.
//
// Both loaders take a path, not a buffer (they check the opened file's owner
// and mode, and resolve includes and seccomp profiles next to it), so each
// input is written to fuzz.json in a private directory that also holds the
// shipped default.json, privileged.json and seccomp/default.json: an input
// may include them or name the profile, as real policies do. A policy that
// loads is then run through what `toolsandbox policy` does with it: the
// check summary, the explain page and the linter.
//
// Seccomp is parsed but not compiled (PolicyContext::compile = false): the
// compiler is libseccomp's, and at about 6 ms a filter it would cut the
// executions per second a hundredfold.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "daemon/policy/embedded.h"
#include "daemon/policy/policy.h"
#include "daemon/policy/policy_explain.h"
#include "daemon/policy/policy_lint.h"
#include "daemon/policy/registry.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

std::string g_dir;
std::string g_file;
int g_fd = -1;

void remove_dir() {
  if (g_fd >= 0) ::close(g_fd);
  std::error_code ec;
  if (!g_dir.empty()) std::filesystem::remove_all(g_dir, ec);
}

void write_file(const std::string& path, std::string_view text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0 || ::write(fd, text.data(), text.size()) != static_cast<ssize_t>(text.size()))
    tsb::fuzz::fail("cannot write a file of the policy directory", path);
  ::close(fd);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* tmp = std::getenv("TMPDIR");
  std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/tsb-fuzz-policy-XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) tsb::fuzz::fail("mkdtemp failed", tmpl);
  g_dir = tmpl;
  ::chmod(g_dir.c_str(), 0755);
  std::atexit(remove_dir);
  ::umask(022);
  ::mkdir((g_dir + "/seccomp").c_str(), 0755);
  for (const char* f : {"default.json", "privileged.json", "seccomp/default.json"}) {
    auto text = tsb::core::embedded_file(f);
    if (!text) tsb::fuzz::fail("the shipped policy is not embedded", f);
    write_file(g_dir + "/" + f, *text);
  }
  g_file = g_dir + "/fuzz.json";
  g_fd = ::open(g_file.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (g_fd < 0) tsb::fuzz::fail("cannot create", g_file);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (::ftruncate(g_fd, 0) != 0 || ::pwrite(g_fd, data, size, 0) != static_cast<ssize_t>(size))
    tsb::fuzz::fail("cannot rewrite", g_file);

  tsb::core::PolicyContext ctx;
  ctx.bind_allowlist = {"/srv/tools"};
  ctx.compile = false;
  auto policy = tsb::core::load_policy(g_file, ctx);
  if (policy.ok()) {
    TSB_FUZZ_CHECK(policy->fingerprint.size() == 71 && policy->fingerprint.rfind("sha256:", 0) == 0, policy->fingerprint);
    TSB_FUZZ_CHECK(policy->seccomp_profile != nullptr, "a policy without a seccomp profile");
    (void)tsb::core::check_summary("fuzz.json", *policy);
    tsb::core::ExplainOptions portable;
    portable.host_facts = false;
    TSB_FUZZ_CHECK(!tsb::core::explain_policy(*policy, portable).empty());
    const auto report = tsb::core::lint_policy_file(g_file, ctx);
    TSB_FUZZ_CHECK(report.exit_status() != 2, "lint cannot load a policy the loader loads");
  } else {
    TSB_FUZZ_CHECK(!policy.error().message.empty(), "a refusal without a message");
  }

  auto orgs = tsb::core::load_organizations(g_file);
  if (!orgs.ok()) TSB_FUZZ_CHECK(!orgs.error().message.empty(), "a refusal without a message");
  return 0;
}
