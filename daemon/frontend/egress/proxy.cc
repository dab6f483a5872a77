#include "daemon/frontend/egress/proxy.h"

#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/post.hpp>
#include <asio/posix/stream_descriptor.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/write.hpp>
#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>

#include "daemon/frontend/egress/request.h"
#include "daemon/frontend/egress/rules.h"
#include "daemon/common/quote.h"
#include "isolate/engine/plan.h"

namespace tsb::egress {
namespace {

using namespace asio::experimental::awaitable_operators;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;
constexpr auto tuple_awaitable = asio::experimental::as_tuple(asio::use_awaitable);

// How long a connection may take to send its request head, and how long a
// name lookup and each connection attempt may take.
constexpr auto kHeadTimeout = std::chrono::seconds(30);
constexpr auto kLookupTimeout = std::chrono::seconds(10);
constexpr auto kConnectTimeout = std::chrono::seconds(10);
constexpr std::size_t kMaxAttempts = 4;  // addresses tried per connection

std::string q(std::string_view s) { return quoted_for_message(s); }

// A reason phrase (RFC 9112 4): visible ASCII and spaces only, bounded.
std::string phrase(std::string_view s) {
  std::string out;
  for (char c : s.substr(0, 400)) out += (c >= 0x20 && c < 0x7f) ? c : '?';
  return out;
}

tcp::endpoint endpoint_of(const Address& a, std::uint16_t port) {
  if (a.v6) {
    asio::ip::address_v6::bytes_type b;
    std::copy(a.bytes.begin(), a.bytes.end(), b.begin());
    return {asio::ip::address_v6(b), port};
  }
  asio::ip::address_v4::bytes_type b;
  std::copy(a.bytes.begin(), a.bytes.begin() + 4, b.begin());
  return {asio::ip::address_v4(b), port};
}

std::string format_bytes(std::uint64_t n) {
  if (n % (1ull << 20) == 0) return std::to_string(n >> 20) + " MiB";
  if (n % 1024 == 0) return std::to_string(n >> 10) + " KiB";
  return std::to_string(n) + " bytes";
}

}  // namespace

// ---- the service -----------------------------------------------------------

// What a lookup's thread shares with the daemon: the io_context to post its
// answer to, gone (null) once the service is.
struct Service::Gate {
  std::mutex m;
  asio::io_context* io = nullptr;
};

Service::Service(asio::io_context& io) : io_(io), gate_(std::make_shared<Gate>()) { gate_->io = &io; }

Service::~Service() {
  std::lock_guard lock(gate_->m);
  gate_->io = nullptr;
}

void Service::lookup(const std::string& name, const std::string& organization,
                     std::function<void(std::vector<Address>, int)> done) {
  ++lookups_;
  ++lookups_by_organization_[organization];
  auto finish = [this, done, organization](std::vector<Address> a, int rc) {
    --lookups_;
    if (--lookups_by_organization_[organization] == 0) lookups_by_organization_.erase(organization);
    done(std::move(a), rc);
  };
  // getaddrinfo blocks for as long as the resolver waits (seconds, for a
  // name server that does not answer): a thread of its own, so that one
  // slow name holds up no other run. It holds the gate, never this object;
  // `finish` only runs on the io_context, and what it captures is cheap to
  // drop on the thread when the daemon is gone.
  try {
    std::thread([gate = gate_, name, finish]() mutable {
      addrinfo hints{};
      hints.ai_family = AF_UNSPEC;
      hints.ai_socktype = SOCK_STREAM;
      addrinfo* res = nullptr;
      const int rc = ::getaddrinfo(name.c_str(), nullptr, &hints, &res);
      std::vector<Address> out;
      for (addrinfo* ai = rc == 0 ? res : nullptr; ai; ai = ai->ai_next) {
        if (!ai->ai_addr || (ai->ai_family != AF_INET && ai->ai_family != AF_INET6)) continue;
        const Address a = from_sockaddr(ai->ai_addr);
        if (std::find(out.begin(), out.end(), a) == out.end()) out.push_back(a);
      }
      if (res) ::freeaddrinfo(res);
      std::lock_guard lock(gate->m);
      if (gate->io) asio::post(*gate->io, [finish = std::move(finish), out = std::move(out), rc]() mutable {
        finish(std::move(out), rc);
      });
    }).detach();
  } catch (const std::system_error&) {
    asio::post(io_, [finish]() mutable { finish({}, EAI_AGAIN); });
  }
}

nlohmann::json Service::status() const {
  return {{"runs", runs_},
          {"connections", connections_},
          {"allowed", allowed_},
          {"refused", refused_},
          {"open", open_},
          {"lookups_in_flight", lookups_},
          {"bytes_sent", bytes_sent_},
          {"bytes_received", bytes_received_},
          {"listeners_missing", listeners_missing_}};
}

// ---- one connection ----------------------------------------------------------

struct RunProxy::Conn {
  Conn(std::shared_ptr<RunProxy> p, tcp::socket s)
      : proxy(std::move(p)), client(std::move(s)), upstream(client.get_executor()), wake(client.get_executor()) {
    proxy->conns_.insert(this);
    ++proxy->svc_.open_;
  }
  ~Conn() {
    proxy->conns_.erase(this);
    --proxy->svc_.open_;
  }
  void close() {
    closed = true;
    asio::error_code ec;
    client.close(ec);
    upstream.close(ec);
    wake.cancel();
  }

