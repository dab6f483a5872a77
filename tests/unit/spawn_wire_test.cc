// The spawner's closed formats (daemon/wire/compiled.h): what is encoded
// is decoded to the same value, and nothing else is accepted.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "daemon/compile/set_codec.h"
#include "daemon/frontend/local/front_codec.h"
#include "isolate/supervise/outcome.h"
#include "daemon/policy/fs_table.h"

namespace s = tsb::spawn;

namespace {

s::CompiledSet sample_set() {
  s::CompiledSet c;
  auto prog = std::make_shared<tsb::isolate::SeccompProgram>();
  prog->name = "p";
  prog->insns = {sock_filter{0x06, 0, 0, 0x7fff0000}};
  prog->sha256 = std::string(64, 'a');
  c.init_filter = prog;
  c.front_end_user = "toolsandboxd";
  c.front_end_uid = 999;
  c.front_end_gid = 995;
  c.engine.cgroups = {tsb::isolate::CgroupMode::V1, "/toolsandbox", {{"memory", "/sys/fs/cgroup/memory/toolsandbox"}}};
  s::SpawnPolicy p;
  p.name = "default";
  p.fingerprint = "sha256:00";
  p.limits.wall_timeout = std::chrono::milliseconds(1234);
  p.env_set = {{"PATH", "/bin"}};
  p.env_allow = {"LETTA_*"};
  p.seccomp = prog;
  p.hostname = "sandbox";
  tsb::isolate::FsInputs in;
  in.binds = {{"/srv/a", "/a", true, false}};
  p.modes[0] = {{"/venv/bin/python3", "-c", "pass"}, {}, *tsb::isolate::build_fs_table(in)};
  in.runner = "/runner.py";
  p.modes[1] = {{"/venv/bin/python3", "/opt/runner.py"}, {"/venv/bin/python3", "-c", "run_pooled()"},
                *tsb::isolate::build_fs_table(in)};
  p.warm_max = 3;
  p.warm_min = 1;
  p.warm_idle = std::chrono::milliseconds(5000);
  c.policies.push_back(p);
  return c;
}

std::string corpus(const std::string& name) {
  std::ifstream f(std::string(TSB_SOURCE_DIR) + "/tests/fuzz/corpus/spawn_wire/" + name, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str().substr(1);  // the fuzz target's selector byte
}

}  // namespace

TEST(SpawnWire, CompiledSetRoundTrips) {
  const std::string bytes = s::encode_compiled_set(sample_set());
  auto d = s::decode_compiled_set(bytes);
  ASSERT_TRUE(d.ok()) << d.error().message;
  ASSERT_EQ(d->policies.size(), 1u);
  const s::SpawnPolicy& p = d->policies[0];
  EXPECT_EQ(p.name, "default");
  EXPECT_EQ(p.limits.wall_timeout.count(), 1234);
  ASSERT_EQ(p.modes[1].fs->size(), sample_set().policies[0].modes[1].fs->size());
  auto bind = std::find_if(p.modes[0].fs->begin(), p.modes[0].fs->end(), [](const auto& e) { return e.path == "/a"; });
  ASSERT_NE(bind, p.modes[0].fs->end());
  EXPECT_EQ(bind->kind, tsb::isolate::FsEntry::kBind);
  EXPECT_EQ(bind->source, "/srv/a");
  EXPECT_EQ(p.modes[1].argv.back(), "/opt/runner.py");
  EXPECT_EQ(p.modes[1].pooled_argv.back(), "run_pooled()");
  EXPECT_TRUE(p.modes[0].pooled_argv.empty());
  EXPECT_EQ(p.warm_max, 3u);
  EXPECT_EQ(p.warm_min, 1u);
  EXPECT_EQ(p.warm_idle.count(), 5000);
  EXPECT_EQ(d->engine.cgroups.hierarchies.at(0).base, "/sys/fs/cgroup/memory/toolsandbox");
  EXPECT_EQ(d->engine.cgroups.mode, tsb::isolate::CgroupMode::V1);
  EXPECT_EQ(p.env_set.at("PATH"), "/bin");
  EXPECT_EQ(p.seccomp->insns.size(), 1u);
  EXPECT_EQ(d->front_end_uid, 999u);
  EXPECT_EQ(s::encode_compiled_set(*d), bytes);
  // Cut anywhere, or with a byte more, it is refused.
  for (std::size_t n = 0; n < bytes.size(); n += 7) EXPECT_FALSE(s::decode_compiled_set(bytes.substr(0, n)).ok()) << n;
  EXPECT_FALSE(s::decode_compiled_set(bytes + "x").ok());
}

TEST(SpawnWire, CompiledSetRefusesWhatTheSpawnerCannotUse) {
  auto c = sample_set();
  c.front_end_uid = 0;
  EXPECT_FALSE(s::decode_compiled_set(s::encode_compiled_set(c)).ok());
  c = sample_set();
  auto empty = std::make_shared<tsb::isolate::SeccompProgram>();
  c.policies[0].seccomp = empty;
  EXPECT_FALSE(s::decode_compiled_set(s::encode_compiled_set(c)).ok()) << "an empty filter must never load as none";
  c = sample_set();
  c.policies[0].modes[0].argv = {"python3"};
  EXPECT_FALSE(s::decode_compiled_set(s::encode_compiled_set(c)).ok()) << "the interpreter must be absolute";
  c = sample_set();
  auto table = std::make_shared<tsb::isolate::FsTable>(*c.policies[0].modes[1].fs);
  table->erase(table->begin());
  c.policies[0].modes[1].fs = table;
  EXPECT_FALSE(s::decode_compiled_set(s::encode_compiled_set(c)).ok()) << "a table starts with its root";
  c = sample_set();
  c.policies[0].warm_min = 4;  // more than its max
  EXPECT_FALSE(s::decode_compiled_set(s::encode_compiled_set(c)).ok()) << "warm_pool min above max";
  c = sample_set();
  c.policies[0].warm_max = 65;
  c.policies[0].warm_min = 0;
  EXPECT_FALSE(s::decode_compiled_set(s::encode_compiled_set(c)).ok()) << "warm_pool max above 64";
}

TEST(SpawnWire, TheFuzzSeedsAreWhatTheyClaim) {
  EXPECT_TRUE(s::decode_compiled_set(corpus("set.bin")).ok());
  EXPECT_FALSE(s::decode_compiled_set(corpus("set-truncated.bin")).ok());
  EXPECT_FALSE(s::decode_compiled_set(corpus("set-empty-program.bin")).ok());
  EXPECT_FALSE(s::decode_compiled_set(corpus("set-bad-magic.bin")).ok());
  EXPECT_FALSE(s::decode_compiled_set(corpus("set-table-without-root.bin")).ok());
  EXPECT_TRUE(s::decode_run(corpus("run-script.bin")).ok());
  auto tool = s::decode_run(corpus("run-tool-env.bin"));
  ASSERT_TRUE(tool.ok());
  EXPECT_EQ(tool->mode, s::RunMode::Tool);
  EXPECT_EQ(tool->env.at("TZ"), "UTC");
  EXPECT_EQ(tool->venv, "");
  auto venv = s::decode_run(corpus("run-venv.bin"));
  ASSERT_TRUE(venv.ok());
  EXPECT_EQ(venv->venv, std::string("0123456789abcdef") + "0123456789abcdef" + "0123456789abcdef" + "0123456789abcdef");
  EXPECT_TRUE(venv->warm);
  EXPECT_FALSE(tool->warm);
  for (const char* bad : {"run-duplicate-env.bin", "run-truncated.bin", "run-trailing.bin", "run-bad-mode.bin",
                          "run-huge-length.bin", "run-bad-warm.bin"})
    EXPECT_FALSE(s::decode_run(corpus(bad)).ok()) << bad;
  EXPECT_TRUE(s::decode_kill(corpus("kill.bin")).ok());
  EXPECT_FALSE(s::decode_kill(corpus("kill-trailing.bin")).ok());
  EXPECT_TRUE(s::decode_notify(corpus("notify.bin")).ok());
  EXPECT_EQ(corpus("pools.bin"), s::encode_pools_question());
}

TEST(SpawnWire, StartedAndPoolStateRoundTrip) {
  auto st = s::decode_started(s::encode(s::Started{4, "r9", 1u << 30, true}));
  ASSERT_TRUE(st.ok());
  EXPECT_TRUE(st->warm);
  EXPECT_EQ(st->run_id, "r9");
  s::PoolState ps;
  ps.pools.push_back({"default", s::RunMode::Script, 2, 1, 3, 10, 4, 1});
  ps.pools.push_back({"tools", s::RunMode::Tool, 0, 0, 1, 0, 1, 0});
  const std::string bytes = s::encode(ps);
  auto d = s::decode_pool_state(bytes);
  ASSERT_TRUE(d.ok()) << d.error().message;
  ASSERT_EQ(d->pools.size(), 2u);
  EXPECT_EQ(d->pools[0].ready, 2u);
  EXPECT_EQ(d->pools[0].starting, 1u);
  EXPECT_EQ(d->pools[0].hits, 10u);
  EXPECT_EQ(d->pools[1].mode, s::RunMode::Tool);
  for (std::size_t n = 0; n < bytes.size(); ++n) EXPECT_FALSE(s::decode_pool_state(bytes.substr(0, n)).ok()) << n;
}

TEST(SpawnWire, MessagesRoundTripAndRefuseOtherTypes) {
  s::RunOrder o{5, "default", "sha256:1", s::RunMode::Tool, {{"A", "1"}, {"B", ""}}, std::chrono::milliseconds(9)};
  auto d = s::decode_run(s::encode(o));
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->env, o.env);
  EXPECT_EQ(d->timeout, o.timeout);
  EXPECT_FALSE(s::decode_kill(s::encode(o)).ok());
  s::Ended ended;
  ended.id = 5;
  ended.run_id = "r1";
  ended.observations.timed_out = true;
  ended.observations.have_tool_status = true;
  ended.observations.tool_status = 9;  // killed by SIGKILL
  ended.observations.oom_kills = 3;
  ended.wall = std::chrono::milliseconds(7);
  ended.cpu = std::chrono::microseconds(1500);
  ended.warm_start_cpu = std::chrono::microseconds(24100);
  auto e = s::decode_ended(s::encode(ended));
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(s::encode(*e), s::encode(ended));
  EXPECT_EQ(e->wall, ended.wall);
  EXPECT_EQ(e->cpu, ended.cpu);
  EXPECT_EQ(e->warm_start_cpu, ended.warm_start_cpu);
  const tsb::isolate::RunResult r = s::run_result_from(*e);
  EXPECT_EQ(r.run_id, "r1");
  EXPECT_EQ(r.reason, tsb::isolate::EndReason::Timeout);
  EXPECT_EQ(r.error, "");
  ended.observations.setup_stage = static_cast<int>(tsb::isolate::Stage::kCount);
  EXPECT_FALSE(s::decode_ended(s::encode(ended)).ok()) << "a stage the front end cannot name";
  s::Ended failed;
  failed.id = 6;
  failed.observations.engine_error = "clone3: Resource temporarily unavailable";
  failed.observations.engine_errno = EAGAIN;
  auto f = s::decode_ended(s::encode(failed));
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(s::run_result_from(*f).reason, tsb::isolate::EndReason::SetupFailed);
  EXPECT_EQ(s::run_result_from(*f).error, failed.observations.engine_error);
  // A set-up step's failure names its path, escaped (a path can hold any
  // byte); what the set-up moved aside is kept, bounded.
  s::Ended step;
  step.observations.have_setup_error = true;
  step.observations.setup_stage = static_cast<int>(tsb::isolate::Stage::MountBind);
  step.observations.setup_errno = ENXIO;
  step.observations.setup_path = "/data/x\n\x1b[2Jaudit run_id=forged";
  step.observations.moved_aside = {"/data/cfg.left-by-a-run-7"};
  auto sf = s::decode_ended(s::encode(step));
  ASSERT_TRUE(sf.ok());
  const tsb::isolate::RunResult sr = s::run_result_from(*sf);
  EXPECT_EQ(sr.reason, tsb::isolate::EndReason::SetupFailed);
  EXPECT_EQ(sr.setup_path, step.observations.setup_path);
  EXPECT_EQ(sr.error, "sandbox set-up failed at mount-bind: No such device or address "
                      "(at \"/data/x\\n\\u001B[2Jaudit run_id=forged\")");
  EXPECT_EQ(sr.moved_aside, step.observations.moved_aside);
  step.observations.moved_aside.assign(65, "/x");
  EXPECT_FALSE(s::decode_ended(s::encode(step)).ok()) << "more moves than the front end takes";
  s::Hello h{"tag", "v2", "summary", {true, false, true, false}, {"note"}};
  auto hh = s::decode_hello(s::encode(h));
  ASSERT_TRUE(hh.ok());
  EXPECT_TRUE(hh->features.memfd_noexec);
  EXPECT_FALSE(hh->features.overlay_views);
  EXPECT_EQ(hh->notes, std::vector<std::string>{"note"});
}

