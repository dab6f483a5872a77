// Landlock's user-space interface up to ABI 7, with the kernel's own values
// (include/uapi/linux/landlock.h). The C library's headers of the oldest
// supported distributions stop at ABI 2, so the newer constants are defined
// here, once, under names of their own: nothing clashes with a newer
// <linux/landlock.h>.
//
// Header only, libc only: included by the static init and by the unit tests.
#pragma once

#include <stdint.h>
#include <sys/syscall.h>

namespace tsb::isolate::landlock {

// The system calls (x86-64, arm64 and every architecture since 5.13 share them).
inline constexpr long kSysCreateRuleset = 444;
inline constexpr long kSysAddRule = 445;
inline constexpr long kSysRestrictSelf = 446;
#ifdef SYS_landlock_create_ruleset
static_assert(SYS_landlock_create_ruleset == kSysCreateRuleset && SYS_landlock_add_rule == kSysAddRule &&
              SYS_landlock_restrict_self == kSysRestrictSelf);
#endif

// landlock_create_ruleset(NULL, 0, kCreateRulesetVersion): the running ABI.
inline constexpr uint32_t kCreateRulesetVersion = 1u << 0;

// The ruleset's attributes. Its size says which fields the caller knows:
// 8 bytes up to ABI 3, 16 from ABI 4 (net), 24 from ABI 6 (scoped).
struct RulesetAttr {
  uint64_t handled_access_fs;
  uint64_t handled_access_net;  // ABI 4
  uint64_t scoped;              // ABI 6
};
inline constexpr unsigned long kAttrSizeV1 = 8, kAttrSizeV4 = 16, kAttrSizeV6 = 24;

inline constexpr int kRulePathBeneath = 1;
inline constexpr int kRuleNetPort = 2;  // ABI 4

// Packed as the kernel declares them.
struct __attribute__((packed)) PathBeneathAttr {
  uint64_t allowed_access;
  int32_t parent_fd;
};
struct NetPortAttr {
  uint64_t allowed_access;
  uint64_t port;
};

// File-system rights, by the ABI that introduced them.
inline constexpr uint64_t kFsExecute = 1ull << 0;
inline constexpr uint64_t kFsWriteFile = 1ull << 1;
inline constexpr uint64_t kFsReadFile = 1ull << 2;
inline constexpr uint64_t kFsReadDir = 1ull << 3;
inline constexpr uint64_t kFsRemoveDir = 1ull << 4;
inline constexpr uint64_t kFsRemoveFile = 1ull << 5;
inline constexpr uint64_t kFsMakeChar = 1ull << 6;
inline constexpr uint64_t kFsMakeDir = 1ull << 7;
inline constexpr uint64_t kFsMakeReg = 1ull << 8;
inline constexpr uint64_t kFsMakeSock = 1ull << 9;
inline constexpr uint64_t kFsMakeFifo = 1ull << 10;
inline constexpr uint64_t kFsMakeBlock = 1ull << 11;
inline constexpr uint64_t kFsMakeSym = 1ull << 12;
inline constexpr uint64_t kFsRefer = 1ull << 13;     // ABI 2
inline constexpr uint64_t kFsTruncate = 1ull << 14;  // ABI 3
inline constexpr uint64_t kFsIoctlDev = 1ull << 15;  // ABI 5

// Network rights (ABI 4): TCP bind and connect, by port.
inline constexpr uint64_t kNetBindTcp = 1ull << 0;
inline constexpr uint64_t kNetConnectTcp = 1ull << 1;

// Scopes (ABI 6): what a domain cannot reach outside itself.
inline constexpr uint64_t kScopeAbstractUnixSocket = 1ull << 0;
inline constexpr uint64_t kScopeSignal = 1ull << 1;

// The rights a rule may grant on a file that is not a directory.
inline constexpr uint64_t kFsFileRights = kFsExecute | kFsWriteFile | kFsReadFile | kFsTruncate | kFsIoctlDev;

// Every file-system right the running ABI `abi` knows (0: no Landlock).
inline constexpr uint64_t fs_rights(int abi) {
  if (abi < 1) return 0;
  uint64_t r = (kFsMakeSym << 1) - 1;  // ABI 1: execute .. make_sym
  if (abi >= 2) r |= kFsRefer;
  if (abi >= 3) r |= kFsTruncate;
  if (abi >= 5) r |= kFsIoctlDev;
  return r;
}
inline constexpr uint64_t net_rights(int abi) { return abi >= 4 ? kNetBindTcp | kNetConnectTcp : 0; }
inline constexpr uint64_t scopes(int abi) { return abi >= 6 ? kScopeAbstractUnixSocket | kScopeSignal : 0; }

}  // namespace tsb::isolate::landlock
