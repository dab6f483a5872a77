// Every limit, exercised by a hostile payload. Run inside the outer guard.
#include <sys/resource.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "tests/integration/harness.h"

using namespace tsb::testing;
using tsb::isolate::EndReason;
using namespace std::chrono_literals;

namespace {
long self_hwm_kib() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stol(line.substr(6));
  return -1;
}
}  // namespace

TEST_F(EngineTest, ForkBombStopsAtThePidsLimit) {
  auto s = probe_spec({"fork-bomb", "100000"});
  s.limits.pids = 32;
  s.limits.wall_timeout = 20s;
  auto r = run(s);
  auto v = parse_lines(r.stdout_data);
  ASSERT_FALSE(v.empty()) << describe(r);
  EXPECT_LT(v.back()["forked"].get<int>(), 32) << v.back().dump();
  EXPECT_EQ(v.back()["errname"], "EAGAIN") << v.back().dump();
  // The probe exits 0 after reporting; its children are killed with the
  // sandbox. Either way the run ends well before the wall-clock limit.
  EXPECT_LT(r.wall, 15s) << describe(r);
}

TEST_F(EngineTest, ForkBombThatFailsIsReportedAsPidsLimit) {
  auto s = spec({"/bin/sh", "-c", std::string(kProbe) + " fork-bomb 100000 >/dev/null; exit 1"});
  s.limits.pids = 16;
  auto r = run(s);
  EXPECT_EQ(r.reason, EndReason::PidsLimit) << describe(r);
}

TEST_F(EngineTest, MemoryBombEndsAsOom) {
  auto s = probe_spec({"mem-hog", "0"});
  s.limits.memory_bytes = 64ull << 20;
  s.limits.wall_timeout = 30s;
  auto r = run(s);
  EXPECT_EQ(r.reason, EndReason::MemoryLimit) << describe(r);
  EXPECT_GT(r.peak_memory_bytes, 32ull << 20);
  EXPECT_LE(r.peak_memory_bytes, (64ull << 20) + (4ull << 20));
}

TEST_F(EngineTest, TmpfsFillGetsEnospc) {
  auto s = probe_spec({"fill", "/tmp/big"}, [](tsb::isolate::FsInputs& in) { in.tmp_bytes = 8ull << 20; });
  s.limits.file_size_bytes = 1ull << 30;
  auto j = parse_lines(run(s).stdout_data).at(0);
  EXPECT_EQ(j["errname"], "ENOSPC") << j.dump();
  EXPECT_LE(j["bytes"].get<std::uint64_t>(), 8ull << 20);
}

TEST_F(EngineTest, FileSizeLimitGetsEfbig) {
  auto s = probe_spec({"fill", "/work/big"});
  s.limits.file_size_bytes = 1ull << 20;
  auto j = parse_lines(run(s).stdout_data).at(0);
  EXPECT_EQ(j["errname"], "EFBIG") << j.dump();
  EXPECT_EQ(j["bytes"].get<std::uint64_t>(), 1ull << 20);
}

TEST_F(EngineTest, CpuSpinEndsAtTheWallTimeout) {
  auto s = probe_spec({"spin"});
  s.limits.wall_timeout = 1500ms;
  s.limits.cpu_time = 0ms;
  auto r = run(s);
  EXPECT_EQ(r.reason, EndReason::Timeout) << describe(r);
  EXPECT_GE(r.wall, 1500ms);
  EXPECT_LT(r.wall, 5s);
}

TEST_F(EngineTest, SleepEndsAtTheWallTimeout) {
  auto s = probe_spec({"sleep", "3600"});
  s.limits.wall_timeout = 1s;
  auto r = run(s);
  EXPECT_EQ(r.reason, EndReason::Timeout) << describe(r);
  EXPECT_LT(r.wall, 4s);
}

TEST_F(EngineTest, CpuTimeLimitCoversTheWholeRun) {
  // Two spinning processes: per-process RLIMIT_CPU alone would allow twice
  // the budget; the engine measures the cgroup.
  auto s = spec({"/bin/sh", "-c", std::string(kProbe) + " spin & " + kProbe + " spin; wait"});
  s.limits.cpu_time = 1000ms;
  s.limits.cpu_quota_millicpus = 2000;
  s.limits.wall_timeout = 20s;
  auto r = run(s);
  EXPECT_EQ(r.reason, EndReason::CpuLimit) << describe(r);
  EXPECT_LT(r.wall, 10s);
  EXPECT_GE(r.cpu, 900ms);
}

