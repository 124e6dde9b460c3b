/* fcoll's compiled shared-memory step (fcoll.backends._shmcore): one call of all_reduce,
 * reduce_scatter, all_gather, broadcast or scan through a group's segment, in C.
 *
 * The segment is an MPI-3 shared window that mpi4py allocated (fcoll/backends/segment.py);
 * it reaches this module as a writable buffer. Its layout, from the start:
 *
 *   control area: per rank PER_RANK = 192 bytes = three 64-byte lines, each written by that
 *                 rank alone except where said:
 *                   bytes   0..63   the step Line of even steps,
 *                   bytes  64..127  the step Line of odd steps: step (atomic), fingerprint,
 *                                   element count, then up to INLINE bytes of the step's data
 *                                   (a small message rides in the line that carries its flag:
 *                                   one cache line crosses cores per peer),
 *                   bytes 128..191  the Wake line: the futex word (the low 32 bits of the
 *                                   rank's last step) and the count of waiters asleep on it
 *                                   (which the waiters, any rank, add to and subtract from);
 *                 rank 0 zeroes it all when it allocates the window (segment.py), a valid start;
 *   slots:        two sets (by parity) of n slots of `capacity` bytes, slot j written by rank j.
 *
 * A step: copy this rank's data in (line or slot), store fingerprint and count, then the step
 * number with release ordering, then the wake word (waking the rank's sleepers, if any); wait
 * until every peer's line of this parity shows the step (acquire ordering), compare every
 * rank's fingerprint and count, fold or copy out. A rank can write parity p again only two
 * steps later, after every rank arrived at the step between, that is after every rank
 * finished reading step p: one flag per rank per step, no barrier.
 *
 * The GIL: each call parses its arguments and makes its result with the GIL, then releases it
 * for all its steps (copy in, wait, fold or copy out: pure C on memory the call holds) and
 * takes it back to return, or to raise Timeout or Mismatch. Only a long wait takes it in
 * between, briefly (below).
 *
 * Waiting (wait_peers), in three phases, each polling every peer's flag:
 *   spin   SPIN_SECONDS (20 us; 1 us with more ranks than cores, where the peer may need this
 *          core) with a pause between polls: what a step takes when the peers are on time;
 *   yield  until YIELD_SECONDS (200 us) after the wait began, sched_yield between polls: the
 *          usual skew between ranks (Python's work between calls, a page fault) ends here,
 *          where waking a sleeper would cost the arriving rank a system call and the waiter
 *          tens of microseconds; a rank waiting for a late peer burns at most this much CPU;
 *   sleep  on the futex word of the first peer that has not arrived (Linux; FUTEX_WAIT
 *          without FUTEX_PRIVATE_FLAG: the window is mapped by several processes), at most
 *          SERVE_SECONDS (10 ms) or until the deadline at a time; after each SERVE_SECONDS
 *          asleep (or a signal), take the GIL to run Python's signal handlers and ``serve``
 *          (flight-record requests, a Python callable). Elsewhere: nanosleep, the pause
 *          doubling from 10 us to 1 ms.
 * The arriving rank wakes only when someone sleeps: it stores its step (release), the wake
 * word (seq_cst), then loads the sleepers count (seq_cst) and calls FUTEX_WAKE only when it is
 * not 0. A waiter reads the word, checks the peer's step, adds itself to the sleepers
 * (seq_cst), reads the word again (seq_cst) and sleeps only while it is unchanged (the kernel
 * checks it once more, atomically with queueing the waiter). Both sides store, then load, in
 * one sequentially consistent order: either the arriver sees the sleeper (and wakes it) or the
 * sleeper sees the new word (and does not sleep); no wake is lost. A peer whose flag was not
 * up has its word at step - 1, and only its arrival at step changes it.
 * A deadline (CLOCK_MONOTONIC seconds, as Python's time.monotonic) raises Timeout once it has
 * passed (a sleep ends at the deadline).
 *
 * Folds run in fcoll's canonical order (fcoll/backends/tree/order.py): a balanced tree over
 * the ranks, and its scan and exscan orders, which Python hands each Core as programs of
 * binary ops (dst = a op b over rows, scratch buffers and the result; Core.programs). Each
 * step runs its rank's program block by block (BLOCK elements, in L1), so results are
 * bit-identical to order.execute with numpy's ufuncs and to the MPI path's schedules:
 * integer sum and product wrap (unsigned arithmetic), float min/max propagate NaN as
 * np.minimum/np.maximum, float16 and bfloat16 accumulate in float32 along the tree and round
 * back once as numpy and ml_dtypes do, avg divides the float result by n (in float32 for the
 * halves, before they round), premul_sum scales each rank's data at copy-in. No -ffast-math:
 * the build keeps IEEE semantics (-ffp-contract=off). combine (a module function) is one such
 * op on numpy arrays, for the MPI path's schedules.
 *
 * Files: _shmcore.h (layout, state, shared declarations), _shmfold.c (conversions, kernels,
 * programs), this file (the step protocol, the collectives, the Core type, the module),
 * _shmfast.c (Fast: a fast path's whole call, flight record included, as one C callable).
 */
#include "_shmcore.h"

#include <errno.h>
#include <sched.h>
#include <unistd.h>

#if defined(__linux__) && !defined(FCOLL_NO_FUTEX)
#define FCOLL_FUTEX 1
#include <limits.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define CPU_RELAX() __asm__ __volatile__("yield" ::: "memory")
#else
#define CPU_RELAX() ((void)0)
#endif

#define SPIN_SECONDS 20e-6
#define SPIN_OVERSUBSCRIBED 1e-6 /* more ranks than cores: the peer may need this core */
#define YIELD_SECONDS 200e-6     /* from the wait's start: then sleep */
#define SERVE_SECONDS 0.01
#define PAUSE_FIRST 1e-5 /* without futexes: the first nap, doubling up to PAUSE_LAST */
#define PAUSE_LAST 1e-3

PyObject *Mismatch, *Timeout;

