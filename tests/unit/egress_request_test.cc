// What the egress proxy reads from a tool (daemon/frontend/egress/request.h) and the
// policy's rules applied to it (daemon/frontend/egress/rules.h).
#include <gtest/gtest.h>

#include "daemon/frontend/egress/request.h"
#include "daemon/frontend/egress/rules.h"

namespace {

using tsb::egress::head_end;
using tsb::egress::Host;
using tsb::egress::parse_host;
using tsb::egress::parse_request;

std::string refusal(std::string_view head) {
  auto r = parse_request(head);
  return r.ok() ? "" : r.error().message;
}

tsb::core::EgressRules rules_for(std::vector<std::string> hosts, std::vector<std::uint16_t> ports,
                                 std::vector<std::uint16_t> public_ports = {}) {
  tsb::core::EgressRules r;
  r.allow.push_back({std::move(hosts), std::move(ports)});
  r.public_ports = std::move(public_ports);
  return r;
}

}  // namespace

TEST(EgressRequest, HeadEndsAtTheBlankLine) {
  EXPECT_EQ(head_end("GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\nbody"), 35u);
  EXPECT_EQ(head_end("CONNECT a:443 HTTP/1.1\n\n"), 24u);
  EXPECT_EQ(head_end("GET http://a/ HTTP/1.1\r\nHost: a\r\n"), 0u);
  EXPECT_EQ(head_end(""), 0u);
  // Resumed where the last call stopped, a line end cut between reads included.
  const std::string h = "GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n";
  for (std::size_t cut = 0; cut <= h.size(); ++cut)
    EXPECT_EQ(head_end(h, cut), h.size()) << "searched before: " << cut;
  EXPECT_EQ(head_end("GET http://a/ HTTP/1.1\n\n", 20), 24u);
}

TEST(EgressRequest, ConnectNamesHostAndPort) {
  auto r = parse_request("CONNECT API.Example.com:443 HTTP/1.1\r\nHost: api.example.com:443\r\n\r\n");
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_TRUE(r->tunnel);
  EXPECT_EQ(r->host.kind, Host::kName);
  EXPECT_EQ(r->host.name, "api.example.com");
  EXPECT_EQ(r->port, 443);
  EXPECT_TRUE(r->upstream_head.empty());

  auto v6 = parse_request("CONNECT [2001:db8::7]:8443 HTTP/1.1\r\n\r\n");
  ASSERT_TRUE(v6.ok()) << v6.error().message;
  EXPECT_EQ(v6->host.kind, Host::kAddress);
  EXPECT_EQ(v6->host.address.text(), "2001:db8::7");
  EXPECT_EQ(v6->port, 8443);

  auto spelled = parse_request("CONNECT 0x7f.1:80 HTTP/1.1\r\n\r\n");
  ASSERT_TRUE(spelled.ok());
  EXPECT_EQ(spelled->host.address.text(), "127.0.0.1") << "every spelling is the address it means";
  EXPECT_EQ(spelled->host_text, "0x7f.1") << "the audit line keeps what the tool wrote";
}

TEST(EgressRequest, AbsoluteFormIsSentOnInOriginForm) {
  auto r = parse_request(
      "POST http://Example.test:8080/a/b?q=1#frag HTTP/1.1\r\n"
      "Host: elsewhere.test\r\n"
      "Proxy-Connection: keep-alive\r\n"
      "Proxy-Authorization: Basic eDp5\r\n"
      "Connection: keep-alive, X-Hop\r\n"
      "X-Hop: 1\r\n"
      "Content-Length: 4\r\n"
      "User-Agent: t\r\n\r\n");
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_FALSE(r->tunnel);
  EXPECT_EQ(r->host.name, "example.test");
  EXPECT_EQ(r->port, 8080);
  EXPECT_EQ(r->upstream_head,
            "POST /a/b?q=1 HTTP/1.1\r\n"
            "Host: example.test:8080\r\n"
            "Content-Length: 4\r\n"
            "User-Agent: t\r\n"
            "Connection: close\r\n\r\n")
      << "Host comes from the target (RFC 9112 3.2.2); hop-by-hop and proxy fields are dropped";

  auto bare = parse_request("GET http://example.test HTTP/1.0\r\n\r\n");
  ASSERT_TRUE(bare.ok());
  EXPECT_EQ(bare->port, 80);
  EXPECT_EQ(bare->upstream_head, "GET / HTTP/1.0\r\nHost: example.test\r\nConnection: close\r\n\r\n");

  auto query = parse_request("GET http://[2001:db8::1]?x HTTP/1.1\r\n\r\n");
  ASSERT_TRUE(query.ok());
  EXPECT_EQ(query->upstream_head, "GET /?x HTTP/1.1\r\nHost: [2001:db8::1]\r\nConnection: close\r\n\r\n");
}