  std::shared_ptr<RunProxy> proxy;
  tcp::socket client, upstream;
  asio::steady_timer wake;  // a lookup's answer, or its timeout
  Clock::time_point t0 = Clock::now();
  bool closed = false;
  bool decided = false;  // counted as allowed or refused
  bool tunnel = false;
  Clock::time_point active = Clock::now();  // the last byte either way
  std::string host = "-", address = "-";
  std::uint16_t port = 0;
  std::uint64_t sent = 0, received = 0;
  std::string ended;  // why an allowed connection ended early
  // What a refusal reads and drops of the client's request (its body, when
  // it names one) before it closes.
  std::uint64_t drain_limit = 1u << 20;
  // The lookup's answer.
  bool looked_up = false;
  std::vector<Address> addresses;
  int lookup_error = 0;

  // The request is read: what the audit line names, and how much of its
  // body a refusal drains (up to 64 MiB).
  void named(const ProxyRequest& r) {
    drain_limit = std::max<std::uint64_t>(drain_limit, std::min<std::uint64_t>(r.body_length, 64ull << 20));
    host = r.host_text;
    port = r.port;
    tunnel = r.tunnel;
  }
};

// A request head as read: the head is buf[0, end); what follows it came in
// the same reads (the first bytes of a body or of a tunnel's stream, or a
// second request).
struct RunProxy::Head {
  std::string buf;
  std::size_t end = 0;
};

// ---- the run's proxy ---------------------------------------------------------

struct RunProxy::Io {
  explicit Io(asio::io_context& io) : channel(io), acceptor(io) {}
  asio::posix::stream_descriptor channel;
  tcp::acceptor acceptor;
};

RunProxy::RunProxy(Service& service, core::EgressRules rules, RunLabels labels)
    : svc_(service), rules_(std::move(rules)), labels_(std::move(labels)), io_(std::make_unique<Io>(service.io_)) {
  ++svc_.runs_;
}

RunProxy::~RunProxy() = default;

void RunProxy::start(UniqueFd channel, std::string run_id) {
  if (!run_id.empty()) run_id_ = std::move(run_id);
  if (stopped_ || !channel) return;
  asio::co_spawn(svc_.io_, receive_listener(std::move(channel)), asio::detached);
}

void RunProxy::stop() {
  if (stopped_) return;
  stopped_ = true;
  asio::error_code ec;
  io_->channel.close(ec);
  io_->acceptor.close(ec);
  for (Conn* c : std::vector<Conn*>(conns_.begin(), conns_.end())) {
    // Counted now, so that the run's summary, read next, has it (its audit
    // line follows when its coroutine sees the close).
    if (!c->decided) {
      c->decided = true;
      ++refused_;
      ++svc_.refused_;
    }
    c->close();
  }
  if (!listener_) ++svc_.listeners_missing_;
}

nlohmann::json RunProxy::summary() const {
  return {{"listener", listener_},   {"connections", connections_},   {"allowed", allowed_},
          {"refused", refused_},     {"bytes_sent", bytes_sent_},     {"bytes_received", bytes_received_}};
}

std::string RunProxy::audit_fields() const {
  return " egress_connections=" + std::to_string(connections_) + " egress_refused=" + std::to_string(refused_) +
         " egress_bytes_sent=" + std::to_string(bytes_sent_) + " egress_bytes_received=" + std::to_string(bytes_received_);
}

asio::awaitable<void> RunProxy::receive_listener(UniqueFd channel) {
  auto self = shared_from_this();
  asio::error_code aec;
  io_->channel.assign(channel.release(), aec);
  if (aec) co_return;
  auto [ec] = co_await io_->channel.async_wait(asio::posix::stream_descriptor::wait_read, tuple_awaitable);
  if (ec || stopped_) co_return;
  // One byte with one descriptor (isolate/init/build.cc). EOF: the sandbox
  // ended before it made one (its set-up failed).
  char byte = 0;
  struct iovec iov{&byte, 1};
  alignas(struct cmsghdr) char control[CMSG_SPACE(4 * sizeof(int))] = {};
  struct msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = control;
  m.msg_controllen = sizeof control;
  const ssize_t n = ::recvmsg(io_->channel.native_handle(), &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  std::vector<UniqueFd> fds;
  for (struct cmsghdr* c = n > 0 ? CMSG_FIRSTHDR(&m) : nullptr; c; c = CMSG_NXTHDR(&m, c))
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS)
      for (std::size_t i = 0; i < (c->cmsg_len - CMSG_LEN(0)) / sizeof(int); ++i) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
        fds.emplace_back(fd);
      }
  io_->channel.close(aec);
  if (n <= 0) co_return;
  // What is accepted on must be what init promised: a listening IPv4 TCP
  // socket on 127.0.0.1:kEgressProxyPort.
  int listening = 0, domain = 0, type = 0;
  socklen_t len = sizeof(int);
  sockaddr_in local{};
  socklen_t alen = sizeof local;
  const bool good = fds.size() == 1 && (m.msg_flags & MSG_CTRUNC) == 0 &&
                    ::getsockopt(fds[0].get(), SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) == 0 && listening == 1 &&
                    ::getsockopt(fds[0].get(), SOL_SOCKET, SO_DOMAIN, &domain, &len) == 0 && domain == AF_INET &&
                    ::getsockopt(fds[0].get(), SOL_SOCKET, SO_TYPE, &type, &len) == 0 && type == SOCK_STREAM &&
                    ::getsockname(fds[0].get(), reinterpret_cast<sockaddr*>(&local), &alen) == 0 &&
                    local.sin_addr.s_addr == htonl(INADDR_LOOPBACK) && ntohs(local.sin_port) == isolate::kEgressProxyPort;
  if (!good) {
    spdlog::error("run {}: the sandbox's egress listener is not what it should be: its tool gets no egress", run_id_);
    co_return;
  }
  io_->acceptor.assign(tcp::v4(), fds[0].release(), aec);
  if (aec) {
    spdlog::error("run {}: adopting the egress listener: {}", run_id_, aec.message());
    co_return;
  }
  listener_ = true;
  co_await accept_loop();
}

