// daemon/frontend/letta/pyjson: byte-exact agreement with CPython's json.dumps, repr(float)
// and bytes.decode("utf-8", "replace").
//
// Fixed vectors run anywhere. The cross-checks run /usr/bin/python3 on the
// same inputs and compare byte for byte; without the interpreter they skip,
// unless TOOLSANDBOXD_TESTS_MUST_RUN contains "python".
#include "daemon/frontend/letta/pyjson.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "tests/unit/python_reference.h"
#include "protocol/json_scan.h"

namespace tsb::letta {
namespace {

using ojson = nlohmann::ordered_json;

// ---------------------------------------------------------------------------
// Running the reference interpreter
// ---------------------------------------------------------------------------

using ::tsb::testing::kPython;
using ::tsb::testing::TempFile;

// Run `script` under /usr/bin/python3 -I with the path of a file holding
// `input` as argv[1]; return its stdout split into lines.
std::vector<std::string> run_python(const std::string& script, const std::string& input) {
  TempFile s(script);
  TempFile in(input);
  const std::string cmd = std::string(kPython) + " -I " + s.path() + " " + in.path();
  FILE* p = popen(cmd.c_str(), "r");
  EXPECT_NE(p, nullptr);
  if (p == nullptr) return {};
  std::string out;
  char buf[4096];
  std::size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  EXPECT_EQ(pclose(p), 0) << "python failed: " << cmd;
  std::vector<std::string> lines;
  std::istringstream is(out);
  for (std::string line; std::getline(is, line);) lines.push_back(line);
  return lines;
}

std::string to_hex(std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string o;
  for (unsigned char c : s) {
    o += kHex[c >> 4];
    o += kHex[c & 15];
  }
  return o;
}

std::string utf8(char32_t cp) {
  std::string o;
  if (cp < 0x80) {
    o += static_cast<char>(cp);
  } else if (cp < 0x800) {
    o += static_cast<char>(0xC0 | (cp >> 6));
    o += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    o += static_cast<char>(0xE0 | (cp >> 12));
    o += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    o += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    o += static_cast<char>(0xF0 | (cp >> 18));
    o += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    o += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    o += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return o;
}

std::string dumps_sorted(const ojson& j) {
  auto r = dumps_compact_sorted(j);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
  return r.ok() ? *r : std::string("<error>");
}

std::string dumps_default(const ojson& j) {
  auto r = dumps_python_default(j);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
  return r.ok() ? *r : std::string("<error>");
}

// ---------------------------------------------------------------------------
// Random JSON values rich in the cases that differ between encoders
// ---------------------------------------------------------------------------

class JsonGen {
 public:
  explicit JsonGen(std::uint32_t seed) : rng_(seed) {}

  std::string text() {
    static constexpr char32_t kSpecial[] = {
        0x00, 0x01, 0x08, 0x09, 0x0A, 0x0C, 0x0D, 0x1F, 0x20, '"', '\\', '/', 0x7E, 0x7F, 0x80, 0x9F,
        0xA0, 0xE9, 0xFF, 0x100, 0x7FF, 0x800, 0x2028, 0x2029, 0xD7FF, 0xE000, 0xFEFF, 0xFFFD, 0xFFFF,
        0x10000, 0x1F600, 0x10FFFF};
    std::string s;
    const int len = pick(0, 8);
    for (int i = 0; i < len; ++i) {
      switch (pick(0, 4)) {
        case 0: s += utf8(kSpecial[pick(0, std::size(kSpecial) - 1)]); break;
        case 1: s += static_cast<char>(pick(0x20, 0x7E)); break;
        case 2: s += utf8(static_cast<char32_t>(pick(0x80, 0xD7FF))); break;
        case 3: s += utf8(static_cast<char32_t>(pick(0xE000, 0xFFFF))); break;
        default: s += utf8(static_cast<char32_t>(pick(0x10000, 0x10FFFF))); break;
      }
    }
    return s;
  }

  double finite_double() {
    switch (pick(0, 3)) {
      case 0: {
        std::uint64_t bits;
        double d;
        do {
          bits = rng_();
          std::memcpy(&d, &bits, sizeof d);
        } while (!std::isfinite(d));
        return d;
      }
      case 1: return static_cast<double>(pick(-1000, 1000)) / 8.0;
      case 2: return std::pow(10.0, pick(-20, 25)) * (pick(0, 1) ? 1 : -1);
      default: return static_cast<double>(pick(0, 1000000)) / 1000.0;
    }
  }

  ojson value(int depth) {
    const int kind = pick(0, depth >= 4 ? 6 : 8);
    switch (kind) {
      case 0: return nullptr;
      case 1: return pick(0, 1) == 1;
      case 2: return static_cast<std::int64_t>(rng_());
      case 3: return static_cast<std::uint64_t>(rng_()) | (std::uint64_t{1} << 63);
      case 4: return pick(-5, 5);
      case 5: return finite_double();
      case 6: return text();
      case 7: {
        ojson a = ojson::array();
        const int n = pick(0, 4);
        for (int i = 0; i < n; ++i) a.push_back(value(depth + 1));
        return a;
      }
      default: {
        ojson o = ojson::object();
        const int n = pick(0, 5);
        for (int i = 0; i < n; ++i) o[text()] = value(depth + 1);
        return o;
      }
    }
  }

 private:
  int pick(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  int pick(int lo, std::size_t hi) { return pick(lo, static_cast<int>(hi)); }
  std::mt19937_64 rng_;
};

// ---------------------------------------------------------------------------
// Fixed vectors
// ---------------------------------------------------------------------------

TEST(PyJson, ReferenceDocumentExample) {
  // Python's json.dumps(sort_keys=True, separators=(",", ":")), as Letta's
  // SandboxConfig.fingerprint() calls it: {"b":"é\x7f/\n"} -> {"b":"\u00e9\u007f/\n"}
  ojson j = {{"b", "\xc3\xa9\x7f/\n"}};
  EXPECT_EQ(dumps_sorted(j), R"({"b":"\u00e9\u007f/\n"})");
}

TEST(PyJson, StringEscapes) {
  ojson j = "\"\\\b\f\n\r\t\x01\x1f /~\x7f";
  EXPECT_EQ(dumps_sorted(j), R"("\"\\\b\f\n\r\t\u0001\u001f /~\u007f")");
  EXPECT_EQ(dumps_sorted(std::string("a\0b", 3)), R"("a\u0000b")");
  // Astral characters become surrogate pairs, lowercase hex.
  EXPECT_EQ(dumps_sorted(utf8(0x1F600)), R"("\ud83d\ude00")");
  EXPECT_EQ(dumps_sorted(utf8(0x10FFFF)), R"("\udbff\udfff")");
  EXPECT_EQ(dumps_sorted(utf8(0xFEFF) + utf8(0xABCD)), R"("\ufeff\uabcd")");
}

TEST(PyJson, KeysSortByCodePointNotUtf16) {
  // Code point order: U+E000 < U+FFFF < U+1F600. UTF-16 order would put the
  // astral key (0xD83D...) first.
  ojson j = ojson::object();
  j[utf8(0x1F600)] = 1;
  j[utf8(0xFFFF)] = 2;
  j[utf8(0xE000)] = 3;
  j["z"] = 4;
  j["A"] = 5;
  j[""] = 6;
  EXPECT_EQ(dumps_sorted(j), R"({"":6,"A":5,"z":4,"\ue000":3,"\uffff":2,"\ud83d\ude00":1})");
  // Default mode keeps insertion order.
  EXPECT_EQ(dumps_default(j), R"({"\ud83d\ude00": 1, "\uffff": 2, "\ue000": 3, "z": 4, "A": 5, "": 6})");
}

TEST(PyJson, NestedSortingAndSeparators) {
  ojson j = ojson::parse(R"({"b":{"y":[1,{"d":null,"c":true}],"x":false},"a":[]})");
  EXPECT_EQ(dumps_sorted(j), R"({"a":[],"b":{"x":false,"y":[1,{"c":true,"d":null}]}})");
  EXPECT_EQ(dumps_default(j), R"({"b": {"y": [1, {"d": null, "c": true}], "x": false}, "a": []})");
  EXPECT_EQ(dumps_default(ojson::object()), "{}");
  EXPECT_EQ(dumps_default(ojson::array()), "[]");
  // A plain nlohmann::json keeps its keys sorted, so both modes sort.
  nlohmann::json plain = {{"b", 1}, {"a", 2}};
  EXPECT_EQ(*dumps_python_default(plain), R"({"a": 2, "b": 1})");
}

TEST(PyJson, Integers) {
  EXPECT_EQ(dumps_sorted(std::numeric_limits<std::int64_t>::min()), "-9223372036854775808");
  EXPECT_EQ(dumps_sorted(std::numeric_limits<std::uint64_t>::max()), "18446744073709551615");
  EXPECT_EQ(dumps_sorted(0), "0");
  EXPECT_EQ(dumps_sorted(true), "true");
  EXPECT_EQ(dumps_sorted(nullptr), "null");
}

TEST(PyJson, FloatRepr) {
  const std::pair<double, const char*> cases[] = {
      {1.0, "1.0"},
      {-0.0, "-0.0"},
      {0.0, "0.0"},
      {0.1, "0.1"},
      {1e-05, "1e-05"},
      {0.0001, "0.0001"},
      {1e16, "1e+16"},
      {1e15, "1000000000000000.0"},
      {9999999999999998.0, "9999999999999998.0"},
      {1.5e16, "1.5e+16"},
      {123456789.125, "123456789.125"},
      {5e-324, "5e-324"},
      {1.7976931348623157e308, "1.7976931348623157e+308"},
      {2.2250738585072014e-308, "2.2250738585072014e-308"},
      {1e22, "1e+22"},
      {1.2345678901234566e-7, "1.2345678901234566e-07"},
      {100.0, "100.0"},
      {0.30000000000000004, "0.30000000000000004"},
  };
  for (const auto& [d, want] : cases) EXPECT_EQ(python_float_repr(d), want) << want;
  EXPECT_EQ(python_float_repr(std::numeric_limits<double>::infinity()), "inf");
  EXPECT_EQ(python_float_repr(std::nan("")), "nan");
  // json.dumps spells the non-finite values like JavaScript.
  ojson a = {std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity(),
             std::nan(""), -std::nan(""), 2.5};
  EXPECT_EQ(dumps_sorted(a), "[Infinity,-Infinity,NaN,NaN,2.5]");
}

TEST(PyJson, RejectsWhatPythonCouldNotHold) {
  EXPECT_FALSE(dumps_compact_sorted(ojson(std::string("\xff"))).ok());
  EXPECT_FALSE(dumps_compact_sorted(ojson(std::string("\xed\xa0\x80"))).ok());  // encoded surrogate
  EXPECT_FALSE(dumps_compact_sorted(ojson(std::string("\xc0\xaf"))).ok());      // overlong '/'
  ojson bad_key = ojson::object();
  bad_key[std::string("k\xfe")] = 1;
  auto r = dumps_compact_sorted(bad_key);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("object key"), std::string::npos) << r.error().message;
  EXPECT_FALSE(dumps_compact_sorted(ojson::binary({1, 2, 3})).ok());

  ojson deep = 1;
  for (int i = 0; i < kMaxDumpDepth + 1; ++i) deep = ojson::array({deep});
  EXPECT_FALSE(dumps_compact_sorted(deep).ok());
  ojson ok_deep = 1;
  for (int i = 0; i < 500; ++i) ok_deep = ojson::array({ok_deep});
  EXPECT_TRUE(dumps_compact_sorted(ok_deep).ok());
}

TEST(PyJson, Utf8TextFunctions) {
  EXPECT_EQ(utf8_prefix_bytes("h\xc3\xa9llo", 2), 3u);
  EXPECT_EQ(utf8_prefix_bytes("\xf0\x9f\x98\x80x", 1), 4u);
  EXPECT_EQ(utf8_prefix_bytes("abc", 10), 3u);
  EXPECT_EQ(utf8_prefix_bytes("abc", 0), 0u);
  auto r = utf8_decode_replace("a\xff" "b\xe2\x82" "c");
  EXPECT_TRUE(r.had_invalid);
  EXPECT_EQ(r.text, "a\xef\xbf\xbd" "b\xef\xbf\xbd" "c");
  EXPECT_FALSE(utf8_decode_replace("plain \xc3\xa9").had_invalid);
  EXPECT_TRUE(is_valid_utf8("\xf4\x8f\xbf\xbf"));
  EXPECT_FALSE(is_valid_utf8("\xf4\x90\x80\x80"));  // above U+10FFFF
}

// ---------------------------------------------------------------------------
// Cross-checks against CPython
// ---------------------------------------------------------------------------

constexpr const char* kDumpsScript = R"PY(
import json, sys
for h in json.load(open(sys.argv[1])):
    obj = json.loads(bytes.fromhex(h).decode("utf-8"))
    print(json.dumps(obj, sort_keys=True, separators=(",", ":")))
    print(json.dumps(obj))
)PY";

TEST(PyJsonVsCPython, TrickyDocumentsByteForByte) {
  TSB_REQUIRE_PYTHON();
  std::vector<std::string> docs = {
      R"({"b":"é\u007f/\n","a":1})",
      R"({"config":{"pip_requirements":[],"sandbox_dir":"/root/.letta/tool_execution_dir","use_venv":false,"venv_name":"venv"},"type":"local","organization_id":"org-1"})",
      R"([1.0, 1e-05, 1e+16, 0.1, -0.0, 1e300, 5e-324, 123456789012345678, -1, 18446744073709551615])",
      R"({"\ud83d\ude00":1,"\uffff":2,"\ue000":3,"\u00e9":4,"e":5,"E":6,"":7})",
      R"({"nested":{"z":{"b":[{"y":1,"x":2}],"a":null}},"list":[[],{},[[]]]})",
      R"(["\u0000\u001f\u007f\u0080\u2028\u2029\ufeff", "tab\there", "q\"b\\s/"])",
      R"({"x":0.30000000000000004,"y":1.7976931348623157e308,"z":2.2250738585072014e-308})",
      R"("\udbff\udfff")",
      R"(true)",
      R"(null)",
  };
  JsonGen gen(20240813);
  for (int i = 0; i < 300; ++i) docs.push_back(gen.value(0).dump(-1, ' ', false));

