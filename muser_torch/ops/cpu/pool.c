/* The thread pool behind parallel_for (declared in kernels.h).
 *
 * Work is split into chunks that the caller and up to want-1 helpers claim
 * from one atomic word. The caller never waits for a helper that has not
 * claimed anything: on a busy machine a sleeping helper may get a CPU only
 * after a scheduler slice (milliseconds), and a fork-join that waits for it
 * (OpenMP's barrier) turns a 0.2 ms matvec into 10 ms. The caller waits only
 * for chunks already claimed.
 *
 * The claim word holds generation (16 bits) | want (8) | total (20) | next (20),
 * so a helper decides from one atomic load whether chunk `next` exists for the
 * job it is looking at; the job's other fields are read only after a
 * successful claim (the caller cannot post a new job before every claimed
 * chunk is done, so they are still this job's).
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

#include "kernels.h"

#define POOL_MAX 64
/* How long a helper looks for the next job before it sleeps. The calls of a
 * decode step come a few µs apart, with Python between them (a QLinear call,
 * a layer's block): a helper that slept meanwhile wakes too late to help
 * (measured: 1000 pauses alone, about 5 µs on the AMD EPYC host, made 2
 * threads slower than 1 on QLinear calls 10 µs apart, while a tight loop of
 * the same calls ran 1.5-1.9x faster on 2). After SPIN_PAUSES pauses it
 * yields between looks, so on a busy machine the spin gives its CPU to the
 * threads that want it (a pause-only spin of 200 µs made the same calls
 * slower still there: it took the CPU from the caller's own Python). */
#define SPIN_NS 200000
#define SPIN_PAUSES 1000  /* pauses before the spin yields between looks */
#define CLAIM(gen, want, total, next)                                                     \
    (((uint64_t)(gen) << 48) | ((uint64_t)(want) << 40) | ((uint64_t)(total) << 20) | (uint64_t)(next))
#define C_GEN(c) ((unsigned)((c) >> 48))
#define C_WANT(c) ((int)(((c) >> 40) & 0xFF))
#define C_TOTAL(c) ((int64_t)(((c) >> 20) & 0xFFFFF))
#define C_NEXT(c) ((int64_t)((c) & 0xFFFFF))

static struct {
    pthread_mutex_t mu;          /* guards posted and the helpers' sleep */
    pthread_cond_t cv;
    pthread_mutex_t job;         /* one job at a time; a second caller runs inline */
    unsigned posted;             /* generation of the last job posted */
    int helpers;                 /* started */
    pid_t pid;                   /* a forked child starts a fresh pool */
    _Atomic uint64_t claim;
    _Atomic int64_t done;
    task_fn fn;
    const void *ctx;
    int64_t n, per;              /* items, items per chunk */
} pool = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER,
            .job = PTHREAD_MUTEX_INITIALIZER};

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Claim and run chunks of generation `gen` as participant `who` (0 = caller). */
static void run_chunks(unsigned gen, int who) {
    uint64_t c = atomic_load_explicit(&pool.claim, memory_order_acquire);
    for (;;) {
        if (C_GEN(c) != (gen & 0xFFFF) || who >= C_WANT(c) || C_NEXT(c) >= C_TOTAL(c)) return;
        if (!atomic_compare_exchange_weak_explicit(&pool.claim, &c, c + 1, memory_order_acq_rel,
                                                   memory_order_acquire))
            continue;
        const int64_t i = C_NEXT(c), b = i * pool.per;
        const int64_t e = b + pool.per < pool.n ? b + pool.per : pool.n;
        pool.fn(pool.ctx, b, e);
        atomic_fetch_add_explicit(&pool.done, 1, memory_order_release);
        c = atomic_load_explicit(&pool.claim, memory_order_acquire);
    }
}

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void *helper_main(void *arg) {
    const int who = (int)(intptr_t)arg;
    unsigned seen = 0;
    for (;;) {
        /* spin for SPIN_NS (the next job of a decode step comes within it),
         * then sleep until a new job */
        const int64_t until = now_ns() + SPIN_NS;
        for (int spin = 1;; spin++) {
            if (C_GEN(atomic_load_explicit(&pool.claim, memory_order_acquire)) != (seen & 0xFFFF))
                break;
            if (spin < SPIN_PAUSES) {
                cpu_relax();
            } else {              /* give the CPU to any thread that wants it, ours included */
                sched_yield();
                if (now_ns() > until) break;
            }
        }
        pthread_mutex_lock(&pool.mu);
        while (pool.posted == seen) pthread_cond_wait(&pool.cv, &pool.mu);
        seen = pool.posted;
        pthread_mutex_unlock(&pool.mu);
        run_chunks(seen, who);
    }
    return 0;
}

void parallel_for(task_fn fn, const void *ctx, int64_t n, int nthreads) {
    if (nthreads > POOL_MAX) nthreads = POOL_MAX;
    if (nthreads <= 1 || n <= 1 || pthread_mutex_trylock(&pool.job) != 0) {
        fn(ctx, 0, n);
        return;
    }
    if (pool.pid != getpid()) {                  /* first use, or a forked child */
        if (pool.pid) {                          /* the parent's helpers did not come along */
            pthread_mutex_init(&pool.mu, 0);
            pthread_cond_init(&pool.cv, 0);
        }
        pool.pid = getpid();
        pool.helpers = 0;
    }
    while (pool.helpers < nthreads - 1) {
        pthread_t t;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        int rc = pthread_create(&t, &attr, helper_main, (void *)(intptr_t)(pool.helpers + 1));
        pthread_attr_destroy(&attr);
        if (rc) break;
        pool.helpers++;
    }
    const int want = pool.helpers + 1 < nthreads ? pool.helpers + 1 : nthreads;
    int64_t chunks = 8 * (int64_t)want;          /* small chunks: a late helper still helps */
    if (chunks > n) chunks = n;
    pool.fn = fn;
    pool.ctx = ctx;
    pool.n = n;
    pool.per = (n + chunks - 1) / chunks;
    chunks = (n + pool.per - 1) / pool.per;
    atomic_store_explicit(&pool.done, 0, memory_order_relaxed);
    pthread_mutex_lock(&pool.mu);
    const unsigned gen = ++pool.posted;
    atomic_store_explicit(&pool.claim, CLAIM(gen & 0xFFFF, want, chunks, 0), memory_order_release);
    pthread_cond_broadcast(&pool.cv);
    pthread_mutex_unlock(&pool.mu);
    run_chunks(gen, 0);
    for (int spin = 0; atomic_load_explicit(&pool.done, memory_order_acquire) < chunks; spin++) {
        if (spin < 4096) cpu_relax();
        else sched_yield();
    }
    pthread_mutex_unlock(&pool.job);
}
