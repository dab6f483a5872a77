// tsb-spawner-probe: a hostile front end, for SpawnerTest
// (tests/integration/privsep_test.cc). Installed next to a copy of
// toolsandboxd as "toolsandboxd-frontend", it is what the spawner starts.
//
// --compile / --check: runs the real front end ($TSB_REAL_FRONTEND), so the
// spawner gets a real compiled set. --serve: ignores the protocol socket and
// sends the spawner, on its control descriptor, a battery of malformed and
// out-of-policy run orders, each followed by a valid one (the spawner must
// refuse the first and still serve the second). Writes one line per case to
// $TSB_PROBE_OUT:  <case> <answer> [<detail>]
// where answer is "refused:<code>", "started", "ended:<reason>:<exit>" or
// "none" (nothing came within 60 s: the VM lane emulates a CPU). Then exits without saying READY, which
// stops the spawner.
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "daemon/frontend/local/front_codec.h"
#include "isolate/supervise/outcome.h"

using namespace tsb;
using namespace tsb::spawn;

namespace {

int control = -1;
constexpr std::uint64_t kAny = ~0ull;  // a refusal of a message that may carry no id
FILE* out = nullptr;

// The next answer for `id` within 60 s: refused, started (then its output
// and end), or ended.
std::string await(std::uint64_t id, std::string* output) {
  for (;;) {
    pollfd p{control, POLLIN, 0};
    if (::poll(&p, 1, 60000) <= 0) return "none";
    std::vector<UniqueFd> fds;
    auto m = receive_message(control, &fds);
    if (!m.ok() || m->empty()) return "closed";
    switch (message_type(*m)) {
      case Msg::Refused: {
        auto r = decode_refused(*m);
        if (!r.ok()) return "bad-refused";
        if (id != kAny && r->id != id && r->id != 0) continue;
        return "refused:" + std::to_string(static_cast<int>(r->code));
      }
      case Msg::Started: {
        auto s = decode_started(*m);
        if (!s.ok() || s->id != id || fds.size() != 3) return "bad-started";
        // The script goes in; stdout comes back; then the end. The pipes are
        // non-blocking (the front end reads them from an event loop).
        for (auto& fd : fds) ::fcntl(fd.get(), F_SETFL, ::fcntl(fd.get(), F_GETFL) & ~O_NONBLOCK);
        static const std::string kScript = std::getenv("TSB_PROBE_SCRIPT") ? std::getenv("TSB_PROBE_SCRIPT") : "import os\nprint('hello', os.getuid())\n";
        ssize_t w = ::write(fds[0].get(), kScript.data(), kScript.size());
        if (w != static_cast<ssize_t>(kScript.size())) *output += "write:" + std::to_string(w) + ":" + std::strerror(errno);
        fds[0].reset();
        char buf[4096];
        ssize_t n;
        while ((n = ::read(fds[1].get(), buf, sizeof buf)) > 0) output->append(buf, static_cast<std::size_t>(n));
        std::string err;
        while ((n = ::read(fds[2].get(), buf, sizeof buf)) > 0) err.append(buf, static_cast<std::size_t>(n));
        if (!err.empty()) *output += "stderr:" + err;
        continue;  // the Ended
      }
      case Msg::Ended: {
        auto e = decode_ended(*m);
        if (!e.ok() || e->id != id) return "bad-ended";
        const isolate::RunResult r = run_result_from(*e);
        if (!r.error.empty()) *output += "error:" + r.error;
        return "ended:" + std::string(isolate::to_string(r.reason)) + ":" + std::to_string(r.exit_code);
      }
      default: continue;
    }
  }
}

std::uint64_t next_id = 100;

void valid_after(const std::string& name, const RunOrder& good) {
  RunOrder o = good;
  o.id = ++next_id;
  if (auto st = send_message(control, encode(o)); !st.ok()) {
    std::fprintf(out, "%s.after send-failed\n", name.c_str());
    return;
  }
  std::string output;
  std::string a = await(o.id, &output);
  for (char& c : output)
    if (c == '\n') c = '|';
  std::fprintf(out, "%s.after %s %s\n", name.c_str(), a.c_str(), output.c_str());
}

void raw_case(const std::string& name, const std::string& bytes, const RunOrder& good, std::uint64_t id = kAny) {
  if (auto st = send_message(control, bytes); !st.ok()) {
    std::fprintf(out, "%s send-failed\n", name.c_str());
  } else {
    std::string ignored;
    std::fprintf(out, "%s %s\n", name.c_str(), await(id, &ignored).c_str());
  }
  std::fflush(out);
  valid_after(name, good);
  std::fflush(out);
}

void order_case(const std::string& name, RunOrder o, const RunOrder& good) {
  o.id = ++next_id;
  raw_case(name, encode(o), good, o.id);
}

}  // namespace

