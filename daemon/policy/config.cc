#include "daemon/policy/config.h"

#include <grp.h>
#include <pwd.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <set>

#include "daemon/policy/policy.h"
#include "daemon/policy/units.h"
#include "daemon/policy/jsonc.h"
#include "isolate/base/file.h"

namespace tsb::core {
namespace {

using nlohmann::json;

Result<std::chrono::milliseconds> duration(ObjectReader& r, const char* k, std::chrono::milliseconds dflt) {
  const json* x = r.get(k);
  if (!x) return dflt;
  auto d = parse_duration(*x);
  if (!d.ok()) return r.error(k, d.error().message);
  return *d;
}

#define TRY_SET(dst, expr)                              \
  do {                                                  \
    auto r_ = (expr);                                   \
    if (!r_.ok()) return std::move(r_).error();         \
    dst = std::move(r_).value();                        \
  } while (0)

// The key: one token of printable ASCII, the whitespace around it dropped.
std::string api_key_of(std::string_view s) {
  const auto first = s.find_first_not_of(" \t\n\r");
  if (first == std::string_view::npos) return "";
  s = s.substr(first, s.find_last_not_of(" \t\n\r") - first + 1);
  if (s.size() > 4096 || !std::all_of(s.begin(), s.end(), [](unsigned char c) { return c >= 0x21 && c <= 0x7e; })) return "";
  return std::string(s);
}

// Each step below reads one part of the configuration through `w`, in the
// order load_daemon_config calls them: an unknown key's message lists the
// keys asked for so far, so the order is part of the messages. Every
// error a step returns is final; the caller passes it on as it is.

// "socket": where the daemon listens, and the mode and group of the
// socket file (never any access for others).
Status read_socket(ObjectReader& w, const LocatedJson& doc, DaemonConfig& c) {
  const json* s = w.get("socket");
  if (!s) return {};
  if (!s->is_object()) return Error::invalid(w.where("socket") + ": must be an object");
  ObjectReader ws(doc, *s, "/socket");
  TRY_SET(c.socket_path, ws.string("path", c.socket_path, true));
  std::string mode;
  TRY_SET(mode, ws.string("mode", "0660"));
  char* end = nullptr;
  unsigned long m = std::strtoul(mode.c_str(), &end, 8);
  if (mode.empty() || *end != '\0' || m > 0777 || (m & 0007))
    return Error::invalid(ws.where("mode") + ": must be an octal mode like \"0660\" with no access for others");
  c.socket_mode = static_cast<mode_t>(m);
  TRY_SET(c.socket_group, ws.string("group", ""));
  TSB_TRY(ws.done(), "configuration");
  return {};
}

// "allowed_uids" and "allowed_groups": the peers the daemon answers, by
// number or by name (names resolved now, once).
Status read_peers(ObjectReader& w, DaemonConfig& c) {
  if (const json* u = w.get("allowed_uids")) {
    if (!u->is_array()) return Error::invalid(w.where("allowed_uids") + ": must be an array of uids or user names");
    c.allowed_uids.clear();
    for (const auto& e : *u) {
      if (e.is_number_unsigned()) c.allowed_uids.push_back(e.get<uid_t>());
      else if (e.is_string()) {
        passwd* pw = ::getpwnam(e.get<std::string>().c_str());
        if (!pw) return Error::invalid(w.where("allowed_uids") + ": no such user " + quoted_for_message(e.get<std::string>()));
        c.allowed_uids.push_back(pw->pw_uid);
      } else return Error::invalid(w.where("allowed_uids") + ": entries must be uids or user names");
    }
  }
  if (const json* g = w.get("allowed_groups")) {
    if (!g->is_array()) return Error::invalid(w.where("allowed_groups") + ": must be an array of gids or group names");
    for (const auto& e : *g) {
      if (e.is_number_unsigned()) c.allowed_gids.push_back(e.get<gid_t>());
      else if (e.is_string()) {
        group* gr = ::getgrnam(e.get<std::string>().c_str());
        if (!gr) return Error::invalid(w.where("allowed_groups") + ": no such group " + quoted_for_message(e.get<std::string>()));
        c.allowed_gids.push_back(gr->gr_gid);
      } else return Error::invalid(w.where("allowed_groups") + ": entries must be gids or group names");
    }
  }
  return {};
}

// The bounds of the daemon's load: runs, queue, frames, connections,
// buffers and timeouts.
Status read_bounds(ObjectReader& w, DaemonConfig& c) {
  std::uint64_t n = 0;
  TRY_SET(n, w.number("max_concurrent_runs", c.max_concurrent_runs, 1, 4096));
  c.max_concurrent_runs = static_cast<unsigned>(n);
  TRY_SET(n, w.number("max_queued_runs", c.max_queued_runs, 0, 65536));
  c.max_queued_runs = static_cast<unsigned>(n);
  TRY_SET(n, w.number("max_sessions", c.max_sessions, 0, 4096));
  c.max_sessions = static_cast<unsigned>(n);
  TRY_SET(n, w.number("max_sessions_per_organization", c.max_sessions_per_organization, 1, 4096));
  c.max_sessions_per_organization = static_cast<unsigned>(n);
  if (const json* f = w.get("max_frame_bytes")) {
    auto s = parse_size(*f);
    if (!s.ok() || *s < 4096 || *s > (1ull << 30))
      return Error::invalid(w.where("max_frame_bytes") + ": must be a size between 4KiB and 1GiB");
    c.max_frame_bytes = *s;
  }
  TRY_SET(n, w.number("max_connections", c.max_connections, 1, 65536));
  c.max_connections = static_cast<unsigned>(n);
  c.max_buffered_bytes = std::max<std::size_t>(c.max_buffered_bytes, c.max_frame_bytes);
  if (const json* b = w.get("max_buffered_bytes")) {
    // One maximal request must always fit, or it could never be read.
    auto s = parse_size(*b);
    if (!s.ok() || *s < c.max_frame_bytes || *s > (64ull << 30))
      return Error::invalid(w.where("max_buffered_bytes") + ": must be a size between max_frame_bytes (" +
                            format_size(c.max_frame_bytes) + ") and 64GiB");
    c.max_buffered_bytes = *s;
  }
  TRY_SET(c.request_timeout, duration(w, "request_timeout", c.request_timeout));
  TRY_SET(c.write_timeout, duration(w, "write_timeout", c.write_timeout));
  if (c.request_timeout.count() < 1) return Error::invalid(w.where("request_timeout") + ": must be at least 1ms");
  if (c.write_timeout.count() < 1) return Error::invalid(w.where("write_timeout") + ": must be at least 1ms");
  TRY_SET(c.shutdown_grace, duration(w, "shutdown_grace", c.shutdown_grace));
  return {};
}

// The files the daemon reads, the front end's user, and the host paths
// policies may bind.
Status read_paths(ObjectReader& w, DaemonConfig& c) {
  TRY_SET(c.policies_dir, w.string("policies_dir", "", true));
  TRY_SET(c.organizations_file, w.string("organizations", "", true));
  TRY_SET(c.runner_path, w.string("runner", "", true));
  TRY_SET(c.front_end_user, w.string("front_end_user", c.front_end_user));
  if (c.front_end_user.empty()) return Error::invalid(w.where("front_end_user") + ": must name a user");
  if (const json* b = w.get("bind_allowlist")) {
    if (!b->is_array()) return Error::invalid(w.where("bind_allowlist") + ": must be an array of absolute host paths");
    for (const auto& e : *b) {
      if (!e.is_string() || e.get<std::string>().empty() || e.get<std::string>()[0] != '/')
        return Error::invalid(w.where("bind_allowlist") + ": entries must be absolute host paths");
      c.bind_allowlist.push_back(e.get<std::string>());
    }
  }
  return {};
}

// "engine": where runs' cgroups and state live, the host ids they map to,
// and the sandbox init.
Status read_engine(ObjectReader& w, const LocatedJson& doc, DaemonConfig& c) {
  const json* e = w.get("engine");
  if (!e) return {};
  if (!e->is_object()) return Error::invalid(w.where("engine") + ": must be an object");
  ObjectReader we(doc, *e, "/engine");
  std::uint64_t n = 0;
  TRY_SET(c.engine.cgroup_parent, we.string("cgroup_parent", c.engine.cgroup_parent));
  if (c.engine.cgroup_parent != "self" && (c.engine.cgroup_parent.empty() || c.engine.cgroup_parent[0] != '/'))
    return Error::invalid(we.where("cgroup_parent") + ": must be \"self\" or an absolute cgroup path");
  TRY_SET(c.engine.state_dir, we.string("state_dir", c.engine.state_dir, true));
  TRY_SET(n, we.number("uid_base", c.engine.uid_base, 65536, 0xF0000000u));
  c.engine.uid_base = static_cast<std::uint32_t>(n);
  TRY_SET(n, we.number("uid_slots", c.engine.uid_slots, 1, 16384));
  c.engine.uid_slots = static_cast<std::uint32_t>(n);
  TRY_SET(c.engine.init_path, we.string("init", "", true));
  if (const json* h = we.get("hide_host_paths")) {
    if (!h->is_boolean()) return Error::invalid(we.where("hide_host_paths") + ": must be true or false");
    c.engine.hide_host_paths = h->get<bool>();
  }
  // The tool's Landlock ruleset (docs/SECURITY.md, "Landlock"): "auto"
  // applies what the kernel's ABI allows, "off" none.
  if (const json* l = we.get("landlock")) {
    if (!l->is_string() || (*l != "auto" && *l != "off"))
      return Error::invalid(we.where("landlock") + ": must be \"auto\" or \"off\"");
    c.engine.landlock = *l == "auto";
  }
  // Only from 0 up: a sandbox is never less likely than an ordinary
  // process to be chosen by the OOM killer.
  TRY_SET(n, we.number("sandbox_oom_score_adj", static_cast<std::uint64_t>(c.engine.sandbox_oom_score_adj), 0, 1000));
  c.engine.sandbox_oom_score_adj = static_cast<int>(n);
  TSB_TRY(we.done(), "configuration");
  return {};
}

// "e2b": the E2B backend, on when an API key file is named.
Status read_e2b(ObjectReader& w, const LocatedJson& doc, DaemonConfig& c) {
  const json* e = w.get("e2b");
  if (!e) return {};
  if (!e->is_object()) return Error::invalid(w.where("e2b") + ": must be an object");
  ObjectReader we(doc, *e, "/e2b");
  std::uint64_t n = 0;
  TRY_SET(c.e2b.api_key_file, we.string("api_key_file", "", true));
  c.e2b.enabled = !c.e2b.api_key_file.empty();
  TRY_SET(c.e2b.api_url, we.string("api_url", c.e2b.api_url));
  TRY_SET(c.e2b.sandbox_url, we.string("sandbox_url", c.e2b.sandbox_url));
  TRY_SET(c.e2b.domain, we.string("domain", c.e2b.domain));
  TRY_SET(c.e2b.template_id, we.string("template", c.e2b.template_id));
  std::chrono::milliseconds ttl{};
  TRY_SET(ttl, duration(we, "sandbox_ttl", std::chrono::duration_cast<std::chrono::milliseconds>(c.e2b.sandbox_ttl)));
  c.e2b.sandbox_ttl = std::chrono::duration_cast<std::chrono::seconds>(ttl);
  TRY_SET(n, we.number("max_sandboxes", c.e2b.max_sandboxes, 1, 1024));
  c.e2b.max_sandboxes = static_cast<unsigned>(n);
  if (const json* a = we.get("allow_requirement_urls")) {
    if (!a->is_boolean()) return Error::invalid(we.where("allow_requirement_urls") + ": must be true or false");
    c.e2b.allow_requirement_urls = a->get<bool>();
  }
  TSB_TRY(we.done(), "configuration");
  return {};
}

// "venvs": the per-tool venv cache: its directory (an absolute,
// normalised path) and its cap.
Status read_venvs(ObjectReader& w, const LocatedJson& doc, DaemonConfig& c) {
  const json* v = w.get("venvs");
  if (!v) return {};
  if (!v->is_object()) return Error::invalid(w.where("venvs") + ": must be an object");
  ObjectReader wv(doc, *v, "/venvs");
  TRY_SET(c.venvs.cache_dir, wv.string("cache_dir", c.venvs.cache_dir));
  if (c.venvs.cache_dir.size() < 2 || c.venvs.cache_dir[0] != '/' || c.venvs.cache_dir.back() == '/' ||
      c.venvs.cache_dir.find("/.") != std::string::npos || c.venvs.cache_dir.find("//") != std::string::npos)
    return Error::invalid(wv.where("cache_dir") + ": must be an absolute, normalised path (not /)");
  if (const json* m = wv.get("max_bytes")) {
    auto s = parse_size(*m);
    if (!s.ok() || *s < (16ull << 20)) return Error::invalid(wv.where("max_bytes") + ": must be a size of at least 16MiB");
    c.venvs.max_bytes = *s;
  }
  TSB_TRY(wv.done(), "configuration");
  return {};
}

}  // namespace

// The configuration file (absent and `optional`: the defaults), read part
// by part; the first error ends it.
Result<DaemonConfig> load_daemon_config(const std::string& path, bool optional, SourceFiles* files) {
  DaemonConfig c;
  auto text = read_policy_text(path, files);
  if (!text.ok()) {
    if (optional && text.error().code == ENOENT) return c;
    return std::move(text).error().wrap("configuration");
  }
  auto doc = parse_jsonc(*text, path);
  if (!doc.ok()) return std::move(doc).error();
  if (!doc->value.is_object()) return Error::invalid(doc->where("") + ": the configuration must be an object");
  c.source = path;
  ObjectReader w(*doc, doc->value, "");
  if (const json* v = w.get("version"); !v || !v->is_number_unsigned() || v->get<int>() != 1)
    return Error::invalid(doc->where(v ? "/version" : "") + ": \"version\": 1 is required");

  if (auto st = read_socket(w, *doc, c); !st.ok()) return std::move(st).error();
  if (auto st = read_peers(w, c); !st.ok()) return std::move(st).error();
  if (auto st = read_bounds(w, c); !st.ok()) return std::move(st).error();
  if (auto st = read_paths(w, c); !st.ok()) return std::move(st).error();
  if (auto st = read_engine(w, *doc, c); !st.ok()) return std::move(st).error();
  if (auto st = read_e2b(w, *doc, c); !st.ok()) return std::move(st).error();
  if (auto st = read_venvs(w, *doc, c); !st.ok()) return std::move(st).error();
  TSB_TRY(w.done(), "configuration");
  return c;
}

Result<std::string> read_e2b_api_key(const std::string& path, int fd) {
  if (path.empty() || path[0] != '/') return Error::invalid("api_key_file must be an absolute path");
  // Under $CREDENTIALS_DIRECTORY (systemd's LoadCredential=) systemd
  // protects the file; anywhere else it must be root's alone.
  ReadRules rules{.max_bytes = 8192, .regular_only = true, .no_follow = true};
  rules.check = [](const std::string& p, const struct stat& st) -> Status {
    bool credential = false;
    if (const char* cd = std::getenv("CREDENTIALS_DIRECTORY"); cd && cd[0] == '/') {
      std::string dir(cd);
      while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
      credential = p.size() > dir.size() + 1 && p.compare(0, dir.size(), dir) == 0 && p[dir.size()] == '/';
    }
    if (credential) return {};
    if (st.st_uid != 0) return Error::invalid("'" + p + "' must be owned by root", EPERM);
    if (st.st_mode & 077)
      return Error::invalid("'" + p + "' must not be accessible by group or others (mode " + mode_string(st.st_mode) +
                                "); chmod 0600 it, or pass it with systemd's LoadCredential=",
                            EPERM);
    return {};
  };
  auto read = fd >= 0 ? read_opened_file(fd, path, rules) : read_file(path, rules);
  if (!read.ok()) {
    if (read.error().code == EFBIG) return Error::invalid("'" + path + "' is too large to hold an API key");
    return std::move(read).error();
  }
  if (read->find_first_not_of(" \t\n\r") == std::string::npos) return Error::invalid("'" + path + "' is empty");
  std::string key = api_key_of(*read);
  if (key.empty()) return Error::invalid("'" + path + "' must hold one API key: printable ASCII, no spaces");
  return key;
}

}  // namespace tsb::core
