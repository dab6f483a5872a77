// Policies: what a tool run may do, as files security teams read.
// Format and every key: policies/README.md. Parsing is strict (unknown keys,
// bad units, unknown syscalls, binds outside the allow-list are errors that
// point at file:line:col); a missing key means the safe value.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "isolate/base/result.h"
#include "daemon/policy/seccomp_profile.h"
#include "daemon/policy/fs_table.h"
#include "daemon/policy/npm_packages.h"
#include "daemon/policy/sessions.h"

namespace tsb {
class ObjectReader;  // daemon/policy/jsonc.h
}  // namespace tsb

namespace tsb::core {

class SourceFiles;

enum class Backend { Local, E2B };
const char* to_string(Backend b) noexcept;
// "none", "host", "egress": as a policy names it.
const char* to_string(isolate::NetworkMode n) noexcept;

// What a tool in network mode "egress" may reach through the daemon's proxy
// (policies/README.md, "egress"). Beyond every rule, the deny list always
// applies (daemon/policy/egress_host.h), and a host it would always refuse
// is refused when the policy is read.
struct EgressRules {
  struct Rule {
    std::vector<std::string> hosts;  // "api.example.com", or "*.example.com" (any name below it)
    std::vector<std::uint16_t> ports;
  };
  std::vector<Rule> allow;
  std::vector<std::uint16_t> public_ports;  // any public destination on these ports; empty: none
  std::uint32_t max_connections = 64;       // per run
  std::uint64_t max_bytes = 100ull << 20;   // per run, both directions together
};

// The variables every egress run gets, fixed by the mode (a request cannot
// change them): the proxy (http://127.0.0.1:3128, isolate/engine/plan.h) for
// HTTP, HTTPS and everything else, both spellings (curl reads only
// http_proxy in lower case); NO_PROXY for the sandbox's own localhost.
inline constexpr const char* kEgressProxyVariables[] = {"HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY",
                                                         "http_proxy", "https_proxy", "all_proxy", "no_proxy"};

// Per-tool packages (policies/README.md, "packages"): a run whose
// requirements (Letta's pip_requirements) are not empty gets a venv of its
// own, built once per set in a build sandbox and bound read-only at /venv
// in place of the policy's venv (daemon/venv/cache.h).
struct PackagesPolicy {
  bool enabled = false;                 // the policy has a "packages" section
  std::vector<std::string> allow;       // fnmatch patterns over PEP 503 names; a requirement no pattern matches is refused
  std::uint32_t max_requirements = 16;  // per run, the sandbox config's and the tool's together
  std::string wheels;                   // a host directory of wheels: builds have no network
  std::string index;                    // or a package index URL (http or https): builds reach it through egress
  std::string index_host;               // the index URL's host and port (egress rule)
  std::uint16_t index_port = 0;
  std::vector<std::string> index_hosts; // more hosts the index's files live on (same port)
  bool source_builds = false;           // false: binary wheels only (pip --only-binary=:all:)
  std::chrono::milliseconds build_timeout{300'000};
  std::uint64_t build_memory = 2ull << 30;
  std::uint64_t venv_size = 1ull << 30;  // the build's /venv tmpfs, and so the largest venv
  // What else decides what pip installs, for the venv's key: the source
  // of packages and whether sdists may be built.
  std::string index_settings() const;
};

// TypeScript tools (policies/README.md, "typescript"): Letta's tools of
// source_type "typescript" run locally under node, their types stripped by
// esbuild or node-typescript, every path below the sandbox's read-only /usr
// (the host's). A host without them still starts: such a run fails its
// set-up, saying what is missing.
struct TypeScriptPolicy {
  bool enabled = false;              // the policy has a "typescript" section
  std::string node = "/usr/bin/node";
  std::string strip_types = "esbuild";  // or "typescript"
  std::string esbuild = "/usr/bin/esbuild";
  std::string typescript = "/usr/share/nodejs/typescript";
  // The stripper's path (esbuild's program, or node-typescript's module).
  const std::string& stripper() const { return strip_types == "esbuild" ? esbuild : typescript; }
};
// The acorn parser the TypeScript runner reads the stripped script with
// (Debian's node-acorn), below /usr like the rest of the runtime.
inline constexpr std::string_view kAcornPath = "/usr/share/nodejs/acorn";

// Warm sandboxes (policies/README.md, "warm_pool"): per mode (the policy's own venv), up
// to `max` sandboxes made before their request, each used once. The pool
// grows by one on every run that finds it empty, keeps at least `min`, and
// shrinks by one for every `idle` without a run.
// What Letta's generated scripts import (letta/services/tool_sandbox,
// every generation): a warm pool's default preload for scripts.
inline const std::vector<std::string> kLettaPreload = {"base64", "hashlib", "json", "pickle", "struct", "sys", "typing"};

struct WarmPool {
  std::uint32_t min = 0, max = 0;  // max 0: no pool
  std::chrono::milliseconds idle{300'000};
  // Modules a warm sandbox imports before its hand-over (dotted names of
  // the policy's venv or the standard library), per mode. A policy's list
  // goes to both. Without one, scripts (execute) get Letta's imports, and
  // tools (run_tool) nothing: the runner takes the place of Letta's
  // script and imports none of them (hashlib and pickle alone cost a warm
  // sandbox ~6 ms of CPU that no run of it would use).
  std::vector<std::string> preload = kLettaPreload;
  std::vector<std::string> tool_preload;
};

struct Policy {
  std::string name;         // file stem ("default"), or as registered
  std::string source;       // path, or "embedded:<name>"
  std::string description;
  Backend backend = Backend::Local;
  isolate::Limits limits;
  // limits.result: the largest result a run may return on its result
  // channel (tool mode; a pickle's decoding), held by the front end. Its
  // own cap, not stdout's: Letta keeps returns of up to 1,000,000
  // characters (Tool.return_char_limit), up to 12 MB as the runner's JSON.
  std::uint64_t result_bytes = 16ull << 20;
  std::string venv;         // host path; "" = no venv
  std::string workdir = "/work";
  std::vector<isolate::BindMount> binds;
  isolate::NetworkMode network = isolate::NetworkMode::None;
  EgressRules egress;                          // network "egress" only
  PackagesPolicy packages;
  TypeScriptPolicy typescript;
  NpmPackagesPolicy npm_packages;              // "typescript": {"packages"} (npm_packages.h)
  WarmPool warm;
  SessionsPolicy sessions;                     // "sessions" (sessions.h)
  std::map<std::string, std::string> env_set;  // fixed values, always present
  std::vector<std::string> env_allow;          // names (or PREFIX_*) a request may set
  std::string seccomp_source;                  // profile path, or "<inline>"
  std::shared_ptr<const policy::SeccompProfile> seccomp_profile;
  std::shared_ptr<const isolate::SeccompProgram> seccomp;  // compiled once, here
  std::uint32_t uid = 1000;
  std::uint32_t gid = 1000;
  std::string interpreter;  // inside the sandbox
  std::string hostname = "sandbox";
  std::string include;      // the included file, if any (resolved path)

