#include "daemon/venv/manifest.h"

#include <string>

namespace tsb::venv {

using nlohmann::json;

protocol::JsonLimits builder_manifest_limits(std::size_t max_bytes) {
  protocol::JsonLimits l;
  l.max_bytes = max_bytes;
  l.max_depth = 2;  // an object of lists of strings
  // The object, its lists, their elements; 256 to spare for members a
  // newer builder may add (ignored here).
  l.max_values = 1 + kMaxFreezeLines + kMaxRequirementsEcho + 256;
  l.max_string_bytes = kMaxFreezeLine;
  l.duplicate_keys = true;  // refused: json.dumps writes each key once
  return l;
}

Result<BuilderManifest> read_builder_manifest(std::string_view text, std::size_t max_bytes) {
  auto doc = protocol::parse_json_limited(text, builder_manifest_limits(max_bytes));
  if (!doc.ok()) return std::move(doc).error().wrap("the builder's manifest");
  if (!doc->is_object()) return Error::invalid("the builder's manifest is not a JSON object", EPROTO);
  BuilderManifest m;
  if (auto f = doc->find("freeze"); f != doc->end() && f->is_array() && f->size() <= kMaxFreezeLines) {
    bool strings = true;
    for (const auto& e : *f) strings = strings && e.is_string();
    if (strings) m.freeze = std::move(*f);
  }
  if (auto f = doc->find("packages"); f != doc->end() && f->is_array() && f->size() <= kMaxFreezeLines) {
    bool strings = true;
    for (const auto& e : *f) strings = strings && e.is_string();
    if (strings) m.packages = std::move(*f);
  }
  if (auto n = doc->find("node"); n != doc->end() && n->is_string() && n->get_ref<const std::string&>().size() <= kMaxPythonVersion)
    m.node = std::move(*n);
  if (auto p = doc->find("python"); p != doc->end() && p->is_string() && p->get_ref<const std::string&>().size() <= kMaxPythonVersion)
    m.python = std::move(*p);
  return m;
}

protocol::JsonLimits stored_manifest_limits() {
  protocol::JsonLimits l;
  l.max_bytes = kMaxStoredManifest;
  l.max_depth = 4;  // 2 today (lists of strings); room for one more level
  l.max_values = 1 + kMaxFreezeLines + kMaxRequirementsEcho + 1024;
  l.max_string_bytes = 64u << 10;
  return l;
}

Result<json> read_stored_manifest(std::string_view text) {
  auto doc = protocol::parse_json_limited(text, stored_manifest_limits());
  if (!doc.ok()) return std::move(doc).error().wrap("the venv's manifest");
  if (!doc->is_object()) return Error::invalid("the venv's manifest is not a JSON object", EPROTO);
  return doc;
}

}  // namespace tsb::venv
