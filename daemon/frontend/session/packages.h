// A session's own packages: an MCP server started the way its users start
// it, `npx -y PACKAGE ARGS...` or `uvx PACKAGE ARGS...`, gets that package
// as a tool's requirements get theirs. The daemon reads the launcher's
// words (parse_package_launch), checks the packages against the policy's
// "typescript.packages" or "packages" (allow-list, count, forms), finds or
// builds a node_modules or a venv in the venv cache, in a build sandbox of
// the policy's (LocalBackend::venv_for), and binds it read-only at
// /node_modules or /venv for the session. The command that runs is the
// package's own program under the policy's runtime: `/usr/bin/node
// /node_modules/PACKAGE/BIN ARGS...` or `/venv/bin/python3
// /venv/bin/SCRIPT ARGS...`. Nothing is installed in the session's
// sandbox, and npx and uvx themselves never run.
#pragma once

#include <asio/awaitable.hpp>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "daemon/frontend/pipeline/pipeline.h"
#include "daemon/venv/npm_requirements.h"

namespace tsb::core {

class LocalBackend;
struct SessionOpen;

// What a launcher's words ask for.
struct PackageLaunch {
  bool npm = true;                        // npx (npm packages), else uvx (Python packages)
  std::vector<std::string> requirements;  // as written, before checks
  // The program to run: npx's command after `--package` (else the
  // package's own bin, ""); uvx's command name.
  std::string program;
  std::vector<std::string> args;
};

// `command` as a launcher: nothing when its first word is not `npx` or
// `uvx`; an error (EINVAL) naming the word when it is one in a form the
// daemon does not take (a shell command, another Python, an option it does
// not know).
Result<std::optional<PackageLaunch>> parse_package_launch(const std::vector<std::string>& command);
// Whether a command's first word is a launcher's (`npx`, `uvx`): the
// sessions resolve such a command, never the policy's list.
inline bool is_package_launcher(std::string_view word) { return word == "npx" || word == "uvx"; }

// The program of npm package `name` to run in a node_modules tree at
// `tree` (a host directory), as npx picks it: `program` when it is one of
// the package's bins, else its only bin, else the bin named as the
// package (without its scope). Read beneath `tree` only, no link out of
// it followed. The path in the sandbox (/node_modules/NAME/FILE).
Result<std::string> npm_program(const std::string& tree, const std::string& name, const std::string& program);
// A venv's console script `program`, as uvx runs it: /venv/bin/PROGRAM,
// a regular file of the venv at `tree`.
Result<std::string> venv_program(const std::string& tree, const std::string& program);

// Reads `open.argv` as a launcher and, when it is one, makes the session's
// packages ready: its command rewritten to the package's program, the key
// and hold in `open`, its part of the end record. Nothing when the session
// may go on; else why not (the client's error line).
// `stop` stops a build (the daemon's stop); a client that leaves does not.
// `check`, given the keys (venv, node_modules) before anything is built:
// a refusal, or nothing.
using PackagesCheck = std::function<std::optional<Refusal>(const std::string&, const std::string&)>;
asio::awaitable<std::optional<Refusal>> prepare_session_packages(LocalBackend& local, SessionOpen& open,
                                                                 CancelSignal& stop, PackagesCheck check = {});

}  // namespace tsb::core
