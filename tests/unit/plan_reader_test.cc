// toolsandbox-init's reader of the plan (isolate/init/plan_reader.h),
// against the layout isolate/engine/plan.h documents, written here with the
// engine's codec (isolate/base/wire.h). The engine's own writer is checked
// by every integration test: no sandbox starts without a plan init accepts.
#include <gtest/gtest.h>
#include <linux/filter.h>

#include <cstring>

#include "isolate/base/wire.h"
#include "isolate/init/plan_reader.h"

namespace {

namespace init = tsb::isolate::init;
using tsb::isolate::Op;
using tsb::isolate::Stage;

struct StepIn {
  Op op;
  Stage stage;
  std::uint8_t flags;
  std::uint32_t mode;
  int fd, err;
  std::string path, source, data;
};

struct PlanIn {
  std::uint32_t magic = tsb::isolate::kPlanMagic;
  int fds[8] = {3, 4, 5, 6, 7, 8, 9, 10};
  int egress = -1;
  std::uint32_t backstop = 70;
  std::uint8_t network = tsb::isolate::kNetworkOwn;
  std::uint8_t landlock = tsb::isolate::kLandlockAuto;
  std::uint8_t end_note = 1;
  std::string staging = "/run/toolsandbox/root", hostname = "sandbox", workdir = "/work";
  std::vector<std::string> argv = {"/venv/bin/python3", "-c", "pass"}, envp = {"PATH=/venv/bin:/usr/bin", "HOME=/work"};
  std::string tool_filter = std::string(sizeof(sock_filter) * 2, '\x01'), init_filter = std::string(sizeof(sock_filter), '\x02');
  std::vector<StepIn> steps = {
      {Op::kAttach, Stage::MountBind, tsb::isolate::kStepDir, 0, 11, 0, "/usr", "", ""},
      {Op::kWriteFile, Stage::MountSkeleton, 0, 0644, -1, 0, "/etc/ld.so.cache", "", std::string("bin\0ary", 7)},
      {Op::kAttach, Stage::MountBind, tsb::isolate::kStepOptional, 0, -1, 2, "/lib32", "", ""},
      {Op::kMask, Stage::MaskProc, 0, 0, -1, 0, "/proc/kcore", "/.masked", ""},
      {Op::kCopyFile, Stage::MountSkeleton, 0, 0444, 12, 0, "/etc/hosts", "", ""},
      {Op::kAttach, Stage::MountTmpfs, tsb::isolate::kStepDir | tsb::isolate::kStepWritable | tsb::isolate::kStepNoExec,
       0, 13, 0, "/tmp", "", ""},
      {Op::kDevice, Stage::MountDev, 0, 0, -1, 0, "/dev/null", "", ""},
  };

  std::string bytes() const {
    tsb::Writer w;
    w.u32(magic);
    for (int fd : fds) w.i32(fd);
    w.i32(egress);
    w.u32(backstop);
    w.u8(network);
    w.u8(landlock);
    w.u8(end_note);
    w.cstr(staging);
    w.cstr(hostname);
    w.cstr(workdir);
    w.u32(1000);
    w.u32(1000);
    for (std::uint64_t v : {64ull << 20, 256ull, 64ull, 60000ull}) w.u64(v);
    for (const auto* list : {&argv, &envp}) {
      w.u32(static_cast<std::uint32_t>(list->size()));
      for (const auto& a : *list) w.cstr(a);
    }
    w.cstr(tool_filter);
    w.cstr(init_filter);
    w.u32(static_cast<std::uint32_t>(steps.size()));
    for (const StepIn& s : steps) {
      w.u8(static_cast<std::uint8_t>(s.op));
      w.u8(static_cast<std::uint8_t>(s.stage));
      w.u8(s.flags);
      w.u32(s.mode);
      w.i32(s.fd);
      w.i32(s.err);
      w.cstr(s.path);
      w.cstr(s.source);
      w.cstr(s.data);
    }
    return w.take();
  }
};

bool reads(const std::string& b) {
  init::Plan p{};
  const bool ok = init::read_plan(b.data(), b.size(), &p);
  init::release_plan(&p);
  return ok;
}

}  // namespace

