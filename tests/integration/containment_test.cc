// What a tool can learn about the host or take from it, asserted from inside
// real sandboxes: mountinfo, /proc/cmdline, the boot id, memfd execution,
// socket memory, the OOM score. And the child path's own races.
#include <fcntl.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <thread>

#include "tests/integration/harness.h"

using namespace tsb::testing;
using tsb::isolate::EndReason;
using tsb::isolate::Stage;
using nlohmann::json;

namespace {

std::string host_file(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  std::string l;
  while (std::getline(in, l))
    if (!l.empty()) out.push_back(l);
  return out;
}

std::vector<std::string> fields(const std::string& line) {
  std::vector<std::string> out;
  std::istringstream in(line);
  std::string f;
  while (in >> f) out.push_back(f);
  return out;
}

}  // namespace

// Every field of every line of /proc/self/mountinfo is the engine's choice:
// no host path, device, file system or host uid. (Before: the venv's host
// path, /dev/vda and ext4's options, devtmpfs with half the host's memory
// as its size, and uid=<the run's host uid> on every tmpfs.)
TEST_F(EngineTest, MountinfoShowsNothingOfTheHost) {
  auto s = probe_spec({"readfile", "/proc/self/mountinfo", "65536"});
  auto r = run(s);
  ASSERT_EQ(r.reason, EndReason::Exited) << describe(r);
  auto j = parse_lines(r.stdout_data).at(0);
  ASSERT_TRUE(j["ok"].get<bool>()) << j.dump();
  const std::string text = j["data"];
  ASSERT_FALSE(text.empty());
  const std::string base = std::to_string(r.host_uid);
  for (const auto& line : split_lines(text)) {
    // id parent maj:min root mountpoint options [optional...] - fstype source superoptions
    auto dash = line.find(" - ");
    ASSERT_NE(dash, std::string::npos) << line;
    auto pre = fields(line.substr(0, dash));
    auto post = fields(line.substr(dash + 3));
    ASSERT_GE(pre.size(), 6u) << line;
    ASSERT_GE(post.size(), 2u) << line;
    const std::string& dev = pre[2];
    const std::string& root = pre[3];
    const std::string& fstype = post[0];
    const std::string& source = post[1];
    const std::string super = post.size() > 2 ? post[2] : "";
    EXPECT_TRUE(fstype == "tmpfs" || fstype == "overlay" || fstype == "proc") << "host file system: " << line;
    EXPECT_TRUE(source == "toolsandbox" || source == "proc") << "host mount source: " << line;
    if (fstype != "proc") EXPECT_EQ(dev.rfind("0:", 0), 0u) << "a host device number: " << line;
    // Roots: "/" for the engine's own mounts, or a path inside the root
    // tmpfs / procfs (masks, the read-only /proc parts).
    EXPECT_TRUE(root == "/" || root.rfind("/.masks/", 0) == 0 || fstype == "proc")
        << "a host path as mount root: " << line;
    EXPECT_EQ(line.find("uid="), std::string::npos) << "an owner in the mount options: " << line;
    EXPECT_EQ(line.find("gid="), std::string::npos) << "an owner in the mount options: " << line;
    EXPECT_EQ(line.find(base), std::string::npos) << "the run's host uid: " << line;
    EXPECT_EQ(line.find(policy_->venv), std::string::npos) << line;
    EXPECT_EQ(line.find(TSB_SOURCE_DIR), std::string::npos) << line;
    EXPECT_EQ(line.find(probe_dir()), std::string::npos) << line;
    if (fstype == "overlay") {
      // lowerdir names the engine's descriptors, not host paths.
      for (std::size_t p = super.find("lowerdir="); p != std::string::npos; p = super.find("lowerdir=", p + 1)) {
        std::string v = super.substr(p + 9, super.find(',', p) - p - 9);
        std::istringstream parts(v);
        std::string part;
        while (std::getline(parts, part, ':')) EXPECT_EQ(part.rfind("/proc/self/fd/", 0), 0u) << line;
      }
    }
  }
  // The /proc view of mounts says the same.
  auto m = probe1({"readfile", "/proc/self/mounts", "65536"});
  const std::string mounts = m["data"];
  for (const auto& line : split_lines(mounts)) {
    auto f = fields(line);
    ASSERT_GE(f.size(), 3u) << line;
    EXPECT_TRUE(f[0] == "toolsandbox" || f[0] == "proc") << "host mount source: " << line;
  }
  EXPECT_EQ(mounts.find("uid="), std::string::npos) << mounts;
}

