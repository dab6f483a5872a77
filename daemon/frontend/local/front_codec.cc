// The front end's half of the spawner's messages (daemon/wire/compiled.h):
// what the front end writes, and what it reads from the spawner. Kept
// apart from compiled.cc so that none of it is linked into the root
// spawner; the unit tests and the spawn_wire fuzz target hold both halves
// to one format.
#include "daemon/frontend/local/front_codec.h"
#include "daemon/common/quote.h"
#include "isolate/supervise/outcome.h"

namespace tsb::spawn {
namespace {

void put_map(Writer& w, const std::map<std::string, std::string>& m) {
  w.u32(static_cast<std::uint32_t>(m.size()));
  for (const auto& [k, v] : m) {
    w.str(k);
    w.str(v);
  }
}

}  // namespace

Result<Hello> decode_hello(std::string_view b) {
  Reader r = open_message(b, Msg::Hello);
  Hello m;
  m.instance = r.str(kMaxName);
  m.cgroup_mode = r.str(kMaxName);
  m.cgroup_summary = r.str(kMaxName);
  m.features.memfd_noexec = r.flag();
  m.features.overlay_views = r.flag();
  m.features.tcp_memory_limit = r.flag();
  m.features.oom_score_floor = r.flag();
  m.features.landlock_abi = r.i32();
  m.notes = r.strs(1024, kMaxName);
  return finish_message(r, std::move(m), "hello");
}

std::string encode(const RunOrder& m) {
  Writer w;
  w.u8(static_cast<std::uint8_t>(Msg::Run));
  w.u64(m.id);
  w.str(m.policy);
  w.str(m.fingerprint);
  w.u8(static_cast<std::uint8_t>(m.mode));
  put_map(w, m.env);
  w.u64(static_cast<std::uint64_t>(m.timeout.count()));
  w.str(m.venv);
  w.u8(m.warm ? 1 : 0);
  w.str(m.node_modules);
  return w.take();
}

Result<Started> decode_started(std::string_view b) {
  Reader r = open_message(b, Msg::Started);
  Started m;
  m.id = r.u64();
  m.run_id = r.str(kMaxName);
  m.host_uid = r.u32();
  m.warm = r.flag();
  return finish_message(r, std::move(m), "started");
}

Result<PoolState> decode_pool_state(std::string_view b) {
  Reader r = open_message(b, Msg::PoolState);
  PoolState m;
  for (std::uint32_t i = 0, n = r.count(1u << 16, 16); i < n && r.ok(); ++i) {
    PoolState::Pool p;
    p.policy = r.str(kMaxName);
    p.mode = static_cast<RunMode>(r.upto(1));
    for (std::uint32_t* v : {&p.ready, &p.starting, &p.target}) *v = r.u32();
    for (std::uint64_t* v : {&p.hits, &p.misses, &p.lost}) *v = r.u64();
    m.pools.push_back(std::move(p));
  }
  return finish_message(r, std::move(m), "pool state");
}

std::string encode_pools_question() { return std::string(1, static_cast<char>(Msg::Pools)); }

Result<Refused> decode_refused(std::string_view b) {
  Reader r = open_message(b, Msg::Refused);
  Refused m;
  m.id = r.u64();
  m.code = static_cast<RefuseCode>(r.u8());
  m.message = r.str(kMaxValue);
  return finish_message(r, std::move(m), "refused");
}

Result<Ended> decode_ended(std::string_view b) {
  Reader r = open_message(b, Msg::Ended);
  Ended m;
  isolate::Observations& o = m.observations;
  m.id = r.u64();
  m.run_id = r.str(kMaxName);
  m.host_uid = r.u32();
  for (auto* t : {&m.wall, &m.cpu, &m.warm_start_cpu})
    *t = std::chrono::nanoseconds(static_cast<std::int64_t>(r.u64() & INT64_MAX));
  m.peak_memory_bytes = r.u64();
  for (bool* f : {&o.have_tool_status, &o.have_setup_error, &o.timed_out, &o.output_exceeded, &o.cpu_exceeded,
                  &o.cancelled, &o.backstop, &o.socket_limit_reached})
    *f = r.flag();
  for (int* v : {&o.tool_status, &o.setup_stage, &o.setup_errno, &o.backstop_s, &o.engine_errno, &o.landlock})
    *v = r.i32();
  if (o.setup_stage < 0 || o.setup_stage >= static_cast<int>(isolate::Stage::kCount)) r.fail();
  o.oom_kills = r.u64();
  o.pids_max_hits = r.u64();
  o.engine_error = r.str(kMaxValue);
  o.setup_path = r.str(kMaxValue);
  o.moved_aside = r.strs(64, kMaxValue);
  return finish_message(r, std::move(m), "ended");
}

isolate::RunResult run_result_from(const Ended& e) {
  isolate::RunResult r;
  r.run_id = e.run_id;
  r.host_uid = e.host_uid;
  r.wall = e.wall;
  r.cpu = e.cpu;
  r.peak_memory_bytes = e.peak_memory_bytes;
  isolate::classify(e.observations, r);
  name_setup_path(r);
  return r;
}

std::string encode(const Kill& m) {
  Writer w;
  w.u8(static_cast<std::uint8_t>(Msg::Kill));
  w.u64(m.id);
  return w.take();
}

std::string encode_notify(std::string_view text) {
  Writer w;
  w.u8(static_cast<std::uint8_t>(Msg::Notify));
  w.str(text);
  return w.take();
}

Result<bool> decode_reload(std::string_view b) {
  Reader r = open_message(b, Msg::Reload);
  bool applied = r.flag();
  return finish_message(r, applied, "reload");
}

}  // namespace tsb::spawn
