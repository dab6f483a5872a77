// From a run_tool request line to the runner's stdin (decode_request, then
// core::runner_request_text): the runner reads exactly its documented
// fields, values arrive byte for byte as the client sent them (integers of
// any size included), and decoding a maximal request plus building the
// runner's stdin stays within 3x the line's size.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <string>
#include <variant>

#include "daemon/frontend/letta/result.h"
#include "protocol/json_scan.h"
#include "protocol/messages.h"

namespace tsb::protocol {
using namespace tsb::letta;  // Letta's dialect, beside the wire protocol
namespace {

using json = nlohmann::json;

const std::string kNonce(32, 'a');

const RunToolRequest& run_tool(const std::variant<Request, ProtocolError>& r) {
  static const RunToolRequest none;
  if (auto* e = std::get_if<ProtocolError>(&r)) {
    ADD_FAILURE() << "refused: " << e->message;
    return none;
  }
  return std::get<RunToolRequest>(std::get<Request>(r).body);
}

std::string line_with(const std::string& extra, const std::string& source = R"(def f(**kw):\n    return kw\n)") {
  return R"({"v":1,"id":"r","type":"run_tool","tool_name":"f","organization_id":"o","source_code":")" + source + "\"" +
         extra + "}";
}

// The runner text's members as raw slices (it must itself be valid JSON).
std::map<std::string, std::string> members_of(const std::string& text) {
  std::map<std::string, std::string> m;
  JsonScanOptions o;
  o.on_child = [&](const JsonChild& c) { m[json_string_value(c.key)] = std::string(c.value); };
  auto r = scan_json(text, o);
  EXPECT_TRUE(std::holds_alternative<JsonScanned>(r)) << text;
  return m;
}

TEST(RunnerRequestText, ExactlyTheRunnersFieldsNullWhereAbsent) {
  auto d = decode_request(line_with(""), nullptr);
  const std::string text = core::runner_request_text(run_tool(d), kNonce);
  auto m = members_of(text);
  EXPECT_EQ(m.size(), 8u);
  EXPECT_EQ(m["env"], "{}");
  EXPECT_EQ(m["nonce"], "\"" + kNonce + "\"");
  EXPECT_EQ(m["tool_name"], "\"f\"");
  EXPECT_EQ(m["source_code"], "\"def f(**kw):\\n    return kw\\n\"");
  EXPECT_EQ(m["args"], "{}");
  EXPECT_EQ(m["json_schema"], "null");
  EXPECT_EQ(m["agent_state"], "null");
  EXPECT_EQ(m["agent_id"], "null");
  // What the runner's json.loads sees.
  json j = json::parse(text);
  EXPECT_EQ(j["source_code"], "def f(**kw):\n    return kw\n");
  EXPECT_TRUE(j["agent_id"].is_null());
}

TEST(RunnerRequestText, EnvIsAnObjectOfStringsSizedExactly) {
  auto d = decode_request(line_with(""), nullptr);
  const std::string text =
      core::runner_request_text(run_tool(d), kNonce, {{"LD_PRELOAD", "/a \"b\".so"}, {"PYTHONPATH", "/p\n"}});
  EXPECT_EQ(members_of(text)["env"], R"({"LD_PRELOAD":"/a \"b\".so","PYTHONPATH":"/p\n"})");
  EXPECT_EQ(text.capacity(), text.size());
  const std::string one = core::runner_request_text(run_tool(d), kNonce, {{"A", "1"}});
  EXPECT_EQ(members_of(one)["env"], R"({"A":"1"})");
  EXPECT_EQ(one.capacity(), one.size());
}

TEST(RunnerRequestText, AgentStateOnlyForASourceThatCanDeclareIt) {
  const std::string state = ",\"agent_state\":{\"secret\":\"s3cr3t\"}";
  auto without = decode_request(line_with(state), nullptr);
  const std::string a = core::runner_request_text(run_tool(without), kNonce);
  EXPECT_EQ(members_of(a)["agent_state"], "null");
  EXPECT_EQ(a.find("s3cr3t"), std::string::npos);
  EXPECT_EQ(a.capacity(), a.size());
  auto with = decode_request(line_with(state, R"(def f(agent_state):\n    return 1\n)"), nullptr);
  EXPECT_EQ(members_of(core::runner_request_text(run_tool(with), kNonce))["agent_state"], "{\"secret\":\"s3cr3t\"}");
}

