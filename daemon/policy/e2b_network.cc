#include "daemon/policy/e2b_network.h"

#include <algorithm>
#include <set>

#include "daemon/common/hash.h"
#include "daemon/common/quote.h"

namespace tsb::core {
namespace {

using nlohmann::json;

std::string port_list(const std::set<std::uint16_t>& ports) {
  std::string s;
  for (auto port : ports) s += (s.empty() ? "" : ", ") + std::to_string(port);
  return s;
}

// Why E2B cannot run `ports` for names (the ports of an allow rule, or of
// "public"), or "" when it can: E2B matches a name on 80 (the HTTP Host
// header) and 443 (the TLS SNI), always both, and on no other port
// (e2b-dev/infra, packages/orchestrator/pkg/tcpfirewall/: other ports are
// matched by address only).
std::string ports_refusal(const std::set<std::uint16_t>& ports, const std::string& what) {
  std::set<std::uint16_t> other;
  for (auto port : ports)
    if (port != 80 && port != 443) other.insert(port);
  if (!other.empty())
    return what + " cannot run on E2B: E2B allows a destination by name only on ports 80 (HTTP, by its Host "
                  "header) and 443 (TLS, by its SNI), so port" + std::string(other.size() == 1 ? " " : "s ") +
           port_list(other) + " would be refused there (give it ports 80 and 443)";
  if (ports.size() != 2) {
    const char* open = ports.count(80) ? "443" : "80";
    return what + " cannot run on E2B as written: E2B allows a destination by name on ports 80 and 443 together, "
                  "never one of them alone, so port " + std::string(open) +
           " would be open too, wider than the rule (give it ports 80 and 443)";
  }
  return "";
}

std::string hosts_list(const std::vector<std::string>& hosts) {
  std::string s;
  for (const auto& h : hosts) s += (s.empty() ? "" : ", ") + quoted_for_message(h);
  return s;
}

}  // namespace

E2BNetwork e2b_network(const Policy& p) {
  E2BNetwork n;
  if (p.network == isolate::NetworkMode::Host) {
    n.internet = true;
  } else if (p.network == isolate::NetworkMode::Egress) {
    n.rules = true;
    std::set<std::string> names;
    for (std::size_t i = 0; i < p.egress.allow.size() && n.refusal.empty(); ++i) {
      const auto& rule = p.egress.allow[i];
      const std::set<std::uint16_t> ports(rule.ports.begin(), rule.ports.end());
      n.refusal = ports_refusal(ports, "egress allow[" + std::to_string(i) + "] (hosts " + hosts_list(rule.hosts) +
                                           ", ports " + port_list(ports) + ")");
      if (!n.refusal.empty()) n.refused_at = "/egress/allow/" + std::to_string(i) + "/ports";
      names.insert(rule.hosts.begin(), rule.hosts.end());
    }
    if (n.refusal.empty() && !p.egress.public_ports.empty()) {
      const std::set<std::uint16_t> ports(p.egress.public_ports.begin(), p.egress.public_ports.end());
      n.refusal = ports_refusal(ports, "egress public (ports " + port_list(ports) + ")");
      if (!n.refusal.empty()) n.refused_at = "/egress/public/ports";
      names.insert("*");  // E2B's name wildcard: any name
    }
    n.allow_out.assign(names.begin(), names.end());
    // Everything allowOut does not name: by address, by a name on any
    // other port, UDP (E2B adds its resolver 8.8.8.8 when allowOut has
    // names), ICMP.
    n.deny_out = {kE2BAllTraffic};
  }
  if (!n.refusal.empty()) {
    n.allow_out.clear();
    n.deny_out.clear();
    return n;
  }
  // allow_internet_access false with rules as well: an E2B that ignored
  // "network" would then give no internet, never all of it.
  n.body = {{"allow_internet_access", n.internet}};
  if (n.rules) n.body["network"] = {{"allowOut", n.allow_out}, {"denyOut", n.deny_out}};
  n.digest = sha256_hex(n.body.dump());
  return n;
}

std::string e2b_refusal_message(const E2BNetwork& n, const std::string& where) {
  return where.empty() ? n.refusal : where + ": " + n.refusal;
}

std::vector<std::string> e2b_network_lines(const E2BNetwork& n) {
  if (!n.refusal.empty()) return {"! refused: " + n.refusal};
  std::vector<std::string> lines;
  lines.push_back("sent           " + n.body.dump());
  lines.push_back("reuse key      tsb_network " + n.digest);
  if (n.internet) {
    lines.push_back("! reach        the whole internet, every port and protocol, as E2B allows it (E2B refuses its");
    lines.push_back("               own internal ranges: private, CGNAT, loopback, link-local)");
  } else if (!n.rules) {
    lines.push_back("reach          nothing outside the sandbox");
  } else if (n.allow_out.empty()) {
    lines.push_back("reach          nothing outside the sandbox (no allow rule, no public)");
  } else {
    std::string names;
    for (const auto& h : n.allow_out) names += (names.empty() ? "" : ", ") + (h == "*" ? std::string("any name") : h);
    lines.push_back("reach          by name, on TCP ports 80 (HTTP Host header) and 443 (TLS SNI) only: " + names);
    lines.push_back("               E2B connects to the name itself and refuses private, CGNAT, loopback and");
    lines.push_back("               link-local addresses; nothing by address but E2B's resolver 8.8.8.8 (any");
    lines.push_back("               port and protocol); max_connections and max_bytes are not enforced there");
  }
  return lines;
}

}  // namespace tsb::core
