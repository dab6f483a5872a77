#include "daemon/frontend/e2b/http.h"

#include <curl/curl.h>
#include <poll.h>

#include <algorithm>
#include <new>
#include <asio/experimental/as_tuple.hpp>
#include <asio/posix/stream_descriptor.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <cctype>

namespace tsb::core::http {

using Clock = std::chrono::steady_clock;

const char* to_string(Failure f) noexcept {
  switch (f) {
    case Failure::None: return "none";
    case Failure::Connect: return "connect";
    case Failure::Timeout: return "timeout";
    case Failure::Stalled: return "stalled";
    case Failure::Transport: return "transport";
    case Failure::TooLarge: return "too_large";
    case Failure::Aborted: return "aborted";
    case Failure::Cancelled: return "cancelled";
    case Failure::Internal: return "internal";
  }
  return "?";
}

std::string Response::header(const std::string& lower_name) const {
  auto it = headers.find(lower_name);
  return it == headers.end() ? std::string() : it->second;
}

// ---------------------------------------------------------------------------
// The multi handle and its sockets
// ---------------------------------------------------------------------------

namespace {

struct SocketWatch {
  SocketWatch(asio::io_context& io, curl_socket_t s) : fd(s), sd(io) {}
  ~SocketWatch() {
    // The fd is curl's: give it back without closing it.
    if (sd.is_open()) (void)sd.release();
  }
  curl_socket_t fd;
  asio::posix::stream_descriptor sd;
  bool want_read = false, want_write = false;
  bool reading = false, writing = false;
  bool removed = false;
};

struct Transfer;

}  // namespace

struct Client::Core : std::enable_shared_from_this<Client::Core> {
  explicit Core(asio::io_context& ctx) : io(ctx), timer(ctx) {}
  ~Core() {
    for (auto& [fd, w] : sockets) {
      w->removed = true;
      if (w->sd.is_open()) (void)w->sd.release();
    }
    if (multi) curl_multi_cleanup(multi);
  }

  asio::io_context& io;
  CURLM* multi = nullptr;
  asio::steady_timer timer;
  std::map<curl_socket_t, std::shared_ptr<SocketWatch>> sockets;

  static int on_socket(CURL*, curl_socket_t s, int what, void* userp, void*);
  static int on_timer(CURLM*, long timeout_ms, void* userp);
  void action(curl_socket_t s, int ev);
  void check_done();
  void arm(const std::shared_ptr<SocketWatch>& w);
  void wait(const std::shared_ptr<SocketWatch>& w, bool read);
};

namespace {

struct Transfer {
  Transfer(std::shared_ptr<Client::Core> c, asio::io_context& io) : core(std::move(c)), event(io) {}
  ~Transfer() {
    if (in_multi) curl_multi_remove_handle(core->multi, easy);
    if (easy) curl_easy_cleanup(easy);
    if (hdrs) curl_slist_free_all(hdrs);
  }
  std::shared_ptr<Client::Core> core;
  CURL* easy = nullptr;
  curl_slist* hdrs = nullptr;
  bool in_multi = false;
  bool finished = false;
  CURLcode code = CURLE_OK;
  Response resp;
  ChunkFn on_chunk;
  std::size_t max_body = 0;
  bool consumer_stopped = false;
  bool too_large = false;
  std::string body;
  char errbuf[CURL_ERROR_SIZE] = {0};
  Clock::time_point last_activity = Clock::now();
  asio::steady_timer event;  // woken (cancelled) on completion and cancellation
};

size_t on_write(char* p, size_t size, size_t n, void* ud) {
  auto* t = static_cast<Transfer*>(ud);
  size_t len = size * n;
  t->last_activity = Clock::now();
  long status = 0;
  curl_easy_getinfo(t->easy, CURLINFO_RESPONSE_CODE, &status);
  if (t->on_chunk && status >= 200 && status < 300) {
    t->resp.body_bytes += len;
    // This runs inside curl_multi_socket_action, called from plain asio
    // handlers: an exception leaving it would leave io.run() and end the
    // front end. A consumer that throws (on a message of an unexpected
    // shape, or out of memory) stops its transfer instead.
    bool go_on = false;
    try {
      go_on = t->on_chunk(std::string_view(p, len));
    } catch (...) {
      go_on = false;
    }
    if (!go_on) {
      t->consumer_stopped = true;
      return len == 0 ? 1 : 0;  // anything but len makes curl stop with CURLE_WRITE_ERROR
    }
    return len;
  }
  if (t->resp.body.size() + len > t->max_body) {
    t->too_large = true;
    return len == 0 ? 1 : 0;
  }
  try {
    t->resp.body.append(p, len);
  } catch (const std::bad_alloc&) {
    t->too_large = true;
    return len == 0 ? 1 : 0;
  }
  t->resp.body_bytes += len;
  return len;
}

size_t on_header(char* p, size_t size, size_t n, void* ud) {
  auto* t = static_cast<Transfer*>(ud);
  size_t len = size * n;
  t->last_activity = Clock::now();
  std::string_view line(p, len);
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.remove_suffix(1);
  if (line.rfind("HTTP/", 0) == 0) {
    t->resp.headers.clear();  // a new response (after a 1xx): start over
    return len;
  }
  auto colon = line.find(':');
  if (colon == std::string_view::npos) return len;
  std::string name(line.substr(0, colon));
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
  std::string_view value = line.substr(colon + 1);
  while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) value.remove_prefix(1);
  while (!value.empty() && (value.back() == ' ' || value.back() == '\t')) value.remove_suffix(1);
  t->resp.headers[name] = std::string(value);
  return len;
}

Failure failure_of(CURLcode c) {
  switch (c) {
    case CURLE_OK: return Failure::None;
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_RESOLVE_PROXY:
    case CURLE_COULDNT_CONNECT:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_SSL_CIPHER:
    case CURLE_SSL_ENGINE_NOTFOUND:
    case CURLE_SSL_ENGINE_SETFAILED:
    case CURLE_UNSUPPORTED_PROTOCOL:
    case CURLE_URL_MALFORMAT:
      return Failure::Connect;
    case CURLE_OPERATION_TIMEDOUT:
      return Failure::Timeout;
    default:
      return Failure::Transport;
  }
}

void global_init_once() {
  // The daemon has one thread when the first client is built, as
  // curl_global_init requires.
  static bool done = [] {
    curl_global_init(CURL_GLOBAL_DEFAULT);
    return true;
  }();
  (void)done;
}

}  // namespace

