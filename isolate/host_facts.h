// What the engine's caller reads from the host for it (the compile helper,
// or the command line): the engine itself, in the root process, parses no
// text. Plain reads of /proc and the file system; no privilege needed.
#pragma once

#include <string>

#include "isolate/base/result.h"
#include "isolate/cgroup.h"

namespace tsb::isolate {

// The cgroup hierarchies mounted here (/proc/self/mountinfo), where this
// process sits in each (/proc/self/cgroup), and the controllers the v2
// root offers. A v1 controller is taken from the first hierarchy that has
// it; a bind of a sub-tree is not a hierarchy's mount.
Result<CgroupLayout> read_cgroup_layout();

// toolsandbox-init: `configured` when set, else next to the running program
// (a build tree, or the libexec directory of an installed front end), else
// the installed libexec directory. Always an absolute path; the engine
// checks the file itself (owner, mode) when it opens it.
std::string find_init(const std::string& configured);

}  // namespace tsb::isolate
