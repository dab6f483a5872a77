// The venv cache (daemon/venv/cache.h): publishing, holds, least recently
// used eviction that never takes a venv in use, another process's removal,
// and what a crash leaves.
#include "daemon/venv/cache.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>

namespace tsb::venv {
namespace {

namespace fs = std::filesystem;

std::string be16(std::uint16_t v) { return std::string{static_cast<char>(v >> 8), static_cast<char>(v & 0xff)}; }
std::string be64(std::uint64_t v) {
  std::string s;
  for (int i = 7; i >= 0; --i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  return s;
}
std::string record(char kind, const std::string& path, std::uint16_t mode, const std::string& payload) {
  return std::string(1, kind) + be16(static_cast<std::uint16_t>(path.size())) + path + be16(mode) + be64(payload.size()) + payload;
}
// A small venv archive: a manifest, a directory, a file of `bytes` bytes.
std::string archive(std::size_t bytes, const std::string& manifest = R"({"requirements": ["x"]})") {
  return std::string(kArchiveMagic) + record('m', "", 0, manifest) + record('d', "lib", 0755, "") +
         record('f', "lib/x.py", 0644, std::string(bytes, 'x')) + record('e', "", 0, "");
}
std::string key(char c) { return std::string(64, c); }

class CacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/tsb-venv-cache-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    ::chmod(dir_.c_str(), 0755);
  }
  void TearDown() override {
    // The venvs are read-only: writable again before removal.
    for (auto& e : fs::recursive_directory_iterator(dir_, fs::directory_options::skip_permission_denied))
      if (e.is_directory() && !e.is_symlink()) ::chmod(e.path().c_str(), 0755);
    ::chmod(dir_.c_str(), 0755);
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::unique_ptr<Cache> open(std::uint64_t max = 1 << 30, bool owner = true) {
    auto c = Cache::open(dir_, max, owner);
    EXPECT_TRUE(c.ok()) << (c.ok() ? "" : c.error().message);
    return c.ok() ? std::move(c).value() : nullptr;
  }
  void publish(Cache& c, const std::string& k, std::size_t bytes) {
    auto s = c.stage(k, ArchiveLimits{});
    ASSERT_TRUE(s.ok()) << s.error().message;
    ASSERT_TRUE((*s)->feed(archive(bytes)).ok());
    auto st = c.publish(**s, {{"build_ms", 12.5}, {"requirements", {"x"}}});
    ASSERT_TRUE(st.ok()) << st.error().message;
  }
  bool exists(const std::string& name) const { return ::access((dir_ + "/" + name).c_str(), F_OK) == 0; }
  std::string dir_;
};

TEST_F(CacheTest, PublishedVenvsAreReadOnlyWithTheirManifest) {
  auto c = open();
  publish(*c, key('a'), 1000);
  EXPECT_TRUE(c->has(key('a')));
  struct stat st{};
  ASSERT_EQ(::stat((dir_ + "/" + key('a')).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0555u);
  ASSERT_EQ(::stat((dir_ + "/" + key('a') + "/lib/x.py").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0444u);
  auto m = c->manifest(key('a'));
  EXPECT_EQ(m["requirements"], nlohmann::json::array({"x"}));
  EXPECT_EQ(m["build_ms"], 12.5);
  EXPECT_EQ(m["key"], key('a'));
  EXPECT_EQ(m["files_bytes"], 1000);
  EXPECT_GT(c->total_bytes(), 1000u);
  // Nothing left over.
  for (auto& e : fs::directory_iterator(dir_)) EXPECT_FALSE(e.path().filename().string().starts_with(".tmp-")) << e.path();
  // A second open reads it back.
  auto again = open();
  EXPECT_TRUE(again->has(key('a')));
  EXPECT_EQ(again->total_bytes(), c->total_bytes());
}

TEST_F(CacheTest, AnUnpublishedOrBrokenBuildLeavesNothing) {
  auto c = open();
  {
    auto s = c->stage(key('b'), ArchiveLimits{});
    ASSERT_TRUE(s.ok());
    ASSERT_TRUE((*s)->feed(archive(10).substr(0, 30)).ok());  // cut short
    EXPECT_FALSE(c->publish(**s, {}).ok());
  }
  {
    auto s = c->stage(key('c'), ArchiveLimits{});
    ASSERT_TRUE(s.ok());
    EXPECT_FALSE((*s)->feed(std::string(kArchiveMagic) + record('f', "../x", 0644, "x")).ok());
  }
  EXPECT_FALSE(c->has(key('b')));
  EXPECT_FALSE(c->has(key('c')));
  std::size_t n = 0;
  for (auto& e : fs::directory_iterator(dir_)) ++n, ADD_FAILURE() << e.path();
  EXPECT_EQ(n, 0u);
  EXPECT_FALSE(c->stage("not-a-key", ArchiveLimits{}).ok());
}

TEST_F(CacheTest, OpeningRemovesWhatACrashLeft) {
  ASSERT_EQ(::mkdir((dir_ + "/.tmp-0123-abcd").c_str(), 0700), 0);
  ASSERT_EQ(::mkdir((dir_ + "/" + key('d')).c_str(), 0555), 0);  // a venv without its manifest
  ::close(::open((dir_ + "/" + key('e') + ".json").c_str(), O_CREAT | O_WRONLY, 0444));  // a manifest without its venv
  ::close(::open((dir_ + "/unrelated").c_str(), O_CREAT | O_WRONLY, 0644));
  // Not the owner (the command line): left alone.
  { auto ro = open(1 << 30, false); }
  EXPECT_TRUE(exists(".tmp-0123-abcd"));
  auto c = open();
  EXPECT_FALSE(exists(".tmp-0123-abcd"));
  EXPECT_FALSE(exists(key('d')));
  EXPECT_FALSE(exists(key('e') + ".json"));
  EXPECT_TRUE(exists("unrelated"));
  EXPECT_TRUE(c->entries().empty());
}

TEST_F(CacheTest, RefusesADirectoryOthersCanWrite) {
  ::chmod(dir_.c_str(), 0777);
  EXPECT_FALSE(Cache::open(dir_, 1 << 30).ok());
  EXPECT_FALSE(Cache::open(dir_ + "/missing", 1 << 30).ok());
}

TEST_F(CacheTest, LeastRecentlyUsedGoesFirstButNeverOneInUse) {
  auto c = open(3 * 20000);
  publish(*c, key('1'), 10000);
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  publish(*c, key('2'), 10000);
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  {
    Cache::Hold h1 = c->hold(key('1'));  // now the most recent, and in use
    ASSERT_TRUE(h1);
    EXPECT_EQ(c->entries().at(key('1')).in_use, 1u);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    publish(*c, key('3'), 10000);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    publish(*c, key('4'), 10000);  // over the cap: 2 goes (least recent not in use)
    EXPECT_TRUE(c->has(key('1')));
    EXPECT_FALSE(c->has(key('2')));
    EXPECT_FALSE(exists(key('2')));
    EXPECT_FALSE(exists(key('2') + ".json"));
    // Everything but the held one.
    auto gone = c->evict(0);
    EXPECT_EQ(gone.size(), 2u);
    EXPECT_TRUE(c->has(key('1')));
    EXPECT_EQ(c->remove(key('1')).error().code, EBUSY);
  }
  EXPECT_EQ(c->entries().at(key('1')).in_use, 0u);
  EXPECT_TRUE(c->remove(key('1')).ok());
  EXPECT_TRUE(c->entries().empty());
  EXPECT_EQ(c->total_bytes(), 0u);
}

TEST_F(CacheTest, AnotherProcessNeverRemovesAVenvInUseAndItsRemovalsAreSeen) {
  auto daemon = open();
  publish(*daemon, key('a'), 100);
  publish(*daemon, key('b'), 100);
  Cache::Hold h = daemon->hold(key('a'));
  ASSERT_TRUE(h);
  // The command line: a cache object of its own (flock(2) locks belong to
  // open file descriptions, so two objects in one process behave as two
  // processes do).
  auto cli = open(0, false);
  EXPECT_TRUE(cli->held_anywhere(key('a')));
  EXPECT_FALSE(cli->held_anywhere(key('b')));
  auto gone = cli->evict();
  EXPECT_EQ(gone, std::vector<std::string>{key('b')});
  EXPECT_TRUE(exists(key('a')));
  EXPECT_EQ(cli->remove(key('a')).error().code, EBUSY);
  // The daemon no longer finds b: a hold on it is none (it would build it
  // again), and a refresh forgets it.
  EXPECT_TRUE(daemon->has(key('b')));
  EXPECT_FALSE(daemon->hold(key('b')));
  EXPECT_FALSE(daemon->has(key('b')));
  h.release();
  EXPECT_FALSE(cli->held_anywhere(key('a')));
  EXPECT_TRUE(cli->remove(key('a')).ok());
  daemon->refresh();
  EXPECT_FALSE(daemon->has(key('a')));
}

TEST_F(CacheTest, TheManifestKeepsOnlyWhatTheBuilderMaySay) {
  auto c = open();
  auto s = c->stage(key('a'), ArchiveLimits{});
  ASSERT_TRUE(s.ok());
  // A builder's manifest with claims of its own and a freeze of the wrong
  // shape; the caller's log tail with invalid UTF-8.
  const std::string m = R"({"requirements": ["lies"], "bytes": 1, "key": "x", "python": "3.11.2", "extra": {"a": 1},)"
                        R"( "freeze": [1, 2]})";
  ASSERT_TRUE((*s)->feed(archive(10, m)).ok());
  auto st = c->publish(**s, {{"requirements", {"x"}}, {"log_tail", std::string("pip \xff\xfe said")}});
  ASSERT_TRUE(st.ok()) << st.error().message;
  EXPECT_FALSE((*s)->feed("more").ok()) << "a published staging takes no more bytes";
  const auto got = c->manifest(key('a'));
  EXPECT_EQ(got["requirements"], nlohmann::json::array({"x"}));
  EXPECT_EQ(got["python"], "3.11.2");
  EXPECT_TRUE(got["freeze"].is_null());
  EXPECT_FALSE(got.contains("extra"));
  EXPECT_EQ(got["key"], key('a'));
  EXPECT_GT(got["bytes"].get<std::uint64_t>(), 10u);
  EXPECT_NE(got["log_tail"].get<std::string>().find("said"), std::string::npos);
  // The frame was written (archive.h).
  EXPECT_EQ(fs::read_symlink(fs::path(dir_) / key('a') / "bin/python3"), "/usr/bin/python3");
}

// What the builder cannot legitimately write (daemon/venv/manifest.h) fails
// the build, with the reason, and leaves nothing behind.
TEST_F(CacheTest, ABuilderManifestPastItsLimitsFailsThePublish) {
  auto c = open();
  std::string deep = "1";
  for (int i = 0; i < 500; ++i) deep = "[" + deep + "]";
  std::string many = R"({"freeze": [)";
  for (int i = 0; i < 20000; ++i) many += i ? ",\"x\"" : "\"x\"";
  many += "]}";
  const std::pair<std::string, std::string> cases[] = {
      {R"({"python": "3.11.2", "deep": )" + deep + "}", "nested deeper than 2 levels (at byte 30)"},
      {many, "more than 10321 values"},
      {R"({"freeze": [")" + std::string(5000, 'x') + R"("]})", "a string or key longer than 4096 bytes (5000)"},
      {"{\"python\": \"3.11\xff\"}", "not JSON: invalid UTF-8 in a string (at byte 16)"},
      {"[]", "is not a JSON object"},
      {"", "has no manifest"},
  };
  for (const auto& [manifest, why] : cases) {
    auto s = c->stage(key('a'), ArchiveLimits{});
    ASSERT_TRUE(s.ok());
    ASSERT_TRUE((*s)->feed(archive(10, manifest)).ok());
    auto st = c->publish(**s, {{"requirements", {"x"}}});
    ASSERT_FALSE(st.ok()) << why;
    EXPECT_NE(st.error().message.find(why), std::string::npos) << st.error().message;
    EXPECT_EQ(st.error().message.rfind("the venv archive", 0), 0u) << st.error().message;
    EXPECT_FALSE(c->has(key('a')));
  }
  for (auto& e : fs::directory_iterator(dir_)) ADD_FAILURE() << "left behind: " << e.path();
}

// A stored manifest that does not read back is a damaged venv: the front end
// removes it at open, like one without a manifest; the command line leaves it.
TEST_F(CacheTest, ADamagedManifestIsADamagedVenv) {
  {
    auto c = open();
    publish(*c, key('a'), 10);
    publish(*c, key('b'), 10);
  }
  const std::string damaged = dir_ + "/" + key('b') + ".json";
  ASSERT_EQ(::chmod(damaged.c_str(), 0644), 0);
  {
    const int fd = ::open(damaged.c_str(), O_WRONLY | O_TRUNC);
    ASSERT_GE(fd, 0);
    const std::string text = "{\"bytes\": 10, \"x\": \"\xff\"}";
    ASSERT_EQ(::write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
    ::close(fd);
  }
  {
    auto cli = open(1 << 30, false);
    EXPECT_TRUE(cli->has(key('a')));
    EXPECT_FALSE(cli->has(key('b')));
    EXPECT_TRUE(cli->manifest(key('b')).is_null());
    EXPECT_TRUE(exists(key('b')));
  }
  auto c = open();
  EXPECT_TRUE(c->has(key('a')));
  EXPECT_FALSE(c->has(key('b')));
  EXPECT_FALSE(exists(key('b')));
}

TEST_F(CacheTest, AskingWhetherAVenvIsHeldNeverMakesAHoldFail) {
  auto daemon = open();
  publish(*daemon, key('a'), 100);
  auto cli = open(0, false);
  // The command line asks, over and over, while the daemon takes and lets
  // go of its first hold: a question that took a lock, even for a moment,
  // would make some hold fail and the daemon forget the venv.
  std::atomic<bool> stop{false};
  std::atomic<unsigned> asked{0};
  std::thread asker([&] {
    while (!stop) {
      (void)cli->held_anywhere(key('a'));
      ++asked;
    }
  });
  unsigned failed = 0;
  for (int i = 0; i < 5000; ++i) {
    {
      Cache::Hold h = daemon->hold(key('a'));
      if (!h) {
        ++failed;
        break;
      }
    }
    // Unheld for a moment: a question that locked would get its lock now
    // and then and be holding it when the next hold comes.
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  stop = true;
  asker.join();
  EXPECT_EQ(failed, 0u) << "after " << asked << " questions";
  EXPECT_GT(asked.load(), 0u);
  EXPECT_TRUE(daemon->has(key('a')));
  Cache::Hold h = daemon->hold(key('a'));
  ASSERT_TRUE(h);
  EXPECT_TRUE(cli->held_anywhere(key('a')));
}

TEST_F(CacheTest, PublishingOverAVenvBeingRemovedTakesItsPlace) {
  auto c = open();
  // What another process's removal leaves for a moment: the manifest
  // unlinked, the directory not yet moved away.
  ASSERT_EQ(::mkdir((dir_ + "/" + key('a')).c_str(), 0700), 0);
  ::close(::open((dir_ + "/" + key('a') + "/stale").c_str(), O_CREAT | O_WRONLY, 0444));
  ::chmod((dir_ + "/" + key('a')).c_str(), 0555);
  publish(*c, key('a'), 100);
  EXPECT_TRUE(c->has(key('a')));
  EXPECT_FALSE(exists(key('a') + "/stale"));
  EXPECT_TRUE(exists(key('a') + "/lib/x.py"));
  // And over a complete one (a hold that failed while a removal was
  // refused): the one there stays.
  auto s = c->stage(key('a'), ArchiveLimits{});
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE((*s)->feed(archive(5)).ok());
  ASSERT_TRUE(c->publish(**s, {{"requirements", {"y"}}}).ok());
  EXPECT_EQ(c->manifest(key('a'))["requirements"], nlohmann::json::array({"x"}));
  s->reset();
  for (auto& e : fs::directory_iterator(dir_)) EXPECT_FALSE(e.path().filename().string().starts_with(".tmp-")) << e.path();
}

TEST(VenvKey, Shape) {
  EXPECT_TRUE(is_key(std::string(64, 'f')));
  EXPECT_FALSE(is_key(std::string(63, 'f')));
  EXPECT_FALSE(is_key(std::string(64, 'F')));
  EXPECT_FALSE(is_key(std::string(63, 'f') + "/"));
}


TEST_F(CacheTest, ANodeModulesTreeIsPublishedWithoutAVenvFrameAndSaysItsKind) {
  auto c = open();
  auto s = c->stage(key('d'), ArchiveLimits{});
  ASSERT_TRUE(s.ok()) << s.error().message;
  const std::string tree = std::string(kArchiveMagic) +
                           record('m', "", 0, R"({"packages": ["tsb-base@1.0.0", "tsb-top@2.1.0"], "node": "20.1.0", "freeze": ["x==1"]})") +
                           record('d', "tsb-top", 0755, "") + record('f', "tsb-top/index.js", 0644, "module.exports = 1;\n") +
                           record('e', "", 0, "");
  ASSERT_TRUE((*s)->feed(tree).ok());
  ASSERT_TRUE(c->publish_tree(**s, {{"requirements", {"tsb-top"}}}).ok());
  EXPECT_TRUE(exists(key('d') + "/tsb-top/index.js"));
  EXPECT_FALSE(exists(key('d') + "/pyvenv.cfg"));  // no interpreter frame
  EXPECT_FALSE(exists(key('d') + "/bin"));
  auto m = c->manifest(key('d'));
  EXPECT_EQ(m["kind"], "node_modules");
  EXPECT_EQ(kind_of(m), "node_modules");
  EXPECT_EQ(m["packages"], nlohmann::json::array({"tsb-base@1.0.0", "tsb-top@2.1.0"}));
  EXPECT_EQ(m["node"], "20.1.0");
  EXPECT_FALSE(m.contains("freeze"));  // what a venv keeps is not a tree's
  struct stat st{};
  ASSERT_EQ(::stat((dir_ + "/" + key('d')).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0555u);
  // A venv says its kind too; one written before kinds reads as a venv.
  publish(*c, key('c'), 10);
  EXPECT_EQ(c->manifest(key('c'))["kind"], "venv");
  EXPECT_EQ(kind_of(nlohmann::json::object()), "venv");
  // The same cache, the same eviction: both go when nothing holds them.
  EXPECT_EQ(c->evict(0).size(), 2u);
}

}  // namespace
}  // namespace tsb::venv
