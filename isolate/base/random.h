// Random nonces from getrandom(2). Header-only (base), no library: the
// root spawner names runs and engines with it and links no crypto.
#pragma once

#include <sys/random.h>

#include <cerrno>
#include <cstdlib>
#include <string>

namespace tsb {

// 2*bytes lowercase hex characters.
inline std::string random_hex(std::size_t bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string raw(bytes, '\0');
  std::size_t got = 0;
  while (got < bytes) {
    const ssize_t n = ::getrandom(raw.data() + got, bytes - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      std::abort();  // getrandom cannot fail otherwise once the pool is initialised
    }
    got += static_cast<std::size_t>(n);
  }
  std::string s(bytes * 2, '\0');
  for (std::size_t i = 0; i < bytes; ++i) {
    const auto b = static_cast<unsigned char>(raw[i]);
    s[2 * i] = kHex[b >> 4];
    s[2 * i + 1] = kHex[b & 0xf];
  }
  return s;
}

}  // namespace tsb
