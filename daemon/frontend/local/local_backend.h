// The local backend: runs a prepared request in a sandbox of this host,
// built by the root spawner (daemon/frontend/local/spawner_link.h), under the front
// end's run slots.
//
// Run slots: at most max_concurrent_runs run, at most max_queued_runs wait,
// both shared fairly between peers (daemon/frontend/admission/fair_share.h);
// beyond that a request is answered `busy` at once. A request waiting in the
// queue leaves it, and never starts, when its client goes away (the run's
// cancel signal) or gives its place up to another peer's (answered `busy`);
// one that holds a slot has its sandbox killed.
#pragma once

#include <asio/awaitable.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string_view>

#include <nlohmann/json.hpp>

#include "daemon/frontend/admission/fair_share.h"
#include "daemon/frontend/pipeline/pipeline.h"
#include "daemon/wire/compiled.h"
#include "daemon/frontend/local/spawner_link.h"
#include "daemon/frontend/egress/proxy.h"
#include "daemon/venv/cache.h"
#include "daemon/venv/requirements.h"

namespace tsb::core {

class LocalBackend final : public RunBackend {
 public:
  // `shares`: the run slots and queue (its limits), by peer; the server's.
  LocalBackend(asio::io_context& io, SpawnerLink& link, FairShare& shares);
  ~LocalBackend() override;

  std::string_view name() const noexcept override { return "local"; }
  RequirementRules requirement_rules(const Policy& p) const override;
  TypeScriptRules typescript_rules(const Policy& p) const override;
  asio::awaitable<BackendRun> run(PreparedRun& p) override;

  // The shares changed (a reload of the limits, a peer came or went): a
  // larger share starts queued runs now; a smaller one lets the runs in
  // flight finish.
  void shares_changed() { grant_waiting(); }
  // Shutdown, first step: nothing new starts and queued requests are told
  // the daemon is shutting down.
  void stop_taking_runs();
  // Then: the runs in flight may finish until `deadline`; the rest are
  // killed, and this returns once every run has ended.
  asio::awaitable<void> finish_runs(std::chrono::steady_clock::time_point deadline);

  unsigned in_flight() const noexcept { return shares_.running(); }
  std::size_t queued() const noexcept { return shares_.queued(); }
  std::uint64_t abandoned_in_queue() const noexcept { return abandoned_in_queue_; }
  // The engine's part of `status`.
  nlohmann::json engine_status() const;
  // The warm pools (status "warm_pool"): the spawner's answer, and the
  // warm runs in flight.
  asio::awaitable<nlohmann::json> warm_status();
  // The egress proxy's part of `status` (daemon/frontend/egress/proxy.h).
  nlohmann::json egress_status() const { return egress_.status(); }

  // Per-tool venvs (daemon/venv/cache.h): opens the cache, once at start.
  // Without a usable cache, a run with requirements is refused, saying why.
  void open_venv_cache(const std::string& dir, std::uint64_t max_bytes);
  // The venv cache's part of `status`.
  nlohmann::json venv_status() const;
  // The egress proxy's service, shared with sessions (daemon/frontend/session/).
  egress::Service& egress_service() noexcept { return egress_; }
  // Removes venvs no run holds, least recently used first, down to
  // `target` bytes (0: all of them); the keys removed.
  std::vector<std::string> venv_gc(std::uint64_t target);

  // A venv or node_modules, and who wants it: a run, or a session's
  // command (daemon/frontend/session/packages.h).
  struct BuildFor {
    const Policy& policy;
    const venv::RequirementSet* pip = nullptr;               // a venv of these
    const std::vector<venv::NpmRequirement>* npm = nullptr;  // or a node_modules of these
    std::string request_id, organization_id, tool;          // for the log and the build's proxy
    CancelSignal& cancel;                                    // stops the wait and the build
  };
  // A venv or node_modules: held until its user ends, or why there is none.
  struct VenvOutcome {
    venv::Cache::Hold hold;
    bool built = false;           // this run built it
    double build_ms = 0;          // the build's time, or the wait for another's
    std::string build_run_id;
    std::string failure;          // set: none; the run does not start
    std::string log_tail;         // the build's last lines of output
    bool cancelled = false;       // the build was stopped (client gone, shutdown)
    bool refused_by_installer = false;  // npm or pip found no such set in the source (their exit status 2)
  };
  // Found in the venv cache (daemon/venv/cache.h) or built once in a build
  // sandbox of the policy's, whoever else waits for the same key.
  // `p` and `key` outlive the wait (a named variable of the caller's).
  asio::awaitable<VenvOutcome> venv_for(const BuildFor& p, const std::string& key);
  // The cache's keys of a set under a policy (venv::venv_key, venv::npm_key).
  std::string venv_key(const Policy& p, const venv::RequirementSet& set) const;
  std::string npm_key(const Policy& p, const std::vector<venv::NpmRequirement>& set) const;
  // Where the cache keeps an entry on this host ("" without a cache).
  std::string venv_path(const std::string& key) const { return venvs_ ? venvs_->dir() + "/" + key : ""; }

