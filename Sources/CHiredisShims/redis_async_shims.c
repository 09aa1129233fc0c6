#include "CHiredisShims.h"
#include "command_argv.h"
#include <hiredis/hiredis.h>
#include <hiredis/async.h>
#include <hiredis/sds.h>
#include <hiredis/adapters/libevent.h>
#include <stdio.h>
#include <stdlib.h>

struct vs_redis_async {
    /// hiredis's context; NULL once hiredis dropped it (after the state callback said so)
    /// or `vs_redis_async_close` freed it.
    redisAsyncContext *context;
    /// Set by `vs_redis_async_close`: the callbacks hiredis makes while freeing the
    /// context (the disconnect) do not reach the owner.
    int closing;
    vs_redis_async_state_callback on_state;
    vs_redis_async_reply_callback on_reply;
    void *argument;
};

// hiredis calls this after the first write event (connected) or when connect(2) failed,
// in which case it frees the context as soon as this returns.
static void on_connect(const redisAsyncContext *context, int status) {
    vs_redis_async *redis = context->data;
    if (status != REDIS_OK) redis->context = NULL;
    if (redis->closing) return;
    if (status == REDIS_OK) {
        redis->on_state(redis->argument, 1, "");
    } else {
        redis->on_state(redis->argument, 0, context->c.errstr[0] ? context->c.errstr : "cannot connect");
    }
}

// hiredis calls this from inside the free of a connected context, whether an error dropped
// it or the owner closed it: the context is gone when this returns.
static void on_disconnect(const redisAsyncContext *context, int status) {
    vs_redis_async *redis = context->data;
    redis->context = NULL;
    if (redis->closing) return;
    const char *why = status == REDIS_OK ? "disconnected" : (context->c.errstr[0] ? context->c.errstr : "connection lost");
    redis->on_state(redis->argument, 0, why);
}

// Replies, and for SUBSCRIBE every confirmation and message. A NULL reply is one lost
// with the connection (hiredis runs the pending callbacks while freeing): the state
// callback reports the loss instead.
static void on_reply(redisAsyncContext *context, void *reply, void *tag) {
    vs_redis_async *redis = context->data;
    if (reply == NULL || redis->closing) return;
    redis->on_reply(redis->argument, (const vs_redis_reply *)reply, (uintptr_t)tag);
}

vs_redis_async *vs_redis_async_connect(
    struct event_base *base, const char *host, int port, vs_redis_async_state_callback on_state,
    vs_redis_async_reply_callback on_reply_callback, void *argument, char *error, size_t capacity) {
    vs_redis_async *redis = calloc(1, sizeof(*redis));
    if (redis == NULL) {
        snprintf(error, capacity, "out of memory");
        return NULL;
    }
    redisAsyncContext *context = redisAsyncConnect(host, port);
    if (context == NULL) {
        snprintf(error, capacity, "out of memory");
        free(redis);
        return NULL;
    }
    if (context->err) {
        snprintf(error, capacity, "%s", context->errstr);
        redisAsyncFree(context);
        free(redis);
        return NULL;
    }
    // A peer that vanished without a FIN (a partition, a dead host) is found by the
    // link's own probes sooner; keep-alive is the kernel's backstop for idle moments.
    redisEnableKeepAlive(&context->c);
    redis->context = context;
    redis->on_state = on_state;
    redis->on_reply = on_reply_callback;
    redis->argument = argument;
    context->data = redis;
    if (redisLibeventAttach(context, base) != REDIS_OK) {
        snprintf(error, capacity, "cannot attach to the event loop");
        redisAsyncFree(context);
        free(redis);
        return NULL;
    }
    redisAsyncSetConnectCallback(context, on_connect);
    redisAsyncSetDisconnectCallback(context, on_disconnect);
    return redis;
}

int vs_redis_async_command(vs_redis_async *redis, uintptr_t tag, const uint8_t *data, const size_t *lengths, int argc) {
    if (redis->context == NULL || redis->closing) return 0;
    const char *stack[VS_REDIS_ARGV_STACK];
    const char **argv = vs_redis_argv(data, lengths, argc, stack);
    if (argv == NULL) return 0;
    int result = redisAsyncCommandArgv(redis->context, on_reply, (void *)tag, argc, argv, lengths);
    vs_redis_argv_free(argv, stack);
    return result == REDIS_OK;
}

void vs_redis_async_flush(vs_redis_async *redis) {
    if (redis->context == NULL || redis->closing || !(redis->context->c.flags & REDIS_CONNECTED)) return;
    if (sdslen(redis->context->c.obuf) == 0) return;
    redisAsyncHandleWrite(redis->context);
}

size_t vs_redis_async_unwritten(const vs_redis_async *redis) {
    return redis->context == NULL ? 0 : sdslen(redis->context->c.obuf);
}

void vs_redis_async_close(vs_redis_async *redis) {
    if (redis == NULL) return;
    redis->closing = 1;
    if (redis->context != NULL) redisAsyncFree(redis->context);
    free(redis);
}
