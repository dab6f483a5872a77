// The header-only base (isolate/base/): the trusted-file reader, quoting
// for messages, digests.
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "isolate/base/file.h"
#include "daemon/common/hash.h"
#include "isolate/base/random.h"
#include "daemon/common/log.h"
#include "daemon/common/quote.h"

namespace tsb {
namespace {

class TempDir {
 public:
  TempDir() {
    char t[] = "/tmp/tsb-base-XXXXXX";
    dir_ = ::mkdtemp(t);
  }
  ~TempDir() { std::filesystem::remove_all(dir_); }
  std::string file(const std::string& name, const std::string& content) const {
    std::ofstream(dir_ + "/" + name, std::ios::binary) << content;
    return dir_ + "/" + name;
  }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
};

TEST(ReadFile, ReadsWholeAndBounded) {
  TempDir t;
  const std::string p = t.file("a", std::string(5000, 'x'));
  auto r = read_file(p);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->size(), 5000u);
  auto small = read_file(p, {.max_bytes = 4999});
  ASSERT_FALSE(small.ok());
  EXPECT_EQ(small.error().code, EFBIG);
  EXPECT_EQ(small.error().message, "'" + p + "' is larger than 4999 bytes");
  EXPECT_TRUE(read_file(p, {.max_bytes = 5000}).ok());
}

TEST(ReadFile, KernelFilesThatReportNoSizeAreBoundedWhileReading) {
  // /proc files have st_size 0: the bound applies to what is read.
  auto r = read_file("/proc/self/mountinfo", {.max_bytes = 10});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, EFBIG);
  EXPECT_TRUE(read_file("/proc/self/mountinfo", {.max_bytes = 16u << 20}).ok());
}

TEST(ReadFile, AFifoIsRefusedWithoutBlocking) {
  TempDir t;
  const std::string fifo = t.dir() + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto r = read_file(fifo, {.regular_only = true});  // would block forever without O_NONBLOCK
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message, "'" + fifo + "' is not a regular file");
  EXPECT_FALSE(read_file(t.dir(), {.regular_only = true}).ok());  // a directory
}

TEST(ReadFile, AFifoNeverBlocksEvenWhenAllowed) {
  TempDir t;
  const std::string fifo = t.dir() + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  ::alarm(10);  // a read that blocks ends the test with SIGALRM instead of hanging it
  auto no_writer = read_file(fifo);
  ASSERT_TRUE(no_writer.ok()) << no_writer.error().message;  // EOF at once
  EXPECT_TRUE(no_writer->empty());
  const int w = ::open(fifo.c_str(), O_RDWR | O_NONBLOCK);  // a writer that never writes
  ASSERT_GE(w, 0);
  auto idle_writer = read_file(fifo);
  ::close(w);
  ::alarm(0);
  ASSERT_FALSE(idle_writer.ok());
  EXPECT_EQ(idle_writer.error().code, EAGAIN);
}

TEST(ReadFile, NoFollowRefusesASymlink) {
  TempDir t;
  const std::string target = t.file("target", "secret");
  const std::string link = t.dir() + "/link";
  ASSERT_EQ(::symlink(target.c_str(), link.c_str()), 0);
  EXPECT_TRUE(read_file(link).ok());
  auto r = read_file(link, {.no_follow = true});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ELOOP);
}

TEST(ReadFile, TheCheckSeesTheOpenedFileAndCanRefuseIt) {
  TempDir t;
  const std::string p = t.file("m", "x");
  ASSERT_EQ(::chmod(p.c_str(), 0640), 0);
  ReadRules rules;
  mode_t seen = 0;
  rules.check = [&](const std::string&, const struct stat& st) -> Status {
    seen = st.st_mode & 07777;
    if (st.st_mode & 077) return Error::invalid("mode " + mode_string(st.st_mode), EPERM);
    return {};
  };
  auto r = read_file(p, rules);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(seen, 0640u);
  EXPECT_EQ(r.error().message, "mode 0640");
  ASSERT_EQ(::chmod(p.c_str(), 0600), 0);
  EXPECT_TRUE(read_file(p, rules).ok());
}

TEST(ReadFile, AMissingFileNamesThePathAndErrno) {
  auto r = read_file("/nonexistent/x");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ENOENT);
  EXPECT_EQ(r.error().message, "open '/nonexistent/x': No such file or directory");
}

