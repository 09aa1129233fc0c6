#ifndef CLINUXSHIMS_H
#define CLINUXSHIMS_H
// Small C helpers for Linux APIs that Swift cannot use directly (function-like macros,
// flag combinations, thread-local storage). One header per area.
#include "socket_shims.h"
#include "load_shims.h"
#include "netlink_shims.h"
#include "thread_shims.h"
#endif