  nlohmann::json hexes = nlohmann::json::array();
  for (const auto& d : docs) hexes.push_back(to_hex(d));
  const auto lines = run_python(kDumpsScript, hexes.dump());
  ASSERT_EQ(lines.size(), 2 * docs.size());
  for (std::size_t i = 0; i < docs.size(); ++i) {
    const ojson j = ojson::parse(docs[i]);
    EXPECT_EQ(dumps_sorted(j), lines[2 * i]) << "document: " << docs[i];
    EXPECT_EQ(dumps_default(j), lines[2 * i + 1]) << "document: " << docs[i];
  }
}

constexpr const char* kFloatScript = R"PY(
import json, struct, sys
for h in json.load(open(sys.argv[1])):
    print(repr(struct.unpack("<d", bytes.fromhex(h))[0]))
)PY";

TEST(PyJsonVsCPython, FloatReprByBitPattern) {
  TSB_REQUIRE_PYTHON();
  std::vector<double> values = {0.0, -0.0, 1.0, 0.1, 1e-5, 1e-4, 9.999999999999999e-05, 1e16, 1e15,
                                9999999999999998.0, 5e-324, 2.225073858507201e-308, 1.7976931348623157e308,
                                std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity(),
                                std::nan("")};
  std::mt19937_64 rng(42);
  for (int i = 0; i < 3000; ++i) {
    const std::uint64_t bits = rng();
    double d;
    std::memcpy(&d, &bits, sizeof d);
    if (!std::isnan(d)) values.push_back(d);
  }
  for (int e = -330; e <= 310; ++e) {
    values.push_back(std::pow(10.0, e));
    values.push_back(std::nextafter(std::pow(10.0, e), 0.0));
  }
  nlohmann::json hexes = nlohmann::json::array();
  for (double d : values) {
    std::string raw(sizeof d, '\0');
    std::memcpy(raw.data(), &d, sizeof d);  // x86-64 and arm64 are little-endian, as "<d" says
    hexes.push_back(to_hex(raw));
  }
  const auto lines = run_python(kFloatScript, hexes.dump());
  ASSERT_EQ(lines.size(), values.size());
  for (std::size_t i = 0; i < values.size(); ++i) {
    EXPECT_EQ(python_float_repr(values[i]), lines[i]) << "bits " << hexes[i].get<std::string>();
  }
}

