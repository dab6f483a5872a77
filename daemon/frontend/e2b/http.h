// An HTTP client for the daemon's event loop: libcurl's multi interface
// driven by Asio, so no request ever blocks the loop.
//
// curl tells us which sockets to watch (CURLMOPT_SOCKETFUNCTION) and when to
// wake it (CURLMOPT_TIMERFUNCTION); each socket is watched through an
// asio::posix::stream_descriptor that never owns the fd (curl opens and
// closes its sockets; we release() the descriptor before destroying it), and
// one steady_timer carries curl's timeout. Every transfer has an overall
// deadline and, optionally, a stall deadline (no body bytes for that long).
//
// Headers and bodies are never logged here. Callers put credentials in
// headers only; nothing in this module copies a header value anywhere else.
#pragma once

#include <asio/awaitable.hpp>
#include <asio/io_context.hpp>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "daemon/frontend/pipeline/cancel.h"

namespace tsb::core::http {

// A run's cancellation (daemon/frontend/pipeline/cancel.h): request() wakes every
// transfer waiting on it, which then aborts with Failure::Cancelled.
using CancelSignal = core::CancelSignal;

struct Request {
  std::string method = "GET";  // GET, POST, DELETE, ...
  std::string url;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;            // sent for POST/PUT/PATCH (also when empty)
  std::chrono::milliseconds timeout{30000};          // the whole exchange
  std::chrono::milliseconds connect_timeout{10000};
  std::chrono::milliseconds stall_timeout{0};        // 0: none; else no body bytes for this long ends it
  std::size_t max_body_bytes = 16u << 20;            // buffered body (and an error body of a stream)
  std::shared_ptr<CancelSignal> cancel;              // optional
};

enum class Failure {
  None,
  Connect,     // resolving, connecting or the TLS handshake failed
  Timeout,     // the overall deadline passed
  Stalled,     // no body bytes within stall_timeout
  Transport,   // the connection broke or the response was malformed mid-way
  TooLarge,    // the buffered body went past max_body_bytes
  Aborted,     // the streaming consumer asked to stop
  Cancelled,   // the CancelSignal fired
  Internal,    // curl could not even start the transfer
};
const char* to_string(Failure f) noexcept;

struct Response {
  Failure failure = Failure::None;
  std::string error;       // curl's message for failures (never contains headers)
  long status = 0;         // 0 when no status line arrived
  std::map<std::string, std::string> headers;  // lower-cased names; the last value wins
  std::string body;        // buffered requests; for streams, the body of a non-2xx answer
  std::uint64_t body_bytes = 0;   // bytes received (streams: delivered to the consumer)
  bool ok() const noexcept { return failure == Failure::None; }
  std::string header(const std::string& lower_name) const;
};

// Receives body bytes of a 2xx response as they arrive. Return false to stop
// the transfer (it then ends with Failure::Aborted, unless it had finished).
using ChunkFn = std::function<bool(std::string_view)>;

class Client {
 public:
  explicit Client(asio::io_context& io);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // The whole body, buffered.
  asio::awaitable<Response> request(Request req);
  // Body bytes of a 2xx answer go to on_chunk as they arrive; a non-2xx
  // answer's body is buffered into Response::body instead.
  asio::awaitable<Response> stream(Request req, ChunkFn on_chunk);

  struct Core;

 private:
  asio::awaitable<Response> run(Request req, ChunkFn on_chunk);
  asio::io_context& io_;
  std::shared_ptr<Core> core_;
};

// Splits a byte stream into lines ('\n', a trailing '\r' removed). A line
// longer than max_line is an error (the callback is not called with it).
class LineSplitter {
 public:
  explicit LineSplitter(std::size_t max_line) : max_(max_line) {}
  // Calls on_line for each complete line; false when a line is too long or
  // on_line returned false.
  bool feed(std::string_view data, const std::function<bool(std::string_view)>& on_line);
  const std::string& pending() const noexcept { return buf_; }
  bool overflowed() const noexcept { return overflow_; }

 private:
  std::size_t max_;
  std::string buf_;
  bool overflow_ = false;
};

// Python's urllib.parse.quote(s, safe) and quote_plus(s, safe): every byte
// that is not an ASCII letter, digit, "_.-~" or in `safe` becomes %XX
// (upper-case hex); quote_plus writes a space as '+'.
std::string py_quote(std::string_view s, std::string_view safe = "/");
std::string py_quote_plus(std::string_view s, std::string_view safe = "");

}  // namespace tsb::core::http
