#ifdef __linux__
#define _GNU_SOURCE
#endif
#include "netlink_shims.h"

#ifdef __linux__
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <linux/if_addr.h>
#include <netinet/in.h>

int vsig_netlink_open_route_monitor(void) {
    int fd = socket(AF_NETLINK, SOCK_RAW | SOCK_NONBLOCK | SOCK_CLOEXEC, NETLINK_ROUTE);
    if (fd < 0) return -1;
    struct sockaddr_nl local;
    memset(&local, 0, sizeof(local));
    local.nl_family = AF_NETLINK;
    local.nl_groups = RTMGRP_LINK | RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR
                    | RTMGRP_IPV4_ROUTE | RTMGRP_IPV6_ROUTE;
    if (bind(fd, (struct sockaddr *)&local, sizeof(local)) < 0) {
        int saved = errno;
        close(fd);
        errno = saved;
        return -1;
    }
    return fd;
}

static void record_address(const struct nlmsghdr *header, vsig_netlink_summary *summary) {
    const struct ifaddrmsg *message = (const struct ifaddrmsg *)NLMSG_DATA(header);
    int removed = header->nlmsg_type == RTM_DELADDR;
    if (removed) summary->addresses_removed++; else summary->addresses_added++;
    int payload = (int)IFA_PAYLOAD(header);
    const void *value = NULL;
    size_t size = message->ifa_family == AF_INET ? 4 : message->ifa_family == AF_INET6 ? 16 : 0;
    if (size == 0) return;
    // IFA_LOCAL is the interface's own address on point-to-point links; IFA_ADDRESS
    // otherwise. Prefer IFA_LOCAL when present.
    for (const struct rtattr *attribute = IFA_RTA(message); RTA_OK(attribute, payload);
         attribute = RTA_NEXT(attribute, payload)) {
        if (RTA_PAYLOAD(attribute) < size) continue;
        if (attribute->rta_type == IFA_LOCAL) { value = RTA_DATA(attribute); break; }
        if (attribute->rta_type == IFA_ADDRESS && value == NULL) value = RTA_DATA(attribute);
    }
    if (value == NULL) return;
    if (summary->address_count >= VSIG_NETLINK_MAX_ADDRESSES) { summary->truncated = 1; return; }
    vsig_netlink_address *out = &summary->addresses[summary->address_count++];
    out->family = message->ifa_family;
    out->interface_index = (int32_t)message->ifa_index;
    out->removed = removed;
    memcpy(out->bytes, value, size);
}

void vsig_netlink_summarize(const void *buffer, size_t length, vsig_netlink_summary *summary) {
    memset(summary, 0, sizeof(*summary));
    int remaining = (int)length;
    for (const struct nlmsghdr *header = (const struct nlmsghdr *)buffer; NLMSG_OK(header, remaining);
         header = NLMSG_NEXT(header, remaining)) {
        switch (header->nlmsg_type) {
        case RTM_NEWADDR:
        case RTM_DELADDR:
            if (header->nlmsg_len >= NLMSG_LENGTH(sizeof(struct ifaddrmsg))) record_address(header, summary);
            else summary->malformed = 1;
            break;
        case RTM_NEWROUTE:
        case RTM_DELROUTE:
            summary->routes_changed++;
            break;
        case RTM_NEWLINK:
        case RTM_DELLINK:
            summary->links_changed++;
            break;
        case NLMSG_ERROR:
        case NLMSG_DONE:
        case NLMSG_NOOP:
        default:
            break;
        }
    }
    if (remaining != 0) summary->malformed = 1;
}

int vsig_enter_network_namespace(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    int status = setns(fd, CLONE_NEWNET);
    int saved = errno;
    close(fd);
    errno = saved;
    return status;
}

#else  // not Linux: no netlink; the Apple branch of the client uses NWPathMonitor.
#include <errno.h>
#include <string.h>
int vsig_netlink_open_route_monitor(void) { errno = ENOSYS; return -1; }
void vsig_netlink_summarize(const void *buffer, size_t length, vsig_netlink_summary *summary) {
    (void)buffer; (void)length; memset(summary, 0, sizeof(*summary)); summary->malformed = 1;
}
int vsig_enter_network_namespace(const char *path) { (void)path; errno = ENOSYS; return -1; }
#endif