TEST(EgressRequest, EverythingElseIsRefusedWithAReason) {
  EXPECT_NE(refusal("GET / HTTP/1.1\r\nHost: a\r\n\r\n").find("names its destination"), std::string::npos);
  EXPECT_NE(refusal("GET https://a.test/ HTTP/1.1\r\n\r\n").find("CONNECT"), std::string::npos);
  EXPECT_NE(refusal("GET http://allowed.test@evil.test/ HTTP/1.1\r\n\r\n").find("user information"), std::string::npos);
  EXPECT_NE(refusal("CONNECT a.test HTTP/1.1\r\n\r\n").find("port"), std::string::npos) << "CONNECT needs a port";
  for (const char* head : {
           "CONNECT a.test:0 HTTP/1.1\r\n\r\n",
           "CONNECT a.test:65536 HTTP/1.1\r\n\r\n",
           "CONNECT a.test:+80 HTTP/1.1\r\n\r\n",
           "CONNECT a.test: HTTP/1.1\r\n\r\n",
           "CONNECT ::1:443 HTTP/1.1\r\n\r\n",
           "CONNECT [::1:443 HTTP/1.1\r\n\r\n",
           "CONNECT [::1]x:443 HTTP/1.1\r\n\r\n",
           "CONNECT 256.1.1.1:443 HTTP/1.1\r\n\r\n",
           "CONNECT a_b..c:443 HTTP/1.1\r\n\r\n",
           "CONNECT a.test:443 HTTP/2\r\n\r\n",
           "CONNECT  a.test:443 HTTP/1.1\r\n\r\n",
           "GET http://a.test/ HTTP/1.1 extra\r\n\r\n",
           "G(T http://a.test/ HTTP/1.1\r\n\r\n",
           "GET http://a.test/ HTTP/1.1\r\n folded\r\n\r\n",
           "GET http://a.test/ HTTP/1.1\r\nNo colon\r\n\r\n",
           "GET http://a.test/ HTTP/1.1\r\nBad\rField: x\r\n\r\n",
           "GET http:///x HTTP/1.1\r\n\r\n",
           "\r\n\r\n",
       })
    EXPECT_FALSE(refusal(head).empty()) << head;
  EXPECT_FALSE(refusal(std::string("GET http://a.test/ HTTP/1.1\r\nX: a\0b\r\n\r\n", 39)).empty()) << "a NUL";
  for (const char* ctl : {"\x01", "\x0b", "\x1b", "\x7f"}) {
    EXPECT_NE(refusal(std::string("GET http://a.test/ HTTP/1.1\r\nX: a") + ctl + "b\r\n\r\n").find("control characters"),
              std::string::npos);
    EXPECT_NE(refusal(std::string("GET http://a.test/") + ctl + " HTTP/1.1\r\n\r\n").find("control characters"),
              std::string::npos);
  }
  EXPECT_TRUE(refusal("GET http://a.test/ HTTP/1.1\r\nX: a\tb\r\n\r\n").empty()) << "a tab is text";
  // A long authority is named, cut, in the reason (which goes to an audit line).
  EXPECT_LT(refusal("GET http://a:" + std::string(30000, 'b') + ":1/ HTTP/1.1\r\n\r\n").size(), 400u);
}

TEST(EgressRequest, OneRequestPerConnectionItsBodyAsLongAsContentLengthSays) {
  auto r = parse_request("POST http://a.test/ HTTP/1.1\r\nContent-Length: 12\r\nConnection: Content-Length, X\r\n\r\n");
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->body_length, 12u);
  EXPECT_NE(r->upstream_head.find("Content-Length: 12\r\n"), std::string::npos)
      << "Connection cannot drop the body's length while the body goes on: " << r->upstream_head;
  auto none = parse_request("GET http://a.test/ HTTP/1.1\r\n\r\n");
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->body_length, 0u);
  auto same = parse_request("POST http://a.test/ HTTP/1.1\r\nContent-Length: 3\r\ncontent-length: 3\r\n\r\n");
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(same->body_length, 3u);
  EXPECT_NE(refusal("POST http://a.test/ HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n").find("two different"),
            std::string::npos);
  for (const char* bad : {"-1", "1e3", "", "0x10", "1 2", "1234567890123456"})
    EXPECT_NE(refusal(std::string("POST http://a.test/ HTTP/1.1\r\nContent-Length: ") + bad + "\r\n\r\n").find("not a number"),
              std::string::npos)
        << bad;
  EXPECT_NE(refusal("POST http://a.test/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n").find("Transfer-Encoding"),
            std::string::npos);
  auto tunnel = parse_request("CONNECT a.test:443 HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n");
  EXPECT_TRUE(tunnel.ok()) << "a tunnel's head has no body: its fields are not read";
}

TEST(EgressRules, WildcardsMatchNamesBelowOnly) {
  using tsb::egress::name_matches;
  EXPECT_TRUE(name_matches("api.example.com", "api.example.com"));
  EXPECT_FALSE(name_matches("api.example.com", "x.api.example.com"));
  EXPECT_TRUE(name_matches("*.example.com", "a.example.com"));
  EXPECT_TRUE(name_matches("*.example.com", "a.b.example.com"));
  EXPECT_FALSE(name_matches("*.example.com", "example.com"));
  EXPECT_FALSE(name_matches("*.example.com", "badexample.com"));
  EXPECT_FALSE(name_matches("*.example.com", "example.com.evil.test"));
}

