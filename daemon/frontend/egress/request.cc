#include "daemon/frontend/egress/request.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <vector>

#include "daemon/common/quote.h"

namespace tsb::egress {
namespace {

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

bool istarts_with(std::string_view s, std::string_view prefix) {
  return s.size() >= prefix.size() && iequals(s.substr(0, prefix.size()), prefix);
}

// RFC 9110 5.6.2: a token (method, header name).
bool is_token(std::string_view s) {
  static constexpr std::string_view kExtra = "!#$%&'*+-.^_`|~";
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || kExtra.find(c) != std::string_view::npos;
  });
}

// Header fields a proxy does not pass on (RFC 9110 7.6.1), besides those the
// Connection field names; Host is replaced from the target (RFC 9112 3.2.2).
constexpr std::array<std::string_view, 9> kDropped = {"connection", "proxy-connection", "keep-alive",
                                                      "proxy-authorization", "proxy-authenticate", "te",
                                                      "trailer", "upgrade", "host"};

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

struct Authority {
  std::string host_text;
  Host host;
  std::uint16_t port = 0;
};

// "host:port", "[v6]:port", or without ":port" when `default_port` is not 0.
Result<Authority> parse_authority(std::string_view a, std::uint16_t default_port) {
  if (a.find('@') != std::string_view::npos)
    return Error::invalid("user information in the authority is refused (which host it names depends on the reader)");
  Authority out;
  std::string_view host = a, port;
  if (!a.empty() && a.front() == '[') {
    const std::size_t close = a.find(']');
    if (close == std::string_view::npos) return Error::invalid("an IPv6 address without its closing ']'");
    host = a.substr(0, close + 1);
    std::string_view rest = a.substr(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':') return Error::invalid("text after an IPv6 address that is not a port");
      port = rest.substr(1);
    }
  } else if (const std::size_t colon = a.rfind(':'); colon != std::string_view::npos) {
    if (a.find(':') != colon)
      return Error::invalid("an IPv6 address must be in brackets: " + quoted_for_message("[" + std::string(a.substr(0, 255)) + "]"));
    host = a.substr(0, colon);
    port = a.substr(colon + 1);
  }
  if (host.empty()) return Error::invalid("no host");
  if (port.empty() && a.back() != ':' && default_port != 0) {
    out.port = default_port;
  } else {
    unsigned long v = 0;
    if (port.empty() || port.size() > 5 || !std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; }) ||
        (v = std::stoul(std::string(port))) == 0 || v > 65535)
      return Error::invalid("a port must be a number from 1 to 65535");
    out.port = static_cast<std::uint16_t>(v);
  }
  out.host = parse_host(host);
  if (out.host.kind == Host::kInvalid)
    return Error::invalid("not a host name or an address: " + quoted_for_message(host.substr(0, 255)));
  out.host_text = std::string(host);
  return out;
}

// The Host field for the origin server: the target's host, with its port
// unless it is the scheme's.
std::string host_field(const Authority& a) {
  std::string h = a.host.kind == Host::kName ? a.host.name
                  : a.host.address.v6        ? "[" + a.host.address.text() + "]"
                                             : a.host.address.text();
  if (a.port != 80) h += ":" + std::to_string(a.port);
  return h;
}

// The head's lines, without their line ends, up to its last one that is
// not empty. Control characters (a stray CR or NUL included) are refused
// anywhere in the head: what reaches the origin server is visible text.
Result<std::vector<std::string_view>> head_lines(std::string_view head) {
  std::vector<std::string_view> lines;
  for (std::size_t pos = 0; pos < head.size();) {
    std::size_t nl = head.find('\n', pos);
    if (nl == std::string_view::npos) nl = head.size();
    std::string_view line = head.substr(pos, nl - pos);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (std::any_of(line.begin(), line.end(), [](char c) { return (c >= 0 && c < 0x20 && c != '\t') || c == 0x7f; }))
      return Error::invalid("a request head with control characters");
    lines.push_back(line);
    pos = nl + 1;
  }
  while (!lines.empty() && lines.back().empty()) lines.pop_back();
  if (lines.empty()) return Error::invalid("an empty request");
  return lines;
}

struct RequestLine {
  std::string_view method, target, version;
};

