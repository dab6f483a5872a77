#include "protocol/json_scan.h"

#include <sys/random.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <ctime>
#include <optional>
#include <vector>

#include <unistd.h>

namespace tsb::protocol {
namespace {

// ---------------------------------------------------------------------------
// SipHash-1-3 over a byte stream (Aumasson and Bernstein; the variant Rust's
// and Python's hash tables use against chosen collisions).
// ---------------------------------------------------------------------------

struct SipKey {
  std::uint64_t k0, k1;
};

// One random key per process. getrandom(2) without GRND_NONBLOCK only waits
// for the pool to be initialised at boot; should it fail anyway, the key is
// still unpredictable enough to keep collisions rare, and a collision costs
// only time (keys are always compared before a duplicate is reported).
const SipKey& sip_key() {
  static const SipKey key = [] {
    SipKey k{};
    if (getrandom(&k, sizeof k, 0) != static_cast<ssize_t>(sizeof k)) {
      timespec ts{};
      clock_gettime(CLOCK_MONOTONIC, &ts);
      k.k0 = static_cast<std::uint64_t>(ts.tv_nsec) * 0x9e3779b97f4a7c15ull ^ reinterpret_cast<std::uintptr_t>(&k);
      k.k1 = static_cast<std::uint64_t>(ts.tv_sec) * 0xbf58476d1ce4e5b9ull ^ static_cast<std::uint64_t>(getpid());
    }
    return k;
  }();
  return key;
}

class SipHash13 {
 public:
  explicit SipHash13(const SipKey& k)
      : v0_(k.k0 ^ 0x736f6d6570736575ull), v1_(k.k1 ^ 0x646f72616e646f6dull), v2_(k.k0 ^ 0x6c7967656e657261ull),
        v3_(k.k1 ^ 0x7465646279746573ull) {}

  void update(const unsigned char* p, std::size_t n) {
    total_ += n;
    while (n > 0 && ntail_ != 0) {
      tail_ |= static_cast<std::uint64_t>(*p++) << (8 * ntail_);
      --n;
      if (++ntail_ == 8) {
        compress(tail_);
        tail_ = 0;
        ntail_ = 0;
      }
    }
    for (; n >= 8; n -= 8, p += 8) {
      std::uint64_t m;
      std::memcpy(&m, p, 8);  // little-endian hosts only (x86-64, arm64 as Debian builds them)
      compress(m);
    }
    for (; n > 0; --n) tail_ |= static_cast<std::uint64_t>(*p++) << (8 * ntail_++);
  }

  // Once per hasher: it consumes the state.
  std::uint64_t finish() {
    compress(tail_ | (static_cast<std::uint64_t>(total_ & 0xff) << 56));
    v2_ ^= 0xff;
    round();
    round();
    round();
    return v0_ ^ v1_ ^ v2_ ^ v3_;
  }

 private:
  static std::uint64_t rotl(std::uint64_t x, int b) { return (x << b) | (x >> (64 - b)); }
  void round() {
    v0_ += v1_;
    v1_ = rotl(v1_, 13);
    v1_ ^= v0_;
    v0_ = rotl(v0_, 32);
    v2_ += v3_;
    v3_ = rotl(v3_, 16);
    v3_ ^= v2_;
    v0_ += v3_;
    v3_ = rotl(v3_, 21);
    v3_ ^= v0_;
    v2_ += v1_;
    v1_ = rotl(v1_, 17);
    v1_ ^= v2_;
    v2_ = rotl(v2_, 32);
  }
  void compress(std::uint64_t m) {
    v3_ ^= m;
    round();
    v0_ ^= m;
  }

