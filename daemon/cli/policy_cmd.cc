// toolsandbox policy: check, explain, fingerprint, lint.
#include <cstdio>

#include "daemon/cli/cli.h"
#include "daemon/core/policy.h"

namespace tsb::cli {

Result<core::Policy> resolve_policy(const std::string& ref, const core::PolicyContext& ctx);

int cmd_policy(const std::vector<std::string>& args) {
  if (args.empty()) {
    std::fprintf(stderr, "toolsandbox policy: need a subcommand: check, explain, fingerprint, lint\n");
    return kExitUsage;
  }
  const std::string& sub = args[0];
  if (sub == "check" || sub == "fingerprint") {
    if (args.size() < 2) {
      std::fprintf(stderr, "toolsandbox policy %s: need at least one FILE\n", sub.c_str());
      return kExitUsage;
    }
    int rc = 0;
    core::PolicyContext ctx;
    for (std::size_t i = 1; i < args.size(); ++i) {
      auto p = resolve_policy(args[i], ctx);
      if (!p.ok()) {
        std::fprintf(stderr, "%s\n", p.error().message.c_str());
        rc = 1;
        continue;
      }
      if (sub == "fingerprint") std::printf("%s  %s\n", p->fingerprint.c_str(), args[i].c_str());
      else
        std::printf("%s: ok: policy '%s', backend %s, network %s, %zu syscall rules, %s\n", args[i].c_str(),
                    p->name.c_str(), core::to_string(p->backend),
                    p->network == isolate::NetworkMode::Host ? "host" : "none",
                    p->seccomp_profile ? p->seccomp_profile->rules.size() : 0, p->fingerprint.c_str());
    }
    return rc;
  }
  std::fprintf(stderr, "toolsandbox policy: unknown subcommand '%s'\n", sub.c_str());
  return kExitUsage;
}

}  // namespace tsb::cli
