// The run pipeline's pure parts (daemon/frontend/pipeline/pipeline.h): what prepare_run
// decides for every backend, and what finish_run makes of a backend's run.
#include <gtest/gtest.h>

#include <memory>

#include "daemon/frontend/pipeline/pipeline.h"
#include "daemon/policy/policy.h"
#include "daemon/frontend/letta/letta.h"

namespace tsb::core {
namespace {

using nlohmann::json;
using protocol::ErrorCode;

// A backend that runs nothing: what prepare_run asks of one is its
// requirement rules.
class StubBackend : public RunBackend {
 public:
  explicit StubBackend(std::string_view name) : name_(name) {}
  std::string_view name() const noexcept override { return name_; }
  RequirementRules requirement_rules(const Policy&) const override { return rules; }
  TypeScriptRules typescript_rules(const Policy&) const override { return ts; }
  asio::awaitable<BackendRun> run(PreparedRun&) override { co_return BackendRun{}; }
  RequirementRules rules;
  TypeScriptRules ts;

 private:
  std::string_view name_;
};

class Pipeline : public testing::Test {
 protected:
  void SetUp() override {
    PolicyContext ctx;
    ctx.compile = false;
    auto p = load_named_policy("default", "", ctx);
    ASSERT_TRUE(p.ok()) << p.error().message;
    Policy pol = std::move(p).value();
    pol.limits.wall_timeout = std::chrono::seconds(60);
    pol.env_allow = {"API_KEY", "LETTA_*"};
    auto set = std::make_shared<PolicySet>();
    set->policies["default"] = std::make_shared<const Policy>(pol);
    Policy remote = pol;
    remote.name = "remote";
    remote.backend = Backend::E2B;
    set->policies["remote"] = std::make_shared<const Policy>(remote);
    set->orgs.fallback = OrgEntry{false, "default", {"default", "remote"}, ""};
    set_ = set;
  }

  protocol::Request request(const json& j) {
    std::string id;
    auto r = protocol::decode_request(j.dump(), &id);
    EXPECT_TRUE(std::holds_alternative<protocol::Request>(r)) << j.dump();
    return std::get<protocol::Request>(std::move(r));
  }
  json execute(json extra = json::object()) {
    json j = {{"v", 1}, {"id", "r1"}, {"type", "execute"}, {"tool_name", "t"}, {"organization_id", "org-1"},
              {"script", "print(1)"}};
    for (auto it = extra.begin(); it != extra.end(); ++it) j[it.key()] = it.value();
    return j;
  }
  json run_tool(json extra = json::object()) {
    json j = {{"v", 1},  {"id", "r2"}, {"type", "run_tool"}, {"tool_name", "add"}, {"organization_id", "org-1"},
              {"source_code", "def add(a, b):\n    return a + b\n"}, {"args", {{"a", 1}, {"b", 2}}}};
    for (auto it = extra.begin(); it != extra.end(); ++it) j[it.key()] = it.value();
    return j;
  }

  // The "default" policy of set_, with this environment allow-list.
  void allow_env(std::vector<std::string> allow) {
    auto set = std::make_shared<PolicySet>(*set_);
    for (const char* name : {"default", "remote"}) {
      Policy pol = *set->policies[name];
      pol.env_allow = allow;
      set->policies[name] = std::make_shared<const Policy>(pol);
    }
    set_ = set;
  }

  // The backends prepare_run places runs on; E2B when configured.
  Backends backends(bool e2b) { return Backends{&local_, e2b ? &e2b_ : nullptr, e2b}; }

