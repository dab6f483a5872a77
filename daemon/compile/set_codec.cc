// The compile helper's half of the compiled set (daemon/wire/compiled.h):
// the encoder. The root spawner links only the decoder (compiled.cc); the
// unit tests and the spawn_wire fuzz target hold both halves to one format.
#include "daemon/compile/set_codec.h"

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
  w.u8(e.landlock ? 1 : 0);
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
    w.u32(static_cast<std::uint32_t>(p.env_set.size()));
    for (const auto& [k, v] : p.env_set) {
      w.str(k);
      w.str(v);
    }
    w.strs(p.env_allow);
    put_program(w, *p.seccomp);
    w.u32(p.uid);
    w.u32(p.gid);
    for (const auto& m : p.modes) {
      w.strs(m.argv);
      w.strs(m.pooled_argv);
      w.u8(m.end_note ? 1 : 0);
      put_table(w, m.fs ? *m.fs : isolate::FsTable{});
    }
    w.u8(static_cast<std::uint8_t>(p.warm_max));
    w.u8(static_cast<std::uint8_t>(p.warm_min));
    w.u64(static_cast<std::uint64_t>(p.warm_idle.count()));
  }
  return w.take();
}

}  // namespace tsb::spawn