// The host kernel's command line (boot parameters, and here the machine's
// own infrastructure) is masked; the boot id is random per run, so two runs
// of the same tenant, or of two tenants, cannot be linked through it.
// A bind is a clone of the host's mount at its source. When that mount is
// shared, the clone must not stay in its peer group: a bind nested inside
// it (here a read-only directory below a writable one) would otherwise
// appear on the host, one more after every run, and host mount events
// would reach the sandbox.
TEST_F(EngineTest, NestedBindInsideABindStaysInTheSandbox) {
  const std::string outer = "/run/tsb-test-shared-bind", inner = "/run/tsb-test-nested-bind";
  ::umount2((outer + "/sub").c_str(), MNT_DETACH);
  ::umount2(outer.c_str(), MNT_DETACH);
  ::mkdir(outer.c_str(), 0755);
  ::mkdir(inner.c_str(), 0755);
  ASSERT_EQ(::mount("tsb-test", outer.c_str(), "tmpfs", 0, "mode=0755"), 0) << std::strerror(errno);
  ASSERT_EQ(::mount(nullptr, outer.c_str(), nullptr, MS_SHARED, nullptr), 0) << std::strerror(errno);
  ::mkdir((outer + "/sub").c_str(), 0755);
  auto mounts_below = [&] {
    std::ifstream in("/proc/self/mountinfo");
    std::string line;
    int n = 0;
    while (std::getline(in, line)) n += line.find(" " + outer + "/") != std::string::npos;
    return n;
  };
  auto s = spec({"/bin/true"}, [&](tsb::isolate::FsInputs& in) {
    in.binds.push_back({outer, "/data", true, false});
    in.binds.push_back({inner, "/data/sub", false, false});
  });
  for (int i = 0; i < 3; ++i) {
    auto r = run(s);
    EXPECT_EQ(r.reason, EndReason::Exited) << describe(r);
  }
  EXPECT_EQ(mounts_below(), 0) << "mounts made inside sandboxes appeared below " << outer << " on the host";
  ::umount2((outer + "/sub").c_str(), MNT_DETACH);
  ::umount2(outer.c_str(), MNT_DETACH);
  ::rmdir(outer.c_str());
  ::rmdir(inner.c_str());
}

