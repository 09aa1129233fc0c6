#define _GNU_SOURCE
#include "socket_shims.h"
#include <sys/socket.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include <fcntl.h>

int shim_listen_tcp(const char *host, uint16_t port, int reuse_port, int backlog, char *err, size_t err_len) {
    struct addrinfo hints, *result = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    char service[8];
    snprintf(service, sizeof service, "%u", (unsigned)port);
    const char *node = (host && host[0]) ? host : "0.0.0.0";
    int rc = getaddrinfo(node, service, &hints, &result);
    if (rc != 0) {
        snprintf(err, err_len, "cannot resolve %s: %s", node, gai_strerror(rc));
        return -1;
    }
    int fd = -1;
    for (struct addrinfo *ai = result; ai; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) continue;
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (reuse_port) setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, backlog) == 0) break;
        snprintf(err, err_len, "cannot listen on %s:%u: %s", node, (unsigned)port, strerror(errno));
        close(fd);
        fd = -1;
    }
    freeaddrinfo(result);
    return fd;
}

int shim_port_is_free(const char *host, uint16_t port, char *err, size_t err_len) {
    int fd = shim_listen_tcp(host, port, 0, 1, err, err_len);
    if (fd < 0) return 0;
    close(fd);
    return 1;
}

int shim_local_port(int fd) {
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &len) != 0) return -1;
    if (ss.ss_family == AF_INET) return ntohs(((struct sockaddr_in *)&ss)->sin_port);
    if (ss.ss_family == AF_INET6) return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    return -1;
}

static uint64_t fnv1a(const unsigned char *bytes, size_t count) {
    uint64_t hash = 1469598103934665603ULL;
    for (size_t i = 0; i < count; i++) { hash ^= bytes[i]; hash *= 1099511628211ULL; }
    return hash;
}

uint64_t shim_address_hash(const void *bytes, size_t count) { return fnv1a(bytes, count); }

int shim_format_address(int family, const void *bytes, uint16_t port, char *out, size_t out_len) {
    char text[INET6_ADDRSTRLEN];
    int af = family == 6 ? AF_INET6 : AF_INET;
    if (!inet_ntop(af, bytes, text, sizeof text)) return -1;
    int written = snprintf(out, out_len, af == AF_INET6 ? "[%s]:%u" : "%s:%u", text, (unsigned)port);
    return written < 0 || (size_t)written >= out_len ? -1 : 0;
}

int shim_peer_address(int fd, char *out, size_t out_len) {
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    if (getpeername(fd, (struct sockaddr *)&ss, &len) != 0) return -1;
    if (ss.ss_family == AF_INET) {
        struct sockaddr_in *in = (struct sockaddr_in *)&ss;
        return shim_format_address(4, &in->sin_addr, ntohs(in->sin_port), out, out_len);
    }
    if (ss.ss_family == AF_INET6) {
        struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&ss;
        return shim_format_address(6, &in6->sin6_addr, ntohs(in6->sin6_port), out, out_len);
    }
    return -1;
}

int shim_accept(int listen_fd, uint64_t *address_hash) {
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    int fd = accept4(listen_fd, (struct sockaddr *)&ss, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return -1;
    if (ss.ss_family == AF_INET) {
        *address_hash = fnv1a((const unsigned char *)&((struct sockaddr_in *)&ss)->sin_addr, 4);
    } else if (ss.ss_family == AF_INET6) {
        *address_hash = fnv1a((const unsigned char *)&((struct sockaddr_in6 *)&ss)->sin6_addr, 16);
    } else {
        *address_hash = 0;
    }
    return fd;
}

int shim_eventfd(void) { return eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC); }

int shim_cloexec_pipe(int fds[2]) { return pipe2(fds, O_CLOEXEC); }

int shim_accept_cloexec(int listen_fd) { return accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC); }

void shim_eventfd_signal(int fd) {
    uint64_t one = 1;
    ssize_t ignored = write(fd, &one, sizeof one);
    (void)ignored;
}

void shim_eventfd_drain(int fd) {
    uint64_t value;
    ssize_t ignored = read(fd, &value, sizeof value);
    (void)ignored;
}

static __thread void *current_loop;
void shim_set_current_loop(void *loop) { current_loop = loop; }
void *shim_current_loop(void) { return current_loop; }
