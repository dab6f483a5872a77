#include "daemon/compile/spawn_policy.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <map>

#include "daemon/common/quote.h"
#include "daemon/compile/prepare.h"
#include "daemon/policy/fs_table.h"
#include "isolate/engine/plan.h"
#include "workspace_keeper.h"  // generated (daemon/compile/CMakeLists.txt)

namespace tsb::core {

bool root_owned_readonly_file(const std::string& p) {
  struct stat st{};
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == 0 && !(st.st_mode & (S_IWGRP | S_IWOTH)) &&
         (st.st_mode & S_IROTH);
}

namespace {

// The names in directory `dir` (none when it cannot be read).
std::vector<std::string> names_in(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = ::opendir(dir.c_str());
  if (!d) return out;
  while (const dirent* e = ::readdir(d)) out.emplace_back(e->d_name);
  ::closedir(d);
  return out;
}

// A file of the runner a sandbox is shown: root_owned_readonly_file, and not
// a link (its name here is its name in the sandbox).
bool runner_file(const std::string& p) {
  struct stat st{};
  return ::lstat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && root_owned_readonly_file(p);
}

// The runner's package directory beside `runner`, "" when `runner` has none.
std::string runner_package_dir(const std::string& runner) {
  const auto slash = runner.rfind('/');
  return runner.empty() || slash == std::string::npos ? "" : runner.substr(0, slash + 1) + std::string(kRunnerPackage);
}

}  // namespace

std::vector<std::string> find_runner_package(const std::string& runner) {
  std::vector<std::string> out;
  const std::string dir = runner_package_dir(runner);
  struct stat st{};  // its listing is what the sandbox is shown: root's alone, and no link
  if (dir.empty() || ::lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != 0 ||
      (st.st_mode & (S_IWGRP | S_IWOTH)))
    return out;
  for (const std::string& n : names_in(dir))
    if (n.size() > 3 && n.ends_with(".py") && runner_file(dir + "/" + n)) out.push_back(dir + "/" + n);
  std::sort(out.begin(), out.end());
  return out;
}

bool runner_package_whole(const std::string& runner) {
  char real[PATH_MAX];  // beside the file itself, as resolve_host_paths shows it
  if (runner.empty() || ::realpath(runner.c_str(), real) == nullptr) return false;
  const std::vector<std::string> found = find_runner_package(real);
  const std::string dir = runner_package_dir(real);
  const auto names = names_in(dir);
  return std::find(found.begin(), found.end(), dir + "/__init__.py") != found.end() &&
         static_cast<std::size_t>(std::count_if(names.begin(), names.end(), [](const std::string& n) {
           return n.size() > 3 && n.ends_with(".py");
         })) == found.size();
}

std::vector<std::string> find_runner_bytecode(const std::string& runner) {
  std::vector<std::string> out;
  if (runner.empty() || runner.rfind('/') == std::string::npos) return out;
  // Per directory, the stems of its modules: the runner's as the sandbox
  // names it (isolate::kRunnerSandboxPath), its package's as they are.
  std::map<std::string, std::vector<std::string>> stems;
  const std::string_view shown = isolate::kRunnerSandboxPath;
  const std::string_view runner_stem = shown.substr(shown.rfind('/') + 1, shown.size() - shown.rfind('/') - 4);
  stems[runner.substr(0, runner.rfind('/'))].emplace_back(runner_stem);
  for (const std::string& m : find_runner_package(runner)) {
    const auto slash = m.rfind('/');
    stems[m.substr(0, slash)].push_back(m.substr(slash + 1, m.size() - slash - 4));
  }
  for (const auto& [dir, of_dir] : stems) {
    const std::string cache = dir + "/__pycache__";
    for (const std::string& n : names_in(cache)) {
      const bool of_a_module = std::any_of(of_dir.begin(), of_dir.end(), [&](const std::string& s) {
        return n.size() > s.size() && n.starts_with(s) && n[s.size()] == '.';
      });
      if (of_a_module && n.ends_with(".pyc") && runner_file(cache + "/" + n)) out.push_back(cache + "/" + n);
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::string> find_runner_files(const std::string& runner) {
  std::vector<std::string> out = find_runner_package(runner);
  const std::vector<std::string> bytecode = find_runner_bytecode(runner);
  out.insert(out.end(), bytecode.begin(), bytecode.end());
  return out;
}

namespace {

// What a policy decides of a run, without the commands and tables.
spawn::SpawnPolicy spawn_policy_fields(const Policy& p) {
  spawn::SpawnPolicy s;
  s.name = p.name;
  s.fingerprint = p.fingerprint;
  s.local = p.backend == Backend::Local;
  s.limits = p.limits;
  s.workdir = p.workdir;
  s.hostname = p.hostname;
  s.network = p.network;
  s.env_set = p.env_set;
  s.env_allow = p.env_allow;
  s.seccomp = p.seccomp;
  s.uid = p.uid;
  s.gid = p.gid;
  s.warm_min = p.warm.min;
  s.warm_max = p.warm.max;
  s.warm_idle = p.warm.idle;
  return s;
}

}  // namespace

Result<spawn::SpawnPolicy> to_build_spawn_policy(const Policy& p, const std::string& builder) {
  if (!p.packages.enabled) return Error::invalid("policy '" + p.name + "' has no \"packages\"");
  const PackagesPolicy& k = p.packages;
  spawn::SpawnPolicy s = spawn_policy_fields(p);
  s.name = build_policy_name(p);
  s.network = k.index.empty() ? isolate::NetworkMode::None : isolate::NetworkMode::Egress;
  // pip's own limits: a run's CPU and processes are not a build's.
  s.limits.wall_timeout = k.build_timeout;
  s.limits.cpu_time = k.build_timeout;
  s.limits.memory_bytes = k.build_memory;
  s.limits.pids = std::max<std::uint64_t>(s.limits.pids, 256);
  s.limits.file_size_bytes = std::max(s.limits.file_size_bytes, k.venv_size);
  s.limits.tmp_bytes = std::max<std::uint64_t>(s.limits.tmp_bytes, 256ull << 20);  // pip unpacks in /tmp
  s.limits.stdout_bytes = k.venv_size + (64ull << 20);  // the archive, streamed into the cache (daemon/venv/cache.h)
  s.limits.stderr_bytes = 256u << 10;  // pip's log: its tail goes in the manifest
  s.env_allow.clear();
  s.env_set = {{"PATH", "/usr/bin:/bin"}, {"HOME", "/tmp"}, {"LANG", "C.UTF-8"}, {"PIP_CONFIG_FILE", "/dev/null"},
               {"PIP_NO_INPUT", "1"}, {"PIP_DISABLE_PIP_VERSION_CHECK", "1"}, {"PYTHONNOUSERSITE", "1"}};
  // Every connection of the build goes through the egress proxy, no
  // NO_PROXY: a build has nothing of its own on its loopback, and an index
  // the proxy refuses (a name of this host's, a private address) is then
  // refused with the proxy's reason in pip's error ("Tunnel connection
  // failed: 403 ..."), where a direct attempt only timed out.
  if (s.network == isolate::NetworkMode::Egress)
    for (const char* name : kEgressProxyVariables) {
      const bool no_proxy = std::string_view(name) == "NO_PROXY" || std::string_view(name) == "no_proxy";
      if (!no_proxy) s.env_set[name] = "http://127.0.0.1:" + std::to_string(isolate::kEgressProxyPort);
    }
  isolate::FsInputs in = fs_inputs_from(p);
  in.venv.clear();
  in.network = s.network;
  in.tmp_bytes = s.limits.tmp_bytes;
  in.workdir = "/work";
  in.binds.clear();
  // Missing: an empty index (pip says which requirement it cannot find).
  if (!k.wheels.empty()) in.binds.push_back({k.wheels, std::string(kWheelsSandboxPath), false, true});
  in.binds.push_back({builder, std::string(kBuilderSandboxPath), false, false});
  isolate::resolve_host_paths(in);
  auto fs = isolate::build_fs_table(in);
  if (!fs.ok()) return std::move(fs).error().wrap("policy '" + s.name + "'");
  // The venv being built: a writable tmpfs of the tool's, next to /tmp
  // (like every tmpfs, nothing on it can be executed; its python3 is a link
  // to the system's). It counts toward the build's memory.
  auto table = std::make_shared<isolate::FsTable>(*fs.value());
  auto at = std::find_if(table->begin(), table->end(), [](const isolate::FsEntry& e) { return e.kind == isolate::FsEntry::kTmpfs; });
  isolate::FsEntry v;
  v.kind = isolate::FsEntry::kTmpfs;
  v.path = std::string(isolate::kVenvPath);
  v.stage = isolate::Stage::MountTmpfs;
  v.size = k.venv_size;
  v.inodes = 262144;
  v.mode = 0755;
  v.tool_owned = true;
  v.reason = "the venv being built, owned by the tool's user; counts toward memory";
  table->insert(at, std::move(v));
  auto& tool = s.modes[static_cast<int>(spawn::RunMode::Tool)];
  tool.argv = {"/usr/bin/python3", "-I", "-B", "-u", std::string(kBuilderSandboxPath)};
  tool.fs = std::move(table);
  s.modes[static_cast<int>(spawn::RunMode::Script)] = tool;  // the same builder either way
  return s;
}

// TypeScript tools' node_modules: an optional keyed row, bound only for a
// run that names a key (its source until then is a name the cache never
// holds: is_key refuses it).
static void add_node_modules_row(spawn::SpawnPolicy::Mode& m, const std::string& venv_cache) {
  auto t = std::make_shared<isolate::FsTable>(*m.fs);
  isolate::FsEntry e;
  e.kind = isolate::FsEntry::kHost;
  e.path = std::string(isolate::kNodeModulesPath);
  e.source = venv_cache + "/.none";
  e.data = venv_cache;
  e.keyed = true;
  e.optional = true;
  e.stage = isolate::Stage::MountBind;
  e.reason = "a TypeScript tool's (or a session's npx) own node_modules, built from its npm requirements (" + venv_cache +
             "/<key>), read-only";
  t->push_back(std::move(e));
  m.fs = std::move(t);
}

// Per-tool venvs and node_modules: the /venv row keyed to the cache (a
// run or session that names a key gets that venv there), and the keyed
// /node_modules row.
static void add_package_rows(const Policy& p, std::initializer_list<spawn::SpawnPolicy::Mode*> modes,
                             const std::string& venv_cache) {
  if (venv_cache.empty()) return;
  for (auto* m : modes) {
    if (p.packages.enabled) {
      auto t = std::make_shared<isolate::FsTable>(*m->fs);
      for (auto& e : *t)
        if (e.kind == isolate::FsEntry::kHost && e.path == isolate::kVenvPath) {
          e.keyed = true;
          e.data = venv_cache;
          e.reason += "; a tool (or a session's uvx) with requirements gets its own, built from them (" + venv_cache + "/<key>)";
        }
      m->fs = std::move(t);
    }
    if (p.npm_packages.enabled) add_node_modules_row(*m, venv_cache);
  }
}

Result<spawn::SpawnPolicy> to_typescript_spawn_policy(const Policy& p, const std::string& ts_runner,
                                                      const std::string& venv_cache) {
  if (!p.typescript.enabled) return Error::invalid("policy '" + p.name + "' has no \"typescript\"");
  const TypeScriptPolicy& t = p.typescript;
  spawn::SpawnPolicy s = spawn_policy_fields(p);
  s.name = typescript_policy_name(p);
  s.warm_min = s.warm_max = 0;
  isolate::FsInputs in = fs_inputs_from(p);
  in.binds.push_back({ts_runner, std::string(kTsRunnerSandboxPath), false, false});
  isolate::resolve_host_paths(in);
  auto fs = isolate::build_fs_table(in);
  if (!fs.ok()) return std::move(fs).error().wrap("policy '" + s.name + "'");
  auto& tool = s.modes[static_cast<int>(spawn::RunMode::Tool)];
  tool.argv = {t.node, std::string(kTsRunnerSandboxPath), t.strip_types, t.stripper()};
  tool.fs = std::move(fs).value();
  if (p.npm_packages.enabled && !venv_cache.empty()) add_node_modules_row(tool, venv_cache);
  s.modes[static_cast<int>(spawn::RunMode::Script)] = tool;  // execute runs the same runner
  return s;
}

Result<spawn::SpawnPolicy> to_session_spawn_policy(const Policy& p, const std::string& venv_cache, bool workspace) {
  if (!p.sessions.enabled) return Error::invalid("policy '" + p.name + "' has no \"sessions\"");
  const SessionsPolicy& k = p.sessions;
  if (workspace && !k.workspace) return Error::invalid("policy '" + p.name + "' keeps no workspaces");
  spawn::SpawnPolicy s = spawn_policy_fields(p);
  s.name = workspace ? workspace_policy_name(p.name) : session_policy_name(p.name);
  s.warm_min = s.warm_max = 0;
  s.limits.wall_timeout = k.max_lifetime;
  s.limits.cpu_time = k.cpu_time;
  s.limits.memory_bytes = k.memory;
  s.limits.pids = k.pids;
  isolate::FsInputs in = fs_inputs_from(p);
  if (workspace) in.work_bytes = k.workspace_size;
  isolate::resolve_host_paths(in);
  auto fs = isolate::build_fs_table(in);
  if (!fs.ok()) return std::move(fs).error().wrap("policy '" + s.name + "'");
  // Tool mode: the keeper (isolate/runner/toolsandbox_workspace.py), its
  // stdin the front end's socket, the allowed programs its arguments: it
  // starts each session's command on pipes the front end sends, and ends
  // all of it. A session's own sandbox has one session; a workspace's, one
  // at a time, and its /work is the workspace's size. No script mode.
  auto& keeper = s.modes[static_cast<int>(spawn::RunMode::Tool)];
  keeper.fs = std::move(fs).value();
  keeper.argv = {"/usr/bin/python3", "-I", "-S", "-B", "-c", std::string(embedded::kWorkspaceKeeper)};
  keeper.argv.insert(keeper.argv.end(), k.commands.begin(), k.commands.end());
  // A command's own packages (npx, uvx).
  add_package_rows(p, {&keeper}, venv_cache);
  // (Every mode has a program: script mode is the same keeper, which the
  // front end never asks for, and which ends at once on a stdin that is
  // not a socket.)
  s.modes[static_cast<int>(spawn::RunMode::Script)] = keeper;
  return s;
}

std::string find_ts_runner(const std::string& runner) {
  if (runner.empty()) return "";
  const std::string r = runner.substr(0, runner.rfind('/') + 1) + "toolsandbox_ts_runner.js";
  return root_owned_readonly_file(r) ? r : "";
}

Result<spawn::SpawnPolicy> to_npm_build_spawn_policy(const Policy& p, const std::string& builder) {
  if (!p.npm_packages.enabled) return Error::invalid("policy '" + p.name + "' has no \"typescript.packages\"");
  const NpmPackagesPolicy& k = p.npm_packages;
  spawn::SpawnPolicy s = spawn_policy_fields(p);
  s.name = npm_build_policy_name(p.name);
  s.network = k.registry.empty() ? isolate::NetworkMode::None : isolate::NetworkMode::Egress;
  // npm's own limits: a run's CPU and processes are not a build's.
  s.limits.wall_timeout = k.build_timeout;
  s.limits.cpu_time = k.build_timeout;
  s.limits.memory_bytes = k.build_memory;
  s.limits.pids = std::max<std::uint64_t>(s.limits.pids, 256);
  s.limits.open_files = std::max<std::uint64_t>(s.limits.open_files, 4096);  // npm keeps many tarballs open
  s.limits.file_size_bytes = std::max(s.limits.file_size_bytes, k.size);
  s.limits.tmp_bytes = std::max<std::uint64_t>(s.limits.tmp_bytes, 256ull << 20);  // npm's cache, in /tmp
  s.limits.stdout_bytes = k.size + (64ull << 20);  // the archive, streamed into the cache
  s.limits.stderr_bytes = 256u << 10;              // npm's log: its tail goes in the manifest
  s.env_allow.clear();
  s.env_set = {{"PATH", "/usr/bin:/bin"}, {"HOME", "/tmp"}, {"LANG", "C.UTF-8"}, {"PYTHONNOUSERSITE", "1"}};
  // As a venv build's: every connection through the egress proxy.
  if (s.network == isolate::NetworkMode::Egress)
    for (const char* name : kEgressProxyVariables) {
      const bool no_proxy = std::string_view(name) == "NO_PROXY" || std::string_view(name) == "no_proxy";
      if (!no_proxy) s.env_set[name] = "http://127.0.0.1:" + std::to_string(isolate::kEgressProxyPort);
    }
  isolate::FsInputs in = fs_inputs_from(p);
  in.venv.clear();
  in.network = s.network;
  in.tmp_bytes = s.limits.tmp_bytes;
  in.workdir = "/work";
  in.binds.clear();
  // Missing: an empty registry (npm says which requirement it cannot find).
  if (!k.tarballs.empty()) in.binds.push_back({k.tarballs, std::string(kTarballsSandboxPath), false, true});
  in.binds.push_back({builder, std::string(kBuilderSandboxPath), false, false});
  isolate::resolve_host_paths(in);
  auto fs = isolate::build_fs_table(in);
  if (!fs.ok()) return std::move(fs).error().wrap("policy '" + s.name + "'");
  auto table = std::make_shared<isolate::FsTable>(*fs.value());
  auto at = std::find_if(table->begin(), table->end(), [](const isolate::FsEntry& e) { return e.kind == isolate::FsEntry::kTmpfs; });
  isolate::FsEntry b;
  b.kind = isolate::FsEntry::kTmpfs;
  b.path = std::string(kNpmBuildPath);
  b.stage = isolate::Stage::MountTmpfs;
  b.size = k.size;
  b.inodes = 1048576;  // node_modules trees hold many small files
  b.mode = 0755;
  b.tool_owned = true;
  b.reason = "the node_modules being built, owned by the tool's user; counts toward memory";
  table->insert(at, std::move(b));
  auto& tool = s.modes[static_cast<int>(spawn::RunMode::Tool)];
  tool.argv = {"/usr/bin/python3", "-I", "-B", "-u", std::string(kBuilderSandboxPath)};
  tool.fs = std::move(table);
  s.modes[static_cast<int>(spawn::RunMode::Script)] = tool;
  return s;
}

Result<spawn::SpawnPolicy> to_spawn_policy(const Policy& p, const std::string& runner, const std::string& venv_cache) {
  spawn::SpawnPolicy s = spawn_policy_fields(p);
  auto& script = s.modes[static_cast<int>(spawn::RunMode::Script)];
  script.argv = {p.interpreter, "-c", script_launcher(false)};
  script.end_note = true;  // the launcher takes it
  isolate::FsInputs in = fs_inputs_from(p, runner);
  isolate::resolve_host_paths(in);
  const std::string resolved_runner = in.runner;
  in.runner.clear();
  auto fs = isolate::build_fs_table(in);
  if (!fs.ok()) return std::move(fs).error().wrap("policy '" + p.name + "'");
  script.fs = std::move(fs).value();
  auto& tool = s.modes[static_cast<int>(spawn::RunMode::Tool)];
  if (!runner.empty()) {
    const std::vector<std::string> flags = {p.interpreter, "-I", "-S", "-B", "-u", "-X", "utf8", "-c"};
    tool.argv = flags;
    tool.argv.emplace_back(kRunnerBoot);
    in.runner = resolved_runner;
    in.runner_files = find_runner_files(resolved_runner);
    auto tfs = isolate::build_fs_table(in);
    if (!tfs.ok()) return std::move(tfs).error().wrap("policy '" + p.name + "'");
    tool.fs = std::move(tfs).value();
    if (p.warm.max > 0) {
      // Warm sandboxes take their hand-over through the runner, in both
      // modes: a script run of this policy sees it too, cold or warm, so
      // the two look alike.
      // The modules to preload follow the program (sys.argv[1:], which the
      // runner empties before the hand-over, as a cold start's is).
      tool.pooled_argv = flags;
      tool.pooled_argv.emplace_back(kRunnerPooledBoot);
      script.pooled_argv = {p.interpreter, "-c", script_launcher(true)};
      tool.pooled_argv.insert(tool.pooled_argv.end(), p.warm.tool_preload.begin(), p.warm.tool_preload.end());
      script.pooled_argv.insert(script.pooled_argv.end(), p.warm.preload.begin(), p.warm.preload.end());
    }
    // Scripts see the runner too, cold or warm: a cold one's launcher
    // takes its end from there, a warm one its hand-over.
    script.fs = tool.fs;
  } else {
    tool.fs = script.fs;
  }
  add_package_rows(p, {&script, &tool}, venv_cache);
  return s;
}

std::string script_launcher(bool pooled) {
  // Cold: the script is stdin; the end of a script that runs to its end
  // (_script_end, isolate/runner/_toolsandbox_runner/lean_exit.py: a
  // program's end without the interpreter's teardown, at the end note, fd
  // 3, which _script_start takes just before the script) comes from the
  // runner's directory alone (the whole of sys.path for that import, so
  // nothing of the working directory stands in), or, where no runner is
  // installed, is the interpreter's own (and fd 3 is closed, unused).
  // Pooled: the runner (at the sandbox path of isolate::kRunnerSandboxPath's
  // directory, first on sys.path for the import only, then forgotten, as
  // await_script forgets its package's modules) waits for the hand-over
  // and returns it.
  static constexpr std::string_view kRead =
      "    source = sys.stdin.buffer.read()\n"
      "    saved, sys.path = sys.path, ['/opt/toolsandbox/runner']\n"
      "    try:\n"
      "        from _toolsandbox_runner.lean_exit import _script_start as watch\n"
      "    except Exception:\n"
      "        watch = None\n"
      "    finally:\n"
      "        sys.path = saved\n"
      "    for name in [n for n in sys.modules if n.partition('.')[0] == '_toolsandbox_runner']:\n"
      "        del sys.modules[name]\n"
      "    if watch is None:\n"
      "        try:\n"
      "            os.close(3)\n"
      "        except OSError:\n"
      "            pass\n"
      "        watch = lambda: lambda: None\n";
  static constexpr std::string_view kAwait =
      "    sys.path.insert(0, '/opt/toolsandbox/runner')\n"
      "    import toolsandbox_runner\n"
      "    del sys.path[0], sys.modules['toolsandbox_runner']\n"
      "    source, watch = toolsandbox_runner.await_script()\n"
      "    del toolsandbox_runner\n";
  // The script runs as __main__ from a file of the working directory, as
  // Letta's does; one that ran to its end ends as a program does (end()).
  static constexpr std::string_view kRun = R"PY(    path = os.path.join(os.getcwd(), "tmp%s.py" % os.urandom(4).hex())
    try:
        with open(path, "xb") as f:
            f.write(source)
    except OSError:
        pass
    sys.argv[0] = path
    sys.path[0] = os.path.dirname(path)
    main = sys.modules["__main__"]
    del main._toolsandbox_main
    main.__file__ = path
    end = watch()
    exec(compile(source, path, "exec"), main.__dict__)
    end()
)PY";
  return "def _toolsandbox_main():\n    import os, sys\n" + std::string(pooled ? kAwait : kRead) + std::string(kRun) +
         "_toolsandbox_main()\n";
}

isolate::RunSpec run_spec_from(const Policy& p) {
  // No mode's command (the caller's, not a launcher): no end note either.
  return spawn::run_spec_from(spawn_policy_fields(p), spawn::RunMode::Script);
}

std::string find_runner(const std::string& configured) {
  std::vector<std::string> candidates;
  if (!configured.empty()) candidates.push_back(configured);
  candidates.push_back(std::string(TSB_DATADIR) + "/runner/toolsandbox_runner.py");
  char exe[4096];
  ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n > 0) {
    exe[n] = '\0';
    std::string dir(exe);
    dir = dir.substr(0, dir.rfind('/'));
    candidates.push_back(dir + "/../share/toolsandbox/runner/toolsandbox_runner.py");
  }
  candidates.push_back(std::string(TSB_SOURCE_DIR) + "/isolate/runner/toolsandbox_runner.py");
  // The runner and its package beside it (runner_package_whole).
  for (const auto& c : candidates)
    if (root_owned_readonly_file(c) && runner_package_whole(c)) return c;
  return "";
}

std::string find_venv_builder(const std::string& runner) {
  if (runner.empty()) return "";
  const std::string b = runner.substr(0, runner.rfind('/') + 1) + "toolsandbox_venv_builder.py";
  return root_owned_readonly_file(b) ? b : "";
}

Result<std::vector<std::string>> build_environment(const Policy& p, const std::map<std::string, std::string>& req) {
  std::string name;
  switch (spawn::check_environment(p.env_set, p.env_allow, req, &name)) {
    case spawn::EnvProblem::kOk: return spawn::environment_of(p.env_set, req);
    case spawn::EnvProblem::kBadName:
      return Error::invalid("environment: not a valid variable name: " + quoted_for_message(name));
    case spawn::EnvProblem::kFixed:
      return Error::invalid("environment: " + quoted_for_message(name) + " is fixed by policy '" + p.name + "'", EPERM);
    case spawn::EnvProblem::kNotAllowed:
      return Error::invalid("environment: policy '" + p.name + "' does not allow setting " + quoted_for_message(name),
                            EPERM);
    case spawn::EnvProblem::kNul: return Error::invalid("environment: a value contains a NUL byte");
  }
  return Error::invalid("environment: refused");
}

}  // namespace tsb::core