// A writable bind is shared by every run of its policy, so a tool can leave
// symlinks there for the next run. The sandbox is built before pivot_root,
// when an absolute link resolves on the host: a row nested under the bind
// must not follow one (it would make the next run's init create directories
// and mount on the host's side): init removes the link and makes the
// directory, so the run goes on and so do the runs after it. Root must not
// read through one when it copies a host file in (a file behind a directory
// the run's ids cannot enter, or one swapped in between a check and the
// read): that run is refused (the policy language refuses a bind source
// inside a writable bind, so a tool cannot plant one there).
TEST_F(EngineTest, LinksLeftInAWritableBindAreNeverFollowed) {
  const std::string shared = "/run/tsb-test-shared", inner = "/run/tsb-test-inner", outside = "/run/tsb-test-outside",
                    secret_dir = "/run/tsb-test-secret";
  for (const auto& d : {shared, inner, outside, secret_dir}) std::filesystem::remove_all(d);
  for (const auto& d : {shared, inner, outside}) {
    ::mkdir(d.c_str(), 0777);
    ::chmod(d.c_str(), 0777);
  }
  ::mkdir(secret_dir.c_str(), 0700);
  std::ofstream(secret_dir + "/token") << "s3cret\n";
  ::chmod((secret_dir + "/token").c_str(), 0644);
  // What an earlier run left: a directory the policy nests a view under,
  // replaced by a link to an absolute host path, and a copied file
  // replaced by a link to a file behind a 0700 directory.
  ASSERT_EQ(::symlink(outside.c_str(), (shared + "/a").c_str()), 0);
  ASSERT_EQ(::symlink((secret_dir + "/token").c_str(), (shared + "/config").c_str()), 0);

  auto nested = run(spec({"/bin/true"}, [&](tsb::isolate::FsInputs& in) {
    in.binds.push_back({shared, "/data", true, false});
    in.binds.push_back({inner, "/data/a/b", false, false});
  }));
  EXPECT_EQ(nested.reason, EndReason::Exited) << describe(nested);
  EXPECT_FALSE(std::filesystem::exists(outside + "/b")) << "the sandbox's init made a directory on the host";
  EXPECT_FALSE(std::filesystem::is_symlink(shared + "/a")) << "the planted link is still there";
  EXPECT_TRUE(std::filesystem::is_directory(shared + "/a"));

  auto copied = run(spec({kProbe, "readfile", "/cfg", "64"}, [&](tsb::isolate::FsInputs& in) {
    in.binds.push_back({shared + "/config", "/cfg", false, false});
  }));
  EXPECT_EQ(copied.stdout_data.find("s3cret"), std::string::npos) << "root copied a file through a planted link";
  EXPECT_EQ(copied.reason, EndReason::SetupFailed) << describe(copied);
  EXPECT_EQ(copied.setup_errno, ELOOP) << describe(copied);
  for (const auto& d : {shared, inner, outside, secret_dir}) std::filesystem::remove_all(d);
}

