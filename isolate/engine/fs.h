// The sandbox's file system as one table: a row per thing made, in the
// order it is made, each with the reason it is there.
//
//   built     once per policy, from plain inputs, by daemon/policy/fs_table.h (in
//             the compile helper, or in the command line for `toolsandbox
//             run`): pure, no privilege, the same on every host;
//   printed   by `toolsandbox policy explain`, row by row;
//   executed  per run, in two places: the engine (root, before clone3) makes
//             what names a host path or needs the host's ids (kRoot, kSystem,
//             kHost, kBind, kTmpfs, kDev and the rows inside /dev), as
//             detached mounts and copies (isolate/engine/mounts.h);
//             toolsandbox-init, inside the sandbox's namespaces, attaches
//             those and makes everything else (isolate/init/).
//
// Paths are sandbox paths: absolute, normalised, no "." or "..". A row's
// parent directories are made as needed (mode 0755).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "isolate/engine/plan.h"  // kMaxCopiedFileBytes
#include "isolate/engine/stage.h"

namespace tsb::isolate {

struct FsEntry {
  enum Kind : std::uint8_t {
    kRoot,     // the tmpfs that becomes /: `size` bytes plus the copies below; read-only once built
    kSystem,   // host path `path` as the host has it: a symlink recreated as the symlink (or, when it
               // points outside /usr, the file it resolves to), anything else as kHost
    kHost,     // host path `source`, read-only: a directory as a read-only view (an overlay whose
               // mountinfo names no host path), a regular file up to kMaxCopiedFileBytes as a copy in
               // the root tmpfs, anything else as a read-only bind
    kBind,     // host path `source`, bound read-write (mountinfo shows the host path)
    kTmpfs,    // a tmpfs of `size` bytes, `inodes` inodes (0: the kernel's default), `mode`
    kDev,      // the /dev tmpfs: made by the engine with the rows inside it, then read-only
    kDevNode,  // inside kDev: a character device node like the host's `source`
    kDir,      // a directory, `mode` (inside kDev: made by the engine)
    kSymlink,  // a symlink to `source` (inside kDev: made by the engine)
    kFile,     // a file holding `data`, `mode`
    kBootId,   // as kMask, the new file holding a boot id made at random for the run
    kProc,     // a new proc for the sandbox's pid namespace, on a directory of `mode`
    kMask,     // when `path` exists: a new empty file or directory (`mode`: S_IFREG or S_IFDIR and
               // its permissions) that init makes at `source`, a new name in the root tmpfs, bound
               // over it read-only
    kReadOnly, // when `path` exists: itself, bound over itself read-only
  };
  Kind kind = kDir;
  Stage stage = Stage::MountSkeleton;  // reported when the row fails
  std::string path;
  std::string source;
  std::string data;
  std::uint64_t size = 0;
  std::uint32_t inodes = 0;
  std::uint32_t mode = 0755;
  bool tool_owned = false;  // kTmpfs: its root directory belongs to the tool's uid and gid
  bool noexec = false;      // kTmpfs, kDev: nothing on it can be executed
  bool optional = false;    // kSystem, kHost, kBind: skipped when the host path is missing
  bool keyed = false;       // kHost: a run that names a venv key gets `data`/key instead of `source`
  std::string reason;       // for people (policy explain); not part of the compiled set
};
inline constexpr std::uint8_t kFsKindLast = FsEntry::kReadOnly;

using FsTable = std::vector<FsEntry>;

}  // namespace tsb::isolate
