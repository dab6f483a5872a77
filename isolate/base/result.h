// Errors as values that carry errno, and a minimal Result<T>.
//
// Convention (docs/ERRORS.md, the page that owns it): the failure site records
// errno and names the operation and its subject ("openat '/x': No such file
// or directory"); callers prepend context on the way up with wrap(), so a
// message reads outermost-first. No exceptions cross module boundaries.
#pragma once

#include <cerrno>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace tsb {

struct Error {
  int code = 0;         // an errno value: the syscall's, or one that fits (invalid(): EINVAL by default)
  std::string message;  // outermost context first; a syscall's ends with strerror(code)

  // Build from the current errno; call this first thing after the failing call.
  static Error from_errno(std::string_view what) { return from_errno(errno, what); }
  static Error from_errno(int err, std::string_view what) {
    Error e;
    e.code = err;
    e.message.assign(what);
    e.message += ": ";
    e.message += std::strerror(err);
    return e;
  }
  // A failure that is not a syscall's (bad input, a violated invariant).
  static Error invalid(std::string_view what, int err = EINVAL) {
    Error e;
    e.code = err;
    e.message.assign(what);
    return e;
  }

  // Prepend context: "configuring mounts: " + "bind '/usr': ...".
  [[nodiscard]] Error wrap(std::string_view context) const& {
    Error e;
    e.code = code;
    e.message.reserve(context.size() + 2 + message.size());
    e.message.assign(context);
    e.message += ": ";
    e.message += message;
    return e;
  }
  [[nodiscard]] Error wrap(std::string_view context) && {
    std::string m(context);
    m += ": ";
    m += message;
    message = std::move(m);
    return std::move(*this);
  }
};

// E: the failure's type. Error everywhere, except where a failure is a fact
// of its own kind (an E2B step's, which carries the run's end reason).
template <class T, class E = Error>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::in_place_index<0>, std::move(value)) {}  // NOLINT(google-explicit-constructor)
  Result(E err) : v_(std::in_place_index<1>, std::move(err)) {}  // NOLINT(google-explicit-constructor)

  [[nodiscard]] bool ok() const noexcept { return v_.index() == 0; }
  explicit operator bool() const noexcept { return ok(); }

  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  const E& error() const& { return std::get<1>(v_); }
  E&& error() && { return std::get<1>(std::move(v_)); }

 private:
  std::variant<T, E> v_;
};

template <class E>
class [[nodiscard]] Result<void, E> {
 public:
  Result() = default;
  Result(E err) : err_(std::move(err)), ok_(false) {}  // NOLINT(google-explicit-constructor)
  [[nodiscard]] bool ok() const noexcept { return ok_; }
  explicit operator bool() const noexcept { return ok_; }
  const E& error() const& { return err_; }
  E&& error() && { return std::move(err_); }

 private:
  E err_;
  bool ok_ = true;
};

using Status = Result<void>;

}  // namespace tsb

// Early return on error, adding context. Usage: TSB_TRY(step(), "mounting /proc");
#define TSB_TRY(expr, context)                                  \
  do {                                                          \
    auto tsb_try_r_ = (expr);                                   \
    if (!tsb_try_r_.ok()) return std::move(tsb_try_r_).error().wrap(context); \
  } while (0)
