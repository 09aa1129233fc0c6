// The reference counts and allocations two threads share, counted (Tools/bench-shared-counts;
// docs/LOAD-TESTING.md, "Routing on more cores"). An LD_PRELOAD library: it swizzles the
// Swift runtime's retain, release and allocation entry points (the hooks the runtime keeps
// for instrumentation) and interposes malloc and free, and at exit writes, per type and per
// event (RCSHIM_EVENTS), how often each thread touched the reference counts of its objects,
// how many of those touches were on objects that both worker threads (the second and third
// threads the process made) touched in their lifetime ("shared-rr": every one a candidate
// for a cache line moving between the cores, the noise-free proxy for what wall-clock
// profiles show as dearer retains with two threads), and how many objects were freed by a
// thread other than the one that made them ("xfrees": glibc then works on another
// thread's arena). RCSHIM_OUT: that table; RCSHIM_OBJECTS: the long-lived objects both
// workers touched, one by one; RCSHIM_TRACE (hex offsets of class metadata symbols in the
// executable, from nm) with RCSHIM_SITES: where in the executable those classes' counts are
// touched (two return addresses, for addr2line). Counting, not timing: one global spinlock
// serialises the bookkeeping, so the threads interleave more coarsely than they would.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdatomic.h>
#include <pthread.h>
#include <malloc.h>
#define MAXT_ 8
#include <execinfo.h>
#include <link.h>
static uintptr_t exe_base, exe_end;
static uintptr_t traced[8]; static int ntraced;
#define NSITE 65536
struct site { uintptr_t k, a1, a2; uint64_t n[MAXT_]; };


typedef void *(*retain_t)(void *);
typedef void *(*retain_n_t)(void *, uint32_t);
typedef void (*release_t)(void *);
typedef void (*release_n_t)(void *, uint32_t);
typedef void *(*alloc_t)(const void *, size_t, size_t);
extern retain_t _swift_retain; extern retain_n_t _swift_retain_n;
extern release_t _swift_release; extern release_n_t _swift_release_n;
extern alloc_t _swift_allocObject;
extern _Bool _swift_enableSwizzlingOfAllocationAndRefCountingFunctions_forInstrumentsOnly;
extern void *__libc_malloc(size_t); extern void __libc_free(void *); extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t); extern void *__libc_memalign(size_t, size_t);

