// What the root spawner knows: the compiled policy set, and the typed
// messages it exchanges with the front end. Plain data and their closed
// encodings (daemon/wire/wire.h); no policy text is ever parsed here.
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

#include "daemon/wire/wire.h"
#include "isolate/base/result.h"
#include "isolate/engine/engine.h"
#include "isolate/engine/fs.h"
#include "isolate/engine/seccomp.h"
#include "isolate/engine/spec.h"

namespace tsb::spawn {

// A policy as far as a local run needs it: everything the engine is given,
// and the bounds of what a run request may choose.
struct SpawnPolicy {
  std::string name;
  std::string fingerprint;  // the policy's "sha256:..." (the front end names the one it placed)
  bool local = true;        // false: the policy runs on E2B, never here
  isolate::Limits limits;   // wall_timeout is the most a request may ask for
  std::string workdir;
  std::string hostname;
  isolate::NetworkMode network = isolate::NetworkMode::None;
  std::map<std::string, std::string> env_set;  // fixed values
  std::vector<std::string> env_allow;          // names (or PREFIX_*) a request may set
  std::shared_ptr<const isolate::SeccompProgram> seccomp;
  std::uint32_t uid = 1000, gid = 1000;
  // Per RunMode (Script, Tool): the command and the file-system table
  // (daemon/policy/fs_table.h), both made by the compile helper. A mode without a
  // command does not run here (tool mode when no runner is installed).
  struct Mode {
    std::vector<std::string> argv;
    std::vector<std::string> pooled_argv;  // the command of a warm sandbox of this mode; none: no pool
    std::shared_ptr<const isolate::FsTable> fs;
    bool end_note = false;  // argv takes the end note (RunSpec::end_note): script_launcher
  };
  Mode modes[2];
  // Warm sandboxes (core::WarmPool): per mode, at most warm_max.
  std::uint32_t warm_min = 0, warm_max = 0;
  std::chrono::milliseconds warm_idle{300'000};
};

// The RunSpec of a run of `p` in `mode`: everything the policy decides
// (env and stdin left to the run). The one place a policy becomes an
// engine's spec. `pooled`: a warm sandbox's (its pooled command; stdin the
// hand-over's socket in both modes; the policy's own venv). Warm sandboxes
// and a mode whose command takes it (Mode::end_note) get the end note.
// `node_modules`: a key for the keyed row at isolate::kNodeModulesPath.
isolate::RunSpec run_spec_from(const SpawnPolicy& p, RunMode mode, const std::string& venv = "", bool pooled = false,
                               const std::string& node_modules = "");

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
  std::uint32_t max_concurrent_runs = 8;
  std::chrono::milliseconds shutdown_grace{30000};
  std::vector<SpawnPolicy> policies;
};

Result<CompiledSet> decode_compiled_set(std::string_view bytes);

// What is wrong with a request's environment under a policy: a name that
// is not a valid name, that the policy fixes or does not allow, or a value
// with a NUL (kOk: nothing); `*name` is the variable it is about. Shared by
// the front end's check (a refusal that names the variable, early) and the
// spawner's (the one that counts; it echoes nothing the front end sent).
enum class EnvProblem : std::uint8_t { kOk, kBadName, kFixed, kNotAllowed, kNul };
EnvProblem check_environment(const std::map<std::string, std::string>& env_set,
                             const std::vector<std::string>& env_allow,
                             const std::map<std::string, std::string>& request, std::string* name);
// The environment of a run: the policy's fixed values, then the request's
// (which check_environment accepted).
std::vector<std::string> environment_of(const std::map<std::string, std::string>& env_set,
                                        const std::map<std::string, std::string>& request);
bool env_name_allowed(const std::vector<std::string>& env_allow, std::string_view name);
bool valid_env_name(std::string_view name);

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
  std::string venv;  // a per-tool venv's key (64 hex digits), or "" for the policy's venv
  std::string node_modules;  // a TypeScript tool's node_modules key (in the same cache), or "": none
  // A warm sandbox of the policy's pool may take it (a run whose
  // environment changes nothing of how a program starts: the pooled one
  // started without it).
  bool warm = false;
};

struct Started {
  std::uint64_t id = 0;
  std::string run_id;
  std::uint32_t host_uid = 0;
  // A warm sandbox: its stdin is the hand-over's socket, where the runner
  // says it is ready and takes the request's environment first
  // (daemon/frontend/letta/letta.h, "Warm sandboxes").
  bool warm = false;
  // Descriptors, in this order: stdin (write end), stdout, stderr (read ends).
};

struct Refused {
  std::uint64_t id = 0;
  RefuseCode code = RefuseCode::Malformed;
  std::string message;
};

// The end of a run: what the spawner measured and observed (the front end
// classifies it, isolate/supervise/outcome.h, and read the output itself from the
// pipes). Also the answer to an order the engine could not start
// (observations.engine_error). A warm run's cpu is from its hand-over;
// warm_start_cpu, what its sandbox used before (the interpreter's start,
// the preloads), 0 for a cold run.
struct Ended {
  std::uint64_t id = 0;
  std::string run_id;
  std::uint32_t host_uid = 0;
  std::chrono::nanoseconds wall{0}, cpu{0}, warm_start_cpu{0};
  std::uint64_t peak_memory_bytes = 0;
  isolate::Observations observations;
};

// The front end wants a run stopped (its client went away, shutdown).
struct Kill {
  std::uint64_t id = 0;
};

// The answer to Pools: each warm pool (policy, mode) as it is now.
struct PoolState {
  struct Pool {
    std::string policy;
    RunMode mode = RunMode::Tool;
    std::uint32_t ready = 0, starting = 0, target = 0;
    std::uint64_t hits = 0, misses = 0, lost = 0;  // lost: ended before a hand-over
  };
  std::vector<Pool> pools;
};

// The spawner's half; the front end's is daemon/frontend/local/front_codec.h.
std::string encode(const Hello& m);
std::string encode(const Started& m);
std::string encode(const Refused& m);
std::string encode(const Ended& m);
std::string encode(const PoolState& m);
// `applied`: the spawner's new set is in force (else it kept the old one).
std::string encode_reload(bool applied);

// The type of a received message (0 when empty).
inline Msg message_type(std::string_view b) { return b.empty() ? Msg{0} : static_cast<Msg>(b[0]); }
// Each decoder checks the type byte and that the message is read exactly.
Result<RunOrder> decode_run(std::string_view b);
Result<Kill> decode_kill(std::string_view b);
Result<std::string> decode_notify(std::string_view b);

}  // namespace tsb::spawn
