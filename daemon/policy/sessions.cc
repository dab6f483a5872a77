#include "daemon/policy/sessions.h"

#include <algorithm>

#include "daemon/common/quote.h"
#include "daemon/policy/fs_table.h"
#include "daemon/policy/units.h"

namespace tsb::core {

using nlohmann::json;

namespace {

std::string_view last_component(std::string_view p) { return p.substr(p.rfind('/') + 1); }

// A duration of the section, within [1s, 24h].
Status session_duration(ObjectReader& o, const char* key, std::chrono::milliseconds& out) {
  const json* v = o.get(key);
  if (!v) return {};
  auto d = parse_duration(*v);
  if (!d.ok() || d->count() < 1000 || d->count() > 86'400'000)
    return o.error(key, "must be a duration from 1s to 24h, like \"600s\"");
  out = *d;
  return {};
}

// A size of the section, within [lo, hi].
Status session_size(ObjectReader& o, const char* key, std::uint64_t lo, std::uint64_t hi, std::uint64_t& out) {
  const json* v = o.get(key);
  if (!v) return {};
  auto s = parse_size(*v);
  if (!s.ok() || *s < lo || *s > hi)
    return o.error(key, "must be a size from " + format_size(lo) + " to " + format_size(hi) + ", like \"512MiB\"");
  out = *s;
  return {};
}

}  // namespace

std::string session_policy_name(std::string_view policy) { return std::string(policy) + "/session"; }
std::string workspace_policy_name(std::string_view policy) { return std::string(policy) + "/workspace"; }

Status parse_sessions(ObjectReader o, SessionsPolicy& s) {
  TSB_TRY(o.object("\"sessions\""), "sessions");
  s.enabled = true;
  auto commands = o.strings("commands", "absolute paths inside the sandbox");
  if (!commands.ok()) return std::move(commands).error();  // context: the reader names file:line:col and the key
  if (commands->empty())
    return o.error("commands", "is required: the programs a session may start, absolute paths inside the sandbox "
                               "(below /usr or /venv), like [\"/usr/bin/node\"]");
  if (commands->size() > 64) return o.error("commands", "names more than 64 programs");
  for (const std::string& c : *commands) {
    if (!isolate::check_sandbox_path(c, "command").ok() || !(c.starts_with("/usr/") || c.starts_with("/venv/")))
      return o.error("commands", "must be absolute, normalised paths below /usr (the host's, read-only) or /venv: " +
                                     quoted_for_message(c));
    if (std::count(commands->begin(), commands->end(), c) > 1) return o.error("commands", "names " + c + " twice");
  }
  s.commands = std::move(commands).value();
  // context: the reader names file:line:col and the key
  if (auto st = session_size(o, "memory", 16ull << 20, 64ull << 30, s.memory); !st.ok()) return st;
  auto pids = o.number("pids", s.pids, 1, 4096);
  if (!pids.ok()) return std::move(pids).error();  // context: the reader names file:line:col and the key
  s.pids = *pids;
  // context: the reader names file:line:col and the key
  if (auto st = session_duration(o, "cpu_time", s.cpu_time); !st.ok()) return st;
  // context: the reader names file:line:col and the key
  if (auto st = session_duration(o, "idle_timeout", s.idle_timeout); !st.ok()) return st;
  // context: the reader names file:line:col and the key
  if (auto st = session_duration(o, "max_lifetime", s.max_lifetime); !st.ok()) return st;
  // context: the reader names file:line:col and the key
  if (auto st = session_size(o, "stream_bytes", 1ull << 20, 1ull << 40, s.stream_bytes); !st.ok()) return st;
  if (s.idle_timeout > s.max_lifetime)
    return o.error("idle_timeout", "is longer than max_lifetime (" + format_duration(s.max_lifetime) + ")");
  if (const json* w = o.get("workspace"); w && !w->is_null()) {
    ObjectReader r(o.doc(), *w, o.pointer("workspace"));
    TSB_TRY(r.object("\"workspace\""), "sessions");
    s.workspace = true;
    // context: the reader names file:line:col and the key
    if (auto st = session_size(r, "size", 1ull << 20, 16ull << 30, s.workspace_size); !st.ok()) return st;
    // context: the reader names file:line:col and the key
    if (auto st = session_duration(r, "idle_ttl", s.workspace_idle_ttl); !st.ok()) return st;
    // (Longer than max_lifetime: never reached, as max_lifetime ends a
    // workspace in any case; allowed, so that a policy that includes
    // another and shortens max_lifetime need not restate the workspace.)
    TSB_TRY(r.done(), "sessions");
  }
  return o.done();
}

json sessions_json(const SessionsPolicy& s) {
  return {{"commands", s.commands},
          {"memory", format_size(s.memory)},
          {"pids", s.pids},
          {"cpu_time", format_duration(s.cpu_time)},
          {"idle_timeout", format_duration(s.idle_timeout)},
          {"max_lifetime", format_duration(s.max_lifetime)},
          {"stream_bytes", format_size(s.stream_bytes)},
          {"workspace", s.workspace ? json{{"size", format_size(s.workspace_size)},
                                           {"idle_ttl", format_duration(s.workspace_idle_ttl)}}
                                    : json()}};
}

std::string resolve_session_command(const SessionsPolicy& s, std::string_view name) {
  if (name.empty()) return "";
  for (const std::string& c : s.commands)
    if (c == name || (name.find('/') == std::string_view::npos && last_component(c) == name)) return c;
  return "";
}

}  // namespace tsb::core
