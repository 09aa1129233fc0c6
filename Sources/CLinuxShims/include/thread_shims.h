#ifndef THREAD_SHIMS_H
#define THREAD_SHIMS_H
// pthread calls that Swift's Glibc module does not export (GNU extensions) or whose
// arguments are macros (CPU_SET). Only <stdint.h>-level types here: a pthread_t is an
// unsigned long on Linux.

#include <stdint.h>

/// Names a thread of this process (what `top -H` and `ps -L` show; at most 15 bytes are
/// kept). Errors (the thread is already gone) are ignored: a name is a convenience.
void shim_name_thread(unsigned long thread, const char *name);

/// Restricts `thread` to the `count` CPUs at `cpus`. Returns 0, or the error number
/// (EINVAL: a CPU number outside 0..<CPU_SETSIZE, or none of them is one this process may
/// use; EPERM: a policy forbids it).
int shim_pin_thread(unsigned long thread, const int *cpus, int count);

/// The CPUs `thread` may run on, in increasing order, into `cpus` (room for `capacity`).
/// Returns how many, or -1 (the error is in errno).
int shim_thread_cpus(unsigned long thread, int *cpus, int capacity);

/// The CPUs the process may run on (the main thread's mask: what taskset, a cpuset
/// cgroup or systemd's CPUAffinity= gave it), in increasing order, into `cpus`. Returns
/// how many, or -1 (the error is in errno).
int shim_process_cpus(int *cpus, int capacity);

/// Bytes malloc actually gave the block at `pointer` (glibc's malloc_usable_size, whose
/// header Swift does not import): how tests check that a per-device object stays within
/// the heap block its memory budget assumes.
unsigned long shim_malloc_usable_size(void *pointer);

/// CPUs the system has configured (online or not): valid CPU numbers are below this.
int shim_configured_cpus(void);

/// Moves `thread` to the SCHED_IDLE policy (`idle` 1: it runs only on CPU time that no
/// thread of a normal policy wants, and a waking normal thread preempts it at once) or
/// back to SCHED_OTHER at the thread's nice value (`idle` 0). Returns 0 or the error number
/// (EPERM: leaving SCHED_IDLE needs CAP_SYS_NICE or an RLIMIT_NICE of at least 20 - nice).
int shim_set_thread_idle(unsigned long thread, int idle);

/// 1 when `thread` runs at SCHED_IDLE, 0 when it does not, -1 when it cannot be read.
int shim_thread_is_idle(unsigned long thread);
/// SCHED_FIFO at `priority` (1-99), or SCHED_OTHER for 0. 0 or the error number.
int shim_set_thread_fifo(unsigned long thread, int priority);
/// The thread's SCHED_FIFO priority, 0 under another policy, -1 if it cannot be read.
int shim_thread_fifo_priority(unsigned long thread);

/// The calling thread's kernel id (gettid): what `setpriority` and /proc/self/task name a
/// thread by.
int shim_current_thread_id(void);

/// Sets the nice value of the thread with kernel id `tid`: the weight it gets under
/// SCHED_OTHER (19 is the lightest, about 1.5 % of a CPU against one busy thread at nice 0).
/// Returns 0 or the error number (EPERM/EACCES: lowering it needs CAP_SYS_NICE or an
/// RLIMIT_NICE of at least 20 - `nice`; ESRCH: no such thread).
int shim_set_thread_nice(int tid, int nice);

/// The nice value of the thread with kernel id `tid`, or INT_MIN when it cannot be read.
int shim_thread_nice(int tid);

/// Asks the scheduler for a slice of `nanoseconds` for the thread with kernel id `tid`,
/// keeping its policy and nice value (`sched_setattr`'s `sched_runtime`; 0: the default
/// slice again). Linux 6.12 and later clamp it to 0.1-100 ms and let a waking thread whose
/// slice is shorter than the running thread's preempt it at once; earlier kernels ignore
/// it. Returns 0 or the error number (ESRCH: no such thread; ENOSYS: no sched_setattr).
int shim_set_thread_slice(int tid, uint64_t nanoseconds);

/// The slice of the thread with kernel id `tid` in force, in ns: the one it asked for, or
/// the default (Linux 6.12 and later report it); 0 from kernels that keep none per thread;
/// -1 when it cannot be read.
int64_t shim_thread_slice(int tid);

/// 1 when this process may move a thread to SCHED_IDLE and back again, 0 when not: tried
/// on a short-lived thread of its own, since a thread that could not come back would be
/// left at idle priority.
int shim_may_restore_from_idle(void);

#endif
