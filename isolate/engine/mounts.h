// The engine's rows of a file-system table (isolate/engine/fs.h), per run, before
// clone3: the mounts are made with the new mount API (fsopen, fsconfig,
// fsmount, open_tree, mount_setattr) as detached mounts, and small host
// files are read; what toolsandbox-init does with them comes out as the
// plan's steps (isolate/engine/plan.h).
//
// Why the engine makes them, and not the sandbox in its user namespace:
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

#include "isolate/base/result.h"
#include "isolate/base/unique_fd.h"
#include "isolate/engine/fs.h"

namespace tsb::isolate {

struct MountContext {
  std::uint32_t host_id_base = 0;      // sandbox id 0 is host id host_id_base
  std::uint32_t tool_uid = 0, tool_gid = 0;  // sandbox ids of kTmpfs rows that are tool_owned
  bool overlay_views = true;           // read-only directories as overlays (false: plain binds)
  int empty_dir_fd = -1;               // an empty read-only directory: the overlays' lowest layer
};

// One run's mounts and steps. Closing the fds after clone3 is all the
// clean-up there is: a detached mount that nobody attached goes away with
// its fd.
struct PreparedFs {
  UniqueFd root;
  std::vector<UniqueFd> fds;
  std::string steps;  // the plan's steps, encoded
  std::uint32_t nsteps = 0;
  std::vector<std::string> paths;  // each step's sandbox path, in order
};

// A host path that cannot be opened is not an error here: its step gets fd
// -1 and the errno, and init reports it at the row's stage like any set-up
// failure (a missing venv says "mount-bind: No such file or directory").
// Anything else (the kernel refusing a tmpfs, no descriptors left) is.
Result<PreparedFs> prepare_fs(const FsTable& table, const MountContext& ctx);

// Probes once, at engine start, whether this kernel can make read-only
// overlays from the engine's descriptors (overlayfs loaded or loadable).
Status probe_overlay_views(int empty_dir_fd);

}  // namespace tsb::isolate
