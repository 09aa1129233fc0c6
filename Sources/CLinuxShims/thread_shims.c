#define _GNU_SOURCE
#include "thread_shims.h"
#include <errno.h>
#include <limits.h>
#include <malloc.h>
#include <pthread.h>
#include <sched.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

void shim_name_thread(unsigned long thread, const char *name) {
    char truncated[16];
    strncpy(truncated, name, sizeof truncated - 1);
    truncated[sizeof truncated - 1] = 0;
    (void)pthread_setname_np((pthread_t)thread, truncated);
}

int shim_pin_thread(unsigned long thread, const int *cpus, int count) {
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int i = 0; i < count; i++) {
        if (cpus[i] < 0 || cpus[i] >= CPU_SETSIZE) return EINVAL;
        CPU_SET(cpus[i], &set);
    }
    return pthread_setaffinity_np((pthread_t)thread, sizeof set, &set);
}

/// The CPUs of `set`, in increasing order, into `cpus`: how many there are.
static int list_cpus(const cpu_set_t *set, int *cpus, int capacity) {
    int count = 0;
    for (int cpu = 0; cpu < CPU_SETSIZE && count < capacity; cpu++) {
        if (CPU_ISSET(cpu, set)) cpus[count++] = cpu;
    }
    return count;
}

int shim_thread_cpus(unsigned long thread, int *cpus, int capacity) {
    cpu_set_t set;
    int error = pthread_getaffinity_np((pthread_t)thread, sizeof set, &set);
    if (error != 0) {
        errno = error;
        return -1;
    }
    return list_cpus(&set, cpus, capacity);
}

int shim_process_cpus(int *cpus, int capacity) {
    cpu_set_t set;
    if (sched_getaffinity(getpid(), sizeof set, &set) != 0) return -1;
    return list_cpus(&set, cpus, capacity);
}

int shim_configured_cpus(void) {
    long count = sysconf(_SC_NPROCESSORS_CONF);
    return count > 0 ? (int)count : 1;
}

unsigned long shim_malloc_usable_size(void *pointer) {
    return (unsigned long)malloc_usable_size(pointer);
}

int shim_set_thread_idle(unsigned long thread, int idle) {
    struct sched_param param = {.sched_priority = 0};
    return pthread_setschedparam((pthread_t)thread, idle ? SCHED_IDLE : SCHED_OTHER, &param);
}

int shim_set_thread_fifo(unsigned long thread, int priority) {
    struct sched_param param = {.sched_priority = priority};
    return pthread_setschedparam((pthread_t)thread, priority > 0 ? SCHED_FIFO : SCHED_OTHER, &param);
}

int shim_thread_fifo_priority(unsigned long thread) {
    struct sched_param param;
    int policy = 0;
    if (pthread_getschedparam((pthread_t)thread, &policy, &param) != 0) return -1;
    return policy == SCHED_FIFO ? param.sched_priority : 0;
}

int shim_thread_is_idle(unsigned long thread) {
    struct sched_param param;
    int policy = 0;
    if (pthread_getschedparam((pthread_t)thread, &policy, &param) != 0) return -1;
    return policy == SCHED_IDLE ? 1 : 0;
}

int shim_current_thread_id(void) {
    return (int)syscall(SYS_gettid);
}

int shim_set_thread_nice(int tid, int nice) {
    return setpriority(PRIO_PROCESS, (id_t)tid, nice) == 0 ? 0 : errno;
}

int shim_thread_nice(int tid) {
    // -1 is a valid nice value: errno tells an error apart.
    errno = 0;
    int nice = getpriority(PRIO_PROCESS, (id_t)tid);
    return (nice == -1 && errno != 0) ? INT_MIN : nice;
}

static void *try_idle_and_back(void *result) {
    pthread_t self = pthread_self();
    *(int *)result = shim_set_thread_idle((unsigned long)self, 1) == 0 && shim_set_thread_idle((unsigned long)self, 0) == 0;
    return NULL;
}

int shim_may_restore_from_idle(void) {
    int result = 0;
    pthread_t probe;
    if (pthread_create(&probe, NULL, try_idle_and_back, &result) != 0) return 0;
    pthread_join(probe, NULL);
    return result;
}

// `struct sched_attr` of <linux/sched/types.h> (not in glibc's headers): its first
// version, which every kernel with sched_setattr (3.14) takes.
struct shim_sched_attr {
    uint32_t size;
    uint32_t sched_policy;
    uint64_t sched_flags;
    int32_t sched_nice;
    uint32_t sched_priority;
    uint64_t sched_runtime;
    uint64_t sched_deadline;
    uint64_t sched_period;
};

// SCHED_FLAG_KEEP_POLICY of <linux/sched.h>: the policy stays; the nice value must be
// given (SCHED_FLAG_KEEP_PARAMS would keep the slice too).
#define SHIM_SCHED_FLAG_KEEP_POLICY 0x08

int shim_set_thread_slice(int tid, uint64_t nanoseconds) {
    int nice = shim_thread_nice(tid);
    if (nice == INT_MIN) return errno;
    struct shim_sched_attr attr;
    memset(&attr, 0, sizeof(attr));
    attr.size = sizeof(attr);
    attr.sched_flags = SHIM_SCHED_FLAG_KEEP_POLICY;
    attr.sched_nice = nice;
    attr.sched_runtime = nanoseconds;
    return syscall(SYS_sched_setattr, tid, &attr, 0) == 0 ? 0 : errno;
}

int64_t shim_thread_slice(int tid) {
    struct shim_sched_attr attr;
    memset(&attr, 0, sizeof(attr));
    if (syscall(SYS_sched_getattr, tid, &attr, sizeof(attr), 0) != 0) return -1;
    return (int64_t)attr.sched_runtime;
}
