// npm requirements as Letta sends them (a TypeScript tool's
// `npm_requirements`: NpmRequirement(name, version), which Letta's E2B
// sandbox installs with `npm install NAME@"VERSION"`), checked and put in
// one canonical form. The run pipeline checks a run's with it (prepare_run);
// the local backend names a tool's node_modules by the canonical set, and the
// E2B backend installs each with `npm install -- SPEC`, never through a
// shell.
#pragma once

#include "isolate/base/result.h"

#include <string>
#include <string_view>
#include <vector>

namespace tsb::venv {

inline constexpr std::size_t kMaxNpmNameLength = 214;     // npm's own limit
inline constexpr std::size_t kMaxNpmRangeLength = 128;

// A requirement is a registry package and what versions of it may be used:
//   "name", "name@RANGE", "@scope/name", "@scope/name@RANGE"
// where RANGE is a semver range ("^1.2.3", ">=1 <2", "1.x || 2.x", "*") or a
// dist-tag ("latest", "next"). npm's other specifiers, which fetch code from
// elsewhere than the registry the policy names, are forbidden: URLs and
// tarballs ("https://...", "x@https://..."), git ("git+ssh://...",
// "github:u/r", "u/r"), paths and "file:", aliases ("x@npm:y"), and options
// ("-..."). Anything else (an invalid name, control or blank characters
// outside a range, a range with characters no semver range has) is
// malformed.
struct NpmRequirement {
  std::string name;   // as npm names it: lower case, optional "@scope/"
  std::string range;  // "" (any: npm's "latest"), a range or a dist-tag, blanks collapsed

  // Canonical text: "name" or "name@range"; what `npm install` is given
  // and what a node_modules key is made of.
  std::string text() const;
};

// The error codes of canonical_npm_set (and parse_npm_requirement).
inline constexpr int kNpmMalformed = EINVAL;
inline constexpr int kNpmForbidden = EPERM;

Result<NpmRequirement> parse_npm_requirement(std::string_view text);

// The requirements of a run in canonical form: each parsed, duplicates of
// the same text dropped, sorted by name. The same package with two
// different ranges is malformed (npm would keep the last; a run gets one
// version of each). Errors: kNpmMalformed or kNpmForbidden, the message
// naming the requirement (escaped).
Result<std::vector<NpmRequirement>> canonical_npm_set(const std::vector<std::string>& requirements);

// fnmatch-style patterns ("*", "?", "[...]") over package names ("@scope/*"
// matches a scope's packages): the first requirement that no pattern
// matches, or "" when all are allowed.
std::string first_npm_not_allowed(const std::vector<NpmRequirement>& set, const std::vector<std::string>& patterns);

// One canonical requirement per line, in order.
std::string npm_set_text(const std::vector<NpmRequirement>& set);

// The content key of a node_modules: sha256 (hex) of a versioned text
// naming the Node runtime (`node`: its path, size and change time), the
// source of packages and whether install scripts run (`source_settings`,
// core::NpmPackagesPolicy::source_settings) and the canonical set. Never a
// venv's key: the texts differ in their first line.
std::string npm_key(std::string_view node, std::string_view source_settings, const std::vector<NpmRequirement>& set);

}  // namespace tsb::venv
