#include "isolate/host_facts.h"

#include <unistd.h>

#include <algorithm>
#include <sstream>

namespace tsb::isolate {

Result<CgroupLayout> read_cgroup_layout() {
  static constexpr const char* kControllers[] = {"memory", "pids", "cpu", "cpuacct", "freezer"};
  CgroupLayout layout;
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
      if (layout.v2_mount.empty() || mnt == "/sys/fs/cgroup") layout.v2_mount = mnt;
    } else if (fstype == "cgroup") {
      std::istringstream opts(superopts);
      std::string opt;
      while (std::getline(opts, opt, ',')) {
        for (const char* c : kControllers) {
          if (opt == c && std::none_of(layout.v1.begin(), layout.v1.end(), [&](const auto& h) { return h.controller == c; }))
            layout.v1.push_back({c, mnt, ""});
        }
      }
    }
  }

  // Where this process sits in each hierarchy (for the parent "self").
  auto pc = read_text_file("/proc/self/cgroup");
  if (!pc.ok()) return std::move(pc).error().wrap("reading /proc/self/cgroup");
  std::istringstream lines(*pc);
  std::string l;
  while (std::getline(lines, l)) {
    auto c1 = l.find(':'), c2 = l.find(':', c1 + 1);
    if (c1 == std::string::npos || c2 == std::string::npos) continue;
    std::string ctrls = l.substr(c1 + 1, c2 - c1 - 1), path = l.substr(c2 + 1);
    if (l.compare(0, c1, "0") == 0 && ctrls.empty()) {
      layout.own_v2 = path;
      continue;
    }
    std::istringstream cs(ctrls);
    std::string c;
    while (std::getline(cs, c, ','))
      for (auto& h : layout.v1)
        if (h.controller == c) h.own = path;
  }

  if (!layout.v2_mount.empty()) {
    // Whole words: a substring search for "cpu" would also match "cpuset".
    auto ctrl = read_text_file(layout.v2_mount + "/cgroup.controllers");
    if (!ctrl.ok()) return std::move(ctrl).error().wrap("reading cgroup v2 controllers");
    std::istringstream words(*ctrl);
    std::string w;
    while (words >> w) layout.v2_controllers.push_back(w);
  }
  return layout;
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
