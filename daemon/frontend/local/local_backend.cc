#include "daemon/frontend/local/local_backend.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <asio/experimental/as_tuple.hpp>
#include <asio/use_awaitable.hpp>

#include <sys/stat.h>

#include <cerrno>
#include <climits>
#include <cstdlib>

#include "daemon/compile/spawn_policy.h"
#include "daemon/policy/jsonc.h"
#include "daemon/policy/units.h"
#include "daemon/frontend/letta/letta.h"
#include "daemon/frontend/letta/pyjson.h"

namespace tsb::core {
namespace {

using protocol::ErrorCode;
constexpr auto tuple_awaitable = asio::experimental::as_tuple(asio::use_awaitable);

std::string q(std::string_view s) { return quoted_for_message(s); }
using nlohmann::json;
using Clock = std::chrono::steady_clock;

// The last `n` lines of `text` (at most 4 KiB of them).
std::string last_lines(std::string_view text, std::size_t n) {
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.remove_suffix(1);
  std::size_t start = 0, lines = 0;
  for (std::size_t i = text.size(); i > 0; --i)
    if (text[i - 1] == '\n' && ++lines == n) {
      start = i;
      break;
    }
  std::string_view tail = text.substr(start);
  if (tail.size() > 4096) tail = tail.substr(tail.size() - 4096);
  // pip's output, package names, a cut inside a character: valid UTF-8 for
  // the record, the manifest and Letta.
  return letta::utf8_decode_replace(tail).text;
}

// What names the interpreter builds run: its real path, size and change
// time, so that an upgrade of the host's Python makes new keys.
std::string host_interpreter_id() {
  char real[PATH_MAX];
  if (!::realpath("/usr/bin/python3", real)) return "/usr/bin/python3";
  struct stat st{};
  if (::stat(real, &st) != 0) return real;
  return std::string(real) + " " + std::to_string(st.st_size) + " " + std::to_string(st.st_ctim.tv_sec);
}

// What names the Node runtime npm builds run (as host_interpreter_id).
std::string host_node_id() {
  char real[PATH_MAX];
  if (!::realpath("/usr/bin/node", real)) return "/usr/bin/node";
  struct stat st{};
  if (::stat(real, &st) != 0) return real;
  return std::string(real) + " " + std::to_string(st.st_size) + " " + std::to_string(st.st_ctim.tv_sec);
}

// The interpreter per-tool venvs point at, as the sandbox sees it (/usr is
// the host's), and its X.Y from the name it resolves to (python3.11).
venv::Interpreter host_interpreter() {
  venv::Interpreter py;
  char real[PATH_MAX];
  if (!::realpath(py.python.c_str(), real)) return py;
  const std::string_view name = std::string_view(real).substr(std::string_view(real).rfind('/') + 1);
  if (name.starts_with("python3.") && venv::is_python_name(name)) py.version = std::string(name.substr(6));
  return py;
}

}  // namespace

void LocalBackend::open_venv_cache(const std::string& dir, std::uint64_t max_bytes) {
  if (venvs_) {
    if (venvs_->dir() != dir)
      spdlog::warn("venvs.cache_dir changed from {} to {}: it takes effect at the next start; until then runs with "
                   "pip requirements are refused",
                   venvs_->dir(), dir);
    wanted_venv_dir_ = dir;
    return;
  }
  wanted_venv_dir_ = dir;
  interpreter_id_ = host_interpreter_id();
  node_id_ = host_node_id();
  interpreter_ = host_interpreter();
  auto c = venv::Cache::open(dir, max_bytes);
  if (!c.ok()) {
    venvs_error_ = c.error().message;
    spdlog::warn("per-tool venvs are unavailable (a run with pip requirements is refused): {}", venvs_error_);
    return;
  }
  venvs_ = std::move(c).value();
  spdlog::info("venv cache {}: {} venvs, {} of {} bytes", dir, venvs_->entries().size(), venvs_->total_bytes(), max_bytes);
}

json LocalBackend::venv_status() const {
  json j = {{"builds", venv_builds_}, {"build_failures", venv_build_failures_}, {"hits", venv_hits_},
            {"building", builds_.size()}};
  if (!venvs_) {
    j["error"] = venvs_error_.empty() ? json() : json(venvs_error_);
    return j;
  }
  unsigned in_use = 0;
  for (const auto& [k, e] : venvs_->entries()) in_use += e.in_use > 0;
  j["dir"] = venvs_->dir();
  j["count"] = venvs_->entries().size();
  j["in_use"] = in_use;
  j["bytes"] = venvs_->total_bytes();
  j["max_bytes"] = venvs_->max_bytes();
  return j;
}

std::vector<std::string> LocalBackend::venv_gc(std::uint64_t target) {
  if (!venvs_) return {};
  auto gone = venvs_->evict(target == 0 ? 0 : target);
  if (!gone.empty()) spdlog::info("venv cache: removed {} venvs", gone.size());
  return gone;
}

LocalBackend::BuildFor LocalBackend::build_for(PreparedRun& p, const venv::RequirementSet* pip,
                                               const std::vector<venv::NpmRequirement>* npm) const {
  return BuildFor{p.policy(), pip, npm, p.request->id, p.common->organization_id, p.common->tool_name, *p.cancel};
}

std::string LocalBackend::venv_key(const Policy& p, const venv::RequirementSet& set) const {
  return venv::venv_key(interpreter_id_, p.packages.index_settings(), set);
}

std::string LocalBackend::npm_key(const Policy& p, const std::vector<venv::NpmRequirement>& set) const {
  return venv::npm_key(node_id_, p.npm_packages.source_settings(), set);
}

asio::awaitable<LocalBackend::VenvOutcome> LocalBackend::venv_for(const BuildFor& p, const std::string& key) {
  const auto t0 = Clock::now();
  for (;;) {
    VenvOutcome o;
    if (!venvs_) {
      o.failure = "per-tool venvs are not available on this host: " + venvs_error_;
      co_return o;
    }
    if (venvs_->dir() != wanted_venv_dir_) {
      // The policies (and the spawner's binds) name the new directory.
      o.failure = "per-tool venvs are not available until the daemon restarts: venvs.cache_dir changed from " +
                  venvs_->dir() + " to " + wanted_venv_dir_;
      co_return o;
    }
    // (A venv another process removed meanwhile gives no hold: built again.)
    if (venvs_->has(key) && (o.hold = venvs_->hold(key))) {
      o.build_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      ++venv_hits_;
      co_return o;
    }
    auto it = builds_.find(key);
    if (it == builds_.end()) {
      auto b = std::make_shared<Build>(io_);
      builds_.emplace(key, b);
      // However the build ends (an exception, this coroutine destroyed at
      // shutdown), its waiters are let go and the key can be built again.
      struct Done {
        LocalBackend* self;
        const std::string& key;
        std::shared_ptr<Build> b;
        ~Done() {
          if (auto it = self->builds_.find(key); it != self->builds_.end() && it->second == b) self->builds_.erase(it);
          if (!b->finished) {
            b->finished = true;
            if (b->outcome.failure.empty()) {
              b->outcome.failure = "the venv build ended abnormally";
              b->outcome.cancelled = true;  // a waiter tries again
            }
          }
          b->done.cancel();
        }
      } done{this, key, b};
      VenvOutcome r;
      try {
        // (Two statements: a co_await in each arm of ?: is not safe with GCC 12.)
        if (p.npm)
          r = co_await build_node_modules(p, key);
        else
          r = co_await build_venv(p, key);
      } catch (const std::exception& e) {
        spdlog::error("venv {}: the build failed in the daemon: {}", key.substr(0, 12), e.what());
        r = VenvOutcome{};
        r.failure = std::string("the venv build failed in the daemon: ") + e.what();
        ++venv_build_failures_;
      }
      b->finished = true;
      b->outcome.failure = r.failure;
      b->outcome.log_tail = r.log_tail;
      b->outcome.cancelled = r.cancelled;
      b->outcome.build_run_id = r.build_run_id;
      b->outcome.refused_by_installer = r.refused_by_installer;
      r.build_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      co_return r;
    }
    // Another run builds it: wait for that build (or for this run's client
    // to go away).
    auto b = it->second;
    {
      CancelHook hook(p.cancel, [b] { b->done.cancel(); });
      if (!b->finished) co_await b->done.async_wait(tuple_awaitable);
    }
    if (p.cancel.requested() || stopping_) {
      o.failure = stopping_ ? "the daemon is shutting down" : "the client disconnected";
      o.cancelled = true;
      co_return o;
    }
    if (!b->finished) continue;
    // A build stopped because its own client left: another try, here.
    if (!b->outcome.failure.empty() && !b->outcome.cancelled) {
      o.failure = b->outcome.failure;
      o.log_tail = b->outcome.log_tail;
      o.build_run_id = b->outcome.build_run_id;
      o.refused_by_installer = b->outcome.refused_by_installer;
      o.build_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      co_return o;
    }
  }
}

asio::awaitable<LocalBackend::VenvOutcome> LocalBackend::build_venv(const BuildFor& p, const std::string& key) {
  VenvOutcome o;
  const Policy& pol = p.policy;
  const venv::RequirementSet& set = *p.pip;
  const PackagesPolicy& k = pol.packages;
  const auto t0 = Clock::now();
  ++venv_builds_;
  venv::ArchiveLimits limits;
  limits.max_file_bytes = k.venv_size;
  auto staged = venvs_->stage(key, limits);
  if (!staged.ok()) {
    ++venv_build_failures_;
    o.failure = "the venv cache: " + staged.error().message;
    co_return o;
  }
  std::shared_ptr<venv::Cache::Staging> staging = std::move(staged).value();
  // The archive is extracted as it arrives; the first error ends the build.
  auto archive_error = std::make_shared<std::string>();
  auto sink = [staging, archive_error](std::string_view chunk) {
    if (auto st = staging->feed(chunk); !st.ok()) {
      *archive_error = st.error().message;
      return false;
    }
    return true;
  };
  json reqs = json::array();
  for (const auto& r : set.items) reqs.push_back(r.text());
  const json request = {{"requirements", reqs},
                        {"find_links", k.wheels.empty() ? json() : json(std::string(kWheelsSandboxPath))},
                        {"index_url", k.index.empty() ? json() : json(k.index)},
                        {"trusted_host", k.index.starts_with("http://") ? json(k.index_host) : json()},
                        {"source_builds", k.source_builds},
                        {"venv", std::string(isolate::kVenvPath)}};
  spawn::RunOrder order;
  order.policy = build_policy_name(pol);
  order.fingerprint = pol.fingerprint;
  order.mode = spawn::RunMode::Tool;
  order.timeout = k.build_timeout;
  std::shared_ptr<egress::RunProxy> proxy;
  if (!k.index.empty())
    proxy = std::make_shared<egress::RunProxy>(egress_, build_egress_rules(k),
                                               egress::RunLabels{p.request_id + "/venv", p.organization_id, p.tool});
  spdlog::info("venv {}: building for request {} (policy {}): {}", key.substr(0, 12), q(p.request_id), q(pol.name),
               set.text().empty() ? "-" : reqs.dump());
  LinkRun ran = co_await link_.run(std::move(order), request.dump(), 0, 256u << 10, {}, p.cancel, proxy.get(), sink);
  if (proxy) proxy->stop();
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  const isolate::RunResult& r = ran.result;
  o.build_run_id = r.run_id;
  o.log_tail = last_lines(r.stderr_data, 12);
  const std::string what = "installing " + reqs.dump();
  if (ran.refused) {
    o.failure = what + ": the build could not start: " + ran.refused->message;
  } else if (!archive_error->empty()) {
    // (First: a refused archive kills the build, which then ends as
    // cancelled; its waiters must not build it again.)
    o.failure = what + ": the built venv was refused: " + *archive_error;
  } else if (r.reason == isolate::EndReason::Cancelled) {
    o.failure = what + ": the build was stopped";
    o.cancelled = true;
  } else if (r.reason == isolate::EndReason::Timeout) {
    o.failure = what + ": the build took longer than its limit (" + std::to_string(k.build_timeout.count() / 1000) +
                "s) and was killed";
  } else if (r.reason != isolate::EndReason::Exited || r.exit_code != 0) {
    o.refused_by_installer = r.reason == isolate::EndReason::Exited && r.exit_code == 2;
    o.failure = what + ": " +
                (r.reason == isolate::EndReason::Exited && r.exit_code == 2
                     ? std::string("pip failed") + (k.wheels.empty() ? "" : " (packages come only from the wheel directory " + k.wheels + ")")
                 : r.reason == isolate::EndReason::Exited ? "the build failed (exit status " + std::to_string(r.exit_code) + ")"
                 : r.reason == isolate::EndReason::SetupFailed ? "the build sandbox could not be set up: " + r.error
                                                               : "the build ended: " + std::string(isolate::to_string(r.reason)));
  } else {
    json extra = {{"requirements", reqs},
                  {"policy", pol.name},
                  {"policy_fingerprint", pol.fingerprint},
                  {"index_settings", k.index_settings()},
                  {"interpreter", interpreter_id_},
                  {"build_ms", ms},
                  {"build_run_id", r.run_id},
                  {"built_at", std::chrono::duration_cast<std::chrono::seconds>(
                                   std::chrono::system_clock::now().time_since_epoch()).count()},
                  {"log_tail", o.log_tail}};
    if (auto st = venvs_->publish(*staging, extra, interpreter_); !st.ok()) o.failure = what + ": " + st.error().message;
  }
  if (o.failure.empty()) {
    o.hold = venvs_->hold(key);
    if (!o.hold) o.failure = what + ": the venv was removed before the run could take it (cache cap too small?)";
  }
  o.built = o.failure.empty();
  // The proxy's refusals, which pip reports only as a missing package
  // (or a package's process made, which pip does not report at all).
  if (!o.failure.empty() && proxy && !proxy->first_refusal().empty())
    o.failure += "; the egress proxy refused " + proxy->first_refusal();
  if (!o.failure.empty()) {
    ++venv_build_failures_;
    spdlog::warn("venv {}: build failed (run {}, landlock {}): {}", key.substr(0, 12), r.run_id.empty() ? "-" : r.run_id,
                 isolate::landlock_summary(r.landlock), o.failure);
  } else {
    spdlog::info("venv {}: built in {:.0f} ms (run {}, landlock {})", key.substr(0, 12), ms, r.run_id,
                 isolate::landlock_summary(r.landlock));
  }
  co_return o;
}

asio::awaitable<LocalBackend::VenvOutcome> LocalBackend::build_node_modules(const BuildFor& p, const std::string& key) {
  VenvOutcome o;
  const Policy& pol = p.policy;
  const NpmPackagesPolicy& k = pol.npm_packages;
  const auto t0 = Clock::now();
  ++venv_builds_;
  venv::ArchiveLimits limits;
  limits.max_file_bytes = k.size;
  auto staged = venvs_->stage(key, limits);
  if (!staged.ok()) {
    ++venv_build_failures_;
    o.failure = "the venv cache: " + staged.error().message;
    co_return o;
  }
  std::shared_ptr<venv::Cache::Staging> staging = std::move(staged).value();
  auto archive_error = std::make_shared<std::string>();
  auto sink = [staging, archive_error](std::string_view chunk) {
    if (auto st = staging->feed(chunk); !st.ok()) {
      *archive_error = st.error().message;
      return false;
    }
    return true;
  };
  json reqs = json::array();
  for (const auto& r : *p.npm) reqs.push_back(r.text());
  const json request = {{"kind", "npm"},
                        {"requirements", reqs},
                        {"tarballs", k.tarballs.empty() ? json() : json(std::string(kTarballsSandboxPath))},
                        {"registry", k.registry.empty() ? json() : json(k.registry)},
                        {"install_scripts", k.install_scripts},
                        {"build", std::string(kNpmBuildPath)}};
  spawn::RunOrder order;
  order.policy = npm_build_policy_name(pol.name);
  order.fingerprint = pol.fingerprint;
  order.mode = spawn::RunMode::Tool;
  order.timeout = k.build_timeout;
  std::shared_ptr<egress::RunProxy> proxy;
  if (!k.registry.empty())
    proxy = std::make_shared<egress::RunProxy>(egress_, npm_build_egress_rules(k),
                                               egress::RunLabels{p.request_id + "/node_modules", p.organization_id, p.tool});
  spdlog::info("node_modules {}: building for request {} (policy {}): {}", key.substr(0, 12), q(p.request_id),
               q(pol.name), reqs.dump());
  LinkRun ran = co_await link_.run(std::move(order), request.dump(), 0, 256u << 10, {}, p.cancel, proxy.get(), sink);
  if (proxy) proxy->stop();
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  const isolate::RunResult& r = ran.result;
  o.build_run_id = r.run_id;
  o.log_tail = last_lines(r.stderr_data, 12);
  const std::string what = "installing npm packages " + reqs.dump();
  if (ran.refused) {
    o.failure = what + ": the build could not start: " + ran.refused->message;
  } else if (!archive_error->empty()) {
    o.failure = what + ": the built node_modules was refused: " + *archive_error;
  } else if (r.reason == isolate::EndReason::Cancelled) {
    o.failure = what + ": the build was stopped";
    o.cancelled = true;
  } else if (r.reason == isolate::EndReason::Timeout) {
    o.failure = what + ": the build took longer than its limit (" + std::to_string(k.build_timeout.count() / 1000) +
                "s) and was killed";
  } else if (r.reason != isolate::EndReason::Exited || r.exit_code != 0) {
    o.refused_by_installer = r.reason == isolate::EndReason::Exited && r.exit_code == 2;
    o.failure = what + ": " +
                (r.reason == isolate::EndReason::Exited && r.exit_code == 2
                     ? std::string("npm failed") + (k.tarballs.empty() ? "" : " (packages come only from the tarball directory " + k.tarballs + ")")
                 : r.reason == isolate::EndReason::Exited ? "the build failed (exit status " + std::to_string(r.exit_code) + ")"
                 : r.reason == isolate::EndReason::SetupFailed ? "the build sandbox could not be set up: " + r.error
                                                               : "the build ended: " + std::string(isolate::to_string(r.reason)));
  } else {
    json extra = {{"requirements", reqs},
                  {"policy", pol.name},
                  {"policy_fingerprint", pol.fingerprint},
                  {"source_settings", k.source_settings()},
                  {"node_runtime", node_id_},
                  {"build_ms", ms},
                  {"build_run_id", r.run_id},
                  {"built_at", std::chrono::duration_cast<std::chrono::seconds>(
                                   std::chrono::system_clock::now().time_since_epoch()).count()},
                  {"log_tail", o.log_tail}};
    if (auto st = venvs_->publish_tree(*staging, extra); !st.ok()) o.failure = what + ": " + st.error().message;
  }
  if (o.failure.empty()) {
    o.hold = venvs_->hold(key);
    if (!o.hold) o.failure = what + ": the node_modules was removed before the run could take it (cache cap too small?)";
  }
  o.built = o.failure.empty();
  if (!o.failure.empty() && proxy && !proxy->first_refusal().empty())
    o.failure += "; the egress proxy refused " + proxy->first_refusal();
  if (!o.failure.empty()) {
    ++venv_build_failures_;
    spdlog::warn("node_modules {}: build failed (run {}): {}", key.substr(0, 12), r.run_id.empty() ? "-" : r.run_id,
                 o.failure);
  } else {
    spdlog::info("node_modules {}: built in {:.0f} ms (run {})", key.substr(0, 12), ms, r.run_id);
  }
  co_return o;
}

LocalBackend::LocalBackend(asio::io_context& io, SpawnerLink& link, FairShare& shares)
    : io_(io), link_(link), shares_(shares), egress_(io) {}

LocalBackend::~LocalBackend() = default;

void LocalBackend::stop_taking_runs() {
  stopping_ = true;
  for (auto& [id, w] : waiters_) {
    shares_.leave_queue(id);
    w->timer.cancel();  // not granted: they answer `unavailable`
  }
  waiters_.clear();
}

asio::awaitable<void> LocalBackend::finish_runs(std::chrono::steady_clock::time_point deadline) {
  asio::steady_timer t(io_);
  while (!live_.empty() && std::chrono::steady_clock::now() < deadline) {
    t.expires_after(std::chrono::milliseconds(50));
    co_await t.async_wait(tuple_awaitable);
  }
  if (live_.empty()) co_return;
  spdlog::warn("grace period over: killing {} runs", live_.size());
  for (auto& c : std::set<std::shared_ptr<CancelSignal>>(live_)) c->request();
  while (!live_.empty()) {
    t.expires_after(std::chrono::milliseconds(20));
    co_await t.async_wait(tuple_awaitable);
  }
}

asio::awaitable<nlohmann::json> LocalBackend::warm_status() {
  auto st = co_await link_.pool_state();
  if (!st) co_return json{{"error", "the sandbox spawner did not answer"}};
  json pools = json::array();
  std::uint64_t ready = 0, starting = 0, hits = 0, misses = 0;
  for (const auto& p : st->pools) {
    pools.push_back({{"policy", p.policy},
                     {"mode", p.mode == spawn::RunMode::Tool ? "run_tool" : "execute"},
                     {"warm", p.ready},
                     {"starting", p.starting},
                     {"target", p.target},
                     {"hits", p.hits},
                     {"misses", p.misses},
                     {"lost", p.lost}});
    ready += p.ready, starting += p.starting, hits += p.hits, misses += p.misses;
  }
  // Hits and misses of pools since the last reload (a reload ends them);
  // in_use: warm runs in flight now.
  co_return json{{"warm", ready}, {"starting", starting}, {"in_use", link_.warm_runs()}, {"hits", hits},
                 {"misses", misses}, {"pools", pools}};
}

nlohmann::json LocalBackend::engine_status() const {
  const spawn::Hello& h = link_.hello();
  const isolate::EngineFeatures& f = h.features;
  return {{"instance", h.instance},
          {"cgroups", h.cgroup_summary},
          {"features",
           {{"memfd_noexec", f.memfd_noexec},
            {"overlay_views", f.overlay_views},
            {"tcp_memory_limit", f.tcp_memory_limit},
            {"oom_score_floor", f.oom_score_floor}}},
          // What runs get (docs/SECURITY.md, "Landlock"), and what the last one got.
          {"landlock",
           {{"abi", std::max(f.landlock_abi, 0)},
            {"mode", f.landlock_abi < 0 ? "off" : f.landlock_abi == 0 ? "unavailable" : "auto"},
            {"last_run", isolate::landlock_summary(last_landlock_)}}},
          {"notes", h.notes}};
}

asio::awaitable<LocalBackend::Slot> LocalBackend::acquire_slot(const PreparedRun& p) {
  if (stopping_) co_return Slot::ShuttingDown;
  if (p.cancel->requested() || p.client_gone()) {
    ++abandoned_in_queue_;
    co_return Slot::ClientGone;
  }
  const std::uint64_t id = ++next_waiter_;
  const FairShare::Admission a = shares_.admit_run(p.peer.uid, id);
  if (a.dropped)
    if (auto it = waiters_.find(*a.dropped); it != waiters_.end()) {
      it->second->gave_up = true;
      it->second->timer.cancel();
      waiters_.erase(it);
    }
  switch (a.admit) {
    case FairShare::Admit::Start: co_return Slot::Granted;
    case FairShare::Admit::BusyShare: co_return Slot::BusyShare;
    case FairShare::Admit::BusyFull: co_return Slot::Busy;
    case FairShare::Admit::Queue: break;
  }
  auto w = std::make_shared<Waiter>(io_);
  waiters_[id] = w;
  // The timer is cancelled by grant_waiting (a slot), by shutdown (none),
  // by another peer's run taking its place (none) or by the run's cancel
  // signal (the client went away).
  {
    CancelHook hook(*p.cancel, [w] { w->timer.cancel(); });
    co_await w->timer.async_wait(tuple_awaitable);
  }
  const bool gone = p.cancel->requested() || p.client_gone();
  if (!w->granted) {
    // Not granted: still queued when the client left (it leaves), or its
    // place given to another peer's run, or woken by shutdown (both of
    // which took it out of the queue already).
    if (waiters_.erase(id) != 0) shares_.leave_queue(id);
    if (w->gave_up) co_return Slot::GaveUp;
    if (gone) {
      ++abandoned_in_queue_;
      co_return Slot::ClientGone;
    }
    co_return Slot::ShuttingDown;
  }
  if (gone) {
    release_slot(p.peer.uid);  // the slot it was handed passes on
    ++abandoned_in_queue_;
    co_return Slot::ClientGone;
  }
  if (stopping_) {
    release_slot(p.peer.uid);  // the slot it was handed goes back: nothing new starts
    co_return Slot::ShuttingDown;
  }
  co_return Slot::Granted;
}

void LocalBackend::release_slot(uid_t uid) {
  shares_.run_ended(uid);
  grant_waiting();
}

void LocalBackend::grant_waiting() {
  // In the order of the shares (fair_share.h): the waiting peer with the
  // fewest runs first, below its share. After a reload lowered
  // max_concurrent_runs, nothing is handed on until the runs in flight are
  // below the new limit.
  while (!stopping_) {
    std::optional<std::uint64_t> id = shares_.next_run();
    if (!id) break;
    auto it = waiters_.find(*id);
    if (it == waiters_.end()) continue;  // never: both are updated together
    it->second->granted = true;
    it->second->timer.cancel();
    waiters_.erase(it);
  }
}

std::string LocalBackend::share_words(uid_t uid) const {
  return "peer uid " + std::to_string(uid) + " has " + std::to_string(shares_.queued(uid)) + " runs queued and " +
         std::to_string(shares_.running(uid)) + " running; its share is " + std::to_string(shares_.queue_share()) +
         " of max_queued_runs " + std::to_string(shares_.limits().queued) + " and " +
         std::to_string(shares_.run_share()) + " of max_concurrent_runs " + std::to_string(shares_.limits().running) +
         ", shared by " + std::to_string(shares_.peers()) + " peers";
}

RequirementRules LocalBackend::requirement_rules(const Policy& pol) const {
  // A per-tool venv, built in a sandbox of the policy's "packages".
  RequirementRules r;
  const PackagesPolicy& k = pol.packages;
  if (!k.enabled)
    r.refusal = "policy " + q(pol.name) + " installs no packages (it has no \"packages\" section)";
  r.max = k.max_requirements;
  r.allow = k.allow;
  return r;
}

TypeScriptRules LocalBackend::typescript_rules(const Policy& pol) const {
  // Under node, with the runtime the policy's "typescript" names.
  TypeScriptRules r;
  if (!pol.typescript.enabled)
    r.refusal = "policy " + q(pol.name) + " runs no TypeScript tools on the local backend (it has no \"typescript\" section)";
  // A TypeScript tool's node_modules, built in a sandbox of the policy's
  // "typescript.packages".
  const NpmPackagesPolicy& k = pol.npm_packages;
  if (!k.enabled)
    r.npm_refusal = "policy " + q(pol.name) + " installs no npm packages (it has no \"typescript\": {\"packages\"} section)";
  r.max_npm = k.max_requirements;
  r.allow = k.allow;
  return r;
}

std::optional<std::string> LocalBackend::typescript_runtime_missing(const PreparedRun& p) const {
  // What the policy names must be on this host; the daemon starts without
  // them (a shipped policy never stops a host without node from starting),
  // and a run says which is missing.
  const TypeScriptPolicy& t = p.policy().typescript;
  const std::string how = " (Debian: apt-get install nodejs esbuild node-typescript node-acorn)";
  struct stat st{};
  if (::stat(t.node.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || !(st.st_mode & S_IXOTH))
    return "the policy's Node runtime " + q(t.node) + " is not installed on this host (typescript.node)" + how;
  if (::stat(t.stripper().c_str(), &st) != 0)
    return "the policy's type stripper " + q(t.stripper()) + " is not installed on this host (typescript.strip_types " +
           q(t.strip_types) + ")" + how;
  if (::stat(std::string(kAcornPath).c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    return "the JavaScript parser the TypeScript runner reads scripts with, " + q(kAcornPath) +
           ", is not installed on this host" + how;
  if (find_ts_runner(p.runner_path).empty())
    return std::string("the TypeScript runner (toolsandbox_ts_runner.js, beside the tool runner) is not installed on this host");
  return std::nullopt;
}

std::optional<Refusal> LocalBackend::order_for(PreparedRun& p, Order& o) const {
  const Policy& pol = p.policy();
  // What the spawner's decoder accepts (daemon/wire/wire.h); execve
  // refuses much less (128 KiB a variable) anyway.
  for (const auto& [k, v] : p.env)
    if (k.size() > spawn::kMaxName || v.size() > spawn::kMaxValue)
      return Refusal{ErrorCode::BadRequest, "environment: the value of " + q(k) + " is larger than " +
                                                std::to_string(spawn::kMaxValue) + " bytes"};
  o.order.policy = pol.name;
  o.order.fingerprint = pol.fingerprint;
  o.order.env = p.env;
  o.order.timeout = p.timeout;
  if (p.typescript) {
    // The TypeScript runner, in both modes: the request on its result
    // channel, the result back on it (toolsandbox_ts_runner.js). Cold: the
    // warm pools are Python's.
    o.order.policy = typescript_policy_name(pol);
    o.order.mode = spawn::RunMode::Tool;
    o.order.warm = false;
    if (p.tool_mode) {
      const auto& t = std::get<protocol::RunToolRequest>(p.request->body);
      o.channel = ChannelExchange{runner_channel_first(t),
                                  [&t, env = p.runner_env](bool declared) { return runner_channel_second(t, declared, env); },
                                  pol.limits.stdout_bytes};
    } else {
      o.channel = ChannelExchange{runner_channel_script(std::get<protocol::ExecuteRequest>(p.request->body).script),
                                  [](bool) { return letta::channel_part_header(2) + "{}"; }, pol.limits.stdout_bytes};
    }
    return std::nullopt;
  }
  if (p.tool_mode) {
    // The runner's request and result travel on its result channel
    // (daemon/frontend/letta/letta.h); stdout and stderr are the tool's alone.
    o.order.mode = spawn::RunMode::Tool;
    const auto& t = std::get<protocol::RunToolRequest>(p.request->body);
    o.channel = ChannelExchange{runner_channel_first(t),
                                [&t, env = p.runner_env](bool declared) { return runner_channel_second(t, declared, env); },
                                pol.result_bytes};
  } else {
    // The script arrives on stdin, so no size limit of argv applies and it
    // never touches a file system. Where Letta's result frame starts is kept
    // past the output cap, so a run that prints more than the cap still
    // returns its result (capped_output.h). A tool's result never is in
    // its output.
    o.order.mode = spawn::RunMode::Script;
    o.stdin_data = std::get<protocol::ExecuteRequest>(p.request->body).script;
    o.frame_tokens = {std::string(letta::kBinaryMarker), std::string(letta::kLegacyStartMarker)};
  }
  // A warm sandbox started without the request's variables: a run that sets
  // one a program reads as it starts (PYTHONPATH, LD_PRELOAD, TZ, LANG)
  // is cold. (In tool mode those that change how a program starts are the
  // tool's, runner_env, warm or cold.)
  o.order.warm = std::none_of(p.env.begin(), p.env.end(), [](const auto& kv) { return read_at_start(kv.first); });
  return std::nullopt;
}

asio::awaitable<std::optional<Refusal>> LocalBackend::take_slot(PreparedRun& p) {
  const protocol::CommonRunFields& c = *p.common;
  switch (co_await acquire_slot(p)) {
    case Slot::Granted: co_return std::nullopt;
    case Slot::ClientGone:
      // Never started: no sandbox, no run record, no audit line of a run.
      spdlog::info("request {} of peer uid={} pid={} (org={} tool={}) dropped before it ran: the client disconnected",
                   q(p.request->id), p.peer.uid, p.peer.pid, q(c.organization_id), q(c.tool_name));
      co_return Refusal{ErrorCode::Unavailable, "the client disconnected before the run started"};
    case Slot::Busy:
      co_return Refusal{ErrorCode::Busy, "too many runs in flight (" + std::to_string(shares_.running()) +
                                             " running, " + std::to_string(shares_.queued()) + " queued); retry later"};
    case Slot::BusyShare:
      if (shares_.peers() == 1)  // its share is the whole queue
        co_return Refusal{ErrorCode::Busy, "too many runs in flight (" + std::to_string(shares_.running()) +
                                               " running, " + std::to_string(shares_.queued()) + " queued); retry later"};
      co_return Refusal{ErrorCode::Busy, "this peer holds its share of the run queue (" + share_words(p.peer.uid) +
                                             "); retry later"};
    case Slot::GaveUp:
      co_return Refusal{ErrorCode::Busy, "the run queue filled up and this peer held more than its share of it (" +
                                             share_words(p.peer.uid) +
                                             "): this queued run gave its place up to another peer's; retry later"};
    case Slot::ShuttingDown: break;
  }
  co_return Refusal{ErrorCode::Unavailable, "the daemon is shutting down"};
}

asio::awaitable<bool> LocalBackend::prepare_venv(PreparedRun& p, const std::string& venv_key, Order& o,
                                                 BackendRun& out) {
  const venv::RequirementSet& reqs = p.requirements;
  // (Named: GCC 12 does not keep a temporary argument of a co_await alive.)
  const BuildFor b = build_for(p, &reqs, nullptr);
  VenvOutcome venv = co_await venv_for(b, venv_key);
  json requirements = json::array();
  for (const auto& r : reqs.items) requirements.push_back(r.text());
  out.record["venv"] = {{"key", venv_key},
                        {"requirements", requirements},
                        {"built", venv.built},
                        {"build_ms", venv.build_ms},
                        {"build_run_id", venv.build_run_id.empty() ? json() : json(venv.build_run_id)}};
  out.audit += " venv=" + venv_key.substr(0, 16) + (venv.built ? " venv_built=yes" : "");
  if (venv.failure.empty()) {
    o.order.venv = venv_key;
    o.venv_hold = std::move(venv.hold);
    co_return true;
  }
  if (venv.cancelled) {
    out.refused = Refusal{ErrorCode::Unavailable, venv.failure};
    co_return false;
  }
  // As Letta reports a failed install: the run's result is an error
  // naming the requirements, with pip's last lines; nothing ran.
  isolate::RunResult& run = out.run;
  run.reason = isolate::EndReason::Exited;
  run.exit_code = -1;
  run.stderr_data = venv.log_tail;
  run.stderr_total_bytes = venv.log_tail.size();
  out.end_reason = "setup_failed";
  out.record["exit_code"] = nullptr;
  out.record["detail"] = "venv_build_failed";
  out.record["error"] = venv.failure;
  out.record["setup_stage"] = "venv-build";
  out.record["setup_errno"] = 0;
  out.record["venv"]["log_tail"] = venv.log_tail;
  out.failure = RunFailure{"RuntimeError", venv.failure};
  co_return false;
}

asio::awaitable<bool> LocalBackend::prepare_node_modules(PreparedRun& p, const std::string& key, Order& o,
                                                         BackendRun& out) {
  const BuildFor b = build_for(p, nullptr, &p.npm_requirements);
  VenvOutcome nm = co_await venv_for(b, key);
  json requirements = json::array();
  for (const auto& r : p.npm_requirements) requirements.push_back(r.text());
  out.record["node_modules"] = {{"key", key},
                                {"requirements", requirements},
                                {"built", nm.built},
                                {"build_ms", nm.build_ms},
                                {"build_run_id", nm.build_run_id.empty() ? json() : json(nm.build_run_id)}};
  out.audit += " node_modules=" + key.substr(0, 16) + (nm.built ? " node_modules_built=yes" : "");
  if (nm.failure.empty()) {
    o.order.node_modules = key;
    o.node_modules_hold = std::move(nm.hold);
    co_return true;
  }
  if (nm.cancelled) {
    out.refused = Refusal{ErrorCode::Unavailable, nm.failure};
    co_return false;
  }
  // As a failed venv build: an error naming the requirements, with npm's
  // last lines (valid UTF-8, escaped where shown); nothing ran.
  isolate::RunResult& run = out.run;
  run.reason = isolate::EndReason::Exited;
  run.exit_code = -1;
  run.stderr_data = nm.log_tail;
  run.stderr_total_bytes = nm.log_tail.size();
  out.end_reason = "setup_failed";
  out.record["exit_code"] = nullptr;
  out.record["detail"] = "node_modules_build_failed";
  out.record["error"] = nm.failure;
  out.record["setup_stage"] = "node_modules-build";
  out.record["setup_errno"] = 0;
  out.record["node_modules"]["log_tail"] = nm.log_tail;
  out.failure = RunFailure{"RuntimeError", nm.failure};
  co_return false;
}

asio::awaitable<void> LocalBackend::run_order(PreparedRun& p, Order& o, BackendRun& out) {
  const Policy& pol = p.policy();
  // Network egress: the run's proxy, from its Started until it ended
  // (daemon/frontend/egress/proxy.h), on any path out of here.
  std::shared_ptr<egress::RunProxy> proxy;
  if (pol.network == isolate::NetworkMode::Egress)
    proxy = std::make_shared<egress::RunProxy>(
        egress_, pol.egress, egress::RunLabels{p.request->id, p.common->organization_id, p.common->tool_name});
  struct StopProxy {
    const std::shared_ptr<egress::RunProxy>& proxy;
    ~StopProxy() {
      if (proxy) proxy->stop();
    }
  } stop_proxy{proxy};
  LinkRun ran = co_await link_.run(std::move(o.order), std::move(o.stdin_data), pol.limits.stdout_bytes,
                                   pol.limits.stderr_bytes, std::move(o.frame_tokens), *p.cancel, proxy.get(), {},
                                   std::move(o.channel), pol.result_bytes);
  if (proxy) {
    proxy->stop();
    out.record["egress"] = proxy->summary();
    out.audit += proxy->audit_fields();
  }
  if (ran.refused) {
    // The spawner checks every order against its own copy of the policy:
    // a refusal here is a reload between placement and start (the policy
    // is gone), its own run limit, or its stopping; or the link's own (an
    // order too large for the socket, not sent, or not answered a minute
    // past its timeout: daemon/frontend/local/spawner_link.h).
    using spawn::RefuseCode;
    const RefuseCode rc = ran.refused->code;
    ErrorCode code = rc == RefuseCode::Busy ? ErrorCode::Busy
                     : rc == RefuseCode::Unavailable || rc == RefuseCode::UnknownPolicy ? ErrorCode::Unavailable
                     : rc == RefuseCode::OutOfBounds ? ErrorCode::PolicyDenied
                                                     : ErrorCode::Internal;
    out.refused = Refusal{code, ran.refused->message};
    co_return;
  }
  out.run = std::move(ran.result);
  out.channel = std::move(ran.channel);
  // What the tool's Landlock domain was (isolate/supervise/outcome.h).
  out.record["landlock"] = isolate::landlock_summary(out.run.landlock);
  out.audit += " landlock=" + isolate::landlock_summary(out.run.landlock);
  if (out.run.landlock >= 0) last_landlock_ = out.run.landlock;
  out.record["warm"] = ran.warm;
  if (ran.warm) {
    out.record["warm_start_cpu_ms"] = std::chrono::duration<double, std::milli>(ran.warm_start_cpu).count();
    out.audit += " warm=yes";
  }
  if (out.run.reason == isolate::EndReason::SetupFailed && !out.run.error.empty())
    spdlog::error("run {}: {}", out.run.run_id.empty() ? "-" : out.run.run_id, out.run.error);
}

asio::awaitable<BackendRun> LocalBackend::run(PreparedRun& p) {
  BackendRun out;
  Order o;
  if ((out.refused = order_for(p, o))) co_return out;
  if (p.typescript) {
    out.record["typescript"] = {{"node", p.policy().typescript.node}, {"strip_types", p.policy().typescript.strip_types}};
    out.audit += " typescript=yes";
    if (auto missing = typescript_runtime_missing(p)) {
      // No sandbox: the run fails its set-up, saying what is missing.
      out.run.reason = isolate::EndReason::SetupFailed;
      out.run.error = *missing;
      out.record["setup_stage"] = "typescript-runtime";
      out.record["setup_errno"] = ENOENT;
      out.record["error"] = *missing;
      co_return out;
    }
  }
  // The run's requirements (prepare_run checked them): the venv is found
  // or built once the run holds its slot.
  const std::string venv_key = p.requirements.items.empty() ? "" : this->venv_key(p.policy(), p.requirements);
  if ((out.refused = co_await take_slot(p))) co_return out;
  // The slot goes back once the pipeline has recorded the run (or when
  // `out` is dropped on any other path).
  out.held = std::shared_ptr<void>(nullptr, [this, uid = p.peer.uid](void*) { release_slot(uid); });

  live_.insert(p.cancel);
  // Out of live_ however the run ends (an exception too): shutdown waits
  // for live_ to empty.
  struct Unlive {
    std::set<std::shared_ptr<CancelSignal>>& live;
    const std::shared_ptr<CancelSignal>& cancel;
    ~Unlive() { live.erase(cancel); }
  } unlive{live_, p.cancel};
  // The run's own venv, found or built in its slot (held until the run
  // ends); a build that failed is the run's answer.
  if (!venv_key.empty() && !co_await prepare_venv(p, venv_key, o, out)) co_return out;
  // A TypeScript tool's node_modules, likewise (bound at /node_modules).
  // The key is a named variable of this frame, made once: prepare_node_modules
  // and the build it may start hold it by reference across their suspensions.
  const std::string nm_key = p.typescript && !p.npm_requirements.empty()
                                 ? npm_key(p.policy(), p.npm_requirements)
                                 : "";
  if (!nm_key.empty() && !co_await prepare_node_modules(p, nm_key, o, out)) co_return out;
  co_await run_order(p, o, out);  // o (its venv hold) lives until the run is answered
  if (!out.refused && !p.tool_mode && !p.typescript) co_await decode_pickle(p, out);
  co_return out;
}

asio::awaitable<void> LocalBackend::decode_pickle(PreparedRun& p, BackendRun& out) {
  using isolate::EndReason;
  const std::optional<std::string> payload = pickle_payload_to_decode(p.shape, out.run);
  if (!payload) co_return;
  DecodedPickle& d = out.decoded.emplace();
  if (stopping_ || p.cancel->requested() || p.client_gone()) {
    d.failure = stopping_ ? "the daemon is shutting down" : "the client disconnected";
    co_return;
  }
  if (p.runner_path.empty()) {
    d.failure = "the runner that decodes it is not installed on this host";
    co_return;
  }
  const Policy& pol = p.policy();
  spawn::RunOrder order;
  order.policy = pol.name;
  order.fingerprint = pol.fingerprint;
  order.mode = spawn::RunMode::Tool;
  // Decoding takes milliseconds (a payload's values are capped); it gets
  // the run's own limit, at most 10 s.
  order.timeout = std::min(p.timeout, std::chrono::milliseconds(10'000));
  order.warm = true;
  // On its result channel, as a tool's request; its result (with the
  // types that come with it) at most limits.result, as a tool's.
  ChannelExchange channel{runner_channel_unpickle(*payload),
                          [](bool) { return letta::channel_part_header(2) + "{}"; }, pol.result_bytes};
  LinkRun ran = co_await link_.run(std::move(order), {}, pol.limits.stdout_bytes, pol.limits.stderr_bytes, {},
                                   *p.cancel, nullptr, {}, std::move(channel));
  if (ran.refused) {
    d.failure = ran.refused->message;
    co_return;
  }
  const isolate::RunResult& r = ran.result;
  out.record["pickle_decode_run_id"] = r.run_id;
  out.audit += " pickle_decode_run_id=" + (r.run_id.empty() ? std::string("-") : r.run_id);
  const ChannelOutcome* ch = ran.channel ? &*ran.channel : nullptr;
  if (r.reason != EndReason::Exited) {
    d.failure = "the decoder's run ended: " + std::string(isolate::to_string(r.reason));
  } else if (!ch || ch->result_total == 0) {
    d.failure = "the decoder wrote no result";
  } else if (ch->result_total > ch->result.size()) {
    d.failure = "the decoded result is larger than the policy's limit of " + format_size(pol.result_bytes) +
                " (limits.result)";
  } else if (auto f = letta::parse_channel_result(ch->result, r.stdout_data); !f.ok()) {
    d.failure = f.error().message;
  } else {
    d.frame = std::move(f).value();
  }
}

}  // namespace tsb::core
