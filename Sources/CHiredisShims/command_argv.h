#ifndef VS_REDIS_COMMAND_ARGV_H
#define VS_REDIS_COMMAND_ARGV_H
// Private to CHiredisShims: the argument vector of a command laid end to end (the form
// both the synchronous and the asynchronous calls take from Swift).
#include <stddef.h>
#include <stdint.h>

#define VS_REDIS_ARGV_STACK 16

/// Pointers to the `argc` arguments in `data` (`lengths[i]` bytes each): in `stack` when
/// there are at most VS_REDIS_ARGV_STACK, else in memory to free with
/// `vs_redis_argv_free`. NULL when out of memory.
const char **vs_redis_argv(const uint8_t *data, const size_t *lengths, int argc, const char **stack);
void vs_redis_argv_free(const char **argv, const char **stack);
#endif
