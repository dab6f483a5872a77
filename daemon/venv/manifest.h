// The two venv manifests, as read.
//
// The builder's: the 'm' record of a venv archive (archive.h), written by
// isolate/runner/toolsandbox_venv_builder.py inside the build sandbox, after
// pip ran the packages' code there; hostile input. What the builder writes
// is one object of json.dumps (ASCII, \u escapes):
//
//   {"freeze": ["numpy==1.26.4", ...],   pip freeze --all, one line each
//    "python": "3.11.2",                 the sandbox's Python
//    "requirements": ["numpy==1.26.4"]}  the daemon's own request, echoed
//
// or, for a TypeScript tool's node_modules, {"packages": ["a@1.0.0", ...],
// "node": "20.19.2", "requirements": [...]} (npm's tree, one line each),
//
// so it nests 2 levels, holds about as many values as pip freeze has lines,
// and its longest string is a freeze line. Anything beyond that is refused
// with the reason (the build fails), and of what passes only freeze (a list
// of strings) and python (a short string) are kept: the rest of the cache's
// manifest is the daemon's own (cache.h, publish).
//
// The cache's: <key>.json, written by the front end (Cache::publish) into a
// directory only it can write; read back at open, by `toolsandbox venv` and
// on a publish race. Still a file, so read with limits of its own: one that
// breaks them is a damaged venv (removed at open, like one without a
// manifest).
#pragma once

#include <cstddef>
#include <string_view>

#include <nlohmann/json.hpp>

#include "isolate/base/result.h"
#include "protocol/json_limits.h"

namespace tsb::venv {

inline constexpr std::size_t kMaxFreezeLines = 10000;   // packages in one venv; pip freeze prints one line each
inline constexpr std::size_t kMaxFreezeLine = 4096;     // "name==version", or "name @ URL" (a PEP 508 URL)
inline constexpr std::size_t kMaxPythonVersion = 64;    // "3.11.2"
inline constexpr std::size_t kMaxRequirementsEcho = 64; // the request's requirements (a policy's max_requirements caps them at 64)

// The builder's manifest: at most `max_bytes` (the archive's cap), 2
// levels, freeze's lines and the requirements plus room for a few more
// members, no string longer than a freeze line, no key twice.
protocol::JsonLimits builder_manifest_limits(std::size_t max_bytes);

struct BuilderManifest {
  nlohmann::json freeze;  // a list of at most kMaxFreezeLines strings; null when the builder's was of another shape
  nlohmann::json python;  // a string of at most kMaxPythonVersion bytes; null otherwise
  // A node_modules build's (the same builder, npm's kind): "packages",
  // name@version of every package in the tree (at most kMaxFreezeLines
  // strings), and "node", the sandbox's Node version; null otherwise.
  nlohmann::json packages;
  nlohmann::json node;
};

// The builder's manifest `text`, or why it is refused ("the builder's
// manifest: nested deeper than 2 levels (at byte 14)"): not JSON (UTF-8
// included), past a limit, or not an object.
Result<BuilderManifest> read_builder_manifest(std::string_view text, std::size_t max_bytes);

// The cache's own manifests: at most 4 MiB (the builder's freeze, the
// caller's members, a log tail of escaped bytes: well under), a few levels,
// the builder's values plus the daemon's members, strings up to 64 KiB (the
// log tail is at most 4096 bytes of pip's output, each byte at most 3 once
// made valid UTF-8).
inline constexpr std::size_t kMaxStoredManifest = 4u << 20;
protocol::JsonLimits stored_manifest_limits();

// A <key>.json's text as an object, or why not.
Result<nlohmann::json> read_stored_manifest(std::string_view text);

}  // namespace tsb::venv
