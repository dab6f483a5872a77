#include "daemon/policy/egress_host.h"

#include <arpa/inet.h>

#include <cctype>
#include <cstring>
#include <optional>

namespace tsb::egress {
namespace {

// One part of an inet_aton-style IPv4 address: decimal, octal (leading 0)
// or hex (0x), at most `max`.
std::optional<std::uint64_t> number_part(std::string_view p, std::uint64_t max) {
  if (p.empty()) return std::nullopt;
  unsigned base = 10;
  if (p.size() > 1 && p[0] == '0' && (p[1] == 'x' || p[1] == 'X')) {
    base = 16;
    p.remove_prefix(2);
    if (p.empty()) return std::nullopt;
  } else if (p.size() > 1 && p[0] == '0') {
    base = 8;
    p.remove_prefix(1);
  }
  std::uint64_t v = 0;
  for (char c : p) {
    unsigned d;
    if (c >= '0' && c <= '9') d = static_cast<unsigned>(c - '0');
    else if (base == 16 && std::isxdigit(static_cast<unsigned char>(c))) d = static_cast<unsigned>(std::tolower(c) - 'a' + 10);
    else return std::nullopt;
    if (d >= base) return std::nullopt;
    v = v * base + d;
    if (v > max) return std::nullopt;
  }
  return v;
}

std::optional<Address> ipv4_any_form(std::string_view s) {
  std::vector<std::string_view> parts;
  for (std::size_t pos = 0;;) {
    const std::size_t dot = s.find('.', pos);
    parts.push_back(s.substr(pos, dot == std::string_view::npos ? std::string_view::npos : dot - pos));
    if (dot == std::string_view::npos) break;
    pos = dot + 1;
  }
  if (parts.size() > 4) return std::nullopt;
  std::uint32_t v = 0;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    const bool last = i + 1 == parts.size();
    // The last part fills every byte the earlier ones did not.
    const std::uint64_t max = last ? (0xFFFFFFFFull >> (8 * (parts.size() - 1))) : 255;
    auto n = number_part(parts[i], max);
    if (!n) return std::nullopt;
    if (last) v |= static_cast<std::uint32_t>(*n);
    else v |= static_cast<std::uint32_t>(*n) << (8 * (3 - i));
  }
  Address a;
  for (int i = 0; i < 4; ++i) a.bytes[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(v >> (8 * (3 - i)));
  return a;
}

bool valid_name(std::string_view n) {
  if (n.empty() || n.size() > 253) return false;
  for (std::size_t pos = 0; pos <= n.size();) {
    std::size_t dot = n.find('.', pos);
    if (dot == std::string_view::npos) dot = n.size();
    std::string_view label = n.substr(pos, dot - pos);
    if (label.empty() || label.size() > 63 || label.front() == '-' || label.back() == '-') return false;
    for (char c : label)
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_') return false;
    pos = dot + 1;
  }
  return true;
}

struct Range {
  std::uint8_t net[16];
  unsigned prefix;
  std::string_view why;
};

bool in(const Address& a, const std::uint8_t* net, unsigned prefix) {
  for (unsigned bit = 0; bit < prefix; ++bit) {
    const unsigned byte = bit / 8, mask = 0x80u >> (bit % 8);
    if ((a.bytes[byte] & mask) != (net[byte] & mask)) return false;
  }
  return true;
}

constexpr Range kV4[] = {
    {{0}, 8, "unspecified (0.0.0.0/8)"},
    {{10}, 8, "a private network (RFC 1918)"},
    {{100, 64}, 10, "shared address space (CGNAT 100.64/10)"},
    {{127}, 8, "loopback"},
    {{168, 63, 129, 16}, 32, "a cloud platform's host service (Azure's WireServer, 168.63.129.16)"},
    {{169, 254}, 16, "link-local (169.254/16: the cloud metadata service)"},
    {{172, 16}, 12, "a private network (RFC 1918)"},
    {{192, 0, 0}, 24, "IETF protocol assignments (192.0.0/24)"},
    {{192, 168}, 16, "a private network (RFC 1918)"},
    {{198, 18}, 15, "benchmarking (198.18/15)"},
    {{224}, 4, "multicast"},
    {{240}, 4, "reserved (240/4, broadcast)"},
};

constexpr Range kV6[] = {
    {{0}, 128, "unspecified (::)"},
    {{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}, 128, "loopback (::1)"},
    {{0}, 96, "IPv4-compatible (::/96, deprecated)"},
    {{0, 0x64, 0xff, 0x9b, 0, 1}, 48, "local-use NAT64 (64:ff9b:1::/48)"},
    {{1}, 64, "discard-only (100::/64)"},
    {{0x20, 0x01, 0, 0}, 32, "Teredo (2001::/32)"},
    {{0xfc}, 7, "a private network (ULA fc00::/7)"},
    {{0xfe, 0x80}, 10, "link-local (fe80::/10)"},
    {{0xfe, 0xc0}, 10, "site-local (fec0::/10, deprecated)"},
    {{0xff}, 8, "multicast"},
};

}  // namespace

Address unwrap_mapped(Address a) {
  static constexpr std::uint8_t kMapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  if (!a.v6 || std::memcmp(a.bytes.data(), kMapped, 12) != 0) return a;
  Address v4;
  std::memcpy(v4.bytes.data(), a.bytes.data() + 12, 4);
  return v4;
}

std::string Address::text() const {
  char buf[INET6_ADDRSTRLEN] = {};
  ::inet_ntop(v6 ? AF_INET6 : AF_INET, bytes.data(), buf, sizeof buf);
  return buf;
}

Host parse_host(std::string_view text) {
  Host h;
  if (text.size() > 2 && text.front() == '[' && text.back() == ']') {
    const std::string inner(text.substr(1, text.size() - 2));
    Address a;
    a.v6 = true;
    if (inner.find('%') != std::string::npos || ::inet_pton(AF_INET6, inner.c_str(), a.bytes.data()) != 1) return h;
    h.kind = Host::kAddress;
    h.address = unwrap_mapped(a);
    return h;
  }
  std::string name(text);
  if (!name.empty() && name.back() == '.') name.pop_back();
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  // A name whose last label starts with a digit is read as an IPv4 address
  // by resolvers and browsers ("127.1", "0x7f.1", "2130706433"): it is
  // one here too, or nothing.
  const std::size_t last = name.rfind('.');
  const std::string_view tail = std::string_view(name).substr(last == std::string::npos ? 0 : last + 1);
  if (!tail.empty() && std::isdigit(static_cast<unsigned char>(tail.front()))) {
    if (auto a = ipv4_any_form(name)) {
      h.kind = Host::kAddress;
      h.address = *a;
    }
    return h;
  }
  if (!valid_name(name)) return h;
  h.kind = Host::kName;
  h.name = std::move(name);
  return h;
}

std::string_view denied(const Address& in_a, const std::vector<Address>& host_addresses) {
  const Address a = unwrap_mapped(in_a);
  for (const Address& h : host_addresses)
    if (unwrap_mapped(h) == a) return "an address of the daemon's own host";
  if (!a.v6) {
    for (const Range& r : kV4)
      if (in(a, r.net, r.prefix)) return r.why;
    return {};
  }
  for (const Range& r : kV6)
    if (in(a, r.net, r.prefix)) return r.why;
  // Forms that carry an IPv4 address: NAT64 (64:ff9b::/96) and
  // IPv4-translated (::ffff:0:0/96, SIIT) in the last four bytes, 6to4
  // (2002::/16) in bytes 2 to 5.
  static constexpr std::uint8_t kNat64[16] = {0, 0x64, 0xff, 0x9b};
  static constexpr std::uint8_t kTranslated[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0, 0};
  static constexpr std::uint8_t k6to4[16] = {0x20, 0x02};
  const bool six_to_four = in(a, k6to4, 16);
  if (in(a, kNat64, 96) || in(a, kTranslated, 96) || six_to_four) {
    Address v4;
    std::memcpy(v4.bytes.data(), a.bytes.data() + (six_to_four ? 2 : 12), 4);
    if (!denied(v4, host_addresses).empty()) return "an IPv6 form (NAT64, IPv4-translated or 6to4) of a denied IPv4 address";
  }
  return {};
}

}  // namespace tsb::egress
