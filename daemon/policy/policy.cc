#include "daemon/policy/policy.h"
#include "daemon/policy/sources.h"

#include <dirent.h>
#include "daemon/venv/archive.h"


#include "isolate/base/file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <optional>
#include <set>

#include "daemon/policy/e2b_network.h"
#include "daemon/policy/egress_host.h"
#include "daemon/policy/embedded.h"
#include "daemon/policy/units.h"
#include "daemon/common/hash.h"
#include "daemon/policy/jsonc.h"
#include "isolate/engine/plan.h"
#include "isolate/base/unique_fd.h"

namespace tsb::core {
Status parse_build_limits(ObjectReader& o, std::string_view section, const char* size_key, std::string_view example,
                          std::chrono::milliseconds& timeout, std::uint64_t& memory, std::uint64_t& size) {
  const nlohmann::json* b = o.get("build");
  if (!b) return {};
  ObjectReader r(o.doc(), *b, o.pointer("build"));
  TSB_TRY(r.object("\"build\""), section);
  if (const nlohmann::json* v = r.get("wall_timeout")) {
    auto d = parse_duration(*v);
    if (!d.ok() || d->count() < 1000 || d->count() > 3'600'000)
      return r.error("wall_timeout", "must be a duration from 1s to 1h, like \"300s\"");
    timeout = *d;
  }
  for (auto [key, out, lo] : {std::tuple<const char*, std::uint64_t*, std::uint64_t>{"memory", &memory, 64ull << 20},
                              {size_key, &size, 16ull << 20}}) {
    if (const nlohmann::json* v = r.get(key)) {
      auto sz = parse_size(*v);
      if (!sz.ok() || *sz < lo || *sz > (64ull << 30))
        return r.error(key, "must be a size from " + format_size(lo) + " to 64GiB, like \"" + std::string(example) + "\"");
      *out = *sz;
    }
  }
  TSB_TRY(r.done(), section);
  return {};
}

namespace {

using nlohmann::json;
constexpr const char* kEmbedded = "embedded:";

bool is_embedded(const std::string& p) { return p.rfind(kEmbedded, 0) == 0; }

std::string dir_of(const std::string& path) {
  auto slash = path.rfind('/');
  if (slash == std::string::npos) return is_embedded(path) ? std::string(kEmbedded) : ".";
  return path.substr(0, slash);
}

std::string join(const std::string& dir, const std::string& rel) {
  if (!rel.empty() && rel[0] == '/') return rel;
  if (dir == kEmbedded) return dir + rel;
  if (dir == ".") return rel;  // messages name the file as the user would
  return dir + "/" + rel;
}

Status expect(bool ok, const std::string& where, const std::string& sentence) {
  if (ok) return {};
  return Error::invalid(where + ": " + sentence);
}

// Deep merge for one level of include: objects merge key by key, anything
// else (arrays included) is replaced by the including file's value.
void merge_into(json& base, const json& over) {
  if (!base.is_object() || !over.is_object()) {
    base = over;
    return;
  }
  for (auto it = over.begin(); it != over.end(); ++it) {
    if (base.contains(it.key())) merge_into(base[it.key()], it.value());
    else base[it.key()] = it.value();
  }
}

bool path_under(const std::string& p, const std::string& prefix) {
  if (prefix == "/") return true;
  return p == prefix || (p.size() > prefix.size() && p.compare(0, prefix.size(), prefix) == 0 && p[prefix.size()] == '/');
}

// "ports": [443, 80]: at least one, each 1-65535.
Status parse_ports(ObjectReader& o, const char* key, std::vector<std::uint16_t>& out) {
  const json* v = o.get(key);
  if (!v) return o.error(key, "is required: the ports this rule allows");
  if (!v->is_array() || v->empty()) return o.error(key, "must be a non-empty array of ports");
  for (const auto& e : *v) {
    if (!e.is_number_unsigned() || e.get<std::uint64_t>() < 1 || e.get<std::uint64_t>() > 65535)
      return o.error(key, "ports are whole numbers from 1 to 65535");
    out.push_back(static_cast<std::uint16_t>(e.get<std::uint64_t>()));
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return {};
}

// "localhost" and the names below it, which resolvers answer with a
// loopback address without asking DNS (RFC 6761, section 6.3): the egress
// proxy refuses every connection there.
bool names_loopback(std::string_view host) { return host == "localhost" || host.ends_with(".localhost"); }

// Why the egress proxy would refuse every connection to `host` (a host a
// policy names for a rule or a package index: a name, or "*." and one),
// or "" when it may serve it. The proxy's own reading of a host and its
// deny list (daemon/policy/egress_host.h) decide, so a policy that loads
// names nothing the proxy then refuses for what it is: an address on the
// deny list (however spelled: "127.1", "0x7f000001", "[::ffff:10.0.0.1]"),
// any other address (a rule or an index names hosts; only "public"
// reaches an address), a name the proxy does not read as one (a label
// longer than 63 bytes, or beginning or ending with '-'), or localhost.
std::string egress_refusal(std::string_view written) {
  const std::string_view host = written.starts_with("*.") ? written.substr(2) : written;
  const egress::Host h = egress::parse_host(host);
  if (h.kind == egress::Host::kAddress) {
    const std::string_view why = egress::denied(h.address, {});
    if (!why.empty())
      return quoted_for_message(written) + " is " + std::string(why) + ": the egress proxy would refuse every "
             "connection to it (its deny list, which no rule overrides)";
    return quoted_for_message(written) + " is an address: the egress proxy allows hosts by name, and an address "
           "only through \"public\"";
  }
  if (h.kind != egress::Host::kName)
    return quoted_for_message(written) + " is not a host name the egress proxy takes (labels of 1 to 63 letters, "
           "digits, '-' or '_', neither beginning nor ending with '-')";
  if (names_loopback(h.name))
    return quoted_for_message(written) + " is this host's loopback (RFC 6761): the egress proxy would refuse every "
           "connection to it";
  return "";
}

// A DNS name, or "*." and one (any name below it). Addresses are not
// names: "public" is what reaches them.
bool egress_host_pattern(std::string_view h) {
  if (h.starts_with("*.")) h.remove_prefix(2);
  if (h.empty() || h.size() > 253 || h.front() == '.' || h.back() == '.' || h.find("..") != std::string_view::npos)
    return false;
  const std::size_t last = h.rfind('.');
  if (std::isdigit(static_cast<unsigned char>(h[last == std::string_view::npos ? 0 : last + 1]))) return false;
  return std::all_of(h.begin(), h.end(), [](char c) {
    return std::islower(static_cast<unsigned char>(c)) || std::isdigit(static_cast<unsigned char>(c)) || c == '-' ||
           c == '.' || c == '_';
  });
}

Status parse_egress(ObjectReader o, EgressRules& e) {
  TSB_TRY(o.object("\"egress\""), "egress");
  if (const json* allow = o.get("allow")) {
    if (!allow->is_array()) return o.error("allow", "must be an array of {\"hosts\", \"ports\"}");
    for (std::size_t i = 0; i < allow->size(); ++i) {
      ObjectReader r(o.doc(), (*allow)[i], json_pointer_append(o.pointer("allow"), i));
      TSB_TRY(r.object("an allow rule"), "egress");
      EgressRules::Rule rule;
      auto hosts = r.strings("hosts", "host names");
      if (!hosts.ok()) return std::move(hosts).error();
      if (hosts->empty()) return r.error("hosts", "is required: the host names this rule allows");
      for (const auto& h : *hosts) {
        if (std::string why = egress_refusal(h); !why.empty()) return r.error("hosts", why);
        if (!egress_host_pattern(h))
          return r.error("hosts", "not a lower-case host name or \"*.\" and one: " + quoted_for_message(h));
      }
      rule.hosts = std::move(hosts).value();
      TSB_TRY(parse_ports(r, "ports", rule.ports), "egress");
      TSB_TRY(r.done(), "egress");
      e.allow.push_back(std::move(rule));
    }
  }
  if (const json* pub = o.get("public")) {
    ObjectReader r(o.doc(), *pub, o.pointer("public"));
    TSB_TRY(r.object("\"public\""), "egress");
    TSB_TRY(parse_ports(r, "ports", e.public_ports), "egress");
    TSB_TRY(r.done(), "egress");
  }
  auto conns = o.number("max_connections", e.max_connections, 1, 4096);
  if (!conns.ok()) return std::move(conns).error();
  e.max_connections = static_cast<std::uint32_t>(*conns);
  if (const json* b = o.get("max_bytes")) {
    auto s = parse_size(*b);
    if (!s.ok() || *s < 4096) return o.error("max_bytes", "must be a size of at least 4KiB, like \"100MiB\"");
    e.max_bytes = *s;
  }
  return o.done();
}

json egress_json(const EgressRules& e) {
  json allow = json::array();
  for (const auto& r : e.allow) allow.push_back({{"hosts", r.hosts}, {"ports", r.ports}});
  return {{"allow", allow},
          {"public", e.public_ports.empty() ? json() : json{{"ports", e.public_ports}}},
          {"max_connections", e.max_connections},
          {"max_bytes", format_size(e.max_bytes)}};
}

// "index": "http(s)://host[:port]/path" (package_source_url).
Status parse_index_url(const std::string& url, PackagesPolicy& k) {
  std::string host;
  std::uint16_t port = 0;
  if (auto st = package_source_url(url, "index", "use \"wheels\"", host, port); !st.ok()) return st;
  k.index = url;
  k.index_host = std::move(host);
  k.index_port = port;
  return {};
}

Status parse_packages(ObjectReader o, PackagesPolicy& k) {
  TSB_TRY(o.object("\"packages\""), "packages");
  k.enabled = true;
  auto allow = o.strings("allow", "name patterns");
  if (!allow.ok()) return std::move(allow).error();
  if (!o.get("allow"))
    return o.error("allow", "is required: the project names (fnmatch patterns, like \"requests\" or \"types-*\") "
                            "a tool may ask for; [\"*\"] allows any");
  for (const std::string& a : *allow)
    if (a.empty() || a.size() > 100 || a.find_first_of(" \t/\\") != std::string::npos)
      return o.error("allow", "not a name pattern: " + quoted_for_message(a));
  k.allow = std::move(allow).value();
  auto max = o.number("max_requirements", k.max_requirements, 1, 64);
  if (!max.ok()) return std::move(max).error();
  k.max_requirements = static_cast<std::uint32_t>(*max);
  // null: not given (so a policy can replace an included file's source).
  const json* wheels = o.get("wheels");
  const json* index = o.get("index");
  if (wheels && wheels->is_null()) wheels = nullptr;
  if (index && index->is_null()) index = nullptr;
  if ((wheels != nullptr) == (index != nullptr))
    return Error::invalid(o.where("") + ": give exactly one of \"wheels\" (a host directory of wheels; builds have "
                                        "no network) or \"index\" (a package index URL; builds reach only it)");
  if (wheels) {
    if (!wheels->is_string()) return o.error("wheels", "must be an absolute host path");
    k.wheels = wheels->get<std::string>();
    // Shown read-only to this policy's builds only, never to a tool run:
    // not a bind, so the bind allow-list does not apply.
    auto st = isolate::check_sandbox_path(k.wheels, "wheels");
    if (!st.ok() || k.wheels == "/") return o.error("wheels", "must be an absolute, normalised host path (not /)");
  } else {
    if (!index->is_string()) return o.error("index", "must be a URL");
    if (auto st = parse_index_url(index->get<std::string>(), k); !st.ok()) return o.error("index", st.error().message);
    auto hosts = o.strings("index_hosts", "host names");
    if (!hosts.ok()) return std::move(hosts).error();
    for (const auto& h : *hosts) {
      if (std::string why = egress_refusal(h); !why.empty())
        return o.error("index_hosts", "the build reaches these hosts through the egress proxy, and " + why);
      if (h.starts_with("*.") || !egress_host_pattern(h))
        return o.error("index_hosts", "not a lower-case host name: " + quoted_for_message(h));
    }
    k.index_hosts = std::move(hosts).value();
  }
  if (const json* h = o.get("index_hosts"); !index && h && !(h->is_array() && h->empty()))
    return o.error("index_hosts", "applies to \"index\" only");
  auto src = o.boolean("source_builds", false);
  if (!src.ok()) return std::move(src).error();
  k.source_builds = *src;
  // context: the reader names file:line:col and the key
  if (auto st = parse_build_limits(o, "packages", "venv_size", "2GiB", k.build_timeout, k.build_memory, k.venv_size);
      !st.ok())
    return st;
  return o.done();
}

// A path of the TypeScript runtime: absolute, normalised, below /usr (the
// sandbox's /usr is the host's, read-only, so the path is the same in both).
Status typescript_path(ObjectReader& o, const char* key, std::string& out) {
  const json* v = o.get(key);
  if (!v) return {};
  if (!v->is_string()) return o.error(key, "must be a path below /usr");
  const std::string path = v->get<std::string>();
  if (!isolate::check_sandbox_path(path, key).ok() || !path.starts_with("/usr/"))
    return o.error(key, "must be an absolute, normalised path below /usr (the sandbox has the host's /usr, read-only): " +
                            quoted_for_message(path));
  out = path;
  return {};
}

Status parse_typescript(ObjectReader o, TypeScriptPolicy& t, NpmPackagesPolicy& npm) {
  TSB_TRY(o.object("\"typescript\""), "typescript");
  t.enabled = true;
  // context: each step's message begins with its place in the document
  if (auto st = typescript_path(o, "node", t.node); !st.ok()) return st;
  if (const json* v = o.get("strip_types")) {
    if (!v->is_string() || (*v != "esbuild" && *v != "typescript"))
      return o.error("strip_types", "must be \"esbuild\" (Debian's esbuild) or \"typescript\" (node-typescript)");
    t.strip_types = v->get<std::string>();
  }
  // context: each step's message begins with its place in the document
  if (auto st = typescript_path(o, "esbuild", t.esbuild); !st.ok()) return st;
  // context: each step's message begins with its place in the document
  if (auto st = typescript_path(o, "typescript_module", t.typescript); !st.ok()) return st;
  if (const json* k = o.get("packages"); k && !k->is_null())
    TSB_TRY(parse_npm_packages(ObjectReader(o.doc(), *k, "/typescript/packages"), npm), "policy");
  return o.done();
}

// "numpy", "email.mime.text": ASCII identifiers joined by dots, at most
// 128 bytes (they become the warm runner's arguments).
bool python_module_name(std::string_view m) {
  if (m.empty() || m.size() > 128) return false;
  for (std::size_t start = 0;;) {
    const std::size_t end = std::min(m.find('.', start), m.size());
    const std::string_view part = m.substr(start, end - start);
    if (part.empty() || std::isdigit(static_cast<unsigned char>(part[0])) ||
        !std::all_of(part.begin(), part.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }))
      return false;
    if (end == m.size()) return true;
    start = end + 1;
  }
}

Status parse_warm_pool(ObjectReader o, WarmPool& w) {
  TSB_TRY(o.object("\"warm_pool\""), "warm_pool");
  auto max = o.number("max", 0, 0, 64);
  if (!max.ok()) return std::move(max).error();
  auto min = o.number("min", 0, 0, *max);
  if (!min.ok()) return std::move(min).error();
  w.max = static_cast<std::uint32_t>(*max);
  w.min = static_cast<std::uint32_t>(*min);
  if (const json* v = o.get("idle")) {
    auto d = parse_duration(*v);
    if (!d.ok() || d->count() < 1000 || d->count() > 86'400'000)
      return o.error("idle", "must be a duration from 1s to 24h, like \"300s\"");
    w.idle = *d;
  }
  if (o.get("preload")) {
    auto mods = o.strings("preload", "module names");
    if (!mods.ok()) return std::move(mods).error();
    if (mods->size() > 64) return o.error("preload", "names more than 64 modules");
    for (const auto& m : *mods) {
      if (!python_module_name(m)) return o.error("preload", "not a dotted Python module name: " + quoted_for_message(m));
      if (std::count(mods->begin(), mods->end(), m) > 1) return o.error("preload", "names " + m + " twice");
    }
    w.preload = w.tool_preload = std::move(mods).value();
  }
  return o.done();
}

json packages_json(const PackagesPolicy& k) {
  return {{"allow", k.allow},
          {"max_requirements", k.max_requirements},
          {"wheels", k.wheels.empty() ? json() : json(k.wheels)},
          {"index", k.index.empty() ? json() : json(k.index)},
          {"index_hosts", k.index_hosts},
          {"source_builds", k.source_builds},
          {"build",
           {{"wall_timeout", format_duration(k.build_timeout)},
            {"memory", format_size(k.build_memory)},
            {"venv_size", format_size(k.venv_size)}}}};
}

Status parse_limits(ObjectReader o, const LocatedJson& doc, isolate::Limits& lim, std::uint64_t& result_bytes) {
  TSB_TRY(o.object("\"limits\""), "limits");
  auto dur = [&](const char* key, std::chrono::milliseconds& out, bool allow_zero) -> Status {
    if (const json* v = o.get(key)) {
      auto d = parse_duration(*v);
      if (!d.ok()) return Error::invalid(o.where(key) + ": " + d.error().message);
      if (!allow_zero && d->count() == 0) return Error::invalid(o.where(key) + ": must be greater than zero");
      out = *d;
    }
    return {};
  };
  auto size = [&](const char* key, std::uint64_t& out, std::uint64_t min) -> Status {
    if (const json* v = o.get(key)) {
      auto s = parse_size(*v);
      if (!s.ok()) return Error::invalid(o.where(key) + ": " + s.error().message);
      if (*s < min) return Error::invalid(o.where(key) + ": must be at least " + format_size(min));
      out = *s;
    }
    return {};
  };
  auto count = [&](const char* key, std::uint64_t& out, std::uint64_t min, std::uint64_t max) -> Status {
    if (const json* v = o.get(key)) {
      if (!v->is_number_integer() || v->get<std::int64_t>() < 0)
        return Error::invalid(o.where(key) + ": must be a whole number");
      auto n = v->get<std::uint64_t>();
      if (n < min || n > max)
        return Error::invalid(o.where(key) + ": must be between " + std::to_string(min) + " and " + std::to_string(max));
      out = n;
    }
    return {};
  };
  TSB_TRY(dur("wall_timeout", lim.wall_timeout, false), "limits");
  TSB_TRY(dur("cpu_time", lim.cpu_time, true), "limits");
  TSB_TRY(size("memory", lim.memory_bytes, 16ull << 20), "limits");
  TSB_TRY(count("pids", lim.pids, 2, 1u << 22), "limits");
  if (const json* v = o.get("cpus")) {
    if (!v->is_number() || v->get<double>() < 0.01 || v->get<double>() > 1024)
      return Error::invalid(o.where("cpus") + ": must be a number of CPUs between 0.01 and 1024");
    lim.cpu_quota_millicpus = static_cast<std::uint32_t>(v->get<double>() * 1000 + 0.5);
  }
  TSB_TRY(size("tmp_size", lim.tmp_bytes, 1ull << 20), "limits");
  TSB_TRY(size("work_size", lim.work_bytes, 1ull << 20), "limits");
  TSB_TRY(size("stdout", lim.stdout_bytes, 1024), "limits");
  TSB_TRY(size("stderr", lim.stderr_bytes, 1024), "limits");
  TSB_TRY(size("result", result_bytes, 1024), "limits");
  if (result_bytes > (1ull << 30)) return Error::invalid(o.where("result") + ": must be at most 1GiB");
  TSB_TRY(size("file_size", lim.file_size_bytes, 1024), "limits");
  TSB_TRY(count("open_files", lim.open_files, 16, 1u << 20), "limits");
  (void)doc;
  return o.done();
}

json limits_json(const isolate::Limits& l, std::uint64_t result_bytes) {
  return json{{"wall_timeout", format_duration(l.wall_timeout)},
              {"cpu_time", format_duration(l.cpu_time)},
              {"memory", format_size(l.memory_bytes)},
              {"pids", l.pids},
              {"cpus", l.cpu_quota_millicpus / 1000.0},
              {"tmp_size", format_size(l.tmp_bytes)},
              {"work_size", format_size(l.work_bytes)},
              {"stdout", format_size(l.stdout_bytes)},
              {"stderr", format_size(l.stderr_bytes)},
              {"result", format_size(result_bytes)},
              {"file_size", format_size(l.file_size_bytes)},
              {"open_files", l.open_files}};
}

// A variable name: a letter or '_', then letters, digits and '_', at most
// 256 bytes. The root spawner checks the same rule again on every run
// (daemon/wire/compiled.h, spawn::valid_env_name; a unit test holds the
// two together).
bool valid_env_name(std::string_view n) {
  if (n.empty() || n.size() > 256 || std::isdigit(static_cast<unsigned char>(n[0]))) return false;
  return std::all_of(n.begin(), n.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; });
}

// "default" for "/etc/toolsandboxd/policies/default.json" or "embedded:default.json".
std::string policy_stem(const std::string& path) {
  std::string stem = path.substr(path.rfind('/') == std::string::npos ? (is_embedded(path) ? std::strlen(kEmbedded) : 0)
                                                                       : path.rfind('/') + 1);
  if (stem.size() > 5 && stem.compare(stem.size() - 5, 5, ".json") == 0) stem.resize(stem.size() - 5);
  return stem;
}

// A file the loader read: its parsed document, its text and its path.
struct SourceFile {
  const LocatedJson* doc;
  std::string_view text;
  std::string path;
};

// Byte offset of a 1-based line:col (columns count code points, as in
// daemon/policy/jsonc.h), or npos.
std::size_t offset_of(std::string_view text, JsonLocation at) {
  int line = 1, col = 1;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    const bool starts_char = (c & 0xC0) != 0x80;
    if (starts_char && line == at.line && col == at.col) return i;
    if (c == '\n') {
      ++line;
      col = 1;
    } else if (starts_char) {
      ++col;
    }
  }
  return std::string::npos;
}

