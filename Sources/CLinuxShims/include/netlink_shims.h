#ifndef VSIG_NETLINK_SHIMS_H
#define VSIG_NETLINK_SHIMS_H
// Netlink (rtnetlink) helpers for the client's network-change monitor.
// The NLMSG_* and RTA_* macros cannot be imported into Swift, so the parsing of a
// received buffer is done here and summarised in a plain struct.
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/// Most addresses remembered per summary; more changes in one read only set `truncated`.
#define VSIG_NETLINK_MAX_ADDRESSES 16

/// One address that appeared or disappeared: family (AF_INET / AF_INET6) and its bytes.
typedef struct vsig_netlink_address {
    int32_t family;
    int32_t interface_index;
    int32_t removed;          // 1 for RTM_DELADDR, 0 for RTM_NEWADDR
    uint8_t bytes[16];        // 4 used for AF_INET
} vsig_netlink_address;

/// What one buffer of rtnetlink messages changed.
typedef struct vsig_netlink_summary {
    int32_t addresses_added;
    int32_t addresses_removed;
    int32_t routes_changed;
    int32_t links_changed;
    int32_t malformed;        // 1 when the buffer did not parse to the end
    int32_t truncated;        // 1 when more addresses changed than fit in `addresses`
    int32_t address_count;
    vsig_netlink_address addresses[VSIG_NETLINK_MAX_ADDRESSES];
} vsig_netlink_summary;

/// Opens a non-blocking, close-on-exec NETLINK_ROUTE socket subscribed to IPv4/IPv6
/// address and route changes and link changes. Returns the fd, or -1 with errno set.
int vsig_netlink_open_route_monitor(void);

/// Parses `length` bytes received from the socket above into `summary` (zeroed first).
void vsig_netlink_summarize(const void *buffer, size_t length, vsig_netlink_summary *summary);

/// Moves the calling thread into the network namespace at `path` (e.g.
/// /var/run/netns/NAME). Sockets the thread creates afterwards belong to it; so do
/// threads it starts. Returns 0, or -1 with errno set. For tests and tools.
int vsig_enter_network_namespace(const char *path);

#ifdef __cplusplus
}
#endif
#endif
