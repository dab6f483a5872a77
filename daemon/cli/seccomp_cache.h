// Compiled seccomp programs kept on disk for `toolsandbox run`, which is one
// process per run and would otherwise parse and compile its policy's
// profile and the sandbox init's filter every time (the daemon compiles
// them once, at start and on reload).
//
// A program is kept under a key that names everything its compilation
// read: what it is (a policy's fingerprint, which covers the profile's
// resolved text, or the init filter), the kernel release and machine (a
// profile's minKernel rules, the native architecture), libseccomp's version,
// and this executable (device, inode, size, modification time: a rebuilt or
// reinstalled toolsandbox compiles anew). The file holds a magic line, the
// SHA-256 of the program and the program; it is used only when the
// directory and the file are root's and writable by no one else, and the
// digest matches. Anything else is a miss: the program is compiled, as
// without a cache. A store that fails is reported, never fatal.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "isolate/base/result.h"
#include "isolate/engine/seccomp.h"

namespace tsb::cli {

inline constexpr std::string_view kSeccompCacheDir = "/var/cache/toolsandbox/seccomp";

// The key of `what` ("policy " + fingerprint, or "init") on this machine,
// for this executable: 64 hex characters.
std::string seccomp_cache_key(std::string_view what);

// The program under `key` in `dir`, or null when there is none this
// process can trust (missing, not root's, writable by others, malformed,
// its digest wrong).
std::shared_ptr<const isolate::SeccompProgram> load_cached_program(const std::string& dir, const std::string& key);

// Keeps `program` under `key`: `dir` is created (0700) when missing, the
// file written whole to a temporary name, synced and renamed into place.
Status store_cached_program(const std::string& dir, const std::string& key, const isolate::SeccompProgram& program);

// The cached program, else compile() (stored on success; a failed store
// is written to stderr with `who`). `hit` says which.
using CompileFn = std::function<Result<std::shared_ptr<const isolate::SeccompProgram>>()>;
Result<std::shared_ptr<const isolate::SeccompProgram>> cached_or_compiled(const std::string& dir, std::string_view what,
                                                                          const CompileFn& compile, const char* who,
                                                                          bool* hit = nullptr);

}  // namespace tsb::cli
