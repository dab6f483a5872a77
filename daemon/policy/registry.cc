#include "daemon/policy/registry.h"

#include <algorithm>

#include "daemon/policy/e2b_network.h"
#include "daemon/policy/jsonc.h"
#include "daemon/policy/sources.h"

namespace tsb::core {
namespace {

using nlohmann::json;

Result<OrgEntry> parse_org(const LocatedJson& doc, const json& v, const std::string& ptr) {
  ObjectReader r(doc, v, ptr);
  if (auto st = r.object("an organization"); !st.ok()) return std::move(st).error();
  OrgEntry e;
  auto privileged = r.boolean("privileged", e.privileged);
  if (!privileged.ok()) return std::move(privileged).error();
  e.privileged = *privileged;
  if (const json* p = r.get("policy"); p && !p->is_string()) return r.error("policy", "must be a policy name");
  auto policy = r.string("policy", e.policy);
  if (!policy.ok()) return std::move(policy).error();
  e.policy = *policy;
  if (r.get("allowed_policies")) {
    auto allowed = r.strings("allowed_policies", "policy names");
    if (!allowed.ok()) return std::move(allowed).error();
    e.allowed_policies = *allowed;
  }
  if (r.get("e2b_policy")) {
    if (!r.get("e2b_policy")->is_string()) return r.error("e2b_policy", "must be a policy name");
    auto e2b = r.string("e2b_policy", "");
    if (!e2b.ok()) return std::move(e2b).error();
    if (e2b->empty()) return r.error("e2b_policy", "must be a policy name");
    e.e2b_policy = *e2b;
  }
  if (auto st = r.done(); !st.ok()) return std::move(st).error();
  if (std::find(e.allowed_policies.begin(), e.allowed_policies.end(), e.policy) == e.allowed_policies.end())
    e.allowed_policies.push_back(e.policy);
  return e;
}

}  // namespace

const OrgEntry& Organizations::lookup(const std::string& id) const {
  auto it = orgs.find(id);
  return it == orgs.end() ? fallback : it->second;
}

Result<Organizations> load_organizations(const std::string& path_in, SourceFiles* files) {
  std::string path = path_in.empty() ? "embedded:organizations.json" : path_in;
  auto text = read_policy_text(path, files);
  if (!text.ok()) return std::move(text).error().wrap("organizations");
  auto doc = parse_jsonc(*text, path);
  if (!doc.ok()) return std::move(doc).error();
  ObjectReader r(*doc, doc->value, "");
  if (auto st = r.object("the organizations table"); !st.ok()) return std::move(st).error();
  Organizations o;
  o.source = path;
  const json* version = r.get("version");
  if (!version) return Error::invalid(doc->where("") + ": \"version\": 1 is required");
  if (!version->is_number_unsigned() || version->get<std::uint64_t>() != 1) return r.error("version", "must be 1");
  if (const json* d = r.get("default")) {
    auto e = parse_org(*doc, *d, "/default");
    if (!e.ok()) return std::move(e).error();
    o.fallback = *e;
  }
  if (const json* orgs = r.get("organizations")) {
    if (!orgs->is_object()) return r.error("organizations", "must be an object of id: entry");
    for (auto org = orgs->begin(); org != orgs->end(); ++org) {
      auto e = parse_org(*doc, *org, json_pointer_append("/organizations", org.key()));
      if (!e.ok()) return std::move(e).error();
      o.orgs[org.key()] = *e;
    }
  }
  if (auto st = r.done(); !st.ok()) return std::move(st).error();
  return o;
}

std::string policy_set_warning(const DaemonConfig& cfg, const PolicySet& set) {
  std::string names;
  for (const auto& [name, p] : set.policies)
    if (p->backend == Backend::Local && p->warm.max > 0) names += (names.empty() ? "\"" : ", \"") + name + "\"";
  // (The spawner's bound: runs and sessions together, daemon/compile/helper.cc.)
  const unsigned held = cfg.max_concurrent_runs + cfg.max_sessions;
  if (names.empty() || cfg.engine.uid_slots > held) return "";
  return "the warm pools of " + names + " stay empty: engine.uid_slots (" + std::to_string(cfg.engine.uid_slots) +
         ") leaves no uid slot beyond max_concurrent_runs plus max_sessions (" + std::to_string(held) +
         "), and every warm sandbox holds one; raise engine.uid_slots";
}

Result<std::shared_ptr<const PolicySet>> load_policy_set(const DaemonConfig& cfg, SourceFiles* files) {
  auto set = std::make_shared<PolicySet>();
  PolicyContext ctx;
  ctx.bind_allowlist = cfg.bind_allowlist;
  SourceFiles disk;  // without a record: the file system, read directly
  ctx.files = files ? files : &disk;
  std::vector<std::string> names = {"default", "privileged", "e2b"};
  if (!cfg.policies_dir.empty()) {
    auto listed = ctx.files->policy_names(cfg.policies_dir);
    if (!listed.ok()) return std::move(listed).error();
    names = std::move(listed).value();
  }
  for (const auto& n : names) {
    auto p = load_named_policy(n, cfg.policies_dir, ctx);
    if (!p.ok()) return std::move(p).error();
    set->policies[n] = std::make_shared<const Policy>(std::move(p).value());
  }
  auto orgs = load_organizations(cfg.organizations_file, ctx.files);
  if (!orgs.ok()) return std::move(orgs).error();
  set->orgs = std::move(orgs).value();
  auto check = [&](const OrgEntry& e, const std::string& who) -> Status {
    for (const auto& n : e.allowed_policies)
      if (!set->policies.count(n))
        return Error::invalid(set->orgs.source + ": " + who + " names policy " + quoted_for_message(n) + ", which is not loaded");
    return {};
  };
  TSB_TRY(check(set->orgs.fallback, "the default entry"), "organizations");
  for (const auto& [id, e] : set->orgs.orgs) TSB_TRY(check(e, "organization " + quoted_for_message(id)), "organizations");
  if (cfg.e2b.enabled) TSB_TRY(check_delegated_policies(set->orgs, set->policies), "organizations");
  return std::shared_ptr<const PolicySet>(set);
}

std::vector<std::string> delegated_policies(const OrgEntry& e) {
  if (e.privileged) return {};
  std::vector<std::string> names = e.allowed_policies;
  if (std::find(names.begin(), names.end(), e.delegated_policy()) == names.end()) names.push_back(e.delegated_policy());
  return names;
}

Status check_delegated_policies(const Organizations& orgs,
                                const std::map<std::string, std::shared_ptr<const Policy>>& policies) {
  auto check = [&](const OrgEntry& e, const std::string& who) -> Status {
    for (const auto& n : delegated_policies(e)) {
      auto it = policies.find(n);
      if (it == policies.end())
        return Error::invalid(orgs.source + ": " + who + " is delegated to E2B and names policy " +
                              quoted_for_message(n) + ", which is not loaded");
      const E2BNetwork net = e2b_network(*it->second);
      if (!net.refusal.empty())
        return Error::invalid(orgs.source + ": " + who + " is delegated to E2B (not privileged, E2B configured) and " +
                              "may run under policy " + quoted_for_message(n) + ", which E2B cannot run: " +
                              e2b_refusal_message(net, it->second->source + ": " + net.refused_at));
    }
    return {};
  };
  TSB_TRY(check(orgs.fallback, "the default entry"), "E2B");
  for (const auto& [id, e] : orgs.orgs) TSB_TRY(check(e, "organization " + quoted_for_message(id)), "E2B");
  return {};
}

Result<Placement> place_run(const PolicySet& set, const std::string& org_id,
                            const std::optional<std::string>& requested, bool e2b_configured) {
  const OrgEntry& e = set.orgs.lookup(org_id);
  const bool delegated = !e.privileged && e2b_configured;
  std::string name = requested.value_or(delegated ? e.delegated_policy() : e.policy);
  if (requested && std::find(e.allowed_policies.begin(), e.allowed_policies.end(), name) == e.allowed_policies.end())
    return Error::invalid("policy " + quoted_for_message(name) + " is not allowed for organization " +
                              quoted_for_message(org_id),
                          EPERM);
  auto it = set.policies.find(name);
  if (it == set.policies.end()) return Error::invalid("policy " + quoted_for_message(name) + " is not loaded", EPERM);
  Placement p;
  p.policy = it->second;
  p.privileged = e.privileged;
  if (p.policy->backend == Backend::E2B) p.backend = Backend::E2B;
  else if (delegated) p.backend = Backend::E2B;
  else p.backend = Backend::Local;
  return p;
}

}  // namespace tsb::core
