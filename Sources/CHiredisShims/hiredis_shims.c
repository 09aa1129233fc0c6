#include "CHiredisShims.h"
#include "command_argv.h"
#include <hiredis/hiredis.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(VS_REDIS_REPLY_STRING == REDIS_REPLY_STRING, "reply type");
_Static_assert(VS_REDIS_REPLY_ARRAY == REDIS_REPLY_ARRAY, "reply type");
_Static_assert(VS_REDIS_REPLY_INTEGER == REDIS_REPLY_INTEGER, "reply type");
_Static_assert(VS_REDIS_REPLY_NIL == REDIS_REPLY_NIL, "reply type");
_Static_assert(VS_REDIS_REPLY_STATUS == REDIS_REPLY_STATUS, "reply type");
_Static_assert(VS_REDIS_REPLY_ERROR == REDIS_REPLY_ERROR, "reply type");

vs_redis *vs_redis_connect(const char *host, int port, int timeout_ms, char *error, size_t capacity) {
    struct timeval timeout = {timeout_ms / 1000, (timeout_ms % 1000) * 1000};
    redisContext *context = redisConnectWithTimeout(host, port, timeout);
    if (context == NULL) {
        snprintf(error, capacity, "out of memory");
        return NULL;
    }
    if (context->err) {
        snprintf(error, capacity, "%s", context->errstr);
        redisFree(context);
        return NULL;
    }
    // The connect timeout covers connect(2) only: every reply waits at most as long too,
    // so a Redis that stops answering fails the command instead of hanging the writer.
    if (redisSetTimeout(context, timeout) != REDIS_OK || redisEnableKeepAlive(context) != REDIS_OK) {
        snprintf(error, capacity, "cannot set socket options: %s", context->errstr);
        redisFree(context);
        return NULL;
    }
    return (vs_redis *)context;
}

void vs_redis_free(vs_redis *redis) { redisFree((redisContext *)redis); }

const char **vs_redis_argv(const uint8_t *data, const size_t *lengths, int argc, const char **stack) {
    const char **argv = argc <= VS_REDIS_ARGV_STACK ? stack : malloc(sizeof(char *) * (size_t)argc);
    if (argv == NULL) return NULL;
    size_t offset = 0;
    for (int index = 0; index < argc; index++) {
        argv[index] = (const char *)data + offset;
        offset += lengths[index];
    }
    return argv;
}

void vs_redis_argv_free(const char **argv, const char **stack) {
    if (argv != stack) free((void *)argv);
}

int vs_redis_append(vs_redis *redis, const uint8_t *data, const size_t *lengths, int argc) {
    const char *stack[VS_REDIS_ARGV_STACK];
    const char **argv = vs_redis_argv(data, lengths, argc, stack);
    if (argv == NULL) return 0;
    int result = redisAppendCommandArgv((redisContext *)redis, argc, argv, lengths);
    vs_redis_argv_free(argv, stack);
    return result == REDIS_OK;
}

vs_redis_reply *vs_redis_read(vs_redis *redis) {
    void *reply = NULL;
    if (redisGetReply((redisContext *)redis, &reply) != REDIS_OK) return NULL;
    return reply;
}

int vs_redis_flush(vs_redis *redis) {
    int done = 0;
    // A blocking context writes what the socket takes; the loop ends when the buffer is
    // empty (a write that times out is an error).
    while (!done) {
        if (redisBufferWrite((redisContext *)redis, &done) != REDIS_OK) return 0;
    }
    return 1;
}

void vs_redis_describe_failure(const vs_redis *redis, char *text, size_t capacity) {
    const redisContext *context = (const redisContext *)redis;
    snprintf(text, capacity, "%s", context->err ? context->errstr : "no error");
}

int vs_redis_reply_type(const vs_redis_reply *reply) { return ((const redisReply *)reply)->type; }

long long vs_redis_reply_integer(const vs_redis_reply *reply) { return ((const redisReply *)reply)->integer; }

const uint8_t *vs_redis_reply_bytes(const vs_redis_reply *reply, size_t *length) {
    const redisReply *r = (const redisReply *)reply;
    *length = r->str ? r->len : 0;
    return (const uint8_t *)r->str;
}

size_t vs_redis_reply_count(const vs_redis_reply *reply) {
    const redisReply *r = (const redisReply *)reply;
    return r->type == REDIS_REPLY_ARRAY ? r->elements : 0;
}

const vs_redis_reply *vs_redis_reply_element(const vs_redis_reply *reply, size_t index) {
    return (const vs_redis_reply *)((const redisReply *)reply)->element[index];
}

void vs_redis_reply_free(vs_redis_reply *reply) { freeReplyObject(reply); }
