// What the compile helper makes of a policy for the root spawner: the
// compiled policy (daemon/wire/compiled.h) with, per mode, its command and
// file-system table; the build policy of per-tool venvs; the RunSpec that
// `toolsandbox run` gives the engine. The policy language
// (daemon/policy/) knows nothing of these formats.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "daemon/policy/policy.h"
#include "daemon/wire/compiled.h"
#include "isolate/base/result.h"
#include "isolate/engine/spec.h"

namespace tsb::core {

// Script mode's `python3 -c` program: reads the script from stdin, writes it
// to a tmpXXXXXXXX.py file in the working directory (as Letta's temporary
// script), and runs it as __main__ with that __file__, sys.argv[0] and
// sys.path[0] (the script's directory, as for `python3 FILE`). Its
// own names stay in a function, so the script's namespace is a fresh main
// module's. A script that ran to its end (no exception, no sys.exit) ends
// without the interpreter's teardown (_script_end,
// isolate/runner/_toolsandbox_runner/lean_exit.py, from the runner,
// read-only at /opt/toolsandbox/runner; where no runner is installed, with
// the interpreter's own). `pooled`: the same, started before its request
// in a warm sandbox: it takes the hand-over from the runner (the request's
// environment, then the script on the channel that is its stdin;
// toolsandbox_runner.await_script) and then does what the cold one does.
std::string script_launcher(bool pooled);

// Tool mode's program (-c, after -I -S -B -u -X utf8): the runner imported
// from its directory, put after the standard library on sys.path, so that
// its bytecode and its package's come from their __pycache__
// (isolate/runner/toolsandbox_runner.py, "Invocation"), and run:
// run_channel() when started for a request,
// run_pooled() in a warm sandbox (which has the policy's own venv, the
// operator's, and sets up its site-packages before the hand-over).
inline constexpr std::string_view kRunnerBoot =
    "import sys\nsys.path.append('/opt/toolsandbox/runner')\nimport toolsandbox_runner\ntoolsandbox_runner.run_channel()\n";
inline constexpr std::string_view kRunnerPooledBoot =
    "import sys\nsys.path.append('/opt/toolsandbox/runner')\nimport toolsandbox_runner\ntoolsandbox_runner.run_pooled()\n";

// Whether `p` (links followed) is a regular file owned by root, readable by
// all and writable by no one else: what the runner, its package's modules,
// their bytecode and the venv builder must be.
bool root_owned_readonly_file(const std::string& p);

// The runner's package: the directory beside the runner
// (isolate/runner/_toolsandbox_runner) whose modules the runner imports.
inline constexpr std::string_view kRunnerPackage = "_toolsandbox_runner";

// The modules of the runner's package beside `runner` (a host path): the
// files kRunnerPackage/*.py that are root_owned_readonly_file and not
// links, sorted; none when kRunnerPackage is not a directory owned by root
// and writable by no one else, or is a link.
std::vector<std::string> find_runner_package(const std::string& runner);

// Whether the runner's package beside `runner` is whole: find_runner_package
// finds its __init__.py and leaves out no .py file the directory holds. A
// runner without it is not installed (find_runner).
bool runner_package_whole(const std::string& runner);

// The bytecode of the runner's modules (`runner` and
// find_runner_package(runner)): for each, the files
// __pycache__/<its stem>.*.pyc beside it that are root_owned_readonly_file
// and not links (`runner`'s own links are resolved: resolve_host_paths).
std::vector<std::string> find_runner_bytecode(const std::string& runner);

// Everything of the runner a tool run is shown besides `runner` itself
// (isolate::FsInputs::runner_files): its package's modules, then the
// bytecode of every module.
std::vector<std::string> find_runner_files(const std::string& runner);


// What the root spawner keeps of a policy (daemon/wire/compiled.h): per
// mode the command (script mode: script_launcher; tool mode: kRunnerBoot, the
// runner at isolate::kRunnerSandboxPath with its package and bytecode
// (find_runner_files), none when `runner` is "") and the table (both modes
// show the runner).
// A policy with "packages" gets a keyed /venv row: a run naming a venv key
// has `venv_cache`/<key> there (daemon/venv/cache.h). A policy with
// "typescript.packages" gets a keyed, optional /node_modules row
// (isolate::kNodeModulesPath): a run naming a node_modules key has
// `venv_cache`/<key> there, read-only; any other run has none.
Result<spawn::SpawnPolicy> to_spawn_policy(const Policy& p, const std::string& runner, const std::string& venv_cache = "");

// The build policy of a policy with "packages", named build_policy_name(p):
// tool mode runs `builder` (isolate/runner/toolsandbox_venv_builder.py)
// under /usr/bin/python3 -I, with a writable tmpfs at /venv of
// packages.venv_size, the wheel directory read-only at /wheels, the
// policy's seccomp filter, its user, and the packages' build limits; no
// network with a wheel directory, else egress to the index's hosts only
// (build_egress_rules). Script mode runs the same.
Result<spawn::SpawnPolicy> to_build_spawn_policy(const Policy& p, const std::string& builder);
// The npm build policy of a policy with "typescript.packages", named
// npm_build_policy_name(p.name): the same builder (its npm kind) under
// /usr/bin/python3 -I, a writable tmpfs at /build (the tree being made) of
// typescript.packages.build.size, the tarball directory read-only at
// /tarballs, the policy's seccomp filter, its user, and the npm build
// limits; no network but the sandbox's own loopback (where the builder
// serves the tarballs as a registry), or egress to the registry's host
// only (npm_build_egress_rules).
Result<spawn::SpawnPolicy> to_npm_build_spawn_policy(const Policy& p, const std::string& builder);
inline constexpr std::string_view kBuilderSandboxPath = "/opt/toolsandbox/builder/toolsandbox_venv_builder.py";
// The TypeScript policy of a policy with "typescript", named
// typescript_policy_name(p): both modes run `ts_runner`
// (isolate/runner/toolsandbox_ts_runner.js, read-only at
// kTsRunnerSandboxPath) under the policy's node, with the stripper it names;
// everything else is the policy's (its file system, seccomp filter, user,
// limits, network). No warm pool: a TypeScript run is cold.
// With "typescript.packages" and a venv cache, both modes have the keyed
// /node_modules row (a run's own node_modules).
Result<spawn::SpawnPolicy> to_typescript_spawn_policy(const Policy& p, const std::string& ts_runner,
                                                      const std::string& venv_cache = "");
// The session policy of a policy with "sessions" (daemon/policy/sessions.h):
// the policy's table, network, environment rules, seccomp and user, the
// section's limits (wall_timeout its max_lifetime), no warm pool, and one
// mode, tool mode: the keeper (isolate/runner/toolsandbox_workspace.py),
// which starts a session's command from the front end's message only when
// it is one of the section's commands. `workspace`: a workspace's
// (workspace_policy_name), its /work the section's workspace size. With
// "packages" or "typescript.packages" and a venv cache, the keyed /venv and
// /node_modules rows (a command's own, from npx or uvx).
Result<spawn::SpawnPolicy> to_session_spawn_policy(const Policy& p, const std::string& venv_cache = "",
                                                   bool workspace = false);
inline constexpr std::string_view kTsRunnerSandboxPath = "/opt/toolsandbox/runner/toolsandbox_ts_runner.js";
// The TypeScript runner installed beside `runner` (root_owned_readonly_file), or "".
std::string find_ts_runner(const std::string& runner);
// A RunSpec carrying everything the policy decides, for a command the
// caller gives (argv, env, stdin and the file-system table left to the
// caller: build_fs_table(fs_inputs_from(p)), plus what it adds), and no
// end note.
isolate::RunSpec run_spec_from(const Policy& p);

// Where the trusted tool runner lives on the host ("" when not found): the
// first candidate that is root_owned_readonly_file with its package whole
// beside it (runner_package_whole).
std::string find_runner(const std::string& configured);
// The venv builder installed beside `runner` (same checks), or "".
std::string find_venv_builder(const std::string& runner);

// The environment of a run: the policy's fixed values, then the request's
// values for allowed names. A request naming a key the policy does not allow
// is refused (never silently dropped), and fixed values cannot be overridden.
Result<std::vector<std::string>> build_environment(const Policy& p, const std::map<std::string, std::string>& request_env);

}  // namespace tsb::core