 private:
  // Script mode: a result frame whose payload is a pickle is decoded by the
  // runner in a second sandbox under the run's policy, in the run's slot.
  asio::awaitable<void> decode_pickle(PreparedRun& p, BackendRun& out);

  // The steps of run(): the order for the spawner (refused when the
  // request cannot be one); a run slot; the run's own venv (false: `out`
  // is the answer); the order's run through the spawner, with its egress
  // proxy.
  struct Order {
    spawn::RunOrder order;
    std::string stdin_data;
    std::vector<std::string> frame_tokens;
    std::optional<ChannelExchange> channel;
    // The venv the order names, held (its manifest's read lock) until the
    // run has ended: a removal waits for it.
    venv::Cache::Hold venv_hold;
    venv::Cache::Hold node_modules_hold;  // a TypeScript tool's, likewise
  };
  std::optional<Refusal> order_for(PreparedRun& p, Order& o) const;
  // What of the TypeScript runtime the run's policy names is missing on
  // this host (node, the stripper, acorn, the TypeScript runner), or nothing.
  std::optional<std::string> typescript_runtime_missing(const PreparedRun& p) const;
  asio::awaitable<std::optional<Refusal>> take_slot(PreparedRun& p);
  asio::awaitable<bool> prepare_venv(PreparedRun& p, const std::string& venv_key, Order& o, BackendRun& out);
  // A TypeScript tool's node_modules (npm requirements), found or built in
  // the same cache, in the same way (false: `out` is the answer).
  asio::awaitable<bool> prepare_node_modules(PreparedRun& p, const std::string& key, Order& o, BackendRun& out);
  asio::awaitable<void> run_order(PreparedRun& p, Order& o, BackendRun& out);

  asio::awaitable<VenvOutcome> build_venv(const BuildFor& p, const std::string& key);
  asio::awaitable<VenvOutcome> build_node_modules(const BuildFor& p, const std::string& key);
  BuildFor build_for(PreparedRun& p, const venv::RequirementSet* pip,
                     const std::vector<venv::NpmRequirement>* npm) const;

  // Busy: the queue is full; BusyShare: the peer holds its share of it;
  // GaveUp: queued, it gave its place up to another peer's run.
  enum class Slot { Granted, Busy, BusyShare, GaveUp, ShuttingDown, ClientGone };
  asio::awaitable<Slot> acquire_slot(const PreparedRun& p);
  void release_slot(uid_t uid);
  // Hands free slots to waiters, in the order of the shares.
  void grant_waiting();
  std::string share_words(uid_t uid) const;

  struct Waiter {
    asio::steady_timer timer;
    bool granted = false;   // grant_waiting passed a slot to this waiter
    bool gave_up = false;   // its place went to another peer's run
    explicit Waiter(asio::io_context& io) : timer(io, std::chrono::steady_clock::time_point::max()) {}
  };

  asio::io_context& io_;
  SpawnerLink& link_;
  FairShare& shares_;
  bool stopping_ = false;
  std::uint64_t next_waiter_ = 0;
  std::map<std::uint64_t, std::shared_ptr<Waiter>> waiters_;  // by the id FairShare knows them by
  // The cancel signals of the runs in flight (shutdown cancels what is left).
  std::set<std::shared_ptr<CancelSignal>> live_;
  std::uint64_t abandoned_in_queue_ = 0;
  int last_landlock_ = -1;  // the last run's Landlock report (isolate/supervise/outcome.h)
  egress::Service egress_;
  // Per-tool venvs.
  std::unique_ptr<venv::Cache> venvs_;
  std::string venvs_error_;  // why there is no cache
  std::string interpreter_id_;  // the host's python3, for the venv key
  std::string node_id_;         // the host's node, for the node_modules key
  venv::Interpreter interpreter_;  // what a venv's frame points at
  std::string wanted_venv_dir_;    // the configuration's (venvs_ stays where it opened)
  struct Build {
    explicit Build(asio::io_context& io) : done(io, std::chrono::steady_clock::time_point::max()) {}
    asio::steady_timer done;  // cancelled when the build ends
    bool finished = false;
    VenvOutcome outcome;      // its failure, if any (a success is in the cache)
  };
  std::map<std::string, std::shared_ptr<Build>> builds_;  // by key, in progress
  std::uint64_t venv_builds_ = 0, venv_build_failures_ = 0, venv_hits_ = 0;
};

}  // namespace tsb::core
