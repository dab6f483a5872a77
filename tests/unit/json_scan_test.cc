// protocol/json_scan: the strict JSON validator request lines go through.
// Every class of malformed input, duplicate keys at any depth and in any
// spelling, the slices it hands back, and a differential check against
// nlohmann::json's strict parser on random documents and random mutations
// of them (the two must agree except where json_scan.h documents why not).
#include "protocol/json_scan.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <random>
#include <set>
#include <string>
#include <vector>

namespace tsb::protocol {
namespace {

using json = nlohmann::json;

bool valid(std::string_view text, const JsonScanOptions& o = {}) {
  return std::holds_alternative<JsonScanned>(scan_json(text, o));
}

JsonScanError error_of(std::string_view text, const JsonScanOptions& o = {}) {
  auto r = scan_json(text, o);
  EXPECT_TRUE(std::holds_alternative<JsonScanError>(r)) << "accepted: " << ::testing::PrintToString(std::string(text));
  if (auto* e = std::get_if<JsonScanError>(&r)) return *e;
  return JsonScanError{JsonScanFailure::Syntax, 0, ""};
}

// ---------------------------------------------------------------------------
// Grammar
// ---------------------------------------------------------------------------

TEST(JsonScan, AcceptsRfc8259) {
  for (const char* ok : {"{}", "[]", "0", "-0", "1", "-1", "0.5", "-0.0e0", "1E+2", "1e-2", "1e400", "1e-400",
                         "123456789012345678901234567890", "true", "false", "null", "\"\"", "\"a\"",
                         " \t\r\n{ \"a\" : [ 1 , 2 ] , \"b\" : { } } \n", "[[[]]]", "{\"\":0}",
                         "\"\\\" \\\\ \\/ \\b \\f \\n \\r \\t \\u0000 \\u00e9 \\uFFFF \\ud83d\\ude00\"",
                         "\"\x7f\"", "\"\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \xf4\x8f\xbf\xbf \xef\xbf\xbf\"",
                         "[1,\"2\",[3],{\"4\":5},true,false,null]"}) {
    SCOPED_TRACE(ok);
    EXPECT_TRUE(valid(ok));
  }
}

TEST(JsonScan, RefusesEveryMalformedClass) {
  struct Bad {
    const char* what;
    std::string text;
  };
  const std::vector<Bad> cases = {
      {"empty", ""},
      {"only whitespace", " \n\t "},
      {"form feed is not whitespace", "\f1"},
      {"vertical tab is not whitespace", "\v1"},
      {"trailing comma in an array", "[1,]"},
      {"trailing comma in an object", "{\"a\":1,}"},
      {"leading comma", "[,1]"},
      {"double comma", "[1,,2]"},
      {"missing comma", "[1 2]"},
      {"missing colon", "{\"a\" 1}"},
      {"missing value", "{\"a\":}"},
      {"non-string key", "{1:1}"},
      {"single-quoted key", "{'a':1}"},
      {"single-quoted string", "'a'"},
      {"bare word key", "{a:1}"},
      {"line comment", "[1]//x"},
      {"block comment", "/*x*/[1]"},
      {"comment inside", "[1/*x*/]"},
      {"leading zero", "01"},
      {"negative leading zero", "-01"},
      {"leading plus", "+1"},
      {"leading dot", ".5"},
      {"trailing dot", "1."},
      {"dot before exponent", "1.e5"},
      {"empty exponent", "1e"},
      {"signed empty exponent", "1e+"},
      {"lone minus", "-"},
      {"hex", "0x10"},
      {"NaN", "NaN"},
      {"Infinity", "Infinity"},
      {"negative Infinity", "-Infinity"},
      {"capitalised literal", "True"},
      {"truncated literal", "tru"},
      {"literal with a tail", "nullx"},
      {"unterminated string", "\"abc"},
      {"unterminated array", "[1,2"},
      {"unterminated object", "{\"a\":1"},
      {"unopened close", "]"},
      {"mismatched close", "[1}"},
      {"two values", "1 2"},
      {"two objects", "{}{}"},
      {"trailing garbage", "{} x"},
      {"invalid escape", "\"\\x\""},
      {"escaped single quote", "\"\\'\""},
      {"short \\u escape", "\"\\u12\""},
      {"non-hex \\u escape", "\"\\u00G0\""},
      {"backslash at the end", "\"\\"},
      {"lone high surrogate", "\"\\ud800\""},
      {"high surrogate then text", "\"\\ud800x\""},
      {"high surrogate then non-low escape", "\"\\ud800\\u0041\""},
      {"two high surrogates", "\"\\ud800\\ud800\""},
      {"lone low surrogate", "\"\\udc00\""},
      {"reversed pair", "\"\\ude00\\ud83d\""},
      {"raw NUL in a string", std::string("\"a\0b\"", 5)},
      {"raw newline in a string", "\"a\nb\""},
      {"raw tab in a string", "\"a\tb\""},
      {"raw 0x1f in a string", "\"\x1f\""},
      {"NUL after the value", std::string("{}\0", 3)},
      {"stray continuation byte", "\"\x80\""},
      {"truncated 2-byte sequence", "\"\xc3\""},
      {"truncated 3-byte sequence", "\"\xe2\x82\""},
      {"truncated 4-byte sequence", "\"\xf0\x9f\x98\""},
      {"overlong 2-byte (C0)", "\"\xc0\xaf\""},
      {"overlong 2-byte (C1)", "\"\xc1\xbf\""},
      {"overlong 3-byte", "\"\xe0\x80\xaf\""},
      {"overlong 4-byte", "\"\xf0\x80\x80\xaf\""},
      {"UTF-8 encoded high surrogate", "\"\xed\xa0\x80\""},
      {"UTF-8 encoded low surrogate", "\"\xed\xbf\xbf\""},
      {"above U+10FFFF (F4 90)", "\"\xf4\x90\x80\x80\""},
      {"F5 lead byte", "\"\xf5\x80\x80\x80\""},
      {"FF byte", "\"\xff\""},
      {"lead byte then ASCII", "\"\xc3x\""},
      {"UTF-8 outside a string", "[\xc3\xa9]"},
      {"invalid UTF-8 in a key", "{\"\xff\":1}"},
      {"byte order mark when not allowed", "\xef\xbb\xbf{}"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    JsonScanError e = error_of(c.text);
    EXPECT_EQ(e.failure, JsonScanFailure::Syntax);
    EXPECT_LE(e.offset, c.text.size());
    EXPECT_FALSE(e.what.empty());
  }
}

TEST(JsonScan, PythonValuesOnlyWhenAsked) {
  JsonScanOptions py;
  py.python_values = true;
  for (const char* text : {"NaN", "Infinity", "-Infinity", "[NaN,-Infinity,{\"a\":Infinity}]", "\"\\udcff\"",
                           "\"\\ud800\"", "\"\\ud800x\"", "\"\\ud800\\u0041\"", "{\"\\udc00\":1}",
                           "\"\\ud83d\\ude00\""}) {
    SCOPED_TRACE(text);
    EXPECT_TRUE(valid(text, py));
    if (std::string_view(text) != "\"\\ud83d\\ude00\"") EXPECT_FALSE(valid(text));
  }
  // Still not Python's whole superset, nor other spellings.
  for (const char* text : {"nan", "inf", "-NaN", "+Infinity", "Infinit", "NaNa", "[NaN,]", "-", "--Infinity"}) {
    SCOPED_TRACE(text);
    EXPECT_FALSE(valid(text, py));
  }
  // The tokens reach on_number with their spelling.
  std::vector<std::string> numbers;
  py.on_number = [&](std::string_view t) { numbers.emplace_back(t); };
  EXPECT_TRUE(valid("[1,NaN,-Infinity,{\"x\":Infinity},-2.5e3]", py));
  EXPECT_EQ(numbers, (std::vector<std::string>{"1", "NaN", "-Infinity", "Infinity", "-2.5e3"}));
  // Duplicate detection sees a lone surrogate key as its own key.
  JsonScanOptions dup;
  dup.python_values = true;
  EXPECT_FALSE(valid("{\"\\udc00\":1,\"\\udc00\":2}", dup));
  EXPECT_TRUE(valid("{\"\\udc00\":1,\"\\udc01\":2}", dup));
}

TEST(JsonWithoutWhitespace, DropsOnlyWhatLiesBetweenTokens) {
  EXPECT_EQ(json_without_whitespace("{\n  \"a b\": [1,\t2 ]\r\n}"), "{\"a b\":[1,2]}");
  EXPECT_EQ(json_without_whitespace(R"([" \" \\", "\n" , NaN])"), R"([" \" \\","\n",NaN])");
  EXPECT_EQ(json_without_whitespace("7"), "7");
}

TEST(JsonScan, ByteOrderMarkOnlyWhenAllowedAndOnlyFirst) {
  JsonScanOptions o;
  o.allow_bom = true;
  EXPECT_TRUE(valid("\xef\xbb\xbf{}", o));
  EXPECT_TRUE(valid("\xef\xbb\xbf 1", o));
  EXPECT_FALSE(valid(" \xef\xbb\xbf{}", o));
  EXPECT_FALSE(valid("\xef\xbb\xbf\xef\xbb\xbf{}", o));
  EXPECT_FALSE(valid("\xef\xbb", o));
  EXPECT_FALSE(valid("\xef\xbb\xbf", o));
}

TEST(JsonScan, ErrorOffsetPointsAtTheFault) {
  EXPECT_EQ(error_of("[1,]").offset, 3u);
  EXPECT_EQ(error_of("{\"a\":1} x").offset, 8u);
  EXPECT_EQ(error_of("\"ab\x01\"").offset, 3u);
}

TEST(JsonScan, NestingDepthIsBounded) {
  auto nest = [](int n) { return std::string(n, '[') + std::string(n, ']'); };
  EXPECT_TRUE(valid(nest(kMaxJsonNesting)));
  EXPECT_EQ(error_of(nest(kMaxJsonNesting + 1)).failure, JsonScanFailure::TooDeep);
  std::string objs;
  for (int i = 0; i < kMaxJsonNesting; ++i) objs += "{\"a\":";
  objs += "1" + std::string(kMaxJsonNesting, '}');
  EXPECT_TRUE(valid(objs));
  JsonScanOptions o;
  o.max_depth = 3;
  EXPECT_TRUE(valid("[[[]]]", o));
  EXPECT_EQ(error_of("[[[[]]]]", o).failure, JsonScanFailure::TooDeep);
  // Far beyond the limit: refused, no recursion, no crash.
  EXPECT_EQ(error_of(nest(1'000'000)).failure, JsonScanFailure::TooDeep);
  EXPECT_EQ(error_of(std::string(1'000'000, '[')).failure, JsonScanFailure::TooDeep);
}

// ---------------------------------------------------------------------------
// Duplicate keys
// ---------------------------------------------------------------------------

TEST(JsonScan, DuplicateKeysAtEveryDepth) {
  for (const char* dup : {
           R"({"a":1,"a":2})",
           R"({"a":1,"b":2,"a":3})",
           R"({"x":{"a":1,"a":2}})",
           R"([{"a":1,"a":2}])",
           R"({"x":[1,{"y":[{"a":{},"a":[]}]}]})",
           R"({"":1,"":2})",
           R"({"a":{"b":1},"a":{"b":1}})",
       }) {
    SCOPED_TRACE(dup);
    EXPECT_EQ(error_of(dup).failure, JsonScanFailure::DuplicateKey);
  }
  // The same key in sibling or nested objects is not a duplicate.
  EXPECT_TRUE(valid(R"({"a":{"a":{"a":1}},"b":[{"a":1},{"a":2}]})"));
  EXPECT_TRUE(valid(R"({"a":1,"A":2,"a ":3," a":4})"));
  // Without the option, duplicates pass.
  JsonScanOptions o;
  o.duplicate_keys = false;
  EXPECT_TRUE(valid(R"({"a":1,"a":2})", o));
}

TEST(JsonScan, DuplicateKeysAreComparedUnescaped) {
  for (const char* dup : {
           R"({"a":1,"\u0061":2})",
           R"({"\u0061":1,"a":2})",
           R"({"\u0061":1,"\u0061":2})",
           R"({"ab":1,"a\u0062":2})",
           "{\"\xc3\xa9\":1,\"\\u00e9\":2}",
           "{\"\\u00E9\":1,\"\\u00e9\":2}",
           "{\"\xf0\x9f\x98\x80\":1,\"\\ud83d\\ude00\":2}",
           R"({"/":1,"\/":2})",
           R"({"\n":1,"\u000a":2})",
           R"({"\"":1,"\u0022":2})",
           R"({"x":{"k\u0065y":1,"key":2}})",
       }) {
    SCOPED_TRACE(dup);
    EXPECT_EQ(error_of(dup).failure, JsonScanFailure::DuplicateKey);
  }
  EXPECT_TRUE(valid(R"({"a":1,"\u0062":2,"\u0061b":3})"));
}

TEST(JsonScan, SyntaxErrorWinsOverAnEarlierDuplicate) {
  EXPECT_EQ(error_of(R"({"a":1,"a":2)").failure, JsonScanFailure::Syntax);
  EXPECT_EQ(error_of(R"({"a":1,"a":2} x)").failure, JsonScanFailure::Syntax);
  EXPECT_EQ(error_of(R"({"x":{"a":1,"a":2},"y":[1,]})").failure, JsonScanFailure::Syntax);
}

TEST(JsonScan, ManyKeysInOneObject) {
  // A million distinct keys pass; one repeated key among them is found,
  // wherever it is. Time stays linear (this also runs under sanitizers).
  std::string obj = "{";
  const int n = 1'000'000;
  for (int i = 0; i < n; ++i) obj += "\"k" + std::to_string(i) + "\":0,";
  std::string ok = obj + "\"end\":0}";
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(valid(ok));
  auto ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::printf("    one object of %d keys (%zu bytes): %.0f ms\n", n, ok.size(), ms);
  EXPECT_EQ(error_of(obj + "\"k0\":1}").failure, JsonScanFailure::DuplicateKey);
  EXPECT_EQ(error_of(obj + "\"k999999\":1}").failure, JsonScanFailure::DuplicateKey);
  EXPECT_EQ(error_of(obj + "\"k\\u0035\":1}").failure, JsonScanFailure::DuplicateKey);  // "k5"
  // Every key the same: refused.
  std::string same = "{";
  for (int i = 0; i < 200'000; ++i) same += "\"a\":0,";
  EXPECT_EQ(error_of(same + "\"a\":0}").failure, JsonScanFailure::DuplicateKey);
}

TEST(JsonScan, ReportsTheLaterOccurrence) {
  std::string t = R"({"a":1,"b":2,"a":3})";
  JsonScanError e = error_of(t);
  EXPECT_EQ(e.failure, JsonScanFailure::DuplicateKey);
  EXPECT_EQ(e.offset, t.rfind("\"a\""));
}

// ---------------------------------------------------------------------------
// What the scanner hands back
// ---------------------------------------------------------------------------

TEST(JsonScan, ChildrenOfTheTopLevelObjectAreRawSlices) {
  std::vector<JsonChild> got;
  JsonScanOptions o;
  o.on_child = [&](const JsonChild& c) { got.push_back(c); };
  const std::string text =
      " { \"n\" : 123456789012345678901234567890 , \"s\":\"a\\u0062\" ,\"o\": { \"x\" : [ 1 ] } , \"\\u0061rr\":[ ],"
      "\"t\":true,\"f\":false,\"z\":null,\"neg\":-0,\"e\":1E+2 } ";
  auto r = scan_json(text, o);
  ASSERT_TRUE(std::holds_alternative<JsonScanned>(r));
  EXPECT_EQ(std::get<JsonScanned>(r).kind, JsonKind::Object);
  EXPECT_EQ(std::get<JsonScanned>(r).value, text.substr(1, text.size() - 2));
  ASSERT_EQ(got.size(), 9u);
  EXPECT_EQ(got[0].key, "\"n\"");
  EXPECT_EQ(got[0].value, "123456789012345678901234567890");
  EXPECT_EQ(got[0].kind, JsonKind::Number);
  EXPECT_EQ(got[1].value, "\"a\\u0062\"");
  EXPECT_EQ(got[1].kind, JsonKind::String);
  EXPECT_EQ(got[2].value, "{ \"x\" : [ 1 ] }");
  EXPECT_EQ(got[2].kind, JsonKind::Object);
  EXPECT_EQ(got[3].key, "\"\\u0061rr\"");
  EXPECT_EQ(got[3].value, "[ ]");
  EXPECT_EQ(got[3].kind, JsonKind::Array);
  EXPECT_EQ(got[4].kind, JsonKind::Boolean);
  EXPECT_EQ(got[5].value, "false");
  EXPECT_EQ(got[6].kind, JsonKind::Null);
  EXPECT_EQ(got[7].value, "-0");
  EXPECT_EQ(got[8].value, "1E+2");
}

TEST(JsonScan, ChildrenOfTheTopLevelArrayHaveNoKey) {
  std::vector<JsonChild> got;
  JsonScanOptions o;
  o.on_child = [&](const JsonChild& c) { got.push_back(c); };
  ASSERT_TRUE(valid(R"([ "a" , {"k":[1]},[],3 ])", o));
  ASSERT_EQ(got.size(), 4u);
  EXPECT_TRUE(got[0].key.empty());
  EXPECT_EQ(got[0].value, "\"a\"");
  EXPECT_EQ(got[1].value, R"({"k":[1]})");
  EXPECT_EQ(got[2].value, "[]");
  EXPECT_EQ(got[3].value, "3");
  got.clear();
  ASSERT_TRUE(valid("7", o));
  EXPECT_TRUE(got.empty());
}

TEST(JsonScan, EveryNumberIsReported) {
  std::vector<std::string> nums;
  JsonScanOptions o;
  o.on_number = [&](std::string_view n) { nums.emplace_back(n); };
  ASSERT_TRUE(valid(R"({"a":[1,-2.5,{"b":3e10}],"c":"4","d":-0})", o));
  EXPECT_EQ(nums, (std::vector<std::string>{"1", "-2.5", "3e10", "-0"}));
}

TEST(JsonStringValue, DecodesEscapes) {
  EXPECT_EQ(json_string_value("\"\""), "");
  EXPECT_EQ(json_string_value("\"plain \xc3\xa9\""), "plain \xc3\xa9");
  EXPECT_EQ(json_string_value(R"("\" \\ \/ \b \f \n \r \t")"), "\" \\ / \b \f \n \r \t");
  EXPECT_EQ(json_string_value(R"("\u0000")"), std::string(1, '\0'));
  EXPECT_EQ(json_string_value(R"("\u00e9\u20AC\ud83d\ude00\uFFFF")"), "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\xef\xbf\xbf");
  EXPECT_EQ(json_string_value(R"("a\u0062c")"), "abc");
}

TEST(JsonQuoted, ShortestEscapesAndRoundTrip) {
  const std::string all = [] {
    std::string s;
    for (int c = 0; c < 0x80; ++c) s += static_cast<char>(c);
    return s + "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80";
  }();
  std::string q;
  append_json_quoted(q, all);
  EXPECT_EQ(q.size(), json_quoted_size(all));
  ASSERT_TRUE(valid(q));
  EXPECT_EQ(json_string_value(q), all);
  EXPECT_EQ(json::parse(q).get<std::string>(), all);
  std::string t;
  append_json_quoted(t, "a\"b\\c\nd\x01/\x7f");
  EXPECT_EQ(t, "\"a\\\"b\\\\c\\nd\\u0001/\x7f\"");
  // Never longer than the token it was decoded from.
  for (const char* tok : {R"("\u0061\/\n\u0001\u00e9\ud83d\ude00")", "\"\xc3\xa9\"", R"("\"\\")"}) {
    EXPECT_LE(json_quoted_size(json_string_value(tok)), std::string_view(tok).size()) << tok;
  }
}

TEST(JsonNumbers, IntegersAnd64Bits) {
  EXPECT_TRUE(json_number_is_integer("-12"));
  EXPECT_FALSE(json_number_is_integer("1.0"));
  EXPECT_FALSE(json_number_is_integer("1e2"));
  EXPECT_FALSE(json_number_is_integer("1E2"));
  EXPECT_TRUE(json_integer_fits_64_bits("0"));
  EXPECT_TRUE(json_integer_fits_64_bits("18446744073709551615"));
  EXPECT_FALSE(json_integer_fits_64_bits("18446744073709551616"));
  EXPECT_FALSE(json_integer_fits_64_bits("99999999999999999999"));
  EXPECT_TRUE(json_integer_fits_64_bits("-9223372036854775808"));
  EXPECT_FALSE(json_integer_fits_64_bits("-9223372036854775809"));
  EXPECT_FALSE(json_integer_fits_64_bits("-18446744073709551615"));
  EXPECT_FALSE(json_integer_fits_64_bits("100000000000000000000000"));
}

// ---------------------------------------------------------------------------
// Differential check against nlohmann::json, and garbage
// ---------------------------------------------------------------------------

// nlohmann's verdict, and whether a disagreement is one json_scan.h
// documents: duplicate keys (nlohmann keeps the last), numbers beyond a
// double's range (nlohmann refuses them; JSON's grammar does not), and a
// raw NUL (nlohmann stops reading there).
struct Reference {
  bool accepts;
  bool duplicate = false;
  bool number_overflow = false;
};

Reference nlohmann_verdict(const std::string& text) {
  Reference r{};
  std::vector<std::set<std::string>> keys;
  auto cb = [&](int, json::parse_event_t ev, json& parsed) {
    if (ev == json::parse_event_t::object_start) keys.emplace_back();
    else if (ev == json::parse_event_t::object_end && !keys.empty()) keys.pop_back();
    else if (ev == json::parse_event_t::key && !keys.empty() && !keys.back().insert(parsed.get<std::string>()).second)
      r.duplicate = true;
    return true;
  };
  try {
    json parsed = json::parse(text, cb, true);
    (void)parsed;
    r.accepts = true;
  } catch (const json::out_of_range& e) {
    r.accepts = false;
    r.number_overflow = std::string(e.what()).find("number overflow") != std::string::npos;
  } catch (const json::exception&) {
    r.accepts = false;
  }
  return r;
}

class Generator {
 public:
  explicit Generator(std::uint32_t seed) : rng_(seed) {}

  std::string document() {
    std::string out;
    value(out, 0);
    return out;
  }
  std::string mutate(std::string s) {
    const int edits = 1 + static_cast<int>(pick(3));
    for (int i = 0; i < edits; ++i) {
      static const char kBytes[] = "{}[],:\"\\ -+.eE0123456789tfnulrsaxuU/\t\n\r\x01\x7f\xc3\xa9\xed\xa0\x80\xf4\x90\xff";
      const std::size_t at = s.empty() ? 0 : pick(s.size());
      const char b = kBytes[pick(sizeof kBytes - 1)];
      const std::size_t op = pick(4);
      switch (op) {
        case 0: if (!s.empty()) s[at] = b; break;
        case 1: s.insert(s.begin() + static_cast<long>(at), b); break;
        case 2: if (!s.empty()) s.erase(at, 1 + pick(3)); break;
        default:
          if (!s.empty()) {
            const std::size_t from = pick(s.size());
            s.insert(at, s.substr(from, pick(8)));
          }
          break;
      }
    }
    return s;
  }

 private:
  std::size_t pick(std::size_t n) { return std::uniform_int_distribution<std::size_t>(0, n - 1)(rng_); }
  void ws(std::string& out) {
    static const char* kWs[] = {"", "", "", " ", "\n", "\t", "\r\n "};
    out += kWs[pick(7)];
  }
  void string(std::string& out) {
    static const char* kPieces[] = {"a", "b", "k", "0", " ", "\\n", "\\\"", "\\\\", "\\/", "\\u0061", "\\u00e9",
                                    "\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x80", "\\ud83d\\ude00", "\\t", "\x7f"};
    out += '"';
    for (std::size_t n = pick(4); n > 0; --n) out += kPieces[pick(sizeof kPieces / sizeof *kPieces)];
    out += '"';
  }
  void number(std::string& out) {
    static const char* kNums[] = {"0", "-0", "1", "-7", "42", "3.25", "-0.5e-3", "1E+2", "6.02e23", "1e308",
                                  "1e309", "-1e400", "1e-400", "18446744073709551616",
                                  "123456789012345678901234567890123456789"};
    out += kNums[pick(sizeof kNums / sizeof *kNums)];
  }
  void value(std::string& out, int depth) {
    const std::size_t k = depth > 6 ? pick(5) : pick(7);
    switch (k) {
      case 0: out += "null"; break;
      case 1: out += pick(2) ? "true" : "false"; break;
      case 2: number(out); break;
      case 3: case 4: string(out); break;
      case 5: {
        out += '[';
        ws(out);
        for (std::size_t n = pick(4), i = 0; i < n; ++i) {
          if (i) { out += ','; ws(out); }
          value(out, depth + 1);
          ws(out);
        }
        out += ']';
        break;
      }
      default: {
        out += '{';
        ws(out);
        for (std::size_t n = pick(4), i = 0; i < n; ++i) {
          if (i) { out += ','; ws(out); }
          string(out);  // keys repeat now and then, on purpose
          ws(out);
          out += ':';
          ws(out);
          value(out, depth + 1);
          ws(out);
        }
        out += '}';
        break;
      }
    }
  }
  std::mt19937 rng_;
};

TEST(JsonScanDifferential, AgreesWithNlohmannExceptWhereDocumented) {
  Generator g(20240611);
  int agreed_valid = 0, agreed_invalid = 0, duplicates = 0, overflows = 0;
  for (int i = 0; i < 40000; ++i) {
    std::string doc = g.document();
    std::string text = i % 2 ? g.mutate(doc) : doc;
    SCOPED_TRACE(::testing::PrintToString(text));
    auto ours = scan_json(text);
    const bool accepted = std::holds_alternative<JsonScanned>(ours);
    if (text.find('\0') != std::string::npos) {
      EXPECT_FALSE(accepted);
      continue;
    }
    Reference ref = nlohmann_verdict(text);
    if (accepted == ref.accepts) {
      ++(accepted ? agreed_valid : agreed_invalid);
      continue;
    }
    if (!accepted) {
      // We refuse, nlohmann accepts: only for a duplicate key.
      ASSERT_EQ(std::get<JsonScanError>(ours).failure, JsonScanFailure::DuplicateKey);
      ASSERT_TRUE(ref.duplicate);
      ++duplicates;
    } else {
      // We accept, nlohmann refuses: only for a number beyond a double.
      ASSERT_TRUE(ref.number_overflow);
      ++overflows;
    }
  }
  std::printf("    agreed: %d valid, %d invalid; documented differences: %d duplicate keys, %d number overflows\n",
              agreed_valid, agreed_invalid, duplicates, overflows);
  EXPECT_GT(agreed_valid, 1000);
  EXPECT_GT(agreed_invalid, 1000);
  EXPECT_GT(duplicates, 10);
  EXPECT_GT(overflows, 10);
}

TEST(JsonScanDifferential, RandomBytesNeverCrash) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> byte(0, 255), len(0, 64);
  int accepted = 0;
  for (int i = 0; i < 200000; ++i) {
    std::string s(static_cast<std::size_t>(len(rng)), '\0');
    for (char& c : s) c = static_cast<char>(byte(rng));
    // Exact-size heap copy, so a read past the end shows under ASan.
    std::vector<char> buf(s.begin(), s.end());
    JsonScanOptions o;
    o.on_child = [](const JsonChild&) {};
    o.on_number = [](std::string_view) {};
    if (std::holds_alternative<JsonScanned>(scan_json(std::string_view(buf.data(), buf.size()), o))) ++accepted;
  }
  EXPECT_GE(accepted, 0);
}

}  // namespace
}  // namespace tsb::protocol
