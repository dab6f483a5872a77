// A session command's own packages (daemon/frontend/session/packages.h):
// the launcher words the daemon takes, the ones it refuses, and the
// program it picks in a built tree, never outside it.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "daemon/frontend/session/packages.h"

namespace tsb::core {
namespace {

PackageLaunch launch(std::vector<std::string> c) {
  auto r = parse_package_launch(c);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
  EXPECT_TRUE(r.ok() && *r);
  return r.ok() && *r ? **r : PackageLaunch{};
}

std::string refusal(std::vector<std::string> c) {
  auto r = parse_package_launch(c);
  return r.ok() ? "" : r.error().message;
}

TEST(SessionPackages, NpxAsLettaAndMcpClientsWriteIt) {
  PackageLaunch l = launch({"npx", "-y", "@modelcontextprotocol/server-memory"});
  EXPECT_TRUE(l.npm);
  EXPECT_EQ(l.requirements, std::vector<std::string>{"@modelcontextprotocol/server-memory"});
  EXPECT_EQ(l.program, "");
  EXPECT_TRUE(l.args.empty());
  // Every word after the package is the program's, options too.
  l = launch({"npx", "--yes", "server-filesystem@^2025.1", "/work", "-y", "--", "x"});
  EXPECT_EQ(l.requirements, std::vector<std::string>{"server-filesystem@^2025.1"});
  EXPECT_EQ(l.args, (std::vector<std::string>{"/work", "-y", "--", "x"}));
  l = launch({"npx", "-p", "a", "--package=b@1", "--package", "c", "run-it", "1"});
  EXPECT_EQ(l.requirements, (std::vector<std::string>{"a", "b@1", "c"}));
  EXPECT_EQ(l.program, "run-it");
  EXPECT_EQ(l.args, std::vector<std::string>{"1"});
  l = launch({"npx", "--", "-weird"});  // after --, a word is the package even when it looks like an option
  EXPECT_EQ(l.requirements, std::vector<std::string>{"-weird"});
}

TEST(SessionPackages, UvxAsLettaAndMcpClientsWriteIt) {
  PackageLaunch l = launch({"uvx", "mcp-server-fetch", "--ignore-robots-txt"});
  EXPECT_FALSE(l.npm);
  EXPECT_EQ(l.requirements, std::vector<std::string>{"mcp-server-fetch"});
  EXPECT_EQ(l.program, "mcp-server-fetch");
  EXPECT_EQ(l.args, std::vector<std::string>{"--ignore-robots-txt"});
  l = launch({"uvx", "tool@1.2", "x"});
  EXPECT_EQ(l.requirements, std::vector<std::string>{"tool==1.2"});
  EXPECT_EQ(l.program, "tool");
  l = launch({"uvx", "tool@latest"});
  EXPECT_EQ(l.requirements, std::vector<std::string>{"tool"});
  l = launch({"uvx", "--from", "pkg[extra]>=2", "--with", "b", "--with=c", "-q", "cmd"});
  EXPECT_EQ(l.requirements, (std::vector<std::string>{"pkg[extra]>=2", "b", "c"}));
  EXPECT_EQ(l.program, "cmd");
}

TEST(SessionPackages, WhatIsNotALauncherOrNotTaken) {
  auto plain = parse_package_launch({"node", "x.js"});
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(*plain);
  auto path = parse_package_launch({"/usr/bin/npx", "-y", "x"});  // a path is a program of the policy's
  ASSERT_TRUE(path.ok());
  EXPECT_FALSE(*path);
  for (const auto& c : std::vector<std::vector<std::string>>{
           {"npx"}, {"npx", "-y"}, {"npx", "-c", "sh -c id"}, {"npx", "--call=id"}, {"npx", "-p"},
           {"npx", "-p", "a", "../b"}, {"npx", "-p", "a", "b/c"}, {"npx", "--registry", "http://x", "a"},
           {"uvx"}, {"uvx", "--python", "3.8", "x"}, {"uvx", "-p", "3.8", "x"}, {"uvx", "--from"},
           {"uvx", "--from", "a", "--from", "b", "x"}, {"uvx", "--from", "a", "x@1"}, {"uvx", "../x"},
           {"uvx", "x/y"}, {"uvx", "--index-url", "http://x", "y"}, {"uvx", ".hidden"}, {"uvx", "--from=", "x"},
           {"uvx", "--from", "", "x"}, {"uvx", "x@"}})
    EXPECT_NE(refusal(c), "") << c.size() << " " << c.back();
  EXPECT_NE(refusal({"npx", "-c", "id"}).find("shell"), std::string::npos);
}

class SessionPackageTree : public ::testing::Test {
 protected:
  void SetUp() override {
    char t[] = "/tmp/tsb-pkgs-XXXXXX";
    ASSERT_NE(::mkdtemp(t), nullptr);
    dir = t;
  }
  void TearDown() override { (void)std::system(("rm -rf '" + dir + "'").c_str()); }
  void file(const std::string& rel, const std::string& text) {
    const std::string path = dir + "/" + rel;
    (void)std::system(("mkdir -p '" + path.substr(0, path.rfind('/')) + "'").c_str());
    std::ofstream(path) << text;
  }
  std::string dir;
};

TEST_F(SessionPackageTree, TheProgramNpxWouldRun) {
  file("one/package.json", R"({"name": "one", "bin": "./dist/cli.js"})");
  file("one/dist/cli.js", "");
  EXPECT_EQ(*npm_program(dir, "one", ""), "/node_modules/one/dist/cli.js");
  file("@s/two/package.json", R"({"bin": {"other": "o.js", "two": "bin//t.js"}})");
  file("@s/two/o.js", "");
  file("@s/two/bin/t.js", "");
  EXPECT_EQ(*npm_program(dir, "@s/two", ""), "/node_modules/@s/two/bin/t.js");  // named as the package
  EXPECT_EQ(*npm_program(dir, "@s/two", "other"), "/node_modules/@s/two/o.js");
  EXPECT_FALSE(npm_program(dir, "@s/two", "nope").ok());
  file("three/package.json", R"({"bin": {"only": "x.js"}})");
  file("three/x.js", "");
  EXPECT_EQ(*npm_program(dir, "three", ""), "/node_modules/three/x.js");  // its only bin
  file("four/package.json", R"({"bin": {"a": "a.js", "b": "b.js"}})");
  EXPECT_FALSE(npm_program(dir, "four", "").ok());  // which one?
  file("aliases/package.json", R"({"bin": {"x": "./cli.js", "y": "cli.js"}})");
  file("aliases/cli.js", "");
  EXPECT_EQ(*npm_program(dir, "aliases", ""), "/node_modules/aliases/cli.js");  // one file, two names
  file("five/package.json", R"({"name": "five"})");
  EXPECT_NE(npm_program(dir, "five", "").error().message.find("no \"bin\""), std::string::npos);
  EXPECT_FALSE(npm_program(dir, "missing", "").ok());
}

TEST_F(SessionPackageTree, NeverAFileOutsideThePackage) {
  file("secret.js", "");
  file("up/package.json", R"({"bin": "../secret.js"})");
  EXPECT_FALSE(npm_program(dir, "up", "").ok());
  file("abs/package.json", R"({"bin": "/etc/passwd"})");
  file("abs/etc/passwd", "");  // read as a path in the package: that one is there
  EXPECT_EQ(*npm_program(dir, "abs", ""), "/node_modules/abs/etc/passwd");
  file("dir/package.json", R"({"bin": "lib"})");
  file("dir/lib/x", "");
  EXPECT_FALSE(npm_program(dir, "dir", "").ok());  // a directory
  file("link/real.js", "");
  file("link/package.json", R"({"bin": "l.js"})");
  ASSERT_EQ(::symlink((dir + "/secret.js").c_str(), (dir + "/link/l.js").c_str()), 0);
  EXPECT_FALSE(npm_program(dir, "link", "").ok());  // no link followed
  // A whole package outside the tree, reached through a link or "..":
  // never read (without the openat2 rules, both would resolve).
  char out[] = "/tmp/tsb-pkgs-out-XXXXXX";
  ASSERT_NE(::mkdtemp(out), nullptr);
  const std::string outside = out;
  (void)std::system(("mkdir -p '" + outside + "/pkg' && echo '{\"bin\": \"x.js\"}' > '" + outside +
                     "/pkg/package.json' && touch '" + outside + "/pkg/x.js'").c_str());
  ASSERT_TRUE(npm_program(outside, "pkg", "").ok()) << "the outside package is whole";
  ASSERT_EQ(::symlink((outside + "/pkg").c_str(), (dir + "/linked").c_str()), 0);
  EXPECT_FALSE(npm_program(dir, "linked", "").ok());
  EXPECT_FALSE(npm_program(dir, "../" + outside.substr(outside.rfind('/') + 1) + "/pkg", "").ok());
  (void)std::system(("rm -rf '" + outside + "'").c_str());
  file("big/package.json", "{\"bin\": \"" + std::string(2u << 20, 'x') + "\"}");
  EXPECT_FALSE(npm_program(dir, "big", "").ok());
  file("notjson/package.json", "bin: x");
  EXPECT_FALSE(npm_program(dir, "notjson", "").ok());
}

TEST_F(SessionPackageTree, AVenvsConsoleScript) {
  file("bin/tool", "#!/venv/bin/python3\n");
  EXPECT_EQ(*venv_program(dir, "tool"), "/venv/bin/tool");
  EXPECT_FALSE(venv_program(dir, "other").ok());
  EXPECT_FALSE(venv_program(dir, "../bin/tool").ok());
  ASSERT_EQ(::symlink("/usr/bin/python3", (dir + "/bin/py").c_str()), 0);
  EXPECT_FALSE(venv_program(dir, "py").ok());
}

}  // namespace
}  // namespace tsb::core
