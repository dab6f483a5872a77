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
  // The policy of a run that goes to E2B because the organization is
  // delegated there (not privileged, E2B configured) and that names no
  // policy; "" = `policy`. Not added to allowed_policies: a request names
  // it only when allowed_policies has it.
  std::string e2b_policy;
  const std::string& delegated_policy() const { return e2b_policy.empty() ? policy : e2b_policy; }
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

// With E2B configured (cfg.e2b.enabled), every policy a delegated entry may
// run under (check_delegated_policies) must be loaded and one E2B can run
// as written, or the set is refused.
Result<std::shared_ptr<const PolicySet>> load_policy_set(const DaemonConfig& cfg, SourceFiles* files = nullptr);

// The policies the runs of an entry that is delegated to E2B (not
// privileged) may go there under: its allowed_policies and its
// delegated_policy(). None for a privileged entry.
std::vector<std::string> delegated_policies(const OrgEntry& e);

// Each of them, for every entry (the default one and each organization),
// is among `policies` and E2B can run its network as written
// (daemon/policy/e2b_network.h); else why not, naming the entry, the
// policy and the rule.
Status check_delegated_policies(const Organizations& orgs,
                                const std::map<std::string, std::shared_ptr<const Policy>>& policies);

// What an operator must hear about a set that loads but cannot work as
// written ("" when nothing): a warm pool in a daemon whose engine.uid_slots
// leaves no uid slot beyond max_concurrent_runs, so the pool stays empty
// (every warm sandbox holds a slot, and runs keep max_concurrent_runs).
std::string policy_set_warning(const DaemonConfig& cfg, const PolicySet& set);

// Where and how one run goes (the legacy Letta rule, ToolExecutionSandbox in
// letta-ai/letta's letta/services/tool_executor/tool_execution_sandbox.py):
// a privileged organization runs locally; one that is not goes to E2B when
// E2B is configured, else runs locally under its (strict) policy. A policy
// whose backend is "e2b" always goes to E2B. A delegated run that names no
// policy gets the entry's delegated_policy().
struct Placement {
  std::shared_ptr<const Policy> policy;
  Backend backend = Backend::Local;
  bool privileged = false;
};
// Errors carry EPERM for a policy the organization may not use.
Result<Placement> place_run(const PolicySet& set, const std::string& organization_id,
                            const std::optional<std::string>& requested_policy, bool e2b_configured);

}  // namespace tsb::core
