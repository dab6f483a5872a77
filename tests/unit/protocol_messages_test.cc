// protocol/messages: decoding of request lines (every strictness rule) and the
// response envelopes. protocol/PROTOCOL.md is the reference these tests hold
// the code to; tests/unit/schema_test.cc holds the JSON Schemas to the code.
#include "protocol/messages.h"
#include "protocol/json_limits.h"

#include <gtest/gtest.h>

#include <csignal>
#include <nlohmann/json.hpp>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <optional>
#include <random>
#include <string>
#include <variant>
#include <vector>

namespace tsb::protocol {
namespace {

using json = nlohmann::json;

// ---------------------------------------------------------------------------
// Decoding shorthands
// ---------------------------------------------------------------------------

struct Decoded {
  std::optional<Request> req;
  std::optional<ProtocolError> err;
  std::string id;  // what decode_request reported through id_out
};

Decoded decode(std::string_view line) {
  Decoded d;
  auto r = decode_request(line, &d.id);
  if (auto* e = std::get_if<ProtocolError>(&r)) d.err = *e;
  else d.req = std::get<Request>(std::move(r));
  return d;
}

Decoded decode(const std::string& line) { return decode(std::string_view(line)); }
Decoded decode(const json& j) { return decode(j.dump()); }

json minimal_execute() {
  return {{"v", 1}, {"id", "r1"}, {"type", "execute"}, {"tool_name", "add"}, {"organization_id", "org-1"},
          {"script", "print(1)"}};
}
json minimal_run_tool() {
  return {{"v", 1},           {"id", "r2"},          {"type", "run_tool"},
          {"tool_name", "add"}, {"organization_id", "org-1"}, {"source_code", "def add(a, b):\n    return a + b\n"}};
}
json minimal_status() { return {{"v", 1}, {"id", "r3"}, {"type", "status"}}; }

// The request is refused with bad_request and a message containing `needle`.
#define EXPECT_BAD_REQUEST(line_or_json, needle)                                        \
  do {                                                                                  \
    Decoded d_ = decode(line_or_json);                                                  \
    ASSERT_TRUE(d_.err.has_value()) << "accepted: " << (needle);                        \
    EXPECT_EQ(d_.err->code, ErrorCode::BadRequest);                                     \
    EXPECT_NE(d_.err->message.find(needle), std::string::npos) << d_.err->message;      \
  } while (0)

// ---------------------------------------------------------------------------
// Valid requests
// ---------------------------------------------------------------------------

TEST(DecodeRequest, MinimalStatus) {
  Decoded d = decode(minimal_status());
  ASSERT_TRUE(d.req) << d.err->message;
  EXPECT_EQ(d.req->id, "r3");
  EXPECT_EQ(d.id, "r3");
  EXPECT_EQ(d.req->type_name(), "status");
  EXPECT_TRUE(std::holds_alternative<StatusRequest>(d.req->body));
}

TEST(DecodeRequest, MinimalExecute) {
  Decoded d = decode(minimal_execute());
  ASSERT_TRUE(d.req) << d.err->message;
  EXPECT_EQ(d.req->type_name(), "execute");
  const auto& e = std::get<ExecuteRequest>(d.req->body);
  EXPECT_EQ(e.script, "print(1)");
  EXPECT_EQ(e.common.tool_name, "add");
  EXPECT_EQ(e.common.organization_id, "org-1");
  EXPECT_FALSE(e.common.policy);
  EXPECT_TRUE(e.common.env.empty());
  EXPECT_FALSE(e.common.timeout_s);
  EXPECT_FALSE(e.common.sandbox_config);
  EXPECT_FALSE(e.common.agent_id);
  EXPECT_FALSE(e.common.project_id);
}

TEST(DecodeRequest, FullExecute) {
  json j = minimal_execute();
  j["policy"] = "privileged";
  j["env"] = {{"API_KEY", "s3cr3t"}, {"EMPTY", ""}};
  j["timeout"] = 12.5;
  j["sandbox_config"] = {{"type", "local"}, {"config", {{"use_venv", false}, {"venv_name", "venv"}}}};
  j["agent_id"] = "agent-1";
  j["project_id"] = "project-1";
  Decoded d = decode(j);
  ASSERT_TRUE(d.req) << d.err->message;
  const auto& c = std::get<ExecuteRequest>(d.req->body).common;
  EXPECT_EQ(c.policy, "privileged");
  EXPECT_EQ(c.env.size(), 2u);
  EXPECT_EQ(c.env.at("API_KEY"), "s3cr3t");
  EXPECT_EQ(c.env.at("EMPTY"), "");
  ASSERT_TRUE(c.timeout_s);
  EXPECT_DOUBLE_EQ(*c.timeout_s, 12.5);
  ASSERT_TRUE(c.sandbox_config);
  EXPECT_EQ(c.sandbox_config->type, "local");
  EXPECT_EQ(c.sandbox_config->config, (json{{"use_venv", false}, {"venv_name", "venv"}}));
  EXPECT_EQ(c.agent_id, "agent-1");
  EXPECT_EQ(c.project_id, "project-1");
}

TEST(DecodeRequest, MinimalRunToolDefaults) {
  Decoded d = decode(minimal_run_tool());
  ASSERT_TRUE(d.req) << d.err->message;
  EXPECT_EQ(d.req->type_name(), "run_tool");
  const auto& r = std::get<RunToolRequest>(d.req->body);
  EXPECT_EQ(r.source_code, "def add(a, b):\n    return a + b\n");
  EXPECT_EQ(r.args, "{}");  // absent args mean {}
  EXPECT_EQ(r.json_schema, "null");
  EXPECT_EQ(r.agent_state, "null");
  EXPECT_TRUE(r.pip_requirements.empty());
}

TEST(DecodeRequest, FullRunTool) {
  json j = minimal_run_tool();
  j["args"] = {{"a", 2}, {"b", {{"nested", json::array({1, "two", nullptr})}}}};
  j["json_schema"] = {{"name", "add"}, {"parameters", {{"properties", {{"a", {{"type", "integer"}}}}}}}};
  j["agent_state"] = {{"id", "agent-1"}, {"memory", json::object()}};
  j["pip_requirements"] = json::array({"requests==2.32.3", "numpy"});
  j["env"] = {{"K", "v"}};
  j["timeout"] = 30;
  j["agent_id"] = "agent-1";
  j["sandbox_config"] = {{"type", "e2b"}, {"config", {{"timeout", 300}}}};
  Decoded d = decode(j);
  ASSERT_TRUE(d.req) << d.err->message;
  const auto& r = std::get<RunToolRequest>(d.req->body);
  // Kept as the text the client sent.
  EXPECT_EQ(r.args, j["args"].dump());
  EXPECT_EQ(r.json_schema, j["json_schema"].dump());
  EXPECT_EQ(r.agent_state, j["agent_state"].dump());
  EXPECT_EQ(r.pip_requirements, (std::vector<std::string>{"requests==2.32.3", "numpy"}));
  EXPECT_EQ(r.common.env.at("K"), "v");
  EXPECT_DOUBLE_EQ(*r.common.timeout_s, 30.0);
  EXPECT_EQ(r.common.sandbox_config->type, "e2b");
}

TEST(DecodeRequest, NullOptionalFieldsMeanAbsent) {
  json e = minimal_execute();
  for (const char* k : {"policy", "env", "timeout", "sandbox_config", "agent_id", "project_id"}) e[k] = nullptr;
  Decoded d = decode(e);
  ASSERT_TRUE(d.req) << d.err->message;
  const auto& c = std::get<ExecuteRequest>(d.req->body).common;
  EXPECT_FALSE(c.policy);
  EXPECT_FALSE(c.timeout_s);
  EXPECT_FALSE(c.sandbox_config);
  EXPECT_FALSE(c.agent_id);

  json r = minimal_run_tool();
  for (const char* k : {"args", "json_schema", "agent_state", "pip_requirements"}) r[k] = nullptr;
  Decoded d2 = decode(r);
  ASSERT_TRUE(d2.req) << d2.err->message;
  EXPECT_EQ(std::get<RunToolRequest>(d2.req->body).args, "{}");
  EXPECT_EQ(std::get<RunToolRequest>(d2.req->body).json_schema, "null");
  EXPECT_EQ(std::get<RunToolRequest>(d2.req->body).agent_state, "null");
}

TEST(DecodeRequest, FieldOrderDoesNotMatter) {
  Decoded d = decode(std::string_view(R"({"script":"x","organization_id":"o","tool_name":"t","type":"execute","id":"i","v":1})"));
  ASSERT_TRUE(d.req) << d.err->message;
  EXPECT_EQ(d.req->id, "i");
}

TEST(DecodeRequest, SurroundingJsonWhitespaceIsAccepted) {
  // The server strips the "\n" and one "\r"; anything else must be JSON whitespace.
  Decoded d = decode(std::string_view(" \t{\"v\":1,\"id\":\"a\",\"type\":\"status\"} \r"));
  ASSERT_TRUE(d.req) << d.err->message;
}

TEST(DecodeRequest, NonAsciiStringsSurvive) {
  json j = minimal_execute();
  j["script"] = "print(\"h\u00e9llo \u2603 \U0001F600\")";
  j["env"] = {{"GREETING", "gr\u00fc\u00df dich"}};
  j["id"] = "\u00e9t\u00e9";
  Decoded d = decode(j);
  ASSERT_TRUE(d.req) << d.err->message;
  EXPECT_EQ(std::get<ExecuteRequest>(d.req->body).script, j["script"].get<std::string>());
  EXPECT_EQ(d.req->id, "\u00e9t\u00e9");
}

TEST(DecodeRequest, EmptyIdIsRefused) {
  // An empty id could not be told apart from "no id" in error responses.
  json j = minimal_status();
  j["id"] = "";
  Decoded d = decode(j);
  ASSERT_TRUE(d.err);
  EXPECT_EQ(d.err->code, ErrorCode::BadRequest);
  EXPECT_NE(d.err->message.find("must not be empty"), std::string::npos) << d.err->message;
}

// ---------------------------------------------------------------------------
// Envelope: id, v, type
// ---------------------------------------------------------------------------

TEST(DecodeRequest, MissingId) {
  json j = minimal_status();
  j.erase("id");
  Decoded d = decode(j);
  ASSERT_TRUE(d.err);
  EXPECT_EQ(d.err->code, ErrorCode::BadRequest);
  EXPECT_NE(d.err->message.find("missing field \"id\""), std::string::npos);
  EXPECT_EQ(d.id, "");
}

TEST(DecodeRequest, IdLengthLimit) {
  json j = minimal_status();
  j["id"] = std::string(kMaxIdLength, 'x');
  EXPECT_TRUE(decode(j).req);
  j["id"] = std::string(kMaxIdLength + 1, 'x');
  Decoded d = decode(j);
  ASSERT_TRUE(d.err);
  EXPECT_EQ(d.err->code, ErrorCode::BadRequest);
  EXPECT_NE(d.err->message.find("\"id\" is longer than 128 bytes"), std::string::npos);
  EXPECT_EQ(d.id, "");  // a refused id is not echoed
  // The limit is in bytes: 64 two-byte characters fit, 65 do not.
  std::string e2;
  for (int i = 0; i < 64; ++i) e2 += "\u00e9";
  j["id"] = e2;
  EXPECT_TRUE(decode(j).req);
  j["id"] = e2 + "\u00e9";
  EXPECT_TRUE(decode(j).err);
}

TEST(DecodeRequest, IdMustBeAString) {
  for (json bad : {json(7), json(true), json::array({"a"}), json::object(), json(nullptr)}) {
    json j = minimal_status();
    j["id"] = bad;
    Decoded d = decode(j);
    ASSERT_TRUE(d.err) << bad.dump();
    EXPECT_EQ(d.err->code, ErrorCode::BadRequest);
    EXPECT_EQ(d.id, "");
  }
}

TEST(DecodeRequest, VersionRules) {
  json j = minimal_status();
  j.erase("v");
  EXPECT_BAD_REQUEST(j, "missing field \"v\"");
  j["v"] = 2;
  EXPECT_BAD_REQUEST(j, "unsupported protocol version 2");
  j["v"] = 0;
  EXPECT_BAD_REQUEST(j, "unsupported protocol version 0");
  // Only the JSON integer 1: not a string, a float, a negative number, a boolean or null.
  for (json bad : {json("1"), json(1.0), json(-1), json(true), json(nullptr), json::array({1})}) {
    j["v"] = bad;
    EXPECT_BAD_REQUEST(j, "\"v\"");
  }
  EXPECT_BAD_REQUEST(std::string_view(R"({"v":1.0,"id":"a","type":"status"})"), "\"v\"");
  EXPECT_BAD_REQUEST(std::string_view(R"({"v":1e0,"id":"a","type":"status"})"), "\"v\"");
}

TEST(DecodeRequest, TypeRules) {
  json j = minimal_status();
  j.erase("type");
  EXPECT_BAD_REQUEST(j, "missing field \"type\"");
  j["type"] = "exec";
  EXPECT_BAD_REQUEST(j, "unknown request type \"exec\"");
  j["type"] = "Status";  // case-sensitive
  EXPECT_BAD_REQUEST(j, "unknown request type");
  j["type"] = "";
  EXPECT_BAD_REQUEST(j, "unknown request type");
  j["type"] = 1;
  EXPECT_BAD_REQUEST(j, "field \"type\" must be a string");
  j["type"] = std::string(33, 'a');
  EXPECT_BAD_REQUEST(j, "\"type\" is longer than 32 bytes");
}

TEST(DecodeRequest, IdIsReportedWhenItCouldBeRead) {
  // Errors found after the id was read carry it back.
  json j = minimal_execute();
  j["v"] = 2;
  EXPECT_EQ(decode(j).id, "r1");
  j = minimal_execute();
  j["type"] = "nope";
  EXPECT_EQ(decode(j).id, "r1");
  j = minimal_execute();
  j["extra"] = 1;
  EXPECT_EQ(decode(j).id, "r1");
  j = minimal_execute();
  j["env"] = {{"A", 1}};
  EXPECT_EQ(decode(j).id, "r1");
  j = minimal_execute();
  j.erase("v");
  EXPECT_EQ(decode(j).id, "r1");
  // Not when the line is not a JSON object, has duplicate keys, or the id itself is bad.
  EXPECT_EQ(decode(std::string_view(R"({"v":1,"id":"r1","type":"status")")).id, "");
  EXPECT_EQ(decode(std::string_view(R"({"v":1,"id":"r1","id":"r2","type":"status"})")).id, "");
  EXPECT_EQ(decode(std::string_view(R"(["v",1,"id","r1"])")).id, "");
  j = minimal_execute();
  j["id"] = 5;
  EXPECT_EQ(decode(j).id, "");
}

// ---------------------------------------------------------------------------
// Unknown fields
// ---------------------------------------------------------------------------

TEST(DecodeRequest, UnknownTopLevelFieldIsRefused) {
  for (json base : {minimal_execute(), minimal_run_tool(), minimal_status()}) {
    json j = base;
    j["timout"] = 5;
    EXPECT_BAD_REQUEST(j, "unknown field \"timout\"");
    j = base;
    j["Tool_Name"] = "x";  // names are case-sensitive
    EXPECT_BAD_REQUEST(j, "unknown field \"Tool_Name\"");
    j = base;
    j["unknown"] = nullptr;  // a null value does not make an unknown field acceptable
    EXPECT_BAD_REQUEST(j, "unknown field \"unknown\"");
  }
}

TEST(DecodeRequest, FieldsOfAnotherTypeAreUnknown) {
  json e = minimal_execute();
  e["source_code"] = "def f(): pass";
  EXPECT_BAD_REQUEST(e, "unknown field \"source_code\"");
  e = minimal_execute();
  e["args"] = json::object();
  EXPECT_BAD_REQUEST(e, "unknown field \"args\"");
  e = minimal_execute();
  e["agent_state"] = json::object();
  EXPECT_BAD_REQUEST(e, "unknown field \"agent_state\"");
  e = minimal_execute();
  e["pip_requirements"] = json::array();
  EXPECT_BAD_REQUEST(e, "unknown field \"pip_requirements\"");

  json r = minimal_run_tool();
  r["script"] = "print(1)";
  EXPECT_BAD_REQUEST(r, "unknown field \"script\"");

  for (const char* k : {"tool_name", "organization_id", "script", "env", "timeout", "policy"}) {
    json s = minimal_status();
    s[k] = "x";
    EXPECT_BAD_REQUEST(s, std::string("unknown field \"") + k + "\"");
  }
}

TEST(DecodeRequest, UnknownFieldInsideSandboxConfigIsRefused) {
  json j = minimal_execute();
  j["sandbox_config"] = {{"type", "local"}, {"config", json::object()}, {"id", "sandbox-1"}};
  EXPECT_BAD_REQUEST(j, "request.sandbox_config: unknown field \"id\"");
  EXPECT_EQ(decode(j).id, "r1");
}

TEST(DecodeRequest, UnknownFieldNameIsCutInTheMessage) {
  json j = minimal_status();
  j[std::string(5000, 'k')] = 1;
  Decoded d = decode(j);
  ASSERT_TRUE(d.err);
  EXPECT_LT(d.err->message.size(), 200u);
}

TEST(DecodeRequest, ContentOfFreeFormObjectsIsNotChecked) {
  // args, json_schema, agent_state and sandbox_config.config are opaque JSON.
  json j = minimal_run_tool();
  j["args"] = {{"anything", {{"deep", {{"er", json::array({1.5, nullptr, true})}}}}}};
  j["json_schema"] = {{"whatever", 1}};
  j["agent_state"] = {{"x", json::object()}};
  j["sandbox_config"] = {{"type", "local"}, {"config", {{"unknown_key", 1}}}};
  EXPECT_TRUE(decode(j).req);
}

// ---------------------------------------------------------------------------
// Required fields and types
// ---------------------------------------------------------------------------

TEST(DecodeRequest, RequiredFields) {
  for (const char* k : {"tool_name", "organization_id", "script"}) {
    json j = minimal_execute();
    j.erase(k);
    EXPECT_BAD_REQUEST(j, std::string("missing field \"") + k + "\"");
    j = minimal_execute();
    j[k] = nullptr;  // null is not a value for a required field
    EXPECT_BAD_REQUEST(j, std::string("field \"") + k + "\" must be a string");
  }
  for (const char* k : {"tool_name", "organization_id", "source_code"}) {
    json j = minimal_run_tool();
    j.erase(k);
    EXPECT_BAD_REQUEST(j, std::string("missing field \"") + k + "\"");
  }
}

struct TypeCase {
  const char* type;  // "execute" or "run_tool"
  const char* field;
  json value;
  const char* needle;
};

TEST(DecodeRequest, WrongTypeForEachField) {
  const std::vector<TypeCase> cases = {
      {"execute", "tool_name", 1, "field \"tool_name\" must be a string"},
      {"execute", "organization_id", json::object(), "field \"organization_id\" must be a string"},
      {"execute", "policy", 3, "field \"policy\" must be a string"},
      {"execute", "env", json::array({"A=1"}), "field \"env\" must be an object"},
      {"execute", "env", "A=1", "field \"env\" must be an object"},
      {"execute", "timeout", "5", "field \"timeout\" must be a number"},
      {"execute", "timeout", true, "field \"timeout\" must be a number"},
      {"execute", "sandbox_config", "local", "field \"sandbox_config\" must be an object"},
      {"execute", "agent_id", 42, "field \"agent_id\" must be a string"},
      {"execute", "project_id", json::array(), "field \"project_id\" must be a string"},
      {"execute", "script", json::array({"print(1)"}), "field \"script\" must be a string"},
      {"run_tool", "source_code", 5, "field \"source_code\" must be a string"},
      {"run_tool", "args", json::array({1, 2}), "field \"args\" must be an object"},
      {"run_tool", "args", "a=1", "field \"args\" must be an object"},
      {"run_tool", "json_schema", json::array(), "field \"json_schema\" must be an object"},
      {"run_tool", "json_schema", "{}", "field \"json_schema\" must be an object"},
      {"run_tool", "agent_state", "{}", "field \"agent_state\" must be an object"},
      {"run_tool", "pip_requirements", "requests", "field \"pip_requirements\" must be an array"},
      {"run_tool", "pip_requirements", json::object(), "field \"pip_requirements\" must be an array"},
      {"run_tool", "timeout", json::array({1}), "field \"timeout\" must be a number"},
  };
  for (const auto& c : cases) {
    json j = std::string(c.type) == "execute" ? minimal_execute() : minimal_run_tool();
    j[c.field] = c.value;
    SCOPED_TRACE(std::string(c.type) + "." + c.field + " = " + c.value.dump());
    EXPECT_BAD_REQUEST(j, c.needle);
    EXPECT_EQ(decode(j).id, j["id"].get<std::string>());
  }
}

// "e2b": what a run delegated to E2B uses instead; its members follow the
// rules of the top-level fields of the same names.
TEST(DecodeRequest, E2BAlternative) {
  json j = minimal_run_tool();
  j["e2b"] = {{"sandbox_config", {{"type", "e2b"}, {"config", {{"pip_requirements", {"pkg"}}}}, {"organization_id", "org-2"}}},
              {"env", {{"K", "e2b"}}}};
  Decoded d = decode(j);
  ASSERT_TRUE(d.req) << d.err->message;
  const auto& c = std::get<RunToolRequest>(d.req->body).common;
  ASSERT_TRUE(c.e2b);
  ASSERT_TRUE(c.e2b->sandbox_config);
  EXPECT_EQ(c.e2b->sandbox_config->type, "e2b");
  EXPECT_EQ(c.e2b->sandbox_config->organization_id, "org-2");
  ASSERT_TRUE(c.e2b->env);
  EXPECT_EQ(c.e2b->env->at("K"), "e2b");
  EXPECT_FALSE(c.sandbox_config);
  EXPECT_TRUE(c.env.empty());

  // Members left out or null: unset, so the top-level fields apply.
  j["e2b"] = {{"sandbox_config", nullptr}};
  d = decode(j);
  ASSERT_TRUE(d.req) << d.err->message;
  const auto& c2 = std::get<RunToolRequest>(d.req->body).common;
  ASSERT_TRUE(c2.e2b);
  EXPECT_FALSE(c2.e2b->sandbox_config);
  EXPECT_FALSE(c2.e2b->env);
  // An empty env is a value: no variables at all on E2B.
  j["e2b"] = {{"env", json::object()}};
  d = decode(j);
  ASSERT_TRUE(d.req) << d.err->message;
  EXPECT_TRUE(std::get<RunToolRequest>(d.req->body).common.e2b->env.value().empty());

  j["e2b"] = json::array();
  EXPECT_BAD_REQUEST(j, "request: field \"e2b\" must be an object");
  j["e2b"] = {{"policy", "x"}};
  EXPECT_BAD_REQUEST(j, "request.e2b: unknown field \"policy\"");
  j["e2b"] = {{"sandbox_config", {{"type", "e2b"}}}};
  EXPECT_BAD_REQUEST(j, "request.e2b.sandbox_config: missing field \"config\"");
  j["e2b"] = {{"sandbox_config", {{"type", "e2b"}, {"config", {{"n", "BIG"}}}}}};
  std::string line = j.dump();
  line.replace(line.find("\"BIG\""), 5, "123456789012345678901234567890");
  EXPECT_BAD_REQUEST(line, "request.e2b.sandbox_config: a number in \"config\" is out of range");
  j["e2b"] = {{"env", {{"K", 1}}}};
  EXPECT_BAD_REQUEST(j, "request.e2b: env values must be strings");
  j["e2b"] = {{"env", {{"1K", "v"}}}};
  EXPECT_BAD_REQUEST(j, "request.e2b: env names must match");
}

TEST(DecodeRequest, SandboxConfigShape) {
  json j = minimal_execute();
  j["sandbox_config"] = {{"config", json::object()}};
  EXPECT_BAD_REQUEST(j, "request.sandbox_config: missing field \"type\"");
  j["sandbox_config"] = {{"type", "local"}};
  EXPECT_BAD_REQUEST(j, "request.sandbox_config: missing field \"config\"");
  j["sandbox_config"] = {{"type", 1}, {"config", json::object()}};
  EXPECT_BAD_REQUEST(j, "request.sandbox_config: field \"type\" must be a string");
  j["sandbox_config"] = {{"type", "local"}, {"config", json::array()}};
  EXPECT_BAD_REQUEST(j, "request.sandbox_config: field \"config\" must be an object");
  j["sandbox_config"] = {{"type", "local"}, {"config", nullptr}};
  EXPECT_BAD_REQUEST(j, "request.sandbox_config: field \"config\" must be an object");
  j["sandbox_config"] = {{"type", std::string(65, 't')}, {"config", json::object()}};
  EXPECT_BAD_REQUEST(j, "\"type\" is longer than 64 bytes");
  j["sandbox_config"] = {{"type", std::string(64, 't')}, {"config", json::object()}};
  EXPECT_TRUE(decode(j).req);
}

TEST(DecodeRequest, EnvValuesMustBeStrings) {
  for (json bad : {json(1), json(true), json(nullptr), json::array({"x"}), json::object({{"a", "b"}})}) {
    json j = minimal_execute();
    j["env"] = {{"GOOD", "ok"}, {"BAD", bad}};
    SCOPED_TRACE(bad.dump());
    EXPECT_BAD_REQUEST(j, "env values must be strings (\"BAD\")");
  }
}

TEST(DecodeRequest, EnvNamesMustBeVariableNames) {
  // Malformed names and NUL in values are malformed requests; whether a
  // well-formed name is allowed is the policy's call (policy_denied).
  json j = minimal_execute();
  for (const char* bad : {"A=B", "", "1X", "A B", "\u00e9"}) {
    j["env"] = {{bad, "x"}};
    EXPECT_BAD_REQUEST(j, "env names must match");
  }
  j["env"] = {{"OK", std::string("a\0b", 3)}};
  EXPECT_BAD_REQUEST(j, "must not contain NUL");
  j["env"] = {{"PATH", "/x"}, {"_private", "y"}, {"K9", "z"}};
  EXPECT_TRUE(decode(j).req);
}

TEST(DecodeRequest, PipRequirementsMustBeStrings) {
  json j = minimal_run_tool();
  j["pip_requirements"] = json::array({"requests", 1});
  EXPECT_BAD_REQUEST(j, "pip_requirements must be strings");
  j["pip_requirements"] = json::array({"requests", nullptr});
  EXPECT_BAD_REQUEST(j, "pip_requirements must be strings");
  j["pip_requirements"] = json::array();
  EXPECT_TRUE(decode(j).req);
}

// Letta's TypeScript tools: source_type and npm_requirements in both modes;
// a TypeScript run_tool takes no agent_state.
TEST(DecodeRequest, SourceTypeAndNpmRequirements) {
  for (json j : {minimal_execute(), minimal_run_tool()}) {
    Decoded plain = decode(j);
    ASSERT_TRUE(plain.req);
    const auto& pc = std::visit([](const auto& b) -> const CommonRunFields* {
      if constexpr (requires { b.common; }) return &b.common;
      else return nullptr;
    }, plain.req->body);
    EXPECT_EQ(pc->source_type, SourceType::Python);
    j["source_type"] = "typescript";
    j["npm_requirements"] = json::array({"left-pad@^1.3.0", "@letta-ai/letta-client"});
    Decoded d = decode(j);
    ASSERT_TRUE(d.req) << d.err->message;
    const CommonRunFields* c = std::visit([](const auto& b) -> const CommonRunFields* {
      if constexpr (requires { b.common; }) return &b.common;
      else return nullptr;
    }, d.req->body);
    ASSERT_TRUE(c);
    EXPECT_EQ(c->source_type, SourceType::TypeScript);
    EXPECT_EQ(c->npm_requirements, (std::vector<std::string>{"left-pad@^1.3.0", "@letta-ai/letta-client"}));
    j["source_type"] = "javascript";
    EXPECT_BAD_REQUEST(j, "\"source_type\" must be \"python\" or \"typescript\"");
    j["source_type"] = "typescript";
    j["npm_requirements"] = json::array({"left-pad", 7});
    EXPECT_BAD_REQUEST(j, "npm_requirements must be strings");
    j["npm_requirements"] = json::array();
    for (int i = 0; i <= 1024; ++i) j["npm_requirements"].push_back("p");
    EXPECT_BAD_REQUEST(j, "npm_requirements holds more than 1024 requirements");
  }
  json t = minimal_run_tool();
  t["source_type"] = "typescript";
  t["agent_state"] = json::object();
  EXPECT_BAD_REQUEST(t, "a TypeScript tool takes no \"agent_state\"");
  t["agent_state"] = nullptr;
  EXPECT_TRUE(decode(t).req);
}

TEST(DecodeRequest, TimeoutRange) {
  auto with = [](std::string_view timeout_literal) {
    return decode(std::string(R"({"v":1,"id":"t","type":"execute","tool_name":"f","organization_id":"o","script":"","timeout":)") +
                  std::string(timeout_literal) + "}");
  };
  for (const char* ok : {"1", "0.001", "1e-9", "60", "180.0", "86400", "86400.0", "8.64e4"}) {
    Decoded d = with(ok);
    ASSERT_TRUE(d.req) << ok << ": " << d.err->message;
  }
  EXPECT_DOUBLE_EQ(*std::get<ExecuteRequest>(with("2.5").req->body).common.timeout_s, 2.5);
  for (const char* bad : {"0", "0.0", "-0.0", "-1", "-0.5", "86400.001", "86401", "1e9", "1e308", "18446744073709551616"}) {
    Decoded d = with(bad);
    ASSERT_TRUE(d.err) << bad;
    EXPECT_EQ(d.err->code, ErrorCode::BadRequest);
    EXPECT_NE(d.err->message.find("\"timeout\" must be seconds in (0, 86400]"), std::string::npos) << bad;
    EXPECT_EQ(d.id, "t");
  }
}

TEST(DecodeRequest, StringLengthLimits) {
  struct L {
    const char* field;
    std::size_t max;
  };
  for (L l : {L{"tool_name", 256}, L{"organization_id", 256}, L{"policy", 128}, L{"agent_id", 256}, L{"project_id", 256}}) {
    SCOPED_TRACE(l.field);
    json j = minimal_execute();
    std::string at = std::string(l.field) == "tool_name" ? "t" + std::string(l.max - 1, 'x') : std::string(l.max, 'x');
    j[l.field] = at;
    EXPECT_TRUE(decode(j).req);
    j[l.field] = at + "x";
    EXPECT_BAD_REQUEST(j, "is longer than " + std::to_string(l.max) + " bytes");
  }
  // script and source_code have no limit of their own (only the frame's).
  json e = minimal_execute();
  e["script"] = std::string(1 << 20, '#');
  EXPECT_TRUE(decode(e).req);
}

TEST(DecodeRequest, ToolNameMustBeAnIdentifier) {
  for (const char* ok : {"f", "_", "_private", "add2", "Tool_Name_9", "__init__"}) {
    json j = minimal_execute();
    j["tool_name"] = ok;
    EXPECT_TRUE(decode(j).req) << ok;
  }
  for (std::string bad : {std::string(""), std::string("1abc"), std::string("a-b"), std::string("a b"), std::string("a.b"),
                          std::string("f()"), std::string("\u00e9t\u00e9"), std::string("tab\t"), std::string("x\ny"),
                          std::string("a\0b", 3)}) {
    json j = minimal_run_tool();
    j["tool_name"] = bad;
    SCOPED_TRACE(json(bad).dump());
    EXPECT_BAD_REQUEST(j, "\"tool_name\" must be a Python identifier");
  }
}

TEST(IsPythonIdentifier, AsciiRules) {
  EXPECT_TRUE(is_python_identifier("a"));
  EXPECT_TRUE(is_python_identifier("_9"));
  EXPECT_TRUE(is_python_identifier(std::string(256, 'a')));
  EXPECT_FALSE(is_python_identifier(std::string(257, 'a')));
  EXPECT_FALSE(is_python_identifier(""));
  EXPECT_FALSE(is_python_identifier("9a"));
  EXPECT_FALSE(is_python_identifier("a$"));
  EXPECT_FALSE(is_python_identifier("\xc3\xa9"));
}

// ---------------------------------------------------------------------------
// JSON-level rules
// ---------------------------------------------------------------------------

TEST(DecodeRequest, DuplicateKeysAreRefusedAtEveryLevel) {
  const char* lines[] = {
      R"({"v":1,"id":"a","type":"status","v":1})",
      R"({"v":1,"id":"a","id":"a","type":"status"})",
      R"({"v":1,"id":"a","type":"execute","tool_name":"f","organization_id":"o","script":"","policy":"default","policy":"privileged"})",
      R"({"v":1,"id":"a","type":"execute","tool_name":"f","organization_id":"o","script":"","env":{"K":"1","K":"2"}})",
      R"({"v":1,"id":"a","type":"run_tool","tool_name":"f","organization_id":"o","source_code":"","args":{"x":{"y":1,"y":2}}})",
      R"({"v":1,"id":"a","type":"run_tool","tool_name":"f","organization_id":"o","source_code":"","agent_state":{"m":[{"k":1,"k":1}]}})",
      R"({"v":1,"id":"a","type":"execute","tool_name":"f","organization_id":"o","script":"","sandbox_config":{"type":"local","type":"e2b","config":{}}})",
  };
  for (const char* l : lines) {
    SCOPED_TRACE(l);
    EXPECT_BAD_REQUEST(std::string_view(l), "duplicate keys");
  }
  // The same key in sibling objects is not a duplicate.
  EXPECT_TRUE(decode(std::string_view(
                         R"({"v":1,"id":"a","type":"run_tool","tool_name":"f","organization_id":"o","source_code":"","args":{"x":{"k":1},"y":{"k":2}},"agent_state":{"k":[{"k":1},{"k":2}]}})"))
                  .req);
}

TEST(DecodeRequest, InvalidUtf8IsRefused) {
  const std::string prefix = R"({"v":1,"id":"a","type":"execute","tool_name":"f","organization_id":"o","script":")";
  for (std::string bad : {std::string("\xff"), std::string("\xc3"), std::string("\xc0\xaf"),  // truncated, overlong
                          std::string("\xed\xa0\x80"),                                        // UTF-8-encoded surrogate
                          std::string("\xf4\x90\x80\x80"),                                    // above U+10FFFF
                          std::string("\\ud800"), std::string("\\udc00x")}) {             // lone surrogate escapes
    SCOPED_TRACE(::testing::PrintToString(bad));
    EXPECT_BAD_REQUEST(prefix + bad + "\"}", "invalid JSON or UTF-8");
  }
  // Invalid UTF-8 in a key, too.
  EXPECT_BAD_REQUEST(std::string("{\"v\":1,\"id\":\"a\",\"type\":\"status\",\"\xff\":1}"), "invalid JSON or UTF-8");
  // A valid surrogate pair is fine.
  EXPECT_TRUE(decode(prefix + "\\ud83d\\ude00\"}").req);
}

TEST(DecodeRequest, NonObjectJsonIsRefused) {
  for (const char* l : {"[]", R"(["v",1])", "\"status\"", "1", "null", "true"}) {
    Decoded d = decode(std::string_view(l));
    ASSERT_TRUE(d.err) << l;
    EXPECT_EQ(d.err->code, ErrorCode::BadRequest);
    EXPECT_NE(d.err->message.find("must be a JSON object"), std::string::npos) << d.err->message;
    EXPECT_EQ(d.id, "");
  }
}

TEST(DecodeRequest, InvalidJsonIsRefused) {
  for (const char* l : {"", " ", "{", "{\"v\":1,", "{'v':1}", "{\"v\":1,\"id\":\"a\",\"type\":\"status\",}",
                        "{\"v\":01,\"id\":\"a\",\"type\":\"status\"}", "{\"v\":NaN}", "{\"v\":Infinity}",
                        "{\"v\":1,\"id\":\"a\nb\",\"type\":\"status\"}"}) {
    SCOPED_TRACE(l);
    EXPECT_BAD_REQUEST(std::string_view(l), "not a JSON object (invalid JSON or UTF-8)");
  }
}

TEST(DecodeRequest, TrailingGarbageIsRefused) {
  for (const char* l : {R"({"v":1,"id":"a","type":"status"} x)", R"({"v":1,"id":"a","type":"status"}})",
                        R"({"v":1,"id":"a","type":"status"}{"v":1,"id":"b","type":"status"})",
                        R"({"v":1,"id":"a","type":"status"},)", R"({"v":1,"id":"a","type":"status"} 1)"}) {
    SCOPED_TRACE(l);
    Decoded d = decode(std::string_view(l));
    ASSERT_TRUE(d.err);
    EXPECT_EQ(d.err->code, ErrorCode::BadRequest);
    EXPECT_EQ(d.id, "");
  }
}

TEST(DecodeRequest, StrictGrammarEverywhereInTheLine) {
  // Inside the free-form values too: they are forwarded as text, so the
  // decoder is what guarantees they are JSON.
  const std::string head = R"({"v":1,"id":"a","type":"run_tool","tool_name":"f","organization_id":"o","source_code":"",)";
  for (std::string bad : {std::string(R"("args":{"a":[1,]}})"), std::string(R"("args":{"a":01}})"),
                          std::string(R"("args":{"a":NaN}})"), std::string(R"("args":{"a":"\x"}})"),
                          std::string(R"("args":{"a":"\ud800"}})"), std::string("\"args\":{\"a\":\"\xc0\xaf\"}}"),
                          std::string("\"args\":{\"a\":\"\t\"}}"), std::string(R"("args":{"a":1}/**/})"),
                          std::string(R"("agent_state":{"a":tru}})"), std::string(R"("json_schema":{'a':1}})")}) {
    SCOPED_TRACE(bad);
    EXPECT_BAD_REQUEST(head + bad, "not a JSON object (invalid JSON or UTF-8)");
  }
  // The message says what and where.
  Decoded d = decode(std::string_view(R"({"v":1,"id":"a","type":"status",})"));
  ASSERT_TRUE(d.err);
  EXPECT_NE(d.err->message.find("expected a string key at byte 32"), std::string::npos) << d.err->message;
}

TEST(DecodeRequest, DuplicateKeysInAnySpellingAreRefused) {
  const std::string head = R"({"v":1,"id":"a","type":"run_tool","tool_name":"f","organization_id":"o","source_code":"",)";
  for (std::string dup : {std::string(R"("args":{"a":1,"\u0061":2}})"),
                          std::string(R"("args":{"x":[{"k":{"\u006b":1,"k":2}}]}})"),
                          std::string(R"("\u0061rgs":{},"args":{}})"),
                          std::string(R"("agent_state":{"m":{"\u00e9":1,"\u00E9":2}}})")}) {
    SCOPED_TRACE(dup);
    Decoded d = decode(head + dup);
    ASSERT_TRUE(d.err);
    EXPECT_NE(d.err->message.find("duplicate keys"), std::string::npos) << d.err->message;
    EXPECT_EQ(d.id, "");
  }
  EXPECT_BAD_REQUEST(std::string_view(R"({"v":1,"\u0069d":"a","id":"b","type":"status"})"), "duplicate keys");
}

TEST(DecodeRequest, EscapedFieldNamesAreTheFields) {
  Decoded d = decode(std::string_view(R"({"\u0076":1,"i\u0064":"a\u0062","t\u0079pe":"status"})"));
  ASSERT_TRUE(d.req) << d.err->message;
  EXPECT_EQ(d.req->id, "ab");
  EXPECT_BAD_REQUEST(std::string_view(R"({"v":1,"id":"a","type":"status","\u0074imout":1})"), "unknown field \"timout\"");
}

TEST(DecodeRequest, ByteOrderMarkBeforeTheObjectIsSkipped) {
  // RFC 8259 section 8.1 lets a parser ignore one; nlohmann::json did.
  EXPECT_TRUE(decode(std::string("\xef\xbb\xbf") + minimal_status().dump()).req);
  EXPECT_BAD_REQUEST(std::string(" \xef\xbb\xbf") + minimal_status().dump(), "invalid JSON");
}

TEST(DecodeRequest, VersionIsNeverConverted) {
  auto with_v = [](const std::string& v) { return R"({"v":)" + v + R"(,"id":"a","type":"status"})"; };
  EXPECT_TRUE(decode(with_v("1")).req);
  for (const char* big : {"18446744073709551616", "18446744073709551617", "99999999999999999999999999999999999999999"}) {
    SCOPED_TRACE(big);
    Decoded d = decode(with_v(big));
    ASSERT_TRUE(d.err);
    EXPECT_EQ(d.err->code, ErrorCode::BadRequest);
    EXPECT_NE(d.err->message.find("unsupported protocol version"), std::string::npos) << d.err->message;
    EXPECT_NE(d.err->message.find(std::string(big).substr(0, 20)), std::string::npos) << d.err->message;
    EXPECT_LT(d.err->message.size(), 100u);
    EXPECT_EQ(d.id, "a");
  }
  // 1 + 2^64 must not wrap around to 1, nor 1.0000000000000000001 round to it.
  for (const char* not_one : {"18446744073709551617", "1.0000000000000000001", "1e400", "1e-400", "-0", "1E0", "10e-1"}) {
    SCOPED_TRACE(not_one);
    EXPECT_TRUE(decode(with_v(not_one)).err);
  }
  EXPECT_BAD_REQUEST(with_v("1e400"), "field \"v\" must be the integer 1");
  EXPECT_BAD_REQUEST(with_v("-18446744073709551617"), "field \"v\" must be the integer 1");
}

TEST(DecodeRequest, TimeoutOutOfRangeIsRefusedNeverRounded) {
  auto with = [](const std::string& t) {
    return decode(std::string(R"({"v":1,"id":"t","type":"execute","tool_name":"f","organization_id":"o","script":"","timeout":)") + t + "}");
  };
  for (std::string bad : {std::string("1e400"), std::string("-1e400"), std::string("1e-400"), std::string("18446744073709551616"),
                          "1" + std::string(300, '0'), std::string("0.") + std::string(400, '0') + "1"}) {
    SCOPED_TRACE(bad.substr(0, 40));
    Decoded d = with(bad);
    ASSERT_TRUE(d.err);
    EXPECT_EQ(d.err->code, ErrorCode::BadRequest);
    EXPECT_NE(d.err->message.find("\"timeout\" must be seconds in (0, 86400]"), std::string::npos) << d.err->message;
    EXPECT_EQ(d.id, "t");
  }
  Decoded ok = with("1E+2");
  ASSERT_TRUE(ok.req) << ok.err->message;
  EXPECT_DOUBLE_EQ(*std::get<ExecuteRequest>(ok.req->body).common.timeout_s, 100.0);
}

TEST(DecodeRequest, ForwardedValuesKeepTheirText) {
  const std::string big = "-" + std::string(300, '9');
  const std::string args = "{ \"n\" : " + big + " ,\"z\":-0,\"h\":1e400,\"e\":1E+2,\"s\":\"\\u00e9\\/\"}";
  json j = minimal_run_tool();
  std::string line = j.dump();
  line.pop_back();
  line += ",\"args\":" + args + ",\"agent_state\":{\"c\":" + big + "},\"json_schema\":{\"m\":" + big + "}}";
  Decoded d = decode(line);
  ASSERT_TRUE(d.req) << d.err->message;
  const auto& r = std::get<RunToolRequest>(d.req->body);
  EXPECT_EQ(r.args, args);
  EXPECT_EQ(r.agent_state, "{\"c\":" + big + "}");
  EXPECT_EQ(r.json_schema, "{\"m\":" + big + "}");
}

TEST(DecodeRequest, SandboxConfigNumbersMustBeRepresentable) {
  // The fingerprint is computed from the config as a document; a number it
  // would have to round is refused instead.
  auto with = [](const std::string& config) {
    return std::string(R"({"v":1,"id":"s","type":"execute","tool_name":"f","organization_id":"o","script":"","sandbox_config":{"type":"local","config":)") +
           config + "}}";
  };
  EXPECT_TRUE(decode(with(R"({"timeout":300,"big":18446744073709551615,"neg":-9223372036854775808,"f":1.5,"t":1e-400})")).req);
  for (const char* bad : {R"({"x":18446744073709551616})", R"({"x":[-9223372036854775809]})", R"({"x":1e400})",
                          R"({"x":{"y":123456789012345678901234567890}})"}) {
    SCOPED_TRACE(bad);
    Decoded d = decode(with(bad));
    ASSERT_TRUE(d.err);
    EXPECT_NE(d.err->message.find("request.sandbox_config: a number in \"config\" is out of range"), std::string::npos)
        << d.err->message;
    EXPECT_EQ(d.id, "s");
  }
}

TEST(DecodeRequest, ContainersTheDecoderBuildsAreBounded) {
  json e = minimal_execute();
  json env = json::object();
  for (std::size_t i = 0; i < kMaxEnvVariables; ++i) env["V" + std::to_string(i)] = "";
  e["env"] = env;
  EXPECT_TRUE(decode(e).req);
  e["env"]["ONE_MORE"] = "";
  EXPECT_BAD_REQUEST(e, "env holds more than 4096 variables");

  json r = minimal_run_tool();
  r["pip_requirements"] = json::array();
  for (std::size_t i = 0; i < kMaxPipRequirements; ++i) r["pip_requirements"].push_back("p");
  EXPECT_TRUE(decode(r).req);
  r["pip_requirements"].push_back("p");
  EXPECT_BAD_REQUEST(r, "pip_requirements holds more than 1024 requirements");

  json s = minimal_execute();
  s["sandbox_config"] = {{"type", "local"}, {"config", {{"pad", std::string(kMaxSandboxConfigBytes - 64, 'x')}}}};
  EXPECT_TRUE(decode(s).req);
  s["sandbox_config"]["config"]["pad"] = std::string(kMaxSandboxConfigBytes, 'x');
  EXPECT_BAD_REQUEST(s, "field \"sandbox_config\" is larger than 1048576 bytes");
}

TEST(DecodeRequest, MillionsOfUnknownFieldsCostNothing) {
  std::string line = R"({"v":1,"id":"u","type":"status")";
  for (int i = 0; i < 300000; ++i) line += ",\"x" + std::to_string(i) + "\":0";
  line += "}";
  Decoded d = decode(line);
  ASSERT_TRUE(d.err);
  EXPECT_NE(d.err->message.find("unknown field \"x0\""), std::string::npos) << d.err->message;
  EXPECT_EQ(d.id, "u");
}

TEST(DecodeRequest, GarbageNeverCrashes) {
  // Random mutations of valid requests and random bytes: refused or
  // accepted, never a crash (a fuzz target explores this further).
  std::mt19937 rng(99);
  const std::string seeds[] = {minimal_execute().dump(), minimal_run_tool().dump(), minimal_status().dump(),
                               R"({"v":1,"id":"a","type":"run_tool","tool_name":"f","organization_id":"o","source_code":"",)"
                               R"("args":{"a":[1,{"b":"\u00e9"}]},"env":{"A":"b"},"pip_requirements":["x"],)"
                               R"("sandbox_config":{"type":"e2b","config":{"k":[1.5e3]}},"timeout":2,"agent_state":{}})"};
  static const char kBytes[] = "{}[],:\"\\ -.e0123456789tfnu\x01\xc3\xa9\xff";
  int accepted = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string s = seeds[rng() % 4];
    for (int k = 1 + static_cast<int>(rng() % 4); k > 0; --k) {
      std::size_t at = rng() % (s.size() + 1);
      switch (rng() % 3) {
        case 0: if (at < s.size()) s[at] = kBytes[rng() % (sizeof kBytes - 1)]; break;
        case 1: s.insert(s.begin() + static_cast<long>(at), kBytes[rng() % (sizeof kBytes - 1)]); break;
        default: if (at < s.size()) s.erase(at, 1 + rng() % 4); break;
      }
    }
    std::vector<char> buf(s.begin(), s.end());
    std::string id;
    if (std::holds_alternative<Request>(decode_request(std::string_view(buf.data(), buf.size()), &id))) ++accepted;
  }
  EXPECT_GT(accepted, 0);
}

