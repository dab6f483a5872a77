// Digests used for fingerprints and integrity checks (OpenSSL EVP).
// Header-only, for the unprivileged programs; users link OpenSSL's
// libcrypto (tsb_common does). Nonces: isolate/base/random.h.
#pragma once

#include <openssl/evp.h>

#include <array>
#include <cerrno>
#include <cstdlib>
#include <string>
#include <string_view>

namespace tsb {
namespace hash_detail {

inline std::string digest(const EVP_MD* md, std::string_view data) {
  std::array<unsigned char, EVP_MAX_MD_SIZE> out{};
  unsigned int len = 0;
  // Fails only when OpenSSL cannot allocate; nothing sensible to return.
  if (EVP_Digest(data.data(), data.size(), out.data(), &len, md, nullptr) != 1) std::abort();
  return std::string(reinterpret_cast<const char*>(out.data()), len);
}

inline std::string to_hex(std::string_view raw) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s(raw.size() * 2, '\0');
  for (std::size_t i = 0; i < raw.size(); ++i) {
    const auto b = static_cast<unsigned char>(raw[i]);
    s[2 * i] = kHex[b >> 4];
    s[2 * i + 1] = kHex[b & 0xf];
  }
  return s;
}

}  // namespace hash_detail

// 32 raw bytes / 64 lowercase hex characters.
inline std::string sha256_raw(std::string_view data) { return hash_detail::digest(EVP_sha256(), data); }
inline std::string sha256_hex(std::string_view data) { return hash_detail::to_hex(sha256_raw(data)); }
// 32 lowercase hex characters (Letta's frame checksum).
inline std::string md5_hex(std::string_view data) { return hash_detail::to_hex(hash_detail::digest(EVP_md5(), data)); }

}  // namespace tsb
