// cgroup facade: one backend for the unified v2 hierarchy, one for v1
// (including the hybrid layout where v1 holds the controllers). The engine
// manages only the subtree it is given ("parent"); every run gets a leaf
// below it that is created, limited, measured, killed and removed here.
#pragma once

#include "isolate/base/file.h"

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "isolate/base/result.h"
#include "isolate/base/unique_fd.h"

namespace tsb::isolate {

enum class CgroupMode { V2, V1 };
const char* to_string(CgroupMode m) noexcept;

// Where run leaves go: the parent directory in each hierarchy (v2: one,
// controller ""), and how to make it ready, worked out by the engine's
// caller (daemon/compile/prepare.h) and done by Cgroups::open (cgroupfs roots are
// mode 0555: only a process with CAP_DAC_OVERRIDE creates in them).
struct CgroupPlacement {
  CgroupMode mode = CgroupMode::V2;
  std::string parent;  // the parent inside the hierarchy ("self" resolved), for messages
  struct Hierarchy {
    std::string controller;  // v1: "memory", "pids", "cpu", "cpuacct", "freezer"
    std::string base;        // the parent's directory
  };
  std::vector<Hierarchy> hierarchies;
  std::vector<std::string> make;    // directories to create, in order
  std::string join;                 // v2 "self": the leaf this process moves into first
  std::vector<std::string> enable;  // v2: +memory +pids +cpu in each cgroup.subtree_control, in
                                    // order; only the last one's failure counts (the levels above
                                    // may be someone else's)
};

struct CgroupLimits {
  std::uint64_t memory_bytes = 0;       // 0 = leave unset
  std::uint64_t pids = 0;               // 0 = leave unset
  std::uint32_t cpu_quota_millicpus = 0;  // 0 = leave unset
};

struct CgroupStats {
  std::uint64_t peak_memory_bytes = 0;  // 0 when the kernel cannot tell
  std::uint64_t oom_kills = 0;          // memory.events oom_kill / v1 oom_control
  std::uint64_t pids_max_hits = 0;      // pids.events max
  std::chrono::nanoseconds cpu{0};      // user + system of the whole leaf
};

class CgroupLeaf;

class Cgroups {
 public:
  // The parent made ready as `placement` says (every controller the engine
  // uses present), and the kernel's features there.
  static Result<std::unique_ptr<Cgroups>> open(const CgroupPlacement& placement);

  CgroupMode mode() const noexcept { return mode_; }
  const std::string& parent() const noexcept { return parent_; }
  // Human description for start-up logs and `status`.
  std::string describe() const;
  // v2 features found at the parent (kernel 5.14+ / 5.19+); false on v1.
  bool has_cgroup_kill() const noexcept { return has_cgroup_kill_.load(std::memory_order_relaxed); }
  bool has_memory_peak() const noexcept { return has_memory_peak_.load(std::memory_order_relaxed); }

  // Create a leaf named `name` under the parent and write its limits.
  Result<std::unique_ptr<CgroupLeaf>> create_leaf(const std::string& name, const CgroupLimits& limits);

  // The leaf `name` left by an engine that is gone (a name directly under
  // the parent; null for anything else), to kill and remove.
  std::unique_ptr<CgroupLeaf> existing_leaf(const std::string& name);
  // v1 with socket accounting: memory.kmem.tcp.limit_in_bytes exists.
  bool has_tcp_memory_limit() const noexcept { return has_kmem_tcp_; }

 private:
  friend class CgroupLeaf;
  using Hierarchy = CgroupPlacement::Hierarchy;
  Cgroups() = default;
  std::string dir_of(const Hierarchy& h, const std::string& leaf) const;

  CgroupMode mode_ = CgroupMode::V2;
  std::string parent_;
  std::vector<Hierarchy> hierarchies_;  // v2: exactly one
  // v2 memory.peak (5.19+), cgroup.kill (5.14+): probed again on each new
  // leaf, which the spawner's spawn thread makes while its loop reads them.
  std::atomic<bool> has_memory_peak_ = false;
  std::atomic<bool> has_cgroup_kill_ = false;
  bool has_memsw_ = false;              // v1 memory.memsw.* (swap accounting on)
  bool has_kmem_tcp_ = false;           // v1 memory.kmem.tcp.limit_in_bytes
};

// One run's leaf. Owns the directories: the destructor kills whatever still
// runs inside and makes one attempt to remove them (no waiting; a leaf left
// behind is removed by the next start-up reclaim at the latest).
class CgroupLeaf {
 public:
  ~CgroupLeaf();
  CgroupLeaf(const CgroupLeaf&) = delete;
  CgroupLeaf& operator=(const CgroupLeaf&) = delete;

  // v2: an O_DIRECTORY fd of the leaf for clone3(CLONE_INTO_CGROUP); -1 on v1.
  int clone_fd() const noexcept { return v2_fd_.get(); }
  // v1 only: every hierarchy's `tasks` file of the leaf, opened for writing
  // (close-on-exec), for the clone3 child to move itself in by writing "0"
  // (child.cc): a task that moves only itself is the one migration that
  // skips the kernel's global threadgroup lock, whose write side waits an
  // RCU grace period (~10 ms here after quiet; docs/BENCHMARKS.md). The
  // write is checked against the opener's credentials (root's). None on v2,
  // where clone3 places the child (CLONE_INTO_CGROUP).
  Result<std::vector<UniqueFd>> join_fds() const;
  // Kill every process in the leaf: cgroup.kill on v2; on v1 freeze, SIGKILL
  // each listed task, thaw, until the leaf is empty.
  Status kill_all();
  CgroupStats stats() const;
  std::chrono::nanoseconds cpu_usage() const;
  // v1 with socket accounting: whether the run's socket buffers have reached
  // memory.kmem.tcp.limit_in_bytes (its high watermark, max_usage_in_bytes,
  // at the limit; the kernel does not count failures of that counter in
  // failcnt on every version). Always false on v2, which charges socket
  // memory to memory.max (an OOM kill there).
  bool socket_limit_reached() const;
  // One non-blocking attempt: kill what is left, remove the directories.
  // False when the kernel still counts exiting processes in it (EBUSY).
  Result<bool> try_remove();
  const std::string& name() const noexcept { return name_; }

 private:
  friend class Cgroups;
  CgroupLeaf(Cgroups* owner, std::string name) : owner_(owner), name_(std::move(name)) {}
  std::string path(std::size_t hierarchy_index) const;
  std::string file(const char* controller, const char* file) const;

  Cgroups* owner_;
  std::string name_;
  UniqueFd v2_fd_;
  bool destroyed_ = false;
};

// Small helpers shared with tests. A kernel file (/proc, cgroupfs) is read
// with the base's reader, up to 16 MiB (a host's mountinfo can be large).
inline Result<std::string> read_text_file(const std::string& path) { return read_file(path, {.max_bytes = 16u << 20}); }
Status write_text_file(const std::string& path, std::string_view data);

}  // namespace tsb::isolate
