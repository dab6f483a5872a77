#include <gtest/gtest.h>

#include "daemon/policy/units.h"

using tsb::core::format_duration;
using tsb::core::format_size;
using tsb::core::parse_duration;
using tsb::core::parse_size;
using nlohmann::json;

TEST(Units, SizesWithSuffixes) {
  EXPECT_EQ(*parse_size(json("512MiB")), 512ull << 20);
  EXPECT_EQ(*parse_size(json("1GiB")), 1ull << 30);
  EXPECT_EQ(*parse_size(json("64KiB")), 64ull << 10);
  EXPECT_EQ(*parse_size(json("3MB")), 3000000ull);
  EXPECT_EQ(*parse_size(json("7B")), 7ull);
  EXPECT_EQ(*parse_size(json(4096)), 4096ull);
}

TEST(Units, BadSizesAreErrors) {
  for (const char* bad : {"", "MiB", "12 MiB", "1.5GiB", "12mib", "12Mb", "-1MiB", "99999999999999999999B", "16EiB"})
    EXPECT_FALSE(parse_size(json(bad)).ok()) << bad;
  EXPECT_FALSE(parse_size(json(-5)).ok());
  EXPECT_FALSE(parse_size(json(1.5)).ok());
  EXPECT_FALSE(parse_size(json(true)).ok());
  auto e = parse_size(json("12Mb"));
  EXPECT_NE(e.error().message.find("unknown size unit \"Mb\""), std::string::npos) << e.error().message;
  EXPECT_FALSE(parse_size(json("17179869184GiB")).ok());  // overflows 64 bits
}

TEST(Units, Durations) {
  EXPECT_EQ(parse_duration(json("60s"))->count(), 60000);
  EXPECT_EQ(parse_duration(json("500ms"))->count(), 500);
  EXPECT_EQ(parse_duration(json("2m"))->count(), 120000);
  EXPECT_EQ(parse_duration(json("1h"))->count(), 3600000);
  EXPECT_EQ(parse_duration(json("1.5s"))->count(), 1500);
  EXPECT_EQ(parse_duration(json(2))->count(), 2000);
  EXPECT_EQ(parse_duration(json(0.25))->count(), 250);
  for (const char* bad : {"", "s", "10", "10 s", "10sec", "1.2.3s", "-1s"})
    EXPECT_FALSE(parse_duration(json(bad)).ok()) << bad;
  EXPECT_FALSE(parse_duration(json(-1)).ok());
}

TEST(Units, FormatRoundTrips) {
  for (std::uint64_t v : {1ull, 1024ull, 1ull << 20, 3ull << 30, 1000ull, 123456789ull})
    EXPECT_EQ(*parse_size(json(format_size(v))), v) << format_size(v);
  for (long long ms : {1LL, 999LL, 1000LL, 60000LL, 90000LL, 3600000LL, 5400000LL})
    EXPECT_EQ(parse_duration(json(format_duration(std::chrono::milliseconds(ms))))->count(), ms);
  EXPECT_EQ(format_size(512ull << 20), "512MiB");
  EXPECT_EQ(format_duration(std::chrono::milliseconds(60000)), "1m");
  EXPECT_EQ(format_duration(std::chrono::milliseconds(1500)), "1500ms");
}
