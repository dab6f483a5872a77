// protocol/schema/*.json and protocol/PROTOCOL.md against the code, so that
// the reference and the daemon cannot drift apart silently:
//
//   - every schema file is JSON, declares draft 2020-12, describes every field,
//     is strict on requests and tolerant on responses;
//   - the request fields decode_request knows (read from protocol/messages.cc)
//     are exactly the schema properties, type by type, and the required ones
//     match;
//   - a corpus of request lines gets the same verdict from the decoder and the
//     schema, wherever a schema can express the rule;
//   - responses built by the daemon's own code (encode_ok, encode_error,
//     shape_tool_result, run_record_json, for every end reason and both modes)
//     validate, and every field they carry is declared;
//   - the status fields (read from daemon/frontend/server.cc and
//     daemon/frontend/e2b/e2b.cc), the end reasons and error codes (read from the
//     enums and the E2B backend) match the schemas;
//   - PROTOCOL.md names every field and its example lines validate.
//
// The validator below implements the subset of JSON Schema 2020-12 the
// schema files use, and fails on any keyword it does not implement, so it
// never passes a constraint it did not check.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "daemon/frontend/letta/result.h"
#include "protocol/record.h"
#include "daemon/common/hash.h"
#include "isolate/supervise/outcome.h"
#include "daemon/frontend/letta/letta.h"
#include "protocol/messages.h"
#include "daemon/frontend/letta/pyjson.h"