  std::shared_ptr<const PolicySet> set_;
  StubBackend local_{"local"}, e2b_{"e2b"};
};

TEST_F(Pipeline, PreparesTimeoutEnvironmentAndShape) {
  auto req = request(execute({{"timeout", 2.5}, {"env", {{"API_KEY", "k"}}}, {"agent_id", "agent-7"}}));
  PreparedRun p;
  auto refused = prepare_run(req, Peer{}, set_, backends(false), "", p);
  ASSERT_FALSE(refused) << refused->message;
  EXPECT_FALSE(p.tool_mode);
  EXPECT_EQ(p.placement.backend, Backend::Local);
  EXPECT_EQ(p.timeout, std::chrono::milliseconds(2500));
  EXPECT_DOUBLE_EQ(p.shape.timeout_s, 2.5);
  EXPECT_EQ(p.env.at("API_KEY"), "k");
  EXPECT_EQ(p.env.at("LETTA_AGENT_ID"), "agent-7");
  EXPECT_NE(std::find(p.sandbox_env.begin(), p.sandbox_env.end(), "API_KEY=k"), p.sandbox_env.end());
  ASSERT_TRUE(p.cancel);
  EXPECT_FALSE(p.cancel->requested());
  EXPECT_TRUE(p.runner_request.empty());
}

TEST_F(Pipeline, ARequestNeverRaisesThePolicysTimeout) {
  auto req = request(execute({{"timeout", 180}}));
  PreparedRun p;
  ASSERT_FALSE(prepare_run(req, Peer{}, set_, backends(false), "", p));
  EXPECT_EQ(p.timeout, std::chrono::seconds(60));
  EXPECT_DOUBLE_EQ(p.shape.timeout_s, 60.0);  // what the messages say
}

// A variable the policy fixes keeps the policy's value and is named in the
// record; it does not refuse the call (a Letta sandbox config often sets
// LANG or HOME).
TEST_F(Pipeline, FixedNamesKeepThePolicysValueAndAreRecorded) {
  const Policy& pol = *set_->policies.at("default");
  ASSERT_TRUE(pol.env_set.count("HOME") && pol.env_set.count("LANG")) << "the default policy fixes HOME and LANG";
  auto req = request(execute({{"env", {{"LANG", "xx_XX"}, {"HOME", "/root"}, {"API_KEY", "k"}}}, {"timeout", 180}}));
  PreparedRun p;
  auto refused = prepare_run(req, Peer{}, set_, backends(false), "", p);
  ASSERT_FALSE(refused) << refused->message;
  EXPECT_EQ(p.env_overridden, (std::vector<std::string>{"HOME", "LANG"}));
  EXPECT_FALSE(p.env.count("LANG"));
  EXPECT_EQ(p.env.at("API_KEY"), "k");
  EXPECT_NE(std::find(p.sandbox_env.begin(), p.sandbox_env.end(), "LANG=" + pol.env_set.at("LANG")), p.sandbox_env.end());
  EXPECT_EQ(std::find(p.sandbox_env.begin(), p.sandbox_env.end(), "LANG=xx_XX"), p.sandbox_env.end());

  BackendRun out;
  out.run.reason = isolate::EndReason::Exited;
  out.run.exit_code = 0;
  json j = json::parse(finish_run(p, "local", out, std::chrono::milliseconds(1), nullptr));
  const json& rec = j["result"]["record"];
  EXPECT_EQ(rec["env_overridden"], json({"HOME", "LANG"}));
  // The policy capped the request's 180 s: both are in the record.
  EXPECT_EQ(rec["timeout_requested_s"], 180);
  EXPECT_DOUBLE_EQ(rec["timeout_applied_s"].get<double>(), 60.0);
}

// Letta's SandboxConfig.fingerprint() hashes the config's own organization,
// which need not be the request's; without one, the request's is used.
TEST_F(Pipeline, FingerprintUsesTheConfigsOwnOrganization) {
  const json cfg = {{"pip_requirements", json::array()}, {"sandbox_dir", "/root/.letta/tool_execution_dir"},
                    {"use_venv", false}, {"venv_name", "venv"}};
  auto with_org = request(execute({{"sandbox_config", {{"type", "local"}, {"config", cfg},
                                                       {"organization_id", "org-00000000-0000-4000-8000-000000000000"}}}}));
  PreparedRun p;
  ASSERT_FALSE(prepare_run(with_org, Peer{}, set_, backends(false), "", p));
  // docs/PROTOCOL.md section 13.3's worked example (the request's own
  // organization is "org-1").
  EXPECT_EQ(p.fingerprint, "48408990033679363701484527775310645901996820373321982248109825766489622234136");
  auto without = request(execute({{"sandbox_config", {{"type", "local"}, {"config", cfg}}}}));
  PreparedRun q;
  ASSERT_FALSE(prepare_run(without, Peer{}, set_, backends(false), "", q));
  EXPECT_EQ(q.fingerprint, *letta::sandbox_config_fingerprint("local", "org-1", cfg));
  EXPECT_NE(q.fingerprint, p.fingerprint);
  // A config whose organization is None (sent as null) is hashed with null,
  // as Letta's; not with the request's.
  auto none = request(execute({{"sandbox_config", {{"type", "local"}, {"config", cfg}, {"organization_id", nullptr}}}}));
  PreparedRun n;
  ASSERT_FALSE(prepare_run(none, Peer{}, set_, backends(false), "", n));
  EXPECT_EQ(n.fingerprint, *letta::sandbox_config_fingerprint("local", std::nullopt, cfg));
  EXPECT_NE(n.fingerprint, q.fingerprint);
}

// A run delegated to E2B is described by the request's "e2b" alternative
// (Letta's E2B sandbox reads the organization's E2B config and its
// variables); a local run ignores it; members left out keep the top level.
TEST_F(Pipeline, E2BRunsUseTheE2BAlternative) {
  const json local_cfg = {{"sandbox_dir", "/d"}, {"use_venv", false}};
  const json e2b_cfg = {{"pip_requirements", {"pkg"}}, {"timeout", 300}};
  json extra = {{"sandbox_config", {{"type", "local"}, {"config", local_cfg}}},
                {"env", {{"API_KEY", "local"}}},
                {"e2b", {{"sandbox_config", {{"type", "e2b"}, {"config", e2b_cfg}, {"organization_id", "org-9"}}},
                         {"env", {{"API_KEY", "e2b"}}}}}};
  // Without E2B configured, an organization that is not privileged runs locally.
  auto local = request(execute(extra));
  PreparedRun l;
  ASSERT_FALSE(prepare_run(local, Peer{}, set_, backends(false), "", l));
  EXPECT_EQ(l.placement.backend, Backend::Local);
  EXPECT_EQ(l.fingerprint, *letta::sandbox_config_fingerprint("local", "org-1", local_cfg));
  EXPECT_EQ(l.sandbox_config->type, "local");
  EXPECT_EQ(l.env.at("API_KEY"), "local");

  extra["policy"] = "remote";
  auto remote = request(execute(extra));
  PreparedRun r;
  ASSERT_FALSE(prepare_run(remote, Peer{}, set_, backends(true), "", r));
  EXPECT_EQ(r.placement.backend, Backend::E2B);
  EXPECT_EQ(r.fingerprint, *letta::sandbox_config_fingerprint("e2b", "org-9", e2b_cfg));
  EXPECT_EQ(r.shape.fingerprint, r.fingerprint);
  EXPECT_EQ(r.sandbox_config->type, "e2b");
  EXPECT_EQ(r.env.at("API_KEY"), "e2b");

  // Only env given: the top-level sandbox_config describes the E2B run.
  extra["e2b"] = {{"env", {{"API_KEY", "e2b"}}}};
  auto env_only = request(execute(extra));
  PreparedRun e;
  ASSERT_FALSE(prepare_run(env_only, Peer{}, set_, backends(true), "", e));
  EXPECT_EQ(e.fingerprint, l.fingerprint);
  EXPECT_EQ(e.env.at("API_KEY"), "e2b");
  // Only sandbox_config given: the top-level env.
  extra["e2b"] = {{"sandbox_config", {{"type", "e2b"}, {"config", e2b_cfg}}}};
  auto config_only = request(execute(extra));
  PreparedRun c;
  ASSERT_FALSE(prepare_run(config_only, Peer{}, set_, backends(true), "", c));
  EXPECT_EQ(c.fingerprint, *letta::sandbox_config_fingerprint("e2b", "org-1", e2b_cfg));
  EXPECT_EQ(c.env.at("API_KEY"), "local");

  // The alternative's environment goes through the policy like any other.
  extra["e2b"] = {{"env", {{"NOT_ALLOWED", "x"}}}};
  auto denied = request(execute(extra));
  PreparedRun d;
  auto refusal = prepare_run(denied, Peer{}, set_, backends(true), "", d);
  ASSERT_TRUE(refusal);
  EXPECT_EQ(refusal->code, ErrorCode::PolicyDenied);
  // ... but a local run never looks at it.
  extra.erase("policy");
  auto ignored = request(execute(extra));
  PreparedRun i;
  EXPECT_FALSE(prepare_run(ignored, Peer{}, set_, backends(false), "", i));
  EXPECT_EQ(i.placement.backend, Backend::Local);
}

TEST_F(Pipeline, RecordSaysNoTimeoutWasRequested) {
  auto req = request(execute());
  PreparedRun p;
  ASSERT_FALSE(prepare_run(req, Peer{}, set_, backends(false), "", p));
  BackendRun out;
  out.run.reason = isolate::EndReason::Exited;
  json j = json::parse(finish_run(p, "local", out, std::chrono::milliseconds(1), nullptr));
  const json& rec = j["result"]["record"];
  EXPECT_TRUE(rec["timeout_requested_s"].is_null());
  EXPECT_DOUBLE_EQ(rec["timeout_applied_s"].get<double>(), 60.0);
  EXPECT_FALSE(rec.contains("env_overridden"));
}

TEST_F(Pipeline, RefusalsComeBeforeAnyBackend) {
  struct Case {
    json req;
    ErrorCode code;
    const char* says;
  };
  const Case cases[] = {
      {execute({{"env", {{"NOT_ALLOWED", "x"}}}}), ErrorCode::PolicyDenied, "NOT_ALLOWED"},
      {execute({{"policy", "ghost"}}), ErrorCode::PolicyDenied, "ghost"},
      {run_tool(), ErrorCode::Internal, "runner is not installed"},  // no runner path given
  };
  for (const auto& c : cases) {
    auto req = request(c.req);
    PreparedRun p;
    auto refused = prepare_run(req, Peer{}, set_, backends(false), "", p);
    ASSERT_TRUE(refused) << c.req.dump();
    EXPECT_EQ(refused->code, c.code) << c.req.dump();
    EXPECT_NE(refused->message.find(c.says), std::string::npos) << refused->message;
  }
}

// A local runner answers on its result channel, which the backend builds:
// no nonce, no request text. An E2B cell's runner gets a fresh nonce and
// the request that carries it.
TEST_F(Pipeline, ToolModeUsesTheChannelLocallyAndAFreshNonceOnE2B) {
  auto req = request(run_tool());
  PreparedRun l;
  ASSERT_FALSE(prepare_run(req, Peer{}, set_, backends(false), "/runner.py", l));
  EXPECT_TRUE(l.tool_mode);
  EXPECT_TRUE(l.shape.channel);
  EXPECT_EQ(l.shape.result_cap, l.policy().result_bytes);  // limits.result, not stdout's cap
  EXPECT_GT(l.policy().result_bytes, l.policy().limits.stdout_bytes);
  EXPECT_TRUE(l.shape.nonce.empty());
  EXPECT_TRUE(l.runner_request.empty());
  EXPECT_EQ(l.runner_path, "/runner.py");

  auto remote = request(run_tool({{"policy", "remote"}}));
  PreparedRun a, b;
  ASSERT_FALSE(prepare_run(remote, Peer{}, set_, backends(true), "/runner.py", a));
  ASSERT_FALSE(prepare_run(remote, Peer{}, set_, backends(true), "/runner.py", b));
  EXPECT_EQ(a.placement.backend, Backend::E2B);
  EXPECT_FALSE(a.shape.channel);
  EXPECT_EQ(a.shape.nonce.size(), 32u);
  EXPECT_NE(a.shape.nonce, b.shape.nonce);
  EXPECT_NE(a.runner_request.find(a.shape.nonce), std::string::npos);
}

TEST_F(Pipeline, StartUpVariablesGoToTheToolNotTheRunner) {
  for (const char* n : {"LD_PRELOAD", "LD_AUDIT", "LD_LIBRARY_PATH", "MALLOC_ARENA_MAX", "GLIBC_TUNABLES", "PYTHONPATH",
                        "PYTHONSTARTUP", "GCONV_PATH", "LOCPATH", "NLSPATH", "TZDIR", "RES_OPTIONS"})
    EXPECT_TRUE(changes_how_a_program_starts(n)) << n;
  for (const char* n : {"PATH", "HOME", "TMPDIR", "API_KEY", "LD", "XLD_PRELOAD", "MALLOC", "PYTHO", "TZ"})
    EXPECT_FALSE(changes_how_a_program_starts(n)) << n;
  allow_env({"*"});
  auto req = request(run_tool({{"env", {{"LD_PRELOAD", "/x.so"}, {"PYTHONPATH", "/p"}, {"API_KEY", "k"}}}}));
  PreparedRun p;
  auto refused = prepare_run(req, Peer{}, set_, backends(false), "/runner.py", p);
  ASSERT_FALSE(refused) << refused->message;
  EXPECT_EQ(p.env.count("LD_PRELOAD"), 0u);
  EXPECT_EQ(p.env.at("API_KEY"), "k");
  EXPECT_EQ(p.runner_env, (std::map<std::string, std::string>{{"LD_PRELOAD", "/x.so"}, {"PYTHONPATH", "/p"}}));
  for (const auto& e : p.sandbox_env) EXPECT_FALSE(e.starts_with("LD_PRELOAD=") || e.starts_with("PYTHONPATH=")) << e;
  // Locally they travel in the channel's second part (the backend builds
  // it from runner_env); on E2B in the runner's request.
  EXPECT_TRUE(p.runner_request.empty());
  auto remote = request(run_tool({{"policy", "remote"}, {"env", {{"LD_PRELOAD", "/x.so"}, {"PYTHONPATH", "/p"}}}}));
  PreparedRun cell;
  ASSERT_FALSE(prepare_run(remote, Peer{}, set_, backends(true), "/runner.py", cell));
  EXPECT_NE(cell.runner_request.find(R"("env":{"LD_PRELOAD":"/x.so","PYTHONPATH":"/p"})"), std::string::npos)
      << cell.runner_request;
  // A name the policy does not allow is refused, start-up variable or not.
  allow_env({"API_KEY"});
  PreparedRun q;
  EXPECT_TRUE(prepare_run(req, Peer{}, set_, backends(false), "/runner.py", q));
  // Script mode: Letta's script is the program; the variables stay where it starts.
  auto ex = request(execute({{"env", {{"API_KEY", "k"}}}}));
  PreparedRun e;
  ASSERT_FALSE(prepare_run(ex, Peer{}, set_, backends(false), "", e));
  EXPECT_TRUE(e.runner_env.empty());
}

TEST_F(Pipeline, PlacementNamesTheBackend) {
  auto req = request(execute({{"policy", "remote"}}));
  PreparedRun p;
  ASSERT_FALSE(prepare_run(req, Peer{}, set_, backends(true), "", p));
  EXPECT_EQ(p.placement.backend, Backend::E2B);
  EXPECT_EQ(p.policy().name, "remote");
}

TEST_F(Pipeline, FinishShapesRecordsAndKeepsBackendFields) {
  auto req = request(execute());
  PreparedRun p;
  ASSERT_FALSE(prepare_run(req, Peer{}, set_, backends(false), "", p));
  BackendRun out;
  out.run.run_id = "abc";
  out.run.reason = isolate::EndReason::Exited;
  out.run.exit_code = 0;
  out.run.stdout_data = "hello\n";
  out.run.stdout_total_bytes = 6;
  out.record["sandbox_id"] = "sb-1";
  std::string ended;
  const std::string line = finish_run(p, "local", out, std::chrono::milliseconds(5), &ended);
  EXPECT_EQ(ended, "exited");
  json j = json::parse(line);
  ASSERT_TRUE(j["ok"].get<bool>()) << line;
  const json& r = j["result"];
  EXPECT_EQ(r["status"], "success");
  EXPECT_EQ(r["stdout"], json::array({"hello\n"}));
  EXPECT_EQ(r["record"]["run_id"], "abc");
  EXPECT_EQ(r["record"]["backend"], "local");
  EXPECT_EQ(r["record"]["policy"], "default");
  EXPECT_EQ(r["record"]["sandbox_id"], "sb-1");
}

// A script's own frame may hold JSON written with line breaks between its
// tokens (json.dumps(..., indent=2)); its exact text goes into the response
// without them, so the response stays one line and nothing the tool wrote
// can pass for another response.
TEST_F(Pipeline, ExactValuesNeverBreakTheResponseLine) {
  for (const char* dialect : {"python", "strict"}) {
    SCOPED_TRACE(dialect);
    auto req = request(execute({{"json_dialect", dialect}}));
    PreparedRun p;
    ASSERT_FALSE(prepare_run(req, Peer{}, set_, backends(false), "", p));
    p.shape.generation = letta::ScriptGeneration::kLegacy;
    const std::string payload =
        "{\n  \"results\": [1,\n{\"v\":1,\"id\":\"next\",\"ok\":true,\"s\":\"a b\\n\"}\r\n, NaN],\n"
        "  \"agent_state\": null\n}";
    BackendRun out;
    out.run.reason = isolate::EndReason::Exited;
    out.run.exit_code = 0;
    out.run.stdout_data = std::string(letta::kLegacyStartMarker) + letta::b64encode(payload) +
                          std::string(letta::kLegacyEndMarker);
    out.run.stdout_total_bytes = out.run.stdout_data.size();
    const std::string line = finish_run(p, "local", out, std::chrono::milliseconds(1), nullptr);
    ASSERT_FALSE(line.empty());
    EXPECT_EQ(line.find_first_of("\r\n"), line.size() - 1) << line;
    if (std::string_view(dialect) == "python") {
      EXPECT_NE(line.find(R"("func_return":[1,{"v":1,"id":"next","ok":true,"s":"a b\n"},NaN])"), std::string::npos) << line;
      continue;
    }
    json j = json::parse(line);
    const json& fr = j["result"]["func_return"];
    ASSERT_TRUE(fr.is_array()) << line;
    EXPECT_EQ(fr[1]["s"], "a b\n");  // inside strings nothing changes
    EXPECT_EQ(fr[2], "NaN");
  }
}

// A backend reports a failure as facts; finish_run shapes it as Letta's
// manager reports the exception, with the backend's end reason.
TEST_F(Pipeline, FinishShapesTheBackendsFailureWithItsEndReason) {
  auto req = request(execute());
  PreparedRun p;
  ASSERT_FALSE(prepare_run(req, Peer{}, set_, backends(false), "", p));
  BackendRun out;
  out.run.reason = isolate::EndReason::Exited;
  out.run.stdout_data = "partial";
  out.run.stderr_data = "pip: \xff failed";
  out.failure = RunFailure{"SandboxException", "the sandbox went away"};
  out.end_reason = "backend_error";
  std::string ended;
  json j = json::parse(finish_run(p, "e2b", out, {}, &ended));
  EXPECT_EQ(ended, "backend_error");
  const json& r = j["result"];
  EXPECT_EQ(r["status"], "error");
  EXPECT_EQ(r["func_return"], letta::friendly_error_msg("t", "SandboxException", "the sandbox went away"));
  EXPECT_EQ(r["stdout"], json({"partial"}));
  // Not UTF-8: replaced, never passed on raw; the exception last.
  EXPECT_EQ(r["stderr"], json({"pip: \uFFFD failed", "SandboxException: the sandbox went away"}));
  EXPECT_EQ(r["record"]["end_reason"], "backend_error");
  EXPECT_EQ(r["record"]["backend"], "e2b");
}

// An E2B kernel's execution: the result from the main result's payload,
// the framing in the record.
TEST_F(Pipeline, FinishShapesAnE2BCell) {
  auto req = request(execute());
  PreparedRun p;
  ASSERT_FALSE(prepare_run(req, Peer{}, set_, backends(false), "", p));
  BackendRun out;
  out.run.reason = isolate::EndReason::Exited;
  CellOutcome& cell = out.cell.emplace();
  cell.main_result = letta::b64encode(R"({"results": 5, "agent_state": null})");
  cell.out = {"hello\n"};
  json j = json::parse(finish_run(p, "e2b", out, {}, nullptr));
  const json& r = j["result"];
  EXPECT_EQ(r["status"], "success");
  EXPECT_EQ(r["func_return"], 5);
  EXPECT_EQ(r["stdout"], json({"hello\n"}));
  EXPECT_EQ(r["record"]["framing"], "e2b-result");

  BackendRun raised;
  raised.run.reason = isolate::EndReason::Exited;
  raised.cell.emplace().error = CellOutcome::Raised{"ValueError", "bad", "Traceback: ..."};
  j = json::parse(finish_run(p, "e2b", raised, {}, nullptr));
  EXPECT_EQ(j["result"]["status"], "error");
  EXPECT_EQ(j["result"]["func_return"], letta::friendly_error_msg("t", "ValueError", "bad"));
  EXPECT_EQ(j["result"]["stderr"], json({"Traceback: ..."}));
}

TEST(CancelSignal, HooksRunOnceAndLateHooksRunAtOnce) {
  CancelSignal s;
  int a = 0, b = 0;
  {
    CancelHook h(s, [&] { ++a; });
    s.request();
    s.request();
  }
  EXPECT_EQ(a, 1);
  CancelHook late(s, [&] { ++b; });
  EXPECT_EQ(b, 1);
}

TEST(CancelSignal, AHookRemovedByAnEarlierOneDoesNotRun) {
  CancelSignal s;
  int second = 0;
  int id2 = -1;
  s.add_hook([&] { s.remove_hook(id2); });
  id2 = s.add_hook([&] { ++second; });
  s.request();
  EXPECT_EQ(second, 0);
}

}  // namespace
}  // namespace tsb::core