// What else a tool can leave in a writable bind for the next run: a FIFO,
// a socket or a link where a file is mounted, an empty directory where a
// file is mounted, a file where a directory is. Each is removed by the next
// run's init and the mount made: no run fails or blocks on it. A directory
// with something in it where a file is mounted is moved aside within the
// same directory, whole, and the run's record says where. A FIFO that is a
// bind's host source (the operator's, or another's) refuses that run at
// once (ENXIO) instead of blocking the tool's read, naming the bind.
TEST_F(EngineTest, WhatAToolLeavesAtAMountPointNeverBreaksTheNextRun) {
  const std::string shared = "/run/tsb-test-leftover", files = "/run/tsb-test-leftover-src";
  for (const auto& d : {shared, files}) std::filesystem::remove_all(d);
  for (const auto& d : {shared, files}) {
    ::mkdir(d.c_str(), 0777);
    ::chmod(d.c_str(), 0777);
  }
  std::ofstream(files + "/cfg") << "config-bytes\n";
  ::chmod((files + "/cfg").c_str(), 0644);
  ::mkdir((files + "/dir").c_str(), 0755);
  std::ofstream(files + "/dir/inside") << "in\n";
  ::chmod((files + "/dir/inside").c_str(), 0644);
  // Left by "an earlier run": a mount point of the wrong kind, each in a
  // run of its own (and the run after it).
  struct Leftover {
    const char* name;
    std::function<int(const std::string&)> make;
    bool dir_mount;
  };
  const Leftover leftovers[] = {
      {"fifo", [](const std::string& p) { return ::mkfifo(p.c_str(), 0666); }, false},
      {"link", [](const std::string& p) { return ::symlink("/etc/shadow", p.c_str()); }, false},
      {"emptydir", [](const std::string& p) { return ::mkdir(p.c_str(), 0777); }, false},
      {"fulldir",
       [](const std::string& p) {
         return ::mkdir(p.c_str(), 0777) == 0 && ::mkdir((p + "/sub").c_str(), 0777) == 0 &&
                        (std::ofstream(p + "/sub/kept") << "kept\n")
                    ? 0
                    : -1;
       },
       false},
      {"file", [](const std::string& p) { return std::ofstream(p) << "x" ? 0 : -1; }, true},
  };
  for (const Leftover& l : leftovers) {
    const std::string at = shared + "/" + l.name;
    ASSERT_EQ(l.make(at), 0) << l.name << ": " << std::strerror(errno);
    auto s = spec({"/bin/cat", l.dir_mount ? std::string("/data/") + l.name + "/inside" : std::string("/data/") + l.name},
                  [&](tsb::isolate::FsInputs& in) {
                    in.binds.push_back({shared, "/data", true, false});
                    // Writable: a view (a read-only file would be a copy,
                    // which needs no mount point).
                    in.binds.push_back({l.dir_mount ? files + "/dir" : files + "/cfg", std::string("/data/") + l.name,
                                        !l.dir_mount, false});
                  });
    for (int i = 0; i < 2; ++i) {
      auto r = run(s);
      EXPECT_EQ(r.reason, EndReason::Exited) << l.name << " (run " << i << "): " << describe(r);
      EXPECT_EQ(r.stdout_data, l.dir_mount ? "in\n" : "config-bytes\n") << l.name << ": " << describe(r);
      if (std::string(l.name) != "fulldir") {
        EXPECT_TRUE(r.moved_aside.empty()) << l.name;
        continue;
      }
      // Moved aside once, whole, beside the mount point; the run says where.
      if (i == 1) {
        EXPECT_TRUE(r.moved_aside.empty()) << "moved twice";
        continue;
      }
      ASSERT_EQ(r.moved_aside.size(), 1u) << describe(r);
      const std::string prefix = std::string("/data/fulldir") + tsb::isolate::kAsideInfix;
      ASSERT_EQ(r.moved_aside[0].rfind(prefix, 0), 0u) << r.moved_aside[0];
      EXPECT_EQ(host_file(shared + r.moved_aside[0].substr(5) + "/sub/kept"), "kept\n") << r.moved_aside[0];
    }
  }
  // A FIFO as a bind's own source: refused at once, never opened.
  ASSERT_EQ(::mkfifo((files + "/pipe").c_str(), 0666), 0);
  auto fifo = run(spec({"/bin/cat", "/pipe"}, [&](tsb::isolate::FsInputs& in) {
    in.binds.push_back({files + "/pipe", "/pipe", false, false});
  }));
  EXPECT_EQ(fifo.reason, EndReason::SetupFailed) << describe(fifo);
  EXPECT_EQ(fifo.setup_errno, ENXIO) << describe(fifo);
  EXPECT_EQ(fifo.setup_path, "/pipe") << describe(fifo);
  for (const auto& d : {shared, files}) std::filesystem::remove_all(d);
}

// A read-only host file up to kMaxCopiedFileBytes is a copy in the root
// tmpfs, made by init from a descriptor the engine opened: every byte (NULs
// included, the largest size allowed), the exec bits, and no mount of its
// own in mountinfo.
TEST_F(EngineTest, SmallHostFilesAreCopiedWhole) {
  const std::string dir = "/run/tsb-test-copy";
  std::filesystem::remove_all(dir);
  ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0);
  std::string big(tsb::isolate::kMaxCopiedFileBytes, '\0');
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>((i * 2654435761u) >> 13);
  std::ofstream(dir + "/big.bin", std::ios::binary) << big;
  std::ofstream(dir + "/small.txt") << "small\n";
  ::chmod((dir + "/big.bin").c_str(), 0755);
  ::chmod((dir + "/small.txt").c_str(), 0644);
  auto r = run(spec({"/bin/sh", "-c",
                     "cat /data/big.bin; stat -c '%a %s' /data/big.bin /data/small.txt; cat /data/small.txt; "
                     "grep -c ' /data/' /proc/self/mountinfo"},
                    [&](tsb::isolate::FsInputs& in) {
                      in.binds.push_back({dir + "/big.bin", "/data/big.bin", false, false});
                      in.binds.push_back({dir + "/small.txt", "/data/small.txt", false, false});
                    }));
  std::filesystem::remove_all(dir);
  ASSERT_EQ(r.reason, EndReason::Exited) << describe(r);
  ASSERT_GE(r.stdout_data.size(), big.size()) << describe(r);
  EXPECT_TRUE(r.stdout_data.compare(0, big.size(), big) == 0) << "the copy differs from the host file";
  EXPECT_EQ(r.stdout_data.substr(big.size()),
            "555 " + std::to_string(big.size()) + "\n444 6\nsmall\n0\n")
      << "exec bits, sizes, content, or a mount of their own";
}

