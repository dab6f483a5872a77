// The strict JSON-with-comments parser behind every policy file: what it
// accepts, exact diagnostics for each class of error, and source locations.
#include "daemon/policy/jsonc.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>

namespace tsb {
namespace {

LocatedJson parse_ok(std::string_view text) {
  auto r = parse_jsonc(text, "t.json");
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
  if (!r.ok()) return {};
  return std::move(r).value();
}

std::string parse_error(std::string_view text) {
  auto r = parse_jsonc(text, "t.json");
  EXPECT_FALSE(r.ok()) << "parsed unexpectedly: " << std::string(text);
  if (r.ok()) return {};
  EXPECT_EQ(r.error().code, EINVAL);
  return r.error().message;
}

TEST(Jsonc, AcceptsCommentsEverywhereBlanksAreAllowed) {
  const auto doc = parse_ok(
      "// leading comment\n"
      "{ /* before key */ \"a\" /* after key */ : /* before value */ 1, // trailing\n"
      "  \"b\": [true, /* inside */ null, \"s // not a comment\", \"/* nor this */\"]\n"
      "} /* after the document */\n"
      "// last line without newline");
  EXPECT_EQ(doc.value["a"], 1);
  EXPECT_EQ(doc.value["b"][2], "s // not a comment");
  EXPECT_EQ(doc.value["b"][3], "/* nor this */");
  EXPECT_TRUE(doc.value["b"][1].is_null());
}

TEST(Jsonc, RecordsValueAndKeyLocations) {
  const auto doc = parse_ok("{\n  \"outer\": {\n    \"in/ner~\": [10, \"x\"]\n  }\n}");
  EXPECT_EQ(doc.source, "t.json");
  EXPECT_EQ(doc.where(""), "t.json:1:1");
  EXPECT_EQ(doc.where("/outer"), "t.json:2:12");
  EXPECT_EQ(doc.where_key("/outer"), "t.json:2:3");
  // RFC 6901 escaping of '/' and '~' in keys.
  EXPECT_EQ(doc.where_key("/outer/in~1ner~0"), "t.json:3:5");
  EXPECT_EQ(doc.where("/outer/in~1ner~0/0"), "t.json:3:17");
  EXPECT_EQ(doc.where("/outer/in~1ner~0/1"), "t.json:3:21");
  EXPECT_EQ(doc.where("/nope"), "t.json: /nope");
}

TEST(Jsonc, ColumnsCountCodePointsNotBytes) {
  // "é" is two bytes, "😀" four; each is one column. A tab is one column.
  const auto doc = parse_ok("{\"é😀\":\t7}");
  EXPECT_EQ(doc.where("/é😀"), "t.json:1:8");
  EXPECT_EQ(parse_error("[\"é\", x]"), "t.json:1:7: unexpected character 'x', expected a JSON value");
}

TEST(Jsonc, KeepsSixtyFourBitIntegersExact) {
  const auto doc = parse_ok(
      "[18446744073709551615, 9223372036854775808, -9223372036854775808, 0, -0, 4294967295, 1.5, -2e3]");
  ASSERT_TRUE(doc.value[0].is_number_unsigned());
  EXPECT_EQ(doc.value[0].get<std::uint64_t>(), std::numeric_limits<std::uint64_t>::max());
  EXPECT_EQ(doc.value[1].get<std::uint64_t>(), std::uint64_t{1} << 63);
  ASSERT_TRUE(doc.value[2].is_number_integer());
  EXPECT_EQ(doc.value[2].get<std::int64_t>(), std::numeric_limits<std::int64_t>::min());
  EXPECT_TRUE(doc.value[3].is_number_unsigned());
  EXPECT_EQ(doc.value[4].get<std::int64_t>(), 0);
  EXPECT_EQ(doc.value[5].get<std::uint64_t>(), 4294967295u);
  EXPECT_TRUE(doc.value[6].is_number_float());
  EXPECT_DOUBLE_EQ(doc.value[7].get<double>(), -2000.0);
}

TEST(Jsonc, DecodesEscapes) {
  const auto doc = parse_ok(R"(["\"\\\/\b\f\n\r\t", "\u00e9\ud83d\ude00", "\u0041"])");
  EXPECT_EQ(doc.value[0], "\"\\/\b\f\n\r\t");
  EXPECT_EQ(doc.value[1], "é😀");
  EXPECT_EQ(doc.value[2], "A");
}

TEST(Jsonc, AcceptsExactlyMaxDepth) {
  const std::string ok = std::string(kMaxJsonDepth, '[') + std::string(kMaxJsonDepth, ']');
  parse_ok(ok);
  const std::string deep = std::string(kMaxJsonDepth + 1, '[') + std::string(kMaxJsonDepth + 1, ']');
  EXPECT_EQ(parse_error(deep), "t.json:1:65: nesting deeper than 64 levels");
}

TEST(Jsonc, DuplicateKeyNamesKeyAndBothPositions) {
  EXPECT_EQ(parse_error("{\"a\": 1,\n  \"b\": {\"a\": 2},\n  \"a\": 3}"),
            "t.json:3:3: duplicate key \"a\"; first defined at 1:2");
  // Keys equal after unescaping are the same key.
  EXPECT_EQ(parse_error(R"({"ab": 1, "\u0061b": 2})"), "t.json:1:11: duplicate key \"ab\"; first defined at 1:2");
}

TEST(Jsonc, RejectsInvalidUtf8) {
  EXPECT_EQ(parse_error("{\"a\": \"\xC3\x28\"}"), "t.json:1:8: invalid UTF-8 (byte 0xC3)");
  EXPECT_EQ(parse_error("[\"\xC0\xAF\"]"), "t.json:1:3: invalid UTF-8 (byte 0xC0)");          // overlong '/'
  EXPECT_EQ(parse_error("[\"\xED\xA0\x80\"]"), "t.json:1:3: invalid UTF-8 (byte 0xED)");      // surrogate
  EXPECT_EQ(parse_error("[\"\xF4\x90\x80\x80\"]"), "t.json:1:3: invalid UTF-8 (byte 0xF4)");  // > U+10FFFF
  EXPECT_EQ(parse_error("[1]\n// caf\xE9\n"), "t.json:2:7: invalid UTF-8 (byte 0xE9)");       // Latin-1 in a comment
  EXPECT_EQ(parse_error("[\"\xE2\x82\"]"), "t.json:1:3: invalid UTF-8 (byte 0xE2)");          // truncated
}

TEST(Jsonc, RejectsTrailingCommas) {
  EXPECT_EQ(parse_error("{\"a\": 1,}"), "t.json:1:9: trailing comma before '}'");
  EXPECT_EQ(parse_error("[1, 2, ]"), "t.json:1:8: trailing comma before ']'");
  EXPECT_EQ(parse_error("[1, // c\n]"), "t.json:2:1: trailing comma before ']'");
  EXPECT_EQ(parse_error("[,]"), "t.json:1:2: unexpected character ',', expected a JSON value");
}

TEST(Jsonc, RejectsNanAndInfinity) {
  EXPECT_EQ(parse_error("{\"a\": NaN}"), "t.json:1:7: NaN and Infinity are not valid JSON numbers");
  EXPECT_EQ(parse_error("[Infinity]"), "t.json:1:2: NaN and Infinity are not valid JSON numbers");
  EXPECT_EQ(parse_error("[-Infinity]"), "t.json:1:2: NaN and Infinity are not valid JSON numbers");
  EXPECT_EQ(parse_error("[1e400]"), "t.json:1:2: number 1e400 out of range");
}

TEST(Jsonc, RejectsTrailingGarbage) {
  EXPECT_EQ(parse_error("{} x"), "t.json:1:4: unexpected character 'x' after the top-level value");
  EXPECT_EQ(parse_error("{}\n{}"), "t.json:2:1: unexpected character '{' after the top-level value");
  EXPECT_EQ(parse_error("[1] /"), "t.json:1:5: unexpected character '/' after the top-level value");
  EXPECT_EQ(parse_error("[nullx]"), "t.json:1:6: unexpected character 'x' after 'null'");
  EXPECT_EQ(parse_error("[12x]"), "t.json:1:4: unexpected character 'x', expected ',' or ']' after array element");
}

TEST(Jsonc, RejectsMalformedNumbers) {
  EXPECT_EQ(parse_error("[01]"), "t.json:1:2: leading zeros are not allowed in numbers");
  EXPECT_EQ(parse_error("[+1]"), "t.json:1:2: unexpected character '+', expected a JSON value");
  EXPECT_EQ(parse_error("[.5]"), "t.json:1:2: unexpected character '.', expected a JSON value");
  EXPECT_EQ(parse_error("[1.]"), "t.json:1:4: unexpected character ']', expected a digit after '.'");
  EXPECT_EQ(parse_error("[1e]"), "t.json:1:4: unexpected character ']', expected a digit in exponent");
  EXPECT_EQ(parse_error("[-]"), "t.json:1:3: unexpected character ']', expected a digit");
  EXPECT_EQ(parse_error("[18446744073709551616]"),
            "t.json:1:2: integer 18446744073709551616 out of range (must fit in 64 bits)");
  EXPECT_EQ(parse_error("[-9223372036854775809]"),
            "t.json:1:2: integer -9223372036854775809 out of range (must fit in 64 bits)");
}

TEST(Jsonc, RejectsBadStrings) {
  EXPECT_EQ(parse_error("[\"abc"), "t.json:1:2: unterminated string");
  EXPECT_EQ(parse_error("[\"a\nb\"]"), "t.json:1:2: unterminated string (raw line break inside a string)");
  EXPECT_EQ(parse_error("[\"a\tb\"]"), "t.json:1:4: control character U+0009 in a string must be escaped");
  EXPECT_EQ(parse_error(R"(["\q"])"), "t.json:1:3: invalid escape '\\q' in string");
  EXPECT_EQ(parse_error(R"(["\u12"])"), "t.json:1:3: invalid \\u escape (expected four hex digits)");
  EXPECT_EQ(parse_error(R"(["\ud800"])"), "t.json:1:3: unpaired UTF-16 surrogate in \\u escape");
  EXPECT_EQ(parse_error(R"(["\udc00"])"), "t.json:1:3: unpaired UTF-16 surrogate in \\u escape");
  EXPECT_EQ(parse_error("['a']"), "t.json:1:2: unexpected character ''', expected a JSON value");
  EXPECT_EQ(parse_error("{a: 1}"), "t.json:1:2: unexpected character 'a', expected a string as object key");
}

TEST(Jsonc, RejectsStructuralErrors) {
  EXPECT_EQ(parse_error(""), "t.json:1:1: empty document, expected a JSON value");
  EXPECT_EQ(parse_error("  // only a comment\n"), "t.json:2:1: empty document, expected a JSON value");
  EXPECT_EQ(parse_error("{\"a\" 1}"), "t.json:1:6: unexpected character '1', expected ':' after object key");
  EXPECT_EQ(parse_error("{\"a\": 1 \"b\": 2}"),
            "t.json:1:9: unexpected character '\"', expected ',' or '}' after object member");
  EXPECT_EQ(parse_error("[1 2]"), "t.json:1:4: unexpected character '2', expected ',' or ']' after array element");
  EXPECT_EQ(parse_error("{\"a\": [1, 2}"),
            "t.json:1:12: unexpected character '}', expected ',' or ']' after array element");
  EXPECT_EQ(parse_error("{\"a\": 1"), "t.json:1:8: unexpected end of input, expected ',' or '}' after object member");
  EXPECT_EQ(parse_error("{\"a\": "), "t.json:1:7: unexpected end of input, expected a JSON value");
}

TEST(Jsonc, RejectsBadComments) {
  EXPECT_EQ(parse_error("{ /* never closed"), "t.json:1:3: unterminated /* comment");
  EXPECT_EQ(parse_error("[1, / 2]"), "t.json:1:5: unexpected character '/', expected a JSON value");
  EXPECT_EQ(parse_error("# shell comment\n{}"), "t.json:1:1: unexpected character '#', expected a JSON value");
}

TEST(Jsonc, RejectsInvisibleAndControlCharacters) {
  EXPECT_EQ(parse_error("\xEF\xBB\xBF{}"), "t.json:1:1: byte order mark (U+FEFF) not allowed");
  EXPECT_EQ(parse_error(std::string("[1]\0", 4)), "t.json:1:4: control character U+0000 not allowed");
  EXPECT_EQ(parse_error("[1] // \x1B[2J\n"), "t.json:1:8: control character U+001B not allowed");
  EXPECT_EQ(parse_error("[\"\xC2\x85\"]"), "t.json:1:3: control character U+0085 not allowed");
  // RIGHT-TO-LEFT OVERRIDE inside a comment ("Trojan Source").
  EXPECT_EQ(parse_error("[1] // \xE2\x80\xAE evil\n"),
            "t.json:1:8: bidirectional control character U+202E not allowed (it makes text display "
            "differently from how it parses)");
}

TEST(Jsonc, ErrorsUseTheGivenSourceName) {
  auto r = parse_jsonc("[1,]", "/etc/toolsandboxd/policies/x.json");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message, "/etc/toolsandboxd/policies/x.json:1:4: trailing comma before ']'");
}

