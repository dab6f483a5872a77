// One reading of the configuration and the policy files.
//
// The compile helper (uid 0, no capability) reads the configuration, every
// policy, include, seccomp profile and the organizations table through a
// recording SourceFiles; the record goes, in a sealed memfd the root
// spawner never reads, to the front end, which loads the same files from
// it with the same code and opens none of them. The two halves cannot see
// different sets: not after an edit between two readings, not for a file
// only root may read. Embedded files ("embedded:...") are read from the
// binary both halves share and are not recorded.
//
// The helper writes and seals the record in a memfd the spawner made; the
// spawner keeps it for each front end it starts and sends it with a reload.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "isolate/base/result.h"

namespace tsb::core {

class SourceFiles {
 public:
  // Reads the file system and keeps what it read.
  SourceFiles() = default;
  // Serves the answers of a record (encode()) and nothing else: a path the
  // record does not hold is an error, never a read of the file system.
  static Result<SourceFiles> decode(std::string_view record);
  std::string encode() const;

  // The text of a configuration or policy file, read with
  // read_policy_text's rules; ENOENT for a file that was missing.
  Result<std::string> read(const std::string& path);
  // The policy names in a policies directory (its *.json files but
  // organizations.json and hidden ones), sorted.
  Result<std::vector<std::string>> policy_names(const std::string& dir);

  bool replaying() const noexcept { return replay_; }

 private:
  bool replay_ = false;
  std::map<std::string, std::optional<std::string>> files_;  // nullopt: missing
  std::map<std::string, std::vector<std::string>> dirs_;
};

// The record of a sealed memfd (written by the compile helper, passed on
// by the spawner), read without moving its offset.
Result<SourceFiles> read_source_record(int fd);
// Writes `files`' record to the memfd `fd` and seals it (the compile
// helper's side).
Status write_source_record(int fd, const SourceFiles& files);

}  // namespace tsb::core