// The text of the object or array at `pointer` in `doc`, with everything
// before it blanked to spaces (newlines kept) and everything after it cut,
// so parsing it alone reports the same line:col as the whole file would.
// "" when the value is not an object or array, or its position is unknown.
std::string value_text_in_place(std::string_view text, const LocatedJson& doc, const std::string& pointer) {
  const auto loc = doc.locations.find(pointer);
  if (loc == doc.locations.end()) return {};
  const std::size_t begin = offset_of(text, loc->second);
  if (begin == std::string::npos || (text[begin] != '{' && text[begin] != '[')) return {};
  // The document parsed, so brackets balance outside strings and comments.
  std::size_t i = begin;
  int depth = 0;
  while (i < text.size()) {
    const char c = text[i];
    if (c == '"') {
      for (++i; i < text.size() && text[i] != '"'; ++i)
        if (text[i] == '\\') ++i;
    } else if (c == '/' && i + 1 < text.size() && text[i + 1] == '/') {
      while (i < text.size() && text[i] != '\n') ++i;
      continue;
    } else if (c == '/' && i + 1 < text.size() && text[i + 1] == '*') {
      i = text.find("*/", i + 2);
      if (i == std::string_view::npos) return {};
      ++i;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if (c == '}' || c == ']') {
      if (--depth == 0) break;
    }
    ++i;
  }
  if (depth != 0 || i >= text.size()) return {};
  std::string out;
  out.reserve(i + 1);
  for (std::size_t k = 0; k < begin; ++k) {
    const auto c = static_cast<unsigned char>(text[k]);
    if (c == '\n') out += '\n';
    else if ((c & 0xC0) != 0x80) out += ' ';  // one column per code point
  }
  out.append(text.substr(begin, i + 1 - begin));
  return out;
}

// The syscalls the engine itself makes under the tool's filter, which is
// loaded just before execve (isolate/init/tool.cc): execve starts the tool,
// write reports a failed start on the report pipe, exit_group ends it; read
// and exit are what any program needs next. A profile that refuses one of
// them, even for some arguments only, cannot run a tool, so it is a load
// error rather than a run that fails at its first step. execveat is not
// used by the engine and may be refused.
constexpr const char* kEngineSyscalls[] = {"execve", "exit", "exit_group", "read", "write"};

Status check_engine_syscalls(const policy::SeccompProfile& prof, const std::string& default_at) {
  using policy::SeccompAction;
  const auto allows = [](SeccompAction a) { return a == SeccompAction::Allow || a == SeccompAction::Log; };
  for (const char* name : kEngineSyscalls) {
    const policy::SeccompRule* unconditional = nullptr;
    const policy::SeccompRule* conditional = nullptr;
    for (const auto& rule : prof.rules) {
      if (std::find(rule.names.begin(), rule.names.end(), name) == rule.names.end()) continue;
      if (rule.args.empty()) unconditional = &rule;
      else if (!conditional) conditional = &rule;
    }
    std::string why;
    std::string where = default_at;
    if (unconditional) {
      if (allows(unconditional->action)) continue;
      where = unconditional->where;
      why = "refuses \"" + std::string(name) + "\" (" +
            policy::seccomp_action_name(unconditional->action, unconditional->errno_ret) + ")";
    } else if (conditional) {
      where = conditional->where;
      why = "allows \"" + std::string(name) + "\" only for some arguments";
    } else if (allows(prof.default_action)) {
      continue;
    } else {
      why = "refuses \"" + std::string(name) + "\" by its default action (" +
            policy::seccomp_action_name(prof.default_action, prof.default_errno) + ")";
    }
    return Error::invalid(where + ": the profile " + why +
                          "; toolsandboxd needs execve, exit, exit_group, read and write allowed for every "
                          "argument to start a tool, report a failed start and end it");
  }
  return {};
}

// Each step below reads one part of a policy document through `root`, in
// the order parse_document calls them. The order is part of the messages:
// an unknown key lists the keys asked for so far ("known here: ..."), and
// a step may rely on what an earlier one set (packages on the backend and
// the venv). Every error a step returns is final (its location and the
// "policy" context already in it); parse_document passes it on as it is.

// "version" (required, 1), "include" (the loader's), "description" and
// "backend".
Status read_header(ObjectReader& root, const LocatedJson& doc, Policy& p) {
  const json* version = root.get("version");
  TSB_TRY(expect(version && version->is_number_unsigned() && version->get<std::uint64_t>() == 1,
                 version ? doc.where("/version") : doc.where(""), "\"version\": 1 is required (the only version)"), "policy");
  (void)root.get("include");  // consumed by the loader
  if (const json* v = root.get("description")) {
    TSB_TRY(expect(v->is_string(), root.where("description"), "must be a string"), "policy");
    p.description = v->get<std::string>();
  }
  if (const json* v = root.get("backend")) {
    TSB_TRY(expect(v->is_string() && (*v == "local" || *v == "e2b"), root.where("backend"),
                   "must be \"local\" or \"e2b\""), "policy");
    p.backend = *v == "e2b" ? Backend::E2B : Backend::Local;
  }
  return {};
}

// "filesystem"/"workdir": a sandbox path that is none of the directories
// the sandbox is built from, which a tmpfs there would hide.
Status read_workdir(ObjectReader& fs, Policy& p) {
  const json* wd = fs.get("workdir");
  if (!wd) return {};
  TSB_TRY(expect(wd->is_string(), fs.where("workdir"), "must be a string"), "policy");
  auto st = isolate::check_sandbox_path(wd->get<std::string>(), "workdir");
  if (!st.ok()) return Error::invalid(fs.where("workdir") + ": " + st.error().message);
  p.workdir = wd->get<std::string>();
  static const char* kReserved[] = {"/", "/usr", "/etc", "/proc", "/dev", "/tmp", "/venv", "/bin", "/lib", "/lib64", "/sbin"};
  for (const char* r : kReserved)
    TSB_TRY(expect(p.workdir != r, fs.where("workdir"), std::string("cannot be ") + r), "policy");
  return {};
}

// One entry of "filesystem"/"binds": both paths checked, the target over
// none of the sandbox's own trees, and the source inside this daemon's
// bind allow-list (the operator's, not the policy author's, decision).
Result<isolate::BindMount> read_bind(const LocatedJson& doc, const json& value, std::size_t i, const PolicyContext& ctx) {
  std::string bp = json_pointer_append("/filesystem/binds", i);
  ObjectReader b(doc, value, bp);
  TSB_TRY(b.object("a bind"), "policy");
  isolate::BindMount m;
  const json* src = b.get("source");
  const json* dst = b.get("target");
  TSB_TRY(expect(src && src->is_string() && !src->get<std::string>().empty() && src->get<std::string>()[0] == '/',
                 src ? b.where("source") : doc.where(bp), "\"source\" must be an absolute host path"), "policy");
  TSB_TRY(expect(dst && dst->is_string(), dst ? b.where("target") : doc.where(bp),
                 "\"target\" must be an absolute path inside the sandbox"), "policy");
  m.source = src->get<std::string>();
  m.target = dst->get<std::string>();
  auto st = isolate::check_sandbox_path(m.target, "target");
  if (!st.ok()) return Error::invalid(b.where("target") + ": " + st.error().message);
  auto st2 = isolate::check_sandbox_path(m.source, "source");
  if (!st2.ok()) return Error::invalid(b.where("source") + ": " + st2.error().message);
  for (const char* r : {"/", "/proc", "/dev", "/etc", "/usr"})
    TSB_TRY(expect(m.target != r, b.where("target"), std::string("cannot bind over ") + r), "policy");
  if (const json* w = b.get("writable")) {
    TSB_TRY(expect(w->is_boolean(), b.where("writable"), "must be true or false"), "policy");
    m.writable = w->get<bool>();
  }
  if (const json* o = b.get("optional")) {
    TSB_TRY(expect(o->is_boolean(), b.where("optional"), "must be true or false"), "policy");
    m.optional = o->get<bool>();
  }
  TSB_TRY(b.done(), "policy");
  bool allowed = std::any_of(ctx.bind_allowlist.begin(), ctx.bind_allowlist.end(),
                             [&](const std::string& pre) { return path_under(m.source, pre); });
  TSB_TRY(expect(allowed, b.where("source"),
                 "bind source " + quoted_for_message(m.source) +
                     " is outside the bind allow-list of this daemon (bind_allowlist in its configuration)"),
          "policy");
  return m;
}

// "filesystem": the host venv (the shipped one unless the policy names
// another, or null for none), the working directory and the binds.
Status read_filesystem(ObjectReader& root, const LocatedJson& doc, const PolicyContext& ctx, Policy& p) {
  p.venv = "/var/lib/toolsandbox/venv";
  const json* v = root.get("filesystem");
  if (!v) return {};
  ObjectReader fs(doc, *v, "/filesystem");
  TSB_TRY(fs.object("\"filesystem\""), "policy");
  if (const json* venv = fs.get("venv")) {
    TSB_TRY(expect(venv->is_null() || (venv->is_string() && !venv->get<std::string>().empty() &&
                                       venv->get<std::string>()[0] == '/'),
                   fs.where("venv"), "must be an absolute host path, or null for no venv"), "policy");
    p.venv = venv->is_null() ? "" : venv->get<std::string>();
  }
  if (auto st = read_workdir(fs, p); !st.ok()) return std::move(st).error();
  if (const json* binds = fs.get("binds")) {
    TSB_TRY(expect(binds->is_array(), fs.where("binds"), "must be an array"), "policy");
    for (std::size_t i = 0; i < binds->size(); ++i) {
      auto m = read_bind(doc, (*binds)[i], i, ctx);
      if (!m.ok()) return std::move(m).error();
      p.binds.push_back(std::move(m).value());
    }
    // A writable bind is shared by every run of the policy: what a tool
    // leaves there, the next run meets. A host path the sandbox is built
    // from must not lie inside one, or a tool could put a link or a FIFO in
    // its place and make every later run fail or block. (The bind's own
    // directory, its mount's root, a tool cannot replace.)
    for (std::size_t i = 0; i < p.binds.size(); ++i) {
      const isolate::BindMount& w = p.binds[i];
      if (!w.writable) continue;
      auto inside = [&](const std::string& host) { return host != w.source && path_under(host, w.source); };
      for (std::size_t j = 0; j < p.binds.size(); ++j)
        if (j != i && inside(p.binds[j].source))
          return Error::invalid(doc.where(json_pointer_append("/filesystem/binds", j)) + ": bind source " +
                                quoted_for_message(p.binds[j].source) + " lies inside the writable bind " +
                                quoted_for_message(w.source) + ", which a tool could change for every later run");
      if (!p.venv.empty() && inside(p.venv))
        return Error::invalid(fs.where("venv") + ": the venv " + quoted_for_message(p.venv) +
                              " lies inside the writable bind " + quoted_for_message(w.source) +
                              ", which a tool could change for every later run");
    }
  }
  TSB_TRY(fs.done(), "policy");
  return {};
}

// "network", then "egress", whose rules only network "egress" may have.
Status read_network(ObjectReader& root, const LocatedJson& doc, Policy& p) {
  if (const json* v = root.get("network")) {
    TSB_TRY(expect(v->is_string() && (*v == "none" || *v == "egress" || *v == "host"), root.where("network"),
                   "must be \"none\", \"egress\" or \"host\""), "policy");
    p.network = *v == "host" ? isolate::NetworkMode::Host : *v == "egress" ? isolate::NetworkMode::Egress
                                                                          : isolate::NetworkMode::None;
  }
  if (const json* v = root.get("egress")) {
    TSB_TRY(expect(p.network == isolate::NetworkMode::Egress, root.where("egress"),
                   "applies to \"network\": \"egress\" only"), "policy");
    TSB_TRY(parse_egress(ObjectReader(doc, *v, "/egress"), p.egress), "policy");
  }
  // A policy that always runs on E2B: its network as E2B takes it, or
  // refused now, not at its first run (daemon/policy/e2b_network.h).
  if (p.backend == Backend::E2B) {
    const E2BNetwork n = e2b_network(p);
    TSB_TRY(expect(n.refusal.empty(), doc.where(n.refused_at), "backend \"e2b\": " + n.refusal), "policy");
  }
  return {};
}

// "packages" (null: none, so a policy can drop an included file's): local
// backend only, and only with a host venv, whose place a tool's own venv
// takes.
Status read_packages(ObjectReader& root, const LocatedJson& doc, Policy& p) {
  const json* v = root.get("packages");
  if (!v || v->is_null()) return {};
  TSB_TRY(parse_packages(ObjectReader(doc, *v, "/packages"), p.packages), "policy");
  TSB_TRY(expect(p.backend == Backend::Local, root.where("packages"),
                 "applies to the local backend (E2B installs a run's requirements in its sandbox)"), "policy");
  TSB_TRY(expect(!p.venv.empty(), root.where("packages"),
                 "needs \"filesystem\": {\"venv\"}: a tool's own venv takes its place at /venv"), "policy");
  return {};
}

// "typescript" (null: none): the local backend's Node runtime, and its
// "packages", a TypeScript tool's own node_modules (npm_packages.h).
Status read_typescript(ObjectReader& root, const LocatedJson& doc, Policy& p) {
  const json* v = root.get("typescript");
  if (!v || v->is_null()) return {};
  TSB_TRY(parse_typescript(ObjectReader(doc, *v, "/typescript"), p.typescript, p.npm_packages), "policy");
  TSB_TRY(expect(p.backend == Backend::Local, root.where("typescript"),
                 "applies to the local backend (E2B runs TypeScript in its own kernel)"), "policy");
  return {};
}

// "sessions" (null: none): long-lived sandboxes of the local backend.
Status read_sessions(ObjectReader& root, const LocatedJson& doc, Policy& p) {
  const json* v = root.get("sessions");
  if (!v || v->is_null()) return {};
  TSB_TRY(parse_sessions(ObjectReader(doc, *v, "/sessions"), p.sessions), "policy");
  TSB_TRY(expect(p.backend == Backend::Local, root.where("sessions"),
                 "applies to the local backend (sessions run on this host)"), "policy");
  return {};
}

// "warm_pool" (null: none): a pool with a size is for the local backend.
Status read_warm_pool(ObjectReader& root, const LocatedJson& doc, Policy& p) {
  const json* v = root.get("warm_pool");
  if (!v || v->is_null()) return {};
  TSB_TRY(parse_warm_pool(ObjectReader(doc, *v, "/warm_pool"), p.warm), "policy");
  TSB_TRY(expect(p.backend == Backend::Local || p.warm.max == 0, root.where("warm_pool"),
                 "applies to the local backend (E2B makes its own sandboxes)"), "policy");
  return {};
}

// "environment"/"set": variables the policy fixes, valid names and
// strings without NUL (they become execve's environment).
Status read_env_set(ObjectReader& env, const LocatedJson& doc, Policy& p) {
  const json* set = env.get("set");
  if (!set) return {};
  TSB_TRY(expect(set->is_object(), env.where("set"), "must be an object of NAME: value"), "policy");
  for (auto it = set->begin(); it != set->end(); ++it) {
    std::string kp = json_pointer_append("/environment/set", it.key());
    TSB_TRY(expect(valid_env_name(it.key()), doc.where_key(kp), "not a valid variable name: " + quoted_for_message(it.key())), "policy");
    TSB_TRY(expect(it->is_string(), doc.where(kp), "must be a string"), "policy");
    TSB_TRY(expect(it->get<std::string>().find('\0') == std::string::npos, doc.where(kp), "must not contain NUL"), "policy");
    p.env_set[it.key()] = it->get<std::string>();
  }
  return {};
}

// "environment"/"allow": the names a request may set: a name, a PREFIX_*
// pattern or "*".
Status read_env_allow(ObjectReader& env, const LocatedJson& doc, Policy& p) {
  const json* allow = env.get("allow");
  if (!allow) return {};
  TSB_TRY(expect(allow->is_array(), env.where("allow"), "must be an array of names"), "policy");
  for (std::size_t i = 0; i < allow->size(); ++i) {
    std::string ap = json_pointer_append("/environment/allow", i);
    const json& a = (*allow)[i];
    TSB_TRY(expect(a.is_string(), doc.where(ap), "must be a string"), "policy");
    std::string name = a.get<std::string>();
    std::string base = (!name.empty() && name.back() == '*') ? name.substr(0, name.size() - 1) : name;
    TSB_TRY(expect(name == "*" || (!base.empty() && valid_env_name(base)), doc.where(ap),
                   "must be a variable name, a PREFIX_* pattern, or \"*\": " + quoted_for_message(name)),
            "policy");
    p.env_allow.push_back(name);
  }
  return {};
}

// "environment": what the policy fixes ("set"), then what a request may
// add ("allow").
Status read_environment(ObjectReader& root, const LocatedJson& doc, Policy& p) {
  const json* v = root.get("environment");
  if (!v) return {};
  ObjectReader env(doc, *v, "/environment");
  TSB_TRY(env.object("\"environment\""), "policy");
  if (auto st = read_env_set(env, doc, p); !st.ok()) return std::move(st).error();
  if (auto st = read_env_allow(env, doc, p); !st.ok()) return std::move(st).error();
  TSB_TRY(env.done(), "policy");
  return {};
}

// Egress: every run finds the proxy through the standard variables, which
// the mode fixes (a request cannot change them); the sandbox's own
// localhost is reached directly.
Status set_egress_proxy_variables(const LocatedJson& doc, Policy& p) {
  if (p.network != isolate::NetworkMode::Egress) return {};
  const std::string url = "http://127.0.0.1:" + std::to_string(isolate::kEgressProxyPort);
  for (const char* name : kEgressProxyVariables) {
    const bool no_proxy = std::string_view(name) == "NO_PROXY" || std::string_view(name) == "no_proxy";
    TSB_TRY(expect(!p.env_set.contains(name), doc.where_key(json_pointer_append("/environment/set", name)),
                   std::string(name) + " is set by network \"egress\" (to the daemon's proxy)"),
            "policy");
    p.env_set[name] = no_proxy ? "localhost,127.0.0.1,::1" : url;
  }
  return {};
}

// Which seccomp profile a policy chose, before it is read: a file
// (relative to the directory of the file that names it), inline rules, or
// by default the shipped default profile.
struct SeccompChoice {
  std::string profile_path = "seccomp/default.json";
  std::string profile_dir;
  const json* inline_profile = nullptr;
  std::string where_profile;   // where a message about the profile points
  bool from_default_dir = true;  // no "profile" named: the default's fallback applies
};

// "seccomp": exactly one of "profile" and "inline", or neither.
Result<SeccompChoice> choose_seccomp(ObjectReader& root, const LocatedJson& doc, const std::string& path,
                                     const SourceFile& seccomp_file) {
  const LocatedJson& sdoc = *seccomp_file.doc;
  SeccompChoice c;
  c.profile_dir = dir_of(path);
  c.where_profile = doc.where("");
  const json* v = root.get("seccomp");
  if (!v) return c;
  ObjectReader sc(sdoc, *v, "/seccomp");
  TSB_TRY(sc.object("\"seccomp\""), "policy");
  const json* prof = sc.get("profile");
  c.inline_profile = sc.get("inline");
  TSB_TRY(sc.done(), "policy");
  TSB_TRY(expect((prof != nullptr) != (c.inline_profile != nullptr), sdoc.where("/seccomp"),
                 "give exactly one of \"profile\" (a file) or \"inline\" (rules)"), "policy");
  if (prof) {
    TSB_TRY(expect(prof->is_string() && !prof->get<std::string>().empty(), sc.where("profile"), "must be a path"), "policy");
    c.profile_path = prof->get<std::string>();
    c.profile_dir = dir_of(seccomp_file.path);
    c.where_profile = sc.where("profile");
    c.from_default_dir = false;
  } else {
    TSB_TRY(expect(c.inline_profile->is_object(), sc.where("inline"), "must be an object (a seccomp profile)"), "policy");
    c.where_profile = sc.where("inline");
  }
  return c;
}

// A profile as read, with its part of the canonical policy and where its
// defaultAction is written ("" when unknown).
struct ReadProfile {
  Result<policy::SeccompProfile> profile = Error::invalid("unset");
  json canon;
  std::string default_action_at;
};

// Inline rules are parsed from the policy file's own text, so every
// diagnostic and rule position points at the line the author wrote.
ReadProfile read_inline_profile(const SeccompChoice& c, const SourceFile& seccomp_file, Policy& p) {
  const LocatedJson& sdoc = *seccomp_file.doc;
  ReadProfile r;
  p.seccomp_source = seccomp_file.path + "#/seccomp/inline";
  std::string text = value_text_in_place(seccomp_file.text, sdoc, "/seccomp/inline");
  r.profile = text.empty() ? policy::parse_seccomp_profile(c.inline_profile->dump(), p.seccomp_source)
                           : policy::parse_seccomp_profile(text, seccomp_file.path);
  r.canon = json{{"inline", *c.inline_profile}};
  r.default_action_at = sdoc.where("/seccomp/inline/defaultAction");
  return r;
}

// A profile file. A policy with no "seccomp" key gets the default profile
// that ships with the policies it came with, else the embedded one. Only
// a missing file falls back: one that exists but is refused (owner, mode)
// or unreadable is an error, never silently replaced.
Result<ReadProfile> read_profile_file(const SeccompChoice& c, const PolicyContext& ctx, Policy& p) {
  ReadProfile r;
  std::string full = join(c.profile_dir, c.profile_path);
  auto text = read_policy_text(full, ctx.files);
  if (!text.ok() && c.from_default_dir && text.error().code == ENOENT) {
    full = std::string(kEmbedded) + c.profile_path;
    text = read_policy_text(full, ctx.files);
  }
  if (!text.ok()) return Error::invalid(c.where_profile + ": seccomp profile: " + text.error().message, text.error().code);
  p.seccomp_source = full;
  // One parse: the profile, and its document for the canonical policy.
  auto located = parse_jsonc(*text, full);
  if (!located.ok()) {
    r.profile = std::move(located).error();
    return r;
  }
  r.profile = policy::parse_seccomp_profile(*located);
  r.default_action_at = located->where("/defaultAction");
  r.canon = json::object();
  r.canon["profile"] = std::move(located->value);  // moved, not copied: a profile is tens of kilobytes
  return r;
}

// Seccomp: a profile file or inline rules; missing means the shipped
// default profile, never no filter. The profile must let the engine start
// a tool, and is compiled when the context asks. Returns the profile's
// part of the canonical policy.
Result<json> read_seccomp(ObjectReader& root, const LocatedJson& doc, const std::string& path, const PolicyContext& ctx,
                          const SourceFile& seccomp_file, Policy& p) {
  auto choice = choose_seccomp(root, doc, path, seccomp_file);
  if (!choice.ok()) return std::move(choice).error();
  Result<ReadProfile> read = choice->inline_profile ? Result<ReadProfile>(read_inline_profile(*choice, seccomp_file, p))
                                                    : read_profile_file(*choice, ctx, p);
  if (!read.ok()) return std::move(read).error();
  Result<policy::SeccompProfile>& prof = read->profile;
  if (!prof.ok()) return std::move(prof).error().wrap("policy " + path + ": seccomp");
  TSB_TRY(check_engine_syscalls(*prof, read->default_action_at.empty() ? choice->where_profile : read->default_action_at),
          "policy " + path + ": seccomp");
  p.seccomp_profile = std::make_shared<policy::SeccompProfile>(std::move(prof).value());
  if (ctx.compile) {
    auto prog = policy::compile_seccomp(*p.seccomp_profile);
    if (!prog.ok()) return std::move(prog).error().wrap("policy " + path + ": compiling seccomp");
    p.seccomp = std::move(prog).value();
  }
  return std::move(read->canon);
}

// "user": the tool's uid and gid inside the sandbox, never 0 (the
// sandbox's init runs as 0 there).
Status read_user(ObjectReader& root, const LocatedJson& doc, Policy& p) {
  const json* v = root.get("user");
  if (!v) return {};
  ObjectReader u(doc, *v, "/user");
  TSB_TRY(u.object("\"user\""), "policy");
  for (const char* key : {"uid", "gid"}) {
    if (const json* id = u.get(key)) {
      TSB_TRY(expect(id->is_number_unsigned() && id->get<std::uint64_t>() >= 1 && id->get<std::uint64_t>() <= 65533,
                     u.where(key), "must be a sandbox id between 1 and 65533 (0 is the sandbox's init)"), "policy");
      (std::string(key) == "uid" ? p.uid : p.gid) = id->get<std::uint32_t>();
    }
  }
  TSB_TRY(u.done(), "policy");
  return {};
}

// "interpreter": by default the venv's python, else the host's; with
// "packages", one of the pythons a tool's own venv has.
Status read_interpreter(ObjectReader& root, Policy& p) {
  if (const json* v = root.get("interpreter")) {
    TSB_TRY(expect(v->is_string(), root.where("interpreter"), "must be a path inside the sandbox"), "policy");
    auto st = isolate::check_sandbox_path(v->get<std::string>(), "interpreter");
    if (!st.ok()) return Error::invalid(root.where("interpreter") + ": " + st.error().message);
    p.interpreter = v->get<std::string>();
  } else {
    p.interpreter = p.venv.empty() ? "/usr/bin/python3" : std::string(isolate::kVenvPath) + "/bin/python3";
  }
  // A tool's own venv has exactly these (daemon/venv/archive.h writes them).
  const auto venv_python = [](const std::string& i) {
    const std::string bin = std::string(isolate::kVenvPath) + "/bin/";
    return i.starts_with(bin) && venv::is_python_name(std::string_view(i).substr(bin.size()));
  };
  TSB_TRY(expect(!p.packages.enabled || venv_python(p.interpreter), root.where("interpreter"),
                 "must be /venv/bin/python3 (or python, python3.N) with \"packages\": a tool's own venv has only these, "
                 "linked to the host's /usr/bin/python3"),
          "policy");
  return {};
}

// "hostname": a plain label, as the sandbox's UTS namespace shows it.
Status read_hostname(ObjectReader& root, Policy& p) {
  const json* v = root.get("hostname");
  if (!v) return {};
  std::string h = v->is_string() ? v->get<std::string>() : std::string();
  TSB_TRY(expect(!h.empty() && h.size() <= 64 &&
                     std::all_of(h.begin(), h.end(),
                                 [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '-'; }),
                 root.where("hostname"), "must be 1-64 letters, digits or '-'"), "policy");
  p.hostname = h;
  return {};
}

// The effective policy, every value explicit, the profile's text resolved
// in: what the fingerprint covers, so an auditor can tie a run to it.
void set_canonical_and_fingerprint(Policy& p, json seccomp_canon) {
  json binds = json::array();
  for (const auto& b : p.binds)
    binds.push_back({{"source", b.source}, {"target", b.target}, {"writable", b.writable}, {"optional", b.optional}});
  p.canonical = json{{"version", 1},
                     {"description", p.description},
                     {"backend", to_string(p.backend)},
                     {"limits", limits_json(p.limits, p.result_bytes)},
                     {"filesystem", {{"venv", p.venv.empty() ? json() : json(p.venv)}, {"workdir", p.workdir}, {"binds", binds}}},
                     {"network", to_string(p.network)},
                     {"environment", {{"set", p.env_set}, {"allow", p.env_allow}}},
                     {"user", {{"uid", p.uid}, {"gid", p.gid}}},
                     {"interpreter", p.interpreter},
                     {"hostname", p.hostname}};
  p.canonical["seccomp"] = std::move(seccomp_canon);  // moved in, as read_seccomp made it
  if (p.network == isolate::NetworkMode::Egress) p.canonical["egress"] = egress_json(p.egress);
  if (p.packages.enabled) p.canonical["packages"] = packages_json(p.packages);
  if (p.typescript.enabled) {
    p.canonical["typescript"] = {{"node", p.typescript.node},
                                 {"strip_types", p.typescript.strip_types},
                                 {"esbuild", p.typescript.esbuild},
                                 {"typescript_module", p.typescript.typescript}};
    if (p.npm_packages.enabled) p.canonical["typescript"]["packages"] = npm_packages_json(p.npm_packages);
  }
  if (p.warm.max > 0)
    p.canonical["warm_pool"] = {
        {"max", p.warm.max}, {"min", p.warm.min}, {"idle", format_duration(p.warm.idle)}, {"preload", p.warm.preload},
        {"tool_preload", p.warm.tool_preload}};
  if (p.sessions.enabled) p.canonical["sessions"] = sessions_json(p.sessions);
  p.fingerprint = "sha256:" + sha256_hex(p.canonical.dump());
}

// One policy document (`merged`: with its include's members merged in) to
// a Policy, section by section; the first error ends it.
Result<Policy> parse_document(const LocatedJson& doc, const std::string& path, const PolicyContext& ctx,
                              const json& merged, const std::string& include_path, const SourceFile& seccomp_file) {
  Policy p;
  p.source = path;
  p.include = include_path;
  ObjectReader root(doc, merged, "");
  TSB_TRY(root.object("a policy"), path);

  if (auto st = read_header(root, doc, p); !st.ok()) return std::move(st).error();
  if (const json* v = root.get("limits")) TSB_TRY(parse_limits(ObjectReader(doc, *v, "/limits"), doc, p.limits, p.result_bytes), "policy");
  if (auto st = read_filesystem(root, doc, ctx, p); !st.ok()) return std::move(st).error();
  if (auto st = read_network(root, doc, p); !st.ok()) return std::move(st).error();
  if (auto st = read_packages(root, doc, p); !st.ok()) return std::move(st).error();
  if (auto st = read_typescript(root, doc, p); !st.ok()) return std::move(st).error();
  if (auto st = read_warm_pool(root, doc, p); !st.ok()) return std::move(st).error();
  if (auto st = read_sessions(root, doc, p); !st.ok()) return std::move(st).error();
  if (auto st = read_environment(root, doc, p); !st.ok()) return std::move(st).error();
  if (auto st = set_egress_proxy_variables(doc, p); !st.ok()) return std::move(st).error();
  auto seccomp_canon = read_seccomp(root, doc, path, ctx, seccomp_file, p);
  if (!seccomp_canon.ok()) return std::move(seccomp_canon).error();
  if (auto st = read_user(root, doc, p); !st.ok()) return std::move(st).error();
  if (auto st = read_interpreter(root, p); !st.ok()) return std::move(st).error();
  if (auto st = read_hostname(root, p); !st.ok()) return std::move(st).error();
  TSB_TRY(root.done(), "policy");

  set_canonical_and_fingerprint(p, std::move(seccomp_canon).value());
  return p;
}

}  // namespace