// The request line: method SP target SP version, HTTP/1.1 or HTTP/1.0.
Result<RequestLine> parse_request_line(std::string_view rl) {
  const std::size_t s1 = rl.find(' '), s2 = s1 == std::string_view::npos ? s1 : rl.find(' ', s1 + 1);
  if (s2 == std::string_view::npos || rl.find(' ', s2 + 1) != std::string_view::npos)
    return Error::invalid("not an HTTP request line");
  RequestLine out{rl.substr(0, s1), rl.substr(s1 + 1, s2 - s1 - 1), rl.substr(s2 + 1)};
  if (!is_token(out.method) || out.target.empty() || (out.version != "HTTP/1.1" && out.version != "HTTP/1.0"))
    return Error::invalid("not an HTTP/1.x request line");
  return out;
}

// A plain-HTTP request's header fields, in order; the names its Connection
// fields list (hop-by-hop too: not passed on); the body's length.
struct Fields {
  std::vector<std::pair<std::string_view, std::string_view>> fields;
  std::vector<std::string> hop;
  std::uint64_t body_length = 0;
};

// The header fields: lines[1] on (lines[0] is the request line). Those the
// Connection field names are hop-by-hop too (never the message's framing:
// Connection cannot make the body's length disappear while the body goes
// on).
Result<Fields> parse_fields(const std::vector<std::string_view>& lines) {
  Fields out;
  bool have_length = false;
  for (std::size_t i = 1; i < lines.size(); ++i) {
    const std::string_view line = lines[i];
    const std::size_t colon = line.find(':');
    if (line.empty() || line.front() == ' ' || line.front() == '\t')
      return Error::invalid("obsolete line folding in a header field");
    if (colon == std::string_view::npos || !is_token(line.substr(0, colon)))
      return Error::invalid("a malformed header field");
    const std::string_view name = line.substr(0, colon), value = trim(line.substr(colon + 1));
    if (iequals(name, "connection")) {
      for (std::size_t p = 0; p <= value.size();) {
        std::size_t comma = value.find(',', p);
        if (comma == std::string_view::npos) comma = value.size();
        const std::string_view opt = trim(value.substr(p, comma - p));
        if (!opt.empty() && !iequals(opt, "content-length")) out.hop.emplace_back(opt);
        p = comma + 1;
      }
    }
    // The body's length: what is sent on after the head, and no more (one
    // request per connection). A streamed (chunked) body would need the
    // proxy to follow its framing; over a tunnel it needs nothing.
    if (iequals(name, "transfer-encoding"))
      return Error::invalid("a request body of unknown length (Transfer-Encoding) through plain HTTP: "
                            "send it with Content-Length, or over HTTPS");
    if (iequals(name, "content-length")) {
      std::uint64_t v = 0;
      if (value.empty() || value.size() > 15 ||
          !std::all_of(value.begin(), value.end(), [](char c) { return c >= '0' && c <= '9'; }))
        return Error::invalid("a Content-Length that is not a number");
      for (char c : value) v = v * 10 + static_cast<std::uint64_t>(c - '0');
      if (have_length && v != out.body_length) return Error::invalid("two different Content-Length fields");
      have_length = true;
      out.body_length = v;
    }
    out.fields.emplace_back(name, value);
  }
  return out;
}

// The head for the origin server: the request line in origin form, Host
// from the target, the client's fields but the hop-by-hop ones, and
// "Connection: close".
std::string upstream_head(const RequestLine& rl, std::string_view origin_path, const Authority& a, const Fields& f) {
  std::string h = std::string(rl.method) + " " + std::string(origin_path) + " " + std::string(rl.version) + "\r\n";
  h += "Host: " + host_field(a) + "\r\n";
  for (const auto& field : f.fields) {
    // (Named, not bound: clang 14 cannot capture a structured binding.)
    const std::string_view name = field.first, value = field.second;
    const bool drop = std::any_of(kDropped.begin(), kDropped.end(), [&](std::string_view d) { return iequals(name, d); }) ||
                      std::any_of(f.hop.begin(), f.hop.end(), [&](const std::string& d) { return iequals(name, d); });
    if (!drop) h += std::string(name) + ": " + std::string(value) + "\r\n";
  }
  h += "Connection: close\r\n\r\n";
  return h;
}

}  // namespace

std::size_t head_end(std::string_view b, std::size_t from) {
  // What was searched before cannot hold the end, except a line end cut
  // between two reads: from its last three bytes on.
  for (std::size_t i = b.find('\n', from > 3 ? from - 3 : 0); i != std::string_view::npos; i = b.find('\n', i + 1)) {
    if (i + 1 < b.size() && b[i + 1] == '\n') return i + 2;
    if (i + 2 < b.size() && b[i + 1] == '\r' && b[i + 2] == '\n') return i + 3;
  }
  return 0;
}

