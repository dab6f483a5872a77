// npm requirements of TypeScript tools (daemon/venv/npm_requirements.h):
// what a registry package is, what fetches code from elsewhere, and the
// canonical set a node_modules is named by.
#include "daemon/venv/npm_requirements.h"

#include <gtest/gtest.h>

namespace {

using tsb::venv::canonical_npm_set;
using tsb::venv::first_npm_not_allowed;
using tsb::venv::kNpmForbidden;
using tsb::venv::kNpmMalformed;
using tsb::venv::npm_key;
using tsb::venv::npm_set_text;
using tsb::venv::parse_npm_requirement;

int code_of(const char* text) {
  auto r = parse_npm_requirement(text);
  return r.ok() ? 0 : r.error().code;
}

TEST(NpmRequirements, Grammar) {
  for (const char* ok : {"left-pad", "left-pad@1.3.0", "left-pad@^1.3.0", "@letta-ai/letta-client", "@types/node@20",
                         "lodash@>=4.17.0 <5", "a@1.x || 2.x", "x@*", "x@latest", "x@next", "x@1.0.0-beta.1+build.5",
                         "x@~1.2", "x@1 - 2", "under_score", "dot.name"})
    EXPECT_EQ(code_of(ok), 0) << ok;
  for (const char* no : {"-g", "--registry=http://evil", "https://evil.test/x.tgz", "x@https://evil.test/x.tgz",
                         "git+ssh://git@github.com/u/r.git", "github:u/r", "u/r", "file:../x", "./x", "/abs/x", "~/x",
                         "x@npm:y", "x@file:../y", "x@git+https://h/r.git", "@scope/x/y", "x@u/r", ".hidden"})
    EXPECT_EQ(code_of(no), kNpmForbidden) << no;
  for (const char* bad : {"", "Left-Pad", "_under", "@scope", "@/x", "x@", "x@ ", "x@\"1.0\"", "x@1;rm -rf .",
                          "x@$(id)", "x@`id`", "na me", "x\n", "x@1\t2", "p\xc3\xa9"})
    EXPECT_EQ(code_of(bad), kNpmMalformed) << bad;
  EXPECT_EQ(code_of(std::string(214, 'a').c_str()), 0);
  EXPECT_EQ(code_of(std::string(215, 'a').c_str()), kNpmMalformed);
}

TEST(NpmRequirements, CanonicalSet) {
  auto set = canonical_npm_set({"zod@^3", "left-pad", "@types/node@ >=18   <21 ", "left-pad"});
  ASSERT_TRUE(set.ok()) << set.error().message;
  EXPECT_EQ(npm_set_text(*set), "@types/node@>=18 <21\nleft-pad\nzod@^3\n");
  auto twice = canonical_npm_set({"zod@^3", "zod@^2"});
  ASSERT_FALSE(twice.ok());
  EXPECT_EQ(twice.error().code, kNpmMalformed);
  EXPECT_NE(twice.error().message.find("asked for twice"), std::string::npos) << twice.error().message;
  auto forbidden = canonical_npm_set({"zod", "github:u/r"});
  ASSERT_FALSE(forbidden.ok());
  EXPECT_EQ(forbidden.error().code, kNpmForbidden);
  // A hostile requirement is quoted with its control characters escaped.
  auto hostile = canonical_npm_set({"x\x1b[31m"});
  ASSERT_FALSE(hostile.ok());
  EXPECT_EQ(hostile.error().message.find('\x1b'), std::string::npos) << hostile.error().message;
}

TEST(NpmRequirements, AllowPatterns) {
  auto set = canonical_npm_set({"@types/node", "left-pad"});
  ASSERT_TRUE(set.ok());
  EXPECT_EQ(first_npm_not_allowed(*set, {"@types/*", "left-pad"}), "");
  EXPECT_EQ(first_npm_not_allowed(*set, {"@types/*"}), "left-pad");
  EXPECT_EQ(first_npm_not_allowed(*set, {"*"}), "") << "fnmatch's * crosses the scope's /";
  EXPECT_EQ(first_npm_not_allowed(*set, {"left-*"}), "@types/node");
}

TEST(NpmKey, TheKeyNamesNodeTheSourceScriptsAndTheSetAndIsNeverAVenvs) {
  auto set = [](std::vector<std::string> r) { return canonical_npm_set(r).value(); };
  const std::string k = npm_key("/usr/bin/node 1 2", "tarballs=/srv/npm", set({"b@^1", "a"}));
  EXPECT_EQ(k.size(), 64u);
  // Two spellings of one set, one key.
  EXPECT_EQ(k, npm_key("/usr/bin/node 1 2", "tarballs=/srv/npm", set({"a", "b@^1", "a"})));
  EXPECT_NE(k, npm_key("/usr/bin/node 1 2", "tarballs=/srv/npm", set({"a"})));
  EXPECT_NE(k, npm_key("/usr/bin/node 1 3", "tarballs=/srv/npm", set({"b@^1", "a"})));
  EXPECT_NE(k, npm_key("/usr/bin/node 1 2", "tarballs=/srv/npm\ninstall_scripts", set({"b@^1", "a"})));
  EXPECT_NE(k, npm_key("/usr/bin/node 1 2", "registry=https://registry.npmjs.org/", set({"b@^1", "a"})));
}

}  // namespace
