/* fcoll's compiled shared-memory step (fcoll.backends._shmcore): one call of all_reduce,
 * reduce_scatter, all_gather, broadcast or scan through a group's segment, in C.
 *
 * The segment is an MPI-3 shared window that mpi4py allocated (fcoll/backends/segment.py);
 * it reaches this module as a writable buffer. Its layout, from the start:
 *
 *   control area: per rank 128 bytes = two 64-byte lines, one per step parity, each written
 *                 by that rank alone: step (atomic), fingerprint, element count, then up to
 *                 INLINE bytes of the step's data (a small message rides in the line that
 *                 carries its flag: one cache line crosses cores per peer);
 *   slots:        two sets (by parity) of n slots of `capacity` bytes, slot j written by rank j.
 *
 * A step: copy this rank's data in (line or slot), store fingerprint and count, then the step
 * number with release ordering; wait until every peer's line of this parity shows the step
 * (acquire ordering), compare every rank's fingerprint and count, fold or copy out. A rank can
 * write parity p again only two steps later, after every rank arrived at the step between,
 * that is after every rank finished reading step p: one flag per rank per step, no barrier.
 *
 * Waiting: spin with the GIL held for SPIN_SECONDS (a few microseconds: what a step takes when
 * the peers are on time), then poll with the GIL released, yielding the core at every poll when
 * the node runs more ranks than cores; after YIELD_SECONDS sleep between polls (up to 1 ms),
 * now and then taking the GIL to answer flight-record requests (a Python callable) and signals.
 * A deadline (CLOCK_MONOTONIC seconds, as Python's time.monotonic) raises Timeout.
 *
 * Folds run in group-rank order, ((r0 op r1) op r2) ..., per element, as numpy's ufuncs do,
 * so results are bit-identical to the numpy path: integer sum and product wrap (unsigned
 * arithmetic), float min/max propagate NaN as np.minimum/np.maximum, float16 and bfloat16
 * accumulate in float32 and round back as numpy and ml_dtypes do, avg divides the float sum by
 * n in the wire type, premul_sum scales each rank's data at copy-in. No -ffast-math: the build
 * keeps IEEE semantics (-ffp-contract=off).
 *
 * Files: _shmcore.h (layout, state, shared declarations), _shmfold.c (conversions and folds),
 * this file (the step protocol, the collectives, the Core type, the module), _shmfast.c (Fast:
 * a fast path's whole call, flight record included, as one C callable).
 */
#include "_shmcore.h"

#include <sched.h>

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
#define YIELD_SECONDS 0.05
#define SERVE_SECONDS 0.01

PyObject *Mismatch, *Timeout;

static inline Line *line_of(Core *c, int rank, int64_t step) {
    return (Line *)(c->base + (Py_ssize_t)rank * PER_RANK + (step & 1) * LINE);
}

