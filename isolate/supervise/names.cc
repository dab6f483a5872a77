// The stable names of set-up stages and end reasons (isolate/supervise/outcome.h).
#include "isolate/supervise/outcome.h"

namespace tsb::isolate {

const char* stage_name(Stage s) noexcept {
  switch (s) {
    case Stage::None: return "none";
    case Stage::Sync: return "sync";
    case Stage::SetIds: return "set-ids";
    case Stage::Cgroupns: return "cgroupns";
    case Stage::MountPrivate: return "mount-private";
    case Stage::MountRoot: return "mount-root";
    case Stage::MountSkeleton: return "mount-skeleton";
    case Stage::MountBind: return "mount-bind";
    case Stage::MountTmpfs: return "mount-tmpfs";
    case Stage::MountProc: return "mount-proc";
    case Stage::MaskProc: return "mask-proc";
    case Stage::MountDev: return "mount-dev";
    case Stage::PivotRoot: return "pivot-root";
    case Stage::RemountRoot: return "remount-root";
    case Stage::Hostname: return "hostname";
    case Stage::Loopback: return "loopback";
    case Stage::Fork: return "fork";
    case Stage::Fds: return "fds";
    case Stage::Rlimits: return "rlimits";
    case Stage::Session: return "session";
    case Stage::Securebits: return "securebits";
    case Stage::CapBound: return "cap-bounding";
    case Stage::SetToolIds: return "set-tool-ids";
    case Stage::Caps: return "caps";
    case Stage::NoNewPrivs: return "no-new-privs";
    case Stage::Chdir: return "chdir";
    case Stage::Seccomp: return "seccomp";
    case Stage::Execve: return "execve";
    case Stage::ExecInit: return "exec-init";
    case Stage::InitSeccomp: return "init-seccomp";
    case Stage::MemfdNoexec: return "memfd-noexec";
    case Stage::DeathSignal: return "death-signal";
    case Stage::InitReady: return "init-ready";
    case Stage::Plan: return "plan";
    case Stage::Egress: return "egress-listener";
    case Stage::Landlock: return "landlock";
    case Stage::CgroupJoin: return "cgroup-join";
    case Stage::kCount: break;
  }
  return "unknown";
}

std::string landlock_summary(int report) {
  if (report < 0) return "-";
  if (report == kLandlockOff) return "off";
  const int abi = report & 0xff;
  if (abi == 0) return "unavailable";
  std::string layers;
  for (const auto& [bit, name] : {std::pair{kLandlockFs, "fs"}, {kLandlockNet, "net"}, {kLandlockScope, "scope"}})
    if (report & bit) layers += (layers.empty() ? "" : ",") + std::string(name);
  return "abi" + std::to_string(abi) + ":" + (layers.empty() ? "none" : layers);
}

std::string_view to_string(EndReason r) noexcept {
  switch (r) {
    case EndReason::Exited: return "exited";
    case EndReason::Signaled: return "signaled";
    case EndReason::Timeout: return "timeout";
    case EndReason::MemoryLimit: return "memory_limit";
    case EndReason::PidsLimit: return "pids_limit";
    case EndReason::CpuLimit: return "cpu_limit";
    case EndReason::OutputLimit: return "output_limit";
    case EndReason::SetupFailed: return "setup_failed";
    case EndReason::Cancelled: return "cancelled";
  }
  return "unknown";
}

}  // namespace tsb::isolate
