#ifndef CHIREDISSHIMS_H
#define CHIREDISSHIMS_H
// The slice of hiredis's synchronous API the Redis store uses, behind a header that
// includes no system header (see CHiredis/shim.h for why). Types stay opaque; the reply
// type constants are ours and checked against hiredis's at compile time in the .c file.
//
// Threads: a connection is used by one thread at a time (the store writer's); replies are
// plain memory and may be read by any thread until freed.
#include <stddef.h>
#include <stdint.h>

typedef struct vs_redis vs_redis;
typedef struct vs_redis_reply vs_redis_reply;

#define VS_REDIS_REPLY_STRING 1
#define VS_REDIS_REPLY_ARRAY 2
#define VS_REDIS_REPLY_INTEGER 3
#define VS_REDIS_REPLY_NIL 4
#define VS_REDIS_REPLY_STATUS 5
#define VS_REDIS_REPLY_ERROR 6

/// Connects over TCP to `host` (a name or an address) within `timeout_ms`, which then
/// also bounds every later read and write (SO_RCVTIMEO/SO_SNDTIMEO), with TCP keep-alive
/// on. NULL on failure, with the reason in `error` (always NUL-terminated).
vs_redis *vs_redis_connect(const char *host, int port, int timeout_ms, char *error, size_t capacity);
void vs_redis_free(vs_redis *redis);

/// Queues one command (pipelining: nothing is sent until a reply is read): `argc`
/// arguments laid end to end in `data`, `lengths[i]` bytes each (binary-safe). 1 on
/// success, 0 when out of memory.
int vs_redis_append(vs_redis *redis, const uint8_t *data, const size_t *lengths, int argc);
/// Sends what is queued and reads the next reply (a Redis error is a reply of type
/// VS_REDIS_REPLY_ERROR). NULL on an I/O error, a timeout or a protocol error: the
/// connection is then unusable (`vs_redis_describe_failure` says why).
vs_redis_reply *vs_redis_read(vs_redis *redis);
/// Sends what is queued without reading a reply, so that commands on several connections
/// can be in flight at once (the replies are then read with `vs_redis_read`). 1 when all
/// of it was written, 0 on an I/O error or a timeout (the connection is then unusable).
int vs_redis_flush(vs_redis *redis);
/// Why the connection failed. Always NUL-terminated.
void vs_redis_describe_failure(const vs_redis *redis, char *text, size_t capacity);

int vs_redis_reply_type(const vs_redis_reply *reply);
long long vs_redis_reply_integer(const vs_redis_reply *reply);
/// The bytes of a string, status or error reply, and their count.
const uint8_t *vs_redis_reply_bytes(const vs_redis_reply *reply, size_t *length);
/// The elements of an array reply (0 for any other type).
size_t vs_redis_reply_count(const vs_redis_reply *reply);
const vs_redis_reply *vs_redis_reply_element(const vs_redis_reply *reply, size_t index);
/// Frees a reply returned by `vs_redis_read` with its elements.
void vs_redis_reply_free(vs_redis_reply *reply);

#include "redis_async_shims.h"
#endif
