#include "protocol/record.h"

#include "isolate/engine/stage.h"

namespace tsb::core {

nlohmann::json run_record_json(const isolate::RunResult& r) {
  using namespace std::chrono;
  nlohmann::json j = {
      {"run_id", r.run_id},
      {"end_reason", std::string(isolate::to_string(r.reason))},
      {"exit_code", r.exit_code >= 0 ? nlohmann::json(r.exit_code) : nlohmann::json()},
      {"signal", r.signal ? nlohmann::json(r.signal) : nlohmann::json()},
      {"wall_ms", duration<double, std::milli>(r.wall).count()},
      {"cpu_ms", duration<double, std::milli>(r.cpu).count()},
      {"peak_memory_bytes", r.peak_memory_bytes},
      {"stdout_truncated", r.stdout_truncated},
      {"stderr_truncated", r.stderr_truncated},
      {"stdout_bytes", r.stdout_total_bytes},
      {"stderr_bytes", r.stderr_total_bytes},
  };
  if (r.reason == isolate::EndReason::SetupFailed) {
    j["setup_stage"] = r.setup_stage == isolate::Stage::None ? nlohmann::json() : nlohmann::json(isolate::stage_name(r.setup_stage));
    j["setup_errno"] = r.setup_errno;
    if (!r.setup_path.empty()) j["setup_path"] = r.setup_path;
  }
  if (!r.moved_aside.empty()) j["moved_aside"] = r.moved_aside;
  if (!r.error.empty()) j["error"] = r.error;
  return j;
}

std::string dump_json(const nlohmann::json& j, int indent) {
  return j.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace tsb::core