asio::awaitable<void> RunProxy::accept_loop() {
  auto self = shared_from_this();
  asio::steady_timer backoff(svc_.io_);
  while (!stopped_) {
    auto [ec, s] = co_await io_->acceptor.async_accept(tuple_awaitable);
    if (stopped_ || capped_) break;
    if (ec == asio::error::connection_aborted) continue;
    if (ec == asio::error::no_descriptors || ec == asio::error::no_buffer_space || ec == asio::error::no_memory ||
        ec.value() == ENFILE) {
      // Out of descriptors: the connection waits in the backlog meanwhile.
      backoff.expires_after(std::chrono::milliseconds(100));
      co_await backoff.async_wait(tuple_awaitable);
      continue;
    }
    if (ec) {
      spdlog::error("run {}: accepting on the egress listener: {}", run_id_, ec.message());
      break;
    }
    asio::co_spawn(svc_.io_, serve(std::make_shared<Conn>(self, std::move(s))), asio::detached);
  }
}

// ---- one connection, step by step ------------------------------------------
//
// serve() is the list of steps. Each step hands the next what it found, or
// says why the connection ends there (a Refusal, answered by refuse());
// every connection ends in finish(), with one audit line. A Refusal is
// named before it goes to refuse(), never made inside the co_await
// expression: GCC 12 destroys an aggregate made there twice.

