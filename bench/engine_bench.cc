// Engine start-up overhead, measured the way the daemon uses the engine:
// one Engine and one compiled policy for the whole process, many runs.
//
//   tsb-bench-engine [--n 200] [--payload "/usr/bin/python3 -S -c pass"] [--json FILE]
//
// Interleaves four variants, n rounds, a fresh random order every round
// (seeded: the same orders on every run), 5
// warm-ups each: the bare payload (posix_spawn + wait), the payload through
// the engine (spawn + supervise to the end, cleanup included) as shipped,
// where read-only host directories are overlays the engine makes
// ("views", so mountinfo names no host path), the same engine with plain
// binds instead (engine.hide_host_paths false), and the payload through
// bwrap --unshare-all --die-with-parent, and the shipped engine with the
// policy's network set to "egress" (what that mode adds to a sandbox: the
// listening socket init makes and hands back, the TLS files; not the
// front end's proxy, which serves the socket). Reports median,
// p10, p90 and p95 in ms, and the overhead of each variant over bare.
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "daemon/compile/spawn_policy.h"
#include "daemon/policy/policy.h"
#include "daemon/policy/seccomp_profile.h"
#include "isolate/engine/engine.h"
#include "daemon/compile/host.h"
#include "isolate/supervise/outcome.h"

extern char** environ;

namespace {

using clk = std::chrono::steady_clock;

double spawn_wait(const std::vector<std::string>& argv) {
  std::vector<char*> a;
  for (const auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
  a.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
  auto t0 = clk::now();
  pid_t pid;
  if (posix_spawn(&pid, a[0], &fa, nullptr, a.data(), environ) != 0) return -1;
  int st = 0;
  waitpid(pid, &st, 0);
  double ms = std::chrono::duration<double, std::milli>(clk::now() - t0).count();
  posix_spawn_file_actions_destroy(&fa);
  return (WIFEXITED(st) && WEXITSTATUS(st) == 0) ? ms : -1;
}

double pct(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  double k = (v.size() - 1) * p;
  std::size_t lo = static_cast<std::size_t>(k);
  std::size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (k - lo);
}

}  // namespace

int main(int argc, char** argv) {
  int n = 200;
  std::string payload = "/usr/bin/python3 -S -c pass", json_out;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--n" && i + 1 < argc) n = std::atoi(argv[++i]);
    else if (a == "--payload" && i + 1 < argc) payload = argv[++i];
    else if (a == "--json" && i + 1 < argc) json_out = argv[++i];
    else {
      std::fprintf(stderr, "usage: tsb-bench-engine [--n N] [--payload CMD] [--json FILE]\n");
      return 2;
    }
  }
  std::vector<std::string> cmd;
  std::istringstream ps(payload);
  for (std::string w; ps >> w;) cmd.push_back(w);

  tsb::isolate::EngineConfig cfg;
  cfg.cgroup_parent = "/toolsandbox-bench";
  cfg.state_dir = "/run/toolsandbox-bench";
  auto engine = tsb::policy::create_engine(cfg);
  if (!engine.ok()) {
    std::fprintf(stderr, "engine: %s\n", engine.error().message.c_str());
    return 1;
  }
  tsb::isolate::EngineConfig bind_cfg = cfg;
  bind_cfg.hide_host_paths = false;
  bind_cfg.uid_base = cfg.uid_base + cfg.uid_slots * 65536u;
  auto bind_engine = tsb::policy::create_engine(bind_cfg);
  if (!bind_engine.ok()) {
    std::fprintf(stderr, "engine (binds): %s\n", bind_engine.error().message.c_str());
    return 1;
  }
  tsb::core::PolicyContext ctx;
  auto policy = tsb::core::load_named_policy("default", "", ctx);
  if (!policy.ok()) {
    std::fprintf(stderr, "policy: %s\n", policy.error().message.c_str());
    return 1;
  }
  auto spec = tsb::core::run_spec_from(*policy);
  spec.env = *tsb::core::build_environment(*policy, {});
  spec.argv = cmd;
  auto table = tsb::isolate::build_fs_table(tsb::core::fs_inputs_from(*policy));
  if (!table.ok()) {
    std::fprintf(stderr, "file system: %s\n", table.error().message.c_str());
    return 1;
  }
  spec.fs = *table;
  auto egress_spec = spec;
  egress_spec.network = tsb::isolate::NetworkMode::Egress;
  auto egress_inputs = tsb::core::fs_inputs_from(*policy);
  egress_inputs.network = tsb::isolate::NetworkMode::Egress;
  auto egress_table = tsb::isolate::build_fs_table(egress_inputs);
  if (!egress_table.ok()) {
    std::fprintf(stderr, "file system (egress): %s\n", egress_table.error().message.c_str());
    return 1;
  }
  egress_spec.fs = *egress_table;

