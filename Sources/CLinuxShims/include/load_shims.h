#pragma once
// Linux APIs that voipload needs and Swift's Glibc module does not export: epoll, and the
// variadic prctl (Swift cannot call variadic C functions).
#include <sys/epoll.h>
#include <netinet/in.h>
#include <netinet/tcp.h>

/// Asks the kernel to send `signal` to this process when its parent dies, so that load
/// workers never outlive a coordinator that was killed. Returns 0 or -1 (errno set).
int voipload_set_parent_death_signal(int signal);
