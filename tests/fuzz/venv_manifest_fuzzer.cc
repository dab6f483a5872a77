// The venv manifests' reader (daemon/venv/manifest.h) and the bounded JSON
// reader under it (parse_json_limited, protocol/json_limits.h): the
// builder's manifest is written by a sandbox that ran packages' code.
//
// Each input is read three ways: as the builder's manifest (2 levels, about
// 10,000 values, strings of 4 KiB), as a stored <key>.json, and under the
// defaults with equal keys allowed (what the request decoder uses for a
// sandbox config). Invariants, besides "no crash, no sanitizer report":
//   - what is read is what nlohmann reads from the same text, and within
//     every limit it was read under;
//   - a refusal names a limit the text really breaks, or the text really is
//     not JSON as RFC 8259 has it (UTF-8 included): nlohmann refuses it too,
//     except for equal keys, which nlohmann takes and the reader refuses;
//   - a refusal says what it refuses (a message), and an over-limit error
//     is E2BIG, a syntax error EINVAL, a number out of range ERANGE;
//   - the builder's manifest keeps only freeze (a list of at most 10,000
//     strings) and python (a string of at most 64 bytes).
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "daemon/venv/archive.h"
#include "daemon/venv/manifest.h"
#include "protocol/json_limits.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

using nlohmann::json;
using tsb::protocol::JsonLimits;

struct Shape {
  std::size_t values = 0, longest = 0;
  int depth = 0;
};

// Iterative: a document's nesting is bounded by the limits it was read
// under, but not the one nlohmann reads for comparison.
Shape shape_of(const json& root) {
  Shape s;
  std::vector<std::pair<const json*, int>> todo{{&root, 0}};
  while (!todo.empty()) {
    auto [j, d] = todo.back();
    todo.pop_back();
    ++s.values;
    if (j->is_string()) s.longest = std::max(s.longest, j->get_ref<const std::string&>().size());
    if (!j->is_structured()) continue;
    s.depth = std::max(s.depth, d + 1);
    if (j->is_object())
      for (auto it = j->begin(); it != j->end(); ++it) s.longest = std::max(s.longest, it.key().size());
    for (const auto& e : *j) todo.emplace_back(&e, d + 1);
  }
  return s;
}

// nlohmann's reading, with exceptions (the reference): made once per input,
// when a check first needs it.
enum class Ref { Json, NotJson, OutOfRange };
struct Reference {
  explicit Reference(std::string_view t) : text(t) {}
  std::string_view text;
  bool made = false;
  Ref kind = Ref::NotJson;
  json doc;

  Ref get() {
    if (made) return kind;
    made = true;
    if (text.find('\0') != std::string_view::npos) return kind = Ref::NotJson;  // nlohmann would stop at it (fuzz_check.h)
    try {
      doc = json::parse(text);
      return kind = Ref::Json;
    } catch (const json::out_of_range&) {
      return kind = Ref::OutOfRange;
    } catch (const json::exception&) {
      return kind = Ref::NotJson;
    }
  }
};

bool check(std::string_view text, const JsonLimits& l, Reference& ref) {
  auto r = tsb::protocol::parse_json_limited(text, l);
  if (r.ok()) {
    TSB_FUZZ_CHECK(text.size() <= l.max_bytes);
    const Shape s = shape_of(*r);
    TSB_FUZZ_CHECK(s.values <= l.max_values && s.depth <= l.max_depth && s.longest <= l.max_string_bytes, r->dump());
    TSB_FUZZ_CHECK(tsb::fuzz::is_utf8(text), "a text of invalid UTF-8 was read");
    TSB_FUZZ_CHECK(ref.get() == Ref::Json, "read what nlohmann refuses");
    TSB_FUZZ_CHECK(ref.doc == *r, "read other than nlohmann reads");
    return true;
  }
  const std::string& m = r.error().message;
  TSB_FUZZ_CHECK(!m.empty(), "a refusal without a message");
  const int code = r.error().code;
  if (m.starts_with("larger than")) {
    TSB_FUZZ_CHECK(code == E2BIG && text.size() > l.max_bytes, m);
    return false;
  }
  if (m.starts_with("nested deeper than")) {
    TSB_FUZZ_CHECK(code == E2BIG && !tsb::protocol::json_nesting_within(text, l.max_depth), m);
    return false;
  }
  if (m.starts_with("not JSON: duplicate key")) {
    TSB_FUZZ_CHECK(code == EINVAL && l.duplicate_keys, m);
    return false;  // nlohmann takes equal keys (the last wins); RFC 8259 leaves them undefined
  }
  if (m.starts_with("not JSON")) {
    TSB_FUZZ_CHECK(code == EINVAL, m);
    // nlohmann skips a UTF-8 byte order mark; RFC 8259 lets a reader refuse
    // it, and this one does (a sender of JSON must not write one).
    if (text.starts_with("\xef\xbb\xbf")) return false;
    // (nlohmann may stop earlier, at a number out of range.)
    TSB_FUZZ_CHECK(ref.get() != Ref::Json, m);
    return false;
  }
  if (m.starts_with("a number beyond a double's range")) {
    TSB_FUZZ_CHECK(code == ERANGE, m);
    TSB_FUZZ_CHECK(ref.get() == Ref::OutOfRange, m);
    return false;
  }
  // The values and strings limits: valid JSON within the depth limit (a
  // number out of range after the limit was reached is not read).
  TSB_FUZZ_CHECK(code == E2BIG, m);
  const Ref got = ref.get();
  TSB_FUZZ_CHECK(got != Ref::NotJson, m);
  if (got == Ref::OutOfRange) return false;
  const Shape s = shape_of(ref.doc);
  if (m.starts_with("more than"))
    TSB_FUZZ_CHECK(s.values > l.max_values, m);
  else if (m.starts_with("a string or key longer than"))
    TSB_FUZZ_CHECK(s.longest > l.max_string_bytes, m);
  else
    tsb::fuzz::fail("an unknown refusal", m);
  return false;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const std::size_t cap = tsb::venv::ArchiveLimits{}.max_manifest;

  Reference ref(text);
  const bool builder = check(text, tsb::venv::builder_manifest_limits(cap), ref);
  check(text, tsb::venv::stored_manifest_limits(), ref);
  JsonLimits lax;
  lax.duplicate_keys = false;
  check(text, lax, ref);

  auto m = tsb::venv::read_builder_manifest(text, cap);
  const std::size_t first = text.find_first_not_of(" \t\r\n");
  const bool object = builder && first != std::string_view::npos && text[first] == '{';
  TSB_FUZZ_CHECK(m.ok() == object, m.ok() ? "read a manifest that is not an object" : m.error().message);
  if (m.ok()) {
    TSB_FUZZ_CHECK(m->freeze.is_null() || (m->freeze.is_array() && m->freeze.size() <= tsb::venv::kMaxFreezeLines));
    if (m->freeze.is_array())
      for (const auto& e : m->freeze) TSB_FUZZ_CHECK(e.is_string() && e.get_ref<const std::string&>().size() <= tsb::venv::kMaxFreezeLine);
    TSB_FUZZ_CHECK(m->python.is_null() ||
                   (m->python.is_string() && m->python.get_ref<const std::string&>().size() <= tsb::venv::kMaxPythonVersion));
  } else {
    TSB_FUZZ_CHECK(m.error().message.starts_with("the builder's manifest"), m.error().message);
  }
  auto stored = tsb::venv::read_stored_manifest(text);
  if (stored.ok()) TSB_FUZZ_CHECK(stored->is_object());
  return 0;
}