namespace tsb::core {
namespace {

// Requirements are gathered from the sandbox config and the tool, made
// canonical and checked once, against the placed backend's rules.
TEST_F(Pipeline, RequirementsAreCheckedOnceAgainstTheBackendsRules) {
  json cfg = {{"pip_requirements", json::array({{{"name", "Requests"}, {"version", "2.31"}}})}};
  auto req = request(run_tool({{"pip_requirements", {"Requests>=2", "numpy"}},
                               {"sandbox_config", {{"type", "local"}, {"config", cfg}}}}));
  local_.rules = RequirementRules{};
  local_.rules.max = 3;  // counted as given: three
  PreparedRun p;
  auto first = prepare_run(req, Peer{}, set_, backends(false), "/runner.py", p);
  ASSERT_FALSE(first) << first->message;
  ASSERT_EQ(p.requirements.items.size(), 2u);  // requests twice is one requirement
  EXPECT_EQ(p.requirements.text(), "numpy\nrequests==2.31,>=2\n");

  local_.rules.max = 2;
  PreparedRun over;
  auto refused = prepare_run(req, Peer{}, set_, backends(false), "/runner.py", over);
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->code, ErrorCode::BadRequest);
  EXPECT_NE(refused->message.find("at most 2 pip requirements per run (3 given)"), std::string::npos) << refused->message;