int Client::Core::on_socket(CURL*, curl_socket_t s, int what, void* userp, void*) {
  auto* core = static_cast<Core*>(userp);
  auto it = core->sockets.find(s);
  if (what == CURL_POLL_REMOVE) {
    if (it != core->sockets.end()) {
      it->second->removed = true;
      // Pending waits end with operation_aborted; the fd stays open for curl.
      if (it->second->sd.is_open()) (void)it->second->sd.release();
      core->sockets.erase(it);
    }
    return 0;
  }
  std::shared_ptr<SocketWatch> w;
  if (it == core->sockets.end()) {
    w = std::make_shared<SocketWatch>(core->io, s);
    asio::error_code ec;
    w->sd.assign(s, ec);
    if (ec) return -1;
    core->sockets[s] = w;
  } else {
    w = it->second;
  }
  w->want_read = what == CURL_POLL_IN || what == CURL_POLL_INOUT;
  w->want_write = what == CURL_POLL_OUT || what == CURL_POLL_INOUT;
  core->arm(w);
  return 0;
}

int Client::Core::on_timer(CURLM*, long timeout_ms, void* userp) {
  auto* core = static_cast<Core*>(userp);
  if (timeout_ms < 0) {
    core->timer.cancel();
    return 0;
  }
  // Never call back into curl from here: even a zero timeout runs from
  // the loop.
  core->timer.expires_after(std::chrono::milliseconds(timeout_ms));
  std::weak_ptr<Core> weak = core->weak_from_this();
  core->timer.async_wait([weak](const asio::error_code& ec) {
    if (ec) return;
    if (auto self = weak.lock()) self->action(CURL_SOCKET_TIMEOUT, 0);
  });
  return 0;
}

void Client::Core::action(curl_socket_t s, int ev) {
  int running = 0;
  curl_multi_socket_action(multi, s, ev, &running);
  check_done();
}

void Client::Core::check_done() {
  int left = 0;
  while (CURLMsg* m = curl_multi_info_read(multi, &left)) {
    if (m->msg != CURLMSG_DONE) continue;
    Transfer* t = nullptr;
    curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, reinterpret_cast<char**>(&t));
    CURLcode code = m->data.result;
    curl_multi_remove_handle(multi, m->easy_handle);
    if (!t) continue;
    t->in_multi = false;
    t->finished = true;
    t->code = code;
    t->event.cancel();
  }
}