TEST(Jsonc, QuotedForMessageEscapesWhatCouldForgeOutput) {
  EXPECT_EQ(quoted_for_message("plain"), "\"plain\"");
  EXPECT_EQ(quoted_for_message("a\"b\\c"), "\"a\\\"b\\\\c\"");
  EXPECT_EQ(quoted_for_message("line\nbreak\r\t"), "\"line\\nbreak\\r\\t\"");
  EXPECT_EQ(quoted_for_message("\x1B[31mred"), "\"\\u001B[31mred\"");
  EXPECT_EQ(quoted_for_message("\x7F"), "\"\\u007F\"");
  EXPECT_EQ(quoted_for_message("caf\xC3\xA9"), "\"caf\xC3\xA9\"");
  EXPECT_EQ(quoted_for_message("\xE2\x80\xAE"), "\"\\u202E\"");
  EXPECT_EQ(quoted_for_message("bad\xFF"), "\"bad\\xFF\"");
}

TEST(Jsonc, PointerConstruction) {
  EXPECT_EQ(json_pointer_append("", "a"), "/a");
  EXPECT_EQ(json_pointer_append("/a", "b/c~d"), "/a/b~1c~0d");
  EXPECT_EQ(json_pointer_append("/a", std::size_t{3}), "/a/3");
}

}  // namespace
}  // namespace tsb