static inline char *slot_of(Core *c, int rank, int64_t step) {
    return c->base + c->head + ((step & 1) * c->n + rank) * c->capacity;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* ---- one step: publish, wait, compare ------------------------------------------------------ */

/* 0: every peer arrived; 1: the deadline passed; -1: a Python error is set */
static int wait_peers(Core *c, int64_t step, double deadline) {
    int j = 0, n = c->n, result = 0;
#define ARRIVED(k) ((k) == c->rank || atomic_load_explicit(&line_of(c, (k), step)->step, memory_order_acquire) >= step)
    while (j < n && ARRIVED(j)) ++j;
    if (j == n) return 0;
    /* spin, checking the flag after every pause (a pause is 10-140 cycles: one cache line
     * crossing cores takes longer), the clock every 64 checks */
    double started = now_s(), t = started, served = started, pause = 1e-5;
    for (unsigned k = 1; t - started < (c->oversubscribed ? SPIN_OVERSUBSCRIBED : SPIN_SECONDS); ++k) {
        CPU_RELAX();
        while (j < n && ARRIVED(j)) ++j;
        if (j == n) return 0;
        if ((k & 63) == 0) t = now_s();
    }
    PyThreadState *ts = PyEval_SaveThread();
    for (;;) {
        while (j < n && ARRIVED(j)) ++j;
        if (j == n) break;
        t = now_s();
        if (deadline > 0 && t > deadline) {
            result = 1;
            break;
        }
        if (t - started < YIELD_SECONDS) {
            if (c->oversubscribed) sched_yield();
            else CPU_RELAX();
            continue;
        }
        struct timespec nap = {0, (long)(pause * 1e9)};
        nanosleep(&nap, NULL);
        pause = pause * 2 < 1e-3 ? pause * 2 : 1e-3;
        if (t - served > SERVE_SECONDS) {
            served = t;
            PyEval_RestoreThread(ts);
            if (PyErr_CheckSignals() < 0) return -1;
            if (c->serve != NULL) {
                PyObject *r = PyObject_CallNoArgs(c->serve);
                if (r == NULL) return -1;
                Py_DECREF(r);
            }
            ts = PyEval_SaveThread();
        }
    }
#undef ARRIVED
    PyEval_RestoreThread(ts);
    return result;
}

/* Publish this rank's announcement (its data already in place), wait, compare. 0 on success,
 * -1 with Timeout or Mismatch(step) set. */
static int exchange(Core *c, int64_t fp, int64_t count, double deadline) {
    int64_t step = ++c->step;
    Line *mine = line_of(c, c->rank, step);
    mine->fp = fp;
    mine->count = count;
    atomic_store_explicit(&mine->step, step, memory_order_release);
    int waited = wait_peers(c, step, deadline);
    if (waited != 0) {
        if (waited > 0) PyErr_SetString(Timeout, "the deadline passed");
        return -1;
    }
    for (int j = 0; j < c->n; ++j) {
        Line *l = line_of(c, j, step);
        if (l->fp != fp || l->count != count) {
            PyObject *s = PyLong_FromLongLong(step);
            PyErr_SetObject(Mismatch, s);
            Py_XDECREF(s);
            return -1;
        }
    }
    return 0;
}

/* Where rank j's data of this step is: its line (small steps) or its slot. */
static inline char *data_of(Core *c, int j, int64_t step, Py_ssize_t nbytes) {
    return nbytes <= INLINE ? (char *)line_of(c, j, step)->data : slot_of(c, j, step);
}

/* ---- the collectives ---------------------------------------------------------------------- */

static PyArrayObject *new_like(PyArrayObject *x, npy_intp first) {
    npy_intp dims[NPY_MAXDIMS];
    int nd = PyArray_NDIM(x);
    if (nd > 0) memcpy(dims, PyArray_DIMS(x), sizeof(npy_intp) * (size_t)nd); /* 0-d: NULL */
    if (nd > 0 && first >= 0) dims[0] = first;
    PyArray_Descr *d = PyArray_DESCR(x);
    Py_INCREF(d);
    return (PyArrayObject *)PyArray_NewFromDescr(&PyArray_Type, d, nd, dims, NULL, NULL, 0, NULL);
}

static inline Py_ssize_t min_size(Py_ssize_t a, Py_ssize_t b) { return a < b ? a : b; }

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
    case K_BROADCAST: /* the root reads x as it is; the others only its shape */
        return s->root >= 0 && s->root < c->n && (contiguous || c->rank != s->root) &&
               min_size(nbytes, c->chunk) <= c->capacity;
    }
    return 0;
}

/* reduce and scan: rank r folds every rank (reduce), ranks 0..r (scan) or 0..r-1 (scan,
 * F_EXCLUSIVE; rank 0's result is left to the caller, who fills in the identity); into
 * ``given`` (reduce only; Py_None: a new array), which may be x itself */