asio::awaitable<void> RunProxy::serve(std::shared_ptr<Conn> c) {
  ++connections_;
  ++svc_.connections_;
  if (std::optional<Refusal> no = admit()) co_return co_await refuse(c, std::move(*no));

  // 1. The request head, within kHeadTimeout, and what it asks for.
  Step<Head> reading = co_await read_head(c);
  if (Refusal* no = std::get_if<Refusal>(&reading)) co_return co_await refuse(c, std::move(*no));
  Head& head = std::get<Head>(reading);
  auto req = parse_request(std::string_view(head.buf).substr(0, head.end));
  if (!req.ok()) {
    Refusal malformed{Verdict::Failed, 400, req.error().message};
    co_return co_await refuse(c, std::move(malformed));
  }
  c->named(*req);

  // 2. The policy's rules, on the host as named.
  if (std::string why = rule_refusal(rules_, req->host, req->port); !why.empty()) {
    Refusal outside{Verdict::Refused, 403, std::move(why)};
    co_return co_await refuse(c, std::move(outside));
  }

  // 3. Its addresses: the literal one, or the daemon's lookup of the name.
  Step<std::vector<Address>> candidates = co_await resolve(c, req->host);
  if (Refusal* no = std::get_if<Refusal>(&candidates)) co_return co_await refuse(c, std::move(*no));

  // 4. The deny list, on every address: only those that pass are used.
  Step<std::vector<Address>> usable = screen(std::get<std::vector<Address>>(candidates), req->host);
  if (Refusal* no = std::get_if<Refusal>(&usable)) co_return co_await refuse(c, std::move(*no));

  // 5. Connect, to the checked addresses only.
  std::vector<Address>& checked = std::get<std::vector<Address>>(usable);
  std::optional<Refusal> unconnected = co_await connect_upstream(c, std::move(checked));
  if (unconnected) co_return co_await refuse(c, std::move(*unconnected));
  ++allowed_;
  ++svc_.allowed_;
  c->decided = true;

  // 6. Bytes both ways, until both directions are done.
  co_await splice(c, std::move(*req), std::move(head));
}

// Before anything is read: the run's caps (connections, bytes), then the
// daemon's and the run's bounds on connections open at once. Nothing, or
// why the connection is not served.
std::optional<RunProxy::Refusal> RunProxy::admit() {
  if (connections_ > rules_.max_connections) {
    // The first connection past the cap is told why; then the listener
    // closes: later ones are refused by the sandbox's own kernel, with no
    // work and no audit line here each.
    capped_ = true;
    asio::error_code ec;
    io_->acceptor.close(ec);
    return Refusal{Verdict::Refused, 403,
                   "the run's connection cap (" + std::to_string(rules_.max_connections) +
                       ") is reached: the proxy takes no more connections from this run"};
  }
  if (bytes_ >= rules_.max_bytes)
    return Refusal{Verdict::Refused, 403, "the run's byte cap (" + format_bytes(rules_.max_bytes) + ") is reached"};
  if (svc_.open_ > kMaxOpenConnections)
    return Refusal{Verdict::Failed, 503, "the daemon has too many egress connections open; retry later"};
  if (conns_.size() > kMaxOpenPerRun)
    return Refusal{Verdict::Failed, 503,
                   "the run has " + std::to_string(kMaxOpenPerRun) + " egress connections open; close one first"};
  return std::nullopt;
}

// 1. Reads until the request head is complete: at most kMaxHeadBytes (then
// 431), within kHeadTimeout in all. A client that takes longer, or goes
// away, is closed without an answer.
asio::awaitable<RunProxy::Step<RunProxy::Head>> RunProxy::read_head(std::shared_ptr<Conn> c) {
  Head head;
  asio::steady_timer limit(svc_.io_);
  limit.expires_after(kHeadTimeout);
  std::array<char, 4096> chunk;
  std::size_t searched = 0;
  while ((head.end = head_end(head.buf, searched)) == 0) {
    searched = head.buf.size();
    if (head.buf.size() >= kMaxHeadBytes)
      co_return Refusal{Verdict::Failed, 431, "the request head is larger than " + format_bytes(kMaxHeadBytes)};
    auto r =
        co_await (c->client.async_read_some(asio::buffer(chunk), tuple_awaitable) || limit.async_wait(tuple_awaitable));
    if (r.index() == 1) co_return Refusal{Verdict::Failed, 0, "no complete request within 30 s"};
    auto [ec, n] = std::get<0>(r);
    if (ec) {
      const char* why = head.buf.empty() ? "closed before sending a request" : "closed within its request";
      co_return Refusal{Verdict::Failed, 0, why};
    }
    head.buf.append(chunk.data(), n);
  }
  co_return std::move(head);
}

