// pip requirements as Letta sends them, checked and put in one canonical
// form: the run pipeline checks a run's with it (prepare_run), and a per-tool
// venv is named by the canonical set (plus the interpreter and the index),
// so two spellings of one set share one venv.
#pragma once

#include <nlohmann/json.hpp>

#include "isolate/base/result.h"

#include <string>
#include <string_view>
#include <vector>

namespace tsb::venv {

// A requirement is one of:
//   Ok:        a plain PEP 508 requirement: a project name, optional
//              [extras], optional version specifiers (with or without
//              parentheses), e.g. "requests", "requests[socks]>=2.31,<3",
//              "numpy (==1.26.4)"; or, only when URLs are allowed,
//              "name [extras] @ URL" (http(s)://, git+https://, file://).
//   Forbidden: a pip option ("-..."), a URL or a path otherwise.
//   Malformed: anything else, environment markers ("x; ...") included.
enum class Verdict { Ok, Forbidden, Malformed };

inline constexpr std::size_t kMaxRequirementLength = 200;

struct Requirement {
  std::string name;                     // PEP 503: lower case, each run of "-", "_", "." one "-"
  std::vector<std::string> extras;      // normalised like names, sorted, unique
  std::vector<std::string> specifiers;  // "op" + version, no blanks, sorted, unique: {"<3", ">=2.31"}
  std::string url;                      // the "name @ URL" form only

  // Canonical text: "name[a,b]<3,>=2.31" or "name[a] @ URL"; what pip is
  // given and what a venv's key is made of.
  std::string text() const;
};

struct Parsed {
  Verdict verdict = Verdict::Malformed;
  std::string reason;  // why not Ok, for the client
  Requirement requirement;
};

Parsed parse_requirement(std::string_view text, bool allow_urls);

// The project-name normal form of PEP 503.
std::string normalize_name(std::string_view name);

// What Letta names for a run, in order, duplicates dropped: the sandbox
// config's `pip_requirements` (strings, as E2B configs store them, or
// {"name", "version"} objects, as local configs do: "name==version", or
// "name" when the version is absent or null), then the tool's own. A
// `config_list` that is not an array, null or absent, or an element of
// another shape, is an error (EINVAL, its message says which, starting with
// the field's name).
Result<std::vector<std::string>> gather(const nlohmann::json* config_list, const std::vector<std::string>& tool);

// A set of requirements in canonical form: each parsed (URLs refused), the
// same project named twice merged into one (extras and specifiers
// together), sorted by name.
struct RequirementSet {
  std::vector<Requirement> items;

  // One canonical requirement per line, in order.
  std::string text() const;
};
// The set, or the first problem: EINVAL for a malformed requirement, EPERM
// for one the rules forbid (a pip option), kUrlRefused for a URL or path
// while `allow_urls` is off (the one a setting would allow).
inline constexpr int kUrlRefused = ENOTSUP;
Result<RequirementSet> canonical_set(const std::vector<std::string>& requirements, bool allow_urls = false);

// fnmatch-style patterns ("*", "?", "[...]") over normalised names: the
// first requirement that no pattern matches, or "" when all are allowed.
std::string first_not_allowed(const RequirementSet& set, const std::vector<std::string>& patterns);

// The content key of a venv: sha256 (hex) of a versioned text naming the
// interpreter, the index settings and the canonical set. Everything that
// changes what pip would install changes the key.
std::string venv_key(std::string_view interpreter, std::string_view index_settings, const RequirementSet& set);

}  // namespace tsb::venv
