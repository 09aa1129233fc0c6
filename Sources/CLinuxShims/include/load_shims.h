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
/// epoll_wait into two parallel arrays of at most max entries, with a timeout in
/// nanoseconds (epoll_pwait2; negative = no timeout), so that probes can be sent on their
/// schedule rather than on millisecond ticks. Falls back to epoll_wait, rounding up to a
/// millisecond, on kernels without epoll_pwait2. Returns the count, or -1.
int voipload_epoll_wait_ns(int epoll_fd, uint64_t *tokens, uint32_t *events, int max, int64_t timeout_ns);
/// PR_SET_TIMERSLACK for the calling thread: how late the kernel may end its sleeps
/// (50 µs by default). Returns 0 or -1 (errno set).
int voipload_set_timer_slack(unsigned long nanoseconds);

/// The calling thread to SCHED_FIFO priority 1 (on != 0) or back to SCHED_OTHER.
/// Returns 0, or the errno (EPERM without CAP_SYS_NICE or an RLIMIT_RTPRIO).
int voipload_set_realtime(int on);

/// Before bind/connect of a client socket: IP_BIND_ADDRESS_NO_PORT (the port is chosen at
/// connect time, so one source address reaches a server from every ephemeral port) and
/// TCP_NODELAY (probes and ACKs are tiny; Nagle would hold them back).
void voipload_prepare_client_socket(int fd);

/// SO_TIMESTAMPNS on: every later read of fd through voipload_read_stamped also reports
/// when the kernel received the bytes. Returns 0 or -1 (errno set). When no other socket
/// of the machine has timestamps on, the kernel turns them on a moment later (from a work
/// queue): reads just after this call may carry none.
int voipload_enable_receive_timestamps(int fd);
/// read(2) through recvmsg(2): reads at most `length` bytes into `buffer`. When the kernel
/// attached a receive timestamp (SCM_TIMESTAMPNS, CLOCK_REALTIME) it is stored in
/// `*kernel_realtime_ns`, else 0 is. For TCP it is the timestamp of the last segment
/// the read took bytes from. Returns what read(2) would (count, 0 at end, -1 with errno).
long voipload_read_stamped(int fd, void *buffer, unsigned long length, uint64_t *kernel_realtime_ns);
/// The receive timestamp of the next unread byte, without consuming it (MSG_PEEK, never
/// blocking): for reads that go through OpenSSL, which reads the socket itself. 0 in
/// `*kernel_realtime_ns` when nothing is queued or no stamp is attached. Returns as
/// voipload_read_stamped (1, 0 at end, -1 with errno).
long voipload_peek_stamp(int fd, uint64_t *kernel_realtime_ns);
/// CLOCK_REALTIME in nanoseconds: the clock of kernel receive timestamps.
uint64_t voipload_realtime_ns(void);

/// Asks the kernel to send `signal` to this process when its parent dies, so that load
/// workers never outlive a coordinator that was killed. Returns 0 or -1 (errno set).
int voipload_set_parent_death_signal(int signal);

#endif