// 3. The addresses of the host the request names: an address as it is; a
// name looked up by the daemon (Service::lookup), within kLookupTimeout,
// when the daemon's, the organization's and the run's bounds on lookups in
// flight leave room for one.
asio::awaitable<RunProxy::Step<std::vector<Address>>> RunProxy::resolve(std::shared_ptr<Conn> c, Host host) {
  if (host.kind == Host::kAddress) co_return std::vector<Address>{host.address};
  const auto org = svc_.lookups_by_organization_.find(labels_.organization);
  if (svc_.lookups_ >= kMaxLookups || lookups_ >= kMaxLookupsPerRun ||
      (org != svc_.lookups_by_organization_.end() && org->second >= kMaxLookupsPerOrganization))
    co_return Refusal{Verdict::Failed, 503, "too many name lookups in flight; retry later"};
  ++lookups_;
  // The answer may come after the connection or the run is gone: it holds
  // neither.
  std::weak_ptr<Conn> weak = c;
  std::weak_ptr<RunProxy> run = weak_from_this();
  svc_.lookup(host.name, labels_.organization, [weak, run](std::vector<Address> a, int rc) {
    if (auto p = run.lock()) --p->lookups_;
    if (auto conn = weak.lock()) {
      conn->addresses = std::move(a);
      conn->lookup_error = rc;
      conn->looked_up = true;
      conn->wake.cancel();
    }
  });
  c->wake.expires_after(kLookupTimeout);
  while (!c->looked_up && !c->closed) {
    auto [ec] = co_await c->wake.async_wait(tuple_awaitable);
    if (!ec) break;  // the timeout
  }
  if (c->closed) co_return Refusal{Verdict::Failed, 0, "the run ended"};
  if (!c->looked_up) co_return Refusal{Verdict::Failed, 504, "looking up " + host.name + " took too long"};
  if (c->lookup_error != 0 || c->addresses.empty()) {
    std::string why = "cannot resolve " + host.name + ": ";
    why += c->lookup_error ? ::gai_strerror(c->lookup_error) : "no address";
    co_return Refusal{Verdict::Failed, 502, std::move(why)};
  }
  co_return c->addresses;
}

// 4. The candidates the deny list (address.h) lets through, in their
// order; the daemon's own host's addresses and local routes are denied
// too. None: a refusal naming the first denied one.
RunProxy::Step<std::vector<Address>> RunProxy::screen(const std::vector<Address>& candidates, const Host& host) {
  const std::vector<Address> own = host_addresses();
  std::vector<Address> usable;
  std::string first_denied;
  for (const Address& a : candidates) {
    std::string_view why = denied(a, own);
    if (why.empty() && is_local(a)) why = "an address of the daemon's own host (a local route)";
    if (why.empty()) usable.push_back(a);
    else if (first_denied.empty()) first_denied = a.text() + " is " + std::string(why);
  }
  if (!usable.empty()) return usable;
  std::string why = "denied: " + first_denied;
  if (host.kind == Host::kName) why = host.name + " resolves only to denied addresses (" + first_denied + ")";
  return Refusal{Verdict::Refused, 403, std::move(why)};
}

// 5. Tries the checked addresses in order, at most kMaxAttempts of them,
// each within kConnectTimeout. Nothing: connected (c->address names to
// what); else why not (504 when an attempt timed out, 502 otherwise).
asio::awaitable<std::optional<RunProxy::Refusal>> RunProxy::connect_upstream(std::shared_ptr<Conn> c,
                                                                             std::vector<Address> usable) {
  std::string failure;
  bool timed_out = false, connected = false;
  for (std::size_t i = 0; i < usable.size() && i < kMaxAttempts && !connected && !c->closed; ++i) {
    asio::error_code ec;
    c->upstream.close(ec);
    asio::steady_timer limit(svc_.io_);
    limit.expires_after(kConnectTimeout);
    auto r = co_await (c->upstream.async_connect(endpoint_of(usable[i], c->port), tuple_awaitable) ||
                       limit.async_wait(tuple_awaitable));
    if (r.index() == 1) {
      timed_out = true;
      failure = usable[i].text() + ": no answer within 10 s";
    } else if (auto [cec] = std::get<0>(r); cec) {
      failure = usable[i].text() + ": " + cec.message();
    } else {
      connected = true;
      c->address = usable[i].text();
    }
  }
  if (c->closed) co_return Refusal{Verdict::Failed, 0, "the run ended"};
  if (connected) co_return std::nullopt;
  c->address = usable[0].text();
  std::string why = "cannot connect to " + c->host + " port " + std::to_string(c->port) + " (" + failure + ")";
  co_return Refusal{Verdict::Failed, timed_out ? 504 : 502, std::move(why)};
}

