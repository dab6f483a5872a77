// What a tool asks the egress proxy for: the head of one HTTP request on a
// new connection to 127.0.0.1:3128 inside its sandbox, read, checked and,
// for plain HTTP, rewritten for the origin server. Pure: no I/O.
//
// Two forms are served (RFC 9110 9.3.6, RFC 9112 3.2.2):
//   CONNECT host:port HTTP/1.1      a tunnel (HTTPS, and anything else over
//                                   TCP: the client speaks TLS through it)
//   GET http://host[:port]/path HTTP/1.1   plain HTTP, absolute form; any
//                                   method. Sent on in origin form
//                                   ("GET /path HTTP/1.1"), with
//                                   "Connection: close": one request per
//                                   connection to the proxy (its body as
//                                   long as Content-Length says; nothing
//                                   after it is sent on).
// Anything else is refused with 400: origin-form requests (the proxy is not
// a web server), "https://" in absolute form (use CONNECT), user info in the
// authority ("http://allowed@other/": which host is meant depends on who
// reads it), a host that is neither a DNS name nor an address.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "daemon/frontend/egress/address.h"
#include "isolate/base/result.h"

namespace tsb::egress {

// The largest request head read before a request is refused (431).
inline constexpr std::size_t kMaxHeadBytes = 32 * 1024;
// Interim (1xx) response heads a plain-HTTP answer may carry before its
// final head (100 Continue, 102 Processing, 103 Early Hints: a few).
inline constexpr int kMaxInformationalHeads = 8;

struct ProxyRequest {
  bool tunnel = false;     // CONNECT
  std::string host_text;   // the host as the request spells it, for logs ("[::1]", "0x7f.1")
  Host host;               // what it is (a name, or an address however spelled)
  std::uint16_t port = 0;
  // Plain HTTP: the head to send to the origin server (request line in
  // origin form, hop-by-hop and proxy headers dropped, "Connection: close"),
  // and how many bytes of body follow it (Content-Length; a body of
  // unknown length, Transfer-Encoding, is refused).
  std::string upstream_head;
  std::uint64_t body_length = 0;
};

// Where a request head ends in `buf`: the offset just past its blank line,
// or 0 when it has not ended yet. A bare LF ends lines too. `from`: how
// much of `buf` an earlier call searched (each read then costs only what it
// added).
std::size_t head_end(std::string_view buf, std::size_t from = 0);

// Reads a complete head (up to and including its blank line). An error's
// message is the reason given to the tool.
Result<ProxyRequest> parse_request(std::string_view head);

// A plain-HTTP response head from the origin server, as the tool gets it:
// the same, with the connection fields (Connection, Keep-Alive,
// Proxy-Connection) replaced by "Connection: close", so that no client
// sends a second request on a connection that carries one; a folded line
// is joined to its field (and dropped with a dropped one). `informational`:
// a 1xx head (another head follows). An error: not an HTTP/1.x response head.
struct ResponseHead {
  std::string head;
  bool informational = false;
};
Result<ResponseHead> rewrite_response_head(std::string_view head);

}  // namespace tsb::egress
