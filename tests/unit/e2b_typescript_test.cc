// The E2B backend's reading of a TypeScript tool's source (e2b.h:
// e2b_typescript_source, e2b_typescript_is_async, e2b_typescript_identifier),
// cross-checked against Letta's own regular expressions
// (generate_typescript_execution_script and is_async_typescript_function in
// letta/services/tool_sandbox/typescript_generator.py) run by /usr/bin/python3.
#include "daemon/frontend/e2b/e2b.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <string>
#include <vector>

#include "python_reference.h"

namespace {

using nlohmann::json;
using ::tsb::testing::kPython;
using ::tsb::testing::TempFile;

// Letta's treatment of each source, in the layout e2b_typescript_source
// gives it: the import lines (each stripped) on top, a blank line, the rest
// without `export `, stripped; and whether its script awaits NAME.
constexpr const char* kLetta = R"PY(
import json, re, sys
cases = json.load(open(sys.argv[1]))
out = []
for src, name in cases:
    import_pattern = r"^import\s+.+?['\"];?\s*$"
    imports = re.findall(import_pattern, src, re.MULTILINE)
    rest = re.sub(import_pattern, "", src, flags=re.MULTILINE)
    text = "".join(i.strip() + "\n" for i in imports) + ("\n" if imports else "")
    text += re.sub(r"\bexport\s+", "", rest).strip() + "\n"
    is_async = bool(re.search(rf"export\s+async\s+function\s+{re.escape(name)}", src)
                    or re.search(rf"export\s+const\s+{re.escape(name)}\s*=\s*async", src))
    out.append([text, is_async])
print(json.dumps(out))
)PY";

json run_letta(const json& cases) {
  TempFile script(kLetta);
  TempFile in(cases.dump());
  const std::string cmd = std::string(kPython) + " -I " + script.path() + " " + in.path();
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return json();
  std::string out;
  char buf[4096];
  for (std::size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  EXPECT_EQ(pclose(p), 0);
  return json::parse(out, nullptr, false);
}

TEST(E2BTypeScript, SourceAndAsyncAsLettasRegularExpressions) {
  TSB_REQUIRE_PYTHON();
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"\nexport function add_numbers(x: number, y: number): number {\n    return x + y;\n}\n", "add_numbers"},
      {"import os from 'os';\nimport * as path from \"path\"\n\n\nexport async function f() { return 1; }\n", "f"},
      {"import { a,\n  b } from 'x';\nexport const g = async (x) => x;\n", "g"},
      {"import x from 'y'; const z = 1;\nexport function h() {}\n", "h"},
      {"import  '  \nexport function i() {}\n", "i"},
      {"import\n\n'side-effect';  \n\t\nfunction j() { return 'export  me'; }\n", "j"},
      {"  import a from 'b';\nreexport x;\nexported();\n_export y;\néexport z;\nexport\tfunction k() {}\n", "k"},
      {"export async function kk2() {}\nexport async function kk() {}\n", "kk"},
      {"export const l =async () => 1\nexport   const   m   =   async function() {}\n", "m"},
      {"export async function prefix_longer() {}\n", "prefix"},
      {"import a from 'b'\r\nexport function n() {}\r\n", "n"},
      {"import 'a';;\nimport 'b' ;\nimport \"c\"x\nexport function o() {}", "o"},
      {"", "p"},
      {"import", "q"},
      {"import  \n", "r"},
      {"export $fn\x1c", "$fn"},
  };
  json in = json::array();
  for (const auto& [src, name] : cases) in.push_back({src, name});
  const json want = run_letta(in);
  ASSERT_TRUE(want.is_array() && want.size() == cases.size()) << want.dump();
  for (std::size_t i = 0; i < cases.size(); ++i) {
    EXPECT_EQ(tsb::core::e2b_typescript_source(cases[i].first), want[i][0].get<std::string>())
        << "case " << i << ": " << json(cases[i].first).dump();
    EXPECT_EQ(tsb::core::e2b_typescript_is_async(cases[i].first, cases[i].second), want[i][1].get<bool>())
        << "case " << i << ": " << json(cases[i].first).dump();
  }
}

TEST(E2BTypeScript, OnlyIdentifiersAreLookedUp) {
  for (const char* ok : {"f", "add_numbers", "$x", "_", "A1"})
    EXPECT_TRUE(tsb::core::e2b_typescript_identifier(ok)) << ok;
  for (const char* bad : {"", "1f", "f()", "a.b", "f;process.exit()", "a-b", "a b", "é"})
    EXPECT_FALSE(tsb::core::e2b_typescript_identifier(bad)) << bad;
}

TEST(E2BTypeScript, TheToolCellHasOneBlobAndNoComment) {
  const std::string cell = tsb::core::e2b_typescript_tool_cell("QUJD");
  EXPECT_NE(cell.find("(\"QUJD\")"), std::string::npos);
  EXPECT_EQ(cell.find("@BLOB@"), std::string::npos);
  EXPECT_NE(cell.rfind("(async (blob: string)", 0), std::string::npos) << cell.substr(0, 80);
}

}  // namespace
