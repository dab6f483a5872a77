#include "daemon/frontend/egress/rules.h"

#include <algorithm>

namespace tsb::egress {

bool name_matches(std::string_view pattern, std::string_view name) {
  if (!pattern.starts_with("*.")) return pattern == name;
  const std::string_view parent = pattern.substr(1);  // ".example.com"
  return name.size() > parent.size() && name.ends_with(parent);
}

std::string rule_refusal(const core::EgressRules& rules, const Host& host, std::uint16_t port) {
  const auto has = [port](const std::vector<std::uint16_t>& ports) {
    return std::find(ports.begin(), ports.end(), port) != ports.end();
  };
  if (has(rules.public_ports)) return "";
  if (host.kind == Host::kName) {
    bool named = false;
    for (const auto& r : rules.allow)
      for (const auto& pattern : r.hosts)
        if (name_matches(pattern, host.name)) {
          if (has(r.ports)) return "";
          named = true;
        }
    if (named) return "port " + std::to_string(port) + " of " + host.name + " is not allowed by the policy";
    return host.name + " is not allowed by the policy";
  }
  if (host.kind == Host::kAddress)
    return "an address (" + host.address.text() + ") is allowed only by the policy's \"public\" rule" +
           (rules.public_ports.empty() ? std::string() : ", on its ports");
  return "not a host";
}

}  // namespace tsb::egress