// 6. What goes first: the tunnel's answer to the client, or the rewritten
// head to the server, with as much of the body as followed the head (plain
// HTTP: the body is Content-Length bytes, and nothing after it goes on: one
// request per connection). Then both directions at once, until both are
// done or the connection carries nothing for kIdleSeconds.
asio::awaitable<void> RunProxy::splice(std::shared_ptr<Conn> c, ProxyRequest req, Head head) {
  std::string first;
  std::uint64_t body_left = 0;  // plain HTTP: body bytes still to come from the client
  bool pipelined = false;       // plain HTTP: the client sent more than one request
  if (req.tunnel) {
    first.assign(head.buf, head.end, std::string::npos);
    static constexpr std::string_view kEstablished = "HTTP/1.1 200 Connection established\r\n\r\n";
    auto [ec, n] = co_await asio::async_write(c->client, asio::buffer(kEstablished), tuple_awaitable);
    if (ec) co_return finish(*c, Verdict::Allowed, "the client went away");
  } else {
    const std::size_t have = head.buf.size() - head.end;
    const std::size_t body_now = static_cast<std::size_t>(std::min<std::uint64_t>(have, req.body_length));
    first = std::move(req.upstream_head);
    first.append(head.buf, head.end, body_now);
    body_left = req.body_length - body_now;
    pipelined = have > body_now;
  }
  c->active = Clock::now();
  std::uint64_t* body = req.tunnel ? nullptr : &body_left;
  if (pipelined) c->ended = "a second request on one plain-HTTP connection (one request per connection): not sent on";
  co_await ((relay(c, true, std::move(first), body) && relay_down(c)) || watch_idle(c));
  finish(*c, Verdict::Allowed, c->ended);
}

// One direction: `pending` first, then what comes, until the sending side
// is done. Up (client to server) with `body_left` set (it points into
// splice()'s frame, which awaits this): plain HTTP, where only that many
// body bytes go on. Counted against the byte cap like
// everything sent (reserved before each write, so that writes in both
// directions at once cannot pass it).
asio::awaitable<void> RunProxy::relay(std::shared_ptr<Conn> c, bool up, std::string pending, std::uint64_t* body_left) {
  tcp::socket& from = up ? c->client : c->upstream;
  tcp::socket& to = up ? c->upstream : c->client;
  std::array<char, 16384> b;
  for (;;) {
    std::string_view data = pending;
    if (pending.empty()) {
      // Plain HTTP, client side, body complete: nothing more is sent on.
      // Whatever comes now is a second request (the client reuses the
      // connection): it is not sent on and nothing more is read, but the
      // answer in flight goes on to its end, and the connection closes
      // after it (with "Connection: close"); the client retries on a new
      // one.
      const bool done = body_left && *body_left == 0;
      auto [ec, got] = co_await from.async_read_some(asio::buffer(b), tuple_awaitable);
      if (ec) break;
      c->active = Clock::now();
      if (done) {
        c->ended = "a second request on one plain-HTTP connection (one request per connection): not sent on";
        co_return;
      }
      std::size_t n = got;
      if (body_left) n = static_cast<std::size_t>(std::min<std::uint64_t>(n, *body_left));
      if (n < got) c->ended = "a second request on one plain-HTTP connection (one request per connection): not sent on";
      data = std::string_view(b.data(), n);
    }
    if (body_left && pending.empty()) *body_left -= data.size();
    const std::uint64_t left = rules_.max_bytes - std::min(bytes_, rules_.max_bytes);
    const std::size_t take = static_cast<std::size_t>(std::min<std::uint64_t>(data.size(), left));
    if (take > 0) {
      bytes_ += take;
      auto [wec, w] = co_await asio::async_write(to, asio::buffer(data.data(), take), tuple_awaitable);
      bytes_ -= take - w;
      c->active = Clock::now();
      (up ? c->sent : c->received) += w;
      (up ? bytes_sent_ : bytes_received_) += w;
      (up ? svc_.bytes_sent_ : svc_.bytes_received_) += w;
      if (wec) break;
    }
    if (take < data.size()) {
      c->ended = "the run's byte cap (" + format_bytes(rules_.max_bytes) + ") was reached";
      c->close();
      co_return;
    }
    pending.clear();
  }
  asio::error_code ec;
  if (up && !body_left) {
    // A tunnel: the client's end of the stream goes on to the server.
    to.shutdown(tcp::socket::shutdown_send, ec);
  } else if (!up) {
    // The server is done: so is the client's side. Plain HTTP: the
    // response is complete (one request per connection).
    to.shutdown(tcp::socket::shutdown_send, ec);
    if (!c->tunnel) c->close();
  }
}

