// The compile helper: `toolsandboxd-frontend --compile` (and --check), run
// by the root spawner as uid 0 with no capability at its start and at
// every reload. It has read the configuration and the policies (recording
// every file: daemon/policy/sources.h); here it checks what they need of
// the host, prepares the host for the engine at the spawner's start
// (daemon/compile/prepare.h), and writes the compiled set the spawner
// reads (daemon/wire/compiled.h) to stdout and the record to its memfd.
#pragma once

#include <string>

#include "daemon/policy/config.h"
#include "daemon/policy/registry.h"
#include "daemon/policy/sources.h"

namespace tsb::compile {

enum class HelperMode {
  kCheck,    // load and report, write nothing (toolsandboxd --check)
  kCompile,  // a reload: the compiled set and the record
  kSetup,    // the spawner's start: the host prepared first, then as kCompile
};

// `config_path`: as given (a missing file is said by name); `sources_fd`:
// the record's memfd. Returns the process's exit status; what failed is
// logged.
int run_helper(const std::string& config_path, const core::DaemonConfig& cfg, const core::PolicySet& set,
               const core::SourceFiles& files, HelperMode mode, int sources_fd);

}  // namespace tsb::compile
