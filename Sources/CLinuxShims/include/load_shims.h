#ifndef LOAD_SHIMS_H
#define LOAD_SHIMS_H
// Linux APIs that voipload needs and Swift's Glibc module does not export: epoll, two
// socket options, and the variadic prctl (Swift cannot call variadic C functions).
//
// Only <stdint.h> is included here: system headers pulled into this module would be
// compiled with other macros than libevent's copy of them in CLibevent, and the two
// definitions of fd_set would then clash in any target that imports both.
#include <stdint.h>

/// Readiness bits, as in <sys/epoll.h> (fixed by the Linux ABI).
enum {
    VOIPLOAD_EPOLLIN = 0x001,
    VOIPLOAD_EPOLLOUT = 0x004,
    VOIPLOAD_EPOLLERR = 0x008,
    VOIPLOAD_EPOLLHUP = 0x010,
    VOIPLOAD_EPOLLRDHUP = 0x2000,
};

/// epoll_create1(EPOLL_CLOEXEC). Returns the descriptor or -1 (errno set).
int voipload_epoll_create(void);
/// Adds (modify = 0) or changes (modify = 1) fd's entry, level-triggered, carrying token.
/// Returns 0 or -1 (errno set).
int voipload_epoll_control(int epoll_fd, int fd, int modify, uint32_t events, uint64_t token);
/// epoll_wait into two parallel arrays of at most max entries. Returns the count, or -1.
int voipload_epoll_wait(int epoll_fd, uint64_t *tokens, uint32_t *events, int max, int timeout_ms);

/// Before bind/connect of a client socket: IP_BIND_ADDRESS_NO_PORT (the port is chosen at
/// connect time, so one source address reaches a server from every ephemeral port) and
/// TCP_NODELAY (probes and ACKs are tiny; Nagle would hold them back).
void voipload_prepare_client_socket(int fd);

/// Asks the kernel to send `signal` to this process when its parent dies, so that load
/// workers never outlive a coordinator that was killed. Returns 0 or -1 (errno set).
int voipload_set_parent_death_signal(int signal);

#endif