  std::vector<std::string> bwrap = {"/usr/bin/bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
                                    "--unshare-all", "--die-with-parent"};
  bwrap.insert(bwrap.end(), cmd.begin(), cmd.end());

  struct Variant {
    const char* name;
    std::vector<double> ms;
  };
  constexpr int kVariants = 5;
  Variant v[kVariants] = {{"bare", {}}, {"engine", {}}, {"bwrap", {}}, {"engine, binds", {}}, {"engine, egress", {}}};
  auto run_variant = [&](int which) -> double {
    if (which == 0) return spawn_wait(cmd);
    if (which == 2) return spawn_wait(bwrap);
    auto t0 = clk::now();
    auto r = which == 4 ? (*engine)->run(egress_spec) : (which == 1 ? *engine : *bind_engine)->run(spec);
    double ms = std::chrono::duration<double, std::milli>(clk::now() - t0).count();
    return (r.reason == tsb::isolate::EndReason::Exited && r.exit_code == 0) ? ms : -1;
  };
  for (int w = 0; w < 5; ++w)
    for (int k = 0; k < kVariants; ++k)
      if (run_variant(k) < 0) {
        std::fprintf(stderr, "variant %s fails\n", v[k].name);
        return 1;
      }
  // A rotated order would keep each variant's predecessor, and what it
  // leaves behind (a busy or an idle host): a random one does not.
  std::mt19937 order_rng(20261204);
  std::vector<int> order(kVariants);
  for (int k = 0; k < kVariants; ++k) order[k] = k;
  for (int round = 0; round < n; ++round) {
    std::shuffle(order.begin(), order.end(), order_rng);
    for (int k : order) {
      double ms = run_variant(k);
      if (ms >= 0) v[k].ms.push_back(ms);
    }
  }

  double base = pct(v[0].ms, 0.5);
  std::ostringstream js;
  js << "{\"n\":" << n << ",\"payload\":\"" << payload << "\",\"variants\":{";
  std::printf("| variant | n | median ms | p10 | p90 | p95 | overhead vs bare |\n|---|---:|---:|---:|---:|---:|---:|\n");
  for (int k = 0; k < kVariants; ++k) {
    double med = pct(v[k].ms, 0.5);
    std::printf("| %s | %zu | %.2f | %.2f | %.2f | %.2f | %+.2f ms (x%.2f) |\n", v[k].name, v[k].ms.size(), med,
                pct(v[k].ms, 0.1), pct(v[k].ms, 0.9), pct(v[k].ms, 0.95), med - base, med / base);
    js << (k ? "," : "") << "\"" << v[k].name << "\":{\"n\":" << v[k].ms.size() << ",\"median\":" << med
       << ",\"p10\":" << pct(v[k].ms, 0.1) << ",\"p90\":" << pct(v[k].ms, 0.9) << ",\"p95\":" << pct(v[k].ms, 0.95) << "}";
  }
  double load[3] = {0, 0, 0};
  if (std::FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf %lf %lf", &load[0], &load[1], &load[2]) != 3) load[0] = load[1] = load[2] = -1;
    std::fclose(f);
  }
  js << "},\"cgroup\":\"" << (*engine)->cgroups().describe() << "\",\"loadavg\":[" << load[0] << "," << load[1]
     << "," << load[2] << "]}";
  std::printf("\nload average at the end: %.2f %.2f %.2f\n", load[0], load[1], load[2]);
  std::printf("\nengine: %s\n", (*engine)->cgroups().describe().c_str());
  if (!json_out.empty()) std::ofstream(json_out) << js.str() << "\n";
  return 0;
}
