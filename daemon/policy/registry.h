// The daemon's policy set: every policy, compiled, plus the organizations
// table. Immutable once built; a reload builds a new set and swaps it in
// whole, so a broken file never leaves a half-loaded set in force.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "daemon/policy/config.h"
#include "daemon/policy/policy.h"

namespace tsb::core {

struct OrgEntry {
  bool privileged = false;
  std::string policy = "default";
  std::vector<std::string> allowed_policies{"default"};
};

struct Organizations {
  std::string source;
  OrgEntry fallback;                      // "default": organizations not listed
  std::map<std::string, OrgEntry> orgs;
  const OrgEntry& lookup(const std::string& id) const;
};

Result<Organizations> load_organizations(const std::string& path, SourceFiles* files = nullptr);  // "" = embedded

struct PolicySet {
  std::map<std::string, std::shared_ptr<const Policy>> policies;
  Organizations orgs;
};

Result<std::shared_ptr<const PolicySet>> load_policy_set(const DaemonConfig& cfg, SourceFiles* files = nullptr);

// What an operator must hear about a set that loads but cannot work as
// written ("" when nothing): a warm pool in a daemon whose engine.uid_slots
// leaves no uid slot beyond max_concurrent_runs, so the pool stays empty
// (every warm sandbox holds a slot, and runs keep max_concurrent_runs).
std::string policy_set_warning(const DaemonConfig& cfg, const PolicySet& set);

// Where and how one run goes (the legacy Letta rule, ToolExecutionSandbox in
// letta-ai/letta's letta/services/tool_executor/tool_execution_sandbox.py):
// a privileged organization runs locally; one that is not goes to E2B when
// E2B is configured, else runs locally under its (strict) policy. A policy
// whose backend is "e2b" always goes to E2B.
struct Placement {
  std::shared_ptr<const Policy> policy;
  Backend backend = Backend::Local;
  bool privileged = false;
};
// Errors carry EPERM for a policy the organization may not use.
Result<Placement> place_run(const PolicySet& set, const std::string& organization_id,
                            const std::optional<std::string>& requested_policy, bool e2b_configured);

}  // namespace tsb::core