void Client::Core::arm(const std::shared_ptr<SocketWatch>& w) {
  if (w->want_read && !w->reading) {
    w->reading = true;
    wait(w, true);
  }
  if (w->want_write && !w->writing) {
    w->writing = true;
    wait(w, false);
  }
}

void Client::Core::wait(const std::shared_ptr<SocketWatch>& w, bool read) {
  std::weak_ptr<Core> weak = weak_from_this();
  auto handler = [weak, w, read](const asio::error_code& ec) {
    (read ? w->reading : w->writing) = false;
    if (ec || w->removed) return;
    if (!(read ? w->want_read : w->want_write)) return;  // curl lost interest meanwhile
    auto self = weak.lock();
    if (!self) return;
    self->action(w->fd, read ? CURL_CSELECT_IN : CURL_CSELECT_OUT);
    if (!w->removed) self->arm(w);
  };
  // The reactor is edge-triggered and curl may leave bytes unread (or stay
  // writable) without a new edge coming: look first, wait only if needed.
  pollfd p{w->fd, static_cast<short>(read ? POLLIN : POLLOUT), 0};
  if (::poll(&p, 1, 0) > 0) {
    asio::post(io, [handler] { handler(asio::error_code()); });
    return;
  }
  w->sd.async_wait(read ? asio::posix::stream_descriptor::wait_read : asio::posix::stream_descriptor::wait_write,
                   handler);
}

// ---------------------------------------------------------------------------
// Client
// ---------------------------------------------------------------------------

Client::Client(asio::io_context& io) : io_(io) {
  global_init_once();
  core_ = std::make_shared<Core>(io);
  core_->multi = curl_multi_init();
  curl_multi_setopt(core_->multi, CURLMOPT_SOCKETFUNCTION, &Core::on_socket);
  curl_multi_setopt(core_->multi, CURLMOPT_SOCKETDATA, core_.get());
  curl_multi_setopt(core_->multi, CURLMOPT_TIMERFUNCTION, &Core::on_timer);
  curl_multi_setopt(core_->multi, CURLMOPT_TIMERDATA, core_.get());
}

Client::~Client() = default;

asio::awaitable<Response> Client::request(Request req) { co_return co_await run(std::move(req), nullptr); }

asio::awaitable<Response> Client::stream(Request req, ChunkFn on_chunk) {
  co_return co_await run(std::move(req), std::move(on_chunk));
}

