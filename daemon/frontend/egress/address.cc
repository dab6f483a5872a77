#include "daemon/frontend/egress/address.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>

namespace tsb::egress {

Address from_sockaddr(const struct sockaddr* sa) {
  Address a;
  if (sa->sa_family == AF_INET6) {
    a.v6 = true;
    std::memcpy(a.bytes.data(), &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr, 16);
    return unwrap_mapped(a);
  }
  std::memcpy(a.bytes.data(), &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, 4);
  return a;
}

bool is_local(const Address& a) {
  // The kernel's own answer: the route this network namespace would take
  // to `a` (RTM_GETROUTE, as `ip route get` asks), which is of type
  // RTN_LOCAL exactly when it receives for `a`: its interfaces' addresses
  // and whatever `local` routes cover, IPv4 and IPv6 alike (a whole range,
  // an address behind NAT made local), which getifaddrs does not list.
  // (Binding a socket to `a` was the test before: it misses IPv6 local
  // routes, and with net.ipv4.ip_nonlocal_bind=1 every IPv4 address binds.)
  // No route at all is not local; anything else it cannot tell counts as
  // local (denied).
  const int fd = ::socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);
  if (fd < 0) return true;
  const timeval tv{1, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  const std::size_t alen = a.v6 ? 16 : 4;
  struct {
    nlmsghdr nh;
    rtmsg rt;
    alignas(NLMSG_ALIGNTO) char attr[RTA_SPACE(16)];
  } req{};
  req.nh.nlmsg_type = RTM_GETROUTE;
  req.nh.nlmsg_flags = NLM_F_REQUEST;
  req.nh.nlmsg_seq = 1;
  req.rt.rtm_family = a.v6 ? AF_INET6 : AF_INET;
  req.rt.rtm_dst_len = static_cast<unsigned char>(alen * 8);
  auto* rta = reinterpret_cast<rtattr*>(req.attr);
  rta->rta_type = RTA_DST;
  rta->rta_len = static_cast<unsigned short>(RTA_LENGTH(alen));
  std::memcpy(RTA_DATA(rta), a.bytes.data(), alen);
  req.nh.nlmsg_len = static_cast<std::uint32_t>(NLMSG_LENGTH(sizeof(rtmsg)) + RTA_SPACE(alen));
  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  bool local = true;
  if (::sendto(fd, &req, req.nh.nlmsg_len, 0, reinterpret_cast<sockaddr*>(&kernel), sizeof kernel) ==
      static_cast<ssize_t>(req.nh.nlmsg_len)) {
    alignas(nlmsghdr) char buf[8192];
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    const auto* nh = reinterpret_cast<const nlmsghdr*>(buf);
    if (n > 0 && NLMSG_OK(nh, static_cast<unsigned>(n)) && nh->nlmsg_seq == 1) {
      if (nh->nlmsg_type == RTM_NEWROUTE && nh->nlmsg_len >= NLMSG_LENGTH(sizeof(rtmsg))) {
        local = static_cast<const rtmsg*>(NLMSG_DATA(nh))->rtm_type == RTN_LOCAL;
      } else if (nh->nlmsg_type == NLMSG_ERROR && nh->nlmsg_len >= NLMSG_LENGTH(sizeof(nlmsgerr))) {
        const int err = -static_cast<const nlmsgerr*>(NLMSG_DATA(nh))->error;
        local = !(err == ENETUNREACH || err == EHOSTUNREACH);
      }
    }
  }
  ::close(fd);
  return local;
}

std::vector<Address> host_addresses() {
  std::vector<Address> out;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return out;
  for (ifaddrs* i = list; i; i = i->ifa_next)
    if (i->ifa_addr && (i->ifa_addr->sa_family == AF_INET || i->ifa_addr->sa_family == AF_INET6))
      out.push_back(from_sockaddr(i->ifa_addr));
  ::freeifaddrs(list);
  return out;
}

}  // namespace tsb::egress