static PyObject *run_reduce(Core *c, const Step *s, PyArrayObject *x, PyObject *given) {
    int fsz = fold_size[s->type], esz = elem_size[s->type], avg = s->flags & F_AVG;
    /* this rank's own row: its input (the slot its peers read is then left to them), or the
     * copy it published when that copy is what counts (scaled), the input is unaligned or
     * the result overwrites it (in place) */
    int scale = s->flags & F_SCALE, published = scale || !PyArray_ISALIGNED(x);
    PyArrayObject *out;
    if (given == Py_None) {
        out = new_like(x, -1);
        if (out == NULL) return NULL;
    } else if (s->kind == K_REDUCE && PyArray_Check(given) &&
               PyArray_IS_C_CONTIGUOUS((PyArrayObject *)given) &&
               PyArray_ISWRITEABLE((PyArrayObject *)given) &&
               PyArray_NBYTES((PyArrayObject *)given) == PyArray_NBYTES(x) &&
               PyArray_EquivTypes(PyArray_DESCR((PyArrayObject *)given), PyArray_DESCR(x))) {
        out = (PyArrayObject *)Py_NewRef(given);
    } else {
        PyErr_SetString(PyExc_ValueError, "_shmcore.allreduce_into: out must be a writable "
                                          "C-contiguous array of x's dtype and size");
        return NULL;
    }
    const char *src = PyArray_BYTES(x), *rows[MAX_RANKS];
    char *dst = PyArray_BYTES(out);
    Py_ssize_t per = c->chunk / esz, total = PyArray_SIZE(x), all_bytes = total * esz;
    if (dst < src + all_bytes && src < dst + all_bytes) published = 1; /* in place: its slot */
    for (Py_ssize_t at = 0; at < total || (total == 0 && at == 0); at += per) {
        Py_ssize_t m = min_size(total - at, per), nbytes = m * esz;
        int64_t step = c->step + 1;
        char *mine = data_of(c, c->rank, step, nbytes);
        if (scale) scale_copy(mine, src + at * esz, s->type, m, s->factor);
        else if (nbytes) memcpy(mine, src + at * esz, (size_t)nbytes);
        if (exchange(c, s->fp, total, s->deadline) < 0) {
            Py_DECREF(out);
            return NULL;
        }
        int k = s->kind == K_SCAN ? (s->flags & F_EXCLUSIVE ? c->rank : c->rank + 1) : c->n;
        for (int j = 0; j < k; ++j)
            rows[j] = (j == c->rank && !published) ? src + at * esz : data_of(c, j, step, nbytes);
        if (k >= 2) folds[s->type][s->op](dst + at * esz, rows, k, m * (esz / fsz), avg);
        else if (k == 1) memcpy(dst + at * esz, rows[0], (size_t)nbytes);
        if (total == 0) break;
    }
    return (PyObject *)out;
}

/* reduce_scatter: each step carries the next piece of every block; rank r folds block r's */
static PyObject *run_reduce_scatter(Core *c, const Step *s, PyArrayObject *x) {
    int n = c->n, me = c->rank, esz = elem_size[s->type], fsz = fold_size[s->type];
    int scale = s->flags & F_SCALE, avg = s->flags & F_AVG;
    int published = scale || !PyArray_ISALIGNED(x); /* as in run_reduce */
    Py_ssize_t size = PyArray_SIZE(x) / n, per = scatter_piece(c, s); /* elements per block */
    PyArrayObject *out = new_like(x, PyArray_DIMS(x)[0] / n);
    if (out == NULL) return NULL;
    const char *src = PyArray_BYTES(x), *rows[MAX_RANKS];
    char *dst = PyArray_BYTES(out);
    for (Py_ssize_t at = 0; at < size || (size == 0 && at == 0); at += per) {
        Py_ssize_t m = min_size(size - at, per), piece = m * esz;
        int64_t step = c->step + 1;
        char *mine = data_of(c, me, step, piece * n);
        for (int j = 0; j < n; ++j) { /* block j's piece, at j * piece; my own if it counts */
            const char *from = src + ((Py_ssize_t)j * size + at) * esz;
            if (scale) scale_copy(mine + j * piece, from, s->type, m, s->factor);
            else if ((j != me || published) && piece) memcpy(mine + j * piece, from, (size_t)piece);
        }
        if (exchange(c, s->fp, PyArray_SIZE(x), s->deadline) < 0) {
            Py_DECREF(out);
            return NULL;
        }
        for (int j = 0; j < n; ++j)
            rows[j] = (j == me && !published) ? src + ((Py_ssize_t)me * size + at) * esz
                                          : data_of(c, j, step, piece * n) + me * piece;
        folds[s->type][s->op](dst + at * esz, rows, n, m * (esz / fsz), avg);
        if (size == 0) break;
    }
    return (PyObject *)out;
}