static inline Wake *wake_of(Core *c, int rank) {
    return (Wake *)(c->base + (Py_ssize_t)rank * PER_RANK + WAKE_AT);
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static struct timespec span(double seconds) {
    if (seconds < 0) seconds = 0;
    struct timespec t;
    t.tv_sec = (time_t)seconds;
    t.tv_nsec = (long)((seconds - (double)t.tv_sec) * 1e9);
    if (t.tv_nsec > 999999999L) t.tv_nsec = 999999999L;
    return t;
}

/* ---- one step: publish, wait, compare ------------------------------------------------------ */

static inline int arrived(Core *c, int j, int64_t step) {
    return j == c->rank || atomic_load_explicit(&line_of(c, j, step)->step, memory_order_acquire) >= step;
}

/* After this rank stored its step: the wake word, then a wake for its sleepers (if any) */
static inline void wake_sleepers(Core *c, int64_t step) {
#ifdef FCOLL_FUTEX
    Wake *w = wake_of(c, c->rank);
    atomic_store_explicit(&w->word, (uint32_t)step, memory_order_seq_cst);
    if (atomic_load_explicit(&w->sleepers, memory_order_seq_cst) != 0)
        syscall(SYS_futex, (uint32_t *)&w->word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
#else
    (void)c;
    (void)step;
#endif
}

/* Sleep until peer j arrives at ``step``, at most ``seconds`` (or less: a signal, a spurious
 * wake). 1 where a signal interrupted the sleep, else 0. ``pause``: the nap without futexes. */
static int sleep_on(Core *c, int j, int64_t step, double seconds, double *pause) {
#ifdef FCOLL_FUTEX
    (void)pause;
    Wake *w = wake_of(c, j);
    uint32_t seen = atomic_load_explicit(&w->word, memory_order_acquire);
    if (arrived(c, j, step)) return 0; /* (a word seen new means a step seen arrived) */
    int interrupted = 0;
    atomic_fetch_add_explicit(&w->sleepers, 1, memory_order_seq_cst);
    if (atomic_load_explicit(&w->word, memory_order_seq_cst) == seen) {
        struct timespec t = span(seconds);
        interrupted = syscall(SYS_futex, (uint32_t *)&w->word, FUTEX_WAIT, seen, &t, NULL, 0) < 0 &&
                      errno == EINTR;
    }
    atomic_fetch_sub_explicit(&w->sleepers, 1, memory_order_seq_cst);
    return interrupted;
#else
    (void)c;
    (void)j;
    (void)step;
    struct timespec nap = span(*pause < seconds ? *pause : seconds);
    int interrupted = nanosleep(&nap, NULL) < 0 && errno == EINTR;
    *pause = *pause * 2 < PAUSE_LAST ? *pause * 2 : PAUSE_LAST;
    return interrupted;
#endif
}

/* With the GIL released (``*ts``): take it, run Python's signal handlers and ``c->serve``,
 * release it again. 0, or -1 with the Python error set (in this thread's state). ``ts`` NULL
 * (a thread without Python, XLA's): nothing, 0. */
static int serve(Core *c, PyThreadState **ts) {
    if (ts == NULL) return 0; /* XLA's thread (_shmxla.c): no Python while it waits */
    PyEval_RestoreThread(*ts);
    int result = PyErr_CheckSignals();
    if (result == 0 && c->serve != NULL) {
        PyObject *fn = Py_NewRef(c->serve), *r = PyObject_CallNoArgs(fn);
        Py_DECREF(fn);
        if (r == NULL) result = -1;
        Py_XDECREF(r);
    }
    *ts = PyEval_SaveThread();
    return result;
}

/* Called without the GIL (``*ts``: this thread's saved state). STEP_OK: every peer arrived;
 * STEP_TIMEOUT: the deadline passed; STEP_ERROR: a Python error is set (signals, serve). */
static int wait_peers(Core *c, int64_t step, double deadline, PyThreadState **ts) {
    int j = 0, n = c->n;
    while (j < n && arrived(c, j, step)) ++j;
    if (j == n) return STEP_OK;
    /* spin, checking the flag after every pause (a pause is 10-140 cycles: one cache line
     * crossing cores takes longer), the clock every 64 checks */
    double started = now_s(), t = started, spin = c->oversubscribed ? SPIN_OVERSUBSCRIBED : SPIN_SECONDS;
    for (unsigned k = 1; t - started < spin; ++k) {
        CPU_RELAX();
        while (j < n && arrived(c, j, step)) ++j;
        if (j == n) return STEP_OK;
        if ((k & 63) == 0) t = now_s();
    }
    /* yield the core at every poll */
    for (;;) {
        sched_yield();
        while (j < n && arrived(c, j, step)) ++j;
        if (j == n) return STEP_OK;
        t = now_s();
        if (deadline > 0 && t > deadline) return STEP_TIMEOUT;
        if (t - started >= YIELD_SECONDS) break;
    }
    /* sleep until peer j arrives, the deadline, or the next serve */
    double served = t, pause = PAUSE_FIRST;
    for (;;) {
        double until = served + SERVE_SECONDS;
        if (deadline > 0 && deadline < until) until = deadline;
        int interrupted = sleep_on(c, j, step, until - t, &pause);
        while (j < n && arrived(c, j, step)) ++j;
        if (j == n) return STEP_OK;
        t = now_s();
        if (deadline > 0 && t > deadline) return STEP_TIMEOUT;
        if (interrupted || t - served >= SERVE_SECONDS) {
            if (serve(c, ts) < 0) return STEP_ERROR;
            served = t = now_s();
        }
    }
}

/* Publish this rank's announcement (its data already in place), wait, compare; called
 * without the GIL (``*ts``). STEP_OK, or what raise_failed tells once the GIL is back. */
int shm_exchange(Core *c, int64_t fp, int64_t count, double deadline, PyThreadState **ts) {
    int64_t step = ++c->step;
    Line *mine = line_of(c, c->rank, step);
    mine->fp = fp;
    mine->count = count;
    atomic_store_explicit(&mine->step, step, memory_order_release);
    wake_sleepers(c, step);
    int waited = wait_peers(c, step, deadline, ts);
    if (waited != STEP_OK) return waited;
    for (int j = 0; j < c->n; ++j) {
        Line *l = line_of(c, j, step);
        if (l->fp != fp || l->count != count) return STEP_MISMATCH;
    }
    return STEP_OK;
}

/* With the GIL again, after a step's loop ended in ``failed`` (not STEP_OK): its error,
 * Mismatch with the step (the core's last) or Timeout; STEP_ERROR: already set. */
void shm_raise_failed(Core *c, int failed) {
    if (failed == STEP_TIMEOUT) {
        PyErr_SetString(Timeout, "the deadline passed");
    } else if (failed == STEP_MISMATCH) {
        PyObject *s = PyLong_FromLongLong(c->step);
        if (s != NULL) PyErr_SetObject(Mismatch, s);
        Py_XDECREF(s);
    } else if (!PyErr_Occurred()) {
        PyErr_SetString(PyExc_SystemError, "_shmcore: a step failed without an error");
    }
}

/* ---- the collectives ---------------------------------------------------------------------- */

PyArrayObject *shm_new_like(PyArrayObject *x, npy_intp first) {
    npy_intp dims[NPY_MAXDIMS];
    int nd = PyArray_NDIM(x);
    if (nd > 0) memcpy(dims, PyArray_DIMS(x), sizeof(npy_intp) * (size_t)nd); /* 0-d: NULL */
    if (nd > 0 && first >= 0) dims[0] = first;
    PyArray_Descr *d = PyArray_DESCR(x);
    Py_INCREF(d);
    return (PyArrayObject *)PyArray_NewFromDescr(&PyArray_Type, d, nd, dims, NULL, NULL, 0, NULL);
}


/* A call's steps ran without the GIL (``ts``, from PyEval_SaveThread); take it back: ``out``,
 * or NULL with the error of ``failed`` (exchange's result; ``out`` dropped) */
PyObject *shm_finish(Core *c, PyThreadState *ts, int failed, PyArrayObject *out) {
    PyEval_RestoreThread(ts);
    if (failed == STEP_OK) return (PyObject *)out;
    shm_raise_failed(c, failed);
    Py_DECREF(out);
    return NULL;
}

/* elements of each block a reduce_scatter step carries */
static Py_ssize_t scatter_piece(Core *c, const Step *s) {
    Py_ssize_t per = c->chunk / c->n / elem_size[s->type];
    return per < 1 ? 1 : per;
}

int shm_takes(Core *c, const Step *s, PyArrayObject *x) {
    Py_ssize_t nbytes = PyArray_NBYTES(x);
    int contiguous = PyArray_IS_C_CONTIGUOUS(x);
    switch (s->kind) {
    case K_REDUCE:
    case K_SCAN:
        return contiguous && c->n <= MAX_RANKS && min_size(nbytes, c->chunk) <= c->capacity;
    case K_REDUCE_SCATTER: {
        if (!contiguous || c->n > MAX_RANKS || PyArray_NDIM(x) == 0 || PyArray_DIMS(x)[0] % c->n)
            return 0;
        Py_ssize_t size = PyArray_SIZE(x) / c->n;
        return min_size(size, scatter_piece(c, s)) * c->n * elem_size[s->type] <= c->capacity;
    }
    case K_ALLGATHER:
        return contiguous && min_size(nbytes, c->chunk) <= c->capacity;
    case K_ALLTOALL:
        return shm_alltoall_kind.takes(c, s, x);
    case K_BROADCAST: /* the root reads x as it is; the others only its shape */
        return s->root >= 0 && s->root < c->n && (contiguous || c->rank != s->root) &&
               min_size(nbytes, c->chunk) <= c->capacity;
    }
    return 0;
}

/* A call's scratch buffers for ``p`` (fold_scratch), on ``count`` units per step at most:
 * ``stack`` where they fit, else malloc'ed (*allocated, to free). NULL with the error set
 * (no programs yet, no memory); made with the GIL, before its steps. */
#define SCRATCH_STACK 16384
static char *scratch_for(Core *c, const Program *p, int type, Py_ssize_t count, char *stack,
                         char **allocated) {
    *allocated = NULL;
    if (!c->programmed) {
        PyErr_SetString(PyExc_RuntimeError, "_shmcore.Core: no programs (Core.programs)");
        return NULL;
    }
    size_t need = fold_scratch(p, type, count);
    if (need <= SCRATCH_STACK) return stack;
    if ((*allocated = malloc(need)) == NULL) PyErr_NoMemory();
    return *allocated;
}

/* reduce and scan: rank r runs its program (Core.programs) on every rank's row per step:
 * the tree (reduce), its scan or exscan (K_SCAN, F_EXCLUSIVE: rank 0's has no result, left to
 * the caller, who fills in the identity); into ``given`` (reduce only; Py_None: a new array),
 * which may be x itself */
static PyObject *run_reduce(Core *c, const Step *s, PyArrayObject *x, PyObject *given) {
    int fsz = fold_size[s->type], esz = elem_size[s->type];
    /* this rank's own row: its input (the slot its peers read is then left to them), or the
     * copy it published when that copy is what counts (scaled), the input is unaligned or
     * the result overwrites it (in place) */
    int published = (s->flags & F_SCALE) || !PyArray_ISALIGNED(x);
    const Program *prog = &c->programs[s->kind == K_REDUCE ? P_ALLREDUCE
                                       : s->flags & F_EXCLUSIVE ? P_EXSCAN : P_SCAN];
    const char *src = PyArray_BYTES(x);
    Py_ssize_t per = c->chunk / esz, total = PyArray_SIZE(x), all_bytes = total * esz;
    _Alignas(64) char stack[SCRATCH_STACK];
    char *allocated, *scratch = scratch_for(c, prog, s->type, min_size(total, per) * (esz / fsz),
                                            stack, &allocated);
    if (scratch == NULL) return NULL;
    PyArrayObject *out;
    if (given == Py_None) {
        out = shm_new_like(x, -1);
    } else if (s->kind == K_REDUCE && PyArray_Check(given) &&
               PyArray_IS_C_CONTIGUOUS((PyArrayObject *)given) &&
               PyArray_ISWRITEABLE((PyArrayObject *)given) &&
               PyArray_NBYTES((PyArrayObject *)given) == PyArray_NBYTES(x) &&
               PyArray_EquivTypes(PyArray_DESCR((PyArrayObject *)given), PyArray_DESCR(x))) {
        out = (PyArrayObject *)Py_NewRef(given);
    } else {
        PyErr_SetString(PyExc_ValueError, "_shmcore.allreduce_into: out must be a writable "
                                          "C-contiguous array of x's dtype and size");
        out = NULL;
    }
    if (out == NULL) {
        free(allocated);
        return NULL;
    }
    char *dst = PyArray_BYTES(out);
    if (dst < src + all_bytes && src < dst + all_bytes) published = 1; /* in place: its slot */
    PyThreadState *ts = PyEval_SaveThread(); /* no Python object touched until finish */
    int failed = shm_reduce_steps(c, s, prog, src, dst, total, published, scratch, &ts);
    free(allocated);
    return shm_finish(c, ts, failed, out);
}

int shm_reduce_steps(Core *c, const Step *s, const Program *prog, const char *src, char *dst,
                     Py_ssize_t total, int published, char *scratch, PyThreadState **ts) {
    int fsz = fold_size[s->type], esz = elem_size[s->type], avg = s->flags & F_AVG, n = c->n;
    int scale = s->flags & F_SCALE;
    const char *rows[MAX_RANKS];
    Py_ssize_t per = c->chunk / esz;
    int failed = STEP_OK;
    for (Py_ssize_t at = 0; at < total || (total == 0 && at == 0); at += per) {
        Py_ssize_t m = min_size(total - at, per), nbytes = m * esz;
        int64_t step = c->step + 1;
        char *mine = data_of(c, c->rank, step, nbytes);
        if (scale) scale_copy(mine, src + at * esz, s->type, m, s->factor);
        else if (nbytes) memcpy(mine, src + at * esz, (size_t)nbytes);
        if ((failed = shm_exchange(c, s->fp, total, s->deadline, ts)) != STEP_OK) break;
        for (int j = 0; j < n; ++j)
            rows[j] = (j == c->rank && !published) ? src + at * esz : data_of(c, j, step, nbytes);
        fold_program(prog, s->type, s->op, avg, n, rows, dst + at * esz, m * (esz / fsz), scratch);
        if (total == 0) break;
    }
    return failed;
}

int shm_announce(Core *c, int64_t fp, int64_t count, double deadline, PyThreadState **ts) {
    return shm_exchange(c, fp, count, deadline, ts);
}

size_t shm_scratch(Core *c, const Step *s, Py_ssize_t total) {
    int esz = elem_size[s->type], fsz = fold_size[s->type];
    return fold_scratch(&c->programs[P_ALLREDUCE], s->type,
                        min_size(total, c->chunk / esz) * (esz / fsz));
}

/* reduce_scatter: each step carries the next piece of every block; rank r runs the tree on
 * block r's */
static PyObject *run_reduce_scatter(Core *c, const Step *s, PyArrayObject *x) {
    int n = c->n, me = c->rank, esz = elem_size[s->type], fsz = fold_size[s->type];
    int scale = s->flags & F_SCALE, avg = s->flags & F_AVG;
    int published = scale || !PyArray_ISALIGNED(x); /* as in run_reduce */
    Py_ssize_t size = PyArray_SIZE(x) / n, per = scatter_piece(c, s); /* elements per block */
    const Program *prog = &c->programs[P_ALLREDUCE];
    _Alignas(64) char stack[SCRATCH_STACK];
    char *allocated, *scratch = scratch_for(c, prog, s->type, min_size(size, per) * (esz / fsz),
                                            stack, &allocated);
    if (scratch == NULL) return NULL;
    PyArrayObject *out = shm_new_like(x, PyArray_DIMS(x)[0] / n);
    if (out == NULL) {
        free(allocated);
        return NULL;
    }
    const char *src = PyArray_BYTES(x), *rows[MAX_RANKS];
    char *dst = PyArray_BYTES(out);
    Py_ssize_t count = PyArray_SIZE(x);
    int failed = STEP_OK;
    PyThreadState *ts = PyEval_SaveThread(); /* no Python object touched until finish */
    for (Py_ssize_t at = 0; at < size || (size == 0 && at == 0); at += per) {
        Py_ssize_t m = min_size(size - at, per), piece = m * esz;
        int64_t step = c->step + 1;
        char *mine = data_of(c, me, step, piece * n);
        for (int j = 0; j < n; ++j) { /* block j's piece, at j * piece; my own if it counts */
            const char *from = src + ((Py_ssize_t)j * size + at) * esz;
            if (scale) scale_copy(mine + j * piece, from, s->type, m, s->factor);
            else if ((j != me || published) && piece) memcpy(mine + j * piece, from, (size_t)piece);
        }
        if ((failed = shm_exchange(c, s->fp, count, s->deadline, &ts)) != STEP_OK) break;
        for (int j = 0; j < n; ++j)
            rows[j] = (j == me && !published) ? src + ((Py_ssize_t)me * size + at) * esz
                                          : data_of(c, j, step, piece * n) + me * piece;
        fold_program(prog, s->type, s->op, avg, n, rows, dst + at * esz, m * (esz / fsz), scratch);
        if (size == 0) break;
    }
    free(allocated);
    return shm_finish(c, ts, failed, out);
}

/* allgather: every rank's x in rank order, into ``given`` (Py_None: a new array, shape[0]
 * times n; a 0-d x is the caller's case) */
static PyObject *run_allgather(Core *c, const Step *s, PyArrayObject *x, PyObject *given) {
    int n = c->n, me = c->rank;
    Py_ssize_t nbytes = PyArray_NBYTES(x);
    PyArrayObject *out;
    if (given == Py_None && PyArray_NDIM(x) > 0) {
        out = shm_new_like(x, PyArray_DIMS(x)[0] * n);
        if (out == NULL) return NULL;
    } else if (given != Py_None && PyArray_Check(given) &&
               PyArray_IS_C_CONTIGUOUS((PyArrayObject *)given) &&
               PyArray_ISWRITEABLE((PyArrayObject *)given) &&
               PyArray_NBYTES((PyArrayObject *)given) == n * nbytes) {
        out = (PyArrayObject *)Py_NewRef(given);
    } else {
        PyErr_SetString(PyExc_ValueError, "_shmcore.allgather: expected out to be None (x at "
                                          "least 1-d) or a writable C-contiguous array of n "
                                          "times x's bytes");
        return NULL;
    }
    const char *src = PyArray_BYTES(x);
    char *dst = PyArray_BYTES(out);
    Py_ssize_t count = PyArray_SIZE(x);
    int failed = STEP_OK;
    PyThreadState *ts = PyEval_SaveThread(); /* no Python object touched until finish */
    for (Py_ssize_t at = 0; at < nbytes || (nbytes == 0 && at == 0); at += c->chunk) {
        Py_ssize_t m = min_size(nbytes - at, c->chunk);
        int64_t step = c->step + 1;
        if (m) memcpy(data_of(c, me, step, m), src + at, (size_t)m);
        if ((failed = shm_exchange(c, s->fp, count, s->deadline, &ts)) != STEP_OK) break;
        for (int j = 0; j < n && m; ++j)
            memcpy(dst + j * nbytes + at, j == me ? src + at : data_of(c, j, step, m), (size_t)m);
        if (nbytes == 0) break;
    }
    return shm_finish(c, ts, failed, out);
}

/* broadcast: the root copies into its line or slot and its result, the others copy out */
static PyObject *run_broadcast(Core *c, const Step *s, PyArrayObject *x) {
    Py_ssize_t nbytes = PyArray_NBYTES(x);
    int root = s->root, is_root = c->rank == root;
    PyArrayObject *out = shm_new_like(x, -1);
    if (out == NULL) return NULL;
    char *dst = PyArray_BYTES(out);
    const char *src = PyArray_BYTES(x);
    Py_ssize_t count = PyArray_SIZE(x);
    int failed = STEP_OK;
    PyThreadState *ts = PyEval_SaveThread(); /* no Python object touched until finish */
    for (Py_ssize_t at = 0; at < nbytes || (nbytes == 0 && at == 0); at += c->chunk) {
        Py_ssize_t m = min_size(nbytes - at, c->chunk);
        int64_t step = c->step + 1;
        if (is_root && m) {
            memcpy(data_of(c, root, step, m), src + at, (size_t)m);
            memcpy(dst + at, src + at, (size_t)m);
        }
        if ((failed = shm_exchange(c, s->fp, count, s->deadline, &ts)) != STEP_OK) break;
        if (!is_root && m) memcpy(dst + at, data_of(c, root, step, m), (size_t)m);
        if (nbytes == 0) break;
    }
    return shm_finish(c, ts, failed, out);
}

PyObject *shm_run(Core *c, const Step *s, PyArrayObject *x, PyObject *out) {
    switch (s->kind) {
    case K_REDUCE:
    case K_SCAN:
        return run_reduce(c, s, x, out);
    case K_REDUCE_SCATTER:
        return run_reduce_scatter(c, s, x);
    case K_ALLGATHER:
        return run_allgather(c, s, x, out);
    case K_BROADCAST:
        return run_broadcast(c, s, x);
    case K_ALLTOALL:
        return shm_alltoall_kind.run(c, s, x);
    }
    PyErr_SetString(PyExc_ValueError, "_shmcore: no such kind of call");
    return NULL;
}

/* ---- the methods: parse, then shm_takes / shm_run ------------------------------------------ */

/* A reduction's (type, op, flags, factor): 0, or -1 with ValueError set */
int shm_fold_ok(int type, int op) {
    if (!fold_exists(type, op)) {
        PyErr_Format(PyExc_ValueError, "_shmcore: no fold for type %d op %d", type, op);
        return -1;
    }
    return 0;
}

PyObject *shm_call(Core *c, Step *s, PyObject *x, PyObject *out) {
    if (!PyArray_Check(x) || !shm_takes(c, s, (PyArrayObject *)x)) Py_RETURN_NONE;
    return shm_run(c, s, (PyArrayObject *)x, out);
}

static PyObject *reduction(Core *c, PyObject *args, int kind) {
    PyObject *x;
    long long fp;
    Step s = {.kind = kind};
    if (!PyArg_ParseTuple(args, "OiiidLd", &x, &s.type, &s.op, &s.flags, &s.factor, &fp,
                          &s.deadline) || shm_fold_ok(s.type, s.op) < 0)
        return NULL;
    s.fp = (int64_t)fp;
    return shm_call(c, &s, x, Py_None);
}

static PyObject *Core_allreduce(Core *c, PyObject *args) { return reduction(c, args, K_REDUCE); }

/* allreduce_into(out, x, type, op, flags, factor, fp, deadline): allreduce into out (writable,
 * C-contiguous, x's dtype and size; it may be x itself): out, or None where allreduce's is */
static PyObject *Core_allreduce_into(Core *c, PyObject *args) {
    PyObject *x, *given;
    long long fp;
    Step s = {.kind = K_REDUCE};
    if (!PyArg_ParseTuple(args, "OOiiidLd", &given, &x, &s.type, &s.op, &s.flags, &s.factor,
                          &fp, &s.deadline) || shm_fold_ok(s.type, s.op) < 0)
        return NULL;
    s.fp = (int64_t)fp;
    return shm_call(c, &s, x, given);
}
static PyObject *Core_scan(Core *c, PyObject *args) { return reduction(c, args, K_SCAN); }
static PyObject *Core_reduce_scatter(Core *c, PyObject *args) {
    return reduction(c, args, K_REDUCE_SCATTER);
}

static PyObject *Core_allgather(Core *c, PyObject *args) {
    PyObject *x, *given;
    long long fp;
    Step s = {.kind = K_ALLGATHER};
    if (!PyArg_ParseTuple(args, "OOLd", &x, &given, &fp, &s.deadline)) return NULL;
    s.fp = (int64_t)fp;
    if (given == Py_None && PyArray_Check(x) && PyArray_NDIM((PyArrayObject *)x) == 0)
        Py_RETURN_NONE;
    return shm_call(c, &s, x, given);
}

static PyObject *Core_broadcast(Core *c, PyObject *args) {
    PyObject *x;
    long long fp;
    Step s = {.kind = K_BROADCAST};
    if (!PyArg_ParseTuple(args, "OiLd", &x, &s.root, &fp, &s.deadline)) return NULL;
    s.fp = (int64_t)fp;
    return shm_call(c, &s, x, Py_None);
}

static PyObject *Core_announce(Core *c, PyObject *args) {
    long long fp, count;
    double deadline;
    if (!PyArg_ParseTuple(args, "LLd", &fp, &count, &deadline)) return NULL;
    PyThreadState *ts = PyEval_SaveThread();
    int failed = shm_exchange(c, (int64_t)fp, (int64_t)count, deadline, &ts);
    PyEval_RestoreThread(ts);
    if (failed != STEP_OK) {
        shm_raise_failed(c, failed);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *Core_announced(Core *c, PyObject *args) {
    long long step;
    if (!PyArg_ParseTuple(args, "L", &step)) return NULL;
    PyObject *list = PyList_New(c->n);
    for (int j = 0; list != NULL && j < c->n; ++j) {
        Line *l = line_of(c, j, step);
        PyObject *item = Py_BuildValue("(LL)", (long long)l->fp, (long long)l->count);
        if (item == NULL) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, j, item);
    }
    return list;
}

/* One program from Python, ``(ops, result, temps)`` (order.py's Program: ``as_array()``, an
 * (k, 3) int32 array, its result and temps), checked and copied into ``p``: 0, or -1 with
 * ValueError set (operands out of range, a result that is never written) */
static int program_from(Core *c, PyObject *spec, Program *p, const char *name) {
    PyObject *given;
    int result, temps, n = c->n;
    if (!PyArg_ParseTuple(spec, "Oii", &given, &result, &temps)) return -1;
    PyArrayObject *ops = (PyArrayObject *)PyArray_FROMANY(given, NPY_INT32, 2, 2,
                                                          NPY_ARRAY_IN_ARRAY);
    if (ops == NULL) return -1;
    npy_intp k = PyArray_DIMS(ops)[0];
    const int32_t *o = (const int32_t *)PyArray_DATA(ops);
    const char *bad = NULL;
    if (PyArray_DIMS(ops)[1] != 3 || k > 1 << 16) bad = "ops must be a (k, 3) array";
    else if (temps < 0 || temps > MAX_TEMPS) bad = "too many scratch buffers";
    else if (k == 0 && !(result == NONE || (result >= 0 && result < n)))
        bad = "without ops the result must be a row or NONE";
    else if (k > 0 && (result != OUT || o[3 * (k - 1)] != OUT))
        bad = "with ops the result must be OUT, the last op's";
    for (npy_intp i = 0; bad == NULL && i < k; ++i) {
        const int32_t *op = o + 3 * i;
        if (op[0] != OUT && (op[0] < n || op[0] >= n + temps))
            bad = "a dst must be OUT or a scratch buffer";
        for (int j = 1; j < 3 && bad == NULL; ++j)
            if (op[j] < 0 || op[j] >= n + temps)
                bad = "an operand must be a row or a scratch buffer";
    }
    if (bad != NULL) {
        PyErr_Format(PyExc_ValueError, "_shmcore.Core.programs: %s program of %d ranks: %s", name,
                     n, bad);
        Py_DECREF(ops);
        return -1;
    }
    p->ops = PyMem_RawMalloc(k > 0 ? (size_t)k * 3 * sizeof(int32_t) : 1);
    p->fuse = PyMem_RawMalloc(k > 0 ? (size_t)k : 1);
    if (p->ops == NULL || p->fuse == NULL) {
        Py_DECREF(ops);
        PyErr_NoMemory();
        return -1;
    }
    if (k > 0) memcpy(p->ops, o, (size_t)k * 3 * sizeof(int32_t));
    p->k = (int)k;
    p->result = result;
    p->temps = temps;
    program_plan(p, n);
    Py_DECREF(ops);
    return 0;
}

static void programs_free(Core *c) {
    for (int i = 0; i < P_COUNT; ++i) {
        PyMem_RawFree(c->programs[i].ops);
        PyMem_RawFree(c->programs[i].fuse);
        c->programs[i].ops = NULL;
        c->programs[i].fuse = NULL;
    }
    c->programmed = 0;
}

/* programs(allreduce, scan, exscan): this rank's reduction orders, once */
static PyObject *Core_programs(Core *c, PyObject *args) {
    PyObject *specs[P_COUNT];
    static const char *names[P_COUNT] = {"the allreduce", "the scan", "the exscan"};
    if (!PyArg_ParseTuple(args, "OOO", &specs[0], &specs[1], &specs[2])) return NULL;
    if (c->programmed) { /* a call may be running them without the GIL */
        PyErr_SetString(PyExc_RuntimeError, "_shmcore.Core.programs: already given");
        return NULL;
    }
    for (int i = 0; i < P_COUNT; ++i) {
        if (program_from(c, specs[i], &c->programs[i], names[i]) < 0) {
            programs_free(c);
            return NULL;
        }
    }
    c->programmed = 1;
    Py_RETURN_NONE;
}

/* ---- the type ----------------------------------------------------------------------------- */

static int Core_init(Core *c, PyObject *args, PyObject *kwds) {
    PyObject *buffer;
    long long step;
    static char *names[] = {"buffer", "n", "rank", "capacity", "head", "chunk", "step",
                            "oversubscribed", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OiinnnLp", names, &buffer, &c->n, &c->rank,
                                     &c->capacity, &c->head, &c->chunk, &step, &c->oversubscribed))
        return -1;
    if (PyObject_GetBuffer(buffer, &c->view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) return -1;
    if (c->n < 1 || c->rank < 0 || c->rank >= c->n || c->capacity < 0 || c->chunk < 1 ||
        c->head < (Py_ssize_t)c->n * PER_RANK ||
        c->view.len < c->head + 2 * (Py_ssize_t)c->n * c->capacity) {
        PyBuffer_Release(&c->view);
        PyErr_SetString(PyExc_ValueError, "_shmcore.Core: the buffer does not hold this layout");
        return -1;
    }
    c->base = (char *)c->view.buf;
    c->step = (int64_t)step;
    c->pid = (int64_t)getpid();
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    c->nonce = ((uint64_t)t.tv_nsec << 32 ^ (uint64_t)t.tv_sec ^ (uint64_t)c->pid << 16 ^
                (uint64_t)(uintptr_t)c) | 1;
    c->direct = shm_direct_available();
    return 0;
}

static void Core_dealloc(Core *c) {
    if (c->base != NULL) PyBuffer_Release(&c->view);
    programs_free(c);
    Py_XDECREF(c->serve);
    Py_TYPE(c)->tp_free((PyObject *)c);
}

static PyObject *Core_get_step(Core *c, void *closure) { return PyLong_FromLongLong(c->step); }

static int Core_set_step(Core *c, PyObject *value, void *closure) {
    long long step = PyLong_AsLongLong(value);
    if (step == -1 && PyErr_Occurred()) return -1;
    c->step = step;
    return 0;
}

static PyObject *Core_get_direct(Core *c, void *closure) { return PyLong_FromLong(c->direct); }

static int Core_set_direct(Core *c, PyObject *value, void *closure) {
    long direct = PyLong_AsLong(value);
    if (direct == -1 && PyErr_Occurred()) return -1;
    if (direct < 0 || direct > 2 || (direct == 1 && !shm_direct_available())) {
        PyErr_Format(PyExc_ValueError, "_shmcore.Core.direct: expected 0, 2 or (where the "
                     "platform reads other processes' memory) 1, got %ld", direct);
        return -1;
    }
    c->direct = (int)direct;
    return 0;
}

static PyObject *Core_get_serve(Core *c, void *closure) {
    return Py_NewRef(c->serve != NULL ? c->serve : Py_None);
}

static int Core_set_serve(Core *c, PyObject *value, void *closure) {
    PyObject *old = c->serve;
    c->serve = (value == NULL || value == Py_None) ? NULL : Py_NewRef(value);
    Py_XDECREF(old);
    return 0;
}

static PyGetSetDef Core_getset[] = {
    {"step", (getter)Core_get_step, (setter)Core_set_step, "the last step taken", NULL},
    {"direct", (getter)Core_get_direct, (setter)Core_set_direct,
     "all-to-alls read large blocks from the peers' inputs: 1, 0 (off), 2 (reads fail: tests)",
     NULL},
    {"serve", (getter)Core_get_serve, (setter)Core_set_serve,
     "called now and then while a wait sleeps (flight-record requests)", NULL},
    {NULL},
};

/* the Core's own methods; Core_methods (the type's table) joins them with the other files'
 * (shm_alltoall_kind's) at module init */
static PyMethodDef core_own_methods[] = {
    {"programs", (PyCFunction)Core_programs, METH_VARARGS,
     "programs(allreduce, scan, exscan): this rank's reduction orders, each (ops, result, "
     "temps) of fcoll.backends.tree.order's Program (ops: as_array()); once, before any reduction"},
    {"allreduce", (PyCFunction)Core_allreduce, METH_VARARGS,
     "allreduce(x, type, op, flags, factor, fp, deadline): a new array, or None"},
    {"allreduce_into", (PyCFunction)Core_allreduce_into, METH_VARARGS,
     "allreduce_into(out, x, type, op, flags, factor, fp, deadline): out, or None"},
    {"scan", (PyCFunction)Core_scan, METH_VARARGS,
     "scan(x, type, op, flags, factor, fp, deadline): the scan program's (F_EXCLUSIVE: exscan's) "
     "result, or None where the core does not take x"},
    {"reduce_scatter", (PyCFunction)Core_reduce_scatter, METH_VARARGS,
     "reduce_scatter(x, type, op, flags, factor, fp, deadline): block rank of the reduction"},
    {"allgather", (PyCFunction)Core_allgather, METH_VARARGS, "allgather(x, out, fp, deadline)"},
    {"broadcast", (PyCFunction)Core_broadcast, METH_VARARGS, "broadcast(x, root, fp, deadline)"},
    {"announce", (PyCFunction)Core_announce, METH_VARARGS, "announce(fp, count, deadline)"},
    {"announced", (PyCFunction)Core_announced, METH_VARARGS, "[(fp, count)] of a step, by rank"},
    {NULL},
};

static PyMethodDef Core_methods[32];

/* ``into`` (room for ``cap`` entries with the closing one): ``a``'s entries, then ``b``'s;
 * 0, or -1 with SystemError set where they do not fit */
static int join_methods(PyMethodDef *into, size_t cap, const PyMethodDef *a, const PyMethodDef *b) {
    size_t k = 0;
    for (const PyMethodDef *t = a; t != NULL; t = t == a ? b : NULL)
        for (const PyMethodDef *m = t; m->ml_name != NULL; ++m) {
            if (k + 1 >= cap) {
                PyErr_SetString(PyExc_SystemError, "_shmcore: too many Core methods");
                return -1;
            }
            into[k++] = *m;
        }
    into[k] = (PyMethodDef){NULL};
    return 0;
}

PyTypeObject CoreType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "fcoll.backends._shmcore.Core",
    .tp_basicsize = sizeof(Core),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One group's segment, stepped in C (see the module's comment).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Core_init,
    .tp_dealloc = (destructor)Core_dealloc,
    .tp_methods = Core_methods,
    .tp_getset = Core_getset,
};

/* combine(out, a, b, type, op): out = a op b elementwise with the core's kernels, the GIL
 * released for the loop (the MPI path's schedules: fcoll.backends.tree). Arrays: C-contiguous,
 * native byte order, of (type)'s dtype and one size; out writable, a or b itself or apart
 * from both. Not float16/bfloat16 (their trees run in float32 on the MPI path). */
static PyObject *combine(PyObject *module, PyObject *args) {
    PyObject *objs[3];
    int type, op;
    if (!PyArg_ParseTuple(args, "OOOii", &objs[0], &objs[1], &objs[2], &type, &op)) return NULL;
    int known = type >= 0 && type < T_COUNT && op >= 0 && op < O_COUNT;
    pair_fn pair = known ? pair_of(type, op) : NULL;
    if (pair == NULL) {
        PyErr_Format(PyExc_ValueError, "_shmcore.combine: no kernel for type %d op %d", type, op);
        return NULL;
    }
    static const char kinds[T_COUNT] = "uiuiuiuiffffcc"; /* numpy's dtype kinds ('b' for u8) */
    PyArrayObject *arr[3];
    for (int i = 0; i < 3; ++i) {
        arr[i] = (PyArrayObject *)objs[i];
        if (!PyArray_Check(objs[i])) {
            PyErr_SetString(PyExc_TypeError, "_shmcore.combine: expected numpy arrays out, a, b");
            return NULL;
        }
        char kind = PyArray_DESCR(arr[i])->kind;
        if (PyArray_ITEMSIZE(arr[i]) != elem_size[type] || !PyArray_ISNOTSWAPPED(arr[i]) ||
            !(kind == kinds[type] || (type == T_U8 && kind == 'b'))) {
            PyErr_Format(PyExc_TypeError, "_shmcore.combine: the arrays must be of type %d's "
                         "dtype (kind %c, %d bytes)", type, kinds[type], elem_size[type]);
            return NULL;
        }
        if (!PyArray_IS_C_CONTIGUOUS(arr[i]) || !PyArray_ISALIGNED(arr[i]) ||
            PyArray_SIZE(arr[i]) != PyArray_SIZE(arr[0])) {
            PyErr_SetString(PyExc_ValueError, "_shmcore.combine: expected aligned C-contiguous "
                                              "arrays of one size");
            return NULL;
        }
    }
    if (!PyArray_ISWRITEABLE(arr[0])) {
        PyErr_SetString(PyExc_ValueError, "_shmcore.combine: out is read-only");
        return NULL;
    }
    char *o = PyArray_BYTES(arr[0]);
    Py_ssize_t nbytes = PyArray_NBYTES(arr[0]);
    for (int i = 1; i < 3; ++i) {
        const char *x = PyArray_BYTES(arr[i]);
        if (x != o && x < o + nbytes && o < x + nbytes) {
            PyErr_SetString(PyExc_ValueError, "_shmcore.combine: out overlaps a or b without "
                                              "being it");
            return NULL;
        }
    }
    Py_ssize_t count = PyArray_SIZE(arr[0]) * (elem_size[type] / fold_size[type]);
    if (count > 0) {
        Py_BEGIN_ALLOW_THREADS
        pair(o, PyArray_BYTES(arr[1]), PyArray_BYTES(arr[2]), count);
        Py_END_ALLOW_THREADS
    }
    return Py_NewRef(objs[0]);
}

static PyMethodDef module_methods[] = {
    {"combine", combine, METH_VARARGS,
     "combine(out, a, b, type, op): out = a op b elementwise (out may be a or b); out"},
    {NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_shmcore", "fcoll's compiled shared-memory step.", -1, module_methods,
};

PyMODINIT_FUNC PyInit__shmcore(void) {
    import_array();
    if (join_methods(Core_methods, sizeof Core_methods / sizeof *Core_methods, core_own_methods,
                     shm_alltoall_kind.core_methods) < 0 ||
        PyType_Ready(&CoreType) < 0 || PyType_Ready(&FastType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddFunctions(m, xla_methods) < 0 ||
        PyModule_AddFunctions(m, shm_alltoall_kind.module_methods) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    Mismatch = PyErr_NewException("fcoll.backends._shmcore.Mismatch", NULL, NULL);
    Timeout = PyErr_NewException("fcoll.backends._shmcore.Timeout", NULL, NULL);
    if (PyModule_AddObjectRef(m, "Core", (PyObject *)&CoreType) < 0 ||
        PyModule_AddObjectRef(m, "Fast", (PyObject *)&FastType) < 0 ||
        PyModule_AddObjectRef(m, "Mismatch", Mismatch) < 0 ||
        PyModule_AddObjectRef(m, "Timeout", Timeout) < 0 ||
        PyModule_AddIntConstant(m, "INLINE", INLINE) < 0 ||
        PyModule_AddIntConstant(m, "PER_RANK", PER_RANK) < 0 ||
        PyModule_AddIntConstant(m, "DIRECT_MIN", (long)DIRECT_MIN) < 0 ||
        PyModule_AddIntConstant(m, "F_AVG", F_AVG) < 0 ||
        PyModule_AddIntConstant(m, "F_SCALE", F_SCALE) < 0 ||
        PyModule_AddIntConstant(m, "F_EXCLUSIVE", F_EXCLUSIVE) < 0 ||
        PyModule_AddIntConstant(m, "K_REDUCE", K_REDUCE) < 0 ||
        PyModule_AddIntConstant(m, "K_SCAN", K_SCAN) < 0 ||
        PyModule_AddIntConstant(m, "K_REDUCE_SCATTER", K_REDUCE_SCATTER) < 0 ||
        PyModule_AddIntConstant(m, "K_ALLGATHER", K_ALLGATHER) < 0 ||
        PyModule_AddIntConstant(m, "K_BROADCAST", K_BROADCAST) < 0 ||
        PyModule_AddIntConstant(m, "K_ALLTOALL", K_ALLTOALL) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
