#include "protocol/json_limits.h"

#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "protocol/json_scan.h"

namespace tsb::protocol {

bool json_nesting_within(std::string_view text, int max_depth) {
  int depth = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;  // skip the escaped character
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    else if (c == '[' || c == '{') {
      if (++depth > max_depth) return false;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return true;
}

nlohmann::json parse_json_bounded(std::string_view text) {
  // nlohmann's lexer takes a NUL byte for the end of the input, so
  // "{}\0anything" would parse as {}. JSON has no raw NUL anywhere (inside a
  // string it is a control character that must be escaped), and Python's
  // json.loads refuses it, so it is refused here before nlohmann sees it.
  if (text.find('\0') != std::string_view::npos || !json_nesting_within(text))
    return nlohmann::json(nlohmann::json::value_t::discarded);
  return nlohmann::json::parse(text.begin(), text.end(), nullptr, false);
}

namespace {

using nlohmann::json;

std::string deeper_than(int depth) {
  return "nested deeper than " + std::to_string(depth) + (depth == 1 ? " level" : " levels");
}

// Builds the document from nlohmann's SAX events (its parser is iterative),
// counting values and measuring strings as they come: the first limit
// broken stops the parse, so nothing past it is ever allocated.
class LimitedBuilder {
 public:
  LimitedBuilder(json& root, const JsonLimits& limits) : root_(root), limits_(limits) {}

  bool null() { return add(json(nullptr)); }
  bool boolean(bool v) { return add(json(v)); }
  bool number_integer(json::number_integer_t v) { return add(json(v)); }
  bool number_unsigned(json::number_unsigned_t v) { return add(json(v)); }
  bool number_float(json::number_float_t v, const json::string_t&) { return add(json(v)); }
  bool string(json::string_t& v) { return fits(v) && add(json(std::move(v))); }
  bool binary(json::binary_t&) { return refuse(EINVAL, "not JSON: a binary value"); }  // JSON text has none
  bool start_object(std::size_t) { return open(json::value_t::object); }
  bool start_array(std::size_t) { return open(json::value_t::array); }
  bool key(json::string_t& k) {
    if (!fits(k)) return false;
    // An existing key (duplicate_keys off) is overwritten: the last one wins.
    member_ = &stack_.back()->get_ref<json::object_t&>()[std::move(k)];
    return true;
  }
  bool end_object() { return close(); }
  bool end_array() { return close(); }
  bool parse_error(std::size_t byte, const std::string&, const json::exception& e) {
    // The text was scanned already, so only a number nlohmann cannot hold
    // (1e400: out_of_range 406) is expected here.
    const std::string at = " (at byte " + std::to_string(byte > 0 ? byte - 1 : 0) + ")";
    if (e.id == 406) return refuse(ERANGE, "a number beyond a double's range" + at);
    return refuse(EINVAL, std::string("not JSON: ") + e.what() + at);
  }

  Error error() const { return error_; }

 private:
  bool refuse(int code, std::string why) {
    if (error_.message.empty()) error_ = Error::invalid(why, code);
    return false;
  }
  bool fits(const json::string_t& s) {
    if (s.size() <= limits_.max_string_bytes) return true;
    return refuse(E2BIG, "a string or key longer than " + std::to_string(limits_.max_string_bytes) + " bytes (" +
                             std::to_string(s.size()) + ")");
  }
  // Counts a value and puts it where the document is at; its address, for a
  // container that is opened.
  json* place(json v) {
    if (stack_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    json& top = *stack_.back();
    if (top.is_array()) {
      auto& a = top.get_ref<json::array_t&>();
      a.push_back(std::move(v));
      return &a.back();
    }
    *member_ = std::move(v);
    return member_;
  }
  bool counted() {
    if (++values_ <= limits_.max_values) return true;
    return refuse(E2BIG, "more than " + std::to_string(limits_.max_values) + (limits_.max_values == 1 ? " value" : " values"));
  }
  bool add(json v) { return counted() && place(std::move(v)) != nullptr; }
  bool open(json::value_t t) {
    if (!counted()) return false;
    // scan_json checked the depth; checked again, as this is what recurses.
    if (stack_.size() >= static_cast<std::size_t>(limits_.max_depth))
      return refuse(E2BIG, deeper_than(limits_.max_depth));
    stack_.push_back(place(json(t)));
    return true;
  }
  bool close() {
    stack_.pop_back();
    return true;
  }

  json& root_;
  const JsonLimits& limits_;
  std::vector<json*> stack_;  // the open containers; a pointer stays valid while its parent takes nothing new
  json* member_ = nullptr;    // the member a key named, for the value that follows
  std::size_t values_ = 0;
  Error error_;
};

}  // namespace

Result<nlohmann::json> parse_json_limited(std::string_view text, const JsonLimits& limits) {
  if (text.size() > limits.max_bytes)
    return Error::invalid("larger than " + std::to_string(limits.max_bytes) + " bytes (" + std::to_string(text.size()) + ")",
                          E2BIG);
  JsonScanOptions o;
  o.max_depth = limits.max_depth;
  o.duplicate_keys = limits.duplicate_keys;
  const auto scanned = scan_json(text, o);
  if (const auto* e = std::get_if<JsonScanError>(&scanned)) {
    const std::string at = " (at byte " + std::to_string(e->offset) + ")";
    if (e->failure == JsonScanFailure::TooDeep)
      return Error::invalid(deeper_than(limits.max_depth) + at, E2BIG);
    return Error::invalid("not JSON: " + std::string(e->what) + at);
  }
  // Valid JSON without NUL bytes from here on: nlohmann reads all of it.
  json doc;
  LimitedBuilder b(doc, limits);
  if (!json::sax_parse(text.begin(), text.end(), &b)) {
    Error e = b.error();
    if (e.message.empty()) e = Error::invalid("not JSON");
    return e;
  }
  return doc;
}

}  // namespace tsb::protocol
