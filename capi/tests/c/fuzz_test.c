/*
 * The C ABI fuzzer (issue 17): seeded random call sequences through every infinirt entry point,
 * on every device unirt finds, for a bounded time. Pools of live, freed, interior, NULL and
 * garbage device pointers and handles; sizes from 0 B to SIZE_MAX with an occasional
 * 32-256 MiB allocation (a seed keeps at most UNIRT_CAPI_FUZZ_BIG_MIB of big buffers live and frees any
 * bigger one at once, so the copies and memsets that follow cannot take the machine's memory); captures begun in every mode (and bogus ones) and ended at random;
 * streams destroyed with work queued. Every call must return a status of the enum (never a
 * crash, never a hang); after each seed everything is released and the device must still
 * copy bytes correctly. With the fake CUDA driver (UNIRT_CUDA_LIBRARY), a call the driver
 * records as misuse (one a real driver may crash on) fails the seed.
 *
 * Environment:
 *   UNIRT_CAPI_FUZZ_SECONDS  total time over all devices (default 3)
 *   UNIRT_CAPI_FUZZ_SEED     first seed, decimal or 0x hex (default: from the clock)
 *   UNIRT_CAPI_FUZZ_RUNS     at most this many seeds per device (default: unlimited)
 *   UNIRT_CAPI_FUZZ_STEPS    calls per seed (default 2000)
 *   UNIRT_CAPI_FUZZ_THREADS  threads sharing one pool per seed (default 1; with 1 a seed
 *                            replays exactly, with more the interleaving is the OS's)
 *   UNIRT_CAPI_FUZZ_BIG_MIB  MiB of buffers over 16 MiB a seed keeps live (default 512)
 *   UNIRT_CAPI_FUZZ_HUGE_LOG2  log2 of the smallest "huge" size tried (default 30, at most 59)
 * Each seed is printed (and flushed) before it runs, so the last line before a crash names it:
 *   UNIRT_CAPI_FUZZ_SEED=<seed> UNIRT_CAPI_FUZZ_RUNS=1 UNIRT_BACKENDS=<vendor> ./fuzz_test
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

/* Room for every object a seed makes (about 3 % of calls create one), so none is forgotten. */
#define POOL 1024
#define HOSTBUF (1u << 20)
#define SEED_TIMEOUT_S 120
/* Device buffers above BIG_MIN count against the big budget (UNIRT_CAPI_FUZZ_BIG_MIB, default
 * 512 MiB); over it they are freed at once. */
#define BIG_MIN ((size_t)16 << 20)
static size_t g_big_budget = (size_t)512 << 20;
/* The "huge" sizes start at 2^g_huge_log2 bytes (UNIRT_CAPI_FUZZ_HUGE_LOG2, default 30): 1 GiB
 * and up is granted by the CPU backend where the machine has it. Under memcheck, whose every
 * GiB mapped costs seconds, 40 keeps them to sizes that are refused before any mapping. */
static unsigned g_huge_log2 = 30;

typedef struct {
    void *p;
    size_t size;
} Buf;

/* One seed's objects, shared by its threads (a mutex guards the tables, never a call). */
typedef struct {
    pthread_mutex_t lock;
    Buf dev[POOL], freed_dev[POOL], host[POOL], freed_host[POOL];
    infinirtStream_t streams[POOL], dead_streams[POOL];
    infinirtEvent_t events[POOL], dead_events[POOL];
    infinirtGraph_t graphs[POOL], dead_graphs[POOL];
    infinirtGraphExec_t execs[POOL], dead_execs[POOL];
    infiniDevice_t type;
    int id;
    int single_thread; /* pinned buffers serve as copy sources only then */
    int bad_status; /* a status outside the enum was returned */
    size_t big_live; /* bytes of live device buffers above BIG_MIN */
} Pools;

typedef struct {
    uint64_t s;
} Rng;