// A mask binds only an object init made for it, at a new name (O_EXCL),
// from the descriptor it made: whatever stands at the mask's source before
// (a file with bytes in it, a link) refuses the run at mask-proc, naming
// the /proc entry; it is never bound over /proc (the runc CVE-2025-31133
// class).
TEST_F(EngineTest, MasksBindOnlyObjectsInitMadeForThem) {
  struct Planted {
    const char* name;
    tsb::isolate::FsEntry::Kind kind;
    const char* data;  // a file's bytes, a link's target
  };
  for (const Planted& p : {Planted{"file", tsb::isolate::FsEntry::kFile, "planted\n"},
                           Planted{"link", tsb::isolate::FsEntry::kSymlink, "/etc/hostname"}}) {
    auto s = spec({"/bin/cat", "/proc/cmdline"});
    auto table = std::make_shared<tsb::isolate::FsTable>(*s.fs);
    auto mask = std::find_if(table->begin(), table->end(), [](const tsb::isolate::FsEntry& e) {
      return e.kind == tsb::isolate::FsEntry::kMask && e.path == "/proc/cmdline";
    });
    ASSERT_NE(mask, table->end());
    mask->source = "/.planted";
    tsb::isolate::FsEntry planted;
    planted.kind = p.kind;
    planted.path = "/.planted";
    planted.mode = 0444;
    (p.kind == tsb::isolate::FsEntry::kFile ? planted.data : planted.source) = p.data;
    table->insert(mask, planted);
    s.fs = table;
    auto r = run(s);
    EXPECT_EQ(r.reason, EndReason::SetupFailed) << p.name << ": bound over /proc/cmdline: " << describe(r);
    EXPECT_EQ(r.setup_stage, Stage::MaskProc) << p.name << ": " << describe(r);
    EXPECT_EQ(r.setup_errno, EEXIST) << p.name << ": " << describe(r);
    EXPECT_EQ(r.setup_path, "/proc/cmdline") << p.name << ": " << describe(r);
  }
  // The table's own masks: new, empty, read-only, under /.masks.
  auto r = run(spec({"/bin/sh", "-c", "cat /proc/cmdline; stat -c '%a %s %h %F' /.masks/cmdline /.masks/boot_id"}));
  ASSERT_EQ(r.reason, EndReason::Exited) << describe(r);
  EXPECT_EQ(r.stdout_data, "444 0 1 regular empty file\n444 37 1 regular file\n") << describe(r);
}

TEST_F(EngineTest, CmdlineIsMaskedAndBootIdIsPerRun) {
  auto c = probe1({"readfile", "/proc/cmdline", "4096"});
  if (c["ok"].get<bool>()) EXPECT_EQ(c["bytes"], 0) << c.dump();
  const std::string host_boot = host_file("/proc/sys/kernel/random/boot_id");
  ASSERT_FALSE(host_boot.empty());
  auto a = probe1({"readfile", "/proc/sys/kernel/random/boot_id", "64"});
  auto b = probe1({"readfile", "/proc/sys/kernel/random/boot_id", "64"});
  ASSERT_TRUE(a["ok"].get<bool>()) << a.dump();
  const std::string ida = a["data"], idb = b["data"];
  EXPECT_NE(ida, host_boot);
  EXPECT_NE(ida, idb) << "the same boot id in two runs";
  EXPECT_EQ(ida.size(), 37u) << "not in the kernel's format: " << ida;
  EXPECT_FALSE(probe1({"writefile", "/proc/sys/kernel/random/boot_id", "x"})["ok"].get<bool>());
}

