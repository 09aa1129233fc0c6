#include "load_shims.h"
#include <errno.h>
#include <sched.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <string.h>
#include <time.h>

#ifndef IP_BIND_ADDRESS_NO_PORT
#define IP_BIND_ADDRESS_NO_PORT 24
#endif

int voipload_epoll_create(void) {
    return epoll_create1(EPOLL_CLOEXEC);
}

int voipload_epoll_control(int epoll_fd, int fd, int modify, uint32_t events, uint64_t token) {
    struct epoll_event event;
    event.events = events;
    event.data.u64 = token;
    return epoll_ctl(epoll_fd, modify ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, fd, &event);
}

int voipload_epoll_wait_ns(int epoll_fd, uint64_t *tokens, uint32_t *events, int max, int64_t timeout_ns) {
    struct epoll_event ready[256];
    if (max > 256) max = 256;
    struct timespec timeout = { .tv_sec = timeout_ns / 1000000000, .tv_nsec = timeout_ns % 1000000000 };
    int count = epoll_pwait2(epoll_fd, ready, max, timeout_ns < 0 ? NULL : &timeout, NULL);
    if (count < 0 && errno == ENOSYS) {
        int ms = timeout_ns < 0 ? -1 : (int)((timeout_ns + 999999) / 1000000);
        count = epoll_wait(epoll_fd, ready, max, ms);
    }
    for (int i = 0; i < count; i++) {
        tokens[i] = ready[i].data.u64;
        events[i] = ready[i].events;
    }
    return count;
}

int voipload_set_realtime(int on) {
    struct sched_param parameter = { .sched_priority = on ? 1 : 0 };
    return sched_setscheduler(0, on ? SCHED_FIFO : SCHED_OTHER, &parameter) == 0 ? 0 : errno;
}

int voipload_set_timer_slack(unsigned long nanoseconds) {
    return prctl(PR_SET_TIMERSLACK, nanoseconds, 0, 0, 0);
}

void voipload_prepare_client_socket(int fd) {
    int one = 1;
    (void)setsockopt(fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof one);
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

int voipload_set_parent_death_signal(int signal) {
    return prctl(PR_SET_PDEATHSIG, (unsigned long)signal, 0UL, 0UL, 0UL);
}

int voipload_enable_receive_timestamps(int fd) {
    int on = 1;
    return setsockopt(fd, SOL_SOCKET, SO_TIMESTAMPNS, &on, sizeof on);
}

static long receive_stamped(int fd, void *buffer, unsigned long length, int flags, uint64_t *kernel_realtime_ns) {
    // Room for one struct timespec control message (and one more, should another appear).
    union {
        char bytes[CMSG_SPACE(sizeof(struct timespec)) * 2];
        struct cmsghdr align;
    } control;
    struct iovec vector = { .iov_base = buffer, .iov_len = length };
    struct msghdr message = { 0 };
    message.msg_iov = &vector;
    message.msg_iovlen = 1;
    message.msg_control = control.bytes;
    message.msg_controllen = sizeof control.bytes;
    *kernel_realtime_ns = 0;
    long count = recvmsg(fd, &message, flags);
    if (count <= 0) return count;
    for (struct cmsghdr *header = CMSG_FIRSTHDR(&message); header; header = CMSG_NXTHDR(&message, header)) {
        if (header->cmsg_level == SOL_SOCKET && header->cmsg_type == SCM_TIMESTAMPNS
            && header->cmsg_len >= CMSG_LEN(sizeof(struct timespec))) {
            struct timespec stamp;
            memcpy(&stamp, CMSG_DATA(header), sizeof stamp);
            *kernel_realtime_ns = (uint64_t)stamp.tv_sec * 1000000000u + (uint64_t)stamp.tv_nsec;
        }
    }
    return count;
}

long voipload_read_stamped(int fd, void *buffer, unsigned long length, uint64_t *kernel_realtime_ns) {
    return receive_stamped(fd, buffer, length, 0, kernel_realtime_ns);
}

long voipload_peek_stamp(int fd, uint64_t *kernel_realtime_ns) {
    unsigned char byte;
    return receive_stamped(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT, kernel_realtime_ns);
}

uint64_t voipload_realtime_ns(void) {
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    return (uint64_t)now.tv_sec * 1000000000u + (uint64_t)now.tv_nsec;
}
