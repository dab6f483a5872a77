// Parent side: makes the mounts a plan asks for (isolate/plan.h,
// MountRequest) as detached mounts with the new mount API (fsopen,
// fsconfig, fsmount, open_tree, mount_setattr), before clone3. The child
// only moves each into place (MountStep::kAttach).
//
// Why the parent makes them, and not the child in its user namespace:
// everything /proc/self/mountinfo says about a mount is then the engine's
// choice, not the host's. A tmpfs made in the sandbox's user namespace is
// owned by its root, and tmpfs prints a non-root owner as uid=/gid= in its
// options, in host ids: the run's host uid range. A bind of a host
// directory prints the host path it comes from, the host device and the
// host file system's options; a read-only overlay of that directory made
// here prints "/" as its root, an anonymous device, source "toolsandbox"
// and lowerdir=/proc/self/fd/N (the engine's descriptor, not a path).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "isolate/plan.h"
#include "isolate/base/result.h"
#include "isolate/base/unique_fd.h"

namespace tsb::isolate {

struct MountContext {
  std::uint32_t host_id_base = 0;  // sandbox id 0 is host id host_id_base
  bool overlay_views = true;       // read-only directories as overlays (false: plain binds)
  int empty_dir_fd = -1;           // an empty read-only directory: the overlays' lowest layer
};

// The mounts of one run. Closing the fds after clone3 is all the clean-up
// there is: a detached mount that nobody attached goes away with its fd.
struct PreparedMounts {
  UniqueFd root;
  std::vector<UniqueFd> fds;
};

// Makes storage.root and every request of storage.mounts, writes each fd
// into its kAttach step (and plan.root_fd). A host path that cannot be
// opened is not an error here: its step gets fd -1 and the errno, and the
// child reports it at that step like any set-up failure. Anything else (the
// kernel refusing a tmpfs, no descriptors left) is.
Result<PreparedMounts> prepare_mounts(PlanStorage& storage, ChildPlan& plan, const MountContext& ctx);

// Probes once, at engine start, whether this kernel can make read-only
// overlays from the engine's descriptors (overlayfs loaded or loadable).
Status probe_overlay_views(int empty_dir_fd);

}  // namespace tsb::isolate