  std::uint64_t v0_, v1_, v2_, v3_;
  std::uint64_t tail_ = 0;
  int ntail_ = 0;
  std::uint64_t total_ = 0;
};

// ---------------------------------------------------------------------------
// Character classes
// ---------------------------------------------------------------------------

// Bytes that stand for themselves inside a string: printable ASCII and DEL,
// except '"' and '\\'. Everything else needs a closer look.
constexpr std::array<bool, 256> kPlain = [] {
  std::array<bool, 256> t{};
  for (int c = 0x20; c < 0x80; ++c) t[c] = c != '"' && c != '\\';
  return t;
}();

bool is_ws(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool is_digit(unsigned char c) { return c >= '0' && c <= '9'; }

int hex_value(unsigned char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Length of the well-formed UTF-8 sequence at p (Unicode 15, table 3-7), or
// 0 when it is not one: overlong forms, surrogates (ED A0..BF) and code
// points above U+10FFFF (F4 90.., F5..FF) are all ill-formed.
std::size_t utf8_sequence(const unsigned char* p, const unsigned char* end) {
  const unsigned char c = p[0];
  const std::size_t avail = static_cast<std::size_t>(end - p);
  auto cont = [&](std::size_t i) { return i < avail && (p[i] & 0xC0) == 0x80; };
  if (c >= 0xC2 && c <= 0xDF) return cont(1) ? 2 : 0;
  if (c >= 0xE0 && c <= 0xEF) {
    if (avail < 2) return 0;
    const unsigned char lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
    if (p[1] < lo || p[1] > hi) return 0;
    return cont(2) ? 3 : 0;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    if (avail < 2) return 0;
    const unsigned char lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
    if (p[1] < lo || p[1] > hi) return 0;
    return cont(2) && cont(3) ? 4 : 0;
  }
  return 0;  // 80..C1 (continuation bytes, overlong leads) and F5..FF
}

std::size_t utf8_encode(std::uint32_t cp, unsigned char* out) {
  if (cp < 0x80) {
    out[0] = static_cast<unsigned char>(cp);
    return 1;
  }
  if (cp < 0x800) {
    out[0] = static_cast<unsigned char>(0xC0 | (cp >> 6));
    out[1] = static_cast<unsigned char>(0x80 | (cp & 0x3F));
    return 2;
  }
  if (cp < 0x10000) {
    out[0] = static_cast<unsigned char>(0xE0 | (cp >> 12));
    out[1] = static_cast<unsigned char>(0x80 | ((cp >> 6) & 0x3F));
    out[2] = static_cast<unsigned char>(0x80 | (cp & 0x3F));
    return 3;
  }
  out[0] = static_cast<unsigned char>(0xF0 | (cp >> 18));
  out[1] = static_cast<unsigned char>(0x80 | ((cp >> 12) & 0x3F));
  out[2] = static_cast<unsigned char>(0x80 | ((cp >> 6) & 0x3F));
  out[3] = static_cast<unsigned char>(0x80 | (cp & 0x3F));
  return 4;
}

// Four hex digits at p (p + 4 <= end checked by the caller), or -1.
long hex4(const unsigned char* p) {
  long v = 0;
  for (int i = 0; i < 4; ++i) {
    int h = hex_value(p[i]);
    if (h < 0) return -1;
    v = v * 16 + h;
  }
  return v;
}

// ---------------------------------------------------------------------------
// Sorting key hashes
// ---------------------------------------------------------------------------

// In-place MSD radix sort (American flag sort) on the top bytes, then
// std::sort for small buckets. The hashes are uniform, so two or three
// passes leave buckets of a few dozen; many equal hashes (one key repeated)
// cost at most eight counting passes. Linear either way.
void sort_hashes(std::uint64_t* a, std::size_t n, int shift) {
  if (shift < 0) return;  // every byte consumed: the bucket's values are all equal
  if (n <= 256) {
    std::sort(a, a + n);
    return;
  }
  std::array<std::size_t, 256> count{}, next{}, end{};
  for (std::size_t i = 0; i < n; ++i) ++count[(a[i] >> shift) & 0xff];
  std::size_t sum = 0;
  for (int b = 0; b < 256; ++b) {
    next[b] = sum;
    sum += count[b];
    end[b] = sum;
  }
  for (int b = 0; b < 256; ++b) {
    while (next[b] < end[b]) {
      const unsigned d = (a[next[b]] >> shift) & 0xff;
      if (static_cast<int>(d) == b) {
        ++next[b];
      } else {
        std::swap(a[next[b]], a[next[d]]);
        ++next[d];
      }
    }
  }
  std::size_t start = 0;
  for (int b = 0; b < 256; ++b) {
    sort_hashes(a + start, count[b], shift - 8);
    start += count[b];
  }
}

// ---------------------------------------------------------------------------
// The scanner
// ---------------------------------------------------------------------------

class Scanner {
 public:
  Scanner(std::string_view text, const JsonScanOptions& o)
      : base_(reinterpret_cast<const unsigned char*>(text.data())), p_(base_), end_(base_ + text.size()), o_(o) {}

  std::variant<JsonScanned, JsonScanError> run();

 private:
  struct Frame {
    bool object;
    std::size_t open;        // offset of '[' or '{'
    std::size_t keys_start;  // objects: where this object's hashes start in keys_
    std::string_view key;    // objects: the key token of the member being read
  };

  std::size_t at() const { return static_cast<std::size_t>(p_ - base_); }
  std::string_view slice(std::size_t from, std::size_t to) const {
    return {reinterpret_cast<const char*>(base_) + from, to - from};
  }
  bool fail(std::string_view what, JsonScanFailure f = JsonScanFailure::Syntax) {
    if (!err_) err_ = JsonScanError{f, at(), what};
    return false;
  }
  void ws() {
    while (p_ < end_ && is_ws(*p_)) ++p_;
  }
  bool string(SipHash13* h);
  bool number();
  bool nonfinite();
  bool literal(std::string_view word);
  bool open(bool object);
  bool key();
  void close_object(const Frame& f);
  void verify_duplicates(const Frame& f, std::size_t close_end, std::vector<std::uint64_t> colliding);
  void child_done(std::size_t from, JsonKind kind);

  const unsigned char* base_;
  const unsigned char* p_;
  const unsigned char* end_;
  const JsonScanOptions& o_;
  std::vector<Frame> stack_;
  std::vector<std::uint64_t> keys_;  // the open objects' key hashes, innermost last
  bool duplicate_ = false;           // a duplicate key was found (kept until the end)
  std::size_t duplicate_at_ = 0;
  std::optional<JsonScanError> err_;
};

// A string token at p_ ('"'). When h is set, the string's unescaped bytes are
// fed to it (raw runs in bulk; UTF-8 in the text is its own decoding).
bool Scanner::string(SipHash13* h) {
  ++p_;
  const unsigned char* run = p_;
  for (;;) {
    while (p_ < end_ && kPlain[*p_]) ++p_;
    if (p_ == end_) return fail("unterminated string");
    const unsigned char c = *p_;
    if (c == '"') {
      if (h) h->update(run, static_cast<std::size_t>(p_ - run));
      ++p_;
      return true;
    }
    if (c == '\\') {
      if (h) h->update(run, static_cast<std::size_t>(p_ - run));
      if (end_ - p_ < 2) return fail("unterminated string");
      unsigned char buf[4];
      std::size_t n = 1;
      switch (p_[1]) {
        case '"': buf[0] = '"'; break;
        case '\\': buf[0] = '\\'; break;
        case '/': buf[0] = '/'; break;
        case 'b': buf[0] = '\b'; break;
        case 'f': buf[0] = '\f'; break;
        case 'n': buf[0] = '\n'; break;
        case 'r': buf[0] = '\r'; break;
        case 't': buf[0] = '\t'; break;
        case 'u': {
          if (end_ - p_ < 6) return fail("truncated \\u escape");
          long cp = hex4(p_ + 2);
          if (cp < 0) return fail("invalid \\u escape");
          // Python's json.loads keeps a lone surrogate as such (hashed
          // here as its 3-byte form, which no valid UTF-8 key has).
          const bool lone_ok = o_.python_values;
          if (cp >= 0xDC00 && cp <= 0xDFFF && !lone_ok) return fail("unpaired surrogate in a \\u escape");
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            const long lo = end_ - p_ >= 12 && p_[6] == '\\' && p_[7] == 'u' ? hex4(p_ + 8) : -1;
            if (lo >= 0xDC00 && lo <= 0xDFFF) {
              cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
              p_ += 6;
            } else if (!lone_ok) {
              return fail("unpaired surrogate in a \\u escape");
            }
          }
          n = utf8_encode(static_cast<std::uint32_t>(cp), buf);
          p_ += 4;  // the 4 hex digits; the "\u" below
          break;
        }
        default:
          return fail("invalid escape");
      }
      p_ += 2;
      if (h) h->update(buf, n);
      run = p_;
      continue;
    }
    if (c < 0x20) return fail("raw control character in a string");
    const std::size_t n = utf8_sequence(p_, end_);
    if (n == 0) return fail("invalid UTF-8 in a string");
    p_ += n;
  }
}

// number = [ "-" ] int [ frac ] [ exp ]   (RFC 8259 section 6)
bool Scanner::number() {
  const std::size_t from = at();
  if (*p_ == '-') ++p_;
  if (p_ == end_) return fail("invalid number");
  if (*p_ == '0') {
    ++p_;
  } else if (*p_ >= '1' && *p_ <= '9') {
    while (p_ < end_ && is_digit(*p_)) ++p_;
  } else {
    return fail("invalid number");
  }
  if (p_ < end_ && *p_ == '.') {
    ++p_;
    if (p_ == end_ || !is_digit(*p_)) return fail("invalid number");
    while (p_ < end_ && is_digit(*p_)) ++p_;
  }
  if (p_ < end_ && (*p_ == 'e' || *p_ == 'E')) {
    ++p_;
    if (p_ < end_ && (*p_ == '+' || *p_ == '-')) ++p_;
    if (p_ == end_ || !is_digit(*p_)) return fail("invalid number");
    while (p_ < end_ && is_digit(*p_)) ++p_;
  }
  if (o_.on_number) o_.on_number(slice(from, at()));
  return true;
}

// NaN, Infinity, -Infinity: what Python's json.dumps writes for non-finite
// floats (allow_nan=True), with python_values only.
bool Scanner::nonfinite() {
  const std::size_t from = at();
  const std::string_view word = *p_ == 'N' ? "NaN" : *p_ == 'I' ? "Infinity" : "-Infinity";
  if (!literal(word)) return false;
  if (o_.on_number) o_.on_number(slice(from, at()));
  return true;
}

bool Scanner::literal(std::string_view word) {
  if (static_cast<std::size_t>(end_ - p_) < word.size() || std::memcmp(p_, word.data(), word.size()) != 0)
    return fail("invalid literal");
  p_ += word.size();
  return true;
}

bool Scanner::open(bool object) {
  if (stack_.size() >= static_cast<std::size_t>(std::max(o_.max_depth, 0)))
    return fail("nested too deeply", JsonScanFailure::TooDeep);
  stack_.push_back(Frame{object, at(), keys_.size(), {}});
  ++p_;
  return true;
}

// A member's key and its ':' (p_ at the key's '"', whitespace skipped).
bool Scanner::key() {
  if (p_ == end_ || *p_ != '"') return fail("expected a string key");
  const std::size_t from = at();
  const bool track = o_.duplicate_keys && !duplicate_;
  SipHash13 h(sip_key());
  if (!string(track ? &h : nullptr)) return false;
  stack_.back().key = slice(from, at());
  if (track) {
    // Reserve for the worst case at once when an object gets large, rather
    // than doubling: untouched capacity costs no memory, and doubling would
    // briefly hold two copies. Every key takes at least 5 bytes (`"":0,`).
    if (keys_.size() == keys_.capacity() && keys_.size() >= 4096)
      keys_.reserve(std::max(keys_.size() * 2, static_cast<std::size_t>(end_ - base_) / 5 + 1));
    keys_.push_back(h.finish());
  }
  ws();
  if (p_ == end_ || *p_ != ':') return fail("expected ':' after a key");
  ++p_;
  return true;
}

// The object's hashes are the last keys_.size() - f.keys_start entries
// (its inner objects have popped theirs already).
void Scanner::close_object(const Frame& f) {
  if (!o_.duplicate_keys || duplicate_) {
    // Keys stop being recorded once a duplicate is found.
    keys_.resize(std::min(keys_.size(), f.keys_start));
    return;
  }
  std::uint64_t* a = keys_.data() + f.keys_start;
  const std::size_t n = keys_.size() - f.keys_start;
  std::vector<std::uint64_t> colliding;
  if (n <= 8) {
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t j = i + 1; j < n; ++j)
        if (a[i] == a[j]) colliding.push_back(a[i]);
  } else {
    sort_hashes(a, n, 56);
    for (std::size_t i = 1; i < n; ++i)
      if (a[i] == a[i - 1] && (colliding.empty() || colliding.back() != a[i])) colliding.push_back(a[i]);
  }
  keys_.resize(f.keys_start);
  if (!colliding.empty()) verify_duplicates(f, at(), std::move(colliding));
}

// Equal hashes: compare the keys themselves. The object's members are read
// again (once per object, and only when hashes collided). For each colliding
// hash only its distinct keys are kept, and the walk stops recording at the
// first key seen twice, so an object of a million copies of one key holds
// one string here, not a million.
void Scanner::verify_duplicates(const Frame& f, std::size_t close_end, std::vector<std::uint64_t> colliding) {
  std::sort(colliding.begin(), colliding.end());
  colliding.erase(std::unique(colliding.begin(), colliding.end()), colliding.end());
  // distinct[i]: the different keys seen so far whose hash is colliding[i]
  // (more than one only for distinct keys with equal hashes, a 2^-64 event).
  std::vector<std::vector<std::string>> distinct(colliding.size());
  bool found = false;
  std::size_t found_at = 0;
  JsonScanOptions again;
  again.max_depth = o_.max_depth;
  again.duplicate_keys = false;
  again.python_values = o_.python_values;
  const char* text_base = reinterpret_cast<const char*>(base_);
  again.on_child = [&](const JsonChild& c) {
    if (found) return;
    std::string k = json_string_value(c.key);
    SipHash13 h(sip_key());
    h.update(reinterpret_cast<const unsigned char*>(k.data()), k.size());
    const std::uint64_t hash = h.finish();
    auto it = std::lower_bound(colliding.begin(), colliding.end(), hash);
    if (it == colliding.end() || *it != hash) return;
    auto& seen = distinct[static_cast<std::size_t>(it - colliding.begin())];
    if (std::find(seen.begin(), seen.end(), k) != seen.end()) {
      found = true;
      found_at = static_cast<std::size_t>(c.key.data() - text_base);
    } else {
      seen.push_back(std::move(k));
    }
  };
  Scanner s(slice(f.open, close_end), again);
  // The object was valid the first time; read it with the offsets of `text`.
  s.base_ = base_;
  s.p_ = base_ + f.open;
  s.end_ = base_ + close_end;
  if (!std::holds_alternative<JsonScanned>(s.run()) || !found) return;
  if (!duplicate_ || found_at < duplicate_at_) duplicate_at_ = found_at;
  duplicate_ = true;
}

// A direct child of the top-level container is complete: [from, p_).
void Scanner::child_done(std::size_t from, JsonKind kind) {
  if (stack_.size() != 1 || !o_.on_child) return;
  const Frame& top = stack_.front();
  o_.on_child(JsonChild{top.object ? top.key : std::string_view(), slice(from, at()), kind});
}

std::variant<JsonScanned, JsonScanError> Scanner::run() {
  if (o_.allow_bom && end_ - p_ >= 3 && p_[0] == 0xEF && p_[1] == 0xBB && p_[2] == 0xBF) p_ += 3;
  ws();
  std::optional<JsonScanned> top;
  // Each turn reads one value; a container pushes a frame and reads its
  // first child on the next turn, so the nesting lives in stack_, never on
  // the machine stack.
  while (!err_) {
    if (p_ == end_) {
      fail("unexpected end of input");
      break;
    }
    std::size_t from = at();
    JsonKind kind = JsonKind::Null;
    bool ok = true;
    switch (*p_) {
      case '{': {
        if (!open(true)) continue;
        ws();
        if (p_ == end_ || *p_ != '}') {
          if (key()) ws();
          continue;  // the next turn reads the first member's value
        }
        ++p_;
        const Frame f = stack_.back();
        stack_.pop_back();
        close_object(f);
        kind = JsonKind::Object;
        break;
      }
      case '[':
        if (!open(false)) continue;
        ws();
        if (p_ == end_ || *p_ != ']') continue;  // the next turn reads the first element
        ++p_;
        stack_.pop_back();
        kind = JsonKind::Array;
        break;
      case '"':
        ok = string(nullptr);
        kind = JsonKind::String;
        break;
      case 't':
        ok = literal("true");
        kind = JsonKind::Boolean;
        break;
      case 'f':
        ok = literal("false");
        kind = JsonKind::Boolean;
        break;
      case 'n':
        ok = literal("null");
        kind = JsonKind::Null;
        break;
      default:
        if (o_.python_values && (*p_ == 'N' || *p_ == 'I' || (*p_ == '-' && end_ - p_ > 1 && p_[1] == 'I'))) {
          ok = nonfinite();
          kind = JsonKind::Number;
        } else if (*p_ == '-' || is_digit(*p_)) {
          ok = number();
          kind = JsonKind::Number;
        } else {
          ok = fail("unexpected character");
        }
        break;
    }
    if (!ok) break;
    // A value [from, p_) of `kind` is complete; so may be the containers it
    // closes, one after the other.
    for (;;) {
      const std::size_t value_end = at();
      child_done(from, kind);
      ws();
      if (stack_.empty()) {
        top = JsonScanned{kind, slice(from, value_end)};
        break;
      }
      Frame& f = stack_.back();
      if (p_ == end_) {
        fail(f.object ? "unterminated object" : "unterminated array");
        break;
      }
      if (*p_ == ',') {
        ++p_;
        ws();
        if (f.object) {
          if (key()) ws();
        }
        break;  // the next turn reads the next value
      }
      if (*p_ != (f.object ? '}' : ']')) {
        fail(f.object ? "expected ',' or '}'" : "expected ',' or ']'");
        break;
      }
      ++p_;
      Frame done = f;
      stack_.pop_back();
      if (done.object) close_object(done);
      from = done.open;
      kind = done.object ? JsonKind::Object : JsonKind::Array;
    }
    if (top) break;
  }
  if (err_) return *err_;
  ws();
  if (p_ != end_) return JsonScanError{JsonScanFailure::Syntax, at(), "unexpected data after the JSON value"};
  if (duplicate_) return JsonScanError{JsonScanFailure::DuplicateKey, duplicate_at_, "duplicate key"};
  return *top;
}

}  // namespace

std::variant<JsonScanned, JsonScanError> scan_json(std::string_view text, const JsonScanOptions& options) {
  return Scanner(text, options).run();
}

// ---------------------------------------------------------------------------
// Valid tokens
// ---------------------------------------------------------------------------

std::string json_string_value(std::string_view token) {
  std::string out;
  if (token.size() < 2) return out;
  std::string_view body = token.substr(1, token.size() - 2);
  if (body.find('\\') == std::string_view::npos) return std::string(body);
  out.reserve(body.size());
  const auto* p = reinterpret_cast<const unsigned char*>(body.data());
  const auto* end = p + body.size();
  while (p < end) {
    const auto* bs = static_cast<const unsigned char*>(std::memchr(p, '\\', static_cast<std::size_t>(end - p)));
    if (!bs) bs = end;
    out.append(reinterpret_cast<const char*>(p), static_cast<std::size_t>(bs - p));
    p = bs;
    if (p == end || end - p < 2) break;
    char c = static_cast<char>(p[1]);
    p += 2;
    switch (c) {
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'n': out += '\n'; break;
      case 'r': out += '\r'; break;
      case 't': out += '\t'; break;
      case 'u': {
        if (end - p < 4) return out;
        long cp = hex4(p);
        p += 4;
        if (cp >= 0xD800 && cp <= 0xDBFF && end - p >= 6 && p[0] == '\\' && p[1] == 'u') {
          long lo = hex4(p + 2);
          if (lo >= 0xDC00 && lo <= 0xDFFF) {
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            p += 6;
          }
        }
        if (cp < 0) return out;
        unsigned char buf[4];
        out.append(reinterpret_cast<const char*>(buf), utf8_encode(static_cast<std::uint32_t>(cp), buf));
        break;
      }
      default: out += c; break;  // " \ /
    }
  }
  return out;
}

bool json_number_is_integer(std::string_view token) {
  return token.find_first_of(".eE") == std::string_view::npos;
}

bool json_integer_fits_64_bits(std::string_view token) {
  const bool negative = !token.empty() && token[0] == '-';
  std::string_view digits = negative ? token.substr(1) : token;
  // int64 reaches -9223372036854775808, uint64 18446744073709551615: both
  // have 19 and 20 digits, and JSON has no leading zeros.
  std::string_view limit = negative ? "9223372036854775808" : "18446744073709551615";
  if (digits.size() != limit.size()) return digits.size() < limit.size();
  return digits <= limit;
}

std::size_t json_quoted_size(std::string_view utf8) {
  std::size_t n = 2;
  for (unsigned char c : utf8) {
    if (c == '"' || c == '\\' || c == '\b' || c == '\f' || c == '\n' || c == '\r' || c == '\t') n += 2;
    else if (c < 0x20) n += 6;
    else n += 1;
  }
  return n;
}

void append_json_quoted(std::string& out, std::string_view utf8) {
  static constexpr char kHex[] = "0123456789abcdef";
  out += '"';
  std::size_t run = 0;  // start of the bytes not yet copied
  for (std::size_t i = 0; i < utf8.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(utf8[i]);
    if (c >= 0x20 && c != '"' && c != '\\') continue;
    out.append(utf8.data() + run, i - run);
    run = i + 1;
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        out += "\\u00";
        out += kHex[c >> 4];
        out += kHex[c & 0xf];
    }
  }
  out.append(utf8.data() + run, utf8.size() - run);
  out += '"';
}

std::string json_without_whitespace(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  bool in_string = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char ch = text[i];
    if (in_string) {
      out += ch;
      if (ch == '\\' && i + 1 < text.size()) out += text[++i];
      else if (ch == '"') in_string = false;
    } else if (ch == '"') {
      in_string = true;
      out += ch;
    } else if (ch != ' ' && ch != '\t' && ch != '\n' && ch != '\r') {
      out += ch;
    }
  }
  return out;
}

}  // namespace tsb::protocol
