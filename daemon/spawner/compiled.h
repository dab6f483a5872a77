// What the root spawner knows: the compiled policy set, and the typed
// messages it exchanges with the front end. Plain data and their closed
// encodings (daemon/spawner/wire.h); no policy text is ever parsed here.
//
// The set is written by the compile helper (`toolsandboxd-frontend
// --compile`, run by the spawner as uid 0 with no capabilities, so that the
// front end's user cannot trace it) from the daemon configuration and the
// policy files, and read back by the spawner with decode_compiled_set.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "daemon/spawner/wire.h"
#include "isolate/base/result.h"
#include "isolate/engine.h"
#include "isolate/seccomp.h"
#include "isolate/spec.h"

namespace tsb::spawn {

// A policy as far as a local run needs it: everything the engine is given,
// and the bounds of what a run request may choose.
struct SpawnPolicy {
  std::string name;
  std::string fingerprint;  // the policy's "sha256:..." (the front end names the one it placed)
  bool local = true;        // false: the policy runs on E2B, never here
  isolate::Limits limits;   // wall_timeout is the most a request may ask for
  std::string venv;
  std::string workdir;
  std::vector<isolate::BindMount> binds;
  isolate::NetworkMode network = isolate::NetworkMode::None;
  std::map<std::string, std::string> env_set;  // fixed values
  std::vector<std::string> env_allow;          // names (or PREFIX_*) a request may set
  std::shared_ptr<const isolate::SeccompProgram> seccomp;
  std::uint32_t uid = 1000, gid = 1000;
  std::string interpreter;
  std::string hostname;
};

// A RunSpec carrying everything the policy decides (argv, env, stdin and
// label left empty): the one place a policy becomes an engine's spec.
isolate::RunSpec run_spec_from(const SpawnPolicy& p);

struct CompiledSet {
  isolate::EngineConfig engine;
  std::shared_ptr<const isolate::SeccompProgram> init_filter;
  // The listening socket, when systemd does not pass one.
  std::string socket_path;
  std::uint32_t socket_mode = 0660;
  std::uint32_t socket_gid = 0;
  // The front end's user.
  std::string front_end_user;
  std::uint32_t front_end_uid = 0, front_end_gid = 0;
  std::string e2b_key_file;  // "" = none; opened by the spawner, read by the front end
  std::string runner_path;   // the trusted tool runner on the host ("" = not installed)
  std::uint32_t max_concurrent_runs = 8;
  std::chrono::milliseconds shutdown_grace{30000};
  std::vector<SpawnPolicy> policies;
};

std::string encode_compiled_set(const CompiledSet& s);
Result<CompiledSet> decode_compiled_set(std::string_view bytes);

// The environment of a run under `p`: the fixed values, then the request's
// for names the policy allows. A name that is fixed, not allowed or not a
// valid name, or a value with a NUL, refuses the run. Shared by the front
// end's check (a clear refusal early) and the spawner's (the one that
// counts).
Result<std::vector<std::string>> build_environment(const std::string& policy_name,
                                                   const std::map<std::string, std::string>& env_set,
                                                   const std::vector<std::string>& env_allow,
                                                   const std::map<std::string, std::string>& request);
bool env_name_allowed(const std::vector<std::string>& env_allow, std::string_view name);
bool valid_env_name(std::string_view name);

// Where the trusted tool runner appears inside a sandbox (bound read-only).
inline constexpr const char* kRunnerSandboxPath = "/opt/toolsandbox/runner/toolsandbox_runner.py";

// Script mode's `python3 -c` program: reads the script from stdin, writes it
// to a tmpXXXXXXXX.py file in the working directory (as Letta's temporary
// script), and runs it as __main__ with that __file__, sys.argv[0] and
// sys.path[0] (the script's directory, as for `python3 FILE`). Its
// own names stay in a function, so the script's namespace is a fresh main
// module's.
inline constexpr std::string_view kScriptMain = R"PY(def _toolsandbox_main():
    import os, sys
    source = sys.stdin.buffer.read()
    path = os.path.join(os.getcwd(), "tmp%s.py" % os.urandom(4).hex())
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
    exec(compile(source, path, "exec"), main.__dict__)
_toolsandbox_main()
)PY";

// ---- messages ------------------------------------------------------------

// Spawner -> front end, first message on a new front end's socket.
struct Hello {
  std::string instance;        // the engine's tag
  std::string cgroup_mode;     // "v1", "v2"
  std::string cgroup_summary;  // Cgroups::describe()
  isolate::EngineFeatures features;
  std::vector<std::string> notes;  // what the engine found at start-up
};

struct RunOrder {
  std::uint64_t id = 0;  // the front end's, echoed in every answer
  std::string policy;
  std::string fingerprint;
  RunMode mode = RunMode::Script;
  std::map<std::string, std::string> env;  // the request's part only
  std::chrono::milliseconds timeout{0};
  std::string label;  // the tool name, for logs and the leaf name
};

struct Started {
  std::uint64_t id = 0;
  std::string run_id;
  std::uint32_t host_uid = 0;
  // Descriptors, in this order: stdin (write end), stdout, stderr (read ends).
};

struct Refused {
  std::uint64_t id = 0;
  RefuseCode code = RefuseCode::Malformed;
  std::string message;
};

// The end of a run: the engine's RunResult without the output, which the
// front end read itself from the pipes.
struct Ended {
  std::uint64_t id = 0;
  isolate::RunResult result;
};

struct Kill {
  std::uint64_t id = 0;
  KillWhy why = KillWhy::Cancel;
};

std::string encode(const Hello& m);
std::string encode(const RunOrder& m);
std::string encode(const Started& m);
std::string encode(const Refused& m);
std::string encode(const Ended& m);
std::string encode(const Kill& m);
// `applied`: the spawner's new set is in force (else it kept the old one).
std::string encode_reload(bool applied);
Result<bool> decode_reload(std::string_view b);
std::string encode_notify(std::string_view text);

// The type of a received message (0 when empty).
inline Msg message_type(std::string_view b) { return b.empty() ? Msg{0} : static_cast<Msg>(b[0]); }
// Each decoder checks the type byte and that the message is read exactly.
Result<Hello> decode_hello(std::string_view b);
Result<RunOrder> decode_run(std::string_view b);
Result<Started> decode_started(std::string_view b);
Result<Refused> decode_refused(std::string_view b);
Result<Ended> decode_ended(std::string_view b);
Result<Kill> decode_kill(std::string_view b);
Result<std::string> decode_notify(std::string_view b);

}  // namespace tsb::spawn