  local_.rules = RequirementRules{};
  local_.rules.refusal = "policy \"default\" installs no packages";
  PreparedRun none;
  refused = prepare_run(req, Peer{}, set_, backends(false), "/runner.py", none);
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->code, ErrorCode::PolicyDenied);
  EXPECT_EQ(refused->message,
            "policy \"default\" installs no packages, and this run asks for 3 pip requirement(s), the first \"Requests==2.31\"");

  local_.rules = RequirementRules{};
  local_.rules.allow = {"numpy"};
  PreparedRun not_allowed;
  refused = prepare_run(req, Peer{}, set_, backends(false), "/runner.py", not_allowed);
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->code, ErrorCode::PolicyDenied);
  EXPECT_NE(refused->message.find("\"requests\" is not allowed"), std::string::npos) << refused->message;
}

TEST_F(Pipeline, RequirementUrlsFollowTheBackendsRules) {
  auto req = request(run_tool({{"pip_requirements", {"pkg @ https://example.com/pkg.whl"}}, {"policy", "remote"}}));
  e2b_.rules = RequirementRules{};
  e2b_.rules.urls_hint = "e2b.allow_requirement_urls is off";
  PreparedRun p;
  auto refused = prepare_run(req, Peer{}, set_, backends(true), "/runner.py", p);
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->code, ErrorCode::PolicyDenied);
  EXPECT_NE(refused->message.find("(e2b.allow_requirement_urls is off)"), std::string::npos) << refused->message;
  e2b_.rules.allow_urls = true;
  PreparedRun q;
  ASSERT_FALSE(prepare_run(req, Peer{}, set_, backends(true), "/runner.py", q));
  EXPECT_EQ(q.requirements.text(), "pkg @ https://example.com/pkg.whl\n");
}

