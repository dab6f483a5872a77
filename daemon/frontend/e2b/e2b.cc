#include "daemon/frontend/e2b/e2b.h"

#include "e2b_cells.h"  // generated from cells/*.py: tsb::embedded::kToolCell, kEnvCell

#include <fcntl.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <climits>
#include <cstdlib>

#include "daemon/common/quote.h"
#include "daemon/frontend/letta/result.h"
#include "protocol/record.h"
#include "daemon/policy/e2b_network.h"
#include "daemon/policy/units.h"
#include "daemon/venv/requirements.h"
#include "isolate/base/file.h"
#include "isolate/base/random.h"
#include "daemon/policy/jsonc.h"
#include "protocol/json_limits.h"
#include "daemon/frontend/letta/letta.h"
#include "daemon/frontend/letta/pyjson.h"
#include "daemon/compile/spawn_policy.h"

namespace tsb::core {
namespace {

using nlohmann::json;
using protocol::ErrorCode;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;
namespace lp = tsb::letta;
constexpr auto tuple_awaitable = asio::experimental::as_tuple(asio::use_awaitable);

// A string member of a JSON object E2B (or the code inside a sandbox) sent,
// or `fallback` when it is absent or of another type: nlohmann's value()
// would throw for a member of the wrong type, and what comes from a sandbox
// is whatever its root wants it to be.
std::string str_field(const json& j, const char* key, std::string_view fallback = "") {
  if (!j.is_object()) return std::string(fallback);
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string(fallback);
}

constexpr int kEnvdPort = 49983;
constexpr int kInterpreterPort = 49999;
// Longest single control-plane call; the run's own deadline usually ends it first.
constexpr auto kControlTimeout = 30s;
// Tool mode: the fixed cell writes a heartbeat to its stderr every
// kHeartbeat while the runner works, so a silent stream for kToolStall
// means the stream (not the tool) is stuck.
constexpr double kHeartbeatSeconds = 2.0;
constexpr auto kToolStall = 15s;
// envd pings a process stream at the interval we ask for (seconds).
constexpr const char* kEnvdKeepalive = "5";
constexpr auto kEnvdStall = 20s;
// A reused sandbox must have this much TTL left before it is refreshed.
constexpr auto kReuseMargin = 3s;
constexpr std::size_t kMaxLine = 64u << 20;
constexpr std::size_t kMaxEnvelope = 4u << 20;
constexpr const char* kUserAgent = "toolsandboxd/" TSB_VERSION;

std::string q(std::string_view s) { return quoted_for_message(s); }

bool is_ident_char(char c) {
  return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z');
}

// Identifiers E2B hands us end up in URLs and host names: letters, digits,
// '-' and '_' only.
bool valid_sandbox_id(std::string_view s) {
  if (s.empty() || s.size() > 128) return false;
  for (char c : s)
    if (!is_ident_char(c) && c != '-' && c != '_') return false;
  return true;
}
bool valid_domain(std::string_view s) {
  if (s.empty() || s.size() > 253) return false;
  for (char c : s)
    if (!is_ident_char(c) && c != '-' && c != '.') return false;
  return s.front() != '.' && s.front() != '-';
}
// A header value: one token of printable ASCII (no CR/LF, no spaces).
bool valid_token(std::string_view s) {
  if (s.empty() || s.size() > 4096) return false;
  for (unsigned char c : s)
    if (c < 0x21 || c > 0x7e) return false;
  return true;
}


std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += s;
  return out;
}

void erase_all(std::string& s, std::string_view what) {
  if (what.empty()) return;
  std::size_t pos = 0;
  while ((pos = s.find(what, pos)) != std::string::npos) s.erase(pos, what.size());
}

std::string trim_ws(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\n' || s.front() == '\r')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\n' || s.back() == '\r')) s.remove_suffix(1);
  return std::string(s);
}

std::string tail(const std::string& s, std::size_t n) { return s.size() <= n ? s : "..." + s.substr(s.size() - n); }

// The fixed tool-mode cell. Data reaches it only as one base64 literal
// (its alphabet cannot end a string literal), decoded inside: the runner's
// source and its package's, the runner's request (with the nonce), the
// tool's environment, the timeout and the heartbeat text. The runner runs
// in its own process with exactly that environment over a minimal base, so
// nothing of the request ever becomes code and no variable is set in the
// kernel.
using embedded::kToolCell;  // daemon/frontend/e2b/cells/tool_cell.py

// Script mode: the environment goes into a fresh kernel through its own
// fixed cell, before the script's cell, and dies with that kernel.
using embedded::kEnvCell;  // daemon/frontend/e2b/cells/env_cell.py

// TypeScript tools: the same in a TypeScript context, and the fixed cell
// that calls the tool in tool mode.
using embedded::kTsEnvCell;   // daemon/frontend/e2b/cells/env_cell.ts
using embedded::kTsToolCell;  // daemon/frontend/e2b/cells/tool_cell.ts

// Letta's E2B sandbox installs its client package for every TypeScript tool
// (a failure only warns).
constexpr const char* kLettaClientPackage = "@letta-ai/letta-client";
// The kernel's working directory, where npm installs so the kernel resolves.
constexpr const char* kKernelCwd = "/home/user";

// Python's str.isspace() for the ASCII range, which re's \s matches; and
// \w's word characters (every non-ASCII byte counts as one).
bool py_space(unsigned char c) { return c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f); }
bool py_word(unsigned char c) { return is_ident_char(static_cast<char>(c)) || c == '_' || c >= 0x80; }

std::string py_strip(std::string_view s) {
  while (!s.empty() && py_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && py_space(s.back())) s.remove_suffix(1);
  return std::string(s);
}

// Where r"^import\s+.+?['\"];?\s*$" (re.MULTILINE) matching at the line
// start `i` ends, or npos: \s+ greedy, .+? (no newline) up to a quote,
// an optional ';', then \s* backed off to an end of line.
std::size_t import_match_end(std::string_view s, std::size_t i) {
  constexpr auto npos = std::string_view::npos;
  if (s.compare(i, 6, "import") != 0) return npos;
  const std::size_t j = i + 6;
  std::size_t k = j;
  while (k < s.size() && py_space(s[k])) ++k;
  if (k == j || k >= s.size()) return npos;
  auto after_quote = [&](std::size_t q) -> std::size_t {
    for (int semi = 1; semi >= 0; --semi) {
      std::size_t e = q + 1;
      if (semi) {
        if (e < s.size() && s[e] == ';') ++e;
        else continue;
      }
      std::size_t w = e;
      while (w < s.size() && py_space(s[w])) ++w;
      for (std::size_t p = w + 1; p-- > e;)
        if (p == s.size() || s[p] == '\n') return p;
    }
    return npos;
  };
  if (s[k] != '\n') {
    const std::size_t line_end = std::min(s.find('\n', k), s.size());
    for (std::size_t q = k + 1; q < line_end; ++q)
      if (s[q] == '\'' || s[q] == '"')
        if (std::size_t end = after_quote(q); end != npos) return end;
  }
  // \s+ backed off by one leaves .+? a blank to start with and the quote at k.
  if ((s[k] == '\'' || s[k] == '"') && k - 1 > j && s[k - 1] != '\n') return after_quote(k);
  return npos;
}

// Letta's \s+ after a keyword at `i` (at least one): where it ends, or npos.
std::size_t after_blanks(std::string_view s, std::size_t i) {
  std::size_t k = i;
  while (k < s.size() && py_space(s[k])) ++k;
  return k == i ? std::string_view::npos : k;
}

std::string with_blob(std::string_view cell, std::string_view blob) {
  std::string out(cell);
  out.replace(out.find("@BLOB@"), 6, blob);
  return out;
}

// Error bodies from E2B: {"code", "message"} (control plane and envd), or
// text. Only the message, bounded.
std::string body_message(const std::string& body) {
  json j = protocol::parse_json_bounded(body);
  std::string m;
  if (j.is_object() && j.contains("message") && j["message"].is_string()) m = j["message"].get<std::string>();
  else if (j.is_string()) m = j.get<std::string>();
  else m = body;
  m = trim_ws(m);
  if (m.size() > 300) m = m.substr(0, 300) + "...";
  return m;
}

}  // namespace

// ---------------------------------------------------------------------------
// Pure helpers
// ---------------------------------------------------------------------------

std::string e2b_metadata_param(const std::vector<std::pair<std::string, std::string>>& metadata) {
  std::string inner;
  for (const auto& [k, v] : metadata) {
    if (!inner.empty()) inner += '&';
    inner += http::py_quote(k) + "=" + http::py_quote(v);
  }
  return "metadata=" + http::py_quote_plus(inner);
}

