#include "isolate/engine/cgroup.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <sstream>

namespace tsb::isolate {
namespace {

constexpr const char* kV1Controllers[] = {"memory", "pids", "cpu", "cpuacct", "freezer"};
constexpr std::uint64_t kCpuPeriodUs = 100000;

bool exists(const std::string& p) {
  struct stat st{};
  return ::stat(p.c_str(), &st) == 0;
}

// "key value" lines (memory.events, pids.events, cpu.stat, oom_control).
std::uint64_t keyed_value(const std::string& text, std::string_view key) {
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + pos, end - pos);
    if (line.size() > key.size() && line.substr(0, key.size()) == key && line[key.size()] == ' ') {
      std::uint64_t v = 0;
      auto num = line.substr(key.size() + 1);
      std::from_chars(num.data(), num.data() + num.size(), v);
      return v;
    }
    pos = end + 1;
  }
  return 0;
}

std::uint64_t parse_u64(const std::string& text) {
  std::uint64_t v = 0;
  std::from_chars(text.data(), text.data() + text.size(), v);
  return v;
}

// A counter file's text; "" (so 0) when it cannot be read.
std::string text_of(const std::string& path) {
  auto t = read_text_file(path);
  return t.ok() ? std::move(t).value() : std::string();
}

std::vector<pid_t> list_pids(const std::string& procs_file) {
  std::vector<pid_t> pids;
  std::istringstream in(text_of(procs_file));
  pid_t p;
  while (in >> p) pids.push_back(p);
  return pids;
}

}  // namespace

const char* to_string(CgroupMode m) noexcept { return m == CgroupMode::V2 ? "v2" : "v1"; }


Status write_text_file(const std::string& path, std::string_view data) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC));
  if (!fd) return Error::from_errno("open '" + path + "'");
  // cgroup and procfs control files take one write(2) per value. A signal
  // may interrupt one that has to reclaim memory first (memory.limit_in_bytes
  // above the current usage): that is not a failure, it is tried again.
  ssize_t n;
  do n = ::write(fd.get(), data.data(), data.size());
  while (n < 0 && errno == EINTR);
  if (n < 0) return Error::from_errno("write '" + std::string(data) + "' to '" + path + "'");
  if (static_cast<std::size_t>(n) != data.size())
    return Error::invalid("short write to '" + path + "'", EIO);
  return {};
}

Result<std::unique_ptr<Cgroups>> Cgroups::open(const CgroupPlacement& p) {
  for (const auto& d : p.make)
    if (::mkdir(d.c_str(), 0755) != 0 && errno != EEXIST) return Error::from_errno("creating cgroup '" + d + "'");
  if (!p.join.empty())
    TSB_TRY(write_text_file(p.join + "/cgroup.procs", "0"), "moving the daemon into its own leaf (is Delegate=yes set?)");
  for (std::size_t i = 0; i < p.enable.size(); ++i)
    for (const char* c : {"+memory", "+pids", "+cpu"})
      if (auto st = write_text_file(p.enable[i] + "/cgroup.subtree_control", c); !st.ok() && i + 1 == p.enable.size())
        return std::move(st).error().wrap("cgroup parent '" + p.enable[i] +
                                          "' (it must be delegated to us and hold no processes)");
  std::unique_ptr<Cgroups> cg(new Cgroups());
  cg->mode_ = p.mode;
  cg->parent_ = p.parent;
  cg->hierarchies_ = p.hierarchies;
  for (const auto& h : p.hierarchies)
    if (h.base.empty() || h.base[0] != '/' || !exists(h.base))
      return Error::invalid("cgroup parent '" + h.base + "' is not there (prepared by the set-up: daemon/compile/prepare.h)", ENOENT);
  if (p.mode == CgroupMode::V2) {
    if (p.hierarchies.size() != 1) return Error::invalid("a cgroup v2 parent is one directory");
    // Kernel features, probed on the parent (every non-root cgroup has the
    // same interface files as the leaves below it), before any leaf exists:
    // stale leaves are killed first, with cgroup.kill when there is one.
    cg->has_cgroup_kill_ = exists(p.hierarchies[0].base + "/cgroup.kill");
    cg->has_memory_peak_ = exists(p.hierarchies[0].base + "/memory.peak");
    return cg;
  }
  for (const char* need : kV1Controllers)
    if (std::none_of(p.hierarchies.begin(), p.hierarchies.end(), [&](const Hierarchy& h) { return h.controller == need; }))
      return Error::invalid(std::string("cgroup v1 controller '") + need + "' has no parent directory", ENOTSUP);
  const std::string memory =
      std::find_if(p.hierarchies.begin(), p.hierarchies.end(), [](const Hierarchy& h) { return h.controller == "memory"; })
          ->base;
  cg->has_memsw_ = exists(memory + "/memory.memsw.limit_in_bytes");
  cg->has_kmem_tcp_ = exists(memory + "/memory.kmem.tcp.limit_in_bytes");
  return cg;
}

