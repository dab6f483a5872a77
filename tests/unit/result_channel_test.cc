// The result channel of a local tool run (daemon/frontend/letta/letta.h, "The result
// channel"): the declaration, the parts the front end writes
// (core::runner_channel_*), the result's checks (parse_channel_result), the
// real runner spoken to over a socket pair, and how shape_tool_result
// answers every way a channel run can end.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <tuple>
#include <variant>

#include "daemon/frontend/letta/result.h"
#include "daemon/policy/policy.h"
#include "daemon/frontend/letta/letta.h"
#include "protocol/messages.h"
#include "daemon/compile/spawn_policy.h"
#include "python_reference.h"

namespace tsb::protocol {
using namespace tsb::letta;  // Letta's dialect, beside the wire protocol
namespace {

using json = nlohmann::json;
using tsb::testing::kPython;

RunToolRequest tool(const std::string& source, const std::string& extra = "") {
  const json line_source = source;
  auto r = decode_request(R"({"v":1,"id":"r","type":"run_tool","tool_name":"f","organization_id":"o","source_code":)" +
                              line_source.dump() + extra + "}",
                          nullptr);
  EXPECT_TRUE(std::holds_alternative<Request>(r));
  if (!std::holds_alternative<Request>(r)) return {};
  return std::get<RunToolRequest>(std::get<Request>(r).body);
}

// A part's header and its JSON text.
std::pair<std::uint32_t, std::string> split_part(const std::string& part) {
  EXPECT_GE(part.size(), 4u);
  const auto* b = reinterpret_cast<const unsigned char*>(part.data());
  const std::uint32_t n = (std::uint32_t{b[0]} << 24) | (std::uint32_t{b[1]} << 16) | (std::uint32_t{b[2]} << 8) | b[3];
  return {n, part.substr(4)};
}

TEST(ResultChannel, OnlyTheTwoDeclarationsAreDeclarations) {
  EXPECT_EQ(parse_channel_declaration("TSB1 agent_state=0\n"), std::optional<bool>(false));
  EXPECT_EQ(parse_channel_declaration("TSB1 agent_state=1\n"), std::optional<bool>(true));
  for (const char* bad : {"", "TSB1 agent_state=2\n", "TSB1 agent_state=1", "TSB1 agent_state=1\r", "tsb1 agent_state=1\n",
                          "TSB1 agent_state=1\nx", "{\"results\":1,\"a\":1}"})
    EXPECT_FALSE(parse_channel_declaration(bad)) << bad;
  EXPECT_EQ(kChannelDeclarationSize, 19u);
}

TEST(ResultChannel, PartHeaderIsTheSizeBigEndian) {
  EXPECT_EQ(channel_part_header(0), std::string(4, '\0'));
  EXPECT_EQ(channel_part_header(0x01020304), "\x01\x02\x03\x04");
  EXPECT_EQ(channel_part_header(0xfffffffe), "\xff\xff\xff\xfe");
}

TEST(ResultChannel, TheFirstPartHoldsOnlyTheNameAndTheSource) {
  const auto t = tool("def f(a):\n    return a\n", R"(,"args":{"a":1},"agent_state":{"secret":"s3cr3t"},"agent_id":"ag")");
  const std::string first = core::runner_channel_first(t);
  auto [n, text] = split_part(first);
  EXPECT_EQ(n, text.size());
  EXPECT_EQ(json::parse(text), json({{"tool_name", "f"}, {"source_code", "def f(a):\n    return a\n"}}));
  EXPECT_EQ(first.capacity(), first.size());  // sized once
  EXPECT_EQ(first.find("s3cr3t"), std::string::npos);
}

TEST(ResultChannel, AgentStateGoesOnlyToARunnerThatDeclaredIt) {
  const std::string big = "1" + std::string(60, '7');
  const auto t = tool("def f(agent_state, a):\n    return a\n",
                      R"(,"args":{"a":)" + big + R"(},"agent_state":{"secret":"s3cr3t"},"agent_id":"ag\"1")");
  const std::map<std::string, std::string> env{{"LD_PRELOAD", "/a \"b\".so"}};
  for (bool declared : {false, true}) {
    const std::string second = core::runner_channel_second(t, declared, env);
    auto [n, text] = split_part(second);
    EXPECT_EQ(n, text.size());
    EXPECT_EQ(second.capacity(), second.size());
    const json j = json::parse(text);
    EXPECT_EQ(j.size(), 5u) << text;
    EXPECT_EQ(j["agent_state"], declared ? json({{"secret", "s3cr3t"}}) : json());
    EXPECT_EQ(text.find("s3cr3t") != std::string::npos, declared);
    EXPECT_EQ(j["agent_id"], "ag\"1");
    EXPECT_EQ(j["env"], json({{"LD_PRELOAD", "/a \"b\".so"}}));
    EXPECT_TRUE(j["json_schema"].is_null());
    EXPECT_NE(text.find("{\"a\":" + big + "}"), std::string::npos);  // as the client wrote it
  }
  auto [n, text] = split_part(core::runner_channel_unpickle("gASVAAAA"));
  EXPECT_EQ(n, text.size());
  EXPECT_EQ(text, R"({"unpickle":"gASVAAAA"})");
}

TEST(ResultChannel, ResultIsCheckedAndStdoutIsAllTheTools) {
  // Text that looks like a frame, with any nonce, is just output here.
  const std::string printed =
      "<<TSB-RESULT-" + std::string(32, 'a') + ">>eyJ9<<TSB-END-" + std::string(32, 'a') + ">>\n";
  auto ok = parse_channel_result(R"({"results":[NaN,123456789012345678901234567890],"agent_state":null})", printed);
  ASSERT_TRUE(ok.ok()) << ok.error().message;
  EXPECT_EQ(ok->results_text, "[NaN,123456789012345678901234567890]");
  EXPECT_EQ(ok->stdout_text, printed);
  EXPECT_FALSE(ok->error);
  auto err = parse_channel_result(
      R"({"results":null,"agent_state":null,"error":{"kind":"tool","name":"E","message":"m","raised":true}})", "");
  ASSERT_TRUE(err.ok());
  ASSERT_TRUE(err->error);
  EXPECT_TRUE(err->error->raised);
  auto bad_utf8 = parse_channel_result(R"({"results":1,"agent_state":null})", "a\xff");
  ASSERT_TRUE(bad_utf8.ok());
  EXPECT_TRUE(bad_utf8->stdout_decode_error);
  for (const char* bad : {"", "{", "[1]", R"({"results":1})", R"({"results":1,"agent_state":null,"x":1})",
                          R"({"results":1,"agent_state":[]})", R"({"results":1,"agent_state":null}{"results":2,"agent_state":null})",
                          R"({"results":1,"agent_state":null,"error":{"kind":"tool","name":"E","message":"m"}})",
                          R"({"results":null,"agent_state":null,"error":{"kind":"x","name":"E","message":"m"}})"}) {
    auto r = parse_channel_result(bad, "");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_TRUE(r.error().message.starts_with("runner result: ")) << r.error().message;
  }
}

// ---------------------------------------------------------------------------
// The real runner, over a socket pair, as the front end speaks to it
// ---------------------------------------------------------------------------

#ifdef TSB_SOURCE_DIR
struct ChannelRun {
  std::string declaration;
  std::string result;
  std::string out;
  int exit_code = -1;
};

bool write_all(int fd, std::string_view s) {
  while (!s.empty()) {
    ssize_t n = ::write(fd, s.data(), s.size());
    if (n <= 0) return false;
    s.remove_prefix(static_cast<std::size_t>(n));
  }
  return true;
}

std::string read_to_eof(int fd) {
  std::string s;
  char buf[4096];
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) s.append(buf, static_cast<std::size_t>(n));
  return s;
}

ChannelRun run_channel(const RunToolRequest& t) {
  int sv[2], out[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0 || ::pipe2(out, O_CLOEXEC) != 0) return {};
  const std::string boot = "import sys\nsys.path.append('" TSB_SOURCE_DIR
                           "/isolate/runner')\nimport toolsandbox_runner\ntoolsandbox_runner.run_channel()\n";
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(sv[1], 0);
    ::dup2(out[1], 1);
    ::execl(kPython, kPython, "-I", "-S", "-B", "-u", "-X", "utf8", "-c", boot.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(sv[1]);
  ::close(out[1]);
  ChannelRun r;
  if (write_all(sv[0], core::runner_channel_first(t))) {
    r.declaration.resize(kChannelDeclarationSize);
    std::size_t got = 0;
    for (ssize_t n; got < r.declaration.size() && (n = ::read(sv[0], &r.declaration[got], r.declaration.size() - got)) > 0;)
      got += static_cast<std::size_t>(n);
    r.declaration.resize(got);
    if (auto d = parse_channel_declaration(r.declaration)) {
      write_all(sv[0], core::runner_channel_second(t, *d));
      ::shutdown(sv[0], SHUT_WR);
      r.result = read_to_eof(sv[0]);
    }
  }
  ::close(sv[0]);
  r.out = read_to_eof(out[0]);
  ::close(out[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

TEST(ResultChannelEndToEnd, TheRunnersResultParsesHere) {
  TSB_REQUIRE_PYTHON();
  const auto r = run_channel(tool("def f(name):\n    print('<<TSB-RESULT-' + 'a' * 32 + '>>')\n    return {'n': name}\n",
                                  R"J(,"args":{"name":"__import__('os').system('x')"},"agent_state":{"secret":"s"})J"));
  EXPECT_EQ(r.declaration, kChannelDeclaredNo);
  EXPECT_EQ(r.exit_code, 0);
  auto f = parse_channel_result(r.result, r.out);
  ASSERT_TRUE(f.ok()) << f.error().message << " in " << r.result;
  EXPECT_EQ(f->results, json({{"n", "__import__('os').system('x')"}}));
  EXPECT_TRUE(f->agent_state.is_null());
  EXPECT_EQ(f->stdout_text, "<<TSB-RESULT-" + std::string(32, 'a') + ">>\n");
}

TEST(ResultChannelEndToEnd, ADeclaringToolGetsItsStateAndGivesItBack) {
  TSB_REQUIRE_PYTHON();
  const auto r = run_channel(tool("def f(agent_state):\n    agent_state.memory.update_block_value('human', 'new')\n"
                                  "    return agent_state.id\n",
                                  R"(,"agent_state":{"id":"agent-1","memory":{"blocks":[{"label":"human","value":"old"}]}})"));
  EXPECT_EQ(r.declaration, kChannelDeclaredYes);
  auto f = parse_channel_result(r.result, r.out);
  ASSERT_TRUE(f.ok()) << f.error().message << " in " << r.result;
  EXPECT_EQ(f->results, "agent-1");
  EXPECT_EQ(f->agent_state["memory"]["blocks"][0]["value"], "new");
}

TEST(ResultChannelEndToEnd, AToolErrorIsTheRunnersErrorPayload) {
  TSB_REQUIRE_PYTHON();
  const auto r = run_channel(tool("def f():\n    return 1 / 0\n"));
  EXPECT_EQ(r.exit_code, 1);
  auto f = parse_channel_result(r.result, r.out);
  ASSERT_TRUE(f.ok()) << f.error().message;
  ASSERT_TRUE(f->error);
  EXPECT_EQ(f->error->name, "ZeroDivisionError");
  EXPECT_TRUE(f->error->raised);
}
// Script mode's launcher, cold (the script on a pipe) and warm (the
// hand-over on a socket pair: ready, the environ part, the script): the
// same output, exit status and error line for a script that ends, exits
// or raises; the short end (no teardown) still joins threads, runs atexit
// handlers and flushes what the script left open. `runner`: the runner's
// directory where the sandbox has it (a cold launcher without one ends
// with the interpreter's teardown).
// A file of `text`, made anew.
bool write_file(const std::string& path, std::string_view text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  const bool ok = fd >= 0 && write_all(fd, text);
  if (fd >= 0) ::close(fd);
  return ok;
}

struct ScriptRun {
  std::string out, err, log;  // log: what the script left in log.txt
  int exit_code = -1;
};

ScriptRun run_launcher(bool warm, const std::string& script, bool runner = true, bool planted = false) {
  std::string launcher = core::script_launcher(warm);
  const std::string at = "/opt/toolsandbox/runner";
  launcher.replace(launcher.find(at), at.size(), runner ? TSB_SOURCE_DIR "/isolate/runner" : "/nonexistent/tsb-runner");
  int in[2], out[2], err[2];
  if ((warm ? ::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, in) : ::pipe2(in, O_CLOEXEC)) != 0 ||
      ::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0)
    return {};
  char dir[] = "/tmp/tsb-launcher-XXXXXX";
  if (!::mkdtemp(dir)) return {};
  // `planted`: a package of the runner's name in the working directory.
  const std::string fake = std::string(dir) + "/_toolsandbox_runner";
  if (planted && (::mkdir(fake.c_str(), 0755) != 0 || !write_file(fake + "/__init__.py", "print('planted')\n") ||
                  !write_file(fake + "/lean_exit.py", "print('planted')\n")))
    return {};
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(warm ? in[1] : in[0], 0);
    ::dup2(out[1], 1);
    ::dup2(err[1], 2);
    if (::close_range(3, ~0U, 0) != 0 || ::chdir(dir) != 0) ::_exit(127);
    char lang[] = "LANG=C.UTF-8";
    char* env[] = {lang, nullptr};
    ::execle(kPython, kPython, "-c", launcher.c_str(), static_cast<char*>(nullptr), env);
    ::_exit(127);
  }
  const int ours = warm ? in[0] : in[1];
  ::close(warm ? in[1] : in[0]);
  ::close(out[1]);
  ::close(err[1]);
  if (warm) {
    std::string ready(kChannelReady.size(), '\0');
    if (::recv(ours, ready.data(), ready.size(), MSG_WAITALL) != static_cast<ssize_t>(ready.size()) || ready != kChannelReady)
      ADD_FAILURE() << "no ready line: " << ready;
    write_all(ours, core::runner_environ_part({{"NEW", "v"}}));
  }
  write_all(ours, script);
  ::close(ours);
  ScriptRun r;
  r.out = read_to_eof(out[0]);
  r.err = read_to_eof(err[0]);
  ::close(out[0]);
  ::close(err[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  const int log = ::open((std::string(dir) + "/log.txt").c_str(), O_RDONLY | O_CLOEXEC);
  if (log >= 0) {
    r.log = read_to_eof(log);
    ::close(log);
  }
  std::system(("rm -rf " + std::string(dir)).c_str());
  return r;
}

std::string last_line(const std::string& s) {
  auto end = s.find_last_not_of('\n');
  if (end == std::string::npos) return "";
  auto start = s.rfind('\n', end);
  return s.substr(start == std::string::npos ? 0 : start + 1, end - (start == std::string::npos ? 0 : start + 1) + 1);
}

TEST(WarmScriptLauncher, EndsAsTheColdOne) {
  TSB_REQUIRE_PYTHON();
  const std::string common =
      "names = sorted(k for k in globals() if not k.startswith('__'))\n"
      "import atexit, os, sys, threading\n"
      "print(__name__, os.path.basename(sys.argv[0]).startswith('tmp'), sys.path[0] == os.getcwd(), names[:1])\n"
      "atexit.register(lambda: print('atexit ran'))\n"
      "threading.Thread(target=lambda: (__import__('time').sleep(0.2), print('thread done'))).start()\n"
      "log = open('log.txt', 'w')\nlog.write('left open')\n"
      "sys.stdout.write('unflushed')\n";
  for (const auto& [tail, code, err_line] :
       {std::tuple<std::string, int, std::string>{"", 0, ""}, {"sys.exit(5)\n", 5, ""},
        {"raise ValueError('bad value')\n", 1, "ValueError: bad value"}}) {
    const ScriptRun cold = run_launcher(false, common + tail), warm = run_launcher(true, common + tail);
    EXPECT_EQ(cold.exit_code, code) << cold.err;
    EXPECT_EQ(warm.exit_code, code) << warm.err;
    EXPECT_EQ(warm.out, cold.out) << tail;
    EXPECT_EQ(cold.out, "__main__ True True []\nunflushedthread done\natexit ran\n") << cold.err;
    EXPECT_EQ(warm.log, "left open");
    EXPECT_EQ(cold.log, "left open");
    EXPECT_EQ(last_line(warm.err), err_line) << warm.err;
    EXPECT_EQ(last_line(cold.err), err_line) << cold.err;
    const ScriptRun bare = run_launcher(false, common + tail, /*runner=*/false);
    EXPECT_EQ(bare.exit_code, code) << bare.err;
    EXPECT_EQ(bare.out, cold.out) << tail;
    EXPECT_EQ(bare.log, "left open");
    EXPECT_EQ(last_line(bare.err), err_line) << bare.err;
  }
}

// The short end skips the interpreter's teardown (a module global's
// __del__ is not run), and only for a script that ran to its end; a cold
// launcher with no runner in its sandbox ends with the teardown. The
// runner's package is not left in sys.modules for the script, and nothing
// of the working directory is imported in its place.
TEST(WarmScriptLauncher, TheShortEndSkipsOnlyTheTeardown) {
  TSB_REQUIRE_PYTHON();
  const std::string script =
      "import sys\n"
      "print(sorted(n for n in sys.modules if 'toolsandbox' in n))\n"
      "class Noisy:\n    def __del__(self):\n        print('teardown')\n"
      "noisy = Noisy()\n";
  for (bool warm : {false, true}) {
    const ScriptRun r = run_launcher(warm, script);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, "[]\n") << (warm ? "warm" : "cold") << ": " << r.err;
  }
  const ScriptRun bare = run_launcher(false, script, /*runner=*/false);
  EXPECT_EQ(bare.out, "[]\nteardown\n") << bare.err;
  const ScriptRun planted = run_launcher(false, script, /*runner=*/false, /*planted=*/true);
  EXPECT_EQ(planted.out, "[]\nteardown\n") << planted.err;
  const ScriptRun raised = run_launcher(false, script + "raise SystemExit(4)\n");
  EXPECT_EQ(raised.exit_code, 4) << raised.err;
  EXPECT_EQ(raised.out, "[]\nteardown\n") << raised.err;
}
#endif  // TSB_SOURCE_DIR

}  // namespace
}  // namespace tsb::protocol

// ---------------------------------------------------------------------------
// Shaping: every way a channel run ends
// ---------------------------------------------------------------------------

namespace tsb::core {
namespace {

using json = nlohmann::json;
using isolate::EndReason;

struct ChannelShaping : ::testing::Test {
  ChannelShaping() {
    ctx.tool_name = "f";
    ctx.tool_mode = true;
    ctx.channel = true;
    ctx.result_cap = 1000;
    run.reason = EndReason::Exited;
    run.exit_code = 0;
  }
  Shaped shape(const ChannelOutcome* ch) { return shape_tool_result(ctx, run, nullptr, ch); }
  static ChannelOutcome sent(bool declared, std::string result) {
    ChannelOutcome o;
    o.declared = declared;
    o.result_total = result.size();
    o.result = std::move(result);
    return o;
  }
  ShapeContext ctx;
  isolate::RunResult run;
};

TEST_F(ChannelShaping, AResultAndTheToolsWholeOutput) {
  run.stdout_data = "printed\n<<TSB-RESULT-" + std::string(32, 'a') + ">>\n";
  const auto ch = sent(false, R"({"results":5,"agent_state":null})");
  auto s = shape(&ch);
  EXPECT_EQ(s.result["status"], "success");
  EXPECT_EQ(s.result["func_return"], 5);
  EXPECT_EQ(s.result["stdout"], json::array({run.stdout_data}));
  EXPECT_EQ(s.extra["framing"], "channel");
  EXPECT_EQ(s.func_return_text, "5");
}

TEST_F(ChannelShaping, AgentStateIsTakenOnlyFromADeclaringTool) {
  const std::string payload = R"({"results":1,"agent_state":{"memory":{"blocks":[]}}})";
  const auto declared = sent(true, payload);
  auto s = shape(&declared);
  EXPECT_EQ(s.result["status"], "success");
  EXPECT_EQ(s.result["agent_state"], json({{"memory", {{"blocks", json::array()}}}}));
  EXPECT_EQ(s.agent_state_text, R"({"memory":{"blocks":[]}})");
  const auto undeclared = sent(false, payload);
  s = shape(&undeclared);
  EXPECT_EQ(s.result["status"], "error");
  EXPECT_TRUE(s.result["agent_state"].is_null());
  EXPECT_EQ(s.result["func_return"], "Error executing function f: Exception: Function ran, but output is corrupted.");
  EXPECT_NE(s.extra["frame_error"].get<std::string>().find("does not declare agent_state"), std::string::npos);
}

// The nonce frame (an E2B cell): a source that does not name agent_state
// was sent none, so a frame that carries one is not the runner's.
TEST_F(ChannelShaping, ANonceFrameCarriesAgentStateOnlyForASourceThatCanDeclareIt) {
  ctx.channel = false;
  ctx.nonce = std::string(32, 'c');
  run.stdout_data =
      "printed\n" + letta::make_nonce_frame(ctx.nonce, json{{"results", 1}, {"agent_state", {{"x", 1}}}}).value();
  ctx.may_declare = true;
  auto s = shape(nullptr);
  EXPECT_EQ(s.result["status"], "success");
  EXPECT_EQ(s.result["agent_state"], json({{"x", 1}}));
  ctx.may_declare = false;
  s = shape(nullptr);
  EXPECT_EQ(s.result["status"], "error");
  EXPECT_TRUE(s.result["agent_state"].is_null());
  EXPECT_NE(s.extra["frame_error"].get<std::string>().find("does not declare agent_state"), std::string::npos);
  EXPECT_TRUE(source_may_declare_agent_state("def f(agent_state):\n    pass\n"));
  EXPECT_FALSE(source_may_declare_agent_state("def f(x):\n    pass\n"));
}

TEST_F(ChannelShaping, MalformedResultIsRefused) {
  const auto ch = sent(false, R"({"results":1,"agent_state":null}{"results":2,"agent_state":null})");
  auto s = shape(&ch);
  EXPECT_EQ(s.result["status"], "error");
  EXPECT_TRUE(s.extra["frame_error"].get<std::string>().starts_with("runner result: "));
}

TEST_F(ChannelShaping, ALargerResultThanTheCapIsAnError) {
  ChannelOutcome ch = sent(false, std::string(1000, ' '));
  ch.result_total = 5000;
  auto s = shape(&ch);
  EXPECT_EQ(s.result["status"], "error");
  EXPECT_EQ(s.result["func_return"],
            "Error executing function f: RuntimeError: the tool's result of 5000 bytes is larger than the policy's "
            "limit of 1000B (limits.result)");
  EXPECT_EQ(s.extra["result_bytes"], 5000);
}

TEST_F(ChannelShaping, StatusZeroWithoutAResultIsSuccessNullAsInLetta) {
  const auto ch = sent(false, "");
  auto s = shape(&ch);
  EXPECT_EQ(s.result["status"], "success");
  EXPECT_TRUE(s.result["func_return"].is_null());
}

TEST_F(ChannelShaping, NoResultIsExplained) {
  const auto ch = sent(false, "");
  run.exit_code = 1;
  auto s = shape(&ch);
  EXPECT_EQ(s.result["status"], "error");
  EXPECT_EQ(s.result["func_return"],
            "Error executing function f: RuntimeError: the tool's process exited with status 1 before returning a result");
  // The exception on stderr wins, as Letta reads it.
  run.stderr_data = "Traceback (most recent call last):\nMemoryError: out of it\n";
  EXPECT_EQ(shape(&ch).result["func_return"], "Error executing function f: MemoryError: out of it");
  // Killed.
  run.stderr_data.clear();
  run.reason = EndReason::Signaled;
  run.exit_code = -1;
  run.signal = 9;
  EXPECT_EQ(shape(&ch).result["func_return"],
            "Error executing function f: RuntimeError: the tool was killed by signal 9 (SIGKILL)");
  // The runner never declared (it could not start): never a success.
  run.reason = EndReason::Exited;
  run.exit_code = 0;
  ChannelOutcome none;
  EXPECT_EQ(shape(&none).result["status"], "error");
  EXPECT_EQ(shape(nullptr).result["status"], "error");
  run.exit_code = 3;
  run.stderr_data = "ToolsandboxRunnerError: cannot read the request: x\n";
  EXPECT_EQ(shape(&none).result["func_return"],
            "Error executing function f: ToolsandboxRunnerError: cannot read the request: x");
}

TEST_F(ChannelShaping, ARaisedErrorIsReadFromStderr) {
  run.exit_code = 1;
  run.stderr_data = "Traceback (most recent call last):\nZeroDivisionError: division by zero\n";
  const auto ch = sent(false, R"({"results":null,"agent_state":null,"error":{"kind":"tool","name":"ZeroDivisionError",)"
                              R"("message":"division by zero","raised":true}})");
  auto s = shape(&ch);
  EXPECT_EQ(s.result["func_return"], "Error executing function f: ZeroDivisionError: division by zero");
  EXPECT_EQ(s.extra["error_kind"], "tool");
}

// A local TypeScript run (both modes): the same channel and table, its
// own framing, and output that is not UTF-8 replaced as E2B hands Letta
// text, never a UnicodeDecodeError.
TEST_F(ChannelShaping, TypeScriptRunsAnswerOnTheChannelInBothModes) {
  ctx.typescript = true;
  run.stdout_data = "bytes \xff\n";
  run.stderr_data = "warn \xfe\n";
  for (bool tool_mode : {true, false}) {
    ctx.tool_mode = tool_mode;
    const auto ch = sent(false, R"({"results":{"a":[1,"x"]},"agent_state":null})");
    auto s = shape(&ch);
    EXPECT_EQ(s.result["status"], "success") << tool_mode;
    EXPECT_EQ(s.result["func_return"], json({{"a", {1, "x"}}}));
    EXPECT_EQ(s.extra["framing"], "typescript-json");
    EXPECT_EQ(s.result["stdout"], json::array({"bytes \xef\xbf\xbd\n"}));
    EXPECT_EQ(s.result["stderr"], json::array({"warn \xef\xbf\xbd\n"}));
    // A thrown error, as E2B's kernel names it.
    run.exit_code = 1;
    const auto err = sent(false, R"({"results":null,"agent_state":null,"error":{"kind":"tool","name":"TypeError",)"
                                 R"("message":"Do not know how to serialize a BigInt"}})");
    EXPECT_EQ(shape(&err).result["func_return"], "Error executing function f: TypeError: Do not know how to serialize a BigInt");
    run.exit_code = 0;
  }
  // Execute never looks for a pickle to decode in a TypeScript run.
  ctx.tool_mode = false;
  run.stdout_data = std::string(tsb::letta::kLegacyStartMarker) + "gASVAgAAAAAAAABLAS4=" + std::string(tsb::letta::kLegacyEndMarker);
  EXPECT_FALSE(pickle_payload_to_decode(ctx, run));
}

// Tool mode's result does not travel through the output: output that is not
// UTF-8 is shown as Python's errors="replace" decode shows it, and the
// result stands (PROTOCOL.md 13.2), also for an error read from stderr.
TEST_F(ChannelShaping, OutputThatIsNotUtf8LeavesTheResult) {
  run.stdout_data = "ok \xff\xfe done\n";
  run.stderr_data = "warn \xe2\x82\n";
  const auto ch = sent(false, R"({"results":1,"agent_state":null})");
  auto s = shape(&ch);
  EXPECT_EQ(s.result["status"], "success");
  EXPECT_EQ(s.result["func_return"], 1);
  EXPECT_EQ(s.result["stdout"], json::array({"ok \uFFFD\uFFFD done\n"}));
  EXPECT_EQ(s.result["stderr"], json::array({"warn \uFFFD\n"}));
  EXPECT_TRUE(s.extra["stdout_invalid_utf8"]);
  EXPECT_TRUE(s.extra["stderr_invalid_utf8"]);
  EXPECT_FALSE(s.extra.contains("utf8_error"));
  run.exit_code = 1;
  run.stderr_data = "\xff\nTraceback (most recent call last):\nValueError: bad \xc3\n";
  const auto raised = sent(false, R"({"results":null,"agent_state":null,"error":{"kind":"tool","name":"ValueError",)"
                                  R"("message":"bad","raised":true}})");
  EXPECT_EQ(shape(&raised).result["func_return"], "Error executing function f: ValueError: bad \uFFFD");
}

// Script mode, the seed's generator and legacy-json (text markers): their
// server decoded stdout, then stderr, strictly (subprocess.run(text=True))
// and raised; a script of neither keeps its output, replaced.
TEST_F(ChannelShaping, TheSeedsScriptsFailOnOutputThatIsNotUtf8) {
  ctx.tool_mode = false;
  ctx.channel = false;
  ctx.generation = letta::ScriptGeneration::kLegacy;
  const std::string frame = std::string(letta::kLegacyStartMarker) + "eyJyZXN1bHRzIjogMX0=" +
                            std::string(letta::kLegacyEndMarker);  // {"results": 1}
  run.stdout_data = "ok \xff\xfe done\n" + frame;
  run.stderr_data = "warn \xe2\x82\n";
  auto s = shape_tool_result(ctx, run);
  const std::string msg = "'utf-8' codec can't decode byte 0xff in position 3: invalid start byte";
  EXPECT_EQ(s.result["status"], "error");
  EXPECT_EQ(s.result["func_return"], "Error executing function f: UnicodeDecodeError: " + msg);
  EXPECT_EQ(s.result["stderr"].back(), "UnicodeDecodeError: " + msg);
  EXPECT_EQ(s.extra["utf8_error"], msg);
  run.stdout_data = frame;  // then stderr's
  EXPECT_EQ(shape_tool_result(ctx, run).extra["utf8_error"],
            "'utf-8' codec can't decode bytes in position 5-6: invalid continuation byte");
  run.stderr_data.clear();
  EXPECT_EQ(shape_tool_result(ctx, run).result["func_return"], 1);
  ctx.generation = letta::ScriptGeneration::kUnknown;
  run.stdout_data = "ok \xff" + frame;
  s = shape_tool_result(ctx, run);
  EXPECT_EQ(s.result["func_return"], 1);
  EXPECT_TRUE(s.extra["stdout_invalid_utf8"]);
}

// A decoded pickle's types (the runner's "types") reach the record as
// record.pickle_types; a malformed list is refused, never passed on.
TEST_F(ChannelShaping, APicklesTypesReachTheRecord) {
  ctx.tool_mode = false;
  ctx.channel = false;
  ctx.generation = letta::ScriptGeneration::kLegacy;
  run.stdout_data = std::string(letta::kLegacyStartMarker) + "gARLAS4=" + std::string(letta::kLegacyEndMarker);
  auto decoded = [](std::string payload) {
    DecodedPickle d;
    auto f = letta::parse_channel_result(payload, "");
    if (f.ok()) d.frame = std::move(f).value();
    else d.failure = f.error().message;
    return d;
  };
  const std::string types = R"([[[],"tuple"],[[1,"1"],"key","int"],[[2],"set","[[1,2]]",[[[0],"tuple"]]],)"
                            R"([[3],"bytes","AP8="]])";
  DecodedPickle d = decoded(R"({"results":[1,{"1":"a"},"{(1, 2)}","b'\\x00\\xff'"],"agent_state":null,"types":)" +
                            types + "}");
  ASSERT_TRUE(d.frame) << d.failure;
  auto s = shape_tool_result(ctx, run, &d);
  EXPECT_EQ(s.result["status"], "success");
  EXPECT_TRUE(s.extra["pickle_decoded"]);
  EXPECT_EQ(s.extra["pickle_types"], json::parse(types));
  EXPECT_FALSE(s.extra.contains("pickle_types_omitted"));
  DecodedPickle omitted = decoded(R"({"results":[1],"agent_state":null,"types_omitted":true})");
  ASSERT_TRUE(omitted.frame);
  EXPECT_TRUE(shape_tool_result(ctx, run, &omitted).extra["pickle_types_omitted"]);
  for (const char* bad : {R"("types":{})", R"("types":[[[],"list"]])", R"("types":[[["a",-1],"tuple"]])",
                          R"("types":[[[],"key","int"]])", R"("types":[[["k"],"key","str"]])",
                          R"("types":[[[],"set","[]",[[[],"nope"]]]])", R"("types":[[[],"bytes",1]])",
                          R"("types_omitted":false)"}) {
    SCOPED_TRACE(bad);
    EXPECT_FALSE(decoded(std::string(R"({"results":1,"agent_state":null,)") + bad + "}").frame);
  }
}

}  // namespace
}  // namespace tsb::core