  nlohmann::json canonical;  // the effective policy, includes resolved
  std::string fingerprint;   // "sha256:" + hex of canonical's compact sorted dump

};

// Where policy files may bind host paths from (daemon configuration).
struct PolicyContext {
  std::vector<std::string> bind_allowlist;  // host path prefixes
  bool compile = true;                      // compile seccomp (off for pure checks in tests)
  // Where files are read (daemon/policy/sources.h): null, the file system.
  SourceFiles* files = nullptr;
};

// Reads files from disk, or from the set embedded in the binary when the
// path starts with "embedded:" (policies/ of the source tree, see
// daemon/policy/embedded.h); through `files` when given.
Result<std::string> read_policy_text(const std::string& path, SourceFiles* files = nullptr);

Result<Policy> load_policy(const std::string& path, const PolicyContext& ctx);
// `name` resolves to a file in `dir` ("<dir>/<name>.json"); with dir empty,
// to the embedded policies.
Result<Policy> load_named_policy(const std::string& name, const std::string& dir, const PolicyContext& ctx);

// What the file system of a run under `p` is made of (daemon/policy/fs_table.h);
// `runner`: the host path of the trusted tool runner, for tool mode.
isolate::FsInputs fs_inputs_from(const Policy& p, const std::string& runner = "");

// The name of the build policy of a policy with "packages", and the egress
// rules of its builds: its index's hosts only (daemon/compile/spawn_policy.h).
std::string build_policy_name(const Policy& p);
// A build's limits (a packages section's "build"): wall_timeout (1s-1h),
// memory (64MiB-64GiB) and the built tree's `size_key` (16MiB-64GiB), each
// kept when absent; `example` is the size a message shows.
Status parse_build_limits(ObjectReader& o, std::string_view section, const char* size_key, std::string_view example,
                          std::chrono::milliseconds& timeout, std::uint64_t& memory, std::uint64_t& size);
// A package source URL (a pip index, an npm registry) that builds reach
// through the egress proxy: "http(s)://host[:port]/path", its host a name
// the proxy would not always refuse (else why, naming `what` and what to
// use `instead`); its host and port.
Status package_source_url(const std::string& url, std::string_view what, std::string_view instead, std::string& host,
                          std::uint16_t& port);
EgressRules build_egress_rules(const PackagesPolicy& k);
inline constexpr std::string_view kWheelsSandboxPath = "/wheels";
// The TypeScript policy of a policy with "typescript": its runs, under
// node (daemon/compile/spawn_policy.h, to_typescript_spawn_policy).
std::string typescript_policy_name(const Policy& p);


}  // namespace tsb::core
