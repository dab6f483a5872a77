// End-reason classification: the pure part of the supervisor.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <csignal>

#include "isolate/supervise/supervise.h"

using namespace tsb::isolate;

namespace {
RunResult classify_obs(const Observations& o) {
  RunResult r;
  classify(o, r);
  return r;
}
int exited(int code) { return W_EXITCODE(code, 0); }
int killed(int sig) { return sig; }
}  // namespace

TEST(Classify, NormalExit) {
  Observations o;
  o.have_tool_status = true;
  o.tool_status = exited(3);
  auto r = classify_obs(o);
  EXPECT_EQ(r.reason, EndReason::Exited);
  EXPECT_EQ(r.exit_code, 3);
}

TEST(Classify, SignalFromTheTool) {
  Observations o;
  o.have_tool_status = true;
  o.tool_status = killed(SIGSEGV);
  auto r = classify_obs(o);
  EXPECT_EQ(r.reason, EndReason::Signaled);
  EXPECT_EQ(r.signal, SIGSEGV);
  EXPECT_EQ(r.exit_code, -1);
}

TEST(Classify, SetupErrorWinsOverEverything) {
  Observations o;
  o.have_setup_error = true;
  o.setup_stage = static_cast<int>(Stage::Execve);
  o.setup_errno = ENOENT;
  o.have_tool_status = true;
  o.tool_status = exited(127);
  o.timed_out = true;
  auto r = classify_obs(o);
  EXPECT_EQ(r.reason, EndReason::SetupFailed);
  EXPECT_EQ(r.setup_stage, Stage::Execve);
  EXPECT_EQ(r.setup_errno, ENOENT);
  EXPECT_EQ(r.error, "sandbox set-up failed at execve: No such file or directory");
}

TEST(Classify, EngineDecisionsBeforeKernelCounters) {
  Observations o;
  o.timed_out = true;
  o.oom_kills = 1;
  EXPECT_EQ(classify_obs(o).reason, EndReason::Timeout);
  o.timed_out = false;
  o.output_exceeded = true;
  EXPECT_EQ(classify_obs(o).reason, EndReason::OutputLimit);
  o.output_exceeded = false;
  EXPECT_EQ(classify_obs(o).reason, EndReason::MemoryLimit);
  o.cancelled = true;
  EXPECT_EQ(classify_obs(o).reason, EndReason::Cancelled);
}

TEST(Classify, SocketBuffersAtTheLimitAreAMemoryLimit) {
  Observations o;
  o.socket_limit_reached = true;
  o.have_tool_status = true;
  o.tool_status = killed(SIGKILL);
  auto r = classify_obs(o);
  EXPECT_EQ(r.reason, EndReason::MemoryLimit);
  EXPECT_NE(r.error.find("socket buffers"), std::string::npos);
  o.timed_out = true;  // decided earlier: it wins
  EXPECT_EQ(classify_obs(o).reason, EndReason::Timeout);
}

TEST(Classify, PidsLimitOnlyWhenTheToolFailed) {
  Observations o;
  o.pids_max_hits = 5;
  o.have_tool_status = true;
  o.tool_status = exited(0);
  EXPECT_EQ(classify_obs(o).reason, EndReason::Exited);
  o.tool_status = exited(1);
  EXPECT_EQ(classify_obs(o).reason, EndReason::PidsLimit);
}

TEST(Classify, CpuLimitFromRlimitSignal) {
  Observations o;
  o.have_tool_status = true;
  o.tool_status = killed(SIGXCPU);
  EXPECT_EQ(classify_obs(o).reason, EndReason::CpuLimit);
}

TEST(Classify, InitGoneWithoutReport) {
  Observations o;
  auto r = classify_obs(o);
  EXPECT_EQ(r.reason, EndReason::Signaled);
  EXPECT_FALSE(r.error.empty());
}

TEST(Classify, EveryStageHasAName) {
  for (int s = 0; s < static_cast<int>(Stage::kCount); ++s)
    EXPECT_STRNE(stage_name(static_cast<Stage>(s)), "unknown") << s;
}
