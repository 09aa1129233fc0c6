#ifndef CLIBEVENTSHIMS_H
#define CLIBEVENTSHIMS_H
// The slice of libevent the Swift code uses, behind a header that includes no system
// header: libevent's own headers pull in <sys/select.h> and friends, and a Clang module
// that includes them textually clashes with Swift's Glibc module on a clean build
// ("fd_set ... is not present in definition"). Types stay opaque; constants are ours and
// checked against libevent's at compile time in the .c file.
#include <stdint.h>
#include <stddef.h>

struct event_base;
struct event;

#define VS_EV_TIMEOUT 0x01
#define VS_EV_READ 0x02
#define VS_EV_WRITE 0x04
#define VS_EV_PERSIST 0x10

#define VS_EVLOOP_ONCE 0x01
#define VS_EVLOOP_NONBLOCK 0x02

typedef void (*vs_event_callback)(int fd, short what, void *argument);

struct event_base *vs_event_base_new(void);
void vs_event_base_free(struct event_base *base);
/// Runs until there are no events or loopbreak; 0, 1 (no events) or -1.
int vs_event_base_dispatch(struct event_base *base);
/// One pass, with VS_EVLOOP_* flags.
int vs_event_base_loop(struct event_base *base, int flags);
int vs_event_base_loopbreak(struct event_base *base);
int vs_event_base_got_break(struct event_base *base);

/// A heap-allocated event (free with vs_event_free).
struct event *vs_event_new(struct event_base *base, int fd, short what, vs_event_callback callback, void *argument);
void vs_event_free(struct event *event);
/// Initialises an event in memory the caller owns (vs_event_struct_size bytes).
int vs_event_assign(struct event *event, struct event_base *base, int fd, short what, vs_event_callback callback, void *argument);
/// Adds the event; timeout_microseconds < 0 means none.
int vs_event_add(struct event *event, int64_t timeout_microseconds);
int vs_event_del(struct event *event);
/// Makes the event's callback run in the loop's next pass with `what` (VS_EV_* flags), as
/// if the socket had become ready: for input a library buffered, which no readiness
/// event announces.
void vs_event_activate(struct event *event, short what);
/// Non-zero once the event memory has been assigned (zeroed memory is not).
int vs_event_initialized(const struct event *event);
size_t vs_event_struct_size(void);

#include "http_shims.h"
#include "httpd_shims.h"
#endif
