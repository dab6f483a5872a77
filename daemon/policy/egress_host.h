// What a host is to the egress proxy, and which addresses no rule can
// allow (the deny list): pure, no I/O. The proxy (daemon/frontend/egress/)
// applies it to every request and every address it would connect to; the
// policy language applies the same functions to the hosts a policy names
// (an egress rule's hosts, a package index), so that `toolsandbox policy
// check` refuses what the proxy would refuse at run time, for the same
// reason, instead of a policy that loads and then never works.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tsb::egress {

// An IPv4 or IPv6 address, in network byte order; IPv4 is kept as such,
// never as an IPv4-mapped IPv6 address (those are unwrapped).
struct Address {
  bool v6 = false;
  std::array<std::uint8_t, 16> bytes{};  // IPv4: the first 4

  std::string text() const;  // "10.0.0.1", "2001:db8::1"
  bool operator==(const Address&) const = default;
};

// An IPv4-mapped IPv6 address (::ffff:a.b.c.d) as the IPv4 address it is;
// any other address as it is.
Address unwrap_mapped(Address a);

// A host as a request names it: an address (any spelling a resolver or a
// browser would take, normalised), or a DNS name (lower case, no trailing
// dot), or nothing valid.
struct Host {
  enum Kind { kInvalid, kName, kAddress } kind = kInvalid;
  std::string name;  // kName
  Address address;   // kAddress
};

// Reads the host part of a request target. IPv4 in every form inet_aton
// accepts: dotted with one to four parts, each decimal, octal (leading 0)
// or hex (0x): "127.0.0.1", "2130706433", "0x7f000001", "0177.1",
// "127.1". IPv6 only in brackets ("[::1]", "[::ffff:127.0.0.1]"), no zone.
// A name must be a valid DNS name (labels of letters, digits and hyphens,
// 1-63 bytes each, 253 in all); one that is all digits and dots, or that a
// resolver would read as a number, is refused rather than resolved.
Host parse_host(std::string_view text);

// Why no rule can allow a connection to `a`, or "" when none: loopback,
// unspecified, private networks (RFC 1918, CGNAT 100.64/10, ULA fc00::/7),
// link-local (169.254/16: the metadata service; fe80::/10), multicast,
// reserved and broadcast, a cloud platform's host service (Azure's
// 168.63.129.16), the host's own addresses (`host_addresses`: the proxy
// passes this host's; the policy language, which knows no host, none), and
// any IPv6 form that carries one of these IPv4 addresses (IPv4-mapped,
// IPv4-compatible, IPv4-translated ::ffff:0:0/96, NAT64 64:ff9b::/96, 6to4
// 2002::/16; Teredo 2001::/32 altogether).
std::string_view denied(const Address& a, const std::vector<Address>& host_addresses);

}  // namespace tsb::egress