std::string e2b_sandbox_base_url(const E2BConfig& cfg, std::string_view id, int port, std::string_view sandbox_domain) {
  if (!cfg.sandbox_url.empty()) {
    std::string u = cfg.sandbox_url;
    for (std::size_t p; (p = u.find("{port}")) != std::string::npos;) u.replace(p, 6, std::to_string(port));
    for (std::size_t p; (p = u.find("{id}")) != std::string::npos;) u.replace(p, 4, std::string(id));
    while (!u.empty() && u.back() == '/') u.pop_back();
    return u;
  }
  std::string domain = sandbox_domain.empty() ? cfg.domain : std::string(sandbox_domain);
  return "https://" + std::to_string(port) + "-" + std::string(id) + "." + domain;
}


std::string e2b_tool_cell(std::string_view blob_base64) { return with_blob(kToolCell, blob_base64); }

std::string e2b_typescript_tool_cell(std::string_view blob_base64) { return with_blob(kTsToolCell, blob_base64); }

std::string e2b_typescript_source(std::string_view s) {
  // re.findall and re.sub of the import pattern: the matches, and the rest.
  std::vector<std::string> imports;
  std::string rest;
  std::size_t copied = 0;
  for (std::size_t i = 0; i < s.size();) {
    if (std::size_t end = import_match_end(s, i); end != std::string_view::npos) {
      imports.push_back(py_strip(s.substr(i, end - i)));
      rest.append(s.substr(copied, i - copied));
      copied = i = end;
    }
    std::size_t nl = s.find('\n', i);
    if (nl == std::string_view::npos) break;
    i = nl + 1;
  }
  rest.append(s.substr(copied));
  // re.sub(r"\bexport\s+", "", ...), then .strip().
  std::string stripped;
  for (std::size_t i = 0; i < rest.size();) {
    if (rest.compare(i, 6, "export") == 0 && (i == 0 || !py_word(rest[i - 1]))) {
      if (std::size_t k = after_blanks(rest, i + 6); k != std::string_view::npos) {
        i = k;
        continue;
      }
    }
    stripped += rest[i++];
  }
  std::string out;
  for (const auto& imp : imports) out += imp + "\n";
  if (!imports.empty()) out += "\n";
  return out + py_strip(stripped) + "\n";
}

bool e2b_typescript_is_async(std::string_view s, std::string_view name) {
  // re.search(r"export\s+async\s+function\s+NAME") or
  // re.search(r"export\s+const\s+NAME\s*=\s*async"): no word boundary
  // after NAME in the first, as there.
  constexpr auto npos = std::string_view::npos;
  auto word = [&](std::size_t k, std::string_view w) { return k != npos && s.compare(k, w.size(), w) == 0; };
  auto blanks0 = [&](std::size_t k) {
    while (k < s.size() && py_space(s[k])) ++k;
    return k;
  };
  for (std::size_t i = s.find("export"); i != npos; i = s.find("export", i + 1)) {
    std::size_t k = after_blanks(s, i + 6);
    if (word(k, "async")) {
      std::size_t f = after_blanks(s, k + 5);
      if (word(f, "function")) {
        std::size_t n = after_blanks(s, f + 8);
        if (word(n, name)) return true;
      }
    }
    if (word(k, "const")) {
      std::size_t n = after_blanks(s, k + 5);
      if (word(n, name)) {
        std::size_t e = blanks0(n + name.size());
        if (e < s.size() && s[e] == '=' && word(blanks0(e + 1), "async")) return true;
      }
    }
  }
  return false;
}

