#include "daemon/compile/host.h"

#include <unistd.h>

#include "daemon/compile/prepare.h"

namespace tsb::policy {

Result<std::unique_ptr<isolate::Engine>> create_engine(isolate::EngineConfig config,
                                                       std::shared_ptr<const SeccompProgram> init_filter) {
  if (!init_filter) {
    auto filter = compile_init_filter();
    if (!filter.ok()) return std::move(filter).error().wrap("compiling the init filter");
    init_filter = std::move(filter).value();
  }
  TSB_TRY(prepare_engine(config, ::getpid()), "engine");
  return isolate::Engine::create(std::move(config), std::move(init_filter));
}

Status prepare_engine(isolate::EngineConfig& config, pid_t engine_pid) {
  TSB_TRY(isolate::check_proc(), "engine");
  auto cgroups = isolate::prepare_cgroups(config.cgroup_parent);
  if (!cgroups.ok()) return std::move(cgroups).error().wrap("setting up cgroups");
  config.cgroups = std::move(cgroups).value();
  TSB_TRY(isolate::prepare_state_dir(config.state_dir), "state directory");
  config.stale_leaves = isolate::find_stale_leaves(config.cgroups, config.leaf_prefix, config.state_dir, engine_pid);
  config.init_path = isolate::find_init(config.init_path);
  return {};
}

}  // namespace tsb::policy