const char* to_string(Backend b) noexcept { return b == Backend::E2B ? "e2b" : "local"; }

const char* to_string(isolate::NetworkMode n) noexcept {
  switch (n) {
    case isolate::NetworkMode::Host: return "host";
    case isolate::NetworkMode::Egress: return "egress";
    case isolate::NetworkMode::None: break;
  }
  return "none";
}

Result<std::string> read_policy_text(const std::string& path, SourceFiles* files) {
  if (files) return files->read(path);  // embedded files too, from the binary
  if (is_embedded(path)) {
    auto text = embedded_file(path.substr(std::strlen(kEmbedded)));
    if (!text) return Error::invalid("no embedded file '" + path.substr(std::strlen(kEmbedded)) + "'", ENOENT);
    return std::string(*text);
  }
  // A policy is only as strong as the weakest hand that can edit it: when
  // the daemon runs as root, a file someone else owns or may write would let
  // that someone rewrite every sandbox's rules. Without root the daemon has
  // nothing to protect that its own user could not change anyway.
  ReadRules rules{.max_bytes = 4u << 20, .regular_only = true};
  rules.check = [](const std::string& p, const struct stat& st) -> Status {
    if (::geteuid() == 0 && (st.st_uid != 0 || (st.st_mode & (S_IWGRP | S_IWOTH)) != 0))
      return Error::invalid("refusing '" + p + "': owned by uid " + std::to_string(st.st_uid) + " with mode " +
                                mode_string(st.st_mode) + "; a policy file must be owned by root and writable by no one else",
                            EPERM);
    return {};
  };
  return read_file(path, rules);
}

