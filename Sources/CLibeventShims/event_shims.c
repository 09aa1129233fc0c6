#include "CLibeventShims.h"
#include <event2/event.h>
#include <event2/event_struct.h>

_Static_assert(VS_EV_TIMEOUT == EV_TIMEOUT, "EV_TIMEOUT");
_Static_assert(VS_EV_READ == EV_READ, "EV_READ");
_Static_assert(VS_EV_WRITE == EV_WRITE, "EV_WRITE");
_Static_assert(VS_EV_PERSIST == EV_PERSIST, "EV_PERSIST");
_Static_assert(VS_EVLOOP_ONCE == EVLOOP_ONCE, "EVLOOP_ONCE");
_Static_assert(VS_EVLOOP_NONBLOCK == EVLOOP_NONBLOCK, "EVLOOP_NONBLOCK");

struct event_base *vs_event_base_new(void) { return event_base_new(); }
void vs_event_base_free(struct event_base *base) { event_base_free(base); }
int vs_event_base_dispatch(struct event_base *base) { return event_base_dispatch(base); }
int vs_event_base_loop(struct event_base *base, int flags) { return event_base_loop(base, flags); }
int vs_event_base_loopbreak(struct event_base *base) { return event_base_loopbreak(base); }
int vs_event_base_got_break(struct event_base *base) { return event_base_got_break(base); }

struct event *vs_event_new(struct event_base *base, int fd, short what, vs_event_callback callback, void *argument) {
    return event_new(base, fd, what, callback, argument);
}

void vs_event_free(struct event *event) { event_free(event); }

int vs_event_assign(struct event *event, struct event_base *base, int fd, short what, vs_event_callback callback, void *argument) {
    return event_assign(event, base, fd, what, callback, argument);
}

int vs_event_add(struct event *event, int64_t timeout_microseconds) {
    if (timeout_microseconds < 0) return event_add(event, NULL);
    struct timeval timeout;
    timeout.tv_sec = (time_t)(timeout_microseconds / 1000000);
    timeout.tv_usec = (suseconds_t)(timeout_microseconds % 1000000);
    return event_add(event, &timeout);
}

int vs_event_del(struct event *event) { return event_del(event); }
void vs_event_activate(struct event *event, short what) { event_active(event, what, 0); }
int vs_event_initialized(const struct event *event) { return event_initialized(event); }
size_t vs_event_struct_size(void) { return event_get_struct_event_size(); }
