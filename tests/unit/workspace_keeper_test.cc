// What the front end takes from a workspace's keeper
// (daemon/frontend/session/workspace.h): an answer the keeper could not
// have meant is no answer, and the workspace is then not kept.
#include <gtest/gtest.h>

#include "daemon/frontend/session/workspace.h"

namespace tsb::core {
namespace {

TEST(KeeperStatus, AnExitOrASignalAndTheCpuTime) {
  auto e = parse_keeper_status(R"({"exit": 3, "cpu_ms": 12.5})");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->exit_code, 3);
  EXPECT_EQ(e->signal, 0);
  EXPECT_DOUBLE_EQ(e->cpu_ms, 12.5);
  auto s = parse_keeper_status(R"({"signal": 9, "cpu_ms": 0})");
  ASSERT_TRUE(s);
  EXPECT_EQ(s->exit_code, -1);
  EXPECT_EQ(s->signal, 9);
  for (const char* bad : {"", "[]", "{}", "null", R"({"exit": 0})", R"({"exit": 0, "signal": 9, "cpu_ms": 1})",
                          R"({"exit": 256, "cpu_ms": 1})", R"({"exit": -1, "cpu_ms": 1})", R"({"exit": "0", "cpu_ms": 1})",
                          R"({"signal": 0, "cpu_ms": 1})", R"({"signal": 65, "cpu_ms": 1})", R"({"exit": 1.5, "cpu_ms": 1})",
                          R"({"exit": 0, "cpu_ms": -1})", R"({"exit": 0, "cpu_ms": "1"})", R"({"exit": 0, "cpu_ms": 1)"})
    EXPECT_FALSE(parse_keeper_status(bad)) << bad;
}

TEST(WorkspaceKey, ClientOrganizationPolicyAndNameNeverRunTogether) {
  EXPECT_NE(workspace_key(0, "a", "b", "c"), workspace_key(0, "a", "bc", ""));
  EXPECT_NE(workspace_key(0, "ab", "c", "d"), workspace_key(0, "a", "bc", "d"));
  EXPECT_NE(workspace_key(1, "o", "p", "n"), workspace_key(11, "o", "p", "n")) << "another client uid, another workspace";
  EXPECT_NE(workspace_key(1, "1o", "p", "n"), workspace_key(11, "o", "p", "n"));
  EXPECT_EQ(workspace_key(0, "o", "p", "n"), workspace_key(0, "o", "p", "n"));
}

TEST(KeeperMessage, TheCommandAndItsEnvironment) {
  EXPECT_EQ(keeper_session_message({"/usr/bin/node", "a b"}, {{"K", "v"}}),
            R"({"argv":["/usr/bin/node","a b"],"env":{"K":"v"}})");
  EXPECT_EQ(keeper_session_message({"/usr/bin/node"}, {}), R"({"argv":["/usr/bin/node"],"env":{}})");
}

}  // namespace
}  // namespace tsb::core
