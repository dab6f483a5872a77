#include <getopt.h>

#include <cstring>

#include "daemon/cli/cli.h"

namespace tsb::cli {

std::optional<std::string> parse_options(const std::vector<std::string>& args, const std::vector<OptionSpec>& specs,
                                         bool operands_after_dashdash_only,
                                         const std::function<std::optional<std::string>(const std::string&, const std::string&)>& on,
                                         std::vector<std::string>* operands) {
  // getopt_long works on a C argv: argv[0] is a placeholder for the verb.
  std::vector<std::string> storage;
  storage.reserve(args.size() + 1);
  storage.emplace_back("toolsandbox");
  storage.insert(storage.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& s : storage) argv.push_back(s.data());
  argv.push_back(nullptr);
  std::vector<option> longopts;
  for (std::size_t i = 0; i < specs.size(); ++i)
    longopts.push_back({specs[i].name, specs[i].value_help ? required_argument : no_argument, nullptr, static_cast<int>(1000 + i)});
  longopts.push_back({nullptr, 0, nullptr, 0});
  // "+": stop at the first operand (a command, then its own options);
  // "-" would hand operands over in order. ":" first: a missing value is
  // ':' (our message), not getopt's own.
  const char* optstring = operands_after_dashdash_only ? "+:" : "-:";
  opterr = 0;
  optind = 0;  // a full re-initialisation (GNU)
  const int argc = static_cast<int>(argv.size() - 1);
  for (int c; (c = ::getopt_long(argc, argv.data(), optstring, longopts.data(), nullptr)) != -1;) {
    if (c == 1) {  // an operand, in place
      operands->push_back(optarg);
      continue;
    }
    const char* arg = argv[optind - 1];
    if (c == ':') {
      for (const auto& s : specs)
        if (std::strncmp(arg + 2, s.name, std::strlen(s.name)) == 0 && s.value_help)
          return std::string("--") + s.name + " needs " + s.value_help;
      return std::string("option '") + arg + "' needs a value";
    }
    if (c == '?') {
      if (std::strchr(arg, '=') && optopt != 0) return std::string("option '") + arg + "' takes no value";
      return std::string("unknown option '") + arg + "'";
    }
    const OptionSpec& s = specs[static_cast<std::size_t>(c - 1000)];
    if (auto err = on(s.name, optarg ? optarg : "")) return err;
  }
  if (operands_after_dashdash_only) {
    // Everything left is an operand, and must follow "--".
    if (optind < argc && std::strcmp(argv[optind - 1], "--") != 0)
      return std::string("unexpected argument '") + argv[optind] + "'";
  }
  for (int i = optind; i < argc; ++i) operands->push_back(argv[i]);
  return std::nullopt;
}

}  // namespace tsb::cli
