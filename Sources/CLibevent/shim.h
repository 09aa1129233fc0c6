#ifndef CLIBEVENT_SHIM_H
#define CLIBEVENT_SHIM_H
// libevent 2.1: the core event loop and its HTTP client (push gateway wake-ups).
// Each event_base is used by one thread only, so evthread locking is not enabled.
#include <event2/event.h>
#include <event2/util.h>
#include <event2/buffer.h>
#include <event2/http.h>
#endif