// A policy's name is its file's stem, and it goes everywhere: the audit
// line, run records, the organizations table, `status`, the spawner's own
// log (which escapes nothing it did not make: docs/ERRORS.md, section 3).
// So it is a plain word: 1 to 128 letters, digits, '.', '_' or '-', not
// beginning with '.' or '-'. A file named otherwise (a newline, a terminal
// sequence, bytes that are not UTF-8) is refused, never shown raw.
namespace {
bool valid_policy_name(std::string_view n) {
  if (n.empty() || n.size() > 128 || n.front() == '.' || n.front() == '-') return false;
  return std::all_of(n.begin(), n.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
  });
}
}  // namespace

Result<Policy> load_policy(const std::string& path, const PolicyContext& ctx) {
  if (const std::string name = policy_stem(path); !valid_policy_name(name))
    return Error::invalid("policy: " + quoted_for_message(path) + ": a policy's name is its file's stem, " +
                          quoted_for_message(name) + ", which must be 1 to 128 letters, digits, '.', '_' or '-' "
                          "(not beginning with '.' or '-'): rename the file");
  auto text = read_policy_text(path, ctx.files);
  if (!text.ok()) return std::move(text).error().wrap("policy");
  auto doc = parse_jsonc(*text, path);
  if (!doc.ok()) return std::move(doc).error();
  json merged = doc->value;
  std::string include_path;
  SourceFile seccomp_file{&*doc, *text, path};
  std::optional<Result<std::string>> itext;
  std::optional<Result<LocatedJson>> idoc;
  if (merged.is_object() && merged.contains("include")) {
    const json& inc = merged["include"];
    if (!inc.is_string() || inc.get<std::string>().empty())
      return Error::invalid(doc->where("/include") + ": must be the path of another policy file");
    include_path = join(dir_of(path), inc.get<std::string>());
    itext = read_policy_text(include_path, ctx.files);
    if (!itext->ok()) return Error::invalid(doc->where("/include") + ": " + itext->error().message, itext->error().code);
    idoc = parse_jsonc(**itext, include_path);
    if (!idoc->ok()) return std::move(*idoc).error().wrap("included from " + doc->where("/include"));
    const LocatedJson& inc_doc = **idoc;
    if (!inc_doc.value.is_object()) return Error::invalid(inc_doc.where("") + ": a policy must be an object");
    // One level deep: an included file including another is refused, so a
    // reader never has to chase a chain to know what a policy says.
    if (inc_doc.value.contains("include"))
      return Error::invalid(inc_doc.where("/include") + ": an included policy cannot include another (one level only)");
    json base = inc_doc.value;
    json over = merged;
    over.erase("include");
    // "seccomp" is one choice (a profile file or inline rules), so an
    // including file's "seccomp" replaces the included one whole rather
    // than merging into it.
    if (over.contains("seccomp")) base.erase("seccomp");
    merge_into(base, over);
    // Validate both files on their own first so errors point at their lines.
    PolicyContext no_compile = ctx;
    no_compile.compile = false;
    const SourceFile inc_file{&inc_doc, **itext, include_path};
    auto check_inc = parse_document(inc_doc, include_path, no_compile, inc_doc.value, "", inc_file);
    if (!check_inc.ok()) return std::move(check_inc).error();
    merged = std::move(base);
    // Seccomp settings that come from the included file are resolved and
    // located there.
    if (!doc->value.contains("seccomp")) seccomp_file = inc_file;
  }
  auto p = parse_document(*doc, path, ctx, merged, include_path, seccomp_file);
  if (!p.ok()) return std::move(p).error();
  p->name = policy_stem(path);
  return p;
}

