#include "daemon/core/registry.h"

#include <dirent.h>

#include <algorithm>

#include "daemon/policy/jsonc.h"

namespace tsb::core {
namespace {

using nlohmann::json;

Result<OrgEntry> parse_org(const LocatedJson& doc, const json& v, const std::string& ptr) {
  if (!v.is_object()) return Error::invalid(doc.where(ptr) + ": must be an object");
  OrgEntry e;
  for (auto it = v.begin(); it != v.end(); ++it) {
    std::string p = json_pointer_append(ptr, it.key());
    if (it.key() == "privileged") {
      if (!it->is_boolean()) return Error::invalid(doc.where(p) + ": must be true or false");
      e.privileged = it->get<bool>();
    } else if (it.key() == "policy") {
      if (!it->is_string()) return Error::invalid(doc.where(p) + ": must be a policy name");
      e.policy = it->get<std::string>();
    } else if (it.key() == "allowed_policies") {
      if (!it->is_array()) return Error::invalid(doc.where(p) + ": must be an array of policy names");
      e.allowed_policies.clear();
      for (const auto& n : *it) {
        if (!n.is_string()) return Error::invalid(doc.where(p) + ": must be an array of policy names");
        e.allowed_policies.push_back(n.get<std::string>());
      }
    } else {
      return Error::invalid(doc.where_key(p) + ": unknown key " + quoted_for_message(it.key()));
    }
  }
  if (std::find(e.allowed_policies.begin(), e.allowed_policies.end(), e.policy) == e.allowed_policies.end())
    e.allowed_policies.push_back(e.policy);
  return e;
}

}  // namespace

const OrgEntry& Organizations::lookup(const std::string& id) const {
  auto it = orgs.find(id);
  return it == orgs.end() ? fallback : it->second;
}

Result<Organizations> load_organizations(const std::string& path_in) {
  std::string path = path_in.empty() ? "embedded:organizations.json" : path_in;
  auto text = read_policy_text(path);
  if (!text.ok()) return std::move(text).error().wrap("organizations");
  auto doc = parse_jsonc(*text, path);
  if (!doc.ok()) return std::move(doc).error();
  const json& v = doc->value;
  if (!v.is_object()) return Error::invalid(doc->where("") + ": must be an object");
  Organizations o;
  o.source = path;
  for (auto it = v.begin(); it != v.end(); ++it) {
    if (it.key() == "version") {
      if (!it->is_number_unsigned() || it->get<int>() != 1) return Error::invalid(doc->where("/version") + ": must be 1");
    } else if (it.key() == "default") {
      auto e = parse_org(*doc, *it, "/default");
      if (!e.ok()) return std::move(e).error();
      o.fallback = *e;
    } else if (it.key() == "organizations") {
      if (!it->is_object()) return Error::invalid(doc->where("/organizations") + ": must be an object of id: entry");
      for (auto org = it->begin(); org != it->end(); ++org) {
        auto e = parse_org(*doc, *org, json_pointer_append("/organizations", org.key()));
        if (!e.ok()) return std::move(e).error();
        o.orgs[org.key()] = *e;
      }
    } else {
      return Error::invalid(doc->where_key(json_pointer_append("", it.key())) + ": unknown key " + quoted_for_message(it.key()));
    }
  }
  if (!v.contains("version")) return Error::invalid(doc->where("") + ": \"version\": 1 is required");
  return o;
}

Result<std::shared_ptr<const PolicySet>> load_policy_set(const DaemonConfig& cfg) {
  auto set = std::make_shared<PolicySet>();
  PolicyContext ctx;
  ctx.bind_allowlist = cfg.bind_allowlist;
  std::vector<std::string> names;
  if (cfg.policies_dir.empty()) {
    names = {"default", "privileged"};
  } else {
    DIR* d = ::opendir(cfg.policies_dir.c_str());
    if (!d) return Error::from_errno("policies directory '" + cfg.policies_dir + "'");
    while (dirent* e = ::readdir(d)) {
      std::string n = e->d_name;
      if (n.size() > 5 && n.compare(n.size() - 5, 5, ".json") == 0 && n != "organizations.json" && n[0] != '.')
        names.push_back(n.substr(0, n.size() - 5));
    }
    ::closedir(d);
    std::sort(names.begin(), names.end());
  }
  for (const auto& n : names) {
    auto p = load_named_policy(n, cfg.policies_dir, ctx);
    if (!p.ok()) return std::move(p).error();
    set->policies[n] = std::make_shared<const Policy>(std::move(p).value());
  }
  auto orgs = load_organizations(cfg.organizations_file);
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
  return std::shared_ptr<const PolicySet>(set);
}

Result<Placement> place_run(const PolicySet& set, const std::string& org_id,
                            const std::optional<std::string>& requested, bool e2b_configured) {
  const OrgEntry& e = set.orgs.lookup(org_id);
  std::string name = requested.value_or(e.policy);
  if (std::find(e.allowed_policies.begin(), e.allowed_policies.end(), name) == e.allowed_policies.end())
    return Error::invalid("policy " + quoted_for_message(name) + " is not allowed for organization " +
                              quoted_for_message(org_id),
                          EPERM);
  auto it = set.policies.find(name);
  if (it == set.policies.end()) return Error::invalid("policy " + quoted_for_message(name) + " is not loaded", EPERM);
  Placement p;
  p.policy = it->second;
  p.privileged = e.privileged;
  if (p.policy->backend == Backend::E2B) p.backend = Backend::E2B;
  else if (!e.privileged && e2b_configured) p.backend = Backend::E2B;
  else p.backend = Backend::Local;
  return p;
}

}  // namespace tsb::core
