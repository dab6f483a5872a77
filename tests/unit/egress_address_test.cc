// The egress proxy's reading of hosts and its deny list
// (daemon/frontend/egress/address.h): every spelling of an address is the address,
// and no spelling of a denied one gets through.
#include <gtest/gtest.h>

#include "daemon/frontend/egress/address.h"

namespace {

using tsb::egress::Address;
using tsb::egress::Host;
using tsb::egress::parse_host;

std::string address_of(std::string_view text) {
  Host h = parse_host(text);
  return h.kind == Host::kAddress ? h.address.text() : (h.kind == Host::kName ? "name:" + h.name : "invalid");
}

std::string_view why(std::string_view text, const std::vector<Address>& host = {}) {
  Host h = parse_host(text);
  EXPECT_EQ(h.kind, Host::kAddress) << text;
  return tsb::egress::denied(h.address, host);
}

}  // namespace

TEST(EgressHost, EveryIpv4SpellingIsTheAddress) {
  for (const char* s : {"127.0.0.1", "2130706433", "0x7f000001", "0X7F000001", "0177.0.0.1", "0177.0.0.01", "127.1",
                        "127.0.1", "0x7f.1", "017700000001", "127.0.0.1.", "[::ffff:127.0.0.1]", "[::ffff:7f00:1]"})
    EXPECT_EQ(address_of(s), "127.0.0.1") << s;
  EXPECT_EQ(address_of("169.254.169.254"), "169.254.169.254");
  EXPECT_EQ(address_of("0xa9fea9fe"), "169.254.169.254");
  EXPECT_EQ(address_of("2852039166"), "169.254.169.254");
  EXPECT_EQ(address_of("0251.0376.0251.0376"), "169.254.169.254");
  EXPECT_EQ(address_of("10.1"), "10.0.0.1");
  EXPECT_EQ(address_of("0"), "0.0.0.0");
  EXPECT_EQ(address_of("198.51.100.7"), "198.51.100.7");
}

TEST(EgressHost, NumbersThatAreNotAddressesAreRefusedNotResolved) {
  for (const char* s : {"256.0.0.1", "1.2.3.4.5", "4294967296", "0x", "08.0.0.1", "1..2", "127.0.0.0x1g",
                        "example.123", "example.0x10", "1.2.3.256", "[::1%lo]", "[1.2.3.4]", "::1", "[]", ""})
    EXPECT_EQ(address_of(s), "invalid") << s;
}

TEST(EgressHost, NamesAreLowerCaseDnsNames) {
  EXPECT_EQ(address_of("API.Example.COM"), "name:api.example.com");
  EXPECT_EQ(address_of("example.com."), "name:example.com");
  EXPECT_EQ(address_of("localhost"), "name:localhost");
  EXPECT_EQ(address_of("a-b.example"), "name:a-b.example");
  const std::vector<std::string> bad = {"-a.example", "a-.example", "a..b", "a b", "a/b", "a:80", "a@b",
                                        std::string(64, 'a') + ".example"};
  for (const auto& s : bad) EXPECT_EQ(address_of(s), "invalid") << s;
}

TEST(EgressDeny, EveryDeniedRangeInEveryForm) {
  for (const char* s : {"127.0.0.1", "127.255.0.1", "0.0.0.0", "10.1.2.3", "172.16.0.1", "172.31.255.255",
                        "192.168.1.1", "100.64.0.1", "100.127.255.255", "169.254.169.254", "224.0.0.1",
                        "239.255.255.250", "255.255.255.255", "240.0.0.1", "198.18.0.1", "192.0.0.8", "2130706433",
                        "0xa9fea9fe", "[::1]", "[::]", "[fe80::1]", "[fc00::1]", "[fd12:3456::1]", "[ff02::1]",
                        "[::ffff:10.0.0.1]", "[::ffff:169.254.169.254]", "[::127.0.0.1]", "[64:ff9b::a9fe:a9fe]",
                        "[64:ff9b::7f00:1]", "[2002:7f00:1::]", "[2002:a9fe:a9fe::1]", "[2001::1]",
                        "[64:ff9b:1::1]", "[fec0::1]", "168.63.129.16", "[::ffff:0:a00:1]", "[::ffff:0:a9fe:a9fe]"})
    EXPECT_FALSE(why(s).empty()) << s << " is not denied";
}

TEST(EgressDeny, PublicAddressesAreNotDenied) {
  for (const char* s : {"198.51.100.7", "203.0.113.9", "192.0.2.1", "8.8.8.8", "1.1.1.1", "172.15.255.255",
                        "172.32.0.1", "100.63.255.255", "100.128.0.1", "169.253.0.1", "[2001:db8::7]",
                        "[2606:4700::1111]", "[64:ff9b::808:808]", "[2002:808:808::1]", "168.63.129.17",
                        "[::ffff:0:808:808]"})
    EXPECT_TRUE(why(s).empty()) << s << " is denied: " << why(s);
}

TEST(EgressDeny, TheHostsOwnAddressesAreDenied) {
  Host pub = parse_host("198.51.100.7");
  EXPECT_TRUE(tsb::egress::denied(pub.address, {}).empty());
  EXPECT_EQ(tsb::egress::denied(pub.address, {pub.address}), "an address of the daemon's own host");
  Host mapped = parse_host("[::ffff:198.51.100.7]");
  EXPECT_FALSE(tsb::egress::denied(mapped.address, {pub.address}).empty());
  EXPECT_FALSE(tsb::egress::host_addresses().empty()) << "even a namespace of its own has lo";
}

TEST(EgressDeny, WhatTheNetworkNamespaceTakesAsItsOwnIsLocal) {
  EXPECT_TRUE(tsb::egress::is_local(parse_host("127.0.0.1").address));
  EXPECT_TRUE(tsb::egress::is_local(parse_host("127.3.4.5").address)) << "127/8 is one local route";
  EXPECT_TRUE(tsb::egress::is_local(parse_host("[::1]").address));
  EXPECT_FALSE(tsb::egress::is_local(parse_host("198.51.100.77").address));
  EXPECT_FALSE(tsb::egress::is_local(parse_host("[2001:db8::77]").address));
}
