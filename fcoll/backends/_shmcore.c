/* fcoll's compiled shared-memory step (fcoll.backends._shmcore): one call of all_reduce,
 * reduce_scatter, all_gather, broadcast or scan through a group's segment, in C.
 *
 * The segment is an MPI-3 shared window that mpi4py allocated (fcoll/backends/_segment.py);
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
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define CPU_RELAX() __asm__ __volatile__("yield" ::: "memory")
#else
#define CPU_RELAX() ((void)0)
#endif

#define LINE 64
#define PER_RANK 128
#define INLINE 40
#define BLOCK 1024
#define SPIN_SECONDS 20e-6
#define SPIN_OVERSUBSCRIBED 1e-6 /* more ranks than cores: the peer may need this core */
#define YIELD_SECONDS 0.05
#define SERVE_SECONDS 0.01

typedef struct {
    _Atomic int64_t step;
    int64_t fp;
    int64_t count;
    unsigned char data[INLINE];
} Line;

_Static_assert(sizeof(Line) == LINE, "a control line is one cache line");

/* wire types and ops (fcoll/backends/native.py names them) */
enum { T_U8, T_I8, T_U16, T_I16, T_U32, T_I32, T_U64, T_I64, T_F16, T_BF16, T_F32, T_F64,
       T_C64, T_C128, T_COUNT };
enum { O_ADD, O_MUL, O_MIN, O_MAX, O_AND, O_OR, O_XOR, O_COUNT };
enum { F_AVG = 1, F_SCALE = 2, F_INCLUSIVE = 4, F_EXCLUSIVE = 8 };

static PyObject *Mismatch, *Timeout;

typedef struct {
    PyObject_HEAD
    Py_buffer view;
    char *base;
    int n, rank, oversubscribed;
    Py_ssize_t capacity, head, chunk;
    int64_t step;
    PyObject *serve;
} Core;

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

/* ---- float16 and bfloat16, as numpy and ml_dtypes convert them ---------------------------- */
/* Branch-free (selects, no early returns), so that gcc vectorises the half folds at -O3 with
 * the baseline instruction set: the conversions are integer shifts, adds and compares, plus one
 * exact float operation for float16's subnormals (F. Giesen's half<->float conversions, with
 * numpy's NaN payloads). Bit-identical to numpy's npy_halfbits_to_floatbits and
 * npy_floatbits_to_halfbits (round to nearest even) and to ml_dtypes' bfloat16 (round to
 * nearest even, NaN -> quiet NaN of the same sign); tests/test_native_stress.py and
 * scripts/sanitize.sh check them against numpy. */

