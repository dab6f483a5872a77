#include "daemon/compile/prepare.h"

#include <dirent.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <charconv>
#include <functional>
#include <iterator>
#include <set>
#include <sstream>

namespace tsb::isolate {
namespace {

constexpr const char* kV1Controllers[] = {"memory", "pids", "cpu", "cpuacct", "freezer"};

struct Mounted {
  std::string v2;  // the cgroup2 mount, "" for none
  struct V1 {
    std::string controller, mount, own;  // own: this process's cgroup in it
  };
  std::vector<V1> v1;
  std::string own_v2;
};

// /proc/self/mountinfo and /proc/self/cgroup.
Result<Mounted> read_mounted() {
  Mounted m;
  auto mi = read_text_file("/proc/self/mountinfo");
  if (!mi.ok()) return std::move(mi).error().wrap("detecting cgroup layout");
  std::istringstream in(*mi);
  std::string line;
  while (std::getline(in, line)) {
    // id parent maj:min root mountpoint options [optional...] - fstype source superoptions
    auto dash = line.find(" - ");
    if (dash == std::string::npos) continue;
    std::istringstream pre(line.substr(0, dash));
    std::string id, par, dev, root, mnt;
    pre >> id >> par >> dev >> root >> mnt;
    std::istringstream post(line.substr(dash + 3));
    std::string fstype, source, superopts;
    post >> fstype >> source >> superopts;
    if (root != "/") continue;  // a bind of a sub-tree cannot hold our parent reliably
    if (fstype == "cgroup2") {
      if (m.v2.empty() || mnt == "/sys/fs/cgroup") m.v2 = mnt;
    } else if (fstype == "cgroup") {
      std::istringstream opts(superopts);
      std::string opt;
      while (std::getline(opts, opt, ',')) {
        for (const char* c : kV1Controllers)
          if (opt == c && std::none_of(m.v1.begin(), m.v1.end(), [&](const auto& h) { return h.controller == c; }))
            m.v1.push_back({c, mnt, "/"});
      }
    }
  }
  auto pc = read_text_file("/proc/self/cgroup");
  if (!pc.ok()) return std::move(pc).error().wrap("reading /proc/self/cgroup");
  std::istringstream lines(*pc);
  std::string l;
  while (std::getline(lines, l)) {
    auto c1 = l.find(':'), c2 = l.find(':', c1 + 1);
    if (c1 == std::string::npos || c2 == std::string::npos) continue;
    std::string ctrls = l.substr(c1 + 1, c2 - c1 - 1), path = l.substr(c2 + 1);
    if (l.compare(0, c1, "0") == 0 && ctrls.empty()) {
      m.own_v2 = path;
      continue;
    }
    std::istringstream cs(ctrls);
    std::string c;
    while (std::getline(cs, c, ','))
      for (auto& h : m.v1)
        if (h.controller == c) h.own = path;
  }
  return m;
}

// Every directory from below `mount` down to `dir`, to create in order.
void chain(const std::string& mount, const std::string& dir, std::vector<std::string>& out) {
  for (std::size_t i = mount.size() + 1; i <= dir.size(); ++i)
    if (i == dir.size() || dir[i] == '/') out.push_back(dir.substr(0, i));
}

}  // namespace

Result<CgroupPlacement> prepare_cgroups(const std::string& parent_in) {
  const bool self_mode = parent_in == "self";
  if (!self_mode && (parent_in.empty() || parent_in[0] != '/' || parent_in.find("..") != std::string::npos))
    return Error::invalid("cgroup parent must be \"self\" or an absolute path without '..': '" + parent_in + "'");
  std::string parent = parent_in;
  while (parent.size() > 1 && parent.back() == '/') parent.pop_back();
  auto mounted = read_mounted();
  if (!mounted.ok()) return std::move(mounted).error().wrap("the host's mounts");
  const Mounted& m = *mounted;
  CgroupPlacement out;
  out.parent = parent;

  const bool v1_memory = std::any_of(m.v1.begin(), m.v1.end(), [](const auto& h) { return h.controller == "memory"; });
  if (!v1_memory && !m.v2.empty()) {
    out.mode = CgroupMode::V2;
    // Whole words: a substring search for "cpu" would also match "cpuset".
    auto ctrl = read_text_file(m.v2 + "/cgroup.controllers");
    if (!ctrl.ok()) return std::move(ctrl).error().wrap("reading cgroup v2 controllers");
    std::istringstream words(*ctrl);
    std::vector<std::string> available{std::istream_iterator<std::string>(words), {}};
    for (const char* need : {"memory", "pids", "cpu"})
      if (std::find(available.begin(), available.end(), need) == available.end())
        return Error::invalid(std::string("cgroup v2 controller '") + need + "' is not available at the hierarchy root " +
                                  m.v2,
                              ENOTSUP);
    std::string dir;
    if (self_mode) {
      if (m.own_v2.empty() || m.own_v2 == "/")
        return Error::invalid("cgroup parent \"self\" needs a delegated cgroup of our own (systemd: Delegate=yes); "
                              "this process is in the root cgroup", EPERM);
      dir = m.v2 + m.own_v2;
      out.parent = m.own_v2;
      // Leave the delegated cgroup to its children: the engine moves into
      // a leaf of its own first.
      out.join = dir + "/supervisor";
      out.make.push_back(out.join);
      out.enable.push_back(dir);
    } else {
      // Create the parent chain. Each level passes the controllers down to
      // the next; levels above `parent` may belong to someone else
      // (systemd), so a failure there only matters if the parent itself
      // ends up without them.
      dir = m.v2 + (parent == "/" ? "" : parent);
      chain(m.v2, dir, out.make);
      out.enable.push_back(m.v2);
      out.enable.insert(out.enable.end(), out.make.begin(), out.make.end());
    }
    out.hierarchies.push_back({"", dir});
    return out;
  }

  if (m.v1.empty()) return Error::invalid("no cgroup hierarchy is mounted", ENOTSUP);
  out.mode = CgroupMode::V1;
  for (const char* need : kV1Controllers) {
    auto it = std::find_if(m.v1.begin(), m.v1.end(), [&](const auto& h) { return h.controller == need; });
    if (it == m.v1.end()) return Error::invalid(std::string("cgroup v1 controller '") + need + "' is not mounted", ENOTSUP);
    const std::string rel = self_mode ? it->own : parent;
    if (self_mode && rel == "/")
      return Error::invalid(std::string("cgroup parent \"self\": this process is in the root of the v1 '") + need +
                                "' hierarchy; give an explicit parent path",
                            EPERM);
    const std::string base = it->mount + (rel == "/" ? "" : rel);
    chain(it->mount, base, out.make);
    out.hierarchies.push_back({need, base});
  }
  return out;
}

namespace {

void each_entry(const std::string& dir, const std::function<void(const dirent&)>& f) {
  if (DIR* d = ::opendir(dir.c_str())) {
    while (const dirent* e = ::readdir(d)) f(*e);
    ::closedir(d);
  }
}

// Whether the lock file `path` exists, and whether someone holds it.
bool lock_held(const std::string& path, bool* exists) {
  UniqueFd f(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  *exists = static_cast<bool>(f);
  return f && ::flock(f.get(), LOCK_SH | LOCK_NB) != 0;
}

}  // namespace

Status prepare_state_dir(const std::string& state_dir) {
  // The modes are set with chmod, not left to mkdir: mkdir applies the
  // umask, and under a restrictive one (the systemd unit's UMask=0077, or a
  // root shell with umask 027) the directories came out without o+x.
  for (const auto& [dir, mode] : {std::pair{state_dir, 0711}, {state_dir + "/root", 0755}, {state_dir + "/empty", 0555},
                                  {state_dir + "/engines", 0700}}) {
    if (::mkdir(dir.c_str(), static_cast<mode_t>(mode)) == 0) {
      if (::chmod(dir.c_str(), static_cast<mode_t>(mode)) != 0) return Error::from_errno("chmod '" + dir + "'");
    } else if (errno != EEXIST) {
      return Error::from_errno("mkdir '" + dir + "'");
    }
    // The engine (root) creates its lock files here and shows `empty` in
    // every view: a directory someone else could have made or changes is
    // not used.
    struct stat st{};
    if (::lstat(dir.c_str(), &st) != 0) return Error::from_errno("stat '" + dir + "'");
    if (!S_ISDIR(st.st_mode) || st.st_uid != 0 || (st.st_mode & (S_IWGRP | S_IWOTH)))
      return Error::invalid("'" + dir + "' must be a directory owned by root and writable only by root", EPERM);
  }
  bool empty = true;
  each_entry(state_dir + "/empty", [&](const dirent& e) {
    empty = empty && (std::string_view(e.d_name) == "." || std::string_view(e.d_name) == "..");
  });
  if (!empty) return Error::invalid("'" + state_dir + "/empty' must be empty (it is the overlays' lowest layer)", ENOTEMPTY);
  // Sandboxes resolve the staging root after switching to their mapped
  // ids, which are "others" for every host directory.
  const std::string staging = state_dir + "/root";
  for (std::string p = staging; !p.empty() && p != "/"; p = p.substr(0, p.rfind('/'))) {
    struct stat st{};
    if (::stat(p.c_str(), &st) != 0) return Error::from_errno("stat '" + p + "'");
    if (!(st.st_mode & S_IXOTH))
      return Error::invalid("state directory: '" + p + "' must be searchable by others (chmod o+x): sandboxes resolve '" +
                                staging + "' with unprivileged ids",
                            EACCES);
    if (p.rfind('/') == 0) break;
  }
  return {};
}


std::vector<std::string> find_stale_leaves(const CgroupPlacement& placement, const std::string& prefix,
                                           const std::string& state_dir, pid_t engine_pid) {
  std::set<std::string> names;
  for (const auto& h : placement.hierarchies)
    each_entry(h.base, [&](const dirent& e) {
      const std::string n = e.d_name;
      if (e.d_type == DT_DIR && n.rfind(prefix + ".", 0) == 0) names.insert(n);
    });
  const std::string engines = state_dir + "/engines/";
  std::vector<std::string> stale;
  for (const auto& n : names) {
    // "<prefix>.<pid>.<instance>-<n>"; older engines: "<prefix>.<pid>.<n>".
    const std::string rest = n.substr(prefix.size() + 1);
    const auto dot = rest.find('.');
    pid_t pid = 0;
    std::from_chars(rest.data(), rest.data() + std::min(dot, rest.size()), pid);
    const std::string tail = dot == std::string::npos ? "" : rest.substr(dot + 1);
    const auto dash = tail.rfind('-');
    bool has_lock = false;
    if (dash != std::string::npos && dash > 0 && lock_held(engines + tail.substr(0, dash) + ".lock", &has_lock)) continue;
    if (!has_lock && pid > 0 && pid != engine_pid && (::kill(pid, 0) == 0 || errno == EPERM)) continue;  // alive: keep
    stale.push_back(n);
  }
  // Lock files of engines that are gone (nobody holds them).
  each_entry(engines, [&](const dirent& e) {
    const std::string n = e.d_name;
    bool exists = false;
    if (n.size() > 5 && n.ends_with(".lock") && !lock_held(engines + n, &exists) && exists)
      ::unlink((engines + n).c_str());
  });
  return stale;
}

void resolve_host_paths(FsInputs& in) {
  const auto resolve = [](std::string& p) {
    char real[PATH_MAX];
    if (!p.empty() && ::realpath(p.c_str(), real) != nullptr) p = real;
  };
  resolve(in.venv);
  resolve(in.runner);
  for (auto& b : in.binds) resolve(b.source);
}

Status check_proc() {
  char self[32] = {};
  const ssize_t n = ::readlink("/proc/self", self, sizeof self - 1);
  if (n <= 0 || std::string(self, static_cast<std::size_t>(n)) != std::to_string(::getpid()))
    return Error::invalid("/proc is not the proc file system of this process's pid namespace "
                          "(mount a new one, e.g. unshare --pid --fork --mount-proc)", EINVAL);
  return {};
}

std::string find_init(const std::string& configured) {
  if (!configured.empty()) return configured;
  char self[4096];
  ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  if (n > 0) {
    std::string dir(self, static_cast<std::size_t>(n));
    dir.resize(dir.rfind('/'));
    const std::string here = dir + "/toolsandbox-init";
    if (::access(here.c_str(), X_OK) == 0) return here;
  }
  return std::string(TSB_LIBEXECDIR) + "/toolsandbox-init";
}

}  // namespace tsb::isolate