// The server's side. Plain HTTP: its response head(s) go to the client
// with "Connection: close" (request.h), then the rest as it comes.
asio::awaitable<void> RunProxy::relay_down(std::shared_ptr<Conn> c) {
  std::string rest;
  if (!c->tunnel) {
    std::optional<std::string> after = co_await pass_response_heads(c);
    if (!after) co_return;
    rest = std::move(*after);
  }
  co_await relay(c, false, std::move(rest), nullptr);
}

// Plain HTTP: reads the server's response heads (at most
// kMaxInformationalHeads 1xx ones, then the final one) and writes each to
// the client rewritten, counted as received and toward the run's byte cap.
// What followed the last head; nothing when the connection is closed here
// (c->ended says why, unless the server or the client just went away). A
// server whose answer cannot be passed on (a head too large or malformed,
// too many interim heads, closed within a head) gets its client a 502
// saying why: the final head is never one the server sent half of.
asio::awaitable<std::optional<std::string>> RunProxy::pass_response_heads(std::shared_ptr<Conn> c) {
  std::string acc;
  std::array<char, 16384> b;
  int interim = 0;
  auto bad_gateway = [&](std::string why) -> asio::awaitable<std::optional<std::string>> {
    c->ended = std::move(why);
    co_await answer_error(c, 502, c->ended);
    c->close();
    co_return std::nullopt;
  };
  for (bool more = true; more;) {
    std::size_t end = 0, searched = 0;
    while ((end = head_end(acc, searched)) == 0) {
      if (acc.size() > kMaxHeadBytes)
        co_return co_await bad_gateway("the server's response head is larger than " + format_bytes(kMaxHeadBytes));
      searched = acc.size();
      auto [ec, got] = co_await c->upstream.async_read_some(asio::buffer(b), tuple_awaitable);
      if (ec) {
        if (acc.empty() && interim == 0) {  // no answer at all: the server went away
          c->close();
          co_return std::nullopt;
        }
        co_return co_await bad_gateway("the server closed within its response head");
      }
      c->active = Clock::now();
      acc.append(b.data(), got);
    }
    if (end > kMaxHeadBytes)  // complete, but past the cap (it came in one read)
      co_return co_await bad_gateway("the server's response head is larger than " + format_bytes(kMaxHeadBytes));
    auto head = rewrite_response_head(std::string_view(acc).substr(0, end));
    if (!head.ok()) co_return co_await bad_gateway(head.error().message);
    if (head->informational && ++interim > kMaxInformationalHeads)
      co_return co_await bad_gateway("the server sent more than " + std::to_string(kMaxInformationalHeads) +
                                     " interim (1xx) response heads");
    c->received += end;
    bytes_received_ += end;
    svc_.bytes_received_ += end;
    bytes_ += end;
    auto [wec, w] = co_await asio::async_write(c->client, asio::buffer(head->head), tuple_awaitable);
    if (wec) {
      c->close();
      co_return std::nullopt;
    }
    acc.erase(0, end);
    more = head->informational;
  }
  co_return std::move(acc);
}