static retain_t o_retain; static retain_n_t o_retain_n; static release_t o_release; static release_n_t o_release_n;
static alloc_t o_alloc;
#define MAXT 8
#define NMETA 8192
struct meta { const void *m; uint64_t rr[MAXT]; uint64_t sw; uint64_t allocs[MAXT]; uint64_t xfree; uint64_t frees; size_t size; uint64_t shared; uint64_t sharedObjects; };
static struct meta metas[NMETA];
#define TBITS 23
#define TSIZE (1u << TBITS)
struct ent { uintptr_t a; uint32_t mi; uint16_t tid; uint16_t live; uint32_t mask; uint32_t n1, n2; uint16_t atid; };
struct rec { uint32_t mi; uintptr_t a; uint32_t n1, n2; };
static struct rec recs[4096]; static int nrecs; static double evg = 1;
static struct ent *tab;
static atomic_flag lk = ATOMIC_FLAG_INIT;
static _Atomic int nthreads;
static __thread int mytid = -1;
static __thread const void *allocating_meta;
static int active;
static int tid(void) { if (mytid < 0) { mytid = atomic_fetch_add(&nthreads, 1); if (mytid >= MAXT) mytid = MAXT - 1; } return mytid; }
static void lock(void) { while (atomic_flag_test_and_set_explicit(&lk, memory_order_acquire)) ; }
static void unlock(void) { atomic_flag_clear_explicit(&lk, memory_order_release); }
static uint32_t metaindex(const void *m, size_t size) {
  uint32_t h = (uint32_t)(((uintptr_t)m >> 3) * 2654435761u) % NMETA;
  for (;;) { if (metas[h].m == m) return h; if (!metas[h].m) { metas[h].m = m; metas[h].size = size; return h; } h = (h + 1) % NMETA; }
}
static struct ent *find(uintptr_t a, int insert) {
  uint32_t h = (uint32_t)((a >> 4) * 0x9E3779B97F4A7C15ull >> (64 - TBITS));
  for (;;) { struct ent *e = &tab[h]; if (e->a == a) return e; if (!e->a) { if (!insert) return 0; e->a = a; return e; } h = (h + 1) & (TSIZE - 1); }
}
// A size-class pseudo type for plain mallocs: (void*)(size bucket).
static void retire(struct ent *e) {
  if (e->live && (e->mask & 6) == 6) { struct meta *m = &metas[e->mi]; m->shared += e->n1 + e->n2; m->sharedObjects++;
    if (e->n1 > evg * 0.002 && e->n2 > evg * 0.002 && nrecs < 4096) recs[nrecs++] = (struct rec){e->mi, e->a, e->n1, e->n2}; }
  e->mask = 0; e->n1 = e->n2 = 0;
}
static const void *sizeclass(size_t n) { size_t b = 16; while (b < n) b <<= 1; return (const void *)b; }
static struct site *sites;
static __thread int intrace;
static void trace(int k, int t, int n) {
  void *fr[12]; intrace = 1; int c = backtrace(fr, 12); intrace = 0;
  uintptr_t a[2] = {0, 0}; int j = 0;
  for (int i = 1; i < c && j < 2; i++) { uintptr_t x = (uintptr_t)fr[i]; if (x >= exe_base && x < exe_end) a[j++] = x - exe_base; }
  lock();
  uint32_t h = (uint32_t)((a[0] * 31 + a[1] * 7 + k) * 0x9E3779B97F4A7C15ull >> 48);
  for (;;) { struct site *s = &sites[h]; if (s->k == (uintptr_t)k + 1 && s->a1 == a[0] && s->a2 == a[1]) { s->n[t] += n; break; }
    if (!s->k) { s->k = k + 1; s->a1 = a[0]; s->a2 = a[1]; s->n[t] += n; break; } h = (h + 1) % NSITE; }
  unlock();
}
static void touch(void *o, int n) {
  if (ntraced && !intrace && (uintptr_t)o >= 65536) { uintptr_t isa = *(uintptr_t *)o; for (int k = 0; k < ntraced; k++) if (isa == traced[k]) { trace(k, tid(), n); break; } }
  if ((uintptr_t)o < 65536 || !active) return;
  int t = tid(); lock();
  struct ent *e = find((uintptr_t)o, 1);
  if (e->live == 0 || e->live == 1) { e->live = 3; e->mi = metaindex((const void *)1, 0); e->tid = t; e->mask = 0; e->n1 = e->n2 = 0; }
  struct meta *m = &metas[e->mi]; m->rr[t] += n;
  if (e->tid != t) { m->sw++; e->tid = t; }
  e->mask |= 1u << t; if (t == 1) e->n1 += n; else if (t == 2) e->n2 += n;
  unlock();
}
// Not a heap object: a null or small value, or the bits of a small string that
// swift_bridgeObjectRetain masked and passed on (the real entry points return for those
// before the hooks see them; a PIE process has no object below 4 GiB).
#define BAD(o) ((uintptr_t)(o) < 0x100000000ull || (uintptr_t)(o) > 0x00007fffffffffffull)
static void *h_retain(void *o) { if (BAD(o)) return o; touch(o, 1); return o_retain(o); }
static void *h_retain_n(void *o, uint32_t n) { if (BAD(o)) return o; touch(o, n); return o_retain_n(o, n); }
static void h_release(void *o) { if (BAD(o)) return; touch(o, 1); o_release(o); }
static void h_release_n(void *o, uint32_t n) { if (BAD(o)) return; touch(o, n); o_release_n(o, n); }
static void *h_alloc(const void *md, size_t size, size_t align) {
  allocating_meta = md;
  void *o = o_alloc(md, size, align);
  allocating_meta = 0;
  if (active) { int t = tid(); lock(); struct ent *e = find((uintptr_t)o, 1); retire(e); e->mi = metaindex(md, size); e->tid = t; e->atid = t; e->live = 2; e->mask = 1u << t; e->n1 = e->n2 = 0; metas[e->mi].allocs[t]++; unlock(); }
  return o;
}
static void noted_alloc(void *p, size_t n) {
  if (!p || !active || allocating_meta) return;  // Swift objects are noted by h_alloc
  int t = tid(); lock(); struct ent *e = find((uintptr_t)p, 1); retire(e); e->mi = metaindex(sizeclass(n), n); e->tid = t; e->atid = t; e->live = 1; e->mask = 1u << t; e->n1 = e->n2 = 0; metas[e->mi].allocs[t]++; unlock();
}
static void noted_free(void *p) {
  if (!p || !active) return;
  int t = tid(); lock(); struct ent *e = find((uintptr_t)p, 0);
  if (e && e->live) {
    struct meta *m = &metas[e->mi]; m->frees++;
    // live==2: e->tid is the last toucher of the count, not the allocator; good enough: a
    // free on the thread that did not touch it last.
    if (e->atid != t) m->xfree++;
    retire(e); e->live = 0;
  }
  unlock();
}
void *malloc(size_t n) { void *p = __libc_malloc(n); noted_alloc(p, n); return p; }
void *calloc(size_t a, size_t b) { void *p = __libc_calloc(a, b); noted_alloc(p, a * b); return p; }
void *realloc(void *q, size_t n) { noted_free(q); void *p = __libc_realloc(q, n); noted_alloc(p, n); return p; }
void free(void *p) { noted_free(p); __libc_free(p); }
int posix_memalign(void **r, size_t al, size_t n) { void *p = __libc_memalign(al, n); if (!p) return 12; noted_alloc(p, n); *r = p; return 0; }
void *aligned_alloc(size_t al, size_t n) { void *p = __libc_memalign(al, n); noted_alloc(p, n); return p; }
void *memalign(size_t al, size_t n) { void *p = __libc_memalign(al, n); noted_alloc(p, n); return p; }