std::string Cgroups::dir_of(const Hierarchy& h, const std::string& leaf) const { return h.base + "/" + leaf; }

std::string Cgroups::describe() const {
  std::string s = std::string("cgroup ") + to_string(mode_) + ", parent " + parent_ + " (";
  for (std::size_t i = 0; i < hierarchies_.size(); ++i) {
    if (i) s += ", ";
    s += hierarchies_[i].controller.empty() ? hierarchies_[i].base
                                            : hierarchies_[i].controller + "@" + hierarchies_[i].base;
  }
  return s + ")";
}

Result<std::unique_ptr<CgroupLeaf>> Cgroups::create_leaf(const std::string& name, const CgroupLimits& lim) {
  std::unique_ptr<CgroupLeaf> leaf(new CgroupLeaf(this, name));
  if (mode_ == CgroupMode::V2) {
    std::string d = dir_of(hierarchies_[0], name);
    if (::mkdir(d.c_str(), 0755) != 0) return Error::from_errno("mkdir cgroup '" + d + "'");
    leaf->v2_fd_.reset(::open(d.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!leaf->v2_fd_) {
      auto e = Error::from_errno("open cgroup '" + d + "'");
      ::rmdir(d.c_str());
      return e;
    }
    auto w = [&](const char* f, const std::string& v) -> Status {
      return write_text_file(d + "/" + f, v);
    };
    if (lim.memory_bytes) {
      TSB_TRY(w("memory.max", std::to_string(lim.memory_bytes)), "setting the memory limit");
      // No swap: the limit is the limit. The file is absent without swap support.
      if (exists(d + "/memory.swap.max")) TSB_TRY(w("memory.swap.max", "0"), "disabling swap");
      // On OOM kill the whole run, not one process of it.
      TSB_TRY(w("memory.oom.group", "1"), "setting memory.oom.group");
    }
    if (lim.pids) TSB_TRY(w("pids.max", std::to_string(lim.pids)), "setting the pids limit");
    if (lim.cpu_quota_millicpus) {
      std::uint64_t quota = std::max<std::uint64_t>(1000, kCpuPeriodUs * lim.cpu_quota_millicpus / 1000);
      TSB_TRY(w("cpu.max", std::to_string(quota) + " " + std::to_string(kCpuPeriodUs)), "setting the CPU quota");
    }
    has_memory_peak_ = exists(d + "/memory.peak");
    has_cgroup_kill_ = exists(d + "/cgroup.kill");
    return leaf;
  }

  for (const auto& h : hierarchies_) {
    std::string d = dir_of(h, name);
    if (::mkdir(d.c_str(), 0755) != 0) return Error::from_errno("mkdir cgroup '" + d + "'");
  }
  auto w = [&](const char* ctrl, const char* f, const std::string& v) -> Status {
    return write_text_file(leaf->file(ctrl, f), v);
  };
  if (lim.memory_bytes) {
    TSB_TRY(w("memory", "memory.limit_in_bytes", std::to_string(lim.memory_bytes)), "setting the memory limit");
    if (has_memsw_)
      TSB_TRY(w("memory", "memory.memsw.limit_in_bytes", std::to_string(lim.memory_bytes)), "disabling swap");
    else
      (void)w("memory", "memory.swappiness", "0");  // best effort: no swap accounting on this kernel
    // v1 charges socket buffers to a cgroup only once its TCP limit is set
    // (and then TCP and UDP alike, to that counter); without it a run could
    // queue any amount in loopback connections, out of the host-wide TCP
    // pool every service shares. Set before any process is in the leaf:
    // sockets made earlier would stay uncharged. v2 charges them to
    // memory.max without being asked.
    if (has_kmem_tcp_)
      TSB_TRY(w("memory", "memory.kmem.tcp.limit_in_bytes", std::to_string(lim.memory_bytes)),
              "charging socket buffers to the run");
  }
  if (lim.pids) TSB_TRY(w("pids", "pids.max", std::to_string(lim.pids)), "setting the pids limit");
  if (lim.cpu_quota_millicpus) {
    std::uint64_t quota = std::max<std::uint64_t>(1000, kCpuPeriodUs * lim.cpu_quota_millicpus / 1000);
    TSB_TRY(w("cpu", "cpu.cfs_period_us", std::to_string(kCpuPeriodUs)), "setting the CPU period");
    TSB_TRY(w("cpu", "cpu.cfs_quota_us", std::to_string(quota)), "setting the CPU quota");
  }
  return leaf;
}

std::unique_ptr<CgroupLeaf> Cgroups::existing_leaf(const std::string& name) {
  if (name.empty() || name[0] == '.' || name.find('/') != std::string::npos) return nullptr;
  std::unique_ptr<CgroupLeaf> leaf(new CgroupLeaf(this, name));
  if (mode_ == CgroupMode::V2)
    leaf->v2_fd_.reset(::open(dir_of(hierarchies_[0], name).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  return leaf;
}

CgroupLeaf::~CgroupLeaf() {
  if (!destroyed_) (void)try_remove();
}

std::string CgroupLeaf::path(std::size_t i) const { return owner_->dir_of(owner_->hierarchies_[i], name_); }

std::string CgroupLeaf::file(const char* controller, const char* f) const {
  for (std::size_t i = 0; i < owner_->hierarchies_.size(); ++i) {
    const auto& h = owner_->hierarchies_[i];
    if (h.controller.empty() || h.controller == controller) return path(i) + "/" + f;
  }
  return path(0) + "/" + f;
}

Result<std::vector<UniqueFd>> CgroupLeaf::join_fds() const {
  std::vector<UniqueFd> fds;
  if (owner_->mode_ == CgroupMode::V2) return fds;
  for (std::size_t i = 0; i < owner_->hierarchies_.size(); ++i) {
    const std::string tasks = path(i) + "/tasks";
    fds.emplace_back(::open(tasks.c_str(), O_WRONLY | O_CLOEXEC | O_NOFOLLOW));
    if (!fds.back()) return Error::from_errno("open '" + tasks + "'");
  }
  return fds;
}

Status CgroupLeaf::kill_all() {
  if (owner_->mode_ == CgroupMode::V2) {
    if (owner_->has_cgroup_kill_) return write_text_file(path(0) + "/cgroup.kill", "1");
    for (pid_t p : list_pids(path(0) + "/cgroup.procs")) ::kill(p, SIGKILL);
    return {};
  }
  // v1 has no cgroup.kill. Freezing first stops the leaf's processes
  // forking between listing and killing, once they are frozen (the write of
  // FROZEN returns while the leaf may still be freezing); SIGKILL is
  // delivered when it is thawed.
  // Another round only for a process not killed yet: one killed already is
  // exiting (its memory takes a while). A fork it had past its last check
  // for a pending SIGKILL can still add a child after the last listing: that
  // child is in pid 1's namespace, which the kernel kills whole (the first
  // fence), and in the leaf, which then cannot be removed, so the pending
  // clean-up sweeps it again.
  std::string freezer = file("freezer", "freezer.state");
  std::vector<pid_t> killed;
  auto not_killed = [&](pid_t p) { return std::ranges::count(killed, p) == 0; };
  for (int round = 0; round < 8 && std::ranges::any_of(list_pids(file("pids", "cgroup.procs")), not_killed); ++round) {
    (void)write_text_file(freezer, "FROZEN");
    killed = list_pids(file("freezer", "cgroup.procs"));
    for (pid_t p : killed) ::kill(p, SIGKILL);
    (void)write_text_file(freezer, "THAWED");
  }
  return {};
}

std::chrono::nanoseconds CgroupLeaf::cpu_usage() const {
  if (owner_->mode_ == CgroupMode::V2) return std::chrono::microseconds(keyed_value(text_of(path(0) + "/cpu.stat"), "usage_usec"));
  return std::chrono::nanoseconds(parse_u64(text_of(file("cpuacct", "cpuacct.usage"))));
}

bool CgroupLeaf::socket_limit_reached() const {
  if (owner_->mode_ == CgroupMode::V2 || !owner_->has_kmem_tcp_) return false;
  const std::uint64_t limit = parse_u64(text_of(file("memory", "memory.kmem.tcp.limit_in_bytes")));  // 0: unread
  return limit > 0 && parse_u64(text_of(file("memory", "memory.kmem.tcp.max_usage_in_bytes"))) >= limit;
}

CgroupStats CgroupLeaf::stats() const {
  CgroupStats s;
  s.cpu = cpu_usage();
  if (owner_->mode_ == CgroupMode::V2) {
    if (owner_->has_memory_peak_) s.peak_memory_bytes = parse_u64(text_of(path(0) + "/memory.peak"));
    const std::string events = text_of(path(0) + "/memory.events");
    s.oom_kills = keyed_value(events, "oom_kill") + keyed_value(events, "oom_group_kill");
    s.pids_max_hits = keyed_value(text_of(path(0) + "/pids.events"), "max");
    return s;
  }
  s.peak_memory_bytes = parse_u64(text_of(file("memory", "memory.max_usage_in_bytes")));
  s.oom_kills = keyed_value(text_of(file("memory", "memory.oom_control")), "oom_kill");
  s.pids_max_hits = keyed_value(text_of(file("pids", "pids.events")), "max");
  return s;
}

Result<bool> CgroupLeaf::try_remove() {
  if (destroyed_) return true;
  (void)kill_all();
  for (std::size_t i = 0; i < owner_->hierarchies_.size(); ++i) {
    std::string d = path(i);
    if (::rmdir(d.c_str()) == 0 || errno == ENOENT) continue;
    // Processes killed a moment ago may still be exiting: rmdir answers
    // EBUSY until the last one is gone.
    if (errno == EBUSY) return false;
    return Error::from_errno("removing cgroup '" + d + "'");
  }
  v2_fd_.reset();
  destroyed_ = true;
  return true;
}

}  // namespace tsb::isolate