TEST(SpawnWire, EnvironmentRules) {
  std::map<std::string, std::string> set = {{"PATH", "/bin"}};
  std::vector<std::string> allow = {"LETTA_*", "TZ"};
  using P = s::EnvProblem;
  const auto check = [&](const std::vector<std::string>& allowed, const std::map<std::string, std::string>& req,
                         std::string* name) { return s::check_environment(set, allowed, req, name); };
  std::string name;
  EXPECT_EQ(check(allow, {{"LETTA_AGENT_ID", "a"}, {"TZ", "UTC"}}, &name), P::kOk);
  EXPECT_EQ(name, "");
  EXPECT_EQ(check(allow, {{"PATH", "/evil"}}, &name), P::kFixed);
  EXPECT_EQ(name, "PATH");
  EXPECT_EQ(check(allow, {{"LD_PRELOAD", "x"}}, &name), P::kNotAllowed);
  EXPECT_EQ(name, "LD_PRELOAD");
  EXPECT_EQ(check(allow, {{"TZZ", "x"}}, &name), P::kNotAllowed);
  EXPECT_EQ(check({"*"}, {{"1X", "x"}}, &name), P::kBadName);
  EXPECT_EQ(check(allow, {{"TZ", std::string("a\0b", 3)}}, &name), P::kNul);
  EXPECT_EQ(s::environment_of(set, {{"TZ", "UTC"}}), (std::vector<std::string>{"PATH=/bin", "TZ=UTC"}));
}