TEST(Quote, EscapesWhatCouldForgeALine) {
  EXPECT_EQ(quoted_for_message("a\"b\\c\n\r\t"), R"("a\"b\\c\n\r\t")");
  EXPECT_EQ(quoted_for_message("\x1b[31m"), R"("\u001B[31m")");
  EXPECT_EQ(quoted_for_message("\xff"), R"("\xFF")");
  EXPECT_EQ(quoted_for_message("\xe2\x80\xae"), R"("\u202E")");  // RIGHT-TO-LEFT OVERRIDE
  EXPECT_EQ(quoted_for_message("\xe2\x80\xa8"), R"("\u2028")");  // LINE SEPARATOR
  EXPECT_EQ(quoted_for_message("h\xc3\xa9"), "\"h\xc3\xa9\"");
}

TEST(Quote, EscapedKeepsQuotesAndEscapesTheRest) {
  // Newline, CR, tab, ESC (a CSI and an OSC title), BEL, DEL, a C1 control,
  // invalid UTF-8, a bidi override: none passes raw.
  EXPECT_EQ(escaped("a\nb\rc\td\x1b[2J\x1b]0;t\x07\x7f\xc2\x9b\xff\xe2\x80\xae"),
            R"(a\nb\rc\td\u001B[2J\u001B]0;t\u0007\u007F\u009B\xFF\u202E)");
  // Quoted text passes unchanged: escaping twice changes nothing.
  const std::string q = quoted_for_message("x\n\"\\\x1b");
  EXPECT_EQ(escaped(q), q);
  EXPECT_EQ(escaped("line 1\n\tline 2\x1b[1m", true), "line 1\n\tline 2\\u001B[1m");
  EXPECT_EQ(escaped("h\xc3\xa9"), "h\xc3\xa9");
}

// The command line's lines: whatever went into the format's arguments
// comes out escaped, one line; a block keeps its lines and escapes the rest.
TEST(Quote, PrintLineEscapesTheWholeLineAndPrintBlockKeepsLines) {
  const auto written = [](auto&& write) {
    std::FILE* f = std::tmpfile();
    write(f);
    std::rewind(f);
    std::string out;
    for (int c; (c = std::fgetc(f)) != EOF;) out += static_cast<char>(c);
    std::fclose(f);
    return out;
  };
  const std::string forged = "x\n2026-12-06T00:00:00.000 info audit run_id=forged\x1b]0;pwned\x07\x1b[2J\r\xc2\x9b\xff";
  EXPECT_EQ(written([&](std::FILE* f) { tsb::print_line(f, "toolsandbox venv: %s (%d)", forged.c_str(), 7); }),
            "toolsandbox venv: x\\n2026-12-06T00:00:00.000 info audit run_id=forged\\u001B]0;pwned\\u0007\\u001B[2J\\r\\u009B\\xFF (7)\n");
  EXPECT_EQ(written([&](std::FILE* f) { tsb::print_block(f, "a\n\tb\x1b[1m\n"); }), "a\n\tb\\u001B[1m\n");
}

// Every log line of the front end goes through log_line_formatter(): a
// message with a forged second line, terminal sequences and bytes that
// are not UTF-8 comes out as one line, escaped.
TEST(Log, LinesAreEscapedWhateverTheCallSitePutsInThem) {
  std::ostringstream out;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_st>(out);
  spdlog::logger log("test", sink);
  log.set_formatter(tsb::log_line_formatter());
  const std::string forged = "pip failed: /venv/x\n2026-12-06T00:00:00.000 info audit run_id=forged\x1b]0;pwned\x07\r\xff";
  log.error("run {}: {}", "r1", forged);
  log.flush();
  const std::string line = out.str();
  ASSERT_FALSE(line.empty());
  EXPECT_EQ(line.find('\n'), line.size() - 1) << line;  // one line, ended by the sink's own newline
  EXPECT_EQ(line.find('\x1b'), std::string::npos) << line;
  EXPECT_EQ(line.find('\x07'), std::string::npos) << line;
  EXPECT_EQ(line.find('\r'), std::string::npos) << line;
  EXPECT_EQ(line.find('\xff'), std::string::npos) << line;
  EXPECT_NE(line.find(" error run r1: pip failed: /venv/x\\n2026-12-06T00:00:00.000 info audit run_id=forged"
                      "\\u001B]0;pwned\\u0007\\r\\xFF"),
            std::string::npos)
      << line;
}

TEST(Hash, KnownDigestsAndNonces) {
  EXPECT_EQ(md5_hex(""), "d41d8cd98f00b204e9800998ecf8427e");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_raw("abc").size(), 32u);
  const std::string a = random_hex(16), b = random_hex(16);
  EXPECT_EQ(a.size(), 32u);
  EXPECT_NE(a, b);
  EXPECT_EQ(a.find_first_not_of("0123456789abcdef"), std::string::npos);
}

}  // namespace
}  // namespace tsb