asio::awaitable<Response> Client::run(Request req, ChunkFn on_chunk) {
  auto t = std::make_unique<Transfer>(core_, io_);
  t->on_chunk = std::move(on_chunk);
  t->max_body = req.max_body_bytes;
  t->body = std::move(req.body);
  t->easy = curl_easy_init();
  if (!t->easy || !core_->multi) {
    t->resp.failure = Failure::Internal;
    t->resp.error = "curl could not create a handle";
    co_return std::move(t->resp);
  }
  CURL* e = t->easy;
  curl_easy_setopt(e, CURLOPT_URL, req.url.c_str());
  curl_easy_setopt(e, CURLOPT_PRIVATE, t.get());
  curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
  // Proxies from the environment are ignored: the daemon talks to the
  // configured URLs and nothing else.
  curl_easy_setopt(e, CURLOPT_PROXY, "");
  curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, 0L);
  curl_easy_setopt(e, CURLOPT_TCP_KEEPALIVE, 1L);
  curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(std::min(req.connect_timeout, req.timeout).count()));
  // A backstop only: the deadline below ends the transfer first.
  curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, static_cast<long>(req.timeout.count() + 5000));
  curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, &on_write);
  curl_easy_setopt(e, CURLOPT_WRITEDATA, t.get());
  curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, &on_header);
  curl_easy_setopt(e, CURLOPT_HEADERDATA, t.get());
  curl_easy_setopt(e, CURLOPT_ERRORBUFFER, t->errbuf);
  for (const auto& [k, v] : req.headers) t->hdrs = curl_slist_append(t->hdrs, (k + ": " + v).c_str());
  t->hdrs = curl_slist_append(t->hdrs, "Expect:");
  curl_easy_setopt(e, CURLOPT_HTTPHEADER, t->hdrs);
  if (req.method == "GET") {
    curl_easy_setopt(e, CURLOPT_HTTPGET, 1L);
  } else if (req.method == "POST" || req.method == "PUT" || req.method == "PATCH") {
    curl_easy_setopt(e, CURLOPT_POST, 1L);
    curl_easy_setopt(e, CURLOPT_POSTFIELDS, t->body.data());
    curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(t->body.size()));
    if (req.method != "POST") curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, req.method.c_str());
  } else {
    curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, req.method.c_str());
    if (!t->body.empty()) {
      curl_easy_setopt(e, CURLOPT_POSTFIELDS, t->body.data());
      curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(t->body.size()));
    }
  }

  const auto start = Clock::now();
  const auto overall = start + req.timeout;
  t->last_activity = start;
  if (curl_multi_add_handle(core_->multi, e) != CURLM_OK) {
    t->resp.failure = Failure::Internal;
    t->resp.error = "curl could not start the transfer";
    co_return std::move(t->resp);
  }
  t->in_multi = true;

  struct HookGuard {
    std::shared_ptr<CancelSignal> sig;
    int id = -1;
    ~HookGuard() {
      if (sig && id >= 0) sig->remove_hook(id);
    }
  } hook{req.cancel};
  if (req.cancel) {
    Transfer* tp = t.get();
    hook.id = req.cancel->add_hook([tp] { tp->event.cancel(); });
  }

  Failure ours = Failure::None;
  while (!t->finished) {
    auto now = Clock::now();
    if (req.cancel && req.cancel->requested()) {
      ours = Failure::Cancelled;
      break;
    }
    if (now >= overall) {
      ours = Failure::Timeout;
      break;
    }
    auto wake = overall;
    if (req.stall_timeout.count() > 0) {
      auto stall_at = t->last_activity + req.stall_timeout;
      if (now >= stall_at) {
        ours = Failure::Stalled;
        break;
      }
      wake = std::min(wake, stall_at);
    }
    t->event.expires_at(wake);
    co_await t->event.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
  }

  Response out = std::move(t->resp);
  if (!t->finished) {
    if (t->in_multi) {
      curl_multi_remove_handle(core_->multi, e);
      t->in_multi = false;
    }
    out.failure = ours;
    out.error = ours == Failure::Timeout   ? "no complete answer within " + std::to_string(req.timeout.count()) + " ms"
                : ours == Failure::Stalled ? "no data for " + std::to_string(req.stall_timeout.count()) + " ms"
                                           : "cancelled";
  } else if (t->code != CURLE_OK) {
    if (t->consumer_stopped) out.failure = Failure::Aborted;
    else if (t->too_large) out.failure = Failure::TooLarge;
    else out.failure = failure_of(t->code);
    out.error = t->errbuf[0] ? std::string(t->errbuf) : std::string(curl_easy_strerror(t->code));
  }
  long status = 0;
  curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &status);
  out.status = status;
  co_return out;
}

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

bool LineSplitter::feed(std::string_view data, const std::function<bool(std::string_view)>& on_line) {
  if (overflow_) return false;
  buf_.append(data);
  std::size_t start = 0;
  for (;;) {
    std::size_t nl = buf_.find('\n', start);
    if (nl == std::string::npos) break;
    std::string_view line(buf_.data() + start, nl - start);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.size() > max_) {
      overflow_ = true;
      return false;
    }
    if (!on_line(line)) {
      buf_.erase(0, nl + 1);
      return false;
    }
    start = nl + 1;
  }
  buf_.erase(0, start);
  if (buf_.size() > max_) {
    overflow_ = true;
    return false;
  }
  return true;
}

namespace {
std::string quote_impl(std::string_view s, std::string_view safe, bool plus) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  out.reserve(s.size() * 3);
  for (unsigned char c : s) {
    if ((c >= '0' && c <= '9') || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_' || c == '.' || c == '-' || c == '~' ||
        (c < 0x80 && safe.find(static_cast<char>(c)) != std::string_view::npos)) {
      out += static_cast<char>(c);
    } else if (plus && c == ' ') {
      out += '+';
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}
}  // namespace

std::string py_quote(std::string_view s, std::string_view safe) { return quote_impl(s, safe, false); }
std::string py_quote_plus(std::string_view s, std::string_view safe) { return quote_impl(s, safe, true); }

}  // namespace tsb::core::http
