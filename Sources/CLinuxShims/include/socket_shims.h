#ifndef SOCKET_SHIMS_H
#define SOCKET_SHIMS_H
#include <stdint.h>
#include <stddef.h>

/// Creates a non-blocking, close-on-exec listening TCP socket bound to host:port
/// (host may be an IPv4 or IPv6 literal or a name; NULL or "" = all IPv4 addresses).
/// With reuse_port, several sockets may bind the same port (one per event loop).
/// Returns the fd, or -1 with a message in err.
int shim_listen_tcp(const char *host, uint16_t port, int reuse_port, int backlog, char *err, size_t err_len);

/// True (1) when host:port can be bound by a socket WITHOUT SO_REUSEPORT, i.e. no other
/// process listens there. SO_REUSEPORT would otherwise let a second server silently
/// share the port and split the devices between two processes.
int shim_port_is_free(const char *host, uint16_t port, char *err, size_t err_len);

/// The local port a socket is bound to, or -1.
int shim_local_port(int fd);

/// accept4 with SOCK_NONBLOCK | SOCK_CLOEXEC. Writes a 64-bit hash of the peer's IP
/// address (not the port) to address_hash, so per-address limits need no sockaddr in Swift.
int shim_accept(int listen_fd, uint64_t *address_hash);

/// The hash shim_accept computes, of an IP address's bytes (4 for IPv4, 16 for IPv6):
/// an address read from a PROXY protocol header counts against the same per-address cap
/// as the same address connecting directly.
uint64_t shim_address_hash(const void *bytes, size_t count);

/// Writes "1.2.3.4:port" (family 4, 4 bytes) or "[2001:db8::1]:port" (family 6, 16 bytes)
/// to out. Returns 0, or -1 if out is too small (48 bytes always suffice).
int shim_format_address(int family, const void *bytes, uint16_t port, char *out, size_t out_len);

/// The peer address of a connected socket, formatted like shim_format_address. 0 or -1.
int shim_peer_address(int fd, char *out, size_t out_len);

/// Non-blocking, close-on-exec eventfd for cross-thread wake-ups.
int shim_eventfd(void);

/// pipe2(fds, O_CLOEXEC): a pipe no child inherits, not even one spawned by another
/// thread a moment later (Swift's Glibc module does not export pipe2). 0 or -1 (errno).
int shim_cloexec_pipe(int fds[2]);

/// accept4 with SOCK_CLOEXEC only (a blocking socket, for test fixtures and tools).
int shim_accept_cloexec(int listen_fd);
/// Adds one to an eventfd / drains it.
void shim_eventfd_signal(int fd);
void shim_eventfd_drain(int fd);

/// Thread-local "current event loop" pointer, so libevent callbacks (which get one
/// argument) can carry a connection slot and still find their loop.
void shim_set_current_loop(void *loop);
void *shim_current_loop(void);
#endif
