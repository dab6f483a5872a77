// One reading of the configuration and policies (daemon/policy/sources.h):
// what the compile helper records is what the front end loads, whatever the
// files say by then, and a record serves nothing it does not hold.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "daemon/policy/config.h"
#include "daemon/policy/registry.h"
#include "daemon/policy/sources.h"
#include "isolate/base/unique_fd.h"

namespace tsb::core {
namespace {

namespace fs = std::filesystem;

class SourcesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/tsb-sources-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    ::chmod(dir_.c_str(), 0755);
    fs::create_directories(dir_ + "/policies");
    config_ = dir_ + "/toolsandboxd.json";
    write(config_, R"({"version": 1, "max_queued_runs": 7, "policies_dir": ")" + dir_ + R"(/policies"})");
    write(dir_ + "/policies/base.json", R"({"version": 1, "limits": {"memory": "256MiB"}})");
    write(dir_ + "/policies/default.json", R"({"version": 1, "include": "base.json", "hostname": "one"})");
  }
  void TearDown() override { fs::remove_all(dir_); }
  static void write(const std::string& path, const std::string& text) {
    std::ofstream(path, std::ios::trunc) << text;
    ::chmod(path.c_str(), 0644);
  }
  // The configuration and policies loaded through `files`.
  static std::pair<DaemonConfig, std::shared_ptr<const PolicySet>> load(const std::string& config, bool optional,
                                                                        SourceFiles& files) {
    auto cfg = load_daemon_config(config, optional, &files);
    EXPECT_TRUE(cfg.ok()) << cfg.error().message;
    if (!cfg.ok()) return {};
    auto set = load_policy_set(*cfg, &files);
    EXPECT_TRUE(set.ok()) << set.error().message;
    if (!set.ok()) return {};
    return {*cfg, *set};
  }
  std::string dir_, config_;
};

TEST_F(SourcesTest, TheRecordIsWhatTheFrontEndLoadsWhateverTheFilesSayLater) {
  SourceFiles rec;
  auto [cfg, set] = load(config_, false, rec);
  ASSERT_TRUE(set);
  const std::string fingerprint = set->policies.at("default")->fingerprint;
  EXPECT_EQ(cfg.max_queued_runs, 7u);
  // Every file is edited, one is removed and another policy appears, after
  // the reading: the record still holds what was read.
  write(config_, R"({"version": 1, "max_queued_runs": 9, "policies_dir": ")" + dir_ + R"(/policies"})");
  write(dir_ + "/policies/base.json", R"({"version": 1, "limits": {"memory": "1GiB"}})");
  write(dir_ + "/policies/other.json", R"({"version": 1})");
  fs::remove(dir_ + "/policies/default.json");
  auto replay = SourceFiles::decode(rec.encode());
  ASSERT_TRUE(replay.ok()) << replay.error().message;
  EXPECT_TRUE(replay->replaying());
  auto [cfg2, set2] = load(config_, false, *replay);
  ASSERT_TRUE(set2);
  EXPECT_EQ(cfg2.max_queued_runs, 7u);
  ASSERT_EQ(set2->policies.size(), 2u);  // base and default, not the new one
  EXPECT_EQ(set2->policies.count("other"), 0u);
  EXPECT_EQ(set2->policies.at("default")->fingerprint, fingerprint);
  EXPECT_EQ(set2->policies.at("default")->hostname, "one");
  // The policies directory has no seccomp/default.json: recorded as
  // missing, the profile is the embedded one again.
  EXPECT_EQ(set2->policies.at("default")->seccomp_source, "embedded:seccomp/default.json");
  EXPECT_EQ(set->policies.at("default")->seccomp_source, "embedded:seccomp/default.json");
  // The files as they are now give another set: the record was not them.
  SourceFiles now;
  auto cfg3 = load_daemon_config(config_, false, &now);
  ASSERT_TRUE(cfg3.ok());
  EXPECT_EQ(cfg3->max_queued_runs, 9u);
}

