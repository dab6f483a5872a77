// The plan a sandbox is built from: what the engine (root, isolate/engine/engine.cc)
// hands to toolsandbox-init (isolate/init/), which builds the sandbox from
// inside its namespaces and becomes its pid 1.
//
// The engine writes the plan into a memfd before clone3, in the base's
// encoding (isolate/base/wire.h); the clone3 child waits for its id maps,
// becomes the namespace's root and executes toolsandbox-init with the
// plan's descriptor. The descriptors the plan names are the child's own:
// the same numbers as in the engine, kept open across that execve.
//
// Layout, in order ("cstr": a u32 length, the bytes, a NUL; "text": a cstr
// without a NUL inside; "bytes": a cstr whose bytes may hold NULs):
//
//   u32   kPlanMagic
//   i32   descriptors: report, stdin, stdout, stderr, sync, watch, lease, root
//   i32   the egress socket (network 2; -1 otherwise)
//   u32   backstop in seconds (init ends the run itself after it; 0: none)
//   u8    network: 0 the host's (nothing to do), 1 a namespace of its own
//         (bring lo up), 2 egress (lo up, then a listener on
//         127.0.0.1:kEgressProxyPort sent over the egress socket)
//   u8    Landlock: 0 off, 1 as far as the kernel's ABI goes (kLandlockAuto)
//   u8    end note: 1 gives the tool a pipe to pid 1 as fd 3 (RunSpec::end_note)
//   text  staging directory (where the root tmpfs is attached, a host path)
//   text  hostname, working directory
//   u32   the tool's uid, gid (inside the sandbox)
//   u64   RLIMIT_FSIZE, RLIMIT_NOFILE, RLIMIT_NPROC, the CPU-time limit in ms (0: none)
//   u32   argc, then argc texts; u32 envc, then envc texts ("KEY=VALUE")
//   bytes the tool's seccomp program, the init's seccomp program (sock_filter arrays)
//   u32   step count, then each step:
//           u8 Op, u8 Stage, u8 flags (kStepDir, kStepOptional, kStepWritable,
//           kStepNoExec), u32 mode,
//           i32 fd (kAttach: a detached mount, -1 with `err`; kCopyFile: a
//           host file opened read-only), i32 err,
//           text path (a sandbox path), text source, bytes data
//
// Header only, no library includes: toolsandbox-init is a static program
// that links nothing but libc.
#pragma once

#include <cstdint>

namespace tsb::isolate {

inline constexpr std::uint32_t kPlanMagic = 0x32627374;  // "tsb2": the layout with the end note
// A plan larger than this is refused by init (an environment is a few
// MiB; host files travel as descriptors, not in the plan).
inline constexpr std::uint64_t kMaxPlanBytes = 64ull << 20;

// Read-only host files up to this size are copied into the root tmpfs
// rather than bound (a bind shows its host path in mountinfo): the engine
// opens each and init copies it (kCopyFile).
inline constexpr std::uint64_t kMaxCopiedFileBytes = 256u << 10;

// What toolsandbox-init does for one step, in order, before pivot_root.
enum class Op : std::uint8_t {
  kMkdir,      // mkdir path (mode)
  kSymlink,    // symlink path -> source
  kWriteFile,  // a new file at path (mode) holding data
  kAttach,     // move the detached mount fd onto path (a directory, or an empty file unless kStepDir)
  kProc,       // mount a new proc on path (a directory of mode)
  kMask,       // when path exists: a new empty file (kStepDir: directory) of mode at source, bound over it read-only
  kReadOnly,   // when path exists: bind it over itself, read-only
  kBootId,     // as kMask, the new file holding a random boot id
  kCopyFile,   // a new file at path (mode) holding what the regular file fd holds, at most kMaxCopiedFileBytes
  kDevice,     // path is a character device the engine made in the attached /dev: checked; the tool may use it
};
inline constexpr std::uint8_t kOpLast = static_cast<std::uint8_t>(Op::kDevice);
inline constexpr std::uint8_t kStepDir = 1;       // kAttach: the mount is a directory
inline constexpr std::uint8_t kStepOptional = 2;  // kAttach with fd -1: skip instead of failing
// What the tool may do at path, for its Landlock rules (isolate/init/landlock.h):
inline constexpr std::uint8_t kStepWritable = 4;  // kAttach: the mount is writable
inline constexpr std::uint8_t kStepNoExec = 8;    // kAttach: nothing on the mount can be executed
inline constexpr std::uint8_t kLandlockAuto = 1;

// Where a tool in network mode "egress" finds the daemon's proxy: a
// listener init creates in the sandbox's network namespace, which the
// front end accepts on (docs/ARCHITECTURE.md, "Egress").
inline constexpr std::uint16_t kEgressProxyPort = 3128;
inline constexpr std::uint8_t kNetworkHost = 0, kNetworkOwn = 1, kNetworkEgress = 2;

// Bytes on the sync pipe, from the engine to the sandbox.
inline constexpr char kSyncMaps = 'M';    // uid/gid maps are written
inline constexpr char kSyncCgroup = 'C';  // the child sits in its cgroup leaf

}  // namespace tsb::isolate
