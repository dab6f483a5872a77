#include "isolate/hash.h"

#include <openssl/evp.h>
#include <sys/random.h>

#include <array>
#include <cerrno>
#include <cstdlib>
#include <stdexcept>

namespace tsb {
namespace {

std::string digest(const EVP_MD* md, std::string_view data) {
  std::array<unsigned char, EVP_MAX_MD_SIZE> out{};
  unsigned int len = 0;
  if (EVP_Digest(data.data(), data.size(), out.data(), &len, md, nullptr) != 1) {
    // Only fails on allocation failure inside OpenSSL; nothing sensible to return.
    std::abort();
  }
  return std::string(reinterpret_cast<const char*>(out.data()), len);
}

std::string to_hex(std::string_view raw) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s;
  s.resize(raw.size() * 2);
  for (std::size_t i = 0; i < raw.size(); ++i) {
    auto b = static_cast<unsigned char>(raw[i]);
    s[2 * i] = kHex[b >> 4];
    s[2 * i + 1] = kHex[b & 0xf];
  }
  return s;
}

}  // namespace

std::string sha256_raw(std::string_view data) { return digest(EVP_sha256(), data); }
std::string sha256_hex(std::string_view data) { return to_hex(sha256_raw(data)); }
std::string md5_hex(std::string_view data) { return to_hex(digest(EVP_md5(), data)); }

std::string random_hex(std::size_t bytes) {
  std::string raw(bytes, '\0');
  std::size_t got = 0;
  while (got < bytes) {
    ssize_t n = getrandom(raw.data() + got, bytes - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      std::abort();  // getrandom cannot fail otherwise once the pool is initialised
    }
    got += static_cast<std::size_t>(n);
  }
  return to_hex(raw);
}

}  // namespace tsb
