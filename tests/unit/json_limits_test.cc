// parse_json_limited (protocol/json_limits.h): RFC 8259 exactly, and each
// limit refused with an error that names it.
#include "protocol/json_limits.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <random>
#include <string>

namespace tsb::protocol {
namespace {

using nlohmann::json;

std::string error_of(const Result<json>& r) { return r.ok() ? "(parsed: " + r->dump() + ")" : r.error().message; }

TEST(JsonLimited, ReadsWhatNlohmannReads) {
  const std::string text = R"( {"a": [1, -2, 3.5, 1e300, true, false, null, "x\u00e9\ud83d\ude00"], "b": {"c": {}}, "d": []} )";
  auto r = parse_json_limited(text, {});
  ASSERT_TRUE(r.ok()) << error_of(r);
  EXPECT_EQ(*r, json::parse(text));
  EXPECT_EQ((*r)["a"][7], "x\xc3\xa9\xf0\x9f\x98\x80");
  // Scalars at the top, and integers of every width.
  EXPECT_EQ(*parse_json_limited("\"s\"", {}), "s");
  EXPECT_EQ(*parse_json_limited("18446744073709551615", {}), json(18446744073709551615ull));
  EXPECT_EQ(*parse_json_limited("-9223372036854775808", {}), json(INT64_MIN));
  EXPECT_TRUE(parse_json_limited("123456789012345678901234567890", {})->is_number_float());
}

TEST(JsonLimited, RefusesTextLargerThanItsLimit) {
  JsonLimits l;
  l.max_bytes = 8;
  EXPECT_TRUE(parse_json_limited("[1,2,3] ", l).ok());
  auto r = parse_json_limited("[1,2,3]  ", l);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message, "larger than 8 bytes (9)");
  EXPECT_EQ(r.error().code, E2BIG);
}

TEST(JsonLimited, RefusesNestingDeeperThanItsLimit) {
  JsonLimits l;
  l.max_depth = 2;
  EXPECT_TRUE(parse_json_limited(R"({"a": [1, "[[[["]})", l).ok()) << "brackets in strings do not count";
  auto r = parse_json_limited(R"({"a": [[1]]})", l);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message, "nested deeper than 2 levels (at byte 7)");
  EXPECT_EQ(r.error().code, E2BIG);
  l.max_depth = 1;
  EXPECT_EQ(error_of(parse_json_limited("[[]]", l)), "nested deeper than 1 level (at byte 1)");
  l.max_depth = 0;
  EXPECT_TRUE(parse_json_limited("1", l).ok());
  EXPECT_FALSE(parse_json_limited("[]", l).ok());
  // The default: kMaxJsonNesting, and no stack overflow far beyond it.
  EXPECT_TRUE(parse_json_limited(std::string(kMaxJsonNesting, '[') + std::string(kMaxJsonNesting, ']'), {}).ok());
  r = parse_json_limited(std::string(1 << 20, '['), {});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message, "nested deeper than 512 levels (at byte 512)");
}

TEST(JsonLimited, RefusesMoreValuesThanItsLimit) {
  JsonLimits l;
  l.max_values = 4;  // the array and its three elements
  EXPECT_TRUE(parse_json_limited("[1, [], {}]", l).ok());
  auto r = parse_json_limited("[1, 2, 3, 4]", l);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message, "more than 4 values");
  EXPECT_EQ(r.error().code, E2BIG);
  // Members count by their values; keys are not values.
  EXPECT_TRUE(parse_json_limited(R"({"a": 1, "b": 2, "c": 3})", l).ok());
  EXPECT_FALSE(parse_json_limited(R"({"a": 1, "b": 2, "c": {}, "d": 4})", l).ok());
  l.max_values = 1;
  EXPECT_EQ(error_of(parse_json_limited("[0]", l)), "more than 1 value");
}

TEST(JsonLimited, RefusesStringsAndKeysLongerThanItsLimit) {
  JsonLimits l;
  l.max_string_bytes = 4;
  EXPECT_TRUE(parse_json_limited(R"({"abcd": "\u00e9\u00e9"})", l).ok()) << "measured decoded: 4 bytes of UTF-8";
  auto r = parse_json_limited(R"(["abcde"])", l);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message, "a string or key longer than 4 bytes (5)");
  EXPECT_EQ(r.error().code, E2BIG);
  EXPECT_EQ(error_of(parse_json_limited(R"({"abcde": 1})", l)), "a string or key longer than 4 bytes (5)");
  EXPECT_EQ(error_of(parse_json_limited(R"(["\u00e9\u00e9\u00e9"])", l)), "a string or key longer than 4 bytes (6)");
}

TEST(JsonLimited, RefusesWhatIsNotJsonWithWhereItIs) {
  const std::pair<std::string, std::string> cases[] = {
      {"[\"\xff\"]", "not JSON: invalid UTF-8 in a string (at byte 2)"},
      {"[\"\xc0\xaf\"]", "not JSON: invalid UTF-8 in a string (at byte 2)"},       // overlong "/"
      {"[\"\xed\xa0\x80\"]", "not JSON: invalid UTF-8 in a string (at byte 2)"},   // a surrogate, encoded
      {"\xef\xbb\xbf{}", "not JSON: unexpected character (at byte 0)"},           // a byte order mark
      {std::string("{}\0junk", 7), "not JSON: unexpected data after the JSON value (at byte 2)"},
      {std::string("[\"a\0\"]", 6), "not JSON: raw control character in a string (at byte 3)"},
      {R"(["\ud800"])", "not JSON: unpaired surrogate in a \\u escape (at byte 2)"},
      {"[1,]", "not JSON: unexpected character (at byte 3)"},
      {"{'a': 1}", "not JSON: expected a string key (at byte 1)"},
      {"[NaN]", "not JSON: unexpected character (at byte 1)"},
      {"// c\n1", "not JSON: unexpected character (at byte 0)"},
      {"", "not JSON: unexpected end of input (at byte 0)"},
      {R"({"a": 1, "a": 2})", "not JSON: duplicate key (at byte 9)"},
  };
  for (const auto& [text, want] : cases) {
    auto r = parse_json_limited(text, {});
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_EQ(r.error().message, want) << text;
    EXPECT_EQ(r.error().code, EINVAL) << text;
  }
}

TEST(JsonLimited, EqualKeysKeepTheLastWhenAllowed) {
  JsonLimits l;
  l.duplicate_keys = false;
  auto r = parse_json_limited(R"({"a": [1, 2], "b": 0, "a": {"c": 3}})", l);
  ASSERT_TRUE(r.ok()) << error_of(r);
  EXPECT_EQ(*r, json::parse(R"({"a": {"c": 3}, "b": 0})"));
}

TEST(JsonLimited, RefusesNumbersBeyondADouble) {
  auto r = parse_json_limited("[1, -1e400]", {});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ERANGE);
  EXPECT_EQ(r.error().message.rfind("a number beyond a double's range (at byte ", 0), 0u) << r.error().message;
}