/* allgather: every rank's x in rank order, into ``given`` (Py_None: a new array, shape[0]
 * times n; a 0-d x is the caller's case) */
static PyObject *run_allgather(Core *c, const Step *s, PyArrayObject *x, PyObject *given) {
    int n = c->n, me = c->rank;
    Py_ssize_t nbytes = PyArray_NBYTES(x);
    PyArrayObject *out;
    if (given == Py_None && PyArray_NDIM(x) > 0) {
        out = new_like(x, PyArray_DIMS(x)[0] * n);
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
    for (Py_ssize_t at = 0; at < nbytes || (nbytes == 0 && at == 0); at += c->chunk) {
        Py_ssize_t m = min_size(nbytes - at, c->chunk);
        int64_t step = c->step + 1;
        if (m) memcpy(data_of(c, me, step, m), src + at, (size_t)m);
        if (exchange(c, s->fp, PyArray_SIZE(x), s->deadline) < 0) {
            Py_DECREF(out);
            return NULL;
        }
        for (int j = 0; j < n && m; ++j)
            memcpy(dst + j * nbytes + at, j == me ? src + at : data_of(c, j, step, m), (size_t)m);
        if (nbytes == 0) break;
    }
    return (PyObject *)out;
}

/* broadcast: the root copies into its line or slot and its result, the others copy out */
static PyObject *run_broadcast(Core *c, const Step *s, PyArrayObject *x) {
    Py_ssize_t nbytes = PyArray_NBYTES(x);
    int root = s->root, is_root = c->rank == root;
    PyArrayObject *out = new_like(x, -1);
    if (out == NULL) return NULL;
    char *dst = PyArray_BYTES(out);
    const char *src = PyArray_BYTES(x);
    for (Py_ssize_t at = 0; at < nbytes || (nbytes == 0 && at == 0); at += c->chunk) {
        Py_ssize_t m = min_size(nbytes - at, c->chunk);
        int64_t step = c->step + 1;
        if (is_root && m) {
            memcpy(data_of(c, root, step, m), src + at, (size_t)m);
            memcpy(dst + at, src + at, (size_t)m);
        }
        if (exchange(c, s->fp, PyArray_SIZE(x), s->deadline) < 0) {
            Py_DECREF(out);
            return NULL;
        }
        if (!is_root && m) memcpy(dst + at, data_of(c, root, step, m), (size_t)m);
        if (nbytes == 0) break;
    }
    return (PyObject *)out;
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
    }
    PyErr_SetString(PyExc_ValueError, "_shmcore: no such kind of call");
    return NULL;
}

/* ---- the methods: parse, then shm_takes / shm_run ------------------------------------------ */

/* A reduction's (type, op, flags, factor): 0, or -1 with ValueError set */
int shm_fold_ok(int type, int op) {
    if (type < 0 || type >= T_COUNT || op < 0 || op >= O_COUNT || folds[type][op] == NULL) {
        PyErr_Format(PyExc_ValueError, "_shmcore: no fold for type %d op %d", type, op);
        return -1;
    }
    return 0;
}

static PyObject *call(Core *c, Step *s, PyObject *x, PyObject *out) {
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
    return call(c, &s, x, Py_None);
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
    return call(c, &s, x, given);
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
    return call(c, &s, x, given);
}

static PyObject *Core_broadcast(Core *c, PyObject *args) {
    PyObject *x;
    long long fp;
    Step s = {.kind = K_BROADCAST};
    if (!PyArg_ParseTuple(args, "OiLd", &x, &s.root, &fp, &s.deadline)) return NULL;
    s.fp = (int64_t)fp;
    return call(c, &s, x, Py_None);
}