namespace tsb::protocol {
using namespace tsb::letta;  // Letta's dialect, beside the wire protocol
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

const std::string kSchemaDir = std::string(TSB_SOURCE_DIR) + "/protocol/schema";
const std::string kDraft = "https://json-schema.org/draft/2020-12/schema";

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A source file of the tree, read for the fields and values it adds to
// responses ("" when the file is absent).
std::string source_file(const char* path) {
  std::ifstream in(std::string(TSB_SOURCE_DIR) + "/" + path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
std::string e2b_source() { return source_file("daemon/frontend/e2b/e2b.cc"); }

// The body of a function definition `signature { ... }` in a source text.
std::string function_body(const std::string& src, const std::string& signature) {
  auto start = src.find(signature);
  if (start == std::string::npos) return "";
  auto end = src.find("\n}\n", start);
  return src.substr(start, end == std::string::npos ? std::string::npos : end - start);
}

// ---------------------------------------------------------------------------
// A small JSON Schema 2020-12 validator (the subset the schema files use)
// ---------------------------------------------------------------------------

const std::set<std::string> kAnnotations = {"$schema", "$id", "$defs", "$comment", "title", "description", "examples",
                                            "default"};
const std::set<std::string> kAssertions = {"$ref",     "allOf",     "anyOf",     "oneOf",      "not",
                                           "type",     "enum",      "const",     "properties", "required",
                                           "additionalProperties",  "propertyNames", "items", "minLength",
                                           "maxLength", "pattern",  "minimum",   "maximum",    "exclusiveMinimum",
                                           "exclusiveMaximum", "minItems", "maxItems", "maxProperties"};

std::size_t code_points(const std::string& s) {
  std::size_t n = 0;
  for (unsigned char c : s)
    if ((c & 0xC0) != 0x80) ++n;
  return n;
}

class Schemas {
 public:
  void load(const std::string& dir) {
    for (const auto& e : fs::directory_iterator(dir)) {
      if (e.path().extension() != ".json") continue;
      docs_[e.path().filename().string()] = json::parse(read_text(e.path().string()));
    }
  }
  const std::map<std::string, json>& docs() const { return docs_; }
  const json& doc(const std::string& name) const { return docs_.at(name); }

  // Errors (empty when valid) of `inst` against the schema file `name`.
  std::vector<std::string> validate(const json& inst, const std::string& name) const {
    std::vector<std::string> errs;
    check(inst, docs_.at(name), name, "", errs);
    return errs;
  }
  bool valid(const json& inst, const std::string& name) const { return validate(inst, name).empty(); }

 private:
  const json& resolve(const std::string& ref, const std::string& file, std::string* target_file) const {
    std::string f = file, frag;
    auto hash = ref.find('#');
    std::string path = hash == std::string::npos ? ref : ref.substr(0, hash);
    if (hash != std::string::npos) frag = ref.substr(hash + 1);
    if (!path.empty()) f = path.substr(path.rfind('/') + 1);
    *target_file = f;
    const json& d = docs_.at(f);
    if (frag.empty()) return d;
    return d.at(json::json_pointer(frag));
  }

  static bool type_matches(const json& inst, const std::string& t) {
    if (t == "object") return inst.is_object();
    if (t == "array") return inst.is_array();
    if (t == "string") return inst.is_string();
    if (t == "boolean") return inst.is_boolean();
    if (t == "null") return inst.is_null();
    if (t == "number") return inst.is_number();
    if (t == "integer")
      return inst.is_number_integer() || (inst.is_number_float() && std::isfinite(inst.get<double>()) &&
                                          inst.get<double>() == std::floor(inst.get<double>()));
    ADD_FAILURE() << "unknown type " << t;
    return false;
  }

  void check(const json& inst, const json& s, const std::string& file, const std::string& at,
             std::vector<std::string>& errs) const {
    auto fail = [&](const std::string& m) { errs.push_back((at.empty() ? "/" : at) + ": " + m); };
    if (s.is_boolean()) {
      if (!s.get<bool>()) fail("false schema");
      return;
    }
    for (auto it = s.begin(); it != s.end(); ++it)
      if (!kAnnotations.count(it.key()) && !kAssertions.count(it.key()))
        ADD_FAILURE() << file << ": keyword " << it.key() << " is not implemented by the test validator";
    if (s.contains("$ref")) {
      std::string f;
      const json& target = resolve(s["$ref"], file, &f);
      check(inst, target, f, at, errs);
    }
    if (s.contains("allOf"))
      for (const auto& sub : s["allOf"]) check(inst, sub, file, at, errs);
    if (s.contains("anyOf")) {
      bool any = false;
      for (const auto& sub : s["anyOf"]) {
        std::vector<std::string> e;
        check(inst, sub, file, at, e);
        any = any || e.empty();
      }
      if (!any) fail("matches no anyOf branch");
    }
    if (s.contains("oneOf")) {
      int n = 0;
      std::vector<std::string> all;
      for (const auto& sub : s["oneOf"]) {
        std::vector<std::string> e;
        check(inst, sub, file, at, e);
        if (e.empty()) ++n;
        all.insert(all.end(), e.begin(), e.end());
      }
      if (n != 1) {
        fail("matches " + std::to_string(n) + " oneOf branches");
        if (n == 0)
          for (const auto& e : all) errs.push_back("  (branch) " + e);
      }
    }
    if (s.contains("not")) {
      std::vector<std::string> e;
      check(inst, s["not"], file, at, e);
      if (e.empty()) fail("matches a \"not\" schema");
    }
    if (s.contains("type")) {
      bool ok = false;
      if (s["type"].is_string()) ok = type_matches(inst, s["type"]);
      else
        for (const auto& t : s["type"]) ok = ok || type_matches(inst, t);
      if (!ok) fail("type is not " + s["type"].dump());
    }
    if (s.contains("enum")) {
      bool found = false;
      for (const auto& v : s["enum"]) found = found || v == inst;
      if (!found) fail(inst.dump() + " is not one of " + s["enum"].dump());
    }
    if (s.contains("const") && !(s["const"] == inst)) fail("is not " + s["const"].dump());
    if (inst.is_string()) {
      const std::string& str = inst.get_ref<const std::string&>();
      if (s.contains("minLength") && code_points(str) < s["minLength"].get<std::size_t>()) fail("too short");
      if (s.contains("maxLength") && code_points(str) > s["maxLength"].get<std::size_t>()) fail("too long");
      if (s.contains("pattern") && !std::regex_search(str, std::regex(s["pattern"].get<std::string>(), std::regex::ECMAScript)))
        fail("does not match " + s["pattern"].get<std::string>());
    }
    if (inst.is_number()) {
      double v = inst.get<double>();
      if (s.contains("minimum") && v < s["minimum"].get<double>()) fail("below minimum");
      if (s.contains("maximum") && v > s["maximum"].get<double>()) fail("above maximum");
      if (s.contains("exclusiveMinimum") && v <= s["exclusiveMinimum"].get<double>()) fail("not above exclusiveMinimum");
      if (s.contains("exclusiveMaximum") && v >= s["exclusiveMaximum"].get<double>()) fail("not below exclusiveMaximum");
    }
    if (inst.is_array()) {
      if (s.contains("minItems") && inst.size() < s["minItems"].get<std::size_t>()) fail("too few items");
      if (s.contains("maxItems") && inst.size() > s["maxItems"].get<std::size_t>()) fail("too many items");
      if (s.contains("items"))
        for (std::size_t i = 0; i < inst.size(); ++i) check(inst[i], s["items"], file, at + "/" + std::to_string(i), errs);
    }
    if (inst.is_object()) {
      if (s.contains("maxProperties") && inst.size() > s["maxProperties"].get<std::size_t>()) fail("too many properties");
      if (s.contains("required"))
        for (const auto& r : s["required"])
          if (!inst.contains(r.get<std::string>())) fail("missing " + r.get<std::string>());
      const json empty = json::object();
      const json& props = s.contains("properties") ? s["properties"] : empty;
      for (auto it = inst.begin(); it != inst.end(); ++it) {
        std::string p = at + "/" + it.key();
        if (s.contains("propertyNames")) check(json(it.key()), s["propertyNames"], file, p + "(name)", errs);
        if (props.contains(it.key())) check(it.value(), props[it.key()], file, p, errs);
        else if (s.contains("additionalProperties")) check(it.value(), s["additionalProperties"], file, p, errs);
      }
    }
  }

  std::map<std::string, json> docs_;
};

const Schemas& schemas() {
  static Schemas* s = [] {
    auto* x = new Schemas;
    x->load(kSchemaDir);
    return x;
  }();
  return *s;
}

std::set<std::string> keys_of(const json& obj) {
  std::set<std::string> out;
  for (auto it = obj.begin(); it != obj.end(); ++it) out.insert(it.key());
  return out;
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& e : v) s += e + "\n";
  return s;
}

// Regex captures over a text.
std::set<std::string> captures(const std::string& text, const std::string& re) {
  std::set<std::string> out;
  std::regex r(re);
  for (auto it = std::sregex_iterator(text.begin(), text.end(), r); it != std::sregex_iterator(); ++it) out.insert((*it)[1]);
  return out;
}

// The identifiers of `enum class NAME { ... };` in a header.
std::vector<std::string> enumerators(const std::string& header, const std::string& name) {
  std::string text = read_text(std::string(TSB_SOURCE_DIR) + "/" + header);
  auto start = text.find("enum class " + name + " {");
  EXPECT_NE(start, std::string::npos) << name << " not found in " << header;
  auto end = text.find("};", start);
  std::string body = text.substr(start, end - start);
  std::vector<std::string> out;
  std::regex r(R"(\n\s+([A-Z][A-Za-z0-9]*)\s*[,=])");
  for (auto it = std::sregex_iterator(body.begin(), body.end(), r); it != std::sregex_iterator(); ++it)
    out.push_back((*it)[1]);
  return out;
}

const char* const kRequestFiles[] = {"request-execute.json", "request-run_tool.json", "request-status.json",
                                     "request-session.json", "request-session_list.json", "request-session_kill.json"};
const char* const kResponseFiles[] = {"response.json", "response-result.json", "response-status.json",
                                      "response-session.json", "response-session_list.json",
                                      "response-session_kill.json", "response-error.json", "run-record.json",
                                      "session-record.json", "tool-execution-result.json"};

// ---------------------------------------------------------------------------
// The schema files themselves
// ---------------------------------------------------------------------------

TEST(Schema, EveryExpectedFileExists) {
  std::set<std::string> want = {"request.json", "request-execute.json", "request-run_tool.json", "request-status.json",
                                "request-session.json", "request-session_list.json", "request-session_kill.json",
                                "response.json", "response-result.json", "response-status.json",
                                "response-session.json", "response-session_list.json", "response-session_kill.json",
                                "response-error.json", "run-record.json", "session-record.json",
                                "tool-execution-result.json"};
  EXPECT_EQ(keys_of(json(schemas().docs())), want);
}

TEST(Schema, FilesAreJsonDraft2020WithIdTitleAndDescription) {
  for (const auto& [name, d] : schemas().docs()) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(d.is_object());
    EXPECT_EQ(d.value("$schema", ""), kDraft);
    std::string id = d.value("$id", "");
    EXPECT_GE(id.size(), name.size());
    EXPECT_EQ(id.substr(id.size() - name.size()), name);
    EXPECT_FALSE(d.value("title", "").empty());
    EXPECT_FALSE(d.value("description", "").empty());
  }
}

// Walks every subschema; `fn(schema, pointer)`.
void walk(const json& s, const std::string& at, const std::function<void(const json&, const std::string&)>& fn) {
  if (!s.is_object()) return;
  fn(s, at);
  for (const char* k : {"properties", "$defs"})
    if (s.contains(k))
      for (auto it = s[k].begin(); it != s[k].end(); ++it) walk(it.value(), at + "/" + k + "/" + it.key(), fn);
  for (const char* k : {"items", "additionalProperties", "propertyNames", "not"})
    if (s.contains(k)) walk(s[k], at + "/" + k, fn);
  for (const char* k : {"allOf", "anyOf", "oneOf"})
    if (s.contains(k))
      for (std::size_t i = 0; i < s[k].size(); ++i) walk(s[k][i], at + "/" + k + "/" + std::to_string(i), fn);
}

TEST(Schema, EveryFieldHasADescription) {
  for (const auto& [name, d] : schemas().docs())
    walk(d, "", [&](const json& s, const std::string& at) {
      if (!s.contains("properties")) return;
      for (auto it = s["properties"].begin(); it != s["properties"].end(); ++it)
        EXPECT_FALSE(it.value().value("description", "").empty()) << name << at << "/properties/" << it.key();
    });
}

TEST(Schema, OnlyImplementedKeywordsAreUsed) {
  for (const auto& [name, d] : schemas().docs())
    walk(d, "", [&](const json& s, const std::string& at) {
      for (auto it = s.begin(); it != s.end(); ++it)
        EXPECT_TRUE(kAnnotations.count(it.key()) || kAssertions.count(it.key())) << name << at << ": " << it.key();
    });
}

TEST(Schema, RequestsAreStrictResponsesTolerant) {
  for (const char* f : kRequestFiles) {
    const json& d = schemas().doc(f);
    EXPECT_EQ(d["additionalProperties"], false) << f;
    if (d["properties"].contains("sandbox_config")) {
      EXPECT_EQ(d["properties"]["sandbox_config"]["additionalProperties"], false) << f;
    }
  }
  for (const char* f : kResponseFiles)
    walk(schemas().doc(f), "", [&](const json& s, const std::string& at) {
      if (s.contains("additionalProperties") && s["additionalProperties"].is_boolean()) {
        EXPECT_TRUE(s["additionalProperties"].get<bool>()) << f << at << ": responses must allow additions";
      }
      if (s.contains("properties") && s.value("type", json()) == "object" && !s.contains("additionalProperties") &&
          !at.empty())
        ADD_FAILURE() << f << at << ": say additionalProperties true explicitly";
    });
}

TEST(Schema, ExamplesInSchemasValidate) {
  for (const auto& [name, d] : schemas().docs()) {
    if (!d.contains("examples")) continue;
    for (const auto& ex : d["examples"]) {
      EXPECT_TRUE(schemas().valid(ex, name)) << name << ": " << joined(schemas().validate(ex, name));
      std::string id;
      auto r = decode_request(ex.dump(), &id);
      EXPECT_TRUE(std::holds_alternative<Request>(r)) << name << ": the decoder refuses the example";
    }
  }
}

// ---------------------------------------------------------------------------
// Requests: schema properties == decoder fields
// ---------------------------------------------------------------------------

json minimal(const std::string& type) {
  json j = {{"v", 1}, {"id", "x"}, {"type", type}};
  if (type == "session") {
    j["organization_id"] = "org";
    j["command"] = json::array({"node", "server.js"});
    return j;
  }
  if (type == "session_kill") j["session_id"] = "4f2a9c1e0b7d3a55";
  if (type == "session_list" || type == "session_kill") return j;
  if (type != "status") {
    j["tool_name"] = "f";
    j["organization_id"] = "org";
  }
  if (type == "execute") j["script"] = "print(1)";
  if (type == "run_tool") j["source_code"] = "def f():\n    return 1\n";
  return j;
}

bool accepted(const json& j, std::string* why = nullptr) {
  std::string id;
  auto r = decode_request(j.dump(), &id);
  if (auto* e = std::get_if<ProtocolError>(&r)) {
    if (why) *why = e->message;
    return false;
  }
  return true;
}

// Every field name decode_request reads, taken from its source.
std::set<std::string> decoder_field_names() {
  std::string src = read_text(std::string(TSB_SOURCE_DIR) + "/protocol/messages.cc");
  std::set<std::string> names = captures(src, R"(\b[a-z]\.(?:str|get)\(\s*\"([A-Za-z_][A-Za-z0-9_]*)\")");
  EXPECT_GE(names.size(), 15u) << "the field extraction from messages.cc found too little";
  return names;
}

TEST(SchemaRequests, DecoderFieldsAreExactlyTheSchemaProperties) {
  std::set<std::string> from_code = decoder_field_names();
  std::set<std::string> from_schema;
  for (const char* f : kRequestFiles) {
    const json& p = schemas().doc(f)["properties"];
    for (auto it = p.begin(); it != p.end(); ++it) from_schema.insert(it.key());
    if (p.contains("sandbox_config"))
      for (auto& [k, v] : p["sandbox_config"]["properties"].items()) from_schema.insert(k);
  }
  EXPECT_EQ(from_code, from_schema);
}

TEST(SchemaRequests, EachTypeAcceptsExactlyItsSchemaProperties) {
  std::set<std::string> names = decoder_field_names();
  names.insert("not_a_field");
  for (const char* f : kRequestFiles) {
    const json& d = schemas().doc(f);
    std::string type = d["properties"]["type"]["const"];
    SCOPED_TRACE(type);
    json base = minimal(type);
    std::string why;
    ASSERT_TRUE(accepted(base, &why)) << why;
    ASSERT_TRUE(schemas().valid(base, f));
    for (const auto& n : names) {
      if (base.contains(n)) continue;
      // An optional field set to null is the field left out; an unknown
      // field is refused whatever its value. So null tells them apart.
      json j = base;
      j[n] = nullptr;
      bool in_schema = d["properties"].contains(n);
      EXPECT_EQ(accepted(j, &why), in_schema) << n << ": " << why;
      EXPECT_EQ(schemas().valid(j, f), in_schema) << n;
    }
  }
}

TEST(SchemaRequests, SandboxConfigAcceptsExactlyItsSchemaProperties) {
  const json& sc = schemas().doc("request-execute.json")["properties"]["sandbox_config"];
  EXPECT_EQ(schemas().doc("request-run_tool.json")["properties"]["sandbox_config"], sc);
  std::set<std::string> names = decoder_field_names();
  names.insert("not_a_field");
  json base = minimal("execute");
  base["sandbox_config"] = {{"type", "local"}, {"config", json::object()}};
  ASSERT_TRUE(accepted(base));
  for (const auto& n : names) {
    if (base["sandbox_config"].contains(n)) continue;
    json j = base;
    j["sandbox_config"][n] = nullptr;
    EXPECT_EQ(accepted(j), sc["properties"].contains(n)) << n;
    // organization_id null: a config without one (PROTOCOL.md 13.3).
    EXPECT_EQ(schemas().valid(j, "request-execute.json"), n == "organization_id") << n;
  }
}

TEST(SchemaRequests, RequiredFieldsMatch) {
  for (const char* f : kRequestFiles) {
    const json& d = schemas().doc(f);
    std::string type = d["properties"]["type"]["const"];
    json base = minimal(type);
    // The minimal request holds exactly the schema's required fields...
    std::set<std::string> req;
    for (const auto& r : d["required"]) req.insert(r);
    EXPECT_EQ(keys_of(base), req) << f;
    // ...and the decoder needs every one of them.
    for (const auto& k : req) {
      json j = base;
      j.erase(k);
      EXPECT_FALSE(accepted(j)) << f << " without " << k;
      EXPECT_FALSE(schemas().valid(j, f)) << f << " without " << k;
    }
  }
  const json& sc = schemas().doc("request-execute.json")["properties"]["sandbox_config"];
  for (const char* k : {"type", "config"}) {
    json j = minimal("execute");
    j["sandbox_config"] = {{"type", "local"}, {"config", json::object()}};
    j["sandbox_config"].erase(k);
    EXPECT_FALSE(accepted(j)) << k;
    EXPECT_NE(std::find(sc["required"].begin(), sc["required"].end(), json(k)), sc["required"].end()) << k;
  }
}

// One line and, for lines a schema can judge, the same verdict from both.
struct Case {
  std::string what;
  json request;
};

std::vector<Case> request_corpus() {
  std::vector<Case> c;
  auto with = [&](const std::string& type, const std::string& what, const std::function<void(json&)>& edit) {
    json j = minimal(type);
    edit(j);
    c.push_back({type + ": " + what, j});
  };
  for (std::string t : {"execute", "run_tool", "status"}) {
    with(t, "minimal", [](json&) {});
    with(t, "no id", [](json& j) { j.erase("id"); });
    with(t, "id 128", [](json& j) { j["id"] = std::string(128, 'i'); });
    with(t, "id 129", [](json& j) { j["id"] = std::string(129, 'i'); });
    with(t, "id empty", [](json& j) { j["id"] = ""; });
    with(t, "id number", [](json& j) { j["id"] = 3; });
    with(t, "v 2", [](json& j) { j["v"] = 2; });
    with(t, "v string", [](json& j) { j["v"] = "1"; });
    with(t, "v missing", [](json& j) { j.erase("v"); });
    with(t, "type unknown", [](json& j) { j["type"] = "nope"; });
    with(t, "unknown field", [](json& j) { j["extra"] = 1; });
  }
  for (std::string t : {"execute", "run_tool"}) {
    with(t, "tool_name dash", [](json& j) { j["tool_name"] = "a-b"; });
    with(t, "tool_name digit first", [](json& j) { j["tool_name"] = "1a"; });
    with(t, "tool_name 256", [](json& j) { j["tool_name"] = std::string(256, 'a'); });
    with(t, "tool_name 257", [](json& j) { j["tool_name"] = std::string(257, 'a'); });
    with(t, "tool_name empty", [](json& j) { j["tool_name"] = ""; });
    with(t, "organization_id 257", [](json& j) { j["organization_id"] = std::string(257, 'o'); });
    with(t, "organization_id number", [](json& j) { j["organization_id"] = 1; });
    with(t, "policy 128", [](json& j) { j["policy"] = std::string(128, 'p'); });
    with(t, "policy 129", [](json& j) { j["policy"] = std::string(129, 'p'); });
    with(t, "env ok", [](json& j) { j["env"] = {{"A", "1"}, {"_B2", ""}}; });
    with(t, "env number value", [](json& j) { j["env"] = {{"A", 1}}; });
    with(t, "env null value", [](json& j) { j["env"] = {{"A", nullptr}}; });
    with(t, "env array", [](json& j) { j["env"] = json::array(); });
    auto env_of = [](std::size_t n) {
      json e = json::object();
      for (std::size_t i = 0; i < n; ++i) e["V" + std::to_string(i)] = "";
      return e;
    };
    with(t, "env 4096", [&](json& j) { j["env"] = env_of(kMaxEnvVariables); });
    with(t, "env 4097", [&](json& j) { j["env"] = env_of(kMaxEnvVariables + 1); });
    with(t, "timeout int", [](json& j) { j["timeout"] = 5; });
    with(t, "timeout float", [](json& j) { j["timeout"] = 0.25; });
    with(t, "timeout max", [](json& j) { j["timeout"] = 86400; });
    with(t, "timeout 0", [](json& j) { j["timeout"] = 0; });
    with(t, "timeout negative", [](json& j) { j["timeout"] = -3; });
    with(t, "timeout huge", [](json& j) { j["timeout"] = 1e12; });
    with(t, "timeout string", [](json& j) { j["timeout"] = "5"; });
    with(t, "sandbox_config ok", [](json& j) { j["sandbox_config"] = {{"type", "local"}, {"config", {{"a", 1}}}}; });
    with(t, "sandbox_config extra", [](json& j) {
      j["sandbox_config"] = {{"type", "local"}, {"config", json::object()}, {"x", 1}};
    });
    with(t, "sandbox_config no config", [](json& j) { j["sandbox_config"] = {{"type", "local"}}; });
    with(t, "sandbox_config type 65", [](json& j) {
      j["sandbox_config"] = {{"type", std::string(65, 't')}, {"config", json::object()}};
    });
    with(t, "agent_id", [](json& j) { j["agent_id"] = "agent-1"; });
    with(t, "agent_id number", [](json& j) { j["agent_id"] = 1; });
    with(t, "project_id 257", [](json& j) { j["project_id"] = std::string(257, 'p'); });
  }
  with("execute", "script null", [](json& j) { j["script"] = nullptr; });
  with("execute", "run_tool field", [](json& j) { j["args"] = json::object(); });
  with("run_tool", "execute field", [](json& j) { j["script"] = "x"; });
  with("run_tool", "args", [](json& j) { j["args"] = {{"a", json::array({1, {{"b", nullptr}}})}}; });
  with("run_tool", "args array", [](json& j) { j["args"] = json::array(); });
  with("run_tool", "json_schema", [](json& j) { j["json_schema"] = {{"parameters", {{"properties", json::object()}}}}; });
  with("run_tool", "json_schema string", [](json& j) { j["json_schema"] = "{}"; });
  with("run_tool", "agent_state", [](json& j) { j["agent_state"] = {{"memory", json::object()}}; });
  with("run_tool", "agent_state array", [](json& j) { j["agent_state"] = json::array(); });
  with("run_tool", "pip_requirements", [](json& j) { j["pip_requirements"] = json::array({"a==1", "b"}); });
  with("run_tool", "pip_requirements number", [](json& j) { j["pip_requirements"] = json::array({1}); });
  with("run_tool", "pip_requirements 1024", [](json& j) { j["pip_requirements"] = json(std::vector<std::string>(kMaxPipRequirements, "p")); });
  with("run_tool", "pip_requirements 1025", [](json& j) { j["pip_requirements"] = json(std::vector<std::string>(kMaxPipRequirements + 1, "p")); });
  with("run_tool", "source_code missing", [](json& j) { j.erase("source_code"); });
  with("status", "tool_name", [](json& j) { j["tool_name"] = "f"; });
  return c;
}

TEST(SchemaRequests, DecoderAndSchemaAgreeOnACorpus) {
  for (const auto& c : request_corpus()) {
    std::string why;
    bool dec = accepted(c.request, &why);
    bool sch = schemas().valid(c.request, "request.json");
    EXPECT_EQ(dec, sch) << c.what << "\n decoder: " << (dec ? "accepts" : "refuses: " + why)
                        << "\n schema: " << joined(schemas().validate(c.request, "request.json"));
  }
}

TEST(SchemaRequests, RequestOneOfDispatchesOnType) {
  // A valid request matches exactly one branch; the file names match the types.
  for (const char* f : kRequestFiles) {
    const json& d = schemas().doc(f);
    std::string type = d["properties"]["type"]["const"];
    EXPECT_EQ(std::string(f), "request-" + type + ".json");
    EXPECT_TRUE(schemas().valid(minimal(type), "request.json")) << type;
  }
}

// ---------------------------------------------------------------------------
// Responses built by the daemon's own code
// ---------------------------------------------------------------------------

// The engine's end reasons (local runs).
std::set<std::string> end_reason_names() {
  std::set<std::string> out;
  auto names = enumerators("isolate/supervise/outcome.h", "EndReason");
  EXPECT_EQ(names.size(), 9u);
  for (std::size_t i = 0; i < names.size(); ++i) out.insert(std::string(isolate::to_string(static_cast<isolate::EndReason>(i))));
  EXPECT_EQ(out.count("unknown"), 0u);
  return out;
}

// Plus the ones the E2B backend writes itself ("backend_error").
std::set<std::string> all_end_reason_names() {
  std::set<std::string> out = end_reason_names();
  for (const auto& r : captures(e2b_source(), R"(end_reason\s*=\s*\"([a-z_]+)\")")) out.insert(r);
  return out;
}

std::set<std::string> strings_of(const json& arr) {
  std::set<std::string> out;
  for (const auto& e : arr) out.insert(e.get<std::string>());
  return out;
}

TEST(SchemaResponses, EndReasonsMatchTheEngine) {
  std::set<std::string> names = all_end_reason_names();
  EXPECT_EQ(strings_of(schemas().doc("run-record.json")["properties"]["end_reason"]["enum"]), names);
  EXPECT_EQ(strings_of(schemas().doc("response-status.json")["properties"]["status"]["properties"]["totals"]["propertyNames"]["enum"]),
            names);
}

TEST(SchemaResponses, ErrorCodesMatchTheProtocol) {
  auto names = enumerators("protocol/messages.h", "ErrorCode");
  EXPECT_EQ(names.size(), 8u);
  std::set<std::string> codes;
  for (std::size_t i = 0; i < names.size(); ++i) codes.insert(std::string(error_code_name(static_cast<ErrorCode>(i))));
  EXPECT_EQ(strings_of(schemas().doc("response-error.json")["properties"]["error"]["properties"]["code"]["enum"]), codes);
}

TEST(SchemaResponses, EncodedErrorsValidate) {
  auto names = enumerators("protocol/messages.h", "ErrorCode");
  for (std::size_t i = 0; i < names.size(); ++i)
    for (const char* id : {"req-1", ""}) {
      json j = json::parse(encode_error(id, static_cast<ErrorCode>(i), "message"));
      EXPECT_TRUE(schemas().valid(j, "response-error.json")) << joined(schemas().validate(j, "response-error.json"));
      EXPECT_TRUE(schemas().valid(j, "response.json")) << joined(schemas().validate(j, "response.json"));
      EXPECT_FALSE(schemas().valid(j, "response-result.json"));
      EXPECT_EQ(keys_of(j), keys_of(schemas().doc("response-error.json")["properties"]));
    }
}

TEST(SchemaResponses, StatusFieldsMatchTheServer) {
  // The keys of Server::status_json(), read from its source.
  std::string src = read_text(std::string(TSB_SOURCE_DIR) + "/daemon/frontend/server.cc");
  auto start = src.find("json Server::status_json(");
  ASSERT_NE(start, std::string::npos);
  auto end = src.find("\n}\n", start);
  std::string body = src.substr(start, end - start);
  auto ret = body.find("return {");
  ASSERT_NE(ret, std::string::npos);
  std::set<std::string> keys = captures(body.substr(ret), R"(\{\"([a-z_0-9]+)\",)");
  const json& st = schemas().doc("response-status.json")["properties"]["status"];
  EXPECT_EQ(keys, keys_of(st["properties"]));
  EXPECT_EQ(keys, strings_of(st["required"]));
}

TEST(SchemaResponses, E2BStatusFieldsMatchTheBackend) {
  std::string body = function_body(e2b_source(), "json E2BBackend::status_json()");
  const json& e2b = schemas().doc("response-status.json")["properties"]["status"]["properties"]["e2b"];
  if (body.empty()) {
    EXPECT_TRUE(e2b.is_null()) << "status.e2b is documented but the E2B backend is gone";
    return;
  }
  auto ret = body.find("return {");
  ASSERT_NE(ret, std::string::npos);
  EXPECT_EQ(captures(body.substr(ret), R"(\{\"([a-z_0-9]+)\",)"), keys_of(e2b["properties"]));
}

TEST(SchemaResponses, RecordFieldsSetByTheServerAreDeclared) {
  std::string src = read_text(std::string(TSB_SOURCE_DIR) + "/daemon/frontend/server.cc") + e2b_source();
  std::set<std::string> keys = captures(src, R"(record\[\"([a-z_0-9]+)\"\])");
  EXPECT_FALSE(keys.empty());
  const json& props = schemas().doc("run-record.json")["properties"];
  for (const auto& k : keys) EXPECT_TRUE(props.contains(k)) << k;
  // Literal framing values written there are declared too.
  for (const auto& f : captures(src, R"(record\[\"framing\"\]\s*=\s*\"([a-z0-9-]+)\")"))
    EXPECT_TRUE(strings_of(props["framing"]["enum"]).count(f)) << f;
  // And what the shaping adds to the record (Shaped::extra).
  const std::string shaping = read_text(std::string(TSB_SOURCE_DIR) + "/daemon/frontend/letta/result.cc");
  EXPECT_FALSE(captures(shaping, R"(extra\[\"([a-z_0-9]+)\"\])").empty());
  for (const auto& k : captures(shaping, R"(extra\[\"([a-z_0-9]+)\"\])")) EXPECT_TRUE(props.contains(k)) << k;
  for (const auto& f : captures(shaping, R"(extra\[\"framing\"\]\s*=\s*\"([a-z0-9-]+)\")"))
    EXPECT_TRUE(strings_of(props["framing"]["enum"]).count(f)) << f;
}

// Runs of every kind, shaped as the server shapes them.
struct Shaping {
  std::string what;
  core::ShapeContext ctx;
  isolate::RunResult run;
  std::optional<core::DecodedPickle> decoded;  // a pickle payload's decoding
  std::optional<core::ChannelOutcome> channel;  // a local tool run's result channel
};

std::string binary_frame(const std::string& payload) {
  std::string len(4, '\0');
  uint32_t n = static_cast<uint32_t>(payload.size());
  for (int i = 0; i < 4; ++i) len[i] = static_cast<char>((n >> (24 - 8 * i)) & 0xff);
  return std::string(kBinaryMarker) + len + md5_hex(payload) + payload;
}

std::string legacy_frame(const std::string& payload) {
  return std::string(kLegacyStartMarker) + b64encode(payload) + std::string(kLegacyEndMarker);
}

std::vector<Shaping> shapings() {
  std::vector<Shaping> out;
  const std::string nonce(32, 'a');
  auto add = [&](const std::string& what, bool tool_mode, const std::function<void(isolate::RunResult&)>& edit,
                 std::optional<std::string> fp = std::nullopt) {
    Shaping s;
    s.what = what;
    s.ctx.tool_name = "f";
    s.ctx.timeout_s = 60;
    s.ctx.tool_mode = tool_mode;
    s.ctx.nonce = nonce;
    s.ctx.may_declare = true;
    s.ctx.memory_limit = 512u << 20;
    s.ctx.pids_limit = 64;
    s.ctx.fingerprint = fp;
    s.run.run_id = "0123456789abcdef";
    s.run.reason = isolate::EndReason::Exited;
    s.run.exit_code = 0;
    s.run.wall = std::chrono::milliseconds(40);
    s.run.cpu = std::chrono::milliseconds(12);
    s.run.peak_memory_bytes = 3 << 20;
    edit(s.run);
    s.run.stdout_total_bytes = s.run.stdout_data.size();
    s.run.stderr_total_bytes = s.run.stderr_data.size();
    out.push_back(std::move(s));
  };
  using R = isolate::EndReason;
  const std::string ok_payload = R"({"results": {"sum": 5}, "agent_state": null})";
  const std::string traceback = "Traceback (most recent call last):\n  File \"<stdin>\", line 1\nZeroDivisionError: division by zero\n";
  for (bool tool : {false, true}) {
    std::string m = tool ? "run_tool " : "execute ";
    add(m + "timeout", tool, [](auto& r) { r.reason = R::Timeout; r.exit_code = -1; r.stdout_data = "started\n"; });
    add(m + "memory_limit", tool, [](auto& r) { r.reason = R::MemoryLimit; r.exit_code = -1; r.signal = 9; });
    add(m + "cpu_limit", tool, [](auto& r) { r.reason = R::CpuLimit; r.exit_code = -1; });
    add(m + "output_limit", tool, [](auto& r) {
      r.reason = R::OutputLimit; r.exit_code = -1; r.stdout_data = std::string(100, 'x'); r.stdout_truncated = true;
    });
    add(m + "cancelled", tool, [](auto& r) { r.reason = R::Cancelled; r.exit_code = -1; });
    add(m + "setup_failed at a stage", tool, [](auto& r) {
      r.reason = R::SetupFailed; r.exit_code = -1; r.setup_stage = isolate::Stage::Execve; r.setup_errno = 2;
      r.error = "sandbox set-up failed at execve: No such file or directory";
    });
    add(m + "setup_failed before the sandbox", tool, [](auto& r) {
      r = isolate::RunResult{}; r.reason = R::SetupFailed; r.setup_errno = 12; r.error = "cannot allocate";
    });
    add(m + "pids_limit failing", tool, [&](auto& r) { r.reason = R::PidsLimit; r.exit_code = 1; r.stderr_data = "BlockingIOError: [Errno 11] x\n"; });
    add(m + "signaled", tool, [](auto& r) { r.reason = R::Signaled; r.exit_code = -1; r.signal = 9; });
    add(m + "exited 1 without a frame", tool, [&](auto& r) { r.exit_code = 1; r.stderr_data = traceback; });
    add(m + "invalid utf-8", tool, [](auto& r) { r.exit_code = 3; r.stdout_data = "bad \xff\n"; });
  }
  add("execute binary frame", false, [&](auto& r) { r.stdout_data = "hello\n" + binary_frame(ok_payload); },
      std::string("48408990033679363701484527775310645901996820373321982248109825766489622234136"));
  add("execute binary frame with agent_state", false, [&](auto& r) {
    r.stdout_data = binary_frame(R"({"results": "ok", "agent_state": {"memory": {"blocks": []}}})");
  });
  add("execute legacy frame", false, [&](auto& r) { r.stdout_data = "a\n" + legacy_frame(ok_payload) + "\nb\n"; });
  add("execute pids_limit exit 0", false, [&](auto& r) { r.reason = R::PidsLimit; r.stdout_data = binary_frame(ok_payload); });
  add("execute frame and exit 1", false, [&](auto& r) { r.exit_code = 1; r.stdout_data = binary_frame(ok_payload); });
  add("execute corrupted md5", false, [&](auto& r) {
    std::string f = binary_frame(ok_payload);
    f[20] = f[20] == '0' ? '1' : '0';
    r.stdout_data = f;
  });
  add("execute legacy bad base64", false, [&](auto& r) {
    r.stdout_data = std::string(kLegacyStartMarker) + "!!!" + std::string(kLegacyEndMarker);
  });
  add("execute opaque pickle", false, [&](auto& r) { r.stdout_data = legacy_frame(std::string("\x80\x04\x95", 3) + "pickle"); });
  // Decoded by the runner (LocalBackend::decode_pickle): its answer, its
  // error, or no answer.
  auto decoded = [&](const std::string& what, const json& payload, const std::string& failure) {
    add(what, false, [&](auto& r) { r.stdout_data = legacy_frame(std::string("\x80\x04\x95", 3) + "pickle"); });
    core::DecodedPickle& d = out.back().decoded.emplace();
    if (payload.is_null()) {
      d.failure = failure;
      return;
    }
    auto f = extract_nonce_frame(make_nonce_frame(nonce, payload).value(), nonce);
    d.frame = std::move(**f);
  };
  decoded("execute pickle decoded", {{"results", {1, "x"}}, {"agent_state", {{"memory", {{"blocks", json::array()}}}}}}, "");
  decoded("execute pickle that pickle.loads refuses",
          {{"results", nullptr}, {"agent_state", nullptr},
           {"error", {{"kind", "tool"}, {"name", "UnpicklingError"}, {"message", "pickle data was truncated"}}}}, "");
  decoded("execute pickle whose decoding failed", nullptr, "the decoder's run ended: timeout");
  auto nonce_frame = [&](const json& payload) { return make_nonce_frame(nonce, payload).value(); };
  add("run_tool success", true, [&](auto& r) {
    r.stdout_data = "printed\n" + nonce_frame({{"results", 5}, {"agent_state", nullptr}});
  });
  add("run_tool agent_state", true, [&](auto& r) {
    r.stdout_data = nonce_frame({{"results", "ok"}, {"agent_state", {{"memory", {{"blocks", json::array()}}}}}});
  });
  add("run_tool tool error", true, [&](auto& r) {
    r.exit_code = 1;
    r.stderr_data = traceback;
    r.stdout_data = nonce_frame({{"results", nullptr}, {"agent_state", nullptr},
                                 {"error", {{"kind", "tool"}, {"name", "ZeroDivisionError"}, {"message", "division by zero"}}}});
  });
  add("run_tool request error", true, [&](auto& r) {
    r.exit_code = 2;
    r.stdout_data = nonce_frame({{"results", nullptr}, {"agent_state", nullptr},
                                 {"error", {{"kind", "request"}, {"name", "NameError"}, {"message", "name 'f' is not defined"}}}});
  });
  add("run_tool duplicated frame", true, [&](auto& r) {
    std::string f = nonce_frame({{"results", 1}, {"agent_state", nullptr}});
    r.stdout_data = f + f;
  });
  add("run_tool forged frame only", true, [&](auto& r) {
    r.exit_code = 1;
    r.stdout_data = make_nonce_frame(std::string(32, 'b'), json{{"results", 1}, {"agent_state", nullptr}}).value();
  });
  // A local runner's result channel.
  auto channel = [&](const std::string& what, std::optional<bool> declared, const std::string& result, int exit_code,
                     std::uint64_t total = 0) {
    add(what, true, [&](auto& r) {
      r.exit_code = exit_code;
      r.stdout_data = "printed\n";
      if (exit_code == 1) r.stderr_data = traceback;
    });
    Shaping& s = out.back();
    s.ctx.channel = true;
    s.ctx.nonce.clear();
    s.ctx.result_cap = 1 << 20;
    core::ChannelOutcome& c = s.channel.emplace();
    c.declared = declared;
    c.result = result;
    c.result_total = total ? total : result.size();
  };
  channel("run_tool channel success", false, R"({"results":5,"agent_state":null})", 0);
  channel("run_tool channel agent_state", true, R"({"results":"ok","agent_state":{"memory":{"blocks":[]}}})", 0);
  channel("run_tool channel tool error", false,
          R"({"results":null,"agent_state":null,"error":{"kind":"tool","name":"ZeroDivisionError","message":"division by zero","raised":true}})",
          1);
  channel("run_tool channel undeclared agent_state", false, R"({"results":1,"agent_state":{"x":1}})", 0);
  channel("run_tool channel result too large", false, std::string(16, ' '), 0, 5u << 20);
  channel("run_tool channel no declaration", std::nullopt, "", 3);
  channel("run_tool channel status 0 without a result", true, "", 0);
  // A local TypeScript run, both modes: the same channel, its own framing.
  for (bool tool_mode : {true, false}) {
    channel(std::string(tool_mode ? "run_tool" : "execute") + " typescript success", false,
            R"({"results":{"a":1},"agent_state":null})", 0);
    out.back().ctx.typescript = true;
    out.back().ctx.tool_mode = tool_mode;
    channel(std::string(tool_mode ? "run_tool" : "execute") + " typescript error", false,
            R"({"results":null,"agent_state":null,"error":{"kind":"tool","name":"TypeError","message":"x"}})", 1);
    out.back().ctx.typescript = true;
    out.back().ctx.tool_mode = tool_mode;
  }
  return out;
}

// The record and result exactly as Server::run_local assembles them.
json server_result(const Shaping& s) {
  auto shaped = core::shape_tool_result(s.ctx, s.run, s.decoded ? &*s.decoded : nullptr, s.channel ? &*s.channel : nullptr);
  json record = core::run_record_json(s.run);
  record["policy"] = "default";
  record["policy_fingerprint"] = "sha256:" + std::string(64, '0');
  record["backend"] = "local";
  for (auto it = shaped.extra.begin(); it != shaped.extra.end(); ++it) record[it.key()] = it.value();
  json result = shaped.result;
  result["record"] = record;
  return result;
}

// What the local backend has decoded is what the shaping answers from.
TEST(PickleDecoding, OnlyAPayloadTheShapingWouldReadIsDecoded) {
  core::ShapeContext ctx;
  ctx.tool_name = "f";
  isolate::RunResult run;
  run.reason = isolate::EndReason::Exited;
  const std::string pickle("\x80\x04\x95pickle", 9);
  run.stdout_data = "before\n" + legacy_frame(pickle);
  auto payload = core::pickle_payload_to_decode(ctx, run);
  ASSERT_TRUE(payload.has_value());
  EXPECT_EQ(*payload, b64encode(pickle));
  // Not for JSON payloads, tool mode, a JSON generator's script, output
  // without a frame, or runs shaped without their output.
  isolate::RunResult json_run = run;
  json_run.stdout_data = legacy_frame(R"({"results": 1})");
  EXPECT_FALSE(core::pickle_payload_to_decode(ctx, json_run));
  core::ShapeContext other = ctx;
  other.json_result_script = true;
  EXPECT_FALSE(core::pickle_payload_to_decode(other, run));
  other = ctx;
  other.tool_mode = true;
  EXPECT_FALSE(core::pickle_payload_to_decode(other, run));
  isolate::RunResult plain = run;
  plain.stdout_data = "no frame\n";
  EXPECT_FALSE(core::pickle_payload_to_decode(ctx, plain));
  isolate::RunResult timed_out = run;
  timed_out.reason = isolate::EndReason::Timeout;
  EXPECT_FALSE(core::pickle_payload_to_decode(ctx, timed_out));
  // Letta's current parser fails on stderr that is not UTF-8 first.
  other = ctx;
  other.generation = letta::ScriptGeneration::kCurrent;
  isolate::RunResult bad_stderr = run;
  bad_stderr.stdout_data = binary_frame(pickle);
  ASSERT_TRUE(core::pickle_payload_to_decode(other, bad_stderr));
  bad_stderr.stderr_data = "\xff";
  EXPECT_FALSE(core::pickle_payload_to_decode(other, bad_stderr));
}

TEST(SchemaResponses, ResultsOfEveryKindValidate) {
  const json& rec_props = schemas().doc("run-record.json")["properties"];
  const json& ter_props = schemas().doc("tool-execution-result.json")["properties"];
  std::set<std::string> reasons_seen, framings_seen;
  for (const auto& s : shapings()) {
    SCOPED_TRACE(s.what);
    json result = server_result(s);
    json line = json::parse(encode_ok("req-9", "result", result));
    EXPECT_TRUE(schemas().valid(line, "response.json")) << joined(schemas().validate(line, "response.json"));
    EXPECT_TRUE(schemas().valid(line, "response-result.json")) << joined(schemas().validate(line, "response-result.json"));
    EXPECT_FALSE(schemas().valid(line, "response-error.json"));
    // Every field is declared, not merely tolerated.
    for (const auto& k : keys_of(result)) EXPECT_TRUE(k == "record" || ter_props.contains(k)) << "result." << k;
    for (const auto& k : keys_of(result["record"])) EXPECT_TRUE(rec_props.contains(k)) << "record." << k;
    reasons_seen.insert(result["record"]["end_reason"]);
    if (result["record"].contains("framing")) framings_seen.insert(result["record"]["framing"]);
  }
  EXPECT_EQ(reasons_seen, end_reason_names());
  // Every framing value is produced here or written literally by the
  // shaping of an E2B cell.
  for (const auto& f : captures(source_file("daemon/frontend/letta/result.cc"), R"(extra\[\"framing\"\]\s*=\s*\"([a-z0-9-]+)\")"))
    framings_seen.insert(f);
  EXPECT_EQ(framings_seen, strings_of(rec_props["framing"]["enum"]));
}

// ---------------------------------------------------------------------------
// PROTOCOL.md
// ---------------------------------------------------------------------------

std::string protocol_md() { return read_text(std::string(TSB_SOURCE_DIR) + "/protocol/PROTOCOL.md"); }

TEST(ProtocolDoc, NamesEveryFieldErrorCodeAndEndReason) {
  std::string md = protocol_md();
  std::set<std::string> names;
  for (const auto& [name, d] : schemas().docs())
    walk(d, "", [&](const json& s, const std::string&) {
      if (s.contains("properties"))
        for (auto it = s["properties"].begin(); it != s["properties"].end(); ++it) names.insert(it.key());
    });
  for (const auto& n : names) EXPECT_NE(md.find("`" + n + "`"), std::string::npos) << "PROTOCOL.md does not name `" << n << "`";
  for (const auto& r : all_end_reason_names()) EXPECT_NE(md.find("`" + r + "`"), std::string::npos) << r;
  for (const auto& c : strings_of(schemas().doc("response-error.json")["properties"]["error"]["properties"]["code"]["enum"]))
    EXPECT_NE(md.find("`" + c + "`"), std::string::npos) << c;
}

// Every JSON object line in a code block that carries "v" is a protocol
// message: responses (they have "ok") must validate; requests must get the
// same verdict from the decoder and the schema (the error examples are
// refused by both).
TEST(ProtocolDoc, ExampleLinesValidate) {
  std::istringstream in(protocol_md());
  std::string line;
  bool in_code = false;
  int requests = 0, responses = 0;
  while (std::getline(in, line)) {
    if (line.rfind("```", 0) == 0) {
      in_code = !in_code;
      continue;
    }
    // Example transcripts mark lines sent with "\u2192 " and lines received with "\u2190 ".
    for (const char* mark : {"\u2192 ", "\u2190 "})
      if (line.rfind(mark, 0) == 0) line = line.substr(std::string(mark).size());
    if (!in_code || line.rfind("{", 0) != 0) continue;
    json j = json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("v")) continue;
    if (j.contains("ok")) {
      ++responses;
      EXPECT_TRUE(schemas().valid(j, "response.json")) << line.substr(0, 200) << "\n" << joined(schemas().validate(j, "response.json"));
    } else {
      ++requests;
      std::string why;
      bool dec = accepted(j, &why);
      EXPECT_EQ(dec, schemas().valid(j, "request.json")) << line.substr(0, 200) << "\n" << why;
    }
  }
  EXPECT_GE(requests, 8);
  EXPECT_GE(responses, 8);
}

}  // namespace
}  // namespace tsb::protocol
