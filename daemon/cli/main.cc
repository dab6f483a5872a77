// toolsandbox: the command line.
//
//   toolsandbox run [options] -- CMD ARGS...   one command through the engine (root)
//   toolsandbox policy check|explain|fingerprint|lint ...
//   toolsandbox venv list|show|gc|build ...     the per-tool venv cache
//   toolsandbox session [options] -- CMD ARGS...  a stdio bridge to a session of the daemon
//   toolsandbox version
//
// Errors in the invocation are one clear line on stderr and exit status 2.
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "daemon/cli/cli.h"
#include "daemon/common/quote.h"

namespace {

void usage(std::FILE* out) {
  std::fputs(
      "usage: toolsandbox run [--policy NAME|FILE] [--timeout S] [--memory SIZE] [--network none|host]\n"
      "                       [--venv DIR] [--bind SRC:DST[:rw]]... [--env NAME=VALUE]... [--stdin FILE|-]\n"
      "                       [--json] [--cgroup-parent PATH] [--state-dir DIR]\n"
      "                       [--seccomp-cache DIR|--no-seccomp-cache] -- CMD [ARGS...]\n"
      "       toolsandbox exec SCRIPT.py [--org ID] [--env NAME=VALUE]... [--timeout S] [--socket PATH] [--json]\n"
      "       toolsandbox call TOOL.py [--args JSON] [--function NAME] [--agent-state FILE] [--org ID] [--json]\n"
      "       toolsandbox status [--socket PATH] [--json]\n"
      "       toolsandbox session [--org ID] [--policy NAME] [--env NAME=VALUE]... [--agent-id ID] [--record FILE]\n"
      "                           [--workspace NAME] [--socket PATH] -- COMMAND [ARGS...]\n"
      "       toolsandbox session list [--json] [--socket PATH] | kill SESSION_OR_WORKSPACE_ID [--socket PATH]   (as root)\n"
      "       toolsandbox session kill --signal HUP|INT|QUIT|USR1|USR2|TERM|WINCH SESSION_ID [--socket PATH]   (its client, or root)\n"
      "       toolsandbox policy check FILE... [--e2b]\n"
      "       toolsandbox policy explain NAME|FILE [--compare PROFILE] [--no-host]\n"
      "       toolsandbox policy fingerprint FILE...\n"
      "       toolsandbox policy lint FILE... [--notes]\n"
      "         (policy verbs also take --config FILE and --bind-allow PATH; see toolsandbox policy help)\n"
      "       toolsandbox venv list|show KEY|gc [--all|--max-bytes SIZE]|build REQUIREMENT... (see toolsandbox venv help)\n"
      "       toolsandbox version\n",
      out);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
    usage(args.empty() ? stderr : stdout);
    return args.empty() ? 2 : 0;
  }
  const std::string verb = args[0];
  args.erase(args.begin());
  if (verb == "run") return tsb::cli::cmd_run(args);
  if (verb == "policy") return tsb::cli::cmd_policy(args);
  if (verb == "venv") return tsb::cli::cmd_venv(args);
  if (verb == "session") return tsb::cli::cmd_session(args);
  if (verb == "exec" || verb == "call" || verb == "status") return tsb::cli::cmd_client(verb, args);
  if (verb == "version" || verb == "--version") {
    tsb::print_line(stdout, "toolsandbox %s", TSB_VERSION);
    return 0;
  }
  tsb::print_line(stderr, "toolsandbox: unknown command '%s' (try 'toolsandbox --help')", verb.c_str());
  return 2;
}
