// The front end's half of the spawner's formats (daemon/spawner/compiled.h):
// what the front end and the compile helper write, and what they read from
// the spawner. Kept apart from compiled.cc so that none of it is linked into
// the root spawner; the unit tests and the spawn_wire fuzz target hold both
// halves to one format.
#include "daemon/spawner/front_codec.h"
#include "isolate/outcome.h"

namespace tsb::spawn {
namespace {

void put_limits(Writer& w, const isolate::Limits& l) {
  w.u64(l.memory_bytes);
  w.u64(l.pids);
  w.u32(l.cpu_quota_millicpus);
  w.u64(static_cast<std::uint64_t>(l.cpu_time.count()));
  w.u64(static_cast<std::uint64_t>(l.wall_timeout.count()));
  w.u64(l.tmp_bytes);
  w.u64(l.work_bytes);
  w.u64(l.file_size_bytes);
  w.u64(l.open_files);
  w.u64(l.stdout_bytes);
  w.u64(l.stderr_bytes);
}

void put_program(Writer& w, const isolate::SeccompProgram& p) {
  w.str({reinterpret_cast<const char*>(p.insns.data()), p.insns.size() * sizeof(sock_filter)});
}

void put_table(Writer& w, const isolate::FsTable& t) {
  w.u32(static_cast<std::uint32_t>(t.size()));
  for (const isolate::FsEntry& e : t) {
    w.u8(e.kind);
    w.u8(static_cast<std::uint8_t>(e.stage));
    w.u8((e.tool_owned ? 1 : 0) | (e.noexec ? 2 : 0) | (e.optional ? 4 : 0) | (e.keyed ? 8 : 0));
    w.str(e.path);
    w.str(e.source);
    w.str(e.data);
    w.u64(e.size);
    w.u32(e.inodes);
    w.u32(e.mode);
  }
}

void put_map(Writer& w, const std::map<std::string, std::string>& m) {
  w.u32(static_cast<std::uint32_t>(m.size()));
  for (const auto& [k, v] : m) {
    w.str(k);
    w.str(v);
  }
}

}  // namespace

std::string encode_compiled_set(const CompiledSet& s) {
  Writer w;
  for (char c : kSetMagic) w.u8(static_cast<std::uint8_t>(c));
  const isolate::EngineConfig& e = s.engine;
  const isolate::CgroupPlacement& cg = e.cgroups;
  w.u8(cg.mode == isolate::CgroupMode::V1 ? 1 : 0);
  w.str(cg.parent);
  w.u32(static_cast<std::uint32_t>(cg.hierarchies.size()));
  for (const auto& h : cg.hierarchies) {
    w.str(h.controller);
    w.str(h.base);
  }
  w.strs(cg.make);
  w.str(cg.join);
  w.strs(cg.enable);
  w.str(e.state_dir);
  w.u32(e.uid_base);
  w.u32(e.uid_slots);
  w.str(e.init_path);
  w.str(e.leaf_prefix);
  w.strs(e.stale_leaves);
  w.u8(e.hide_host_paths ? 1 : 0);
  w.i32(e.sandbox_oom_score_adj);
  put_program(w, *s.init_filter);
  w.str(s.socket_path);
  w.u32(s.socket_mode);
  w.u32(s.socket_gid);
  w.str(s.front_end_user);
  w.u32(s.front_end_uid);
  w.u32(s.front_end_gid);
  w.str(s.e2b_key_file);
  w.u32(s.max_concurrent_runs);
  w.u64(static_cast<std::uint64_t>(s.shutdown_grace.count()));
  w.u32(static_cast<std::uint32_t>(s.policies.size()));
  for (const SpawnPolicy& p : s.policies) {
    w.str(p.name);
    w.str(p.fingerprint);
    w.u8(p.local ? 1 : 0);
    put_limits(w, p.limits);
    w.str(p.workdir);
    w.str(p.hostname);
    w.u8(static_cast<std::uint8_t>(p.network));
    put_map(w, p.env_set);
    w.strs(p.env_allow);
    put_program(w, *p.seccomp);
    w.u32(p.uid);
    w.u32(p.gid);
    for (const auto& m : p.modes) {
      w.strs(m.argv);
      w.strs(m.pooled_argv);
      put_table(w, m.fs ? *m.fs : isolate::FsTable{});
    }
    w.u8(static_cast<std::uint8_t>(p.warm_max));
    w.u8(static_cast<std::uint8_t>(p.warm_min));
    w.u64(static_cast<std::uint64_t>(p.warm_idle.count()));
  }
  return w.take();
}

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
  m.wall = std::chrono::nanoseconds(static_cast<std::int64_t>(r.u64() & INT64_MAX));
  m.cpu = std::chrono::nanoseconds(static_cast<std::int64_t>(r.u64() & INT64_MAX));
  m.peak_memory_bytes = r.u64();
  for (bool* f : {&o.have_tool_status, &o.have_setup_error, &o.timed_out, &o.output_exceeded, &o.cpu_exceeded,
                  &o.cancelled, &o.backstop, &o.socket_limit_reached})
    *f = r.flag();
  for (int* v : {&o.tool_status, &o.setup_stage, &o.setup_errno, &o.backstop_s, &o.engine_errno}) *v = r.i32();
  if (o.setup_stage < 0 || o.setup_stage >= static_cast<int>(isolate::Stage::kCount)) r.fail();
  o.oom_kills = r.u64();
  o.pids_max_hits = r.u64();
  o.engine_error = r.str(kMaxValue);
  o.cleanup_error = r.str(kMaxValue);
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