TEST(RunnerRequestText, StringsAreEscapedAndDecodedOnce) {
  const std::string line =
      R"({"v":1,"id":"r","type":"run_tool","tool_name":"f","organization_id":"o","agent_id":"ag\"ent\u00e9\n",)"
      R"("source_code":"x = \"\\u00e9\" \u00e9 \ud83d\ude00 \t\u0001\/"})";
  auto d2 = decode_request(line, nullptr);
  const auto& t = run_tool(d2);
  EXPECT_EQ(t.source_code, "x = \"\\u00e9\" \xc3\xa9 \xf0\x9f\x98\x80 \t\x01/");
  const std::string text = core::runner_request_text(t, kNonce);
  json j = json::parse(text);
  EXPECT_EQ(j["source_code"], t.source_code);
  EXPECT_EQ(j["agent_id"], "ag\"ent\xc3\xa9\n");
  EXPECT_EQ(text.capacity(), text.size());
  auto m = members_of(text);
  EXPECT_EQ(m["source_code"], "\"x = \\\"\\\\u00e9\\\" \xc3\xa9 \xf0\x9f\x98\x80 \\t\\u0001/\"");
}

TEST(RunnerRequestText, NumbersReachTheToolAsWritten) {
  const std::string big300 = "1" + std::string(299, '7');
  const std::string args = "{\"big\":" + big300 + ",\"neg\":-" + big300 +
                           ",\"u64p1\":18446744073709551616,\"i64m1\":-9223372036854775809,"
                           "\"negzero\":-0,\"huge\":1e400,\"tiny\":1e-400,\"upper\":1E+2,\"f\":0.1000000000000000000001,"
                           "\"nested\":[ 12345678901234567890123 , {\"x\" : -0.0e-0} ]}";
  const std::string state = "{\"counter\":" + big300 + ",\"ws\" :\t[ 1 ,2 ]}";
  const std::string schema = "{\"parameters\":{\"properties\":{\"big\":{\"maximum\":" + big300 + "}}}}";
  auto d = decode_request(line_with(",\"args\":" + args + ",\"agent_state\":" + state + ",\"json_schema\":" + schema,
                                    R"(def f(agent_state, **kw):\n    return kw\n)"),
                          nullptr);
  const auto& t = run_tool(d);
  EXPECT_EQ(t.args, args);
  EXPECT_EQ(t.agent_state, state);
  EXPECT_EQ(t.json_schema, schema);
  const std::string text = core::runner_request_text(t, kNonce);
  EXPECT_NE(text.find(",\"args\":" + args + ","), std::string::npos) << text;
  EXPECT_NE(text.find(",\"agent_state\":" + state + ","), std::string::npos) << text;
  EXPECT_NE(text.find(",\"json_schema\":" + schema + ","), std::string::npos) << text;
  // Sized exactly in advance (libstdc++ reserves what is asked): a miscount
  // would show as a larger capacity, or a doubled one after a reallocation.
  EXPECT_EQ(text.capacity(), text.size());
  auto m = members_of(text);
  EXPECT_EQ(m["args"], args);
  EXPECT_EQ(m["agent_state"], state);
  EXPECT_EQ(m["json_schema"], schema);
}

// ---------------------------------------------------------------------------
// Memory
// ---------------------------------------------------------------------------

// A run_tool line of about `size` bytes whose args hold millions of small
// values: half an array of one-digit numbers, half an object of short keys.
std::string maximal_line(std::size_t size) {
  std::string line = line_with("");
  line.pop_back();
  line += R"(,"args":{"a":[)";
  line.reserve(size + 64);
  while (line.size() < size / 2) {
    line += static_cast<char>('0' + line.size() % 10);
    line += ',';
  }
  line += "0],\"o\":{";
  for (unsigned i = 0; line.size() < size - 40; ++i) {
    line += "\"k";
    line += std::to_string(i);
    line += "\":";
    line += static_cast<char>('0' + i % 10);
    line += ',';
  }
  line += "\"end\":null}}}";
  return line;
}

long status_kb(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string l;
  const std::string f(field);
  while (std::getline(in, l))
    if (l.rfind(f, 0) == 0) return std::stol(l.substr(f.size()));
  return -1;
}

struct Measured {
  int ok;              // 1 measured, 0 cannot reset the peak, -1 the work failed
  double line_bytes;
  double growth_bytes;  // peak resident growth while the work ran
  double ms;
  double output_bytes;
};

