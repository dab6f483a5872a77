// The npm part of a policy's "typescript" section (policies/README.md,
// "typescript.packages"): a TypeScript tool whose npm_requirements are not
// empty gets a node_modules of its own, built once per set in a build
// sandbox from the registry or the tarball directory named here, cached
// beside the per-tool venvs (daemon/venv/cache.h) and bound read-only at
// /node_modules for its run.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "daemon/policy/jsonc.h"
#include "isolate/base/result.h"

namespace tsb::core {

struct EgressRules;

struct NpmPackagesPolicy {
  bool enabled = false;                 // the policy has "typescript": {"packages"}
  std::vector<std::string> allow;       // fnmatch patterns over npm names; a requirement no pattern matches is refused
  std::uint32_t max_requirements = 16;  // per run
  std::string tarballs;                 // a host directory of .tgz files: builds have no network
  std::string registry;                 // or a registry URL (http or https): builds reach it through egress
  std::string registry_host;            // its host and port (the build's egress rule)
  std::uint16_t registry_port = 0;
  bool install_scripts = false;         // false: npm --ignore-scripts
  std::chrono::milliseconds build_timeout{300'000};
  std::uint64_t build_memory = 2ull << 30;
  std::uint64_t size = 1ull << 30;      // the build's tmpfs, and so the largest node_modules
  // What else decides what npm installs, for the key: the source of
  // packages and whether install scripts run.
  std::string source_settings() const;
};

// Where a build sees the tarball directory, and where it makes the tree.
inline constexpr std::string_view kTarballsSandboxPath = "/tarballs";
inline constexpr std::string_view kNpmBuildPath = "/build";

// "packages" of "typescript": the object `o` into `k`.
Status parse_npm_packages(ObjectReader o, NpmPackagesPolicy& k);
// Its part of the canonical policy.
nlohmann::json npm_packages_json(const NpmPackagesPolicy& k);
// The egress rules of its builds: the registry's host and port only
// (none with a tarball directory).
EgressRules npm_build_egress_rules(const NpmPackagesPolicy& k);
// The name of the npm build policy of a policy with "typescript.packages".
std::string npm_build_policy_name(std::string_view policy);

}  // namespace tsb::core
