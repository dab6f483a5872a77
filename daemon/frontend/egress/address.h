// Where a tool may connect through the egress proxy: what a host in a
// request is and the deny list (pure, shared with the policy language:
// daemon/policy/egress_host.h), and what only this host can answer: its
// own addresses and the addresses its routing table calls local.
#pragma once

#include <netinet/in.h>

#include <vector>

#include "daemon/policy/egress_host.h"

namespace tsb::egress {

// The addresses of this host's interfaces (getifaddrs), for `denied`.
std::vector<Address> host_addresses();

// Whether this network namespace takes `a` as its own (a socket can bind
// to it): its interfaces' addresses and whatever `local` routes cover. An
// address it cannot tell about counts as local.
bool is_local(const Address& a);

Address from_sockaddr(const struct sockaddr* sa);

}  // namespace tsb::egress