TEST_F(SourcesTest, ARecordServesOnlyWhatItHolds) {
  SourceFiles rec;
  ASSERT_TRUE(load_daemon_config(config_, false, &rec).ok());
  auto replay = SourceFiles::decode(rec.encode());
  ASSERT_TRUE(replay.ok());
  // A file the helper never read is an error, not a read of the disk, and
  // never "missing": an optional configuration must not fall back to the
  // embedded defaults because the record lacks it.
  auto other = load_daemon_config(dir_ + "/policies/default.json", true, &*replay);
  ASSERT_FALSE(other.ok());
  EXPECT_NE(other.error().message.find("not among the files the compile helper read"), std::string::npos)
      << other.error().message;
  auto listing = replay->policy_names(dir_ + "/elsewhere");
  EXPECT_FALSE(listing.ok());
}

TEST_F(SourcesTest, AMissingOptionalConfigurationIsRecordedAsMissing) {
  SourceFiles rec;
  const std::string absent = dir_ + "/absent.json";
  auto cfg = load_daemon_config(absent, true, &rec);
  ASSERT_TRUE(cfg.ok());
  EXPECT_EQ(cfg->source, DaemonConfig{}.source);
  // Created after the reading: the record still says it was missing.
  write(absent, R"({"version": 1, "max_queued_runs": 3})");
  auto replay = SourceFiles::decode(rec.encode());
  ASSERT_TRUE(replay.ok());
  auto again = load_daemon_config(absent, true, &*replay);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->source, DaemonConfig{}.source);
  auto required = load_daemon_config(absent, false, &*replay);
  ASSERT_FALSE(required.ok());
  EXPECT_EQ(required.error().code, ENOENT);
}

TEST_F(SourcesTest, MalformedRecordsAreRefused) {
  SourceFiles rec;
  ASSERT_TRUE(load(config_, false, rec).second);
  const std::string good = rec.encode();
  EXPECT_FALSE(SourceFiles::decode("").ok());
  EXPECT_FALSE(SourceFiles::decode("garbage").ok());
  for (std::size_t cut : {good.size() - 1, good.size() / 2, std::size_t{5}})
    EXPECT_FALSE(SourceFiles::decode(good.substr(0, cut)).ok()) << cut;
  EXPECT_FALSE(SourceFiles::decode(good + "x").ok());
}

TEST_F(SourcesTest, OnlyASealedMemfdIsRead) {
  SourceFiles rec;
  ASSERT_TRUE(load(config_, false, rec).second);
  // The same bytes in a memfd anyone holding it could still change.
  UniqueFd open_fd(::memfd_create("t", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  ASSERT_TRUE(open_fd);
  const std::string bytes = rec.encode();
  ASSERT_EQ(::write(open_fd.get(), bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
  auto unsealed = read_source_record(open_fd.get());
  ASSERT_FALSE(unsealed.ok());
  EXPECT_NE(unsealed.error().message.find("sealed"), std::string::npos);
  // What the compile helper writes is sealed: no one writes it again.
  UniqueFd fd(::memfd_create("t", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  ASSERT_TRUE(fd);
  ASSERT_TRUE(write_source_record(fd.get(), rec).ok());
  EXPECT_EQ(::pwrite(fd.get(), "x", 1, 0), -1);
  EXPECT_EQ(errno, EPERM);
  auto sealed = read_source_record(fd.get());
  ASSERT_TRUE(sealed.ok()) << sealed.error().message;
  auto [cfg, set] = load(config_, false, *sealed);
  EXPECT_EQ(cfg.max_queued_runs, 7u);
  // Read without moving the offset: a restarted front end reads it again.
  EXPECT_TRUE(read_source_record(fd.get()).ok());
  // A plain file is not a record.
  UniqueFd plain(::open(config_.c_str(), O_RDONLY | O_CLOEXEC));
  EXPECT_FALSE(read_source_record(plain.get()).ok());
}

}  // namespace
}  // namespace tsb::core
