#define _GNU_SOURCE
#include "thread_shims.h"
#include <malloc.h>
#include <pthread.h>
#include <sched.h>
#include <string.h>
#include <unistd.h>

void shim_name_thread(unsigned long thread, const char *name) {
    char truncated[16];
    strncpy(truncated, name, sizeof truncated - 1);
    truncated[sizeof truncated - 1] = 0;
    (void)pthread_setname_np((pthread_t)thread, truncated);
}

int shim_pin_thread(unsigned long thread, int cpu) {
    if (cpu < 0 || cpu >= CPU_SETSIZE) return 22; /* EINVAL */
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    return pthread_setaffinity_np((pthread_t)thread, sizeof set, &set);
}

int shim_configured_cpus(void) {
    long count = sysconf(_SC_NPROCESSORS_CONF);
    return count > 0 ? (int)count : 1;
}

unsigned long shim_malloc_usable_size(void *pointer) {
    return (unsigned long)malloc_usable_size(pointer);
}