// A NUL byte is refused wherever it is (nlohmann's lexer used to take one
// for the end of the input and ignore whatever followed).
TEST(DecodeRequest, BytesAfterANulAreRefused) {
  const std::string obj = R"({"v":1,"id":"a","type":"status"})";
  EXPECT_TRUE(decode(obj + std::string(1, '\0')).err);
  EXPECT_TRUE(decode(obj + std::string(1, '\0') + "garbage \xff{").err);
}

TEST(DecodeRequest, FirstErrorIsReported) {
  // Several problems: the message names one of them, the code is bad_request.
  json j = minimal_execute();
  j["env"] = {{"A", 1}};
  j["timeout"] = -1;
  j["bogus"] = 1;
  Decoded d = decode(j);
  ASSERT_TRUE(d.err);
  EXPECT_EQ(d.err->code, ErrorCode::BadRequest);
  EXPECT_FALSE(d.err->message.empty());
}

TEST(DecodeRequest, DecodingWithoutIdOutput) {
  EXPECT_TRUE(std::holds_alternative<Request>(decode_request(minimal_status().dump(), nullptr)));
  EXPECT_TRUE(std::holds_alternative<ProtocolError>(decode_request("{}", nullptr)));
}

// A request with ~100000 levels of nesting inside args (a line of a few
// hundred kilobytes, far below the frame limit) must not overflow the stack
// while it is decoded. Run in a child process so that a failure cannot take
// the test binary down.
TEST(DecodeRequestDeathTest, DeepNestingDoesNotCrash) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const int depth = 200000;
  std::string nest = std::string(depth, '[') + std::string(depth, ']');
  std::string line = R"({"v":1,"id":"deep","type":"run_tool","tool_name":"f","organization_id":"o","source_code":"","args":{"a":)" +
                     nest + "}}";
  EXPECT_EXIT(
      {
        std::string id;
        auto r = decode_request(line, &id);
        (void)r;  // refused or accepted, both are fine: only a crash is not
        std::exit(0);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST(DecodeRequest, NestingIsBoundedAt512Levels) {
  // The request object is level 1 and args level 2.
  auto line = [](int inner, const std::string& tail = "") {
    return R"({"v":1,"id":"deep","type":"run_tool","tool_name":"f","organization_id":"o","source_code":"","args":{"a":)" +
           std::string(inner, '[') + std::string(inner, ']') + tail + "}}";
  };
  EXPECT_TRUE(decode(line(kMaxJsonNesting - 2)).req);
  EXPECT_BAD_REQUEST(line(kMaxJsonNesting - 1), "JSON nested deeper than 512 levels");
  EXPECT_BAD_REQUEST(line(200000), "JSON nested deeper than 512 levels");
  // Too deep and malformed: called too deep, as before.
  EXPECT_BAD_REQUEST(std::string("{\"v\":1,,") + std::string(600, '[') , "JSON nested deeper than 512 levels");
}

// ---------------------------------------------------------------------------
// Response envelopes
// ---------------------------------------------------------------------------

TEST(ErrorCodeName, EveryCodeHasItsStableName) {
  EXPECT_EQ(error_code_name(ErrorCode::BadRequest), "bad_request");
  EXPECT_EQ(error_code_name(ErrorCode::TooLarge), "too_large");
  EXPECT_EQ(error_code_name(ErrorCode::Unauthorized), "unauthorized");
  EXPECT_EQ(error_code_name(ErrorCode::Busy), "busy");
  EXPECT_EQ(error_code_name(ErrorCode::PolicyDenied), "policy_denied");
  EXPECT_EQ(error_code_name(ErrorCode::Timeout), "timeout");
  EXPECT_EQ(error_code_name(ErrorCode::Unavailable), "unavailable");
  EXPECT_EQ(error_code_name(ErrorCode::Internal), "internal");
}

json parse_line(const std::string& line) {
  EXPECT_FALSE(line.empty());
  EXPECT_EQ(line.back(), '\n');
  // Exactly one line: the only newline is the terminator.
  EXPECT_EQ(line.find('\n'), line.size() - 1) << line;
  return json::parse(line);
}

TEST(EncodeError, Shape) {
  json j = parse_line(encode_error("req-7", ErrorCode::Busy, "too many runs"));
  EXPECT_EQ(j, (json{{"v", 1}, {"id", "req-7"}, {"ok", false}, {"error", {{"code", "busy"}, {"message", "too many runs"}}}}));
}

TEST(EncodeError, EmptyIdBecomesNull) {
  json j = parse_line(encode_error("", ErrorCode::Timeout, "no request"));
  ASSERT_TRUE(j.contains("id"));
  EXPECT_TRUE(j["id"].is_null());
  EXPECT_EQ(j["error"]["code"], "timeout");
}

TEST(EncodeError, EveryCode) {
  for (ErrorCode c : {ErrorCode::BadRequest, ErrorCode::TooLarge, ErrorCode::Unauthorized, ErrorCode::Busy,
                      ErrorCode::PolicyDenied, ErrorCode::Timeout, ErrorCode::Unavailable, ErrorCode::Internal}) {
    json j = parse_line(encode_error("x", c, "m"));
    EXPECT_EQ(j["error"]["code"], std::string(error_code_name(c)));
    EXPECT_EQ(j["ok"], false);
    EXPECT_EQ(j["v"], 1);
  }
}

TEST(EncodeError, MessagesStayOneLineAndValidUtf8) {
  std::string msg = "line one\nline two\r\t\"quoted\" \\ \x01 \xff\xfe end";
  json j = parse_line(encode_error("id\n2", ErrorCode::BadRequest, msg));
  std::string m = j["error"]["message"];
  EXPECT_NE(m.find("line one\nline two"), std::string::npos);
  EXPECT_NE(m.find("\xEF\xBF\xBD"), std::string::npos);  // invalid bytes became U+FFFD
  EXPECT_EQ(j["id"], "id\n2");
}

TEST(EncodeOk, ResultAndStatusShapes) {
  json payload = {{"status", "success"}, {"func_return", 5}};
  json j = parse_line(encode_ok("req-5", "result", payload));
  EXPECT_EQ(j, (json{{"v", 1}, {"id", "req-5"}, {"ok", true}, {"result", payload}}));
  json s = parse_line(encode_ok("req-1", "status", {{"version", "0.1.0"}}));
  EXPECT_EQ(s["status"]["version"], "0.1.0");
  EXPECT_EQ(s["ok"], true);
  EXPECT_FALSE(s.contains("error"));
}

TEST(EncodeOk, RawMembersAreSplicedInSortedPlace) {
  json payload = {{"status", "success"}, {"record", {{"a", 1}}}, {"func_return", "placeholder"}};
  const std::string exact = R"([NaN,123456789012345678901234567890,"\udcff",{"b":1,"a":2,"a":3}])";
  const std::string line = encode_ok("r", "result", payload, {{"func_return", exact}, {"agent_state", "null"}});
  EXPECT_EQ(line, std::string(R"({"id":"r","ok":true,"result":{"agent_state":null,"func_return":)") + exact +
                      R"(,"record":{"a":1},"status":"success"},"v":1})" + "\n");
  // No raw members: the plain encoding, byte for byte.
  EXPECT_EQ(encode_ok("r", "result", payload, {}), encode_ok("r", "result", payload));
  const std::string same = encode_ok("r", "result", payload, {{"func_return", "\"placeholder\""}});
  EXPECT_EQ(same, encode_ok("r", "result", payload));
}

TEST(EncodeOk, EmptyIdStaysAString) {
  // Unlike encode_error, encode_ok writes "" for an empty id.
  json j = parse_line(encode_ok("", "status", json::object()));
  EXPECT_EQ(j["id"], "");
}

TEST(EncodeOk, ToolOutputWithInvalidUtf8NeverThrows) {
  json payload = {{"stdout", json::array({std::string("ok \xff\xfe\n")})}};
  std::string line;
  ASSERT_NO_THROW(line = encode_ok("r", "result", payload));
  json j = parse_line(line);
  EXPECT_EQ(j["result"]["stdout"][0], "ok \xEF\xBF\xBD\xEF\xBF\xBD\n");
}

TEST(EncodeOk, RoundTripsThroughDecoderIds) {
  // Whatever id the decoder accepted is echoed byte for byte.
  for (std::string id : {std::string("a"), std::string("\u00e9\u2603"), std::string(128, 'z'), std::string("with space"),
                         std::string("quote\"back\\slash")}) {
    json req = minimal_status();
    req["id"] = id;
    Decoded d = decode(req);
    ASSERT_TRUE(d.req);
    json resp = parse_line(encode_ok(d.req->id, "status", json::object()));
    EXPECT_EQ(resp["id"], id);
  }
}

}  // namespace
}  // namespace tsb::protocol

