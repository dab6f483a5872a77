// Digests used for fingerprints and integrity checks (OpenSSL EVP).
#pragma once

#include <string>
#include <string_view>

namespace tsb {

std::string sha256_hex(std::string_view data);   // lowercase hex, 64 chars
std::string sha256_raw(std::string_view data);   // 32 raw bytes
std::string md5_hex(std::string_view data);      // lowercase hex, 32 chars (Letta's frame checksum)
std::string random_hex(std::size_t bytes);       // getrandom(2)-backed nonce, 2*bytes hex chars

}  // namespace tsb