TEST(EgressRules, NamesNeedARuleWithThePortAddressesNeedPublic) {
  using tsb::egress::rule_refusal;
  const auto r = rules_for({"api.example.com", "*.cdn.test"}, {443});
  EXPECT_EQ(rule_refusal(r, parse_host("api.example.com"), 443), "");
  EXPECT_EQ(rule_refusal(r, parse_host("x.cdn.test"), 443), "");
  EXPECT_NE(rule_refusal(r, parse_host("api.example.com"), 80).find("port 80"), std::string::npos);
  EXPECT_NE(rule_refusal(r, parse_host("other.test"), 443).find("not allowed"), std::string::npos);
  EXPECT_NE(rule_refusal(r, parse_host("198.51.100.7"), 443).find("\"public\""), std::string::npos)
      << "an address never matches a name rule";

  const auto pub = rules_for({}, {}, {80, 443});
  EXPECT_EQ(rule_refusal(pub, parse_host("anything.test"), 443), "");
  EXPECT_EQ(rule_refusal(pub, parse_host("198.51.100.7"), 80), "") << "the deny list decides the address";
  EXPECT_NE(rule_refusal(pub, parse_host("anything.test"), 22), "");
  EXPECT_NE(rule_refusal(tsb::core::EgressRules{}, parse_host("a.test"), 443), "") << "no rule, nothing allowed";
}

TEST(EgressRequest, TheResponseSaysTheConnectionCloses) {
  using tsb::egress::rewrite_response_head;
  auto r = rewrite_response_head("HTTP/1.1 302 Found\r\nLocation: /x\r\nConnection: keep-alive\r\nKeep-Alive: timeout=5\r\n"
                                 "Content-Length: 0\r\n\r\n");
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_FALSE(r->informational);
  EXPECT_EQ(r->head, "HTTP/1.1 302 Found\r\nLocation: /x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
  auto bare = rewrite_response_head("HTTP/1.0 200\n\n");
  ASSERT_TRUE(bare.ok());
  EXPECT_EQ(bare->head, "HTTP/1.0 200\r\nConnection: close\r\n\r\n");
  auto cont = rewrite_response_head("HTTP/1.1 100 Continue\r\n\r\n");
  ASSERT_TRUE(cont.ok());
  EXPECT_TRUE(cont->informational);
  EXPECT_EQ(cont->head, "HTTP/1.1 100 Continue\r\n\r\n") << "another head follows: that one closes";
  for (const char* bad : {"", "\r\n", "HTTP/2 200\r\n\r\n", "SSH-2.0-x\r\n\r\n", "HTTP/1.1 2000 x\r\n\r\n", "HTTP/1.1 20x\r\n\r\n",
                          "HTTP/1.1 200 OK\r\n folded: onto the status line\r\n\r\n"})
    EXPECT_FALSE(rewrite_response_head(bad).ok()) << bad;
}

// Obsolete line folding: a continuation goes with its field. One after a
// dropped Connection field is dropped with it (kept, it would have folded
// onto the field before, or stood as a field of its own); one after a
// kept field is joined to it with a space.
TEST(EgressResponse, FoldedLinesGoWithTheirField) {
  using tsb::egress::rewrite_response_head;
  auto r = rewrite_response_head("HTTP/1.1 200 OK\r\nX-A: 1\r\nConnection: keep-alive,\r\n Upgrade\r\n\tX-Forged: yes\r\n"
                                 "X-B: two\r\n  parts\r\nContent-Length: 0\r\n\r\n");
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->head, "HTTP/1.1 200 OK\r\nX-A: 1\r\nX-B: two parts\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
}

// A refusal's reason carries the host a tool wrote, and reaches the audit
// line, the tool's answer and, for a venv build, the build's error that
// its client sees. Control characters below 0x20 end the head at once
// (above); what passes them (C1 controls such as U+009B, a terminal's CSI,
// bidirectional controls, bytes that are not UTF-8) is quoted and escaped
// in the reason, never written raw.
TEST(EgressRequest, AHostileHostIsQuotedInTheRefusal) {
  for (const std::string target : {std::string("evil\xc2\x9b" "2J.test\xff:443"), std::string("a\xe2\x80\xae::1:443")}) {
    const std::string why = refusal("CONNECT " + target + " HTTP/1.1\r\n\r\n");
    ASSERT_FALSE(why.empty()) << target;
    for (char c : why) {
      const auto u = static_cast<unsigned char>(c);
      EXPECT_TRUE(u >= 0x20 && u < 0x7f) << "raw byte " << int(u) << " in: " << why;
    }
  }
  EXPECT_EQ(refusal("CONNECT evil\xc2\x9b" "2J.test\xff:443 HTTP/1.1\r\n\r\n"),
            "not a host name or an address: \"evil\\u009B2J.test\\xFF\"");
}