int main(int argc, char** argv) {
  bool serve = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--serve") == 0) serve = true;
    if (std::strcmp(argv[i], "--control-fd") == 0 && i + 1 < argc) control = std::atoi(argv[i + 1]);
  }
  if (!serve) {
    const char* real = std::getenv("TSB_REAL_FRONTEND");
    if (!real) return 126;
    argv[0] = const_cast<char*>(real);
    ::execv(real, argv);
    return 127;
  }
  const char* path = std::getenv("TSB_PROBE_OUT");
  const char* fp = std::getenv("TSB_PROBE_FINGERPRINT");
  if (!path || !fp || control < 0) return 125;
  out = std::fopen(path, "w");
  if (!out) return 124;
  std::vector<UniqueFd> fds;
  auto hello = receive_message(control, &fds);
  std::fprintf(out, "hello %s\n", hello.ok() && decode_hello(*hello).ok() ? "ok" : "bad");

  RunOrder good;
  good.policy = "default";
  good.fingerprint = fp;
  good.mode = RunMode::Script;
  good.timeout = std::chrono::milliseconds(10000);
  valid_after("baseline", good);

  // Malformed messages.
  raw_case("empty", std::string(1, '\0'), good);
  raw_case("unknown-type", std::string(1, static_cast<char>(99)), good);
  std::string run = encode(RunOrder{++next_id, "default", fp, RunMode::Script, {}, std::chrono::milliseconds(1000), ""});
  raw_case("truncated", run.substr(0, run.size() - 3), good);
  raw_case("trailing", run + "junk", good);
  std::string huge = run.substr(0, 9);  // type + id
  huge += std::string("\xff\xff\xff\x7f", 4);  // a policy name of 2 GiB
  raw_case("huge-length", huge, good);
  std::string mode = encode(RunOrder{++next_id, "default", fp, RunMode::Script, {}, std::chrono::milliseconds(1000), ""});
  mode[9 + 4 + 7 + 4 + std::strlen(fp)] = 7;  // the mode byte: neither script nor tool
  raw_case("bad-mode", mode, good);

  // Out of the policy's bounds.
  RunOrder o = good;
  o.policy = "no-such-policy";
  order_case("unknown-policy", o, good);
  o = good;
  o.fingerprint = "sha256:0000";
  order_case("wrong-fingerprint", o, good);
  o = good;
  o.timeout = std::chrono::milliseconds(0);
  order_case("timeout-zero", o, good);
  o = good;
  o.timeout = std::chrono::hours(24);
  order_case("timeout-above-policy", o, good);
  o = good;
  o.env = {{"PATH", "/tmp/evil"}};
  order_case("env-fixed-name", o, good);
  o = good;
  o.env = {{"LD_PRELOAD", "/tmp/evil.so"}};
  order_case("env-not-allowed", o, good);
  o = good;
  o.env = {{"1BAD", "x"}};
  order_case("env-bad-name", o, good);
  o = good;
  o.env = {{"LETTA_AGENT_ID", std::string("a\0b", 3)}};
  order_case("env-nul-value", o, good);

  // A Kill for a run that does not exist: ignored.
  (void)send_message(control, encode(Kill{424242}));
  valid_after("kill-unknown", good);
  std::fflush(out);  // before the spawner kills this process
  // A descriptor from the front end: the spawner ends it (this process is
  // killed; the line below is written only if it is not).
  int devnull = ::open("/dev/null", O_RDONLY);
  (void)send_message(control, encode(Kill{424243}), &devnull, 1);
  std::fflush(out);
  std::string ignored;
  std::fprintf(out, "descriptor-sent %s\n", await(kAny, &ignored).c_str());
  std::fclose(out);
  return 0;
}