// A binary written to a memfd cannot be executed (vm.memfd_noexec=2 in the
// sandbox's pid namespace). Where the kernel lacks the knob the engine says
// so at start-up instead.
TEST_F(EngineTest, MemfdCannotBeExecuted) {
  const char* script = R"PY(
import os, sys
fd = os.memfd_create("dropped")
with open("/usr/bin/true", "rb") as f:
    os.write(fd, f.read())
try:
    os.execv("/proc/self/fd/%d" % fd, ["dropped"])
except OSError as e:
    print("refused", e.errno)
    sys.exit(0)
)PY";
  auto r = run(spec({"/venv/bin/python3", "-c", script}));
  if (::access("/proc/sys/vm/memfd_noexec", F_OK) != 0) {
    EXPECT_FALSE(engine_->features().memfd_noexec);
    bool said = false;
    for (const auto& n : engine_->startup_notes()) said |= n.find("memfd") != std::string::npos;
    EXPECT_TRUE(said) << "a kernel without vm.memfd_noexec must be reported at start-up";
    std::fprintf(stderr, "NOTE: this kernel has no vm.memfd_noexec (Linux 6.3+); the engine reported it\n");
    return;
  }
  EXPECT_TRUE(engine_->features().memfd_noexec);
  ASSERT_EQ(r.reason, EndReason::Exited) << describe(r);
  EXPECT_EQ(r.stdout_data, "refused " + std::to_string(EACCES) + "\n") << describe(r);
  // And the host's own setting is untouched.
  EXPECT_EQ(host_file("/proc/sys/vm/memfd_noexec"), "0\n");
}

// Loopback TCP queues are the run's memory: a tool that fills many
// connections and never reads them cannot queue more than its memory limit
// (before: 640 MiB queued under a 512 MiB limit, taken from the TCP pool
// every service of the host shares).
TEST_F(EngineTest, SocketBuffersAreChargedToTheRun) {
  ASSERT_TRUE(engine_->features().tcp_memory_limit) << "no way to charge socket memory on this host";
  const char* script = tsb::testing::kQueueLoopbackTcp;  // argv: target bytes, "exit" or "hold"
  const std::uint64_t limit = 48ull << 20;
  auto s = spec({"/venv/bin/python3", "-c", script, "0", "exit"});
  s.limits.memory_bytes = limit;
  s.limits.open_files = 1024;
  s.limits.pids = 64;
  s.limits.wall_timeout = std::chrono::seconds(40);
  auto with = [&](std::uint64_t target, const char* mode) {
    s.argv[3] = std::to_string(target);
    s.argv[4] = mode;
    return run(s);
  };
  // A tool that uses sockets within its limit is left alone.
  auto small = with(4ull << 20, "exit");
  ASSERT_EQ(small.reason, EndReason::Exited) << describe(small);
  EXPECT_EQ(small.stdout_data, std::to_string(4ull << 20) + "\n");
  // Beyond it: v2 charges the buffers to memory.max, an OOM kill; v1 refuses
  // them memory at memory.kmem.tcp.limit_in_bytes and the engine ends the
  // run. Uncharged, the tool queues the 4x it aims for and exits 0.
  auto r = with(4 * limit, "exit");
  ASSERT_EQ(r.reason, EndReason::MemoryLimit)
      << describe(r) << "; queued " << r.stdout_data << " bytes in loopback TCP under a " << (limit >> 20)
      << " MiB limit";
  if (engine_->cgroups().mode() == tsb::isolate::CgroupMode::V1)
    EXPECT_NE(r.error.find("socket buffers"), std::string::npos) << describe(r);
  // One that keeps them queued and waits is ended then, not at its timeout.
  auto held = with(4 * limit, "hold");
  ASSERT_EQ(held.reason, EndReason::MemoryLimit) << describe(held);
  EXPECT_LT(held.wall, std::chrono::seconds(10)) << describe(held);
}