static uint64_t next(Rng *r) {
    /* splitmix64 */
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [0, n); 0 when n is 0. */
static size_t below(Rng *r, uint64_t n) { return n ? (size_t)(next(r) % n) : 0; }

static volatile uint64_t g_current_seed = 0;

static void on_alarm(int sig) {
    (void)sig;
    char msg[128];
    int n = snprintf(msg, sizeof msg, "fuzz: seed 0x%" PRIx64 " did not finish in %d s (hang)\n",
                     (uint64_t)g_current_seed, SEED_TIMEOUT_S);
    if (n > 0) {
        ssize_t w = write(2, msg, (size_t)n);
        (void)w;
    }
    _exit(3);
}

static void status_ok(Pools *P, infiniStatus_t s, const char *what) {
    int v = (int)s;
    if ((v >= 0 && v <= 8) || (v >= 10 && v <= 13)) return;
    fprintf(stderr, "fuzz: %s returned %d, not an infiniStatus_t\n", what, v);
    P->bad_status = 1;
}

#define CALL(expr) status_ok(P, (expr), #expr)

/* A slot index of a pointer table, and table helpers (call with the lock held). */
static void *pick_slot(Rng *r, void **table) {
    unsigned start = below(r, POOL);
    for (unsigned i = 0; i < POOL; i++) {
        void *v = table[(start + i) % POOL];
        if (v) return v;
    }
    return NULL;
}

static void put(Rng *r, void **table, void *v) {
    unsigned start = below(r, POOL);
    for (unsigned i = 0; i < POOL; i++) {
        unsigned k = (start + i) % POOL;
        if (!table[k]) {
            table[k] = v;
            return;
        }
    }
    table[start] = v; /* full: forget the oldest there (a leak the seed's cleanup tolerates) */
}

static int take(void **table, void *v) {
    for (unsigned i = 0; i < POOL; i++) {
        if (table[i] == v) {
            table[i] = NULL;
            return 1;
        }
    }
    return 0;
}

/* A handle: live, destroyed, NULL or garbage. */
static void *pick_handle(Rng *r, Pools *P, void **live, void **dead) {
    void *v = NULL;
    pthread_mutex_lock(&P->lock);
    unsigned k = below(r, 20);
    if (k < 13) v = pick_slot(r, live);
    else if (k < 16) v = pick_slot(r, dead);
    else if (k < 18) v = NULL;
    else v = (void *)(uintptr_t)(next(r) | 1);
    pthread_mutex_unlock(&P->lock);
    return v;
}

static void buf_put(Rng *r, Buf *table, void *p, size_t size) {
    unsigned start = below(r, POOL);
    for (unsigned i = 0; i < POOL; i++) {
        Buf *b = &table[(start + i) % POOL];
        if (!b->p) {
            b->p = p;
            b->size = size;
            return;
        }
    }
    table[start].p = p;
    table[start].size = size;
}

static int buf_take(Buf *table, void *p, size_t *size) {
    for (unsigned i = 0; i < POOL; i++) {
        if (table[i].p == p) {
            if (size) *size = table[i].size;
            table[i].p = NULL;
            return 1;
        }
    }
    return 0;
}

static Buf buf_pick(Rng *r, Buf *table) {
    unsigned start = below(r, POOL);
    for (unsigned i = 0; i < POOL; i++) {
        Buf b = table[(start + i) % POOL];
        if (b.p) return b;
    }
    Buf none = {NULL, 0};
    return none;
}

/* Keeps a new device buffer in the pool, unless it is big and the seed's budget for big
 * buffers is spent: then it is freed at once (the allocation path was still exercised). */
static void keep_dev(Rng *r, Pools *P, void *p, size_t n) {
    int keep = 1;
    pthread_mutex_lock(&P->lock);
    if (n > BIG_MIN) {
        if (n <= g_big_budget && P->big_live + n <= g_big_budget)
            P->big_live += n;
        else
            keep = 0;
    }
    if (keep) buf_put(r, P->dev, p, n);
    pthread_mutex_unlock(&P->lock);
    if (!keep) CALL(infinirtFree(p));
}

/* A device pointer: live (start or interior), freed, NULL, garbage, or a host address. */
static void *pick_dev(Rng *r, Pools *P, const unsigned char *hostbuf) {
    pthread_mutex_lock(&P->lock);
    void *v;
    unsigned k = below(r, 20);
    if (k < 12) {
        Buf b = buf_pick(r, P->dev);
        v = b.p;
        if (v && b.size > 1 && below(r, 3) == 0) v = (unsigned char *)v + below(r, b.size);
    } else if (k < 15) {
        v = buf_pick(r, P->freed_dev).p;
    } else if (k < 17) {
        v = NULL;
    } else if (k < 19) {
        v = (void *)(uintptr_t)next(r);
    } else {
        v = (void *)hostbuf;
    }
    pthread_mutex_unlock(&P->lock);
    return v;
}

static size_t pick_size(Rng *r) {
    switch (below(r, 20)) {
    case 0: return 0;
    case 1: return SIZE_MAX;
    case 2: return (size_t)1 << (g_huge_log2 + below(r, 60 - g_huge_log2));
    case 3: return (size_t)1 << 20;
    case 4: case 5: case 6: return below(r, 1u << 16);
    default: return below(r, 4096) + 1;
    }
}

/* A size for a call whose host side is our own buffer: the host side never overflows (that
 * would be this program's bug, not unirt's), the device side may. */
static size_t host_bounded(Rng *r) {
    size_t n = pick_size(r);
    return n > HOSTBUF ? below(r, HOSTBUF) : n;
}

typedef struct {
    Pools *P;
    uint64_t seed;
    unsigned steps;
    unsigned char *hostbuf;
} Worker;

static void one_call(Rng *r, Pools *P, unsigned char *hostbuf) {
    switch (below(r, 34)) {
    case 0: case 1: { /* malloc, now and then a big one */
        size_t n = below(r, 50) == 0 ? ((size_t)32 << 20) + below(r, 224u << 20) : pick_size(r);
        void *p = NULL;
        void **out = below(r, 30) == 0 ? NULL : &p;
        CALL(infinirtMalloc(out, n));
        if (p) keep_dev(r, P, p, n);
        break;
    }
    case 2: { /* malloc_async */
        void *p = NULL;
        size_t n = pick_size(r);
        CALL(infinirtMallocAsync(&p, n, pick_handle(r, P, P->streams, P->dead_streams)));
        if (p) keep_dev(r, P, p, n);
        break;
    }
    case 3: { /* malloc_host */
        void *p = NULL;
        size_t n = host_bounded(r);
        CALL(infinirtMallocHost(&p, n));
        if (p) {
            pthread_mutex_lock(&P->lock);
            buf_put(r, P->host, p, n);
            pthread_mutex_unlock(&P->lock);
        }
        break;
    }
    case 4: case 5: { /* free / free_async: whatever pointer */
        void *p = pick_dev(r, P, hostbuf);
        pthread_mutex_lock(&P->lock);
        size_t n = 0;
        int was_live = buf_take(P->dev, p, &n);
        if (was_live && n > BIG_MIN) P->big_live -= n;
        pthread_mutex_unlock(&P->lock);
        infiniStatus_t st = below(r, 2) ? infinirtFree(p)
                                        : infinirtFreeAsync(p, pick_handle(r, P, P->streams,
                                                                              P->dead_streams));
        CALL(st);
        if (was_live) {
            /* A refused free (a dead stream, a capture) leaves the buffer live: keep it so
             * the cleanup frees it. */
            pthread_mutex_lock(&P->lock);
            if (st == INFINI_STATUS_SUCCESS) {
                buf_put(r, P->freed_dev, p, n);
            } else {
                buf_put(r, P->dev, p, n);
                if (n > BIG_MIN) P->big_live += n;
            }
            pthread_mutex_unlock(&P->lock);
        }
        break;
    }
    case 6: { /* free_host: live, freed or garbage */
        pthread_mutex_lock(&P->lock);
        unsigned k = below(r, 4);
        Buf b = k < 2 ? buf_pick(r, P->host) : k == 2 ? buf_pick(r, P->freed_host) : (Buf){0, 0};
        if (k == 3) b.p = (void *)(uintptr_t)next(r);
        int was_live = buf_take(P->host, b.p, NULL);
        pthread_mutex_unlock(&P->lock);
        infiniStatus_t st = infinirtFreeHost(b.p);
        CALL(st);
        if (was_live) {
            pthread_mutex_lock(&P->lock);
            buf_put(r, st == INFINI_STATUS_SUCCESS ? P->freed_host : P->host, b.p, b.size);
            pthread_mutex_unlock(&P->lock);
        }
        break;
    }
    case 7: case 8: case 9: { /* synchronous copies; the host side is always our buffer */
        unsigned kind = below(r, 5); /* 4: a bogus kind */
        void *d = pick_dev(r, P, hostbuf);
        size_t n = kind == INFINIRT_MEMCPY_D2D ? pick_size(r) : host_bounded(r);
        if (kind == INFINIRT_MEMCPY_H2D)
            CALL(infinirtMemcpy(d, hostbuf, n, INFINIRT_MEMCPY_H2D));
        else if (kind == INFINIRT_MEMCPY_D2H)
            CALL(infinirtMemcpy(hostbuf, d, n, INFINIRT_MEMCPY_D2H));
        else if (kind == INFINIRT_MEMCPY_D2D)
            CALL(infinirtMemcpy(d, pick_dev(r, P, hostbuf), n, INFINIRT_MEMCPY_D2D));
        else if (kind == INFINIRT_MEMCPY_H2H)
            CALL(infinirtMemcpy(hostbuf, hostbuf + HOSTBUF / 2, n / 2, INFINIRT_MEMCPY_H2H));
        else
            CALL(infinirtMemcpy(d, hostbuf, n, (infinirtMemcpyKind_t)(7 + below(r, 100))));
        break;
    }
    case 10: case 11: case 12: { /* async copies, the host side our buffer or a live pinned one */
        unsigned kind = below(r, 4);
        void *d = pick_dev(r, P, hostbuf);
        infinirtStream_t s = pick_handle(r, P, P->streams, P->dead_streams);
        unsigned char *h = hostbuf;
        size_t n = host_bounded(r);
        if (P->single_thread && below(r, 2)) {
            /* One thread only: another could free a pinned buffer under our copy, which is
             * the caller's use-after-free, not a status unirt can give. */
            pthread_mutex_lock(&P->lock);
            Buf b = buf_pick(r, P->host);
            pthread_mutex_unlock(&P->lock);
            if (b.p) {
                h = b.p;
                n = b.size ? below(r, (uint64_t)b.size + 1) : 0;
            }
        }
        if (below(r, 8) == 0 && (kind == INFINIRT_MEMCPY_H2D || kind == INFINIRT_MEMCPY_D2H)) {
            /* A malloc'd (pageable) buffer freed right after the call, as CUDA allows: on a
             * stream of our own (never captured: a capture would keep the address), made busy
             * with a memset first. */
            infinirtStream_t mine = NULL;
            unsigned char *tmp = malloc(n ? n : 1);
            if (tmp && infinirtStreamCreate(&mine) == INFINI_STATUS_SUCCESS) {
                memset(tmp, (int)next(r), n ? n : 1);
                CALL(infinirtMemsetAsync(d, (int)next(r), pick_size(r), mine));
                if (kind == INFINIRT_MEMCPY_H2D)
                    CALL(infinirtMemcpyAsync(d, tmp, n, INFINIRT_MEMCPY_H2D, mine));
                else
                    CALL(infinirtMemcpyAsync(tmp, d, n, INFINIRT_MEMCPY_D2H, mine));
                free(tmp);
                tmp = NULL;
                CALL(infinirtStreamDestroy(mine));
            }
            free(tmp);
        } else if (kind == INFINIRT_MEMCPY_H2D)
            CALL(infinirtMemcpyAsync(d, h, n, INFINIRT_MEMCPY_H2D, s));
        else if (kind == INFINIRT_MEMCPY_D2H)
            CALL(infinirtMemcpyAsync(h, d, n, INFINIRT_MEMCPY_D2H, s));
        else
            CALL(infinirtMemcpyAsync(d, pick_dev(r, P, hostbuf), pick_size(r),
                                     INFINIRT_MEMCPY_D2D, s));
        break;
    }
    case 13: case 14: { /* memset, sync or async */
        void *d = pick_dev(r, P, hostbuf);
        size_t n = pick_size(r);
        int v = (int)next(r);
        if (below(r, 2))
            CALL(infinirtMemset(d, v, n));
        else
            CALL(infinirtMemsetAsync(d, v, n, pick_handle(r, P, P->streams, P->dead_streams)));
        break;
    }
    case 15: { /* stream create */
        infinirtStream_t s = NULL;
        CALL(infinirtStreamCreate(below(r, 30) ? &s : NULL));
        if (s) {
            pthread_mutex_lock(&P->lock);
            put(r, (void **)P->streams, s);
            pthread_mutex_unlock(&P->lock);
        }
        break;
    }
    case 16: { /* stream destroy, often with work queued */
        infinirtStream_t s = pick_handle(r, P, P->streams, P->dead_streams);
        pthread_mutex_lock(&P->lock);
        int was_live = s && take((void **)P->streams, s);
        pthread_mutex_unlock(&P->lock);
        infiniStatus_t st = infinirtStreamDestroy(s);
        CALL(st);
        pthread_mutex_lock(&P->lock);
        /* A capturing stream refuses to be destroyed: keep it live. */
        put(r, was_live && st != INFINI_STATUS_SUCCESS ? (void **)P->streams
                                                       : (void **)P->dead_streams, s);
        pthread_mutex_unlock(&P->lock);
        break;
    }
    case 17: CALL(infinirtStreamSynchronize(pick_handle(r, P, P->streams, P->dead_streams))); break;
    case 18:
        CALL(infinirtStreamWaitEvent(pick_handle(r, P, P->streams, P->dead_streams),
                                     pick_handle(r, P, P->events, P->dead_events)));
        break;
    case 19: { /* event create, with valid and invalid flags */
        infinirtEvent_t e = NULL;
        if (below(r, 2))
            CALL(infinirtEventCreate(&e));
        else
            CALL(infinirtEventCreateWithFlags(below(r, 30) ? &e : NULL,
                                              below(r, 4) ? below(r, 4) : (uint32_t)next(r)));
        if (e) {
            pthread_mutex_lock(&P->lock);
            put(r, (void **)P->events, e);
            pthread_mutex_unlock(&P->lock);
        }
        break;
    }
    case 20:
        CALL(infinirtEventRecord(pick_handle(r, P, P->events, P->dead_events),
                                 pick_handle(r, P, P->streams, P->dead_streams)));
        break;
    case 21: {
        infinirtEventStatus_t st;
        CALL(infinirtEventQuery(pick_handle(r, P, P->events, P->dead_events),
                                below(r, 30) ? &st : NULL));
        break;
    }
    case 22: CALL(infinirtEventSynchronize(pick_handle(r, P, P->events, P->dead_events))); break;
    case 23: {
        float ms;
        CALL(infinirtEventElapsedTime(below(r, 30) ? &ms : NULL,
                                      pick_handle(r, P, P->events, P->dead_events),
                                      pick_handle(r, P, P->events, P->dead_events)));
        break;
    }
    case 24: {
        infinirtEvent_t e = pick_handle(r, P, P->events, P->dead_events);
        pthread_mutex_lock(&P->lock);
        int was_live = e && take((void **)P->events, e);
        pthread_mutex_unlock(&P->lock);
        infiniStatus_t st = infinirtEventDestroy(e);
        CALL(st);
        if (was_live) {
            pthread_mutex_lock(&P->lock);
            put(r, st == INFINI_STATUS_SUCCESS ? (void **)P->dead_events : (void **)P->events, e);
            pthread_mutex_unlock(&P->lock);
        }
        break;
    }
    case 25: case 26: { /* begin capture: every mode, and bogus ones */
        unsigned mode = below(r, 8) ? below(r, 3) : 3 + below(r, 1000);
        CALL(infinirtStreamBeginCapture(pick_handle(r, P, P->streams, P->dead_streams),
                                        (infinirtStreamCaptureMode_t)mode));
        break;
    }
    case 27: case 28: { /* end capture */
        infinirtGraph_t g = NULL;
        CALL(infinirtStreamEndCapture(pick_handle(r, P, P->streams, P->dead_streams),
                                      below(r, 30) ? &g : NULL));
        if (g) {
            pthread_mutex_lock(&P->lock);
            put(r, (void **)P->graphs, g);
            pthread_mutex_unlock(&P->lock);
        }
        break;
    }
    case 29: { /* instantiate, with and without a log buffer */
        infinirtGraphExec_t x = NULL;
        infinirtGraphNode_t node = NULL;
        char log[64];
        int with_log = below(r, 2);
        CALL(infinirtGraphInstantiate(below(r, 30) ? &x : NULL,
                                      pick_handle(r, P, P->graphs, P->dead_graphs),
                                      with_log ? &node : NULL, with_log ? log : NULL,
                                      with_log ? sizeof log : 0));
        if (x) {
            pthread_mutex_lock(&P->lock);
            put(r, (void **)P->execs, x);
            pthread_mutex_unlock(&P->lock);
        }
        break;
    }
    case 30:
        CALL(infinirtGraphLaunch(pick_handle(r, P, P->execs, P->dead_execs),
                                 pick_handle(r, P, P->streams, P->dead_streams)));
        break;
    case 31: { /* graph or exec destroy */
        int exec = below(r, 2);
        void **live = exec ? (void **)P->execs : (void **)P->graphs;
        void **dead = exec ? (void **)P->dead_execs : (void **)P->dead_graphs;
        void *h = pick_handle(r, P, live, dead);
        pthread_mutex_lock(&P->lock);
        int was_live = h && take(live, h);
        pthread_mutex_unlock(&P->lock);
        infiniStatus_t st = exec ? infinirtGraphExecDestroy(h) : infinirtGraphDestroy(h);
        CALL(st);
        if (was_live) {
            pthread_mutex_lock(&P->lock);
            put(r, st == INFINI_STATUS_SUCCESS ? dead : live, h);
            pthread_mutex_unlock(&P->lock);
        }
        break;
    }
    case 32: CALL(infinirtDeviceSynchronize()); break;
    default: { /* device queries and selection, then back to the fuzzed device */
        size_t free_b = 0, total_b = 0;
        int count = 0;
        infiniDevice_t t;
        int id;
        switch (below(r, 4)) {
        case 0: CALL(infinirtGetMemInfo(P->type, P->id, &free_b, &total_b)); break;
        case 1: CALL(infinirtGetDeviceCount((infiniDevice_t)below(r, 12), &count)); break;
        case 2: CALL(infinirtGetDevice(&t, &id)); break;
        default:
            CALL(infinirtSetDevice((infiniDevice_t)below(r, 12), (int)below(r, 4) - 1));
            CALL(infinirtSetDevice(P->type, P->id));
        }
    }
    }
}

/* Ends the captures this thread may end (statuses unchecked) and destroys their graphs. */
static void end_captures(Pools *P) {
    infinirtStream_t streams[POOL + 1];
    pthread_mutex_lock(&P->lock);
    memcpy(streams, P->streams, sizeof P->streams);
    pthread_mutex_unlock(&P->lock);
    streams[POOL] = NULL; /* the default stream */
    for (unsigned i = 0; i <= POOL; i++) {
        if (!streams[i] && i < POOL) continue;
        infinirtGraph_t g = NULL;
        if (infinirtStreamEndCapture(streams[i], &g) == INFINI_STATUS_SUCCESS && g)
            infinirtGraphDestroy(g);
    }
}

static void *worker(void *arg) {
    Worker *w = arg;
    Rng r = {w->seed};
    infinirtSetDevice(w->P->type, w->P->id);
    for (unsigned i = 0; i < w->steps; i++) one_call(&r, w->P, w->hostbuf);
    /* A Global or ThreadLocal capture is ended by the thread that began it. */
    end_captures(w->P);
    return NULL;
}

/* Releases everything a seed left; statuses are not checked (objects may be half-dead). */
static void cleanup(Pools *P) {
    end_captures(P);
    for (unsigned i = 0; i < POOL; i++) {
        if (P->execs[i]) infinirtGraphExecDestroy(P->execs[i]);
        if (P->graphs[i]) infinirtGraphDestroy(P->graphs[i]);
    }
    for (unsigned i = 0; i < POOL; i++) {
        if (P->events[i]) infinirtEventDestroy(P->events[i]);
        if (P->dev[i].p) infinirtFree(P->dev[i].p);
        if (P->host[i].p) infinirtFreeHost(P->host[i].p);
    }
    for (unsigned i = 0; i < POOL; i++)
        if (P->streams[i]) infinirtStreamDestroy(P->streams[i]);
}

/* After a seed the device must still work: a fresh buffer round-trips a pattern and takes a
 * memset. Says which step failed, with unirt's message. */
static int device_works(void) {
    unsigned char in[4096], out[4096];
    fill_pattern(in, sizeof in, 11);
    memset(out, 0, sizeof out);
    void *d = NULL;
    const char *step = "infinirtDeviceSynchronize";
    infiniStatus_t st = infinirtDeviceSynchronize();
    if (st == INFINI_STATUS_SUCCESS) {
        step = "infinirtMalloc";
        st = infinirtMalloc(&d, sizeof in);
    }
    if (st == INFINI_STATUS_SUCCESS) {
        step = "infinirtMemcpy H2D";
        st = infinirtMemcpy(d, in, sizeof in, INFINIRT_MEMCPY_H2D);
    }
    if (st == INFINI_STATUS_SUCCESS) {
        step = "infinirtMemcpy D2H";
        st = infinirtMemcpy(out, d, sizeof out, INFINIRT_MEMCPY_D2H);
    }
    if (st == INFINI_STATUS_SUCCESS && memcmp(in, out, sizeof in) != 0) {
        step = "the round trip (bytes differ)";
        st = INFINI_STATUS_INTERNAL_ERROR;
    }
    if (st == INFINI_STATUS_SUCCESS) {
        step = "infinirtMemset";
        st = infinirtMemset(d, 0x5a, sizeof in);
    }
    if (st == INFINI_STATUS_SUCCESS) {
        step = "infinirtMemcpy D2H after memset";
        st = infinirtMemcpy(out, d, sizeof out, INFINIRT_MEMCPY_D2H);
    }
    if (st == INFINI_STATUS_SUCCESS && !all_bytes(out, sizeof out, 0x5a)) {
        step = "the memset (bytes differ)";
        st = INFINI_STATUS_INTERNAL_ERROR;
    }
    if (st == INFINI_STATUS_SUCCESS) {
        step = "infinirtFree";
        st = infinirtFree(d);
    }
    if (st == INFINI_STATUS_SUCCESS) return 1;
    char msg[512] = {0};
    unirtGetLastErrorMessage(msg, sizeof msg);
    fprintf(stderr, "fuzz: after the seed, %s gave %d (%s)\n", step, (int)st, msg);
    return 0;
}

static uint64_t env_u64(const char *name, uint64_t dflt) {
    const char *v = getenv(name);
    return v && *v ? strtoull(v, NULL, 0) : dflt;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static uint64_t (*g_fake_misuses)(void) = NULL;
static size_t (*g_fake_misuse_log)(char *, size_t) = NULL;

/* The fake CUDA driver's misuse counter, when UNIRT_CUDA_LIBRARY names it. */
static void find_fake_driver(void) {
    const char *path = getenv("UNIRT_CUDA_LIBRARY");
    if (!path || !*path) return;
    void *h = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    if (!h) h = dlopen(path, RTLD_NOW);
    if (!h) return;
    *(void **)&g_fake_misuses = dlsym(h, "unirt_fakecuda_misuses");
    *(void **)&g_fake_misuse_log = dlsym(h, "unirt_fakecuda_misuse_log");
}

static unsigned char g_hostbufs[8][HOSTBUF];

int main(void) {
    OK(infinirtInit());
    double budget = (double)env_u64("UNIRT_CAPI_FUZZ_SECONDS", 3);
    uint64_t seed = env_u64("UNIRT_CAPI_FUZZ_SEED", (uint64_t)time(NULL) * 0x9e3779b97f4a7c15ull);
    uint64_t runs = env_u64("UNIRT_CAPI_FUZZ_RUNS", UINT64_MAX);
    unsigned steps = (unsigned)env_u64("UNIRT_CAPI_FUZZ_STEPS", 2000);
    unsigned threads = (unsigned)env_u64("UNIRT_CAPI_FUZZ_THREADS", 1);
    if (threads < 1) threads = 1;
    if (threads > 8) threads = 8;
    g_big_budget = (size_t)env_u64("UNIRT_CAPI_FUZZ_BIG_MIB", 512) << 20;
    g_huge_log2 = (unsigned)env_u64("UNIRT_CAPI_FUZZ_HUGE_LOG2", 30);
    if (g_huge_log2 > 59) g_huge_log2 = 59;
    find_fake_driver();
    signal(SIGALRM, on_alarm);

    infiniDevice_t types[] = {INFINI_DEVICE_CPU, INFINI_DEVICE_NVIDIA, INFINI_DEVICE_UNIRT_WGPU};
    struct {
        infiniDevice_t type;
        int id;
    } devices[64];
    int ndev = 0;
    for (unsigned t = 0; t < sizeof types / sizeof types[0]; t++) {
        int n = 0;
        if (infinirtGetDeviceCount(types[t], &n) != INFINI_STATUS_SUCCESS) continue;
        for (int i = 0; i < n && ndev < 64; i++) {
            devices[ndev].type = types[t];
            devices[ndev].id = i;
            ndev++;
        }
    }
    printf("fuzz: %d device(s), %.0f s, first seed 0x%" PRIx64 ", %u steps, %u thread(s)\n", ndev,
           budget, seed, steps, threads);
    unsigned long total_seeds = 0, failed = 0;
    for (int di = 0; di < ndev; di++) {
        double until = now_s() + budget / ndev;
        for (uint64_t run = 0; run < runs && (run == 0 || now_s() < until); run++, seed++) {
            static Pools P;
            memset(&P, 0, sizeof P);
            pthread_mutex_init(&P.lock, NULL);
            P.type = devices[di].type;
            P.id = devices[di].id;
            P.single_thread = threads == 1;
            OK(infinirtSetDevice(P.type, P.id));
            printf("fuzz: device %d:%d seed 0x%" PRIx64 "\n", (int)P.type, P.id, seed);
            fflush(stdout);
            g_current_seed = seed;
            alarm(SEED_TIMEOUT_S);
            uint64_t misuses_before = g_fake_misuses ? g_fake_misuses() : 0;
            Worker w[8];
            pthread_t tid[8];
            for (unsigned t = 0; t < threads; t++) {
                w[t].P = &P;
                w[t].seed = seed + ((uint64_t)t << 48);
                w[t].steps = steps;
                w[t].hostbuf = g_hostbufs[t];
                if (threads == 1)
                    worker(&w[t]);
                else
                    pthread_create(&tid[t], NULL, worker, &w[t]);
            }
            if (threads > 1)
                for (unsigned t = 0; t < threads; t++) pthread_join(tid[t], NULL);
            cleanup(&P);
            int works = device_works();
            alarm(0);
            total_seeds++;
            int misused = g_fake_misuses && g_fake_misuses() > misuses_before;
            if (P.bad_status || !works || misused) {
                failed++;
                fprintf(stderr, "fuzz: FAILED device %d:%d seed 0x%" PRIx64 ":%s%s%s\n",
                        (int)P.type, P.id, seed, P.bad_status ? " a status outside the enum" : "",
                        works ? "" : " the device no longer works",
                        misused ? " the fake driver recorded misuse" : "");
                if (misused && g_fake_misuse_log) {
                    char log[2048] = {0};
                    g_fake_misuse_log(log, sizeof log);
                    fprintf(stderr, "%s\n", log);
                }
            }
            pthread_mutex_destroy(&P.lock);
        }
    }
    printf("fuzz: %lu seeds, %lu failed\n", total_seeds, failed);
    return finish("fuzz_test") || failed ? 1 : 0;
}