constexpr const char* kDecodeScript = R"PY(
import json, sys
for h in json.load(open(sys.argv[1])):
    print(bytes.fromhex(h).decode("utf-8", "replace").encode("utf-8").hex())
)PY";

TEST(PyJsonVsCPython, Utf8DecodeReplace) {
  TSB_REQUIRE_PYTHON();
  std::vector<std::string> inputs = {"", "abc", "\xff", "\xc3", "\xc3\xa9", "\xe0\x80\x80", "\xe0\xa0",
                                     "\xed\xa0\x80", "\xed\x9f\xbf", "\xf0\x80\x80\x80", "\xf0\x90\x80",
                                     "\xf4\x90\x80\x80", "\xf5\x80", "\x80\x80", "\xc0\xaf", "\xe2\x82\xac\xe2\x82"};
  const unsigned char interesting[] = {0x00, 0x41, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xC1, 0xC2,
                                       0xDF, 0xE0, 0xE1, 0xEC, 0xED, 0xEE, 0xEF, 0xF0, 0xF1, 0xF3, 0xF4, 0xF5, 0xFF};
  std::mt19937 rng(7);
  for (int i = 0; i < 2000; ++i) {
    std::string s;
    const int len = static_cast<int>(rng() % 8);
    for (int k = 0; k < len; ++k) s += static_cast<char>(interesting[rng() % std::size(interesting)]);
    inputs.push_back(s);
  }
  nlohmann::json hexes = nlohmann::json::array();
  for (const auto& s : inputs) hexes.push_back(to_hex(s));
  const auto lines = run_python(kDecodeScript, hexes.dump());
  ASSERT_EQ(lines.size(), inputs.size());
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const auto r = utf8_decode_replace(inputs[i]);
    EXPECT_EQ(to_hex(r.text), lines[i]) << "input " << to_hex(inputs[i]);
    EXPECT_EQ(r.had_invalid, !is_valid_utf8(inputs[i]));
  }
}

TEST(PyJson, PythonJsonAsStrictQuotesOnlyNonFiniteTokens) {
  EXPECT_EQ(python_json_as_strict("[NaN, Infinity,-Infinity ,{\"NaN\": \"Infinity\"}]"),
            "[\"NaN\", \"Infinity\",\"-Infinity\" ,{\"NaN\": \"Infinity\"}]");
  for (const char* same : {"123456789012345678901234567890", "\"\\udcff\"", "{\"a\":1,\"a\":2}", "-0.0", "[]"}) {
    SCOPED_TRACE(same);
    EXPECT_EQ(python_json_as_strict(same), same);
  }
  const std::string strict = python_json_as_strict("{\"x\":[NaN,1e400,-Infinity]}");
  EXPECT_TRUE(std::holds_alternative<protocol::JsonScanned>(protocol::scan_json(strict))) << strict;
  EXPECT_EQ(strict, "{\"x\":[\"NaN\",1e400,\"-Infinity\"]}");
}

}  // namespace
}  // namespace tsb::letta
