#include "daemon/core/local_backend.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <asio/experimental/as_tuple.hpp>
#include <asio/use_awaitable.hpp>

#include "daemon/policy/jsonc.h"
#include "isolate/base/random.h"

namespace tsb::core {
namespace {

using protocol::ErrorCode;
constexpr auto tuple_awaitable = asio::experimental::as_tuple(asio::use_awaitable);

std::string q(std::string_view s) { return quoted_for_message(s); }

}  // namespace

LocalBackend::LocalBackend(asio::io_context& io, SpawnerLink& link, unsigned max_concurrent, unsigned max_queued)
    : io_(io), link_(link), max_concurrent_(max_concurrent), max_queued_(max_queued), egress_(io) {}

LocalBackend::~LocalBackend() = default;

void LocalBackend::set_limits(unsigned max_concurrent, unsigned max_queued) {
  max_concurrent_ = max_concurrent;
  max_queued_ = max_queued;
  grant_waiting();
}

void LocalBackend::stop_taking_runs() {
  stopping_ = true;
  for (auto& w : waiters_) w->timer.cancel();  // not granted: they answer `unavailable`
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
          {"notes", h.notes}};
}

asio::awaitable<LocalBackend::Slot> LocalBackend::acquire_slot(const PreparedRun& p) {
  if (stopping_) co_return Slot::ShuttingDown;
  if (p.cancel->requested() || p.client_gone()) {
    ++abandoned_in_queue_;
    co_return Slot::ClientGone;
  }
  if (in_flight_ < max_concurrent_ && waiters_.empty()) {
    ++in_flight_;
    co_return Slot::Granted;
  }
  if (waiters_.size() >= max_queued_) co_return Slot::Busy;
  auto w = std::make_shared<Waiter>(io_);
  waiters_.push_back(w);
  // The timer is cancelled by grant_waiting (a slot), by shutdown (none) or
  // by the run's cancel signal (the client went away).
  {
    CancelHook hook(*p.cancel, [w] { w->timer.cancel(); });
    co_await w->timer.async_wait(tuple_awaitable);
  }
  const bool gone = p.cancel->requested() || p.client_gone();
  if (!w->granted) {
    // Not granted: still queued when the client left (remove it), or
    // woken by shutdown (which already emptied the queue).
    auto it = std::find(waiters_.begin(), waiters_.end(), w);
    if (it != waiters_.end()) waiters_.erase(it);
    if (gone) {
      ++abandoned_in_queue_;
      co_return Slot::ClientGone;
    }
    co_return Slot::ShuttingDown;
  }
  if (gone) {
    release_slot();  // the slot it was handed passes on
    ++abandoned_in_queue_;
    co_return Slot::ClientGone;
  }
  if (stopping_) {
    release_slot();  // the slot it was handed goes back: nothing new starts
    co_return Slot::ShuttingDown;
  }
  co_return Slot::Granted;
}

void LocalBackend::release_slot() {
  --in_flight_;
  grant_waiting();
}

void LocalBackend::grant_waiting() {
  // Oldest first. After a reload lowered max_concurrent_runs, nothing is
  // handed on until the runs in flight are below the new limit.
  while (!stopping_ && in_flight_ < max_concurrent_ && !waiters_.empty()) {
    auto w = waiters_.front();
    waiters_.pop_front();
    ++in_flight_;
    w->granted = true;
    w->timer.cancel();
  }
}