// A connection that carries nothing either way for kIdleSeconds is closed
// (a client gone without a word, a server that never answers).
asio::awaitable<void> RunProxy::watch_idle(std::shared_ptr<Conn> c) {
  asio::steady_timer t(svc_.io_);
  const auto limit = std::chrono::seconds(kIdleSeconds);
  while (!c->closed) {
    t.expires_at(c->active + limit);
    auto [ec] = co_await t.async_wait(tuple_awaitable);
    if (ec) co_return;
    if (Clock::now() - c->active >= limit) {
      c->ended = "nothing either way for " + std::to_string(kIdleSeconds) + " s";
      c->close();
      co_return;
    }
  }
}

// ---- how a connection ends ---------------------------------------------------

// Answers the client an HTTP error whose reason phrase (and body) is `why`
// (phrase()), and "Connection: close".
asio::awaitable<asio::error_code> RunProxy::answer_error(std::shared_ptr<Conn> c, int status, std::string_view why) {
  if (c->closed) co_return asio::error::operation_aborted;
  const std::string p = phrase(why);
  const std::string body = "toolsandboxd egress: " + p + "\n";
  const std::string resp = "HTTP/1.1 " + std::to_string(status) + " " + p +
                           "\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: " +
                           std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
  auto [ec, w] = co_await asio::async_write(c->client, asio::buffer(resp), tuple_awaitable);
  co_return ec;
}

// A connection not served. With a status, the client is answered an HTTP
// error whose reason phrase says why (Python's http.client puts it in the
// tool's exception: "Tunnel connection failed: 403 ..."), the same text as
// the body; status 0 (the client went quiet or away, the run ended)
// answers nothing. Then finish().
asio::awaitable<void> RunProxy::refuse(std::shared_ptr<Conn> c, Refusal r) {
  if (r.status != 0 && !c->closed) {
    const asio::error_code wec = co_await answer_error(c, r.status, r.reason);
    // A lingering close: what the client is still sending (a request
    // body: most clients read the answer only once they sent it all) is
    // read and dropped, up to a bound, so that closing does not reset the
    // connection before the client has read the answer. What it reads
    // counts toward the run's byte cap, as a body sent on would: a tool
    // cannot push more through refusals than through allowed connections.
    asio::error_code ec;
    c->client.shutdown(tcp::socket::shutdown_send, ec);
    asio::steady_timer limit(svc_.io_);
    limit.expires_after(std::chrono::seconds(5));
    std::array<char, 65536> sink;
    std::uint64_t drained = 0;
    while (!wec && !c->closed && drained < c->drain_limit && bytes_ < rules_.max_bytes) {
      auto rd = co_await (c->client.async_read_some(asio::buffer(sink), tuple_awaitable) ||
                          limit.async_wait(tuple_awaitable));
      if (rd.index() == 1) break;
      auto [rec, n] = std::get<0>(rd);
      if (rec) break;
      drained += n;
      bytes_ += n;
    }
  }
  finish(*c, r.verdict, r.reason);
}

// Every connection ends here: counted as refused unless it was allowed,
// one audit line, and closed sockets. The run's first refusal or failure
// is kept for its record (first_refusal()).
void RunProxy::finish(Conn& c, Verdict v, std::string_view reason) {
  if (v != Verdict::Allowed && !c.decided) {
    ++refused_;
    ++svc_.refused_;
  }
  c.decided = true;
  if (reason.size() > 512) reason = reason.substr(0, 512);
  // Escaped: what a tool or a package sent can be in it, and a build's
  // error that names it goes to the client and the command line.
  if (v != Verdict::Allowed && first_refusal_.empty() && !reason.empty())
    first_refusal_ = escaped((c.host == "-" ? std::string("a request") : c.host + (c.port ? ":" + std::to_string(c.port) : std::string())) +
                             ": " + std::string(reason));
  const auto ms = std::chrono::duration<double, std::milli>(Clock::now() - c.t0).count();
  spdlog::info("egress run_id={} request_id={} org={} tool={} host={} port={} address={} verdict={} reason={} "
               "sent={} received={} duration_ms={:.1f}",
               run_id_, q(labels_.request_id), q(labels_.organization), q(labels_.tool), q(c.host), c.port,
               c.address, v == Verdict::Allowed ? "allowed" : v == Verdict::Refused ? "refused" : "failed",
               reason.empty() ? "-" : q(reason), c.sent, c.received, ms);
  c.close();
}

}  // namespace tsb::egress