static int phdr(struct dl_phdr_info *info, size_t size, void *data) {
  if (exe_base) return 0;
  exe_base = info->dlpi_addr;
  for (int i = 0; i < info->dlpi_phnum; i++) { uintptr_t e = info->dlpi_addr + info->dlpi_phdr[i].p_vaddr + info->dlpi_phdr[i].p_memsz; if (info->dlpi_phdr[i].p_type == PT_LOAD && e > exe_end) exe_end = e; }
  return 0;
}
__attribute__((constructor)) static void init(void) {
  dl_iterate_phdr(phdr, 0);
  if (getenv("RCSHIM_EVENTS")) evg = atof(getenv("RCSHIM_EVENTS"));
  sites = __libc_calloc(NSITE, sizeof(struct site));
  if (getenv("RCSHIM_TRACE")) { char *s = getenv("RCSHIM_TRACE"); while (*s && ntraced < 8) { traced[ntraced++] = exe_base + strtoull(s, &s, 16); while (*s == ',') s++; } }
  tab = __libc_calloc(TSIZE, sizeof(struct ent));
  o_retain = _swift_retain; o_retain_n = _swift_retain_n; o_release = _swift_release; o_release_n = _swift_release_n; o_alloc = _swift_allocObject;
  _swift_retain = h_retain; _swift_retain_n = h_retain_n; _swift_release = h_release; _swift_release_n = h_release_n; _swift_allocObject = h_alloc;
  _swift_enableSwizzlingOfAllocationAndRefCountingFunctions_forInstrumentsOnly = 1;
  tid();  // the main thread is 0
  active = 1;
}
typedef struct { const char *data; uintptr_t length; } TypeNamePair;
__attribute__((destructor)) static void fini(void) {
  active = 0;
  FILE *g = getenv("RCSHIM_OBJECTS") ? fopen(getenv("RCSHIM_OBJECTS"), "w") : 0;
  double ev0 = getenv("RCSHIM_EVENTS") ? atof(getenv("RCSHIM_EVENTS")) : 1;
  TypeNamePair (*tn0)(const void *, _Bool) = dlsym(RTLD_DEFAULT, "swift_getTypeName");
  for (uint32_t i = 0; i < TSIZE; i++) {
    struct ent *e = &tab[i];
    if (!e->a || !e->live) continue;
    retire(e);
  }
  if (g) { for (int i = 0; i < nrecs; i++) { const void *md = metas[recs[i].mi].m; TypeNamePair p = ((uintptr_t)md > (1u<<30) && tn0) ? tn0(md, 1) : (TypeNamePair){"(not seen allocated: a static object)", 37};
    // A static object: its symbol, when it has one (the empty array's storage, a metadata).
    Dl_info info; const char *symbol = (uintptr_t)md <= (1u<<30) && dladdr((void *)recs[i].a, &info) && info.dli_sname ? info.dli_sname : "";
    fprintf(g, "%9.4f %9.4f %p %.*s %s\n", recs[i].n1 / ev0, recs[i].n2 / ev0, (void *)recs[i].a, (int)p.length, p.data, symbol); } fclose(g); }
  FILE *h = getenv("RCSHIM_SITES") ? fopen(getenv("RCSHIM_SITES"), "w") : 0;
  if (h) { for (int i = 0; i < NSITE; i++) if (sites[i].k) fprintf(h, "%d %.4f %.4f %lx %lx\n", (int)sites[i].k - 1, sites[i].n[1] / ev0, sites[i].n[2] / ev0, sites[i].a1, sites[i].a2); fclose(h); }
  double ev = getenv("RCSHIM_EVENTS") ? atof(getenv("RCSHIM_EVENTS")) : 1;
  TypeNamePair (*tn)(const void *, _Bool) = dlsym(RTLD_DEFAULT, "swift_getTypeName");
  FILE *f = getenv("RCSHIM_OUT") ? fopen(getenv("RCSHIM_OUT"), "w") : stderr;
  fprintf(f, "%10s %10s %10s %10s %10s %10s %10s %10s  %s   (per event; threads %d)\n", "shared-rr", "sharedobj", "switches", "xfrees", "rr-t1", "rr-t2", "allocs", "size", "type", nthreads);
  for (int i = 0; i < NMETA; i++) {
    struct meta *m = &metas[i]; if (!m->m) continue;
    uint64_t all = 0, al = 0; for (int t = 0; t < MAXT; t++) { all += m->rr[t]; al += m->allocs[t]; }
    if (m->sw + m->xfree < ev * 0.001 && all < ev * 0.05) continue;
    char name[200];
    if ((uintptr_t)m->m == 1) snprintf(name, sizeof name, "(objects not seen allocated: statics, set-up)");
    else if ((uintptr_t)m->m <= (1u << 30)) snprintf(name, sizeof name, "malloc <= %zu bytes", (size_t)(uintptr_t)m->m);
    else { TypeNamePair p = tn ? tn(m->m, 1) : (TypeNamePair){0, 0}; snprintf(name, sizeof name, "%.*s", (int)(p.data ? p.length : 1), p.data ? p.data : "?"); }
    fprintf(f, "%10.4f %10.4f %10.4f %10.4f %10.4f %10.4f %10.4f %10zu  %s\n", m->shared / ev, m->sharedObjects / ev, m->sw / ev, m->xfree / ev, m->rr[1] / ev, m->rr[2] / ev, al / ev, m->size, name);
  }
  if (f != stderr) fclose(f);
}
