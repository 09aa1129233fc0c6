#ifndef REDIS_ASYNC_SHIMS_H
#define REDIS_ASYNC_SHIMS_H
// hiredis 0.14's asynchronous API on a libevent event_base (hiredis's libevent adapter),
// as the node link (RedisNodeLink) uses it, behind a header with no system includes (see
// CHiredis/shim.h for why). A `vs_redis_async` is ours: it outlives hiredis's context, so
// that a connection hiredis dropped on an error can still be closed by its owner exactly
// once, and no callback reaches the owner after `vs_redis_async_close`.
//
// Threads: everything on the thread that runs the event_base.
#include <stddef.h>
#include <stdint.h>

struct event_base;
typedef struct vs_redis_async vs_redis_async;
typedef struct vs_redis_reply vs_redis_reply;

/// The connection is up (`connected` 1), or failed or dropped (`connected` 0, with why in
/// `error`): hiredis has then freed its context; only `vs_redis_async_close` is left to call.
typedef void (*vs_redis_async_state_callback)(void *argument, int connected, const char *error);
/// A reply to the command sent with `tag` (for SUBSCRIBE: each confirmation and each
/// message on the channels it named). Not called for replies lost with the connection.
/// `reply` is valid during the call only.
typedef void (*vs_redis_async_reply_callback)(void *argument, const vs_redis_reply *reply, uintptr_t tag);

/// Starts connecting over TCP to `host` (an address: no name lookup) and attaches the
/// connection to `base`. NULL when it failed at once (the reason in `error`, always
/// NUL-terminated); otherwise `on_state` says later whether it connected.
vs_redis_async *vs_redis_async_connect(
    struct event_base *base, const char *host, int port, vs_redis_async_state_callback on_state,
    vs_redis_async_reply_callback on_reply, void *argument, char *error, size_t capacity);
/// Queues a command (`argc` arguments laid end to end in `data`, `lengths[i]` bytes each):
/// written when the socket is writable, its reply passed to `on_reply` with `tag`.
/// 1 queued; 0 when the connection is gone or closing (or out of memory).
int vs_redis_async_command(vs_redis_async *redis, uintptr_t tag, const uint8_t *data, const size_t *lengths, int argc);
/// Writes what is queued now, as far as the socket takes it, instead of at the event
/// loop's next turn (the rest waits for writability as usual). A write error drops the
/// connection: `on_state` reports it, from inside this call. Call it only from a callback
/// of the event_base that is not one of this connection's own (hiredis may be inside it),
/// and only once `on_state` said connected.
void vs_redis_async_flush(vs_redis_async *redis);
/// Bytes queued and not yet written to the socket.
size_t vs_redis_async_unwritten(const vs_redis_async *redis);
/// Drops the connection if hiredis still has it, and frees `redis`. No callback runs
/// during or after it. Never call it from one of this connection's callbacks.
void vs_redis_async_close(vs_redis_async *redis);
#endif