static PyObject *Core_announce(Core *c, PyObject *args) {
    long long fp, count;
    double deadline;
    if (!PyArg_ParseTuple(args, "LLd", &fp, &count, &deadline)) return NULL;
    if (exchange(c, (int64_t)fp, (int64_t)count, deadline) < 0) return NULL;
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
    return 0;
}

static void Core_dealloc(Core *c) {
    if (c->base != NULL) PyBuffer_Release(&c->view);
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
    {"serve", (getter)Core_get_serve, (setter)Core_set_serve,
     "called now and then while a wait sleeps (flight-record requests)", NULL},
    {NULL},
};

static PyMethodDef Core_methods[] = {
    {"allreduce", (PyCFunction)Core_allreduce, METH_VARARGS,
     "allreduce(x, type, op, flags, factor, fp, deadline): a new array, or None"},
    {"allreduce_into", (PyCFunction)Core_allreduce_into, METH_VARARGS,
     "allreduce_into(out, x, type, op, flags, factor, fp, deadline): out, or None"},
    {"scan", (PyCFunction)Core_scan, METH_VARARGS,
     "scan(x, type, op, flags, factor, fp, deadline): ranks 0..r (F_EXCLUSIVE: 0..r-1)"},
    {"reduce_scatter", (PyCFunction)Core_reduce_scatter, METH_VARARGS,
     "reduce_scatter(x, type, op, flags, factor, fp, deadline): block rank of the reduction"},
    {"allgather", (PyCFunction)Core_allgather, METH_VARARGS, "allgather(x, out, fp, deadline)"},
    {"broadcast", (PyCFunction)Core_broadcast, METH_VARARGS, "broadcast(x, root, fp, deadline)"},
    {"announce", (PyCFunction)Core_announce, METH_VARARGS, "announce(fp, count, deadline)"},
    {"announced", (PyCFunction)Core_announced, METH_VARARGS, "[(fp, count)] of a step, by rank"},
    {NULL},
};

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

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_shmcore", "fcoll's compiled shared-memory step.", -1, NULL,
};

PyMODINIT_FUNC PyInit__shmcore(void) {
    import_array();
    if (PyType_Ready(&CoreType) < 0 || PyType_Ready(&FastType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Mismatch = PyErr_NewException("fcoll.backends._shmcore.Mismatch", NULL, NULL);
    Timeout = PyErr_NewException("fcoll.backends._shmcore.Timeout", NULL, NULL);
    if (PyModule_AddObjectRef(m, "Core", (PyObject *)&CoreType) < 0 ||
        PyModule_AddObjectRef(m, "Fast", (PyObject *)&FastType) < 0 ||
        PyModule_AddObjectRef(m, "Mismatch", Mismatch) < 0 ||
        PyModule_AddObjectRef(m, "Timeout", Timeout) < 0 ||
        PyModule_AddIntConstant(m, "INLINE", INLINE) < 0 ||
        PyModule_AddIntConstant(m, "PER_RANK", PER_RANK) < 0 ||
        PyModule_AddIntConstant(m, "F_AVG", F_AVG) < 0 ||
        PyModule_AddIntConstant(m, "F_SCALE", F_SCALE) < 0 ||
        PyModule_AddIntConstant(m, "F_EXCLUSIVE", F_EXCLUSIVE) < 0 ||
        PyModule_AddIntConstant(m, "K_REDUCE", K_REDUCE) < 0 ||
        PyModule_AddIntConstant(m, "K_SCAN", K_SCAN) < 0 ||
        PyModule_AddIntConstant(m, "K_REDUCE_SCATTER", K_REDUCE_SCATTER) < 0 ||
        PyModule_AddIntConstant(m, "K_ALLGATHER", K_ALLGATHER) < 0 ||
        PyModule_AddIntConstant(m, "K_BROADCAST", K_BROADCAST) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
