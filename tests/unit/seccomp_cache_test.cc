// The command line's cache of compiled seccomp programs
// (daemon/cli/seccomp_cache.h): a program comes back exactly as stored, and
// only from a file and a directory that are root's alone, whole, with its
// digest; anything else is a miss, and a miss compiles.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "daemon/cli/seccomp_cache.h"
#include "daemon/policy/seccomp_profile.h"

namespace tsb::cli {
namespace {

namespace fs = std::filesystem;

class SeccompCache : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "the cache trusts root's files only: run as root";
    char tmpl[] = "/tmp/tsb-seccomp-cache-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    base_ = tmpl;
    dir_ = base_ + "/cache";
    auto p = policy::compile_init_filter();
    ASSERT_TRUE(p.ok()) << p.error().message;
    program_ = *p;
  }
  void TearDown() override {
    if (!base_.empty()) fs::remove_all(base_);
  }
  std::string file(const std::string& key) const { return dir_ + "/" + key; }

  std::string base_, dir_;
  std::shared_ptr<const isolate::SeccompProgram> program_;
};

TEST_F(SeccompCache, KeysNameWhatWasCompiled) {
  const std::string a = seccomp_cache_key("policy sha256:aa"), b = seccomp_cache_key("policy sha256:ab");
  EXPECT_EQ(a.size(), 64u);
  EXPECT_EQ(a.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_NE(a, b);
  EXPECT_EQ(a, seccomp_cache_key("policy sha256:aa"));
}

TEST_F(SeccompCache, AStoredProgramComesBackExactly) {
  const std::string key = seccomp_cache_key("init");
  EXPECT_EQ(load_cached_program(dir_, key), nullptr);  // no directory yet
  ASSERT_TRUE(store_cached_program(dir_, key, *program_).ok());
  struct stat st{};
  ASSERT_EQ(::stat(dir_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  auto p = load_cached_program(dir_, key);
  ASSERT_NE(p, nullptr);
  ASSERT_EQ(p->insns.size(), program_->insns.size());
  EXPECT_EQ(std::memcmp(p->insns.data(), program_->insns.data(), p->insns.size() * sizeof(sock_filter)), 0);
  EXPECT_EQ(p->sha256, program_->sha256);
  // Nothing but the program is left behind.
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 1);
  EXPECT_TRUE(fs::exists(file(key)));
}

TEST_F(SeccompCache, OnlyRootsAloneIsTrusted) {
  const std::string key = seccomp_cache_key("init");
  ASSERT_TRUE(store_cached_program(dir_, key, *program_).ok());
  ASSERT_EQ(::chmod(file(key).c_str(), 0620), 0);  // group-writable
  EXPECT_EQ(load_cached_program(dir_, key), nullptr);
  ASSERT_EQ(::chmod(file(key).c_str(), 0600), 0);
  ASSERT_NE(load_cached_program(dir_, key), nullptr);
  ASSERT_EQ(::chown(file(key).c_str(), 1234, 0), 0);  // someone else's
  EXPECT_EQ(load_cached_program(dir_, key), nullptr);
  ASSERT_EQ(::chown(file(key).c_str(), 0, 0), 0);
  ASSERT_EQ(::chmod(dir_.c_str(), 0777), 0);  // a directory anyone can write to
  EXPECT_EQ(load_cached_program(dir_, key), nullptr);
  EXPECT_FALSE(store_cached_program(dir_, key, *program_).ok());
  ASSERT_EQ(::chmod(dir_.c_str(), 0700), 0);
  // A link planted at the key is not followed.
  const std::string other = seccomp_cache_key("policy other");
  ASSERT_EQ(::symlink(file(key).c_str(), file(other).c_str()), 0);
  EXPECT_EQ(load_cached_program(dir_, other), nullptr);
  EXPECT_EQ(load_cached_program(dir_, "../cache/" + key), nullptr);  // not a key
}

TEST_F(SeccompCache, ATamperedOrShortenedProgramIsAMiss) {
  const std::string key = seccomp_cache_key("init");
  ASSERT_TRUE(store_cached_program(dir_, key, *program_).ok());
  std::string text;
  {
    std::ifstream in(file(key), std::ios::binary);
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  const auto rewrite = [&](const std::string& t) {
    std::ofstream out(file(key), std::ios::binary | std::ios::trunc);
    out << t;
  };
  std::string flipped = text;
  flipped.back() ^= 1;  // the last instruction's k
  rewrite(flipped);
  EXPECT_EQ(load_cached_program(dir_, key), nullptr);
  rewrite(text.substr(0, text.size() - sizeof(sock_filter)));  // one instruction short
  EXPECT_EQ(load_cached_program(dir_, key), nullptr);
  rewrite("x" + text.substr(1));  // not the magic line
  EXPECT_EQ(load_cached_program(dir_, key), nullptr);
  rewrite(text);
  EXPECT_NE(load_cached_program(dir_, key), nullptr);
}

TEST_F(SeccompCache, AMissCompilesAndKeepsAHitDoesNot) {
  int compiles = 0;
  const CompileFn compile = [&]() -> Result<std::shared_ptr<const isolate::SeccompProgram>> {
    ++compiles;
    return program_;
  };
  bool hit = true;
  auto first = cached_or_compiled(dir_, "policy sha256:1", compile, "test", &hit);
  ASSERT_TRUE(first.ok());
  EXPECT_FALSE(hit);
  auto second = cached_or_compiled(dir_, "policy sha256:1", compile, "test", &hit);
  ASSERT_TRUE(second.ok());
  EXPECT_TRUE(hit);
  EXPECT_EQ(compiles, 1);
  EXPECT_EQ((*second)->sha256, program_->sha256);
  // A compile error is the caller's, and nothing is kept for it.
  const CompileFn broken = []() -> Result<std::shared_ptr<const isolate::SeccompProgram>> {
    return Error::invalid("no such syscall");
  };
  auto failed = cached_or_compiled(dir_, "policy sha256:2", broken, "test", &hit);
  EXPECT_FALSE(failed.ok());
  EXPECT_EQ(load_cached_program(dir_, seccomp_cache_key("policy sha256:2")), nullptr);
}

}  // namespace
}  // namespace tsb::cli
