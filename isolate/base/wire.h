// A closed binary encoding: the one codec of every format the root
// spawner reads or writes (the compiled policy set and the messages of
// daemon/wire/wire.h, the plan a sandbox is built from: isolate/engine/plan.h).
//
// Integers are little-endian and fixed-size; strings are a u32 length and
// the bytes (cstr: the bytes and a NUL, for a reader that hands out C
// strings). The reader never trusts a length: every read is checked against
// what is left, a failed read poisons the reader, and a document is valid
// only when it is read to its last byte. Header-only (base).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tsb {

class Writer {
 public:
  void u8(std::uint8_t v) { buf_.push_back(static_cast<char>(v)); }
  void u32(std::uint32_t v) { put(v); }
  void u64(std::uint64_t v) { put(v); }
  void i32(std::int32_t v) { put(static_cast<std::uint32_t>(v)); }
  void str(std::string_view s) {
    u32(static_cast<std::uint32_t>(s.size()));
    buf_.append(s);
  }
  // The bytes and a NUL after them (not counted in the length).
  void cstr(std::string_view s) {
    str(s);
    buf_.push_back('\0');
  }
  void raw(std::string_view s) { buf_.append(s); }
  void strs(const std::vector<std::string>& v) {
    u32(static_cast<std::uint32_t>(v.size()));
    for (const auto& s : v) str(s);
  }
  const std::string& bytes() const noexcept { return buf_; }
  std::string take() noexcept { return std::move(buf_); }

 private:
  template <typename T>
  void put(T v) {
    char b[sizeof v];
    for (std::size_t i = 0; i < sizeof v; ++i) b[i] = static_cast<char>((v >> (8 * i)) & 0xff);
    buf_.append(b, sizeof v);
  }
  std::string buf_;
};

class Reader {
 public:
  explicit Reader(std::string_view b) : p_(b.data()), end_(b.data() + b.size()) {}
  std::uint8_t u8() { return get<std::uint8_t>(); }
  std::uint32_t u32() { return get<std::uint32_t>(); }
  std::uint64_t u64() { return get<std::uint64_t>(); }
  std::int32_t i32() { return static_cast<std::int32_t>(get<std::uint32_t>()); }
  // A u8 of at most `max`.
  std::uint8_t upto(std::uint8_t max) {
    std::uint8_t v = u8();
    if (v > max) ok_ = false;
    return v;
  }
  bool flag() { return upto(1) == 1; }
  // A string of at most `max` bytes.
  std::string str(std::size_t max) {
    std::uint32_t n = u32();
    if (!ok_ || n > max || n > left()) {
      ok_ = false;
      return {};
    }
    std::string s(p_, n);
    p_ += n;
    return s;
  }
  // At most `max_count` strings of at most `max` bytes each.
  std::vector<std::string> strs(std::size_t max_count, std::size_t max) {
    std::uint32_t n = u32();
    std::vector<std::string> v;
    if (n > max_count) ok_ = false;
    for (std::uint32_t i = 0; ok_ && i < n; ++i) v.push_back(str(max));
    return v;
  }
  // A count of at most `max` elements of at least `min_bytes` each.
  std::uint32_t count(std::uint32_t max, std::size_t min_bytes) {
    std::uint32_t n = u32();
    if (n > max || (min_bytes && n > left() / min_bytes)) ok_ = false;
    return ok_ ? n : 0;
  }
  void fail() noexcept { ok_ = false; }
  bool ok() const noexcept { return ok_; }
  // Everything read, nothing left, no read failed.
  bool done() const noexcept { return ok_ && p_ == end_; }

 private:
  std::size_t left() const noexcept { return static_cast<std::size_t>(end_ - p_); }
  template <typename T>
  T get() {
    if (!ok_ || left() < sizeof(T)) {
      ok_ = false;
      return 0;
    }
    T v = 0;
    for (std::size_t i = 0; i < sizeof(T); ++i) v |= static_cast<T>(static_cast<unsigned char>(p_[i])) << (8 * i);
    p_ += sizeof(T);
    return v;
  }
  const char* p_;
  const char* end_;
  bool ok_ = true;
};

}  // namespace tsb