TEST(PlanReader, ReadsThePlanAsDocumented) {
  const PlanIn in;
  const std::string b = in.bytes();
  init::Plan p{};
  ASSERT_TRUE(init::read_plan(b.data(), b.size(), &p));
  EXPECT_EQ(p.report_fd, 3);
  EXPECT_EQ(p.root_fd, 10);
  EXPECT_EQ(p.backstop_s, 70u);
  EXPECT_EQ(p.network, tsb::isolate::kNetworkOwn);
  EXPECT_EQ(p.egress_fd, -1);
  EXPECT_STREQ(p.staging, "/run/toolsandbox/root");
  EXPECT_STREQ(p.workdir, "/work");
  EXPECT_EQ(p.open_files, 256u);
  EXPECT_EQ(p.cpu_time_ms, 60000u);
  ASSERT_NE(p.argv, nullptr);
  EXPECT_STREQ(p.argv[2], "pass");
  EXPECT_EQ(p.argv[3], nullptr);
  EXPECT_STREQ(p.envp[1], "HOME=/work");
  EXPECT_EQ(p.envp[2], nullptr);
  EXPECT_EQ(p.tool_filter.len, 2);
  EXPECT_EQ(p.init_filter.len, 1);
  EXPECT_EQ(p.landlock, tsb::isolate::kLandlockAuto);
  EXPECT_EQ(p.end_note, 1);
  ASSERT_EQ(p.nsteps, 7u);
  EXPECT_EQ(p.steps[0].op, Op::kAttach);
  EXPECT_TRUE(p.steps[0].dir);
  EXPECT_EQ(p.steps[0].fd, 11);
  EXPECT_EQ(p.steps[1].len, 7u) << "file contents keep their NUL bytes";
  EXPECT_EQ(std::memcmp(p.steps[1].data, "bin\0ary", 7), 0);
  EXPECT_EQ(p.steps[1].mode, 0644u);
  EXPECT_TRUE(p.steps[2].optional);
  EXPECT_EQ(p.steps[2].err, 2);
  EXPECT_STREQ(p.steps[3].source, "/.masked");
  EXPECT_EQ(p.steps[4].op, Op::kCopyFile);
  EXPECT_EQ(p.steps[4].fd, 12);
  EXPECT_FALSE(p.steps[0].writable || p.steps[0].noexec);
  EXPECT_TRUE(p.steps[5].writable && p.steps[5].noexec && p.steps[5].dir);
  EXPECT_EQ(p.steps[6].op, Op::kDevice);
  init::release_plan(&p);
}

TEST(PlanReader, EgressComesWithItsSocket) {
  PlanIn in;
  in.network = tsb::isolate::kNetworkEgress;
  in.egress = 12;
  const std::string b = in.bytes();
  init::Plan p{};
  ASSERT_TRUE(init::read_plan(b.data(), b.size(), &p));
  EXPECT_EQ(p.network, tsb::isolate::kNetworkEgress);
  EXPECT_EQ(p.egress_fd, 12);
  init::release_plan(&p);
}

TEST(PlanReader, RefusesAnythingElse) {
  const std::string good = PlanIn{}.bytes();
  // Cut anywhere, or with a byte more.
  for (std::size_t n = 0; n < good.size(); ++n) EXPECT_FALSE(reads(good.substr(0, n))) << "cut at " << n;
  EXPECT_FALSE(reads(good + "x"));
  auto variant = [](auto change) {
    PlanIn in;
    change(in);
    return in.bytes();
  };
  EXPECT_FALSE(reads(variant([](PlanIn& p) { p.magic = 0x70627373; })));
  EXPECT_FALSE(reads(variant([](PlanIn& p) { p.fds[7] = -1; }))) << "a descriptor the plan needs";
  EXPECT_FALSE(reads(variant([](PlanIn& p) { p.network = 3; })));
  EXPECT_FALSE(reads(variant([](PlanIn& p) { p.network = tsb::isolate::kNetworkEgress; })))
      << "egress without its socket";
  EXPECT_FALSE(reads(variant([](PlanIn& p) { p.egress = 12; }))) << "a socket without egress";
  EXPECT_FALSE(reads(variant([](PlanIn& p) {
    p.network = tsb::isolate::kNetworkEgress;
    p.egress = -2;
  })));
  EXPECT_FALSE(reads(variant([](PlanIn& p) { p.staging = "relative"; })));
  EXPECT_FALSE(reads(variant([](PlanIn& p) { p.workdir = "work"; })));
  EXPECT_FALSE(reads(variant([](PlanIn& p) { p.hostname = ""; })));
  EXPECT_FALSE(reads(variant([](PlanIn& p) { p.argv = {}; }))) << "nothing to run";
  EXPECT_FALSE(reads(variant([](PlanIn& p) { p.argv = {std::string("a\0b", 3)}; }))) << "a NUL inside a text";
  EXPECT_FALSE(reads(variant([](PlanIn& p) { p.envp.push_back(std::string("X=\0", 3)); })));
  EXPECT_FALSE(reads(variant([](PlanIn& p) { p.tool_filter = ""; }))) << "an empty filter is never \"no filter\"";
  EXPECT_FALSE(reads(variant([](PlanIn& p) { p.init_filter = "123"; }))) << "not whole instructions";
  EXPECT_FALSE(reads(variant([](PlanIn& p) { p.tool_filter = std::string((BPF_MAXINSNS + 1) * sizeof(sock_filter), 'x'); })));
  EXPECT_FALSE(reads(variant([](PlanIn& p) { p.steps[0].op = static_cast<Op>(tsb::isolate::kOpLast + 1); })));
  EXPECT_FALSE(reads(variant([](PlanIn& p) { p.steps[0].stage = Stage::kCount; })));
  EXPECT_FALSE(reads(variant([](PlanIn& p) { p.steps[0].flags = 16; })));
  EXPECT_FALSE(reads(variant([](PlanIn& p) { p.landlock = 2; })));
  EXPECT_FALSE(reads(variant([](PlanIn& p) { p.end_note = 2; })));
  EXPECT_FALSE(reads(variant([](PlanIn& p) { p.steps[0].path = "usr"; }))) << "a step outside the sandbox's root";
  EXPECT_FALSE(reads(variant([](PlanIn& p) { p.steps[3].source = std::string("/.m\0asked", 9); })));
  EXPECT_FALSE(reads(variant([](PlanIn& p) { p.steps[4].fd = -1; }))) << "a copy without its host file";
  EXPECT_FALSE(reads(variant([](PlanIn& p) { p.steps[4].fd = 2; }))) << "a copy from init's own stdio";
}
