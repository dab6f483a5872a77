// A policy's egress rules (policies/README.md, "egress") applied to what a
// request names, before any address is known. The deny list
// (daemon/policy/egress_host.h) applies afterwards, to every address, whatever
// the rules said.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "daemon/frontend/egress/address.h"
#include "daemon/policy/policy.h"

namespace tsb::egress {

// "api.example.com" matches itself only; "*.example.com" matches every name
// below example.com ("a.example.com", "a.b.example.com"), not example.com.
// Both are lower case (the policy and parse_host make them so).
bool name_matches(std::string_view pattern, std::string_view name);

// "" when a rule allows `host` on `port`, else why not (for the tool and
// the audit line). A name is allowed by an allow rule that lists it (or a
// wildcard above it) with the port, or by "public" with the port; an
// address, by "public" only.
std::string rule_refusal(const core::EgressRules& rules, const Host& host, std::uint16_t port);

}  // namespace tsb::egress
