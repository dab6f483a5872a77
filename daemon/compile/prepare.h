// What the engine's caller reads from the host and prepares on it before
// the engine starts: the set-up helper (`toolsandboxd-frontend --compile
// --setup`, uid 0 without any capability) for the root spawner, or the
// command line itself. The engine, in the root process, parses no text and
// decides none of this; it only creates the cgroup directories it is told
// to (that needs CAP_DAC_OVERRIDE).
#pragma once

#include <sys/types.h>

#include <string>

#include "isolate/base/result.h"
#include "isolate/engine/cgroup.h"
#include "daemon/policy/fs_table.h"

namespace tsb::isolate {

// Where the cgroup parent run leaves go below (EngineConfig::cgroup_parent)
// is, and how the engine makes it ready (Cgroups::open does it: cgroupfs
// roots are mode 0555): the hierarchies mounted here are read from
// /proc/self/mountinfo; v2 is used unless a v1 hierarchy holds the memory
// controller (the hybrid layout). The parent is created; on v2 every level
// above it passes memory, pids and cpu down, and the parent may hold no
// process ("no internal processes", Documentation/admin-guide/cgroup-v2.rst).
// The parent "self" is the cgroup this process runs in (the engine's: the
// compile helper is its child), as systemd delegates it to a service
// (Delegate=yes): on v2 the engine first moves into its leaf "supervisor",
// and run leaves go beside it. Fails with a sentence that says what is
// missing (a controller, a hierarchy, the delegation).
Result<CgroupPlacement> prepare_cgroups(const std::string& parent);

// The engine's state directory: itself (0711), the staging root (0755),
// the overlays' empty lowest layer (0555) and the engines' lock directory
// (0700), with these modes whatever the umask. Sandboxes resolve the
// staging root with their own unprivileged ids: every directory above it
// must be searchable by others, or this fails saying which is not.
Status prepare_state_dir(const std::string& state_dir);

// Leaves of engines that are gone, in every hierarchy of `placement` (a
// crash may leave a leaf in some only): names "<prefix>.<pid>.<instance>-<n>"
// whose instance's lock file (<state_dir>/engines/<instance>.lock) nobody
// holds; without a lock file (an engine with another state directory, or
// one whose /run was wiped, as in a container restart), those whose pid is
// not alive or is `engine_pid` (a restart got the dead engine's pid). The
// lock files of engines that are gone are removed once their leaves are
// listed. The engine kills and removes the leaves (EngineConfig::stale_leaves).
std::vector<std::string> find_stale_leaves(const CgroupPlacement& placement, const std::string& prefix,
                                           const std::string& state_dir, pid_t engine_pid);

// The host paths of `in` (the venv, the runner, bind sources) with the
// symlinks in them resolved, as they are now (a path that does not exist is
// left as it is). The engine follows no symlink in a host path at run time
// (isolate/engine/mounts.cc), so that a link planted later cannot redirect it;
// this is when a policy's own links are taken: at load.
void resolve_host_paths(FsInputs& in);

// The engine names its children by pid in /proc: that /proc must be the
// one of its pid namespace (not so after a bare unshare --pid). Checked by
// a process of the same pid and mount namespaces as the engine.
Status check_proc();

// toolsandbox-init: `configured` when set, else next to the running program
// (a build tree, or the libexec directory of an installed front end), else
// the installed libexec directory. Always an absolute path; the engine
// checks the file itself (owner, mode) when it opens it.
std::string find_init(const std::string& configured);

}  // namespace tsb::isolate