Result<Policy> load_named_policy(const std::string& name, const std::string& dir, const PolicyContext& ctx) {
  if (name.empty() || name.find('/') != std::string::npos || name[0] == '.')
    return Error::invalid("policy names are plain file stems: " + quoted_for_message(name));
  std::string path = dir.empty() ? std::string(kEmbedded) + name + ".json" : dir + "/" + name + ".json";
  return load_policy(path, ctx);
}

isolate::FsInputs fs_inputs_from(const Policy& p, const std::string& runner) {
  isolate::FsInputs in;
  in.venv = p.venv;
  in.binds = p.binds;
  in.runner = runner;
  in.workdir = p.workdir;
  in.hostname = p.hostname;
  in.uid = p.uid;
  in.gid = p.gid;
  in.network = p.network;
  in.tmp_bytes = p.limits.tmp_bytes;
  in.work_bytes = p.limits.work_bytes;
  return in;
}


std::string PackagesPolicy::index_settings() const {
  return (wheels.empty() ? "index=" + index : "wheels=" + wheels) + (source_builds ? "\nsource_builds" : "");
}

// "http(s)://host[:port]/path": a host name (a build reaches it through
// the egress proxy, which allows names), no user, query or fragment.
Status package_source_url(const std::string& url, std::string_view what, std::string_view instead, std::string& host_out,
                          std::uint16_t& port_out) {
  std::string_view u = url;
  const bool https = u.starts_with("https://");
  if (!https && !u.starts_with("http://")) return Error::invalid("must be an http:// or https:// URL");
  u.remove_prefix(https ? 8 : 7);
  const std::size_t slash = u.find('/');
  std::string_view authority = u.substr(0, slash);
  if (url.find_first_of("@?# \t\n\r\\\"'") != std::string::npos)
    return Error::invalid("must be a plain URL: no user, query, fragment, blanks or quotes");
  std::string_view host = authority;
  std::uint32_t port = https ? 443 : 80;
  // "[v6]" or "[v6]:port": the colon that ends the host is after the ']'.
  const std::size_t after_host = authority.starts_with("[") ? authority.find(']') : 0;
  if (const std::size_t colon = authority.rfind(':');
      colon != std::string_view::npos && after_host != std::string_view::npos && colon > after_host) {
    host = authority.substr(0, colon);
    std::string_view ps = authority.substr(colon + 1);
    port = 0;
    if (ps.empty() || ps.size() > 5 || !std::all_of(ps.begin(), ps.end(), [](char c) { return c >= '0' && c <= '9'; }))
      return Error::invalid("the port must be a number");
    for (char c : ps) port = port * 10 + static_cast<std::uint32_t>(c - '0');
    if (port < 1 || port > 65535) return Error::invalid("the port must be from 1 to 65535");
  }
  // What the build's egress proxy would refuse, refused now with its
  // reason (every build would fail on it); then the policy's own form.
  if (std::string why = egress_refusal(host); !why.empty())
    return Error::invalid("the build reaches the " + std::string(what) + " through the egress proxy, and " + why +
                          ": serve the " + std::string(what) + " on a host name the build may reach, or " + std::string(instead));
  if (host.starts_with("*.") || !egress_host_pattern(host))
    return Error::invalid("the host must be a lower-case host name (egress allows names): " + quoted_for_message(host));
  host_out = std::string(host);
  port_out = static_cast<std::uint16_t>(port);
  return {};
}

std::string build_policy_name(const Policy& p) { return p.name + "/build"; }
std::string typescript_policy_name(const Policy& p) { return p.name + "/typescript"; }

EgressRules build_egress_rules(const PackagesPolicy& k) {
  EgressRules e;
  if (k.index.empty()) return e;
  EgressRules::Rule r;
  r.hosts.push_back(k.index_host);
  r.hosts.insert(r.hosts.end(), k.index_hosts.begin(), k.index_hosts.end());
  r.ports.push_back(k.index_port);
  e.allow.push_back(std::move(r));
  e.max_connections = 64;
  e.max_bytes = k.venv_size * 2 + (64ull << 20);  // wheels are compressed; the index pages besides
  return e;
}





}  // namespace tsb::core