// v1: the clone3 child moves itself into the run's leaf (CgroupLeaf::join_fds)
// before it executes init. Every process of the run sits in the leaf of
// every hierarchy (limits and the whole-tree kill see all of them), and no
// descriptor of a leaf's `tasks` file reaches the sandbox: with one, a tool
// could move host processes into its leaf (the kernel checks the opener).
TEST_F(EngineTest, V1ChildJoinsEveryHierarchysLeafAndKeepsNoTasksFile) {
  if (engine_->cgroups().mode() != tsb::isolate::CgroupMode::V1) GTEST_SKIP() << "cgroup v2 here: clone3 places the child";
  // The tool is one process: the leaves hold exactly init and it.
  auto sb = engine_->spawn(spec({"/bin/sleep", "3600"}));
  ASSERT_TRUE(sb.ok()) << sb.error().message;
  const auto slurp = [](const std::string& p) {
    std::ifstream f(p);
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  const auto& hs = engine_->config().cgroups.hierarchies;
  ASSERT_GE(hs.size(), 5u);
  std::set<pid_t> first;
  for (int i = 0; i < 1000 && first.size() < 2; ++i) {  // init and sleep
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    std::istringstream in(slurp(hs[0].base + "/" + (*sb)->cgroup().name() + "/tasks"));
    first.clear();
    for (pid_t p; in >> p;) first.insert(p);
  }
  ASSERT_EQ(first.size(), 2u) << hs[0].controller;
  EXPECT_TRUE(first.count((*sb)->pid())) << "init is not in the " << hs[0].controller << " leaf";
  for (const auto& h : hs) {
    std::istringstream in(slurp(h.base + "/" + (*sb)->cgroup().name() + "/tasks"));
    std::set<pid_t> here;
    for (pid_t p; in >> p;) here.insert(p);
    EXPECT_EQ(here, first) << "the " << h.controller << " leaf holds other tasks";
  }
  // From the host: no descriptor of init or the tool names a cgroup file.
  for (pid_t p : first) {
    const std::string dir = "/proc/" + std::to_string(p) + "/fd";
    for (const auto& e : std::filesystem::directory_iterator(dir)) {
      std::error_code ec;
      const auto target = std::filesystem::read_symlink(e.path(), ec).string();
      EXPECT_EQ(target.find("/sys/fs/cgroup"), std::string::npos) << "pid " << p << " holds " << target;
    }
  }
  (*sb)->kill();
}

// Under memory pressure the kernel takes a run, not the daemon or anything
// else on the host; no process of the run may lower that.
TEST_F(EngineTest, SandboxIsTheOomKillersFirstChoice) {
  auto j = probe1({"readfile", "/proc/self/oom_score_adj", "16"});
  ASSERT_TRUE(j["ok"].get<bool>()) << j.dump();
  EXPECT_EQ(j["data"], "1000\n");
  auto w = probe1({"writefile", "/proc/self/oom_score_adj", "0"});
  if (!engine_->features().oom_score_floor) {
    // An engine without CAP_SYS_RESOURCE (the systemd unit grants it) can
    // set the score but not make it a floor; it says so at start-up.
    bool said = false;
    for (const auto& n : engine_->startup_notes()) said |= n.find("CAP_SYS_RESOURCE") != std::string::npos;
    EXPECT_TRUE(said);
    std::fprintf(stderr, "NOTE: no CAP_SYS_RESOURCE here: the OOM score is not a floor (reported at start-up)\n");
    return;
  }
  EXPECT_FALSE(w["ok"].get<bool>()) << "the tool lowered its OOM score: " << w.dump();
}

// A child that fails at its first mount steps has exited before the engine
// signals it; its own report must reach the result, not the engine's
// "Broken pipe" (it did in about half the runs under load).
TEST_F(EngineTest, EarlySetupFailureIsReportedEveryTime) {
  for (int i = 0; i < 40; ++i) {
    auto s = spec({"/bin/true"}, [](tsb::isolate::FsInputs& in) { in.venv = "/nonexistent/venv"; });
    auto r = run(s);
    ASSERT_EQ(r.reason, EndReason::SetupFailed) << "run " << i << ": " << describe(r);
    ASSERT_EQ(r.setup_stage, Stage::MountBind) << "run " << i << ": " << describe(r);
    ASSERT_EQ(r.setup_errno, ENOENT) << "run " << i << ": " << describe(r);
  }
}

// The tool runs only once pid 1 is toolsandbox-init (before, it could start
// while pid 1 was still the engine's copy, between fork and exec).
TEST_F(EngineTest, ToolStartsOnlyOnceInitRuns) {
  for (int i = 0; i < 40; ++i) {
    auto v = probe({"pid"});
    ASSERT_EQ(v.size(), 1u);
    ASSERT_EQ(v[0]["init_cmdline"][0], "toolsandbox-init") << "run " << i << ": " << v[0].dump();
  }
}

namespace {
std::atomic<int> g_marker_fd{-1};
pid_t g_engine_pid = 0;
void marker_handler(int) {
  // Any process but the engine that runs this is a sandbox child running
  // the engine's handler.
  if (::getpid() != g_engine_pid) {
    char c = 'X';
    (void)!::write(g_marker_fd.load(), &c, 1);
  }
}
}  // namespace

// No handler of the engine's process ever runs in a sandbox's child: every
// signal is blocked across clone3, the handlers are cleared there, and the
// child leaves the engine's process group before it unblocks them. The
// signals go to the process group (as a terminal's Ctrl-C would), which
// the children are in right after clone3; this process gets a group of its
// own for the test so nothing else receives them. The sending thread also
// makes the engine multi-threaded, as a resolver thread would: the child
// must not use glibc's setresuid, which waits for threads the child does
// not have (it hung there, and the run timed out).
TEST_F(EngineTest, EngineSignalHandlersNeverRunInTheChild) {
  const pid_t old_pgrp = ::getpgrp();
  ASSERT_EQ(::setpgid(0, 0), 0) << std::strerror(errno);
  struct RestoreGroup {
    pid_t pgrp;
    ~RestoreGroup() { (void)::setpgid(0, pgrp); }
  } restore{old_pgrp};
  int p[2];
  ASSERT_EQ(::pipe2(p, O_CLOEXEC | O_NONBLOCK), 0);
  g_marker_fd = p[1];
  g_engine_pid = ::getpid();
  struct sigaction sa{}, old{};
  sa.sa_handler = marker_handler;
  sigemptyset(&sa.sa_mask);
  ASSERT_EQ(::sigaction(SIGUSR1, &sa, &old), 0);
  std::atomic<bool> stop{false};
  std::thread spammer([&] {
    while (!stop) {
      ::kill(0, SIGUSR1);
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  });
  for (int i = 0; i < 60; ++i) {
    auto r = run(spec({"/bin/true"}));
    EXPECT_EQ(r.reason, EndReason::Exited) << describe(r);
  }
  stop = true;
  spammer.join();
  ::sigaction(SIGUSR1, &old, nullptr);
  char buf[64];
  ssize_t n = ::read(p[0], buf, sizeof buf);
  ::close(p[0]);
  ::close(p[1]);
  EXPECT_LE(n, 0) << "the engine's signal handler ran in " << n << " sandbox children";
}
