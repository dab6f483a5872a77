// The venv manifests as read (daemon/venv/manifest.h): the builder's within
// what toolsandbox_venv_builder.py can write, each limit refused with a
// clear error; the cache's own read back.
#include "daemon/venv/manifest.h"

#include <gtest/gtest.h>

#include <string>

#include "daemon/venv/archive.h"

namespace tsb::venv {
namespace {

using nlohmann::json;

const std::size_t kArchiveManifest = ArchiveLimits{}.max_manifest;

std::string error_of(const Result<BuilderManifest>& r) { return r.ok() ? "(read)" : r.error().message; }

// `n` freeze lines of `len` bytes each, as the builder writes them.
std::string builder_text(std::size_t n, std::size_t len = 12) {
  json m = {{"python", "3.11.2"}, {"requirements", {"numpy==1.26.4"}}};
  json freeze = json::array();
  for (std::size_t i = 0; i < n; ++i) freeze.push_back(std::string(len, static_cast<char>('a' + i % 26)));
  m["freeze"] = freeze;
  return m.dump();
}

TEST(BuilderManifest, KeepsFreezeAndPythonOfWhatTheBuilderWrites) {
  // json.dumps(manifest, sort_keys=True), as the builder writes it.
  const std::string text =
      R"({"freeze": ["numpy==1.26.4", "pip==23.0.1", "caf\u00e9==1"], "python": "3.11.2", "requirements": ["numpy==1.26.4"]})";
  auto m = read_builder_manifest(text, kArchiveManifest);
  ASSERT_TRUE(m.ok()) << m.error().message;
  EXPECT_EQ(m->freeze, json::array({"numpy==1.26.4", "pip==23.0.1", "caf\xc3\xa9==1"}));
  EXPECT_EQ(m->python, "3.11.2");
  // `--archive DIR` (tests) writes an empty one.
  m = read_builder_manifest("{}", kArchiveManifest);
  ASSERT_TRUE(m.ok());
  EXPECT_TRUE(m->freeze.is_null());
  EXPECT_TRUE(m->python.is_null());
}

TEST(BuilderManifest, MembersOfAnotherShapeAreDroppedNotKept) {
  auto m = read_builder_manifest(R"({"freeze": [1, "x"], "python": ["3.11"], "bytes": 1, "key": "x"})", kArchiveManifest);
  ASSERT_TRUE(m.ok()) << m.error().message;
  EXPECT_TRUE(m->freeze.is_null());
  EXPECT_TRUE(m->python.is_null());
  m = read_builder_manifest(R"({"freeze": "numpy", "python": ")" + std::string(kMaxPythonVersion + 1, '3') + R"("})",
                            kArchiveManifest);
  ASSERT_TRUE(m.ok()) << m.error().message;
  EXPECT_TRUE(m->freeze.is_null());
  EXPECT_TRUE(m->python.is_null());
}

TEST(BuilderManifest, TheLargestLegitimateOneIsRead) {
  // As many freeze lines as are kept, each as long as one may be, within
  // the archive's cap.
  const std::size_t len = kArchiveManifest / kMaxFreezeLines - 4;
  const std::string text = builder_text(kMaxFreezeLines, len);
  ASSERT_LE(text.size(), kArchiveManifest);
  auto m = read_builder_manifest(text, kArchiveManifest);
  ASSERT_TRUE(m.ok()) << m.error().message;
  EXPECT_EQ(m->freeze.size(), kMaxFreezeLines);
  m = read_builder_manifest(builder_text(3, kMaxFreezeLine), kArchiveManifest);
  ASSERT_TRUE(m.ok()) << m.error().message;
  EXPECT_EQ(m->freeze.size(), 3u);
}

TEST(BuilderManifest, TooDeepIsRefused) {
  EXPECT_EQ(error_of(read_builder_manifest(R"({"freeze": [["numpy"]]})", kArchiveManifest)),
            "the builder's manifest: nested deeper than 2 levels (at byte 12)");
  const std::string deep = std::string(100000, '[') + "1" + std::string(100000, ']');
  EXPECT_EQ(error_of(read_builder_manifest(R"({"deep": )" + deep + "}", kArchiveManifest)),
            "the builder's manifest: nested deeper than 2 levels (at byte 10)");
}

TEST(BuilderManifest, TooManyEntriesAreRefused) {
  const std::size_t limit = builder_manifest_limits(kArchiveManifest).max_values;
  EXPECT_EQ(limit, 1 + kMaxFreezeLines + kMaxRequirementsEcho + 256);
  auto m = read_builder_manifest(builder_text(limit), kArchiveManifest);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.error().message, "the builder's manifest: more than " + std::to_string(limit) + " values");
  EXPECT_EQ(m.error().code, E2BIG);
  // Small values, many of them: refused long before the byte cap.
  std::string zeros = R"({"x": [0)";
  for (std::size_t i = 0; i < 200000; ++i) zeros += ",0";
  zeros += "]}";
  EXPECT_EQ(error_of(read_builder_manifest(zeros, kArchiveManifest)),
            "the builder's manifest: more than " + std::to_string(limit) + " values");
}

TEST(BuilderManifest, TooLongStringsAreRefused) {
  EXPECT_EQ(error_of(read_builder_manifest(builder_text(2, kMaxFreezeLine + 1), kArchiveManifest)),
            "the builder's manifest: a string or key longer than 4096 bytes (4097)");
  EXPECT_EQ(error_of(read_builder_manifest(R"({")" + std::string(5000, 'k') + R"(": 1})", kArchiveManifest)),
            "the builder's manifest: a string or key longer than 4096 bytes (5000)");
  // Escapes count as what they decode to.
  std::string escaped;
  for (int i = 0; i < 1366; ++i) escaped += "\\u20ac";  // 3 bytes each: 4098
  EXPECT_EQ(error_of(read_builder_manifest(R"({"freeze": [")" + escaped + R"("]})", kArchiveManifest)),
            "the builder's manifest: a string or key longer than 4096 bytes (4098)");
}

TEST(BuilderManifest, NonUtf8AndOtherNonJsonIsRefused) {
  EXPECT_EQ(error_of(read_builder_manifest("{\"freeze\": [\"caf\xe9\"]}", kArchiveManifest)),
            "the builder's manifest: not JSON: invalid UTF-8 in a string (at byte 16)");
  EXPECT_EQ(error_of(read_builder_manifest("{\"python\": \"3\xed\xa0\x80\"}", kArchiveManifest)),
            "the builder's manifest: not JSON: invalid UTF-8 in a string (at byte 13)");
  EXPECT_EQ(error_of(read_builder_manifest(std::string("{}\0{\"python\": \"x\"}", 18), kArchiveManifest)),
            "the builder's manifest: not JSON: unexpected data after the JSON value (at byte 2)");
  EXPECT_EQ(error_of(read_builder_manifest(R"({"python": "3.11", "python": "9.9"})", kArchiveManifest)),
            "the builder's manifest: not JSON: duplicate key (at byte 19)");
  EXPECT_EQ(error_of(read_builder_manifest(R"({"freeze": [NaN]})", kArchiveManifest)),
            "the builder's manifest: not JSON: unexpected character (at byte 12)");
  EXPECT_EQ(error_of(read_builder_manifest(R"(["numpy"])", kArchiveManifest)), "the builder's manifest is not a JSON object");
  EXPECT_EQ(error_of(read_builder_manifest(R"({"python": 1e999})", kArchiveManifest)).rfind(
                "the builder's manifest: a number beyond a double's range", 0),
            0u);
  EXPECT_EQ(error_of(read_builder_manifest(std::string(100, ' ') + "{}", 64)), "the builder's manifest: larger than 64 bytes (102)");
}

TEST(StoredManifest, ReadsWhatPublishWritesAndRefusesTheDamaged) {
  json m = {{"key", std::string(64, 'a')}, {"bytes", 12345}, {"freeze", json::array({"numpy==1.26.4"})},
            {"log_tail", std::string(12288, 'x')}, {"requirements", json::array({"numpy"})}};
  auto r = read_stored_manifest(m.dump(2));
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(*r, m);
  EXPECT_EQ(read_stored_manifest("[]").error().message, "the venv's manifest is not a JSON object");
  EXPECT_EQ(read_stored_manifest("{\"bytes\": 1, \"x\": \"\xff\"}").error().message,
            "the venv's manifest: not JSON: invalid UTF-8 in a string (at byte 19)");
  EXPECT_EQ(read_stored_manifest(R"({"a": [[[[[1]]]]]})").error().message,
            "the venv's manifest: nested deeper than 4 levels (at byte 9)");
  EXPECT_FALSE(read_stored_manifest(R"({"a": ")" + std::string(65537, 'x') + R"("})").ok());
  EXPECT_FALSE(read_stored_manifest(std::string(kMaxStoredManifest + 1, ' ')).ok());
}

}  // namespace
}  // namespace tsb::venv
