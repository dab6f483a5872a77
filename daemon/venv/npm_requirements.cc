#include "daemon/venv/npm_requirements.h"

#include <fnmatch.h>

#include <algorithm>

#include "daemon/common/hash.h"
#include "daemon/common/quote.h"

namespace tsb::venv {
namespace {

bool lower_or_digit(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); }
bool name_char(char c) { return lower_or_digit(c) || c == '-' || c == '.' || c == '_'; }

// One part of a name (the scope or the package): what npm accepts for a new
// package (validate-npm-package-name): URL-safe lower-case characters, not
// starting with "." or "_".
bool valid_part(std::string_view s) {
  return !s.empty() && lower_or_digit(s[0]) && std::all_of(s.begin(), s.end(), name_char);
}

// The characters of a semver range (node-semver's grammar: numbers, "x",
// "*", pre-release and build identifiers, the operators, "||", hyphen
// ranges, blanks between comparators) and of a dist-tag.
bool range_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '-' ||
         c == '+' || c == '^' || c == '~' || c == '<' || c == '>' || c == '=' || c == '|' || c == '*' || c == ' ' ||
         c == '_';
}

Error bad(int code, std::string_view text, std::string_view why) {
  return Error::invalid("npm requirement " + quoted_for_message(text) + ": " + std::string(why), code);
}

}  // namespace

std::string NpmRequirement::text() const { return range.empty() ? name : name + "@" + range; }

Result<NpmRequirement> parse_npm_requirement(std::string_view text) {
  if (text.empty()) return bad(kNpmMalformed, text, "empty");
  if (text.size() > kMaxNpmNameLength + 1 + kMaxNpmRangeLength) return bad(kNpmMalformed, text, "too long");
  for (unsigned char c : text)
    if (c < 0x20 || c >= 0x7f) return bad(kNpmMalformed, text, "control or non-ASCII characters");
  if (text[0] == '-') return bad(kNpmForbidden, text, "an npm option, not a package");
  // Everything npm fetches from elsewhere than the registry: URLs, git,
  // "github:", "file:", "npm:" aliases, paths and "user/repo" shorthands.
  const bool scoped = text[0] == '@';
  const std::size_t slash = text.find('/');
  if (text.find(':') != std::string_view::npos || text[0] == '.' || text[0] == '/' || text[0] == '~' ||
      (slash != std::string_view::npos && (!scoped || text.find('/', slash + 1) != std::string_view::npos)))
    return bad(kNpmForbidden, text,
               "a URL, git repository, path or alias; only registry packages (\"name\" or \"name@range\") are allowed");
  if (scoped && slash == std::string_view::npos) return bad(kNpmMalformed, text, "a scope without a package name");
  const std::size_t at = text.find('@', scoped ? slash : 0);
  NpmRequirement r;
  r.name = std::string(text.substr(0, at));
  if (r.name.size() > kMaxNpmNameLength) return bad(kNpmMalformed, text, "a name longer than 214 characters");
  const std::string_view pkg = scoped ? std::string_view(r.name).substr(slash + 1) : std::string_view(r.name);
  if ((scoped && !valid_part(std::string_view(r.name).substr(1, slash - 1))) || !valid_part(pkg))
    return bad(kNpmMalformed, text,
               "not an npm package name (lower-case letters, digits, \"-\", \".\", \"_\", not starting with \".\" "
               "or \"_\", an optional \"@scope/\")");
  if (at == std::string_view::npos) return r;
  std::string_view range = text.substr(at + 1);
  // Blanks around and between comparators are one blank.
  for (char c : range)
    if (!range_char(c)) return bad(kNpmMalformed, text, "the version is not a semver range or a dist-tag");
  while (!range.empty() && range.front() == ' ') range.remove_prefix(1);
  while (!range.empty() && range.back() == ' ') range.remove_suffix(1);
  if (range.empty()) return bad(kNpmMalformed, text, "an empty version after \"@\"");
  if (range.size() > kMaxNpmRangeLength) return bad(kNpmMalformed, text, "a version longer than 128 characters");
  for (char c : range)
    if (c != ' ' || r.range.empty() || r.range.back() != ' ') r.range += c;
  return r;
}

Result<std::vector<NpmRequirement>> canonical_npm_set(const std::vector<std::string>& requirements) {
  std::vector<NpmRequirement> out;
  for (const std::string& t : requirements) {
    auto parsed = parse_npm_requirement(t);
    if (!parsed.ok()) return std::move(parsed).error();  // context: the message names the requirement
    NpmRequirement r = std::move(parsed).value();
    auto same = std::find_if(out.begin(), out.end(), [&](const NpmRequirement& o) { return o.name == r.name; });
    if (same == out.end()) {
      out.push_back(std::move(r));
    } else if (same->range != r.range) {
      return Error::invalid("npm package " + quoted_for_message(r.name) + " is asked for twice, as " +
                            quoted_for_message(same->text()) + " and " + quoted_for_message(r.text()) +
                            " (a run gets one version of each package)");
    }
  }
  std::sort(out.begin(), out.end(), [](const NpmRequirement& a, const NpmRequirement& b) { return a.name < b.name; });
  return out;
}

std::string first_npm_not_allowed(const std::vector<NpmRequirement>& set, const std::vector<std::string>& patterns) {
  for (const NpmRequirement& r : set)
    if (std::none_of(patterns.begin(), patterns.end(),
                     [&](const std::string& p) { return ::fnmatch(p.c_str(), r.name.c_str(), 0) == 0; }))
      return r.name;
  return "";
}

std::string npm_set_text(const std::vector<NpmRequirement>& set) {
  std::string s;
  for (const NpmRequirement& r : set) s += r.text() + "\n";
  return s;
}

std::string npm_key(std::string_view node, std::string_view source_settings, const std::vector<NpmRequirement>& set) {
  std::string text = "toolsandboxd node_modules 1\nnode ";
  text.append(node);
  text += "\nsource ";
  text.append(source_settings);
  text += "\nrequirements\n" + npm_set_text(set);
  return sha256_hex(text);
}

}  // namespace tsb::venv