TEST_F(EngineTest, DaemonizedGrandchildrenAreGoneAfterTheRun) {
  // keep-stdio: the grandchild keeps the output pipes open, so the run can
  // only end because the engine killed the whole namespace.
  auto s = spec({"/bin/sh", "-c", std::string(kProbe) + " daemonize keep-stdio; exit 0"});
  auto r = run(s);
  EXPECT_EQ(r.reason, EndReason::Exited) << describe(r);
  EXPECT_LT(r.wall, 5s) << describe(r);
  EXPECT_TRUE(host_pids_with_uid_in(r.host_uid, r.host_uid + 65536).empty());
}

TEST_F(EngineTest, DaemonizedGrandchildrenAreGoneAfterATimeout) {
  auto s = spec({"/bin/sh", "-c", std::string(kProbe) + " daemonize; sleep 3600"});
  s.limits.wall_timeout = 1s;
  auto r = run(s);
  EXPECT_EQ(r.reason, EndReason::Timeout) << describe(r);
  EXPECT_TRUE(host_pids_with_uid_in(r.host_uid, r.host_uid + 65536).empty());
}

TEST_F(EngineTest, OutputFloodIsCappedAndMemoryStaysFlat) {
  long before = self_hwm_kib();
  auto s = probe_spec({"flood", std::to_string(2ull << 30)});
  s.limits.stdout_bytes = 1ull << 20;
  s.limits.wall_timeout = 60s;
  auto r = run(s);
  long after = self_hwm_kib();
  EXPECT_EQ(r.reason, EndReason::OutputLimit) << describe(r);
  EXPECT_TRUE(r.stdout_truncated);
  EXPECT_EQ(r.stdout_data.size(), 1u << 20);
  EXPECT_LT(after - before, 64 * 1024) << "the engine's memory grew with the tool's output";
  EXPECT_LT(r.wall, 30s);
}

TEST_F(EngineTest, StderrFloodIsCappedToo) {
  auto s = spec({"/bin/sh", "-c", "yes xxxxxxxxxxxxxxxx >&2"});
  s.limits.stderr_bytes = 64 * 1024;
  auto r = run(s);
  EXPECT_EQ(r.reason, EndReason::OutputLimit) << describe(r);
  EXPECT_TRUE(r.stderr_truncated);
  EXPECT_EQ(r.stderr_data.size(), 64u * 1024);
}

TEST_F(EngineTest, RlimitsAreApplied) {
  // The engine's own priority limits raised first where this process may
  // (root with CAP_SYS_RESOURCE; the outer guard may have dropped it): the
  // run's are 0 whatever the engine had.
  struct rlimit nice_before{}, rt_before{};
  ASSERT_EQ(::getrlimit(RLIMIT_NICE, &nice_before), 0);
  ASSERT_EQ(::getrlimit(RLIMIT_RTPRIO, &rt_before), 0);
  const struct rlimit raised_nice{20, 20}, raised_rt{50, 50};
  const bool raised = ::setrlimit(RLIMIT_NICE, &raised_nice) == 0 && ::setrlimit(RLIMIT_RTPRIO, &raised_rt) == 0;
  if (!raised) std::fprintf(stderr, "RlimitsAreApplied: the engine's RLIMIT_NICE/RTPRIO could not be raised (%s)\n",
                            std::strerror(errno));
  auto j = probe1({"rlimits"});
  (void)::setrlimit(RLIMIT_NICE, &nice_before);
  (void)::setrlimit(RLIMIT_RTPRIO, &rt_before);
  EXPECT_EQ(j["CORE"]["hard"], 0);
  EXPECT_EQ(j["NICE"]["hard"], 0) << "no process of the run may raise its priority";
  EXPECT_EQ(j["RTPRIO"]["hard"], 0) << "no process of the run may take a real-time policy";
  EXPECT_EQ(j["NOFILE"]["hard"], policy_->limits.open_files);
  EXPECT_EQ(j["FSIZE"]["hard"], policy_->limits.file_size_bytes);
}
