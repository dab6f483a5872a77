#include "daemon/policy/npm_packages.h"

#include "daemon/common/quote.h"
#include "daemon/policy/policy.h"
#include "daemon/policy/units.h"
#include "daemon/policy/fs_table.h"

namespace tsb::core {

using nlohmann::json;

std::string NpmPackagesPolicy::source_settings() const {
  return (tarballs.empty() ? "registry=" + registry : "tarballs=" + tarballs) +
         (install_scripts ? "\ninstall_scripts" : "");
}

std::string npm_build_policy_name(std::string_view policy) { return std::string(policy) + "/npm-build"; }

Status parse_npm_packages(ObjectReader o, NpmPackagesPolicy& k) {
  TSB_TRY(o.object("\"packages\""), "typescript.packages");
  k.enabled = true;
  auto allow = o.strings("allow", "npm name patterns");
  if (!allow.ok()) return std::move(allow).error();  // context: the reader names file:line:col and the key
  if (!o.get("allow"))
    return o.error("allow", "is required: the npm package names (fnmatch patterns, like \"lodash\" or \"@types/*\") "
                            "a tool may ask for; [\"*\"] allows any");
  for (const std::string& a : *allow)
    if (a.empty() || a.size() > 214 || a.find_first_of(" \t\\") != std::string::npos)
      return o.error("allow", "not an npm name pattern: " + quoted_for_message(a));
  k.allow = std::move(allow).value();
  auto max = o.number("max_requirements", k.max_requirements, 1, 64);
  if (!max.ok()) return std::move(max).error();  // context: the reader names file:line:col and the key
  k.max_requirements = static_cast<std::uint32_t>(*max);
  // null: not given (so a policy can replace an included file's source).
  const json* tarballs = o.get("tarballs");
  const json* registry = o.get("registry");
  if (tarballs && tarballs->is_null()) tarballs = nullptr;
  if (registry && registry->is_null()) registry = nullptr;
  if ((tarballs != nullptr) == (registry != nullptr))
    return Error::invalid(o.where("") + ": give exactly one of \"tarballs\" (a host directory of npm .tgz files; "
                                        "builds have no network) or \"registry\" (an npm registry URL; builds reach only it)");
  if (tarballs) {
    if (!tarballs->is_string()) return o.error("tarballs", "must be an absolute host path");
    k.tarballs = tarballs->get<std::string>();
    // Shown read-only to this policy's npm builds only, never to a tool
    // run: not a bind, so the bind allow-list does not apply.
    auto st = isolate::check_sandbox_path(k.tarballs, "tarballs");
    if (!st.ok() || k.tarballs == "/") return o.error("tarballs", "must be an absolute, normalised host path (not /)");
  } else {
    if (!registry->is_string()) return o.error("registry", "must be a URL");
    const std::string url = registry->get<std::string>();
    if (auto st = package_source_url(url, "registry", "use \"tarballs\"", k.registry_host, k.registry_port); !st.ok())
      return o.error("registry", st.error().message);
    k.registry = url;
  }
  auto scripts = o.boolean("install_scripts", false);
  if (!scripts.ok()) return std::move(scripts).error();  // context: the reader names file:line:col and the key
  k.install_scripts = *scripts;
  // context: the reader names file:line:col and the key
  if (auto st = parse_build_limits(o, "typescript.packages", "size", "1GiB", k.build_timeout, k.build_memory, k.size);
      !st.ok())
    return st;
  return o.done();
}

json npm_packages_json(const NpmPackagesPolicy& k) {
  return {{"allow", k.allow},
          {"max_requirements", k.max_requirements},
          {"tarballs", k.tarballs.empty() ? json() : json(k.tarballs)},
          {"registry", k.registry.empty() ? json() : json(k.registry)},
          {"install_scripts", k.install_scripts},
          {"build",
           {{"wall_timeout", format_duration(k.build_timeout)},
            {"memory", format_size(k.build_memory)},
            {"size", format_size(k.size)}}}};
}

EgressRules npm_build_egress_rules(const NpmPackagesPolicy& k) {
  EgressRules e;
  if (k.registry.empty()) return e;
  EgressRules::Rule r;
  r.hosts.push_back(k.registry_host);
  r.ports.push_back(k.registry_port);
  e.allow.push_back(std::move(r));
  e.max_connections = 256;  // npm fetches one tarball per package
  e.max_bytes = k.size * 2 + (64ull << 20);
  return e;
}

}  // namespace tsb::core