namespace tsb::protocol {
namespace {

// session: organization and command required; the command's strings
// bounded, none with a NUL, the program not empty; nothing of a run's
// fields (tool_name, timeout, script) is accepted.
TEST(DecodeRequest, Session) {
  json j = {{"v", 1}, {"id", "s"}, {"type", "session"}, {"organization_id", "o"}, {"command", {"node", "x.js", ""}},
            {"env", {{"A", "1"}}}, {"policy", "default"}, {"agent_id", "agent-1"}};
  Decoded d = decode(j);
  ASSERT_TRUE(d.req) << d.err->message;
  const auto* s = std::get_if<SessionRequest>(&d.req->body);
  ASSERT_TRUE(s);
  EXPECT_EQ(d.req->type_name(), "session");
  EXPECT_EQ(s->command, (std::vector<std::string>{"node", "x.js", ""}));
  EXPECT_EQ(s->env.at("A"), "1");
  EXPECT_EQ(s->policy, "default");
  EXPECT_EQ(s->agent_id, "agent-1");
  EXPECT_FALSE(s->workspace);
  json ws = j;
  ws["workspace"] = "agent-1.a_b:c";
  Decoded w = decode(ws);
  ASSERT_TRUE(w.req) << w.err->message;
  EXPECT_EQ(std::get<SessionRequest>(w.req->body).workspace, "agent-1.a_b:c");
  for (json bad : {json(""), json("a b"), json("../x"), json("a/b"), json(std::string(129, 'a')), json(1)}) {
    ws["workspace"] = bad;
    EXPECT_BAD_REQUEST(ws, "\"workspace\"");
  }
  json no_cmd = j;
  no_cmd.erase("command");
  EXPECT_BAD_REQUEST(no_cmd, "missing field \"command\"");
  for (json bad_cmd : {json::array(), json::array({""}), json::array({1}), json::array({std::string("a\0b", 3)}),
                       json("node")}) {
    json b = j;
    b["command"] = bad_cmd;
    EXPECT_BAD_REQUEST(b, "\"command\"");
  }
  json many = j;
  many["command"] = json::array();
  for (int i = 0; i < 257; ++i) many["command"].push_back("a");
  EXPECT_BAD_REQUEST(many, "more than 256 arguments");
  json big = j;
  big["command"] = json::array({std::string(70000, 'a')});
  EXPECT_BAD_REQUEST(big, "65536 bytes");
  for (const char* run_field : {"tool_name", "timeout", "script"}) {
    json b = j;
    b[run_field] = run_field == std::string("timeout") ? json(1) : json("x");
    EXPECT_BAD_REQUEST(b, "unknown field");
  }
  json no_org = j;
  no_org.erase("organization_id");
  EXPECT_BAD_REQUEST(no_org, "organization_id");
  // The operator's two: a list with nothing else, a kill with an id.
  Decoded l = decode(json{{"v", 1}, {"id", "l"}, {"type", "session_list"}});
  ASSERT_TRUE(l.req) << l.err->message;
  EXPECT_EQ(l.req->type_name(), "session_list");
  EXPECT_BAD_REQUEST((json{{"v", 1}, {"id", "l"}, {"type", "session_list"}, {"session_id", "x"}}), "unknown field");
  Decoded k = decode(json{{"v", 1}, {"id", "k"}, {"type", "session_kill"}, {"session_id", "abc"}});
  ASSERT_TRUE(k.req) << k.err->message;
  EXPECT_EQ(std::get<SessionKillRequest>(k.req->body).session_id, "abc");
  EXPECT_BAD_REQUEST((json{{"v", 1}, {"id", "k"}, {"type", "session_kill"}}), "missing field \"session_id\"");
  EXPECT_BAD_REQUEST((json{{"v", 1}, {"id", "k"}, {"type", "session_kill"}, {"session_id", std::string(65, 'a')}}),
                     "longer than 64");
  EXPECT_FALSE(std::get<SessionKillRequest>(k.req->body).signal) << "no signal: the session's end";
  // A signal for the command instead, by its name without SIG: only those
  // a command may be sent (never KILL or STOP, never a number).
  Decoded t = decode(json{{"v", 1}, {"id", "k"}, {"type", "session_kill"}, {"session_id", "abc"}, {"signal", "TERM"}});
  ASSERT_TRUE(t.req) << t.err->message;
  EXPECT_EQ(std::get<SessionKillRequest>(t.req->body).signal, SIGTERM);
  for (const auto& [name, number] : std::vector<std::pair<std::string, int>>{
           {"HUP", SIGHUP}, {"INT", SIGINT}, {"QUIT", SIGQUIT}, {"USR1", SIGUSR1}, {"USR2", SIGUSR2}, {"WINCH", SIGWINCH}}) {
    Decoded d = decode(json{{"v", 1}, {"id", "k"}, {"type", "session_kill"}, {"session_id", "a"}, {"signal", name}});
    ASSERT_TRUE(d.req) << name;
    EXPECT_EQ(std::get<SessionKillRequest>(d.req->body).signal, number);
    EXPECT_EQ(session_signal_name(number), name);
  }
  for (const json& bad : {json("KILL"), json("STOP"), json("SIGTERM"), json("term"), json(""), json(15)})
    EXPECT_FALSE(decode(json{{"v", 1}, {"id", "k"}, {"type", "session_kill"}, {"session_id", "a"}, {"signal", bad}}).req)
        << bad.dump();
}

TEST(SessionFrame, KindLengthPayload) {
  EXPECT_EQ(session_frame(kSessionStdout, "hi"), std::string("o\0\0\0\x02hi", 7));
  const std::string big(70000, 'z');
  const std::string f = session_frame(kSessionEnd, big);
  EXPECT_EQ(f.substr(0, 5), std::string("x\0\x01\x11\x70", 5));
  EXPECT_EQ(f.size(), 5 + big.size());
}

}  // namespace
}  // namespace tsb::protocol
