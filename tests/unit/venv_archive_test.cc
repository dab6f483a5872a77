// The venv archive (daemon/venv/archive.h): what the builder writes is what
// the front end extracts, in any cut of the stream; and a hostile stream
// never reaches outside its directory, overwrites, or leaves anything
// writable.
#include "daemon/venv/archive.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace {

namespace fs = std::filesystem;
using tsb::UniqueFd;
using tsb::venv::ArchiveLimits;
using tsb::venv::Extractor;

std::string be(std::uint64_t v, int bytes) {
  std::string s;
  for (int i = bytes - 1; i >= 0; --i) s += static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

std::string rec(char kind, const std::string& path, std::uint16_t mode, const std::string& payload) {
  return std::string(1, kind) + be(path.size(), 2) + path + be(mode, 2) + be(payload.size(), 8) + payload;
}

const std::string kEnd = rec('e', "", 0, "");

struct Dir {
  fs::path path;
  Dir() {
    char t[] = "/tmp/tsb-venv-archive-XXXXXX";
    path = ::mkdtemp(t);
  }
  ~Dir() {
    // Read-only directories made by the extractor: writable again first.
    std::error_code ec;
    for (auto it = fs::recursive_directory_iterator(path, ec); it != fs::recursive_directory_iterator(); it.increment(ec))
      if (it->is_directory(ec) && !it->is_symlink(ec)) fs::permissions(it->path(), fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(path, ec);
  }
  UniqueFd make(const std::string& name) const {
    fs::create_directory(path / name);
    return UniqueFd(::open((path / name).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  }
};

// Extracts `stream` into a fresh directory `out` of `d`, fed in pieces of `cut`.
tsb::Status extract(const Dir& d, const std::string& stream, std::size_t cut = 1 << 16, ArchiveLimits lim = {},
                    std::string* manifest = nullptr, const tsb::venv::Interpreter& py = {}) {
  Extractor x(d.make("out"), lim);
  for (std::size_t i = 0; i < stream.size(); i += cut)
    if (auto s = x.feed(std::string_view(stream).substr(i, cut)); !s.ok()) return s;
  auto s = x.finish(py);
  if (manifest) *manifest = x.manifest();
  return s;
}

std::string error_of(const tsb::Status& s) { return s.ok() ? "" : s.error().message; }

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

unsigned mode_of(const fs::path& p) {
  struct stat st {};
  EXPECT_EQ(::lstat(p.c_str(), &st), 0) << p;
  return st.st_mode & 07777;
}

TEST(VenvArchive, TheBuildersArchiveExtractsExactlyInAnyCut) {
  Dir src;
  const fs::path t = src.path / "venv";
  fs::create_directories(t / "bin");
  fs::create_directories(t / "lib/python3.11/site-packages/pkg/__pycache__");
  std::ofstream(t / "pyvenv.cfg") << "home = /usr/bin\n";
  std::ofstream(t / "bin/tool") << "#!/venv/bin/python3\n";
  fs::permissions(t / "bin/tool", fs::perms::owner_all | fs::perms::group_read | fs::perms::others_read);
  std::ofstream(t / "lib/python3.11/site-packages/pkg/__init__.py") << std::string(300000, 'x');
  std::ofstream(t / "lib/python3.11/site-packages/pkg/empty.py");
  // What decides the interpreter is the daemon's: the builder leaves it
  // out, and the extractor writes its own.
  fs::create_symlink("/evil/python3", t / "bin/python3");
  fs::create_symlink("python3", t / "bin/python");
  std::ofstream(t / "bin/python3._pth") << "/evil\n";
  fs::create_symlink("lib", t / "lib64");
  std::ofstream(t / "bin/python-dotenv") << "#!/venv/bin/python3\n";  // not reserved
  const std::string builder = std::string(TSB_SOURCE_DIR) + "/isolate/runner/toolsandbox_venv_builder.py";
  const std::string cmd = "/usr/bin/python3 " + builder + " --archive " + t.string();
  std::FILE* p = ::popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string stream;
  char buf[65536];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) stream.append(buf, n);
  ASSERT_EQ(::pclose(p), 0);
  ASSERT_EQ(stream.substr(0, 8), "TSBVENV1");

  for (std::size_t cut : {std::size_t{1}, std::size_t{7}, std::size_t{4096}, stream.size()}) {
    Dir d;
    std::string manifest;
    ASSERT_EQ(error_of(extract(d, stream, cut, {}, &manifest, {"/usr/bin/python3", "3.11"})), "") << "cut " << cut;
    EXPECT_EQ(manifest, "{}");
    const fs::path o = d.path / "out";
    EXPECT_EQ(slurp(o / "pyvenv.cfg"), "home = /usr/bin\ninclude-system-site-packages = false\nversion = 3.11\n");
    EXPECT_EQ(fs::read_symlink(o / "bin/python3.11"), "python3");
    EXPECT_FALSE(fs::exists(fs::symlink_status(o / "bin/python3._pth")));
    EXPECT_EQ(slurp(o / "bin/python-dotenv"), "#!/venv/bin/python3\n");
    EXPECT_EQ(slurp(o / "lib/python3.11/site-packages/pkg/__init__.py"), std::string(300000, 'x'));
    EXPECT_EQ(slurp(o / "lib/python3.11/site-packages/pkg/empty.py"), "");
    EXPECT_EQ(fs::read_symlink(o / "bin/python3"), "/usr/bin/python3");
    EXPECT_EQ(fs::read_symlink(o / "bin/python"), "python3");
    EXPECT_EQ(fs::read_symlink(o / "lib64"), "lib");
    EXPECT_EQ(mode_of(o / "bin/tool"), 0555u);
    EXPECT_EQ(mode_of(o / "pyvenv.cfg"), 0444u);
    EXPECT_EQ(mode_of(o / "lib/python3.11/site-packages/pkg/__pycache__"), 0555u);
    EXPECT_EQ(mode_of(o), 0555u);
  }
}

TEST(VenvArchive, HostilePathsAreRefused) {
  const std::string magic = "TSBVENV1";
  for (const std::string& bad : {std::string("../x"), std::string("/abs"), std::string("a//b"), std::string("a/"),
                                 std::string("."), std::string("a/./b"), std::string("a/../b"), std::string("a\0b", 3),
                                 std::string(256, 'c'), std::string("")}) {
    Dir d;
    const std::string s = magic + rec('d', "a", 0755, "") + rec('f', bad, 0644, "data") + kEnd;
    EXPECT_NE(error_of(extract(d, s)), "") << "path " << bad;
    EXPECT_FALSE(fs::exists(d.path / "x")) << bad;
  }
  std::string deep;
  std::string s = magic;
  for (int i = 0; i < 65; ++i) {
    deep += (i ? "/" : "") + std::string("d");
    s += rec('d', deep, 0755, "");
  }
  Dir d;
  EXPECT_NE(error_of(extract(d, s + kEnd)).find("deeper than 64"), std::string::npos);
  // A header that claims a path over 4096 bytes is refused before it is read.
  Dir d2;
  EXPECT_NE(error_of(extract(d2, magic + "f" + be(5000, 2))).find("longer than 4096"), std::string::npos);
}

TEST(VenvArchive, NothingIsFollowedOrOverwritten) {
  const std::string magic = "TSBVENV1";
  Dir d;
  fs::create_directory(d.path / "outside");
  const std::string outside = (d.path / "outside").string();
  // A link to a directory outside, then a file through it.
  EXPECT_NE(error_of(extract(d, magic + rec('l', "evil", 0, outside) + rec('f', "evil/x", 0644, "data") + kEnd)), "");
  EXPECT_FALSE(fs::exists(d.path / "outside/x"));
  // A link, then a file of the same name: not written through the link.
  for (char kind : {'f', 'd', 'l'}) {
    Dir e;
    fs::create_directory(e.path / "outside");
    const std::string target = (e.path / "outside/victim").string();
    auto err = error_of(extract(e, magic + rec('l', "a", 0, target) + rec(kind, "a", 0644, kind == 'd' ? "" : "zz") + kEnd));
    EXPECT_NE(err.find("appears twice"), std::string::npos) << kind << ": " << err;
    EXPECT_FALSE(fs::exists(target)) << kind;
  }
  // The same file twice.
  Dir f;
  EXPECT_NE(error_of(extract(f, magic + rec('f', "a", 0644, "1") + rec('f', "a", 0644, "2") + kEnd)).find("appears twice"),
            std::string::npos);
  EXPECT_EQ(slurp(f.path / "out/a"), "1");
  // A parent that was never made.
  Dir g;
  EXPECT_NE(error_of(extract(g, magic + rec('f', "nodir/x", 0644, "1") + kEnd)).find("not a directory of the archive"),
            std::string::npos);
  // A file as a parent.
  Dir h;
  EXPECT_NE(error_of(extract(h, magic + rec('f', "a", 0644, "1") + rec('f', "a/b", 0644, "1") + kEnd)), "");
}

// A refusal that names a path the build wrote (here: the same name twice,
// and a parent that was never made) says it escaped: a newline and a
// forged log line, OSC and CSI sequences, BEL, CR, a C1 control, a
// bidirectional control and bytes that are not UTF-8 all come out as
// escapes, in one line.
TEST(VenvArchive, ARefusalNamesAHostilePathEscaped) {
  const std::string magic = "TSBVENV1";
  const std::string hostile = "x\n2024-01-01 00:00:00 info audit run_id=forged\x1b]0;pwned\x07\x1b[2J\r\xc2\x9b\xe2\x80\xae\xff";
  for (const std::string& stream : {magic + rec('f', hostile, 0644, "1") + rec('f', hostile, 0644, "2") + kEnd,
                                    magic + rec('f', hostile + "/y", 0644, "1") + kEnd}) {
    Dir d;
    const std::string err = error_of(extract(d, stream));
    ASSERT_NE(err, "");
    for (char c : err) {
      const auto u = static_cast<unsigned char>(c);
      EXPECT_TRUE(u >= 0x20 && u < 0x7f) << "raw byte " << int(u) << " in: " << err;
    }
    EXPECT_NE(err.find("x\\n2024-01-01 00:00:00 info audit run_id=forged\\u001B]0;pwned\\u0007\\u001B[2J\\r\\u009B\\u202E\\xFF"),
              std::string::npos)
        << err;
  }
}

TEST(VenvArchive, ModesAreNeverWritableOrSetuid) {
  Dir d;
  const std::string s = "TSBVENV1" + rec('d', "bin", 07777, "") + rec('f', "bin/x", 07777, "#!") +
                        rec('f', "bin/y", 06644, "y") + rec('f', "z", 0222, "z") + kEnd;
  ASSERT_EQ(error_of(extract(d, s)), "");
  EXPECT_EQ(mode_of(d.path / "out/bin"), 0555u);
  EXPECT_EQ(mode_of(d.path / "out/bin/x"), 0555u);
  EXPECT_EQ(mode_of(d.path / "out/bin/y"), 0444u);
  EXPECT_EQ(mode_of(d.path / "out/z"), 0444u);
}

TEST(VenvArchive, LimitsAndFraming) {
  const std::string magic = "TSBVENV1";
  auto err = [&](const std::string& s, ArchiveLimits lim = {}) {
    Dir d;
    return error_of(extract(d, s, 3, lim));
  };
  ArchiveLimits small;
  small.max_file_bytes = 10;
  small.max_entries = 3;
  small.max_manifest = 8;
  EXPECT_EQ(err(magic + rec('f', "a", 0644, std::string(10, 'x')) + kEnd, small), "");
  EXPECT_NE(err(magic + rec('f', "a", 0644, std::string(6, 'x')) + rec('f', "b", 0644, std::string(5, 'x')) + kEnd, small)
                .find("more than 10 bytes"),
            std::string::npos);
  EXPECT_NE(err(magic + rec('d', "a", 0, "") + rec('d', "b", 0, "") + rec('d', "c", 0, "") + rec('d', "d", 0, "") + kEnd,
                small)
                .find("more than 3 entries"),
            std::string::npos);
  EXPECT_NE(err(magic + rec('m', "", 0, "123456789") + kEnd, small).find("manifest over"), std::string::npos);
  EXPECT_NE(err(magic + rec('m', "", 0, "{}") + rec('m', "", 0, "{}") + kEnd).find("second manifest"), std::string::npos);
  EXPECT_NE(err(magic + rec('m', "x", 0, "{}") + kEnd).find("with a path"), std::string::npos);
  EXPECT_NE(err(magic + rec('x', "a", 0, "") + kEnd).find("unknown record kind"), std::string::npos);
  EXPECT_NE(err(magic + rec('d', "a", 0, "zz") + kEnd).find("with content"), std::string::npos);
  EXPECT_NE(err(magic + rec('l', "a", 0, "") + kEnd).find("empty target"), std::string::npos);
  EXPECT_NE(err(magic + rec('l', "a", 0, std::string(4097, 'l')) + kEnd).find("longer than 4096"), std::string::npos);
  EXPECT_NE(err(magic + kEnd + "x").find("after the end"), std::string::npos);
  EXPECT_NE(err(magic + rec('f', "a", 0644, "1")).find("before its end record"), std::string::npos);
  EXPECT_NE(err(magic + rec('f', "a", 0644, "1234") .substr(0, 20)).find("before its end record"), std::string::npos);
  EXPECT_NE(err("TSBVENV2" + kEnd).find("not a venv archive"), std::string::npos);
  EXPECT_NE(err(magic + rec('e', "x", 0, "")).find("malformed end"), std::string::npos);
  EXPECT_NE(err("").find("before its end record"), std::string::npos);

  // The first error stays.
  Dir d;
  Extractor x(d.make("out"), {});
  EXPECT_FALSE(x.feed("NOTMAGIC").ok());
  EXPECT_FALSE(x.feed(magic + kEnd).ok());
  EXPECT_FALSE(x.finish({}).ok());

  // Paths and link targets together are capped.
  ArchiveLimits meta;
  meta.max_meta_bytes = 10;
  EXPECT_EQ(err(magic + rec('d', "abcde", 0, "") + kEnd, meta), "");
  EXPECT_NE(err(magic + rec('d', "abcde", 0, "") + rec('l', "ab", 0, "target") + kEnd, meta).find("bytes of paths"),
            std::string::npos);
}

// The runner's parent holds the run's nonce and starts from
// /venv/bin/python3: nothing that chooses its code comes from a build.
TEST(VenvArchive, WhatChoosesTheInterpreterIsNeverTakenFromTheArchive) {
  const std::string magic = "TSBVENV1";
  const std::string bin = rec('d', "bin", 0755, "");
  for (const std::string& path : {"pyvenv.cfg", "lib64", "bin/pyvenv.cfg", "bin/python", "bin/python3", "bin/python3.11",
                                  "bin/python3.9", "bin/python3._pth", "bin/python3.11._pth", "bin/x._pth"}) {
    for (char kind : {'f', 'l', 'd'}) {
      Dir d;
      const std::string err = error_of(extract(d, magic + bin + rec(kind, path, 0755, kind == 'd' ? "" : "/evil") + kEnd));
      EXPECT_NE(err.find("the daemon's to write"), std::string::npos) << kind << " " << path << ": " << err;
      EXPECT_TRUE(tsb::venv::reserved_path(path)) << path;
    }
  }
  for (const std::string& path : {"bin/python-dotenv", "bin/python3x", "bin/python3.", "bin/pythonw", "lib/pyvenv.cfg",
                                  "lib/python3.11", "bin/sub/python3", "lib64x", "python3"})
    EXPECT_FALSE(tsb::venv::reserved_path(path)) << path;

  // The frame, also without a bin/ in the archive.
  Dir d;
  ASSERT_EQ(error_of(extract(d, magic + rec('d', "lib", 0755, "") + kEnd, 4096, {}, nullptr, {"/usr/bin/python3", "3.11"})), "");
  const fs::path o = d.path / "out";
  EXPECT_EQ(fs::read_symlink(o / "bin/python3"), "/usr/bin/python3");
  EXPECT_EQ(fs::read_symlink(o / "bin/python"), "python3");
  EXPECT_EQ(fs::read_symlink(o / "bin/python3.11"), "python3");
  EXPECT_EQ(fs::read_symlink(o / "lib64"), "lib");
  EXPECT_EQ(mode_of(o / "pyvenv.cfg"), 0444u);
  EXPECT_EQ(mode_of(o / "bin"), 0555u);
  // A bin/ that is not a directory: refused, not followed.
  for (char kind : {'f', 'l'}) {
    Dir e;
    fs::create_directory(e.path / "elsewhere");
    const std::string err = error_of(extract(e, magic + rec(kind, "bin", 0, (e.path / "elsewhere").string()) + kEnd));
    EXPECT_NE(err.find("bin"), std::string::npos) << kind << ": " << err;
    EXPECT_TRUE(fs::is_empty(e.path / "elsewhere")) << kind;
  }
  // A version that is not X.Y.
  Dir f;
  EXPECT_NE(error_of(extract(f, magic + kEnd, 4096, {}, nullptr, {"/usr/bin/python3", "3"})).find("malformed"),
            std::string::npos);
}

TEST(VenvArchive, RemoveTreeRemovesAReadOnlyTreeAndFollowsNoLink) {
  Dir d;
  fs::create_directory(d.path / "keep");
  std::ofstream(d.path / "keep/file") << "precious";
  const std::string s = "TSBVENV1" + rec('d', "a", 0, "") + rec('f', "a/f", 0644, "1") +
                        rec('l', "a/link", 0, (d.path / "keep").string()) + rec('l', "a/flink", 0, (d.path / "keep/file").string()) +
                        kEnd;
  ASSERT_EQ(error_of(extract(d, s)), "");
  const UniqueFd parent(::open(d.path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  ASSERT_EQ(error_of(tsb::venv::remove_tree(parent.get(), "out")), "");
  EXPECT_FALSE(fs::exists(d.path / "out"));
  EXPECT_EQ(slurp(d.path / "keep/file"), "precious");
  EXPECT_EQ(error_of(tsb::venv::remove_tree(parent.get(), "out")), "") << "a missing tree is not an error";
  for (const char* bad : {"keep/file", "..", ".", ""})
    EXPECT_NE(error_of(tsb::venv::remove_tree(parent.get(), bad)), "") << "a name, not a path: " << bad;
  EXPECT_EQ(slurp(d.path / "keep/file"), "precious");
}

}  // namespace