Result<ProxyRequest> parse_request(std::string_view head) {
  auto lines = head_lines(head);
  if (!lines.ok()) return std::move(lines).error();
  auto rl = parse_request_line(lines->front());
  if (!rl.ok()) return std::move(rl).error();

  // A tunnel: CONNECT host:port; its header fields are not looked at.
  ProxyRequest out;
  if (rl->method == "CONNECT") {
    auto a = parse_authority(rl->target, 0);
    if (!a.ok()) return std::move(a).error();
    out.tunnel = true;
    out.host_text = std::move(a->host_text);
    out.host = std::move(a->host);
    out.port = a->port;
    return out;
  }
  // Plain HTTP, in absolute form: the target, its fields, the head sent on.
  if (istarts_with(rl->target, "https://"))
    return Error::invalid("https:// goes through a tunnel: CONNECT host:443 (every HTTPS client does this by itself)");
  if (!istarts_with(rl->target, "http://"))
    return Error::invalid("this is the sandbox's egress proxy: a request names its destination "
                          "(http://host/path, or CONNECT host:port)");
  std::string_view rest = rl->target.substr(7);
  const std::size_t path_at = rest.find_first_of("/?#");
  auto a = parse_authority(rest.substr(0, path_at), 80);
  if (!a.ok()) return std::move(a).error();
  std::string_view path = path_at == std::string_view::npos ? std::string_view() : rest.substr(path_at);
  if (const std::size_t frag = path.find('#'); frag != std::string_view::npos) path = path.substr(0, frag);
  std::string origin_path = path.empty() || path.front() != '/' ? "/" + std::string(path) : std::string(path);

  auto fields = parse_fields(*lines);
  if (!fields.ok()) return std::move(fields).error();
  out.upstream_head = upstream_head(*rl, origin_path, *a, *fields);
  out.body_length = fields->body_length;
  out.host_text = std::move(a->host_text);
  out.host = std::move(a->host);
  out.port = a->port;
  return out;
}

Result<ResponseHead> rewrite_response_head(std::string_view head) {
  ResponseHead out;
  std::size_t pos = 0;
  bool first = true;
  bool in_field = false;  // a header field was read (a folded line continues it)
  bool dropping = false;  // the field being read is one not passed on
  while (pos < head.size()) {
    std::size_t nl = head.find('\n', pos);
    if (nl == std::string_view::npos) nl = head.size();
    std::string_view line = head.substr(pos, nl - pos);
    pos = nl + 1;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) break;
    if (first) {
      // HTTP/1.x SP 3DIGIT [SP reason]
      if (line.size() < 12 || !istarts_with(line, "HTTP/1.") || line[8] != ' ' ||
          !std::all_of(line.begin() + 9, line.begin() + 12, [](char c) { return c >= '0' && c <= '9'; }) ||
          (line.size() > 12 && line[12] != ' '))
        return Error::invalid("the server's answer is not an HTTP/1.x response");
      out.informational = line[9] == '1';
      out.head = std::string(line) + "\r\n";
      first = false;
      continue;
    }
    // A line that starts with a blank continues the field before it
    // (obsolete line folding): it goes, or is dropped, with that field,
    // unfolded into one line with a space (RFC 9112, section 5.2).
    if (line.front() == ' ' || line.front() == '\t') {
      if (!in_field) return Error::invalid("the server's answer folds a line onto its status line");
      if (!dropping) {
        out.head.resize(out.head.size() - 2);  // the previous line's CRLF
        out.head += ' ';
        out.head += std::string(trim(line)) + "\r\n";
      }
      continue;
    }
    const std::size_t colon = line.find(':');
    const std::string_view name = colon == std::string_view::npos ? line : line.substr(0, colon);
    in_field = true;
    dropping = iequals(name, "connection") || iequals(name, "keep-alive") || iequals(name, "proxy-connection");
    if (dropping) continue;
    out.head += std::string(line) + "\r\n";
  }
  if (first) return Error::invalid("the server's answer is not an HTTP/1.x response");
  if (!out.informational) out.head += "Connection: close\r\n";
  out.head += "\r\n";
  return out;
}

}  // namespace tsb::egress