asio::awaitable<BackendRun> LocalBackend::run(PreparedRun& p) {
  BackendRun out;
  const Policy& pol = p.policy();
  const protocol::CommonRunFields& c = *p.common;

  // What the spawner's decoder accepts (daemon/spawner/wire.h); execve
  // refuses much less (128 KiB a variable) anyway.
  for (const auto& [k, v] : p.env)
    if (k.size() > spawn::kMaxName || v.size() > spawn::kMaxValue) {
      out.refused = Refusal{ErrorCode::BadRequest, "environment: the value of " + q(k) + " is larger than " +
                                                       std::to_string(spawn::kMaxValue) + " bytes"};
      co_return out;
    }
  spawn::RunOrder order;
  order.policy = pol.name;
  order.fingerprint = pol.fingerprint;
  order.env = p.env;
  order.timeout = p.timeout;
  std::string stdin_data;
  if (p.tool_mode) {
    order.mode = spawn::RunMode::Tool;
    stdin_data = std::move(p.runner_request);
  } else {
    // The script arrives on stdin, so no size limit of argv applies and it
    // never touches a file system.
    order.mode = spawn::RunMode::Script;
    stdin_data = std::get<protocol::ExecuteRequest>(p.request->body).script;
  }

  switch (co_await acquire_slot(p)) {
    case Slot::Granted: break;
    case Slot::ClientGone:
      // Never started: no sandbox, no run record, no audit line of a run.
      spdlog::info("request {} of peer uid={} pid={} (org={} tool={}) dropped before it ran: the client disconnected",
                   q(p.request->id), p.peer.uid, p.peer.pid, q(c.organization_id), q(c.tool_name));
      out.refused = Refusal{ErrorCode::Unavailable, "the client disconnected before the run started"};
      co_return out;
    case Slot::Busy:
      out.refused = Refusal{ErrorCode::Busy, "too many runs in flight (" + std::to_string(in_flight_) + " running, " +
                                                 std::to_string(waiters_.size()) + " queued); retry later"};
      co_return out;
    case Slot::ShuttingDown:
      out.refused = Refusal{ErrorCode::Unavailable, "the daemon is shutting down"};
      co_return out;
  }
  // The slot goes back once the pipeline has recorded the run (or when
  // `out` is dropped on any other path).
  out.held = std::shared_ptr<void>(nullptr, [this](void*) { release_slot(); });

  live_.insert(p.cancel);
  // Out of live_ however the run ends (an exception too): shutdown waits
  // for live_ to empty.
  struct Unlive {
    std::set<std::shared_ptr<CancelSignal>>& live;
    const std::shared_ptr<CancelSignal>& cancel;
    ~Unlive() { live.erase(cancel); }
  } unlive{live_, p.cancel};
  // Where the result frame starts: kept past the output cap, so a run that
  // prints more than the cap still returns its result (capped_output.h).
  std::vector<std::string> frame_tokens;
  if (p.tool_mode) {
    // With the newline the runner writes before its frame, which belongs to it.
    frame_tokens.push_back("\n" + std::string(protocol::kNonceFrameStart) + p.shape.nonce +
                           std::string(protocol::kNonceFrameClose));
  } else {
    frame_tokens.emplace_back(protocol::kBinaryMarker);
    frame_tokens.emplace_back(protocol::kLegacyStartMarker);
  }
  // Network egress: the run's proxy, from its Started until it ended
  // (daemon/egress/proxy.h), on any path out of here.
  std::shared_ptr<egress::RunProxy> proxy;
  if (pol.network == isolate::NetworkMode::Egress)
    proxy = std::make_shared<egress::RunProxy>(egress_, pol.egress,
                                               egress::RunLabels{p.request->id, c.organization_id, c.tool_name});
  struct StopProxy {
    const std::shared_ptr<egress::RunProxy>& proxy;
    ~StopProxy() {
      if (proxy) proxy->stop();
    }
  } stop_proxy{proxy};
  LinkRun ran = co_await link_.run(std::move(order), std::move(stdin_data), pol.limits.stdout_bytes,
                                   pol.limits.stderr_bytes, std::move(frame_tokens), *p.cancel, proxy.get());
  if (proxy) {
    proxy->stop();
    out.record["egress"] = proxy->summary();
    out.audit += proxy->audit_fields();
  }
  if (ran.refused) {
    // The spawner checks every order against its own copy of the policy:
    // a refusal here is a reload between placement and start (the policy
    // is gone), its own run limit, or its stopping.
    using spawn::RefuseCode;
    const RefuseCode rc = ran.refused->code;
    ErrorCode code = rc == RefuseCode::Busy ? ErrorCode::Busy
                     : rc == RefuseCode::Unavailable || rc == RefuseCode::UnknownPolicy ? ErrorCode::Unavailable
                     : rc == RefuseCode::OutOfBounds ? ErrorCode::PolicyDenied
                                                     : ErrorCode::Internal;
    out.refused = Refusal{code, ran.refused->message};
    co_return out;
  }
  out.run = std::move(ran.result);
  if (out.run.reason == isolate::EndReason::SetupFailed && !out.run.error.empty())
    spdlog::error("run {}: {}", out.run.run_id.empty() ? "-" : out.run.run_id, out.run.error);
  // Local runs use the policy's read-only venv: nothing is installed per run
  // (a shared, writable venv is how Letta's local sandbox gets poisoned).
  if (p.tool_mode && !std::get<protocol::RunToolRequest>(p.request->body).pip_requirements.empty())
    out.record["pip_requirements_ignored"] = true;
  if (!p.tool_mode) co_await decode_pickle(p, out);
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
  const std::string nonce = random_hex(16);
  // Base64 needs no JSON escaping.
  std::string request = "{\"nonce\":\"" + nonce + "\",\"unpickle\":\"" + *payload + "\"}";
  std::vector<std::string> frame_tokens{"\n" + std::string(protocol::kNonceFrameStart) + nonce +
                                        std::string(protocol::kNonceFrameClose)};
  LinkRun ran = co_await link_.run(std::move(order), std::move(request), pol.limits.stdout_bytes,
                                   pol.limits.stderr_bytes, std::move(frame_tokens), *p.cancel);
  if (ran.refused) {
    d.failure = ran.refused->message;
    co_return;
  }
  const isolate::RunResult& r = ran.result;
  out.record["pickle_decode_run_id"] = r.run_id;
  out.audit += " pickle_decode_run_id=" + (r.run_id.empty() ? std::string("-") : r.run_id);
  auto frame = protocol::extract_nonce_frame(r.stdout_data, nonce);
  if (!frame.ok()) {
    d.failure = frame.error().message;
  } else if (!frame->has_value()) {
    d.failure = r.reason == EndReason::Exited ? std::string("the decoder wrote no result")
                                              : "the decoder's run ended: " + std::string(isolate::to_string(r.reason));
  } else {
    d.frame = std::move(**frame);
  }
}

}  // namespace tsb::core
