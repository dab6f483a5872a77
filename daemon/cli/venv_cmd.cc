// toolsandbox venv list | show | gc | build: the per-tool venv cache
// (daemon/venv/cache.h) for operators and auditors.
//
//   list, show, gc   read (and gc removes) the cache directory itself, as
//                    its owner (root drops to the cache's owner first: the
//                    directory is the front end's, and nothing in it is
//                    followed); a venv a run holds is never removed.
//   build            asks the daemon: a run of a trivial tool with the
//                    requirements builds the venv exactly as a tool's run
//                    would, under the organization's policy; with --npm,
//                    a TypeScript tool's node_modules (same cache, same
//                    verbs: list shows each entry's kind).
#include <grp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <ctime>

#include "daemon/common/quote.h"
#include "daemon/cli/cli.h"
#include "daemon/policy/config.h"
#include "protocol/record.h"
#include "daemon/policy/units.h"
#include "daemon/venv/cache.h"
#include "isolate/base/random.h"

namespace tsb::cli {
namespace {

using nlohmann::json;
using core::format_size;
using core::parse_size;

constexpr const char* kUsage =
    "usage: toolsandbox venv list [--json] [--config FILE | --cache DIR]\n"
    "       toolsandbox venv show KEY [--config FILE | --cache DIR]\n"
    "       toolsandbox venv gc [--all | --max-bytes SIZE] [--json] [--config FILE | --cache DIR]\n"
    "       toolsandbox venv build [--npm] REQUIREMENT... [--org ID] [--policy NAME] [--socket PATH] [--json]\n";

int usage(const std::string& msg) {
  print_line(stderr, "toolsandbox venv: %s", msg.c_str());
  std::fputs(kUsage, stderr);
  return kExitUsage;
}

int fail(const std::string& msg) {
  print_line(stderr, "toolsandbox venv: %s", msg.c_str());
  return 1;
}

// As the cache directory's owner: root gives up root for good (this
// process does nothing else), so a link or a name planted in the directory
// can make it touch nothing its owner could not.
Status become_owner(const std::string& dir) {
  struct stat st{};
  if (::stat(dir.c_str(), &st) != 0) return Error::from_errno("the venv cache " + dir);
  if (::geteuid() != 0 || st.st_uid == 0) return {};
  if (::setgroups(0, nullptr) != 0 || ::setresgid(st.st_gid, st.st_gid, st.st_gid) != 0 ||
      ::setresuid(st.st_uid, st.st_uid, st.st_uid) != 0)
    return Error::from_errno("dropping to the owner of " + dir);
  return {};
}

std::string when(std::chrono::system_clock::time_point t) {
  const std::time_t tt = std::chrono::system_clock::to_time_t(t);
  std::tm tm{};
  ::gmtime_r(&tt, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// What the command line asks for: the verb, its options and its operands.
struct VenvOptions {
  std::string verb;
  std::optional<std::string> config, cache;
  std::string socket_path = kDefaultSocket, org = "default", policy;
  std::optional<std::uint64_t> max_bytes;
  bool as_json = false, all = false, npm = false;
  std::vector<std::string> operands;
};

// The verb (args[0]) and what follows it, or the usage error.
Result<VenvOptions> parse_venv_options(const std::vector<std::string>& args) {
  VenvOptions o;
  o.verb = args[0];
  static const std::vector<OptionSpec> kOptions = {
      {"json", nullptr},   {"config", "a file"}, {"cache", "a directory"}, {"all", nullptr},
      {"max-bytes", "a size"}, {"org", "an organization id"}, {"policy", "a name"}, {"socket", "a path"},
      {"npm", nullptr},
  };
  auto err = parse_options(std::vector<std::string>(args.begin() + 1, args.end()), kOptions, false,
                           [&](const std::string& name, const std::string& v) -> std::optional<std::string> {
                             if (name == "json") o.as_json = true;
                             else if (name == "config") o.config = v;
                             else if (name == "cache") o.cache = v;
                             else if (name == "all") o.all = true;
                             else if (name == "npm") o.npm = true;
                             else if (name == "org") o.org = v;
                             else if (name == "policy") o.policy = v;
                             else if (name == "socket") o.socket_path = v;
                             else if (name == "max-bytes") {
                               auto s = parse_size(json(v));
                               if (!s.ok()) return "--max-bytes: " + s.error().message;
                               o.max_bytes = *s;
                             }
                             return std::nullopt;
                           },
                           &o.operands);
  if (err) return Error::invalid(*err);
  return o;
}

// build: a run of a trivial tool with the requirements, through the
// daemon, builds the venv exactly as a tool's run would.
int venv_build(const VenvOptions& o) {
  if (o.operands.empty()) return usage("build needs at least one requirement");
  if (o.config || o.cache || o.all || o.max_bytes) return usage("build takes --npm, --org, --policy, --socket and --json");
  json req = {{"v", 1},
              {"id", "venv-build-" + random_hex(8)},
              {"type", "run_tool"},
              {"tool_name", "venv_build"},
              {"organization_id", o.org},
              {"source_code", "def venv_build() -> str:\n    import sys\n    return sys.prefix\n"},
              {"args", json::object()},
              {"pip_requirements", o.operands}};
  if (o.npm) {
    // A TypeScript tool's: its node_modules is built before the tool runs.
    req["tool_name"] = "node_modules_build";
    req["source_code"] = "export function node_modules_build(): string {\n  return \"ok\";\n}\n";
    req["source_type"] = "typescript";
    req["json_schema"] = {{"name", "node_modules_build"}, {"parameters", {{"type", "object"}, {"properties", json::object()}}}};
    req.erase("pip_requirements");
    req["npm_requirements"] = o.operands;
  }
  if (!o.policy.empty()) req["policy"] = o.policy;
  auto resp = roundtrip(o.socket_path, req);
  if (!resp.ok()) return fail(resp.error().message);
  if (o.as_json) std::printf("%s\n", core::dump_json(*resp).c_str());
  if (!resp->value("ok", false)) {
    if (!o.as_json)
      print_line(stderr, "toolsandbox venv: %s: %s", (*resp)["error"].value("code", "?").c_str(),
                   (*resp)["error"].value("message", "").c_str());
    return 1;
  }
  const json& r = (*resp)["result"];
  const char* part = o.npm ? "node_modules" : "venv";
  const json& v = r["record"].contains(part) ? r["record"][part] : json::object();
  // --npm: built (or found) is what counts, whatever the trivial tool did.
  const bool built = o.npm ? v.is_object() && v.contains("key") && r["record"].value("detail", "") != "node_modules_build_failed"
                           : r.value("status", "") == "success";
  if (!built) {
    if (!o.as_json) {
      // What pip or npm printed, on the operator's terminal: escaped, lines kept.
      for (const auto& s : r["stderr"]) print_block(stderr, s.get<std::string>() + "\n");
      print_line(stderr, "toolsandbox venv: the build failed: %s", r["record"].value("error", "").c_str());
    }
    return 1;
  }
  if (!o.as_json)
    print_line(stdout, "%s %s in %.0f ms (policy %s)", v.value("key", "?").c_str(),
                v.value("built", false) ? "built" : "cached", v.value("build_ms", 0.0),
                r["record"].value("policy", "?").c_str());
  return 0;
}

// list, show and gc read the cache itself: the options for build and for
// another verb are refused before anything is opened.
Status check_cache_options(const VenvOptions& o) {
  if (o.verb != "list" && o.verb != "show" && o.verb != "gc") return Error::invalid("unknown verb '" + o.verb + "'");
  if (o.npm) return Error::invalid("--npm is for build");
  if (!o.org.empty() && o.org != "default") return Error::invalid("--org is for build");
  if (!o.policy.empty()) return Error::invalid("--policy is for build");
  if ((o.all || o.max_bytes) && o.verb != "gc") return Error::invalid("--all and --max-bytes are for gc");
  if (o.all && o.max_bytes) return Error::invalid("give --all or --max-bytes, not both");
  if (o.config && o.cache) return Error::invalid("give --config or --cache, not both");
  return {};
}

// The cache directory, its cap (for gc: what it removes down to) and the
// cache opened as its owner.
struct OpenCache {
  std::string dir;
  std::uint64_t cap = 0;
  std::unique_ptr<venv::Cache> cache;
};

// The directory comes from --cache, else from the daemon's configuration
// (--config, or the installed one, which may be absent); root becomes the
// directory's owner before opening it.
Result<OpenCache> open_cache(const VenvOptions& o) {
  OpenCache out;
  {
    const bool explicit_config = o.config.has_value();
    const std::string path = explicit_config ? *o.config : std::string(TSB_SYSCONFDIR) + "/toolsandboxd.json";
    auto cfg = core::load_daemon_config(path, !explicit_config);
    if (!cfg.ok() && !o.cache) return std::move(cfg).error().wrap("the daemon's configuration (--cache names the cache without it)");
    out.dir = o.cache ? *o.cache : cfg->venvs.cache_dir;
    out.cap = cfg.ok() ? cfg->venvs.max_bytes : core::VenvConfig{}.max_bytes;
  }
  if (auto st = become_owner(out.dir); !st.ok()) return std::move(st).error().wrap("the cache's owner");
  // gc: the cap is what it removes down to.
  if (o.verb == "gc") out.cap = o.all ? 0 : o.max_bytes.value_or(out.cap);
  auto c = venv::Cache::open(out.dir, out.cap, /*owner=*/false);
  if (!c.ok()) return std::move(c).error().wrap("the venv cache");
  out.cache = std::move(c).value();
  return out;
}

// show KEY: one venv's manifest, found by a unique prefix of its key.
int venv_show(venv::Cache& cache, const std::string& dir, const VenvOptions& o) {
  if (o.operands.size() != 1) return usage("show needs one KEY (or a unique prefix of at least 8 digits)");
  const std::string& k = o.operands[0];
  std::vector<std::string> match;
  for (const auto& [key, e] : cache.entries())
    if (k.size() >= 8 && key.starts_with(k)) match.push_back(key);
  if (match.empty()) return fail("no venv " + k + " in " + dir);
  if (match.size() > 1) return fail(k + " names " + std::to_string(match.size()) + " venvs; give more digits");
  json m = cache.manifest(match[0]);
  if (m.is_null()) return fail("the manifest of " + match[0] + " is unreadable");
  m["in_use"] = cache.held_anywhere(match[0]);
  m["path"] = dir + "/" + match[0];
  std::printf("%s\n", m.dump(2).c_str());
  return 0;
}

// list: every venv, most recently used first, as JSON or one line each.
int venv_list(venv::Cache& cache, const std::string& dir, std::uint64_t cap, const VenvOptions& o) {
  if (!o.operands.empty()) return usage("list takes no operand");
  std::vector<const venv::CacheEntry*> es;
  for (const auto& [k, e] : cache.entries()) es.push_back(&e);
  std::sort(es.begin(), es.end(), [](auto* a, auto* b) { return a->last_used > b->last_used; });
  json out = json::array();
  for (const venv::CacheEntry* e : es) {
    // The manifest is the daemon's, but read as any file is: a field of
    // another shape is shown as missing.
    const json m = cache.manifest(e->key);
    json reqs = json::array();
    if (m.is_object() && m.contains("requirements") && m["requirements"].is_array())
      for (const auto& r : m["requirements"])
        if (r.is_string()) reqs.push_back(r);
    const json policy = m.is_object() && m.contains("policy") && m["policy"].is_string() ? m["policy"] : json("");
    out.push_back({{"key", e->key},
                   {"kind", venv::kind_of(m)},
                   {"bytes", e->bytes},
                   {"last_used", when(e->last_used)},
                   {"in_use", cache.held_anywhere(e->key)},
                   {"policy", policy},
                   {"requirements", reqs}});
  }
  if (o.as_json) {
    std::printf("%s\n", json{{"dir", dir}, {"bytes", cache.total_bytes()}, {"max_bytes", cap}, {"venvs", out}}.dump(2).c_str());
    return 0;
  }
  print_line(stdout, "%s: %zu venvs, %s of %s", dir.c_str(), out.size(), format_size(cache.total_bytes()).c_str(),
              format_size(cap).c_str());
  for (const json& e : out) {
    std::string reqs;
    for (const auto& r : e["requirements"]) reqs += (reqs.empty() ? "" : " ") + escaped(r.get<std::string>());
    print_line(stdout, "%.16s  %-12s  %10s  %s  %-6s  %s", e["key"].get<std::string>().c_str(),
                e["kind"].get<std::string>().c_str(),
                format_size(e["bytes"].get<std::uint64_t>()).c_str(), e["last_used"].get<std::string>().c_str(),
                e["in_use"].get<bool>() ? "in use" : "", reqs.c_str());
  }
  return 0;
}

// gc: least recently used first, never one a run holds.
int venv_gc(venv::Cache& cache, const std::string& dir, const VenvOptions& o) {
  if (!o.operands.empty()) return usage("gc takes no operand");
  const std::uint64_t before = cache.total_bytes();
  const std::vector<std::string> gone = cache.evict();
  if (o.as_json) {
    std::printf("%s\n", json{{"removed", gone}, {"bytes_before", before}, {"bytes", cache.total_bytes()}}.dump(2).c_str());
  } else {
    for (const auto& k : gone) print_line(stdout, "removed %s", k.c_str());
    print_line(stdout, "%s: %zu venvs removed, %s left (%zu venvs)", dir.c_str(), gone.size(),
                format_size(cache.total_bytes()).c_str(), cache.entries().size());
  }
  return 0;
}

}  // namespace

// The verb decides: build asks the daemon; list, show and gc open the
// cache directory (as its owner) and read it.
int cmd_venv(const std::vector<std::string>& args) {
  if (args.empty() || args[0] == "help" || args[0] == "--help") {
    std::fputs(kUsage, args.empty() ? stderr : stdout);
    return args.empty() ? kExitUsage : 0;
  }
  auto opts = parse_venv_options(args);
  if (!opts.ok()) return usage(opts.error().message);
  if (opts->verb == "build") return venv_build(*opts);
  if (auto st = check_cache_options(*opts); !st.ok()) return usage(st.error().message);
  auto opened = open_cache(*opts);
  if (!opened.ok()) return fail(opened.error().message);
  if (opts->verb == "show") return venv_show(*opened->cache, opened->dir, *opts);
  if (opts->verb == "list") return venv_list(*opened->cache, opened->dir, opened->cap, *opts);
  return venv_gc(*opened->cache, opened->dir, *opts);
}

}  // namespace tsb::cli