static inline float bits_f32(uint32_t bits) {
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline uint32_t f32_bits(float f) {
    uint32_t bits;
    memcpy(&bits, &f, 4);
    return bits;
}

static inline uint32_t pick(uint32_t cond, uint32_t a, uint32_t b) { /* cond ? a : b, no branch */
    uint32_t mask = 0u - cond;
    return (a & mask) | (b & ~mask);
}

static inline float f16_to_f32(uint16_t h) {
    uint32_t o = (uint32_t)(h & 0x7fffu) << 13, exp = o & (0x7c00u << 13);
    o += (127u - 15u) << 23;
    uint32_t special = o + ((128u - 16u) << 23);                          /* inf, NaN */
    uint32_t tiny = f32_bits(bits_f32(o + (1u << 23)) - bits_f32(113u << 23)); /* subnormal, 0 */
    o = pick(exp == (0x7c00u << 13), special, pick(exp == 0, tiny, o));
    return bits_f32(o | ((uint32_t)(h & 0x8000u) << 16));
}

static inline uint16_t f32_to_f16(float value) {
    uint32_t f = f32_bits(value), sign = f & 0x80000000u;
    f ^= sign;
    uint32_t nan = 0x7c00u + ((f & 0x007fffffu) >> 13);
    nan += nan == 0x7c00u;                                /* numpy keeps the payload's top */
    uint32_t big = pick(f > 0x7f800000u, nan, 0x7c00u);   /* >= 65536: inf, or NaN */
    uint32_t magic = ((127u - 15u) + (23u - 10u) + 1u) << 23;
    uint32_t small = f32_bits(bits_f32(f) + bits_f32(magic)) - magic; /* < 2^-14: RNE by the FPU */
    uint32_t normal = (f + ((uint32_t)(15 - 127) << 23) + 0xfffu + ((f >> 13) & 1u)) >> 13;
    uint32_t o = pick(f >= (143u << 23), big, pick(f < (113u << 23), small, normal));
    return (uint16_t)(o | (sign >> 16));
}

static inline float bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

static inline uint16_t f32_to_bf16(float value) {
    uint32_t f = f32_bits(value);
    uint32_t rounded = f + 0x7fffu + ((f >> 16) & 1u), quiet = (f & 0x80000000u) | 0x7fc00000u;
    return (uint16_t)(pick((f & 0x7fffffffu) > 0x7f800000u, quiet, rounded) >> 16);
}

/* ---- folds: ((r0 op r1) op r2) ... per element, in blocks that stay in L1 ------------------ */

/* Each fold is built for the baseline of the target (x86-64: SSE2) and, on x86-64 with GCC or
 * clang, once more for AVX2, chosen at load time by the CPU (an ifunc): a wheel runs anywhere
 * and uses AVX2 where it exists (each fold: 2-4x faster at 1 MiB here, float16/bfloat16 most).
 * -ffp-contract=off keeps FMA out of both, so both give numpy's bits. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && defined(__ELF__) && \
    !defined(FCOLL_NO_CLONES) /* scripts/sanitize.sh builds the baseline alone */
#define CLONES __attribute__((target_clones("avx2", "default")))
#else
#define CLONES
#endif

typedef void (*fold_fn)(char *out, const char *const *rows, int n, Py_ssize_t count, int avg);

#define F_ADD(x, y) ((x) + (y))
#define F_MUL(x, y) ((x) * (y))
#define F_AND(x, y) ((x) & (y))
#define F_OR(x, y) ((x) | (y))
#define F_XOR(x, y) ((x) ^ (y))
#define F_IMIN(x, y) ((x) < (y) ? (x) : (y))
#define F_IMAX(x, y) ((x) > (y) ? (x) : (y))
#define F_FMIN(x, y) ((((x) <= (y)) | ((x) != (x))) ? (x) : (y)) /* no branch: vectorised */
#define F_FMAX(x, y) ((((x) >= (y)) | ((x) != (x))) ? (x) : (y))

#define DEFINE_FOLD(NAME, T, OP, DIVIDE)                                                        \
    CLONES static void NAME(char *out_, const char *const *rows, int n, Py_ssize_t count, int avg) {  \
        T *restrict out = (T *)out_;                                                           \
        for (Py_ssize_t s = 0; s < count; s += BLOCK) {                                        \
            Py_ssize_t e = count - s < BLOCK ? count : s + BLOCK;                              \
            const T *restrict a = (const T *)rows[0], *restrict b = (const T *)rows[1];        \
            for (Py_ssize_t i = s; i < e; ++i) out[i] = OP(a[i], b[i]);                        \
            for (int j = 2; j < n; ++j) {                                                      \
                const T *restrict r = (const T *)rows[j];                                      \
                for (Py_ssize_t i = s; i < e; ++i) out[i] = OP(out[i], r[i]);                  \
            }                                                                                  \
            if (DIVIDE && avg) {                                                               \
                T d = (T)n;                                                                    \
                for (Py_ssize_t i = s; i < e; ++i) out[i] = out[i] / d;                        \
            }                                                                                  \
        }                                                                                      \
    }

/* float16 / bfloat16: accumulate a block in float32, round back once; the first two rows are
 * read in one pass, the last one is folded as the block is rounded back (two ranks: one pass) */
#define DEFINE_HALF_FOLD(NAME, LOAD, STORE, OP)                                                \
    CLONES static void NAME(char *out_, const char *const *rows, int n, Py_ssize_t count,     \
                            int avg) {                                                         \
        uint16_t *restrict out = (uint16_t *)out_;                                             \
        float acc[BLOCK], d = (float)n;                                                        \
        for (Py_ssize_t s = 0; s < count; s += BLOCK) {                                        \
            Py_ssize_t m = count - s < BLOCK ? count - s : BLOCK;                              \
            const uint16_t *restrict a = (const uint16_t *)rows[0] + s;                        \
            const uint16_t *restrict z = (const uint16_t *)rows[n - 1] + s;                    \
            uint16_t *restrict o = out + s;                                                    \
            if (n > 2) {                                                                       \
                const uint16_t *restrict b = (const uint16_t *)rows[1] + s;                    \
                for (Py_ssize_t i = 0; i < m; ++i) acc[i] = OP(LOAD(a[i]), LOAD(b[i]));        \
                for (int j = 2; j < n - 1; ++j) {                                              \
                    const uint16_t *restrict r = (const uint16_t *)rows[j] + s;                \
                    for (Py_ssize_t i = 0; i < m; ++i) acc[i] = OP(acc[i], LOAD(r[i]));        \
                }                                                                              \
            } else {                                                                           \
                for (Py_ssize_t i = 0; i < m; ++i) acc[i] = LOAD(a[i]);                        \
            }                                                                                  \
            if (avg) {                                                                         \
                for (Py_ssize_t i = 0; i < m; ++i) o[i] = STORE(OP(acc[i], LOAD(z[i])) / d);   \
            } else {                                                                           \
                for (Py_ssize_t i = 0; i < m; ++i) o[i] = STORE(OP(acc[i], LOAD(z[i])));       \
            }                                                                                  \
        }                                                                                      \
    }

#define INT_FOLDS(U, S, P)                                                                     \
    DEFINE_FOLD(P##_add, U, F_ADD, 0)                                                          \
    DEFINE_FOLD(P##_mul, U, F_MUL, 0)                                                          \
    DEFINE_FOLD(P##_and, U, F_AND, 0)                                                          \
    DEFINE_FOLD(P##_or, U, F_OR, 0)                                                            \
    DEFINE_FOLD(P##_xor, U, F_XOR, 0)                                                          \
    DEFINE_FOLD(P##_umin, U, F_IMIN, 0)                                                        \
    DEFINE_FOLD(P##_umax, U, F_IMAX, 0)                                                        \
    DEFINE_FOLD(P##_smin, S, F_IMIN, 0)                                                        \
    DEFINE_FOLD(P##_smax, S, F_IMAX, 0)

INT_FOLDS(uint8_t, int8_t, k8)
INT_FOLDS(uint16_t, int16_t, k16)
INT_FOLDS(uint32_t, int32_t, k32)
INT_FOLDS(uint64_t, int64_t, k64)
DEFINE_FOLD(f32_add, float, F_ADD, 1)
DEFINE_FOLD(f32_mul, float, F_MUL, 0)
DEFINE_FOLD(f32_min, float, F_FMIN, 0)
DEFINE_FOLD(f32_max, float, F_FMAX, 0)
DEFINE_FOLD(f64_add, double, F_ADD, 1)
DEFINE_FOLD(f64_mul, double, F_MUL, 0)
DEFINE_FOLD(f64_min, double, F_FMIN, 0)
DEFINE_FOLD(f64_max, double, F_FMAX, 0)
DEFINE_HALF_FOLD(h16_add, f16_to_f32, f32_to_f16, F_ADD)
DEFINE_HALF_FOLD(h16_mul, f16_to_f32, f32_to_f16, F_MUL)
DEFINE_HALF_FOLD(h16_min, f16_to_f32, f32_to_f16, F_FMIN)
DEFINE_HALF_FOLD(h16_max, f16_to_f32, f32_to_f16, F_FMAX)
DEFINE_HALF_FOLD(b16_add, bf16_to_f32, f32_to_bf16, F_ADD)
DEFINE_HALF_FOLD(b16_mul, bf16_to_f32, f32_to_bf16, F_MUL)
DEFINE_HALF_FOLD(b16_min, bf16_to_f32, f32_to_bf16, F_FMIN)
DEFINE_HALF_FOLD(b16_max, bf16_to_f32, f32_to_bf16, F_FMAX)

/* the fold of each (type, op); NULL where fcoll never asks for it */
static fold_fn folds[T_COUNT][O_COUNT] = {
    [T_U8] = {k8_add, k8_mul, k8_umin, k8_umax, k8_and, k8_or, k8_xor},
    [T_I8] = {k8_add, k8_mul, k8_smin, k8_smax, k8_and, k8_or, k8_xor},
    [T_U16] = {k16_add, k16_mul, k16_umin, k16_umax, k16_and, k16_or, k16_xor},
    [T_I16] = {k16_add, k16_mul, k16_smin, k16_smax, k16_and, k16_or, k16_xor},
    [T_U32] = {k32_add, k32_mul, k32_umin, k32_umax, k32_and, k32_or, k32_xor},
    [T_I32] = {k32_add, k32_mul, k32_smin, k32_smax, k32_and, k32_or, k32_xor},
    [T_U64] = {k64_add, k64_mul, k64_umin, k64_umax, k64_and, k64_or, k64_xor},
    [T_I64] = {k64_add, k64_mul, k64_smin, k64_smax, k64_and, k64_or, k64_xor},
    [T_F16] = {h16_add, h16_mul, h16_min, h16_max},
    [T_BF16] = {b16_add, b16_mul, b16_min, b16_max},
    [T_F32] = {f32_add, f32_mul, f32_min, f32_max},
    [T_F64] = {f64_add, f64_mul, f64_min, f64_max},
    [T_C64] = {f32_add},  /* complex sum: the real and imaginary parts, as floats */
    [T_C128] = {f64_add},
};
static const int elem_size[T_COUNT] = {1, 1, 2, 2, 4, 4, 8, 8, 2, 2, 4, 8, 8, 16};
static const int fold_size[T_COUNT] = {1, 1, 2, 2, 4, 4, 8, 8, 2, 2, 4, 8, 4, 8};

/* premul_sum: each rank's data scaled at copy-in (x * factor in its own type, as numpy) */
static void scale_copy(char *dst, const char *src, int type, Py_ssize_t count, double factor) {
    if (type == T_F32) {
        float f = (float)factor, *d = (float *)dst;
        const float *s = (const float *)src;
        for (Py_ssize_t i = 0; i < count; ++i) d[i] = s[i] * f;
    } else {
        double *d = (double *)dst;
        const double *s = (const double *)src;
        for (Py_ssize_t i = 0; i < count; ++i) d[i] = s[i] * factor;
    }
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

/* ---- arguments ---------------------------------------------------------------------------- */

typedef struct {
    PyArrayObject *x;
    int type, op, flags;
    int64_t fp;
    double deadline, factor;
} Args;

static int parse(PyObject *args, Args *a, int with_op) {
    PyObject *x;
    long long fp;
    a->type = a->op = a->flags = 0;
    a->factor = 1.0;
    if (with_op) {
        if (!PyArg_ParseTuple(args, "OiiidLd", &x, &a->type, &a->op, &a->flags, &a->factor, &fp,
                              &a->deadline))
            return -1;
        if (a->type < 0 || a->type >= T_COUNT || a->op < 0 || a->op >= O_COUNT ||
            folds[a->type][a->op] == NULL) {
            PyErr_Format(PyExc_ValueError, "_shmcore: no fold for type %d op %d", a->type, a->op);
            return -1;
        }
    } else if (!PyArg_ParseTuple(args, "OLd", &x, &fp, &a->deadline)) {
        return -1;
    }
    a->fp = (int64_t)fp;
    if (!PyArray_Check(x) || !PyArray_IS_C_CONTIGUOUS((PyArrayObject *)x))
        return 1; /* not this module's case: the caller takes the numpy path */
    a->x = (PyArrayObject *)x;
    return 0;
}

static PyArrayObject *new_like(PyArrayObject *x, npy_intp first) {
    npy_intp dims[NPY_MAXDIMS];
    int nd = PyArray_NDIM(x);
    if (nd > 0) memcpy(dims, PyArray_DIMS(x), sizeof(npy_intp) * (size_t)nd); /* 0-d: NULL */
    if (nd > 0 && first >= 0) dims[0] = first;
    PyArray_Descr *d = PyArray_DESCR(x);
    Py_INCREF(d);
    return (PyArrayObject *)PyArray_NewFromDescr(&PyArray_Type, d, nd, dims, NULL, NULL, 0, NULL);
}

/* ---- the collectives ---------------------------------------------------------------------- */

static PyObject *reduce_steps(Core *c, Args *a, PyArrayObject *out, Py_ssize_t total,
                              const char *src, char *dst, int scan) {
    int fsz = fold_size[a->type], esz = elem_size[a->type];
    int avg = a->flags & F_AVG;
    /* this rank's own row: its input (the slot its peers read is then left to them), or the
     * copy it published when that copy is what counts (scaled) or the input is unaligned */
    int scale = a->flags & F_SCALE, published = scale || !PyArray_ISALIGNED(a->x);
    Py_ssize_t all_bytes = total * esz;
    if (dst < src + all_bytes && src < dst + all_bytes) published = 1; /* in place: its slot */
    Py_ssize_t per = c->chunk / esz, count_all = total;
    const char *rows[256];
    for (Py_ssize_t at = 0; at < total || (total == 0 && at == 0); at += per) {
        Py_ssize_t m = total - at < per ? total - at : per, nbytes = m * esz;
        int64_t step = c->step + 1;
        char *mine = data_of(c, c->rank, step, nbytes);
        if (scale) scale_copy(mine, src + at * esz, a->type, m, a->factor);
        else if (nbytes) memcpy(mine, src + at * esz, (size_t)nbytes);
        if (exchange(c, a->fp, count_all, a->deadline) < 0) return NULL;
        int k = scan ? (a->flags & F_EXCLUSIVE ? c->rank : c->rank + 1) : c->n;
        for (int j = 0; j < k; ++j)
            rows[j] = (j == c->rank && !published) ? src + at * esz : data_of(c, j, step, nbytes);
        Py_ssize_t units = m * (esz / fsz);
        if (k >= 2) folds[a->type][a->op](dst + at * esz, rows, k, units, avg);
        else if (k == 1) memcpy(dst + at * esz, rows[0], (size_t)nbytes);
        if (total == 0) break;
    }
    Py_INCREF(out);
    return (PyObject *)out;
}

static PyObject *Core_allreduce(Core *c, PyObject *args) {
    Args a;
    int r = parse(args, &a, 1);
    if (r != 0) return r < 0 ? NULL : Py_NewRef(Py_None);
    Py_ssize_t nbytes = PyArray_NBYTES(a.x);
    if ((nbytes < c->chunk ? nbytes : c->chunk) > c->capacity || c->n > 256) Py_RETURN_NONE;
    PyArrayObject *out = new_like(a.x, -1);
    if (out == NULL) return NULL;
    PyObject *res = reduce_steps(c, &a, out, PyArray_SIZE(a.x), PyArray_BYTES(a.x),
                                 PyArray_BYTES(out), 0);
    Py_DECREF(out);
    return res;
}

/* allreduce_into(out, x, type, op, flags, factor, fp, deadline): allreduce into out (writable,
 * C-contiguous, x's dtype and size; it may be x itself): out, or None where allreduce's is */
static PyObject *Core_allreduce_into(Core *c, PyObject *args) {
    Py_ssize_t nargs = PyTuple_GET_SIZE(args);
    if (nargs < 1) {
        PyErr_SetString(PyExc_TypeError, "_shmcore.allreduce_into: expected out first");
        return NULL;
    }
    PyObject *given = PyTuple_GET_ITEM(args, 0), *rest = PyTuple_GetSlice(args, 1, nargs);
    if (rest == NULL) return NULL;
    Args a;
    int r = parse(rest, &a, 1);
    Py_DECREF(rest);
    if (r != 0) return r < 0 ? NULL : Py_NewRef(Py_None);
    Py_ssize_t nbytes = PyArray_NBYTES(a.x);
    if ((nbytes < c->chunk ? nbytes : c->chunk) > c->capacity || c->n > 256) Py_RETURN_NONE;
    if (!PyArray_Check(given) || !PyArray_IS_C_CONTIGUOUS((PyArrayObject *)given) ||
        !PyArray_ISWRITEABLE((PyArrayObject *)given) ||
        PyArray_NBYTES((PyArrayObject *)given) != nbytes ||
        !PyArray_EquivTypes(PyArray_DESCR((PyArrayObject *)given), PyArray_DESCR(a.x))) {
        PyErr_SetString(PyExc_ValueError, "_shmcore.allreduce_into: out must be a writable "
                                          "C-contiguous array of x's dtype and size");
        return NULL;
    }
    PyArrayObject *out = (PyArrayObject *)given;
    return reduce_steps(c, &a, out, PyArray_SIZE(a.x), PyArray_BYTES(a.x), PyArray_BYTES(out), 0);
}

/* scan: rank r folds ranks 0..r (inclusive) or 0..r-1 (exclusive; rank 0's result is left to
 * the caller, who fills in the identity) */
static PyObject *Core_scan(Core *c, PyObject *args) {
    Args a;
    int r = parse(args, &a, 1);
    if (r != 0) return r < 0 ? NULL : Py_NewRef(Py_None);
    Py_ssize_t nbytes = PyArray_NBYTES(a.x);
    if ((nbytes < c->chunk ? nbytes : c->chunk) > c->capacity || c->n > 256) Py_RETURN_NONE;
    PyArrayObject *out = new_like(a.x, -1);
    if (out == NULL) return NULL;
    PyObject *res = reduce_steps(c, &a, out, PyArray_SIZE(a.x), PyArray_BYTES(a.x),
                                 PyArray_BYTES(out), 1);
    Py_DECREF(out);
    return res;
}

static PyObject *Core_reduce_scatter(Core *c, PyObject *args) {
    Args a;
    int r = parse(args, &a, 1);
    if (r != 0) return r < 0 ? NULL : Py_NewRef(Py_None);
    int n = c->n, me = c->rank, esz = elem_size[a.type], fsz = fold_size[a.type];
    int scale = a.flags & F_SCALE, avg = a.flags & F_AVG;
    int published = scale || !PyArray_ISALIGNED(a.x); /* as in reduce_steps */
    if (PyArray_NDIM(a.x) == 0 || PyArray_DIMS(a.x)[0] % n || n > 256) Py_RETURN_NONE;
    Py_ssize_t size = PyArray_SIZE(a.x) / n; /* elements per block */
    Py_ssize_t per = c->chunk / n / esz;
    if (per < 1) per = 1;
    if ((size < per ? size : per) * n * esz > c->capacity) Py_RETURN_NONE;
    PyArrayObject *out = new_like(a.x, PyArray_DIMS(a.x)[0] / n);
    if (out == NULL) return NULL;
    const char *src = PyArray_BYTES(a.x);
    char *dst = PyArray_BYTES(out);
    const char *rows[256];
    for (Py_ssize_t at = 0; at < size || (size == 0 && at == 0); at += per) {
        Py_ssize_t m = size - at < per ? size - at : per, piece = m * esz;
        int64_t step = c->step + 1;
        char *mine = data_of(c, me, step, piece * n);
        for (int j = 0; j < n; ++j) { /* block j's piece, at j * piece; my own if it counts */
            const char *from = src + ((Py_ssize_t)j * size + at) * esz;
            if (scale) scale_copy(mine + j * piece, from, a.type, m, a.factor);
            else if ((j != me || published) && piece) memcpy(mine + j * piece, from, (size_t)piece);
        }
        if (exchange(c, a.fp, PyArray_SIZE(a.x), a.deadline) < 0) {
            Py_DECREF(out);
            return NULL;
        }
        for (int j = 0; j < n; ++j)
            rows[j] = (j == me && !published) ? src + ((Py_ssize_t)me * size + at) * esz
                                          : data_of(c, j, step, piece * n) + me * piece;
        folds[a.type][a.op](dst + at * esz, rows, n, m * (esz / fsz), avg);
        if (size == 0) break;
    }
    return (PyObject *)out;
}

/* allgather(x, out, fp, deadline): every rank's x in rank order, into out (None: a new array,
 * shape[0] times n) */
static PyObject *Core_allgather(Core *c, PyObject *args) {
    PyObject *x, *given;
    long long fp;
    double deadline;
    if (!PyArg_ParseTuple(args, "OOLd", &x, &given, &fp, &deadline)) return NULL;
    if (!PyArray_Check(x) || !PyArray_IS_C_CONTIGUOUS((PyArrayObject *)x)) Py_RETURN_NONE;
    PyArrayObject *xa = (PyArrayObject *)x;
    int n = c->n, me = c->rank;
    Py_ssize_t nbytes = PyArray_NBYTES(xa);
    if ((nbytes < c->chunk ? nbytes : c->chunk) > c->capacity) Py_RETURN_NONE;
    PyArrayObject *out;
    if (given == Py_None) {
        if (PyArray_NDIM(xa) == 0) Py_RETURN_NONE;
        out = new_like(xa, PyArray_DIMS(xa)[0] * n);
        if (out == NULL) return NULL;
    } else if (PyArray_Check(given) && PyArray_IS_C_CONTIGUOUS((PyArrayObject *)given) &&
               PyArray_ISWRITEABLE((PyArrayObject *)given) &&
               PyArray_NBYTES((PyArrayObject *)given) == n * nbytes) {
        out = (PyArrayObject *)Py_NewRef(given);
    } else {
        PyErr_SetString(PyExc_ValueError, "_shmcore.allgather: out must be a writable "
                                          "C-contiguous array of n times x's bytes");
        return NULL;
    }
    const char *src = PyArray_BYTES(xa);
    char *dst = PyArray_BYTES(out);
    for (Py_ssize_t at = 0; at < nbytes || (nbytes == 0 && at == 0); at += c->chunk) {
        Py_ssize_t m = nbytes - at < c->chunk ? nbytes - at : c->chunk;
        int64_t step = c->step + 1;
        if (m) memcpy(data_of(c, me, step, m), src + at, (size_t)m);
        if (exchange(c, (int64_t)fp, PyArray_SIZE(xa), deadline) < 0) {
            Py_DECREF(out);
            return NULL;
        }
        for (int j = 0; j < n && m; ++j)
            memcpy(dst + j * nbytes + at, j == me ? src + at : data_of(c, j, step, m), (size_t)m);
        if (nbytes == 0) break;
    }
    return (PyObject *)out;
}

static PyObject *Core_broadcast(Core *c, PyObject *args) {
    PyObject *x;
    long long fp;
    double deadline;
    int root;
    if (!PyArg_ParseTuple(args, "OiLd", &x, &root, &fp, &deadline)) return NULL;
    if (!PyArray_Check(x) || root < 0 || root >= c->n) Py_RETURN_NONE;
    PyArrayObject *xa = (PyArrayObject *)x;
    Py_ssize_t nbytes = PyArray_NBYTES(xa);
    int is_root = c->rank == root;
    if ((nbytes < c->chunk ? nbytes : c->chunk) > c->capacity ||
        (is_root && !PyArray_IS_C_CONTIGUOUS(xa)))
        Py_RETURN_NONE;
    PyArrayObject *out = new_like(xa, -1);
    if (out == NULL) return NULL;
    char *dst = PyArray_BYTES(out);
    const char *src = PyArray_BYTES(xa);
    for (Py_ssize_t at = 0; at < nbytes || (nbytes == 0 && at == 0); at += c->chunk) {
        Py_ssize_t m = nbytes - at < c->chunk ? nbytes - at : c->chunk;
        int64_t step = c->step + 1;
        if (is_root && m) {
            memcpy(data_of(c, root, step, m), src + at, (size_t)m);
            memcpy(dst + at, src + at, (size_t)m);
        }
        if (exchange(c, (int64_t)fp, PyArray_SIZE(xa), deadline) < 0) {
            Py_DECREF(out);
            return NULL;
        }
        if (!is_root && m) memcpy(dst + at, data_of(c, root, step, m), (size_t)m);
        if (nbytes == 0) break;
    }
    return (PyObject *)out;
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

static PyTypeObject CoreType = {
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
    if (PyType_Ready(&CoreType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Mismatch = PyErr_NewException("fcoll.backends._shmcore.Mismatch", NULL, NULL);
    Timeout = PyErr_NewException("fcoll.backends._shmcore.Timeout", NULL, NULL);
    if (PyModule_AddObjectRef(m, "Core", (PyObject *)&CoreType) < 0 ||
        PyModule_AddObjectRef(m, "Mismatch", Mismatch) < 0 ||
        PyModule_AddObjectRef(m, "Timeout", Timeout) < 0 ||
        PyModule_AddIntConstant(m, "INLINE", INLINE) < 0 ||
        PyModule_AddIntConstant(m, "PER_RANK", PER_RANK) < 0 ||
        PyModule_AddIntConstant(m, "F_AVG", F_AVG) < 0 ||
        PyModule_AddIntConstant(m, "F_SCALE", F_SCALE) < 0 ||
        PyModule_AddIntConstant(m, "F_EXCLUSIVE", F_EXCLUSIVE) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
