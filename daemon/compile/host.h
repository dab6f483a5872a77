// Making an engine: what the engine needs prepared on the host, read and
// done here, outside the root process, with the init's filter compiled
// (daemon/policy/seccomp_profile.h). The compile helper does it for the
// root spawner; `toolsandbox run`, the tests and the benchmarks for
// themselves.
#pragma once

#include <sys/types.h>

#include <memory>

#include "daemon/policy/seccomp_profile.h"
#include "isolate/base/result.h"
#include "isolate/engine/engine.h"

namespace tsb::policy {

// isolate::Engine::create with the init's filter compiled here (or given,
// compiled by compile_init_filter earlier: the command line's cache): the
// one way the daemon, the command line, the tests and the benchmarks make
// an engine.
Result<std::unique_ptr<isolate::Engine>> create_engine(isolate::EngineConfig config,
                                                       std::shared_ptr<const SeccompProgram> init_filter = nullptr);

// What the engine needs prepared on the host, done or worked out here
// (daemon/compile/prepare.h): where the cgroup parent is (the engine makes it
// ready), the state directory, the leaves of engines that are gone (`engine_pid`:
// the engine's pid, which a dead engine's leaves may carry after a
// restart), toolsandbox-init's path when none is configured. The set-up
// helper does it for the root spawner.
Status prepare_engine(isolate::EngineConfig& config, pid_t engine_pid);

}  // namespace tsb::policy