bool e2b_typescript_identifier(std::string_view name) {
  if (name.empty() || name.size() > 256) return false;
  for (std::size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    if (!(is_ident_char(c) || c == '_' || c == '$') || (i == 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

// ---------------------------------------------------------------------------
// Backend state
// ---------------------------------------------------------------------------

struct E2BBackend::Sandbox {
  std::string id;
  std::string token;   // envdAccessToken: header only
  std::string domain;  // "" = the configured one
  std::string key;     // reuse key: config_state + network digest + organization
  bool in_use = false;
  Clock::time_point expires_at;
  Clock::time_point last_used;
  std::set<std::string> installed;  // requirements pip installed here
};

struct E2BBackend::RunCtx {
  std::string tool_name;
  Clock::time_point t0, deadline;
  double timeout_s = 60;
  std::chrono::milliseconds timeout{60000};
  std::shared_ptr<http::CancelSignal> cancel;
  std::vector<std::pair<std::string, std::string>> metadata;
  std::string pool_key;
  json network;         // the create body's network members (daemon/policy/e2b_network.h)
  std::string network_digest;
  bool internet = false;  // the policy has a network ("egress" or "host")
  long ttl_s = 300;
  std::uint64_t stdout_cap = 1u << 20, stderr_cap = 1u << 20;
  bool reused = false, adopted = false;
  std::vector<std::string> installed_now, npm_installed_now;
  std::string letta_client;  // TypeScript: what became of Letta's client package

  std::chrono::milliseconds remaining() const {
    auto r = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    return std::max(r, std::chrono::milliseconds(1));
  }
  bool past_deadline() const { return Clock::now() + 5ms >= deadline; }
};

struct E2BBackend::Fail {
  std::string end_reason = "backend_error";  // or timeout, cancelled, output_limit, setup_failed
  std::string detail;                        // backend_error / setup_failed: which failure
  std::string message;                       // for the record, the log and the exception
  std::string exc_name = "SandboxException";
  bool kill = true;                          // kill the sandbox this run holds
};

struct E2BBackend::Exec {
  std::vector<std::string> out, err;
  std::uint64_t out_bytes = 0, err_bytes = 0;
  bool out_over = false, err_over = false;
  std::optional<json> main_result;
  int display_results = 0;
  std::optional<json> error;
  int execution_count = -1;
  bool ended = false;
  bool bad_line = false;
  std::string bad_text;
};

E2BBackend::E2BBackend(asio::io_context& io, E2BConfig cfg) : io_(io), cfg_(std::move(cfg)), http_(io) {}

E2BBackend::~E2BBackend() = default;

Status E2BBackend::load_key(UniqueFd key) {
  auto k = read_e2b_api_key(cfg_.api_key_file, key.get());
  if (!k.ok()) return std::move(k).error().wrap("e2b api key");
  api_key_ = std::move(k).value();
  spdlog::info("e2b: API key loaded from {} (api {}, template {}, max_sandboxes {})", cfg_.api_key_file, cfg_.api_url,
               q(cfg_.template_id), cfg_.max_sandboxes);
  return {};
}

Status E2BBackend::reconfigure(const E2BConfig& cfg, UniqueFd key) {
  auto k = read_e2b_api_key(cfg.api_key_file, key.get());
  if (!k.ok()) return std::move(k).error().wrap("e2b api key");
  const bool moved = cfg.api_url != cfg_.api_url || cfg.sandbox_url != cfg_.sandbox_url ||
                     cfg.domain != cfg_.domain || cfg.template_id != cfg_.template_id || k.value() != api_key_;
  cfg_ = cfg;
  api_key_ = std::move(k).value();
  if (moved) {
    // Idle sandboxes belong to the old account, endpoint or template: forget
    // them (E2B ends them at their TTL). Busy ones are dropped when released.
    for (auto it = pool_.begin(); it != pool_.end();)
      it = it->second->in_use ? std::next(it) : pool_.erase(it);
    for (auto& [id, sb] : pool_) sb->key = "<stale>";
  }
  spdlog::info("e2b: API key reloaded from {}", cfg_.api_key_file);
  return {};
}

json E2BBackend::status_json() const {
  unsigned idle = 0;
  for (const auto& [id, sb] : pool_)
    if (!sb->in_use) ++idle;
  json c = json::object();
  for (const auto& [k, v] : counters_) c[k] = v;
  return {{"sandboxes", pool_.size()}, {"idle", idle}, {"runs_in_flight", in_flight_}, {"counters", c}};
}

std::string E2BBackend::redact(std::string s) const {
  auto scrub = [&](const std::string& secret) {
    if (secret.size() < 4) return;
    for (std::size_t p; (p = s.find(secret)) != std::string::npos;) s.replace(p, secret.size(), "[redacted]");
  };
  scrub(api_key_);
  for (const auto& [id, sb] : pool_) scrub(sb->token);
  return s;
}

std::vector<std::pair<std::string, std::string>> E2BBackend::control_headers(bool json_body) const {
  std::vector<std::pair<std::string, std::string>> h = {{"X-API-KEY", api_key_}, {"User-Agent", kUserAgent},
                                                        {"Accept", "application/json"}};
  if (json_body) h.emplace_back("Content-Type", "application/json");
  return h;
}

std::vector<std::pair<std::string, std::string>> E2BBackend::data_headers(const Sandbox& sb, int port) const {
  return {{"X-Access-Token", sb.token},
          {"E2b-Sandbox-Id", sb.id},
          {"E2b-Sandbox-Port", std::to_string(port)},
          {"User-Agent", kUserAgent}};
}

http::Request E2BBackend::control_request(RunCtx& ctx, std::string method, std::string path, std::string body) const {
  http::Request r;
  r.method = std::move(method);
  std::string base = cfg_.api_url;
  while (!base.empty() && base.back() == '/') base.pop_back();
  r.url = base + path;
  r.headers = control_headers(!body.empty());
  r.body = std::move(body);
  r.timeout = std::min<std::chrono::milliseconds>(kControlTimeout, ctx.remaining());
  r.cancel = ctx.cancel;
  return r;
}

E2BBackend::Fail E2BBackend::fail_from_http(const RunCtx& ctx, const http::Response& r, std::string_view what,
                                            bool data_plane) const {
  Fail f;
  std::string w(what);
  switch (r.failure) {
    case http::Failure::Cancelled:
      f.end_reason = "cancelled";
      f.exc_name = "CancelledError";
      f.message = w + ": cancelled (the client went away or the daemon is stopping)";
      return f;
    case http::Failure::Timeout:
      if (ctx.past_deadline()) {
        f.end_reason = "timeout";
        f.exc_name = "TimeoutError";
        f.message = w + ": the run's timeout passed";
      } else {
        f.detail = "timeout";
        f.exc_name = "TimeoutException";
        f.message = w + ": " + r.error;
      }
      return f;
    case http::Failure::Stalled:
      f.detail = "stalled";
      f.exc_name = "TimeoutException";
      f.message = w + ": the stream stalled (" + r.error + ")";
      return f;
    case http::Failure::Connect:
      f.detail = "connect_error";
      f.message = w + ": " + redact(r.error);
      return f;
    case http::Failure::Transport:
    case http::Failure::TooLarge:
    case http::Failure::Aborted:
      f.detail = "stream_error";
      f.message = w + ": " + redact(r.error);
      return f;
    case http::Failure::Internal:
      f.detail = "internal";
      f.message = w + ": " + r.error;
      return f;
    case http::Failure::None:
      break;
  }
  std::string msg = redact(body_message(r.body));
  f.message = w + ": HTTP " + std::to_string(r.status) + (msg.empty() ? "" : " " + q(msg));
  if (r.status == 401 || r.status == 403) {
    f.detail = "unauthorized";
    f.exc_name = "AuthenticationException";
  } else if (r.status == 404) {
    f.detail = "not_found";
    f.exc_name = "NotFoundException";
  } else if (r.status == 429) {
    f.detail = "rate_limited";
    f.exc_name = "RateLimitException";
  } else if (r.status >= 500) {
    f.detail = "server_error";
    if (data_plane && r.status == 502) f.message += " (the sandbox is gone: it timed out or was killed)";
  } else {
    f.detail = "rejected";
  }
  return f;
}

void E2BBackend::kill_later(std::string sandbox_id, std::string why) {
  created_ids_.erase(sandbox_id);
  ++background_;
  ++counters_["killed"];
  spdlog::info("e2b: killing sandbox {} ({})", sandbox_id, why);
  asio::co_spawn(
      io_,
      [this, sandbox_id]() -> asio::awaitable<void> {
        http::Request r;
        r.method = "DELETE";
        std::string base = cfg_.api_url;
        while (!base.empty() && base.back() == '/') base.pop_back();
        r.url = base + "/sandboxes/" + sandbox_id;
        r.headers = control_headers(false);
        r.timeout = 15s;
        auto res = co_await http_.request(std::move(r));
        if (!res.ok()) spdlog::warn("e2b: killing sandbox {}: {} (E2B ends it at its TTL)", sandbox_id, redact(res.error));
        else if (res.status != 204 && res.status != 200 && res.status != 404)
          spdlog::warn("e2b: killing sandbox {}: HTTP {} (E2B ends it at its TTL)", sandbox_id, res.status);
        --background_;
      },
      asio::detached);
}

void E2BBackend::release(const std::shared_ptr<Sandbox>& sb, bool kill, std::string_view why) {
  if (!sb) return;
  auto it = pool_.find(sb->id);
  if (kill) {
    if (it != pool_.end()) pool_.erase(it);
    kill_later(sb->id, std::string(why));
    return;
  }
  if (sb->key == "<stale>") {
    if (it != pool_.end()) pool_.erase(it);
    return;
  }
  sb->in_use = false;
  sb->last_used = Clock::now();
}

// ---------------------------------------------------------------------------
// Control plane
// ---------------------------------------------------------------------------

E2BBackend::Step<E2BBackend::Refresh> E2BBackend::refresh(RunCtx& ctx, Sandbox& sb) {
  json body = {{"timeout", ctx.ttl_s}};
  auto r = co_await http_.request(control_request(ctx, "POST", "/sandboxes/" + sb.id + "/timeout", body.dump()));
  if (r.ok() && (r.status == 204 || r.status == 200)) {
    sb.expires_at = Clock::now() + std::chrono::seconds(ctx.ttl_s);
    ++counters_["refreshed"];
    co_return Refresh::extended;
  }
  if (r.ok() && r.status == 404) co_return Refresh::gone;
  Fail fail = fail_from_http(ctx, r, "refreshing the timeout of sandbox " + sb.id, false);
  fail.kill = false;
  co_return fail;
}

E2BBackend::Step<std::shared_ptr<E2BBackend::Sandbox>> E2BBackend::adopt(RunCtx& ctx) {
  std::vector<std::string> candidates;
  std::string next;
  for (int page = 0; page < 20; ++page) {
    std::string path = "/v2/sandboxes?" + e2b_metadata_param(ctx.metadata) + "&state=running&limit=100";
    if (!next.empty()) path += "&nextToken=" + http::py_quote_plus(next);
    auto r = co_await http_.request(control_request(ctx, "GET", path, ""));
    if (!r.ok() || r.status != 200) {
      Fail fail = fail_from_http(ctx, r, "listing sandboxes", false);
      fail.kill = false;
      co_return fail;
    }
    json arr = protocol::parse_json_bounded(r.body);
    if (!arr.is_array())
      co_return Fail{.detail = "bad_response",
                     .message = "listing sandboxes: the answer is not a JSON array",
                     .kill = false};
    // A sandbox this daemon is creating may be listed before its create
    // answer arrived; adopting it would put two runs into one kernel.
    if (creates_in_flight_ > 0) co_return nullptr;
    for (const auto& s : arr) {
      if (!s.is_object()) continue;
      std::string id = str_field(s, "sandboxID");
      if (!valid_sandbox_id(id) || pool_.count(id) || adopting_.count(id) || created_ids_.count(id)) continue;
      if (s.contains("state") && s["state"] != "running") continue;
      // The filter is E2B's; check it again, a sandbox of another
      // configuration must never be picked up.
      bool match = s.contains("metadata") && s["metadata"].is_object();
      for (const auto& [k, v] : ctx.metadata)
        if (match && (!s["metadata"].contains(k) || s["metadata"][k] != v)) match = false;
      if (match) candidates.push_back(id);
    }
    next = r.header("x-next-token");
    if (next.empty()) break;
  }
  for (std::size_t i = 0; i < candidates.size() && i < 3; ++i) {
    const std::string& id = candidates[i];
    if (pool_.count(id) || adopting_.count(id) || created_ids_.count(id)) continue;
    adopting_.insert(id);
    struct Unmark {
      std::set<std::string>& s;
      std::string id;
      ~Unmark() { s.erase(id); }
    } unmark{adopting_, id};
    auto r = co_await http_.request(control_request(ctx, "GET", "/sandboxes/" + id, ""));
    if (r.ok() && r.status == 404) continue;
    if (!r.ok() || r.status != 200) {
      Fail fail = fail_from_http(ctx, r, "reading sandbox " + id, false);
      fail.kill = false;
      co_return fail;
    }
    json j = protocol::parse_json_bounded(r.body);
    if (!j.is_object()) continue;
    auto sb = std::make_shared<Sandbox>();
    sb->id = id;
    sb->token = str_field(j, "envdAccessToken");
    if (j.contains("domain") && j["domain"].is_string()) sb->domain = j["domain"].get<std::string>();
    if (!valid_token(sb->token) || (!sb->domain.empty() && !valid_domain(sb->domain))) continue;
    sb->key = ctx.pool_key;
    sb->in_use = true;
    auto refreshed = co_await refresh(ctx, *sb);
    // context: a step's Fail names what the step was doing
    if (!refreshed.ok()) co_return std::move(refreshed).error();
    if (*refreshed == Refresh::gone) continue;
    if (pool_.count(id) || created_ids_.count(id)) continue;  // taken meanwhile
    created_ids_.insert(id);
    ++counters_["adopted"];
    co_return sb;
  }
  co_return nullptr;
}

E2BBackend::Step<std::shared_ptr<E2BBackend::Sandbox>> E2BBackend::create(RunCtx& ctx) {
  json md = json::object();
  for (const auto& [k, v] : ctx.metadata) md[k] = v;
  json body = {{"templateID", cfg_.template_id},
               {"timeout", ctx.ttl_s},
               {"autoPause", false},
               {"secure", true},
               {"metadata", md},
               {"envVars", json::object()}};
  body.update(ctx.network);  // allow_internet_access, and network for egress: exactly what the digest covers
  ++creates_in_flight_;
  auto r = co_await http_.request(control_request(ctx, "POST", "/sandboxes", body.dump()));
  --creates_in_flight_;
  {
    json j = protocol::parse_json_bounded(r.body);
    if (j.is_object() && j.contains("sandboxID") && j["sandboxID"].is_string())
      created_ids_.insert(j["sandboxID"].get<std::string>());
  }
  if (!r.ok() || (r.status != 201 && r.status != 200)) {
    Fail fail = fail_from_http(ctx, r, "creating a sandbox", false);
    fail.kill = false;
    co_return fail;
  }
  json j = protocol::parse_json_bounded(r.body);
  std::string id = j.is_object() ? str_field(j, "sandboxID") : "";
  auto bad = [&](std::string why) {
    if (valid_sandbox_id(id)) kill_later(id, "unusable create answer");
    return Fail{.detail = "bad_response", .message = "creating a sandbox: " + why, .kill = false};
  };
  if (!valid_sandbox_id(id)) co_return bad("the answer has no usable sandboxID");
  auto sb = std::make_shared<Sandbox>();
  sb->id = id;
  sb->token = str_field(j, "envdAccessToken");
  if (j.contains("domain") && j["domain"].is_string()) sb->domain = j["domain"].get<std::string>();
  if (!valid_token(sb->token))
    co_return bad("the answer has no usable envdAccessToken (the sandbox was created with secure: true)");
  if (!sb->domain.empty() && !valid_domain(sb->domain)) co_return bad("the answer's domain is not a host name");
  sb->key = ctx.pool_key;
  sb->in_use = true;
  sb->expires_at = Clock::now() + std::chrono::seconds(ctx.ttl_s);
  ++counters_["created"];
  spdlog::info("e2b: created sandbox {} (template {}, network {}, ttl {}s)", id, q(cfg_.template_id),
               ctx.network_digest, ctx.ttl_s);
  co_return sb;
}

E2BBackend::Step<std::shared_ptr<E2BBackend::Sandbox>> E2BBackend::acquire(RunCtx& ctx) {
  // 1. An idle sandbox of ours with the same key, most recently used first.
  for (;;) {
    std::shared_ptr<Sandbox> pick;
    auto now = Clock::now();
    for (auto& [id, sb] : pool_) {
      if (sb->in_use || sb->key != ctx.pool_key || sb->expires_at <= now + kReuseMargin) continue;
      if (!pick || sb->last_used > pick->last_used) pick = sb;
    }
    if (!pick) break;
    pick->in_use = true;
    auto refreshed = co_await refresh(ctx, *pick);
    if (!refreshed.ok()) {
      pick->in_use = false;
      // context: a step's Fail names what the step was doing
      co_return std::move(refreshed).error();
    }
    if (*refreshed == Refresh::extended) {
      ctx.reused = true;
      co_return pick;
    }
    created_ids_.erase(pick->id);
    pool_.erase(pick->id);  // E2B no longer knows it
  }
  // Idle sandboxes past their TTL are gone at E2B already.
  auto now = Clock::now();
  for (auto it = pool_.begin(); it != pool_.end();) {
    if (!it->second->in_use && it->second->expires_at <= now) {
      created_ids_.erase(it->first);
      it = pool_.erase(it);
    } else {
      ++it;
    }
  }

  // 2. Room for one more: evict the least recently used idle sandbox if
  //    that is what it takes, else the daemon is busy.
  if (pool_.size() + creating_ >= cfg_.max_sandboxes) {
    std::shared_ptr<Sandbox> lru;
    for (auto& [id, sb] : pool_)
      if (!sb->in_use && (!lru || sb->last_used < lru->last_used)) lru = sb;
    if (!lru) co_return std::shared_ptr<Sandbox>();  // busy: no sandbox, and no failure
    pool_.erase(lru->id);
    kill_later(lru->id, "evicted to make room");
  }
  ++creating_;
  struct Dec {
    unsigned& n;
    ~Dec() { --n; }
  } dec{creating_};

  // 3. A running sandbox with our metadata (left by an earlier daemon);
  //    when there is none, and looking for one did not fail, 4.
  auto adopted = co_await adopt(ctx);
  // context: a step's Fail names what the step was doing
  if (!adopted.ok()) co_return std::move(adopted).error();
  if (std::shared_ptr<Sandbox> sb = std::move(adopted).value()) {
    ctx.adopted = true;
    pool_[sb->id] = sb;
    co_return sb;
  }
  // 4. A new one.
  auto created = co_await create(ctx);
  // context: a step's Fail names what the step was doing
  if (!created.ok()) co_return std::move(created).error();
  std::shared_ptr<Sandbox> sb = std::move(created).value();
  pool_[sb->id] = sb;
  co_return sb;
}

// ---------------------------------------------------------------------------
// Data plane
// ---------------------------------------------------------------------------

struct E2BBackend::Install {
  enum class Kind { pip, npm, letta_client } kind = Kind::pip;
  std::string requirement;  // canonical text: what is installed, and its key in Sandbox::installed
  std::string shown;        // how Letta's message names it
};

E2BBackend::Step<void> E2BBackend::install(RunCtx& ctx, Sandbox& sb, const Install& in) {
  const std::string& requirement = in.requirement;
  const bool npm = in.kind != Install::Kind::pip;
  json process = npm ? json{{"cmd", "npm"}, {"args", json::array({"install", "--", requirement})}, {"cwd", kKernelCwd}}
                     : json{{"cmd", "python3"},
                            {"args", json::array({"-m", "pip", "install", "--no-input", "--", requirement})}};
  std::string msg = json{{"process", process}}.dump();
  http::Request r;
  r.method = "POST";
  r.url = e2b_sandbox_base_url(cfg_, sb.id, kEnvdPort, sb.domain) + "/process.Process/Start";
  r.headers = data_headers(sb, kEnvdPort);
  r.headers.emplace_back("Content-Type", "application/connect+json");
  r.headers.emplace_back("Connect-Protocol-Version", "1");
  r.headers.emplace_back("Connect-Content-Encoding", "identity");
  r.headers.emplace_back("Authorization", "Basic dXNlcjo=");  // base64("user:"): run as the sandbox's user
  r.headers.emplace_back("Keepalive-Ping-Interval", kEnvdKeepalive);
  r.headers.emplace_back("Connect-Timeout-Ms", std::to_string(ctx.remaining().count()));
  r.body = std::string(1, '\0') + letta::big_endian_u32(static_cast<std::uint32_t>(msg.size())) + msg;
  r.timeout = ctx.remaining();
  r.stall_timeout = kEnvdStall;
  r.cancel = ctx.cancel;

  struct State {
    std::string buf;
    bool started = false, ended = false, trailer = false, bad = false;
    int exit_code = 0;
    std::string end_error, out, err;
    json trailer_error;
  } st;
  auto on_chunk = [&](std::string_view d) -> bool {
    st.buf.append(d);
    while (st.buf.size() >= 5) {
      auto b = [&](int i) { return static_cast<std::uint32_t>(static_cast<unsigned char>(st.buf[i])); };
      std::uint8_t flags = static_cast<std::uint8_t>(b(0));
      std::uint32_t len = (b(1) << 24) | (b(2) << 16) | (b(3) << 8) | b(4);
      if (len > kMaxEnvelope) {
        st.bad = true;
        return false;
      }
      if (st.buf.size() < 5 + static_cast<std::size_t>(len)) break;
      json m = protocol::parse_json_bounded(st.buf.substr(5, len));
      st.buf.erase(0, 5 + static_cast<std::size_t>(len));
      if (!m.is_object()) {
        st.bad = true;
        return false;
      }
      if (flags & 0x02) {  // end of stream
        st.trailer = true;
        if (m.contains("error")) st.trailer_error = m["error"];
        continue;
      }
      if (!m.contains("event") || !m["event"].is_object()) continue;
      const json& ev = m["event"];
      if (ev.contains("start")) st.started = true;
      if (ev.contains("data") && ev["data"].is_object()) {
        for (const char* k : {"stdout", "stderr"}) {
          if (!ev["data"].contains(k) || !ev["data"][k].is_string()) continue;
          auto raw = lp::b64decode_validate(ev["data"][k].get<std::string>());
          if (!raw.ok()) continue;
          std::string& dst = std::string_view(k) == "stdout" ? st.out : st.err;
          dst += *raw;
          if (dst.size() > 64 * 1024) dst.erase(0, dst.size() - 64 * 1024);
        }
      }
      if (ev.contains("end") && ev["end"].is_object()) {
        st.ended = true;
        const json& e = ev["end"];
        if (e.contains("exitCode") && e["exitCode"].is_number_integer()) st.exit_code = e["exitCode"].get<int>();
        if (e.contains("error") && e["error"].is_string()) st.end_error = e["error"].get<std::string>();
      }
    }
    return true;
  };
  std::string what = "installing " + q(requirement);
  auto res = co_await http_.stream(std::move(r), on_chunk);
  if (st.bad) co_return Fail{.detail = "stream_error", .message = what + ": malformed Connect envelope from envd"};
  if (!res.ok() && !(st.trailer && res.failure == http::Failure::Transport))
    co_return fail_from_http(ctx, res, what, true);
  if (res.status != 200) co_return fail_from_http(ctx, res, what, true);
  if (!st.trailer || !st.started)
    co_return Fail{.detail = "stream_error",
                   .message = what + ": the process stream ended without " +
                              (st.started ? "its end-of-stream message" : "a start event")};
  auto pip_failed = [&](std::string why) {
    std::string err = trim_ws(lp::utf8_decode_replace(st.err).text);
    if (npm)  // Letta's message, with the E2B SDK's CommandExitException text
      return Fail{.end_reason = "setup_failed",
                  .detail = "npm_install_failed",
                  .message = "Failed to install tool npm requirement '" + escaped(in.shown) + "' for tool '" +
                             escaped(ctx.tool_name) +
                             "' in E2B sandbox. This may be due to package version incompatibility. Error: " + why +
                             " and error:\n" + escaped(tail(err, 600)),
                  .exc_name = "RuntimeError"};
    return Fail{.end_reason = "setup_failed",
                .detail = "pip_install_failed",
                .message = "Failed to install " + requirement + " in E2B sandbox: " + why +
                           (err.empty() ? std::string() : ": " + escaped(tail(err, 600))),
                .exc_name = "RuntimeError"};
  };
  if (st.trailer_error.is_object())
    co_return pip_failed("envd ended the command with " + escaped(str_field(st.trailer_error, "code", "unknown")) + " " +
                         q(str_field(st.trailer_error, "message")));
  if (!st.ended) co_return pip_failed("the command ended without an exit status");
  if (st.exit_code != 0)
    co_return pip_failed(npm ? "Command exited with code " + std::to_string(st.exit_code)
                             : "pip exited with code " + std::to_string(st.exit_code));
  sb.installed.insert(npm ? "npm:" + requirement : requirement);
  (npm ? ctx.npm_installed_now : ctx.installed_now).push_back(requirement);
  co_return Outcome<void>();
}

E2BBackend::Step<std::string> E2BBackend::new_context(RunCtx& ctx, Sandbox& sb, const char* language) {
  http::Request r;
  r.method = "POST";
  r.url = e2b_sandbox_base_url(cfg_, sb.id, kInterpreterPort, sb.domain) + "/contexts";
  r.headers = data_headers(sb, kInterpreterPort);
  r.headers.emplace_back("Content-Type", "application/json");
  r.body = json{{"language", language}, {"cwd", kKernelCwd}}.dump();
  r.timeout = std::min<std::chrono::milliseconds>(kControlTimeout, ctx.remaining());
  r.cancel = ctx.cancel;
  auto res = co_await http_.request(std::move(r));
  if (!res.ok() || (res.status != 200 && res.status != 201))
    co_return fail_from_http(ctx, res, "creating a kernel context", true);
  json j = protocol::parse_json_bounded(res.body);
  std::string context_id = j.is_object() ? str_field(j, "id") : "";
  if (!valid_sandbox_id(context_id))
    co_return Fail{.detail = "bad_response", .message = "creating a kernel context: the answer has no usable id"};
  co_return context_id;
}

asio::awaitable<bool> E2BBackend::delete_context(RunCtx& ctx, Sandbox& sb, const std::string& context_id) {
  http::Request r;
  r.method = "DELETE";
  r.url = e2b_sandbox_base_url(cfg_, sb.id, kInterpreterPort, sb.domain) + "/contexts/" + context_id;
  r.headers = data_headers(sb, kInterpreterPort);
  r.timeout = 10s;
  auto res = co_await http_.request(std::move(r));
  co_return res.ok() && (res.status == 200 || res.status == 204);
}

E2BBackend::Step<void> E2BBackend::execute(RunCtx& ctx, Sandbox& sb, const std::string& code,
                                           const std::string& context_id, std::chrono::milliseconds stall, Exec& ex) {
  http::Request r;
  r.method = "POST";
  r.url = e2b_sandbox_base_url(cfg_, sb.id, kInterpreterPort, sb.domain) + "/execute";
  r.headers = data_headers(sb, kInterpreterPort);
  r.headers.emplace_back("Content-Type", "application/json");
  r.body = dump_json(json{{"code", code},
                          {"context_id", context_id.empty() ? json() : json(context_id)},
                          {"language", nullptr},
                          {"env_vars", nullptr}});
  r.timeout = ctx.remaining();
  r.stall_timeout = stall;
  r.cancel = ctx.cancel;

  auto on_line = [&](std::string_view line) -> bool {
    if (ex.ended || line.empty()) return true;
    json m = protocol::parse_json_bounded(line);
    if (!m.is_object()) {
      ex.bad_line = true;
      ex.bad_text = lp::utf8_decode_replace(line.substr(0, 120)).text;
      return false;
    }
    std::string type = m.contains("type") && m["type"].is_string() ? m["type"].get<std::string>() : "";
    if (type == "stdout" || type == "stderr") {
      const bool out = type == "stdout";
      std::string text = m.contains("text") && m["text"].is_string() ? m["text"].get<std::string>() : "";
      auto& bytes = out ? ex.out_bytes : ex.err_bytes;
      bytes += text.size();
      if (bytes > (out ? ctx.stdout_cap : ctx.stderr_cap)) {
        (out ? ex.out_over : ex.err_over) = true;
        return false;
      }
      (out ? ex.out : ex.err).push_back(std::move(text));
    } else if (type == "result") {
      // The cell's value is the result marked main; display() output is
      // not (Letta took results[0], which an earlier display() wins).
      if (auto it = m.find("is_main_result"); it != m.end() && it->is_boolean() && it->get<bool>()) {
        if (!ex.main_result) ex.main_result = m;
      } else {
        ++ex.display_results;
      }
    } else if (type == "error") {
      ex.error = m;
    } else if (type == "number_of_executions") {
      if (m.contains("execution_count") && m["execution_count"].is_number_integer())
        ex.execution_count = m["execution_count"].get<int>();
    } else if (type == "end_of_execution") {
      ex.ended = true;
    }
    return true;
  };
  http::LineSplitter lines(kMaxLine);
  auto res = co_await http_.stream(std::move(r), [&](std::string_view d) { return lines.feed(d, on_line); });
  // A last line without its newline.
  if (res.ok() && !ex.ended && !lines.pending().empty()) on_line(lines.pending());

  const std::string what = "running the cell";
  if (ex.out_over || ex.err_over)
    co_return Fail{.end_reason = "output_limit",
                   .detail = {},
                   .message = what + ": " + (ex.out_over ? "stdout" : "stderr") + " went past its cap",
                   .exc_name = "RuntimeError"};
  if (ex.bad_line || lines.overflowed())
    co_return Fail{
        .detail = "stream_error",
        .message = what + (ex.bad_line ? ": the /execute stream broke off with a line that is not a JSON object: " +
                                             q(ex.bad_text)
                                       : ": the /execute stream carried an over-long line")};
  if (!res.ok() && !(ex.ended && res.failure == http::Failure::Transport))
    co_return fail_from_http(ctx, res, what, true);
  if (res.status != 200) co_return fail_from_http(ctx, res, what, true);
  if (!ex.ended)
    co_return Fail{.detail = "stream_error",
                   .message = what + ": the /execute stream ended without end_of_execution (truncated)"};
  co_return Outcome<void>();
}

// ---------------------------------------------------------------------------
// One run
// ---------------------------------------------------------------------------

namespace {

json base_record() {
  isolate::RunResult empty;
  empty.reason = isolate::EndReason::Exited;
  json rec = run_record_json(empty);
  rec["exit_code"] = nullptr;
  return rec;
}

}  // namespace

RequirementRules E2BBackend::requirement_rules(const Policy& pol) const {
  // pip in the E2B sandbox, from the index it reaches: only with internet
  // access; the policy's limit on their number; URLs only when configured.
  RequirementRules r;
  if (pol.network == isolate::NetworkMode::None)
    r.refusal = "pip requirements need network access, which policy " + q(pol.name) +
                " does not allow (its sandboxes have no internet access)";
  r.max = pol.packages.max_requirements;
  r.allow_urls = cfg_.allow_requirement_urls;
  r.urls_hint = "e2b.allow_requirement_urls is off";
  return r;
}

TypeScriptRules E2BBackend::typescript_rules(const Policy& pol) const {
  // npm in the E2B sandbox, from the registry it reaches: only with
  // internet access, as pip; the policy's limit on their number.
  TypeScriptRules r;
  if (pol.network == isolate::NetworkMode::None)
    r.npm_refusal = "npm requirements need network access, which policy " + q(pol.name) +
                    " does not allow (its sandboxes have no internet access)";
  r.max_npm = pol.packages.max_requirements;
  r.pip = true;
  return r;
}

namespace {

// The runner as a tool cell sends it: {"runner": its source, "package": its
// package's modules by their path below the runner's directory} (what a
// local sandbox is shown of it, find_runner_files, source only). Read for
// every run: an update of the installed runner applies to the next one.
Result<json> read_runner(const std::string& runner_path) {
  auto src = read_file(runner_path, {.max_bytes = 1u << 20, .regular_only = true});
  if (!src.ok()) return std::move(src).error().wrap("the tool runner");
  if (src->empty()) return Error::invalid("the tool runner '" + runner_path + "' is empty", EIO);
  char real[PATH_MAX];
  const std::string runner = ::realpath(runner_path.c_str(), real) ? std::string(real) : runner_path;
  json package = json::object();
  for (const std::string& m : find_runner_package(runner)) {
    auto part = read_file(m, {.max_bytes = 1u << 20, .regular_only = true});
    if (!part.ok()) return std::move(part).error().wrap("the tool runner's package");
    package[m.substr(runner.rfind('/') + 1)] = std::move(part).value();
  }
  if (package.empty()) return Error::invalid("the tool runner's package beside '" + runner + "' is missing", ENOENT);
  return json{{"runner", std::move(src).value()}, {"package", std::move(package)}};
}

}  // namespace

E2BBackend::RunCtx E2BBackend::run_context(const PreparedRun& p, const std::string& config_state) const {
  const Policy& pol = p.policy();
  const std::string& org = p.common->organization_id;
  RunCtx ctx;
  ctx.tool_name = p.common->tool_name;
  ctx.t0 = Clock::now();
  ctx.timeout = p.timeout;
  ctx.timeout_s = p.shape.timeout_s;
  ctx.deadline = ctx.t0 + ctx.timeout;
  // The pipeline requests it when the client goes away; the daemon's
  // shutdown, through running_.
  ctx.cancel = p.cancel;
  // The policy's network as E2B takes it (daemon/policy/e2b_network.h),
  // and its digest: sandboxes created with different rules are never shared.
  const E2BNetwork net = e2b_network(pol);
  ctx.network = net.body;
  ctx.network_digest = net.digest;
  ctx.internet = pol.network != isolate::NetworkMode::None;
  const std::string& network = net.digest;
  // The request's organization is part of the key (and of the metadata a
  // restarted daemon adopts sandboxes by) whatever the fingerprint hashes:
  // the sandbox config may name another organization, and a sandbox is never
  // shared between organizations.
  ctx.metadata = {{"config_state", config_state}, {"tsb_network", network}, {"tsb_org", org}};
  ctx.pool_key = config_state + "|" + network + "|" + org;
  // The sandbox must outlive the run it serves.
  ctx.ttl_s = std::max<long>(cfg_.sandbox_ttl.count(),
                             std::chrono::duration_cast<std::chrono::seconds>(ctx.timeout).count() + 30);
  ctx.stdout_cap = pol.limits.stdout_bytes;
  ctx.stderr_cap = pol.limits.stderr_bytes;
  return ctx;
}

E2BBackend::Step<void> E2BBackend::run_tool_cell(RunCtx& ctx, Sandbox& sb, PreparedRun& p, json spec, BackendRun& out,
                                                 Printed& printed) {
  // The fixed cell runs the runner on the request; the beat marks its
  // heartbeat on stderr, which is dropped from what the tool printed.
  const std::string beat = "<<TSB-HB-" + random_hex(8) + ">>";
  spec["request"] = std::move(p.runner_request);
  spec["env"] = p.env;
  spec["timeout"] = ctx.timeout_s;
  spec["heartbeat"] = kHeartbeatSeconds;
  spec["beat"] = beat;
  Exec ex;
  auto ran = co_await execute(ctx, sb, e2b_tool_cell(lp::b64encode(dump_json(spec))), "", kToolStall, ex);
  printed.out = join(ex.out);
  printed.err = join(ex.err);
  erase_all(printed.err, beat);
  // context: a step's Fail names what the step was doing
  if (!ran.ok()) co_return std::move(ran).error();
  if (ex.error) {
    std::string tb = str_field(*ex.error, "traceback");
    if (!tb.empty()) printed.err += (printed.err.empty() || printed.err.back() == '\n' ? "" : "\n") + tb;
    co_return Fail{.detail = "execution_error",
                   .message = "the fixed cell failed in the sandbox: " + escaped(str_field(*ex.error, "name")) + ": " +
                              escaped(str_field(*ex.error, "value")),
                   .exc_name = str_field(*ex.error, "name", "SandboxException")};
  }
  // The cell's main result is the runner's exit status (negative: a signal).
  std::string text = ex.main_result ? str_field(*ex.main_result, "text") : "";
  char* end = nullptr;
  long rc = text.empty() ? 0 : std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || rc < -255 || rc > 255)
    co_return Fail{.detail = "bad_response", .message = "the fixed cell returned no exit status"};
  // The pipeline shapes it as it shapes a local run.
  out.run.reason = rc < 0 ? isolate::EndReason::Signaled : isolate::EndReason::Exited;
  out.run.exit_code = rc < 0 ? -1 : static_cast<int>(rc);
  out.run.signal = rc < 0 ? static_cast<int>(-rc) : 0;
  out.run.stdout_data = printed.out;
  out.run.stderr_data = printed.err;
  out.run.stdout_total_bytes = printed.out.size();
  out.run.stderr_total_bytes = printed.err.size();
  out.run.wall = Clock::now() - ctx.t0;
  co_return Outcome<void>();
}

E2BBackend::Step<void> E2BBackend::run_script_cell(RunCtx& ctx, std::shared_ptr<Sandbox>& sb, PreparedRun& p,
                                                   BackendRun& out, Printed& printed) {
  // A fresh kernel context; the environment goes in by its own fixed cell,
  // then the script as Letta's E2B sandbox runs it.
  const std::string& script = std::get<protocol::ExecuteRequest>(p.request->body).script;
  // A TypeScript tool's script (Letta's run_code(language="ts")) runs in a
  // TypeScript context, with the environment set by its TypeScript cell.
  auto made = co_await new_context(ctx, *sb, p.typescript ? "typescript" : "python");
  // context: a step's Fail names what the step was doing
  if (!made.ok()) co_return std::move(made).error();
  const std::string context_id = std::move(made).value();
  if (!p.env.empty()) {
    Exec pre;
    auto env_set = co_await execute(ctx, *sb, with_blob(p.typescript ? kTsEnvCell : kEnvCell, lp::b64encode(dump_json(json(p.env)))),
                                    context_id, 0ms, pre);
    // context: a step's Fail names what the step was doing
    if (!env_set.ok()) co_return std::move(env_set).error();
    if (pre.error)
      co_return Fail{.detail = "execution_error",
                     .message = "setting the environment failed in the sandbox: " + escaped(str_field(*pre.error, "name")) +
                                ": " + escaped(str_field(*pre.error, "value"))};
  }
  Exec ex;
  auto ran = co_await execute(ctx, *sb, script, context_id, 0ms, ex);
  printed.out = join(ex.out);
  printed.err = join(ex.err);
  // context: a step's Fail names what the step was doing
  if (!ran.ok()) co_return std::move(ran).error();
  // What the kernel reported; the pipeline shapes it (shape_cell).
  CellOutcome& cell = out.cell.emplace();
  cell.typescript = p.typescript;
  if (ex.main_result) cell.main_result = str_field(*ex.main_result, "text");
  cell.out = ex.out;
  cell.err = ex.err;
  if (ex.error)
    cell.error = CellOutcome::Raised{str_field(*ex.error, "name"), str_field(*ex.error, "value"),
                                     str_field(*ex.error, "traceback")};
  out.run.reason = isolate::EndReason::Exited;
  out.run.stdout_total_bytes = ex.out_bytes;
  out.run.stderr_total_bytes = ex.err_bytes;
  out.record = base_record();
  out.record["exit_code"] = ex.error ? 1 : 0;
  out.record["stdout_bytes"] = ex.out_bytes;
  out.record["stderr_bytes"] = ex.err_bytes;
  if (ex.display_results) out.record["display_results"] = ex.display_results;
  // The kernel (and the variables the script left in it) goes away; if
  // that fails, the whole sandbox does (the run stands).
  if (!co_await delete_context(ctx, *sb, context_id)) {
    release(sb, true, "its kernel context could not be deleted");
    sb = nullptr;
  }
  co_return Outcome<void>();
}

E2BBackend::Step<void> E2BBackend::run_ts_tool_cells(RunCtx& ctx, std::shared_ptr<Sandbox>& sb, PreparedRun& p,
                                                     BackendRun& out, Printed& printed) {
  const auto& t = std::get<protocol::RunToolRequest>(p.request->body);
  auto made = co_await new_context(ctx, *sb, "typescript");
  // context: a step's Fail names what the step was doing
  if (!made.ok()) co_return std::move(made).error();
  const std::string context_id = std::move(made).value();
  Exec ex;
  // A fixed cell's own failure (not the tool's) leaves the kernel in an
  // unknown state: the sandbox is killed.
  auto fixed_failed = [&](const Exec& e, const char* what) {
    return Fail{.detail = "execution_error",
                .message = std::string(what) + " failed in the sandbox: " + escaped(str_field(*e.error, "name")) + ": " +
                           escaped(str_field(*e.error, "value"))};
  };
  if (!p.env.empty()) {
    Exec pre;
    auto env_set = co_await execute(ctx, *sb, with_blob(kTsEnvCell, lp::b64encode(dump_json(json(p.env)))), context_id,
                                    0ms, pre);
    // context: a step's Fail names what the step was doing
    if (!env_set.ok()) co_return std::move(env_set).error();
    if (pre.error) co_return fixed_failed(pre, "setting the environment");
  }
  // The tool's source as Letta's script holds it, in a cell of its own:
  // its declarations become the context's globals. An error there is the
  // tool's (Letta's script would raise it): the kernel's error, shaped as
  // in script mode.
  {
    Exec src;
    auto ran = co_await execute(ctx, *sb, e2b_typescript_source(t.source_code), context_id, 0ms, src);
    printed.out = join(src.out);
    printed.err = join(src.err);
    // context: a step's Fail names what the step was doing
    if (!ran.ok()) co_return std::move(ran).error();
    if (src.error) {
      CellOutcome& cell = out.cell.emplace();
      cell.typescript = true;
      cell.out = src.out;
      cell.err = src.err;
      cell.error = CellOutcome::Raised{str_field(*src.error, "name"), str_field(*src.error, "value"),
                                       str_field(*src.error, "traceback")};
      out.record = base_record();
      out.record["exit_code"] = 1;
      out.record["failed_cell"] = "source";
      out.run.reason = isolate::EndReason::Exited;
    }
  }
  if (!out.cell) {
    // The call: arguments and schema spliced in as the client sent them
    // (their key order is Letta's positional order), the name as a string.
    std::string spec = "{\"name\":" + dump_json(json(p.common->tool_name)) + ",\"nonce\":" + dump_json(json(p.shape.nonce)) +
                       ",\"await\":" + (e2b_typescript_is_async(t.source_code, p.common->tool_name) ? "true" : "false") +
                       ",\"args\":" + t.args + ",\"schema\":" + t.json_schema + "}";
    auto ran = co_await execute(ctx, *sb, e2b_typescript_tool_cell(lp::b64encode(spec)), context_id, 0ms, ex);
    printed.out += join(ex.out);
    printed.err += join(ex.err);
    // context: a step's Fail names what the step was doing
    if (!ran.ok()) co_return std::move(ran).error();
    if (ex.error) co_return fixed_failed(ex, "the fixed call cell");
    const std::string text = ex.main_result ? str_field(*ex.main_result, "text") : "";
    if (text != "0" && text != "1")
      co_return Fail{.detail = "bad_response", .message = "the fixed call cell returned no exit status"};
    // The pipeline shapes it as a run_tool of a Python tool on E2B.
    out.run.reason = isolate::EndReason::Exited;
    out.run.exit_code = text == "0" ? 0 : 1;
    out.run.stdout_data = printed.out;
    out.run.stderr_data = printed.err;
    out.run.stdout_total_bytes = printed.out.size();
    out.run.stderr_total_bytes = printed.err.size();
    out.run.wall = Clock::now() - ctx.t0;
  }
  if (!co_await delete_context(ctx, *sb, context_id)) {
    release(sb, true, "its kernel context could not be deleted");
    sb = nullptr;
  }
  co_return Outcome<void>();
}

E2BBackend::Step<void> E2BBackend::npm_installs(RunCtx& ctx, Sandbox& sb, PreparedRun& p) {
  // As Letta's E2B sandbox: each npm requirement (a failure ends the run),
  // then its client package (a failure only warns). Each once per sandbox.
  for (const auto& r : p.npm_requirements) {
    if (sb.installed.count("npm:" + r.text())) continue;
    // Letta names it str(NpmRequirement): name@"version".
    const Install in{Install::Kind::npm, r.text(), r.range.empty() ? r.name : r.name + "@\"" + r.range + "\""};
    auto done = co_await install(ctx, sb, in);
    // context: a step's Fail names what the step was doing
    if (!done.ok()) co_return std::move(done).error();
  }
  // Without internet access npm cannot reach a registry: not tried.
  if (!ctx.internet) {
    ctx.letta_client = "skipped";
    co_return Outcome<void>();
  }
  const std::string client_key = std::string("npm:") + kLettaClientPackage;
  if (sb.installed.count(client_key) || sb.installed.count(client_key + " failed")) co_return Outcome<void>();
  // A named Install: GCC 12 destroys a braced temporary in a co_await twice.
  const Install client{Install::Kind::letta_client, kLettaClientPackage, kLettaClientPackage};
  auto done = co_await install(ctx, sb, client);
  if (done.ok()) {
    ctx.letta_client = "installed";
  } else if (done.error().end_reason == "setup_failed") {
    // npm ran and failed: Letta logs a warning and runs the tool. Not tried
    // again in this sandbox.
    ctx.letta_client = "failed";
    sb.installed.insert(client_key + " failed");
    spdlog::warn("e2b: installing {} in sandbox {} failed (the tool runs without it): {}", kLettaClientPackage, sb.id,
                 redact(done.error().message));
  } else {
    // context: a step's Fail names what the step was doing
    co_return std::move(done).error();
  }
  co_return Outcome<void>();
}

void E2BBackend::record_failure(const RunCtx& ctx, const Fail& fail, BackendRun& out, const Printed& printed) const {
  isolate::RunResult& run = out.run;
  run.stdout_data = printed.out;
  run.stderr_data = printed.err;
  run.stdout_total_bytes = printed.out.size();
  run.stderr_total_bytes = printed.err.size();
  run.wall = Clock::now() - ctx.t0;
  if (fail.end_reason == "timeout" || fail.end_reason == "cancelled" || fail.end_reason == "output_limit") {
    // Shaped by the pipeline, as a local run that ended so.
    run.reason = fail.end_reason == "timeout"     ? isolate::EndReason::Timeout
                 : fail.end_reason == "cancelled" ? isolate::EndReason::Cancelled
                                                  : isolate::EndReason::OutputLimit;
    if (run.reason == isolate::EndReason::OutputLimit) {
      run.stdout_truncated = printed.out.size() >= ctx.stdout_cap;
      run.stderr_truncated = printed.err.size() >= ctx.stderr_cap;
    }
    out.record["error"] = fail.message;
    return;
  }
  // backend_error / setup_failed: Letta's manager would report the
  // exception the E2B SDK raised (ToolExecutionManager, Letta's
  // letta/services/tool_executor/tool_execution_manager.py).
  run.reason = isolate::EndReason::Exited;
  out.end_reason = fail.end_reason;
  out.record["exit_code"] = nullptr;
  out.record["detail"] = fail.detail;
  out.record["error"] = fail.message;
  if (fail.end_reason == "setup_failed") {
    out.record["setup_stage"] = fail.detail == "npm_install_failed" ? "npm-install" : "pip-install";
    out.record["setup_errno"] = 0;
  }
  out.failure = RunFailure{fail.exc_name, fail.message};
}

asio::awaitable<BackendRun> E2BBackend::run(PreparedRun& p) {
  const protocol::CommonRunFields& c = *p.common;
  BackendRun out;
  auto refuse = [&](ErrorCode code, const std::string& msg) {
    out.refused = Refusal{code, msg};
    return std::move(out);
  };
  if (stopping_) co_return refuse(ErrorCode::Unavailable, "the daemon is shutting down");
  if (api_key_.empty()) co_return refuse(ErrorCode::Unavailable, "E2B is configured but its API key is not loaded");
  // Refused when the policy set was read; checked again here, fail closed.
  if (const E2BNetwork net = e2b_network(p.policy()); !net.refusal.empty())
    co_return refuse(ErrorCode::PolicyDenied, "policy " + q(p.policy().name) + ": " + net.refusal);

  // Everything is checked before any call to E2B. The policy decided which
  // environment names the request may set (prepare_run); its fixed values
  // describe the local sandbox's file system and are not sent: the tool
  // gets a minimal base plus the request's (docs/E2B.md). The requirements
  // were checked there too.
  json spec = json::object();
  if (p.tool_mode && p.typescript) {
    // The tool-mode cell looks the function up by its name.
    if (!e2b_typescript_identifier(c.tool_name))
      co_return refuse(ErrorCode::BadRequest, "tool_name " + q(c.tool_name) +
                                                  " is not an identifier, which a TypeScript tool's name must be");
    // A TypeScript tool has no agent_state: a frame carrying one is not ours.
    p.shape.may_declare = false;
  } else if (p.tool_mode) {
    auto runner = read_runner(p.runner_path);
    if (!runner.ok()) {
      // The host's paths go to the log, not to the client.
      spdlog::error("e2b: {}", runner.error().message);
      co_return refuse(ErrorCode::Internal, "the tool runner cannot be read (the daemon's log says why)");
    }
    spec = std::move(runner).value();
  }
  std::string config_state;
  if (p.fingerprint) {
    config_state = *p.fingerprint;
  } else {
    auto fp = lp::sandbox_config_fingerprint("e2b", c.organization_id, json::object());
    if (!fp.ok()) co_return refuse(ErrorCode::BadRequest, "organization_id: " + fp.error().message);
    config_state = *fp;
  }
  RunCtx ctx = run_context(p, config_state);

  ++in_flight_;
  running_.insert(ctx.cancel);
  // Held until the pipeline has recorded the run, as a local run's slot.
  out.held = std::shared_ptr<void>(nullptr, [this, s = ctx.cancel](void*) {
    --in_flight_;
    running_.erase(s);
  });

  const std::string run_id = random_hex(8);
  auto acquired = co_await acquire(ctx);
  // An ok result without a sandbox: no room (busy), a refusal.
  if (acquired.ok() && !*acquired) {
    ++counters_["busy"];
    co_return refuse(ErrorCode::Busy, "all " + std::to_string(cfg_.max_sandboxes) +
                                          " E2B sandboxes of this daemon are in use; retry later");
  }
  std::shared_ptr<Sandbox> sb = acquired.ok() ? *acquired : nullptr;
  const std::string sandbox_id = sb ? sb->id : "";
  Printed printed;  // what the tool printed, for failures
  Outcome<void> done;
  if (!acquired.ok()) done = std::move(acquired).error();
  // The run's requirements, installed by pip in the sandbox, each once.
  for (const auto& r : p.requirements.items) {
    if (!done.ok() || sb->installed.count(r.text())) continue;
    const Install pip{Install::Kind::pip, r.text(), r.text()};
    done = co_await install(ctx, *sb, pip);
  }
  if (done.ok() && p.typescript) done = co_await npm_installs(ctx, *sb, p);
  out.run.run_id = run_id;
  // Not one conditional expression: GCC 12 runs both co_awaits of one
  // whose operands are not trivial.
  if (done.ok() && p.tool_mode && p.typescript) done = co_await run_ts_tool_cells(ctx, sb, p, out, printed);
  else if (done.ok() && p.tool_mode) done = co_await run_tool_cell(ctx, *sb, p, std::move(spec), out, printed);
  else if (done.ok()) done = co_await run_script_cell(ctx, sb, p, out, printed);
  const Fail* fail = done.ok() ? nullptr : &done.error();
  if (fail) {
    record_failure(ctx, *fail, out, printed);
    spdlog::warn("e2b: run {} ({}): {}{}: {}", run_id, q(c.tool_name), fail->end_reason,
                 fail->detail.empty() ? "" : "/" + fail->detail, redact(fail->message));
  }
  if (sb) {
    if (fail && fail->kill)
      release(sb, true, "the run ended with " + fail->end_reason + (fail->detail.empty() ? "" : "/" + fail->detail));
    else release(sb, false, "");
  }

  out.record["run_id"] = run_id;
  out.record["wall_ms"] = std::chrono::duration<double, std::milli>(Clock::now() - ctx.t0).count();
  out.record["sandbox_id"] = sandbox_id.empty() ? json() : json(sandbox_id);
  out.record["sandbox_reused"] = ctx.reused || ctx.adopted;
  if (!ctx.installed_now.empty()) out.record["pip_installed"] = ctx.installed_now;
  if (!ctx.npm_installed_now.empty()) out.record["npm_installed"] = ctx.npm_installed_now;
  if (!ctx.letta_client.empty()) out.record["letta_client"] = ctx.letta_client;
  ++counters_[out.end_reason.empty() ? std::string(isolate::to_string(out.run.reason)) : out.end_reason];
  out.audit = " sandbox_id=" + (sandbox_id.empty() ? std::string("-") : sandbox_id) +
              " reused=" + (ctx.reused || ctx.adopted ? "yes" : "no") +
              " detail=" + (!fail || fail->detail.empty() ? std::string("-") : fail->detail);
  co_return out;
}

asio::awaitable<void> E2BBackend::shutdown(std::chrono::milliseconds grace) {
  stopping_ = true;
  asio::steady_timer t(io_);
  auto until = Clock::now() + grace;
  while (in_flight_ > 0 && Clock::now() < until) {
    t.expires_after(50ms);
    co_await t.async_wait(tuple_awaitable);
  }
  if (in_flight_ > 0) {
    spdlog::warn("e2b: grace period over: cancelling {} runs", in_flight_);
    auto all = running_;
    for (auto& s : all) s->request();
    until = Clock::now() + 5s;
    while (in_flight_ > 0 && Clock::now() < until) {
      t.expires_after(20ms);
      co_await t.async_wait(tuple_awaitable);
    }
  }
  until = Clock::now() + 5s;
  while (background_ > 0 && Clock::now() < until) {
    t.expires_after(20ms);
    co_await t.async_wait(tuple_awaitable);
  }
  unsigned idle = 0;
  for (const auto& [id, sb] : pool_)
    if (!sb->in_use) ++idle;
  if (idle) spdlog::info("e2b: leaving {} idle sandboxes to their TTL", idle);
}

}  // namespace tsb::core