// Runs `work` on `line` in a child process (the peak resident set is per
// process, and the child starts from a heap of its own) and measures the
// growth of the peak resident set over the moment before it started. The
// work is run once on `warm` first: code and library pages touched for the
// first time would count as growth (a running daemon has them resident).
Measured measure_in_child(const std::function<std::string()>& make_line, const std::string& warm,
                          const std::function<bool(const std::string&, double*)>& work) {
  Measured m{};
  int fds[2];
  if (pipe(fds) != 0) return m;
  pid_t pid = fork();
  if (pid < 0) return m;
  if (pid == 0) {
    close(fds[0]);
    double ignored = 0;
    (void)work(warm, &ignored);
    const std::string line = make_line();
    m.line_bytes = static_cast<double>(line.size());
    {
      std::ofstream clear("/proc/self/clear_refs");
      clear << "5";  // reset VmHWM to the current resident set (Linux 4.0+)
      clear.flush();
      m.ok = clear ? 1 : 0;
    }
    if (m.ok == 1) {
      const long base = status_kb("VmHWM:");
      auto t0 = std::chrono::steady_clock::now();
      if (!work(line, &m.output_bytes)) m.ok = -1;
      m.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      m.growth_bytes = static_cast<double>(status_kb("VmHWM:") - base) * 1024.0;
    }
    ssize_t w = write(fds[1], &m, sizeof m);
    _exit(w == static_cast<ssize_t>(sizeof m) ? 0 : 1);
  }
  close(fds[1]);
  ssize_t n = read(fds[0], &m, sizeof m);
  close(fds[0]);
  int status = 0;
  if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0 || n != static_cast<ssize_t>(sizeof m))
    m.ok = -2;
  return m;
}

// The kernel's resident-set counters are per-CPU and read approximately
// (off by up to a batch of pages per CPU and counter): 1 MiB of slack, with
// page rounding.
constexpr double kSlack = 1 << 20;

TEST(RunnerRequestMemory, MaximalRequestStaysWithinThreeTimesItsSize) {
  // Decode the line and build the runner's stdin from it, keeping both.
  auto work = [](const std::string& line, double* out) {
    auto d = decode_request(line, nullptr);
    auto* r = std::get_if<Request>(&d);
    if (!r) return false;
    std::string text = core::runner_request_text(std::get<RunToolRequest>(r->body), kNonce);
    *out = static_cast<double>(text.size());
    return true;
  };
  Measured m = measure_in_child([] { return maximal_line(kDefaultMaxFrameBytes); }, maximal_line(1 << 20), work);
  ASSERT_NE(m.ok, -2) << "the measuring child failed";
  if (m.ok == 0) GTEST_SKIP() << "cannot reset the peak resident set through /proc/self/clear_refs";
  ASSERT_EQ(m.ok, 1) << "the maximal request was refused";
  const double total = (m.line_bytes + m.growth_bytes) / m.line_bytes;
  std::printf("    %.1f MiB line: peak growth %.2fx the line, %.2fx counting the line; decoded and copied in %.0f ms (%.0f MiB/s)\n",
              m.line_bytes / (1 << 20), m.growth_bytes / m.line_bytes, total, m.ms, m.line_bytes / (1 << 20) / (m.ms / 1000.0));
  // The request holds args (1x) and the runner text repeats it (1x): with
  // the line itself that is the floor, 3x.
  EXPECT_LE(m.line_bytes + m.growth_bytes, 3 * m.line_bytes + kSlack) << "peak " << total << "x the line";
  EXPECT_GT(m.output_bytes, m.line_bytes * 0.99);
}

TEST(RunnerRequestMemory, MillionsOfRepeatedKeysAreRefusedCheaply) {
  // The worst line for duplicate detection: one object of 5-byte members
  // that all repeat one key. Its 8-byte hashes are all it holds.
  auto line = [](std::size_t size) {
    std::string l = line_with("");
    l.pop_back();
    l += R"(,"args":{)";
    while (l.size() < size - 8) l += "\"\":0,";
    l += "\"\":0}}";
    return l;
  };
  auto work = [](const std::string& l, double*) {
    auto d = decode_request(l, nullptr);
    auto* e = std::get_if<ProtocolError>(&d);
    return e && e->message.find("duplicate keys") != std::string::npos;
  };
  Measured m = measure_in_child([&] { return line(kDefaultMaxFrameBytes); }, line(1 << 20), work);
  ASSERT_NE(m.ok, -2) << "the measuring child failed";
  if (m.ok == 0) GTEST_SKIP() << "cannot reset the peak resident set through /proc/self/clear_refs";
  ASSERT_EQ(m.ok, 1) << "the line was not refused for its duplicate keys";
  std::printf("    %.1f MiB of repeated keys: peak growth %.2fx the line; refused in %.0f ms\n", m.line_bytes / (1 << 20),
              m.growth_bytes / m.line_bytes, m.ms);
  EXPECT_LE(m.growth_bytes, 1.7 * m.line_bytes + kSlack);  // 8 bytes per 5-byte member
}

}  // namespace
}  // namespace tsb::protocol
