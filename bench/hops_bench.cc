// tsb-bench-hops: the host's floor under a warm call. A warm tool call
// wakes a chain of processes, each waiting on a descriptor: the client, the
// front end, the spawner, the runner, the sandbox's init, and the front end
// again between them (11 wake-ups: docs/BENCHMARKS.md, "The host's floor").
// This passes one byte around a ring of processes that do nothing else,
// after the same quiet as bench/gap_bench.py, so what a call costs beyond
// the work its processes do can be set against what the host charges for
// waking them. Standard C++ and POSIX only; run it alone on the machine.
//
//   tsb-bench-hops [--hops 11] [--n 20] [--n-long 6] [--gaps 0.02,0.1,1,10]
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

[[noreturn]] void usage() {
  std::fputs("usage: tsb-bench-hops [--hops N] [--n N] [--n-long N] [--gaps S,S,...]\n", stderr);
  std::exit(2);
}

// A positive number of seconds from an option's value, or the usage.
double seconds(const std::string& s) {
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || *end != '\0' || !(v > 0) || v > 3600) usage();
  return v;
}

// A whole number in [lo, hi], or the usage.
int whole(const char* s, int lo, int hi) {
  char* end = nullptr;
  const long v = std::strtol(s, &end, 10);
  if (end == s || *end != '\0' || v < lo || v > hi) usage();
  return static_cast<int>(v);
}

// As Python's statistics.median (bench/gap_bench.py): the mean of the two
// middle values of an even count.
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

}  // namespace

int main(int argc, char** argv) {
  int hops = 11, n = 20, n_long = 6;
  std::vector<double> gaps = {0.02, 0.1, 1, 10};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) usage();
    const char* v = argv[++i];
    if (a == "--hops") hops = whole(v, 2, 64);
    else if (a == "--n") n = whole(v, 1, 100000);
    else if (a == "--n-long") n_long = whole(v, 1, 100000);
    else if (a == "--gaps") {
      gaps.clear();
      std::string s = v;
      for (std::size_t at = 0; at <= s.size();) {
        const std::size_t comma = std::min(s.find(',', at), s.size());
        gaps.push_back(seconds(s.substr(at, comma - at)));
        at = comma + 1;
      }
    } else usage();
  }
  // Pipe i feeds process i; process 0 is this one, the others pass the byte on.
  std::vector<int> rd(hops), wr(hops);
  for (int i = 0; i < hops; ++i) {
    int p[2];
    if (::pipe2(p, O_CLOEXEC) != 0) return std::perror("pipe2"), 1;
    rd[i] = p[0], wr[i] = p[1];
  }
  std::vector<pid_t> kids;
  for (int i = 1; i < hops; ++i) {
    const pid_t pid = ::fork();
    if (pid < 0) return std::perror("fork"), 1;
    if (pid == 0) {
      // Only its own two ends: the ring ends (EOF) when the parent closes its.
      for (int j = 0; j < hops; ++j) {
        if (j != i) ::close(rd[j]);
        if (j != (i + 1) % hops) ::close(wr[j]);
      }
      char c;
      while (::read(rd[i], &c, 1) == 1)
        if (::write(wr[(i + 1) % hops], &c, 1) != 1) ::_exit(1);
      ::_exit(0);
    }
    kids.push_back(pid);
  }
  // The parent keeps the ring's first write end and its last read end.
  for (int j = 0; j < hops; ++j) {
    if (j != 0) ::close(rd[j]);
    if (j != 1) ::close(wr[j]);
  }
  std::printf("# tsb-bench-hops: one byte through %d processes after quiet\n\n", hops);
  std::printf("| quiet | n | median ms | per wake-up, us | fastest ms | slowest ms |\n");
  std::printf("|---|---:|---:|---:|---:|---:|\n");
  for (double gap : gaps) {
    const int rounds = gap < 1 ? n : n_long;
    std::vector<double> ms;
    for (int r = 0; r < rounds + 1; ++r) {  // the first round warms the chain up, untimed
      std::this_thread::sleep_for(std::chrono::duration<double>(gap));
      const auto t0 = std::chrono::steady_clock::now();
      char c = 'x';
      if (::write(wr[1], &c, 1) != 1 || ::read(rd[0], &c, 1) != 1) return std::perror("the ring"), 1;
      const auto t1 = std::chrono::steady_clock::now();
      if (r > 0) ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    }
    const double m = median(ms);
    std::printf("| %g s | %d | %.3f | %.1f | %.3f | %.3f |\n", gap, rounds, m, m * 1000 / hops,
                *std::min_element(ms.begin(), ms.end()), *std::max_element(ms.begin(), ms.end()));
    std::fflush(stdout);
  }
  ::close(wr[1]);  // the first child reads EOF, closes its write end, and so on around
  for (pid_t pid : kids) ::waitpid(pid, nullptr, 0);
  return 0;
}