// Random documents within and past the limits: parsed ones equal nlohmann's
// reading, refused ones break the limit the error names.
TEST(JsonLimited, AgreesWithNlohmannOnRandomDocuments) {
  std::mt19937 rng(7);
  std::function<json(int)> gen = [&](int depth) -> json {
    switch (rng() % (depth > 5 ? 4 : 6)) {
      case 0: return json(static_cast<std::int64_t>(rng()) - (1 << 30));
      case 1: return json(std::string(rng() % 12, static_cast<char>('a' + rng() % 26)));
      case 2: return json(rng() % 2 == 0);
      case 3: return json(nullptr);
      case 4: {
        json a = json::array();
        for (unsigned i = rng() % 5; i > 0; --i) a.push_back(gen(depth + 1));
        return a;
      }
      default: {
        json o = json::object();
        for (unsigned i = rng() % 5; i > 0; --i) o["k" + std::to_string(rng() % 50)] = gen(depth + 1);
        return o;
      }
    }
  };
  std::function<std::size_t(const json&)> values = [&](const json& j) -> std::size_t {
    std::size_t n = 1;
    if (j.is_structured())
      for (const auto& e : j) n += values(e);
    return n;
  };
  std::function<int(const json&)> depth = [&](const json& j) -> int {
    if (!j.is_structured()) return 0;
    int d = 0;
    for (const auto& e : j) d = std::max(d, depth(e));
    return d + 1;
  };
  unsigned parsed = 0, refused = 0;
  for (int i = 0; i < 2000; ++i) {
    const json doc = gen(0);
    const std::string text = doc.dump(rng() % 2 ? 1 : -1);
    JsonLimits l;
    l.max_values = 1 + rng() % 40;
    l.max_depth = static_cast<int>(rng() % 8);
    l.max_string_bytes = rng() % 14;
    auto r = parse_json_limited(text, l);
    if (r.ok()) {
      ++parsed;
      EXPECT_EQ(*r, doc) << text;
      EXPECT_LE(values(doc), l.max_values) << text;
      EXPECT_LE(depth(doc), l.max_depth) << text;
    } else {
      ++refused;
      const std::string& m = r.error().message;
      if (m.starts_with("more than")) EXPECT_GT(values(doc), l.max_values) << text;
      else if (m.starts_with("nested deeper")) EXPECT_GT(depth(doc), l.max_depth) << text;
      else EXPECT_TRUE(m.starts_with("a string or key longer than")) << m << ": " << text;
    }
  }
  EXPECT_GT(parsed, 200u);
  EXPECT_GT(refused, 200u);
}

}  // namespace
}  // namespace tsb::protocol
