#include "daemon/venv/requirements.h"

#include <fnmatch.h>

#include <cctype>

#include <algorithm>
#include <map>

#include "daemon/common/hash.h"
#include "daemon/common/quote.h"

namespace tsb::venv {

namespace {

using nlohmann::json;

struct Cursor {
  std::string_view s;
  std::size_t i = 0;
  bool end() const { return i >= s.size(); }
  char peek() const { return end() ? '\0' : s[i]; }
  void ws() {
    while (!end() && (s[i] == ' ' || s[i] == '\t')) ++i;
  }
  bool eat(std::string_view t) {
    if (s.substr(i, t.size()) != t) return false;
    i += t.size();
    return true;
  }
};

bool alnum(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'); }

// name := [A-Za-z0-9] ([A-Za-z0-9._-]* [A-Za-z0-9])?   (PEP 508 identifier)
bool parse_name(Cursor& c, std::string* out) {
  const std::size_t start = c.i;
  if (!alnum(c.peek())) return false;
  while (!c.end() && (alnum(c.peek()) || c.peek() == '.' || c.peek() == '_' || c.peek() == '-')) ++c.i;
  if (!alnum(c.s[c.i - 1])) return false;
  if (out) *out = normalize_name(c.s.substr(start, c.i - start));
  return true;
}

// version := PEP 440 characters (also "1.*" and what "===" compares)
bool parse_version(Cursor& c, std::string& out) {
  const std::size_t start = c.i;
  while (!c.end() && (alnum(c.peek()) || std::string_view(".*+!-_").find(c.peek()) != std::string_view::npos)) ++c.i;
  out.assign(c.s.substr(start, c.i - start));
  // Versions compare case-insensitively (PEP 440 normalisation; pip's "==="
  // compares lower-cased strings too).
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  return c.i > start;
}

bool parse_spec(Cursor& c, std::vector<std::string>& out) {
  static constexpr std::string_view kOps[] = {"===", "~=", "==", "!=", "<=", ">=", "<", ">"};
  for (auto op : kOps) {
    if (!c.eat(op)) continue;
    c.ws();
    std::string v;
    if (!parse_version(c, v)) return false;
    out.push_back(std::string(op) + v);
    return true;
  }
  return false;
}

bool parse_spec_list(Cursor& c, std::vector<std::string>& out) {
  if (!parse_spec(c, out)) return false;
  for (;;) {
    const std::size_t save = c.i;
    c.ws();
    if (!c.eat(",")) {
      c.i = save;
      return true;
    }
    c.ws();
    if (!parse_spec(c, out)) return false;
  }
}

bool parse_extras(Cursor& c, std::vector<std::string>& out) {
  if (!c.eat("[")) return true;
  c.ws();
  if (c.eat("]")) return true;
  for (;;) {
    std::string e;
    if (!parse_name(c, &e)) return false;
    out.push_back(std::move(e));
    c.ws();
    if (c.eat("]")) return true;
    if (!c.eat(",")) return false;
    c.ws();
  }
}

bool url_ok(std::string_view u) {
  static constexpr std::string_view kSchemes[] = {"https://", "http://", "file://", "git+https://"};
  const bool scheme = std::any_of(std::begin(kSchemes), std::end(kSchemes),
                                  [&](std::string_view s) { return u.size() > s.size() && u.substr(0, s.size()) == s; });
  return scheme && std::none_of(u.begin(), u.end(), [](unsigned char ch) { return ch <= 0x20 || ch >= 0x7f || ch == ';'; });
}

void sort_unique(std::vector<std::string>& v) {
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
}

Parsed malformed(std::string why) { return {Verdict::Malformed, std::move(why), {}}; }

}  // namespace

std::string normalize_name(std::string_view name) {
  std::string out;
  for (char ch : name) {
    if (ch == '-' || ch == '_' || ch == '.') {
      if (out.empty() || out.back() != '-') out += '-';
    } else {
      out += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    }
  }
  return out;
}

std::string Requirement::text() const {
  std::string t = name;
  if (!extras.empty()) {
    t += '[';
    for (std::size_t i = 0; i < extras.size(); ++i) t += (i ? "," : "") + extras[i];
    t += ']';
  }
  if (!url.empty()) return t + " @ " + url;
  for (std::size_t i = 0; i < specifiers.size(); ++i) t += (i ? "," : "") + specifiers[i];
  return t;
}

Parsed parse_requirement(std::string_view req, bool allow_urls) {
  if (req.empty()) return malformed("empty requirement");
  if (req.size() > kMaxRequirementLength)
    return malformed("longer than " + std::to_string(kMaxRequirementLength) + " characters");
  for (unsigned char ch : req)
    if (ch < 0x20 || ch >= 0x7f) return malformed("control or non-ASCII characters");
  std::string_view t = req;
  while (!t.empty() && (t.front() == ' ' || t.front() == '\t')) t.remove_prefix(1);
  while (!t.empty() && (t.back() == ' ' || t.back() == '\t')) t.remove_suffix(1);
  if (!t.empty() && t.front() == '-') return {Verdict::Forbidden, "pip options are not allowed", {}};
  Parsed p{Verdict::Ok, "", {}};
  Requirement& r = p.requirement;
  // A URL, a "name @ URL" or a path (its first token holds a separator).
  const std::string_view first = t.substr(0, t.find_first_of(" \t=<>!~;[("));
  const bool location = t.find("://") != std::string_view::npos || t.find('@') != std::string_view::npos ||
                        first.find('/') != std::string_view::npos || first.find('\\') != std::string_view::npos ||
                        (!t.empty() && (t.front() == '.' || t.front() == '~'));
  Cursor c{t};
  if (location) {
    if (!allow_urls) return {Verdict::Forbidden, "URLs and paths are not allowed", {}};
    if (!parse_name(c, &r.name)) return malformed("a URL requirement must be \"name @ URL\"");
    c.ws();
    if (!parse_extras(c, r.extras)) return malformed("malformed extras");
    c.ws();
    if (!c.eat("@")) return malformed("a URL requirement must be \"name @ URL\"");
    c.ws();
    r.url.assign(c.s.substr(c.i));
    if (!url_ok(r.url)) return malformed("the URL must be http(s)://, git+https:// or file:// without spaces or ';'");
    sort_unique(r.extras);
    return p;
  }
  if (t.find(';') != std::string_view::npos) return malformed("environment markers (\";\") are not accepted");
  if (!parse_name(c, &r.name)) return malformed("must start with a project name");
  c.ws();
  if (c.peek() == '[' && !parse_extras(c, r.extras)) return malformed("malformed extras");
  c.ws();
  if (c.eat("(")) {
    c.ws();
    if (!parse_spec_list(c, r.specifiers)) return malformed("malformed version specifier");
    c.ws();
    if (!c.eat(")")) return malformed("unbalanced parenthesis");
  } else if (!c.end()) {
    if (!parse_spec_list(c, r.specifiers)) return malformed("malformed version specifier");
  }
  c.ws();
  if (!c.end()) return malformed("unexpected text after the requirement");
  sort_unique(r.extras);
  sort_unique(r.specifiers);
  return p;
}

Result<std::vector<std::string>> gather(const json* config_list, const std::vector<std::string>& tool) {
  std::vector<std::string> g;
  auto add = [&](std::string s) {
    if (std::find(g.begin(), g.end(), s) == g.end()) g.push_back(std::move(s));
  };
  if (config_list && !config_list->is_null()) {
    if (!config_list->is_array()) return Error::invalid("pip_requirements must be an array");
    for (const json& e : *config_list) {
      if (e.is_string()) {
        add(e.get<std::string>());
      } else if (e.is_object() && e.contains("name") && e["name"].is_string() &&
                 (!e.contains("version") || e["version"].is_string() || e["version"].is_null())) {
        // Letta's PipRequirement: "name==version", or "name" without one.
        const bool versioned = e.contains("version") && e["version"].is_string() && !e["version"].get<std::string>().empty();
        add(e["name"].get<std::string>() + (versioned ? "==" + e["version"].get<std::string>() : ""));
      } else {
        return Error::invalid("pip_requirements: entries must be strings or {name, version} objects");
      }
    }
  }
  for (const auto& s : tool) add(s);
  return g;
}

std::string RequirementSet::text() const {
  std::string t;
  for (const auto& r : items) t += r.text() + "\n";
  return t;
}

Result<RequirementSet> canonical_set(const std::vector<std::string>& requirements, bool allow_urls) {
  RequirementSet set;
  std::map<std::string, Requirement> by_name;
  for (const auto& s : requirements) {
    Parsed p = parse_requirement(s, allow_urls);
    if (p.verdict != Verdict::Ok) {
      const bool forbidden = p.verdict == Verdict::Forbidden;
      const bool url = forbidden && !allow_urls && parse_requirement(s, true).verdict == Verdict::Ok;
      return Error::invalid("pip requirement " + quoted_for_message(s) + ": " + p.reason,
                            url ? kUrlRefused : forbidden ? EPERM : EINVAL);
    }
    auto [it, fresh] = by_name.try_emplace(p.requirement.name, p.requirement);
    if (fresh) continue;
    Requirement& r = it->second;
    if (r.url != p.requirement.url)
      return Error::invalid("pip requirement " + quoted_for_message(s) + ": " + r.name +
                            " is named twice, from different sources");
    r.extras.insert(r.extras.end(), p.requirement.extras.begin(), p.requirement.extras.end());
    r.specifiers.insert(r.specifiers.end(), p.requirement.specifiers.begin(), p.requirement.specifiers.end());
    sort_unique(r.extras);
    sort_unique(r.specifiers);
  }
  for (auto& [name, r] : by_name) set.items.push_back(std::move(r));
  return set;
}

std::string first_not_allowed(const RequirementSet& set, const std::vector<std::string>& patterns) {
  for (const auto& r : set.items) {
    const bool allowed = std::any_of(patterns.begin(), patterns.end(), [&](const std::string& p) {
      return ::fnmatch(normalize_name(p).c_str(), r.name.c_str(), 0) == 0;
    });
    if (!allowed) return r.name;
  }
  return "";
}

std::string venv_key(std::string_view interpreter, std::string_view index_settings, const RequirementSet& set) {
  std::string text = "toolsandboxd venv 1\ninterpreter ";
  text.append(interpreter);
  text += "\nindex ";
  text.append(index_settings);
  text += "\nrequirements\n" + set.text();
  return sha256_hex(text);
}

}  // namespace tsb::venv
