// What an E2B sandbox of a policy may reach, as E2B's control plane takes it
// at creation (POST /sandboxes: "allow_internet_access" and "network", the
// NewSandbox and SandboxNetworkConfig schemas of spec/openapi.yml in
// e2b-dev/infra; docs/E2B.md, "Networks"): pure, no I/O. The E2B backend
// sends exactly `body`, and the policy loader refuses, when the policy is
// read, a policy E2B could only run wider or narrower than it is written.
//
// What E2B can express, and so the mapping:
//   none    allow_internet_access false (E2B: denyOut 0.0.0.0/0).
//   host    allow_internet_access true, no rules: everything E2B allows.
//   egress  allow_internet_access false and network {allowOut, denyOut
//           ["0.0.0.0/0"]}: only what allowOut names. E2B matches a name
//           of allowOut on TCP port 80 by the HTTP Host header and on 443
//           by the TLS SNI, both ports always, no other port, and has no
//           ports of its own; so an allow rule is sent (its hosts: exact
//           names and "*.name" mean the same there) only when its ports
//           are exactly 80 and 443, and "public" (any public destination)
//           as the name wildcard "*" only on exactly those ports. Any
//           other ports are refused with the reason.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "daemon/policy/policy.h"

namespace tsb::core {

struct E2BNetwork {
  // Why E2B cannot run the policy's network as written, naming the rule;
  // "" when it can. `refused_at` is the rule's JSON pointer in the policy
  // document ("/egress/allow/0/ports"), for a located message.
  std::string refusal;
  std::string refused_at;

  bool internet = false;               // allow_internet_access
  bool rules = false;                  // "network" is sent (egress)
  std::vector<std::string> allow_out;  // network.allowOut: names, "*.name", "*"; sorted, once each
  std::vector<std::string> deny_out;   // network.denyOut

  // The create body's network members, exactly as sent, and the SHA-256
  // (hex) of their compact dump (keys sorted): the sandbox's
  // tsb_network metadata and part of its reuse key, so that sandboxes
  // created with different rules are never shared.
  nlohmann::json body;
  std::string digest;
};

// E2B's always-deny CIDR for allow_internet_access false ("ALL_TRAFFIC" of
// its SDKs).
inline constexpr const char* kE2BAllTraffic = "0.0.0.0/0";

E2BNetwork e2b_network(const Policy& p);

// The located message of a refusal: "<where>: <refusal>".
std::string e2b_refusal_message(const E2BNetwork& n, const std::string& where);

// What an E2B sandbox of `p` may reach, in lines for `policy explain`
// (without indentation), or the refusal.
std::vector<std::string> e2b_network_lines(const E2BNetwork& n);

}  // namespace tsb::core
