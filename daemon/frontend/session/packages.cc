// A session's own packages (packages.h).
#include "daemon/frontend/session/packages.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "daemon/common/quote.h"
#include "daemon/frontend/local/local_backend.h"
#include "daemon/frontend/session/session.h"
#include "protocol/json_limits.h"

namespace tsb::core {
namespace {

using nlohmann::json;
using protocol::ErrorCode;

constexpr std::size_t kMaxPackageJson = 1u << 20;
std::string q(std::string_view s) { return quoted_for_message(s); }

Error bad(const std::string& launcher, const std::string& why) {
  return Error::invalid("`" + launcher + "` in a session: " + why);
}

// A program's name as npx and uvx take it: one path component.
bool program_name_ok(std::string_view s) {
  return !s.empty() && s.size() <= 128 && s.front() != '.' && s.front() != '-' &&
         s.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-") == std::string_view::npos;
}

// npx [-y|--yes|-q|--quiet|-p PKG|--package[=]PKG]... [--] PACKAGE|COMMAND ARGS...
// (npm 7 and later: every option before the first word that is not one).
Result<std::optional<PackageLaunch>> parse_npx(const std::vector<std::string>& c) {
  PackageLaunch l;
  std::size_t i = 1;
  for (; i < c.size(); ++i) {
    const std::string& a = c[i];
    if (a == "--") {
      ++i;
      break;
    }
    if (a == "-y" || a == "--yes" || a == "-q" || a == "--quiet" || a == "--silent") continue;
    if (a == "-p" || a == "--package") {
      if (++i == c.size()) return bad("npx", a + " needs a package");
      l.requirements.push_back(c[i]);
      continue;
    }
    if (a.starts_with("--package=")) {
      l.requirements.push_back(a.substr(10));
      continue;
    }
    if (a.starts_with("-"))
      return bad("npx", "the option " + quoted_for_message(a) +
                            " is not taken (only -y, --yes, -q, --quiet, --silent, -p and --package; "
                            "`-c` runs a shell, which a session never does)");
    break;
  }
  if (i == c.size()) return bad("npx", "no package to run");
  if (l.requirements.empty()) {
    l.requirements.push_back(c[i]);
  } else {
    if (!program_name_ok(c[i])) return bad("npx", "the command " + quoted_for_message(c[i]) + " is not a program's name");
    l.program = c[i];
  }
  l.args.assign(c.begin() + static_cast<std::ptrdiff_t>(i) + 1, c.end());
  return std::optional<PackageLaunch>(std::move(l));
}

// uvx [--from SPEC] [--with SPEC]... [-q|--quiet|--offline] [--] COMMAND[@VERSION] ARGS...
Result<std::optional<PackageLaunch>> parse_uvx(const std::vector<std::string>& c) {
  PackageLaunch l;
  l.npm = false;
  std::string from;
  std::vector<std::string> with;
  std::size_t i = 1;
  for (; i < c.size(); ++i) {
    const std::string& a = c[i];
    if (a == "--") {
      ++i;
      break;
    }
    if (a == "-q" || a == "--quiet" || a == "--offline") continue;
    if (a == "--from" || a == "--with") {
      if (i + 1 == c.size() || c[i + 1].empty()) return bad("uvx", a + " needs a requirement");
      if (a == "--from" && !from.empty()) return bad("uvx", "--from is given twice");
      (a == "--from" ? from : with.emplace_back()) = c[++i];
      continue;
    }
    if (a.starts_with("--from=") || a.starts_with("--with=")) {
      const std::string v = a.substr(7);
      if (v.empty()) return bad("uvx", a + " needs a requirement");
      if (a[2] == 'f' && !from.empty()) return bad("uvx", "--from is given twice");
      (a[2] == 'f' ? from : with.emplace_back()) = v;
      continue;
    }
    if (a.starts_with("-"))
      return bad("uvx", "the option " + quoted_for_message(a) +
                            " is not taken (only --from, --with, -q, --quiet and --offline; the Python is the policy's)");
    break;
  }
  if (i == c.size()) return bad("uvx", "no command to run");
  std::string command = c[i];
  std::string version;
  if (auto at = command.find('@'); at != std::string::npos) {
    version = command.substr(at + 1);
    command.resize(at);
    if (version.empty()) return bad("uvx", "the command " + quoted_for_message(c[i]) + " has an empty version");
    if (!from.empty()) return bad("uvx", "a version in the command and --from together");
  }
  if (!program_name_ok(command)) return bad("uvx", "the command " + quoted_for_message(c[i]) + " is not a program's name");
  l.program = command;
  if (from.empty()) from = version.empty() || version == "latest" ? command : command + "==" + version;
  l.requirements.push_back(from);
  l.requirements.insert(l.requirements.end(), with.begin(), with.end());
  l.args.assign(c.begin() + static_cast<std::ptrdiff_t>(i) + 1, c.end());
  return std::optional<PackageLaunch>(std::move(l));
}

// A file beneath `dir` (no link followed, no other mount), opened to read.
UniqueFd open_beneath(int dir, const std::string& path) {
  struct open_how how {};
  how.flags = O_RDONLY | O_CLOEXEC | O_NOFOLLOW;
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV;
  return UniqueFd(static_cast<int>(::syscall(SYS_openat2, dir, path.c_str(), &how, sizeof how)));
}

bool regular_file(int fd) {
  struct stat st{};
  return fd >= 0 && ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
}

// A path inside a package as its package.json writes one ("./dist/x.js",
// "bin/x"): normalized, or "" when it leaves the package.
std::string inside(std::string_view p) {
  std::string out;
  while (!p.empty()) {
    const auto slash = p.find('/');
    const std::string_view part = p.substr(0, slash);
    p = slash == std::string_view::npos ? std::string_view() : p.substr(slash + 1);
    if (part.empty() || part == ".") continue;
    if (part == ".." || part.find('\0') != std::string_view::npos) return "";
    out += (out.empty() ? "" : "/") + std::string(part);
  }
  return out;
}

}  // namespace

Result<std::optional<PackageLaunch>> parse_package_launch(const std::vector<std::string>& command) {
  if (command.empty() || !is_package_launcher(command[0])) return std::optional<PackageLaunch>();
  return command[0] == "npx" ? parse_npx(command) : parse_uvx(command);
}

Result<std::string> npm_program(const std::string& tree, const std::string& name, const std::string& program) {
  UniqueFd root(::open(tree.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!root) return Error::from_errno("the node_modules " + quoted_for_message(tree));
  UniqueFd f = open_beneath(root.get(), name + "/package.json");
  if (!regular_file(f.get()))
    return Error::invalid("the npm package " + quoted_for_message(name) + " has no package.json in its node_modules");
  std::string text;
  char buf[65536];
  for (ssize_t n; (n = ::read(f.get(), buf, sizeof buf)) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 || text.size() + static_cast<std::size_t>(n) > kMaxPackageJson)
      return Error::invalid("the package.json of " + quoted_for_message(name) + " cannot be read (or is over 1 MiB)");
    text.append(buf, static_cast<std::size_t>(n));
  }
  const json pkg = protocol::parse_json_bounded(text);
  if (!pkg.is_object()) return Error::invalid("the package.json of " + quoted_for_message(name) + " is not a JSON object");
  // Its bins, by name ("bin": "file" is the bin named as the package).
  std::vector<std::pair<std::string, std::string>> bins;
  const std::string base = name.substr(name.find('/') + 1);
  if (auto b = pkg.find("bin"); b != pkg.end()) {
    if (b->is_string()) bins.emplace_back(base, b->get<std::string>());
    if (b->is_object())
      for (const auto& [k, v] : b->items())
        if (v.is_string()) bins.emplace_back(k, v.get<std::string>());
  }
  const std::pair<std::string, std::string>* pick = nullptr;
  for (const auto& b : bins)
    if (b.first == (program.empty() ? base : program)) pick = &b;
  // As npx: its only bin, or the one file all its bins name.
  if (!pick && program.empty() && !bins.empty() &&
      std::all_of(bins.begin(), bins.end(), [&](const auto& b) { return inside(b.second) == inside(bins[0].second); }))
    pick = &bins.front();
  if (!pick) {
    std::string names;
    for (std::size_t i = 0; i < bins.size() && i < 16; ++i)
      names += (i ? ", " : "") + quoted_for_message(bins[i].first);
    if (bins.size() > 16) names += ", ...";
    return Error::invalid("the npm package " + quoted_for_message(name) + " has no program " +
                          quoted_for_message(program.empty() ? base : program) +
                          (bins.empty() ? std::string(" (it has no \"bin\")") : " (its bins: " + names + ")"));
  }
  const std::string file = inside(pick->second);
  if (file.empty() || !regular_file(open_beneath(root.get(), name + "/" + file).get()))
    return Error::invalid("the program " + quoted_for_message(pick->first) + " of the npm package " +
                          quoted_for_message(name) + " is not a file of the package (" +
                          quoted_for_message(pick->second) + ")");
  return std::string(isolate::kNodeModulesPath) + "/" + name + "/" + file;
}

Result<std::string> venv_program(const std::string& tree, const std::string& program) {
  UniqueFd root(::open(tree.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!root) return Error::from_errno("the venv " + quoted_for_message(tree));
  if (!program_name_ok(program) || !regular_file(open_beneath(root.get(), "bin/" + program).get()))
    return Error::invalid("the venv has no program " + quoted_for_message(program) + " (bin/" +
                          quoted_for_message(program) + "): its packages install no such console script");
  return std::string(isolate::kVenvPath) + "/bin/" + program;
}

asio::awaitable<std::optional<Refusal>> prepare_session_packages(LocalBackend& local, SessionOpen& open,
                                                                 CancelSignal& stop, PackagesCheck check) {
  auto parsed = parse_package_launch(open.argv);
  if (!parsed.ok()) co_return Refusal{ErrorCode::BadRequest, parsed.error().message};
  if (!*parsed) co_return std::nullopt;
  const PackageLaunch l = std::move(**parsed);
  const Policy& pol = *open.policy;
  const std::string launcher = l.npm ? "npx" : "uvx";
  // The runtime that runs the package's program: the policy's node, or the
  // venv's python, which the policy must allow as a session command.
  // (The policy's typescript.node: the one its node_modules are built for.)
  const std::string runtime = l.npm ? pol.typescript.node : std::string(isolate::kVenvPath) + "/bin/python3";
  if (std::find(pol.sessions.commands.begin(), pol.sessions.commands.end(), runtime) == pol.sessions.commands.end())
    co_return Refusal{ErrorCode::PolicyDenied, "policy " + q(pol.name) + " does not allow " +
                                                   (runtime.empty() ? std::string("node") : runtime) +
                                                   " in sessions, which runs `" + launcher + "`'s packages"};
  json requirements = json::array();
  std::string key;
  std::vector<venv::NpmRequirement> npm;
  venv::RequirementSet pip;
  if (l.npm) {
    const TypeScriptRules rules = local.typescript_rules(pol);
    if (!rules.npm_refusal.empty()) co_return Refusal{ErrorCode::PolicyDenied, rules.npm_refusal + ", which `npx` needs"};
    if (auto refused = checked_npm_set(rules, pol, l.requirements, "session", npm)) co_return refused;
    for (const auto& r : npm) requirements.push_back(r.text());
    key = local.npm_key(pol, npm);
  } else {
    const RequirementRules rules = local.requirement_rules(pol);
    if (!rules.refusal.empty()) co_return Refusal{ErrorCode::PolicyDenied, rules.refusal + ", which `uvx` needs"};
    if (auto refused = checked_pip_set(rules, pol, l.requirements, "session", pip)) co_return refused;
    for (const auto& r : pip.items) requirements.push_back(r.text());
    key = local.venv_key(pol, pip);
  }
  if (check)
    if (auto refused = l.npm ? check("", key) : check(key, "")) co_return refused;
  // Found or built; a build goes on when the client leaves (the next
  // session finds it), and stops at the daemon's stop.
  const LocalBackend::BuildFor wanted{pol,     l.npm ? nullptr : &pip, l.npm ? &npm : nullptr, open.request_id,
                                      open.organization_id, "session:" + launcher, stop};
  LocalBackend::VenvOutcome got = co_await local.venv_for(wanted, key);
  const std::string what = l.npm ? "node_modules" : "venv";
  open.packages = {{"kind", what},
                   {"key", key},
                   {"requirements", requirements},
                   {"built", got.built},
                   {"build_ms", got.build_ms},
                   {"build_run_id", got.build_run_id.empty() ? json() : json(got.build_run_id)}};
  if (!got.failure.empty()) {
    // npm or pip refused the set (a package or version that is not there):
    // the request's; anything else (a timeout, the cache, shutdown): retry.
    const bool theirs = !got.cancelled && got.refused_by_installer;
    std::string why = "the session's " + what + " (" + requirements.dump() + ") could not be made: " + got.failure;
    if (!got.log_tail.empty()) why += "; the build's last lines: " + escaped(got.log_tail);
    co_return Refusal{theirs ? ErrorCode::BadRequest : ErrorCode::Unavailable, std::move(why)};
  }
  const std::string dir = local.venv_path(key);
  Result<std::string> file = Error::invalid("");
  if (l.npm) {
    for (const auto& r : npm)  // the program: npx's command, or the (first) package's own
      if ((file = npm_program(dir, r.name, l.program)).ok() || l.program.empty()) break;
  } else {
    file = venv_program(dir, l.program);
  }
  if (!file.ok()) co_return Refusal{ErrorCode::BadRequest, "`" + launcher + "` in a session: " + file.error().message};
  open.argv = {runtime, *file};
  open.argv.insert(open.argv.end(), l.args.begin(), l.args.end());
  (l.npm ? open.node_modules : open.venv) = key;
  open.packages_hold = std::make_shared<venv::Cache::Hold>(std::move(got.hold));
  co_return std::nullopt;
}

}  // namespace tsb::core