// A TypeScript tool: the backend's rules decide whether it runs, and its
// npm requirements are canonical and checked once; a Python tool has none.
TEST_F(Pipeline, TypeScriptRunsFollowTheBackendsRules) {
  const json ts_tool = {{"source_type", "typescript"},
                        {"source_code", "export function add(a: number, b: number) { return a + b; }"},
                        {"npm_requirements", {"left-pad@^1.3.0", "@types/node", "left-pad@^1.3.0"}}};
  auto req = request(run_tool(ts_tool));
  local_.ts = TypeScriptRules{};
  local_.ts.refusal = "policy \"default\" runs no TypeScript tools";
  PreparedRun refused_run;
  auto refused = prepare_run(req, Peer{}, set_, backends(false), "/runner.py", refused_run);
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->code, ErrorCode::PolicyDenied);
  EXPECT_EQ(refused->message, "policy \"default\" runs no TypeScript tools");

  local_.ts = TypeScriptRules{};
  PreparedRun p;
  auto ok = prepare_run(req, Peer{}, set_, backends(false), "/runner.py", p);
  ASSERT_FALSE(ok) << ok->message;
  EXPECT_TRUE(p.typescript);
  EXPECT_EQ(venv::npm_set_text(p.npm_requirements), "@types/node\nleft-pad@^1.3.0\n");

  local_.ts.allow = {"@types/*"};
  PreparedRun not_allowed;
  refused = prepare_run(req, Peer{}, set_, backends(false), "/runner.py", not_allowed);
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->code, ErrorCode::PolicyDenied);
  EXPECT_NE(refused->message.find("\"left-pad\" is not allowed"), std::string::npos) << refused->message;

  local_.ts = TypeScriptRules{};
  local_.ts.npm_refusal = "policy \"default\" installs no npm packages";
  PreparedRun no_npm;
  refused = prepare_run(req, Peer{}, set_, backends(false), "/runner.py", no_npm);
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->code, ErrorCode::PolicyDenied);
  EXPECT_NE(refused->message.find("installs no npm packages, and this run asks for 3 npm requirement(s)"),
            std::string::npos) << refused->message;

  // A git URL is a source the policy never names: refused, not malformed.
  local_.ts = TypeScriptRules{};
  json git = ts_tool;
  git["npm_requirements"] = {"github:user/repo"};
  auto git_req = request(run_tool(git));
  PreparedRun g;
  refused = prepare_run(git_req, Peer{}, set_, backends(false), "/runner.py", g);
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->code, ErrorCode::PolicyDenied);

  // pip requirements only where the backend installs them with a TypeScript tool.
  json with_pip = ts_tool;
  with_pip["pip_requirements"] = {"requests"};
  auto pip_req = request(run_tool(with_pip));
  PreparedRun pip_local;
  refused = prepare_run(pip_req, Peer{}, set_, backends(false), "/runner.py", pip_local);
  ASSERT_TRUE(refused);
  EXPECT_NE(refused->message.find("has no Python venv"), std::string::npos) << refused->message;
  local_.ts.pip = true;
  PreparedRun pip_ok;
  EXPECT_FALSE(prepare_run(pip_req, Peer{}, set_, backends(false), "/runner.py", pip_ok));

  // A Python tool has no npm requirements.
  auto py = request(run_tool({{"npm_requirements", {"left-pad"}}}));
  PreparedRun pp;
  refused = prepare_run(py, Peer{}, set_, backends(false), "/runner.py", pp);
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->code, ErrorCode::BadRequest);
}

// A backend that is not there refuses the run before anything else.
TEST_F(Pipeline, ARunOnABackendThatIsNotThereIsRefused) {
  auto req = request(execute({{"policy", "remote"}}));
  PreparedRun p;
  auto refused = prepare_run(req, Peer{}, set_, Backends{&local_, nullptr, true}, "", p);
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->code, ErrorCode::Unavailable);
}

}  // namespace
}  // namespace tsb::core
