/* The compiled core's folds (fcoll.backends._shmcore): float16/bfloat16 conversions, the
 * binary kernel of every (type, op), vectorised, and the run of a reduction program (the
 * canonical tree, fcoll/backends/tree/order.py) over them, block by block (see _shmcore.c's
 * comment and setup.py). */
#define NO_IMPORT_ARRAY
#include "_shmcore.h"

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

/* ---- kernels: one op of a program, out = a op b per element, out possibly a or b ---------- */

/* Each kernel is built for the baseline of the target (x86-64: SSE2) and, on x86-64 with GCC
 * or clang, once more for AVX2, chosen at load time by the CPU (an ifunc): a wheel runs
 * anywhere and uses AVX2 where it exists (2-4x faster at 1 MiB here, float16/bfloat16 most).
 * -ffp-contract=off keeps FMA out of both, so both give numpy's bits. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && defined(__ELF__) && \
    !defined(FCOLL_NO_CLONES) /* scripts/sanitize.sh builds the baseline alone */
#define CLONES __attribute__((target_clones("avx2", "default")))
#else
#define CLONES
#endif
#if defined(__GNUC__) || defined(__clang__)
#define LOOP static inline __attribute__((always_inline)) /* inlined into each clone */
#else
#define LOOP static inline
#endif

#define F_ADD(x, y) ((x) + (y))
#define F_MUL(x, y) ((x) * (y))
#define F_AND(x, y) ((x) & (y))
#define F_OR(x, y) ((x) | (y))
#define F_XOR(x, y) ((x) ^ (y))
#define F_IMIN(x, y) ((x) < (y) ? (x) : (y))
#define F_IMAX(x, y) ((x) > (y) ? (x) : (y))
#define F_FMIN(x, y) ((((x) <= (y)) | ((x) != (x))) ? (x) : (y)) /* no branch: vectorised */
#define F_FMAX(x, y) ((((x) >= (y)) | ((x) != (x))) ? (x) : (y))
#define KEEP(x) (x)

/* A program accumulates in place (dst = dst op x, dst = x op dst): each case of aliasing gets
 * its own loop over restrict pointers, so that each vectorises without an overlap check at
 * run time (which would send an exact alias to the scalar loop). NAME##_3 runs two ops as
 * one pass, o = x op (a op b) (``right``) or (a op b) op x, o possibly x; NAME##_4 three,
 * o = (a op b) op (c op d), o none of them (fold_program). */
#define DEFINE_PAIR(NAME, T, OP)                                                                \
    LOOP void NAME##_new(T *restrict o, const T *restrict a, const T *restrict b, Py_ssize_t m) { \
        for (Py_ssize_t i = 0; i < m; ++i) o[i] = OP(a[i], b[i]);                               \
    }                                                                                           \
    LOOP void NAME##_left(T *restrict o, const T *restrict b, Py_ssize_t m) { /* o is a */      \
        for (Py_ssize_t i = 0; i < m; ++i) o[i] = OP(o[i], b[i]);                               \
    }                                                                                           \
    LOOP void NAME##_right(T *restrict o, const T *restrict a, Py_ssize_t m) { /* o is b */     \
        for (Py_ssize_t i = 0; i < m; ++i) o[i] = OP(a[i], o[i]);                               \
    }                                                                                           \
    CLONES static void NAME(char *o, const char *a, const char *b, Py_ssize_t m) {              \
        T *x = (T *)o;                                                                          \
        if (o != a && o != b) NAME##_new(x, (const T *)a, (const T *)b, m);                     \
        else if (a != b && o == a) NAME##_left(x, (const T *)b, m);                              \
        else if (a != b) NAME##_right(x, (const T *)a, m);                                      \
        else for (Py_ssize_t i = 0; i < m; ++i) x[i] = OP(x[i], x[i]);                          \
    }                                                                                           \
    LOOP void NAME##_tri(T *restrict o, const T *restrict x, const T *restrict a,               \
                         const T *restrict b, Py_ssize_t m, int right) {                        \
        if (right) for (Py_ssize_t i = 0; i < m; ++i) o[i] = OP(x[i], OP(a[i], b[i]));          \
        else for (Py_ssize_t i = 0; i < m; ++i) o[i] = OP(OP(a[i], b[i]), x[i]);                \
    }                                                                                           \
    LOOP void NAME##_tri_in(T *restrict o, const T *restrict a, const T *restrict b,            \
                            Py_ssize_t m, int right) { /* o is x */                             \
        if (right) for (Py_ssize_t i = 0; i < m; ++i) o[i] = OP(o[i], OP(a[i], b[i]));          \
        else for (Py_ssize_t i = 0; i < m; ++i) o[i] = OP(OP(a[i], b[i]), o[i]);                \
    }                                                                                           \
    CLONES static void NAME##_3(char *o, const char *x, const char *a, const char *b,           \
                                Py_ssize_t m, int right) {                                      \
        if (o == x) NAME##_tri_in((T *)o, (const T *)a, (const T *)b, m, right);                \
        else NAME##_tri((T *)o, (const T *)x, (const T *)a, (const T *)b, m, right);            \
    }                                                                                           \
    CLONES static void NAME##_4(char *o_, const char *a_, const char *b_, const char *c_,       \
                                const char *d_, Py_ssize_t m) {                                 \
        T *restrict o = (T *)o_;                                                                \
        const T *restrict a = (const T *)a_, *restrict b = (const T *)b_;                       \
        const T *restrict c = (const T *)c_, *restrict d = (const T *)d_;                       \
        for (Py_ssize_t i = 0; i < m; ++i) o[i] = OP(OP(a[i], b[i]), OP(c[i], d[i]));           \
    }

/* float16 / bfloat16: the tree in float32. An operand is a row (uint16_t, converted as it is
 * loaded: LOAD) or a scratch buffer (float: KEEP); the result a scratch buffer, or for the
 * last op the output, rounded back once (divided by n first for avg). ``how``: H_A32, H_B32
 * (a, b is a scratch buffer), H_OUT (dst is the output), H_AVG; a scratch result may be a or b. */
enum { H_A32 = 1, H_B32 = 2, H_OUT = 4, H_AVG = 8 };

#define HALF_LOOPS(NAME, TA, GA, TB, GB, STORE, OP)                                             \
    LOOP void NAME(float *restrict o, const TA *restrict a, const TB *restrict b, Py_ssize_t m) { \
        for (Py_ssize_t i = 0; i < m; ++i) o[i] = OP(GA(a[i]), GB(b[i]));                       \
    }                                                                                           \
    LOOP void NAME##_out(uint16_t *restrict o, const TA *restrict a, const TB *restrict b,      \
                         Py_ssize_t m, int avg, float d) {                                      \
        if (avg) for (Py_ssize_t i = 0; i < m; ++i) o[i] = STORE(OP(GA(a[i]), GB(b[i])) / d);   \
        else for (Py_ssize_t i = 0; i < m; ++i) o[i] = STORE(OP(GA(a[i]), GB(b[i])));           \
    }                                                                                           \
    LOOP void NAME##_left(float *restrict o, const TB *restrict b, Py_ssize_t m) {              \
        for (Py_ssize_t i = 0; i < m; ++i) o[i] = OP(o[i], GB(b[i]));                           \
    }                                                                                           \
    LOOP void NAME##_right(float *restrict o, const TA *restrict a, Py_ssize_t m) {             \
        for (Py_ssize_t i = 0; i < m; ++i) o[i] = OP(GA(a[i]), o[i]);                           \
    }

/* _rr: a and b rows, _rf: a row and b float, ... (the left and right loops of _rr, _ff unused) */
#define DEFINE_HALF(NAME, LOAD, STORE, OP)                                                      \
    HALF_LOOPS(NAME##_rr, uint16_t, LOAD, uint16_t, LOAD, STORE, OP)                            \
    HALF_LOOPS(NAME##_rf, uint16_t, LOAD, float, KEEP, STORE, OP)                               \
    HALF_LOOPS(NAME##_fr, float, KEEP, uint16_t, LOAD, STORE, OP)                               \
    HALF_LOOPS(NAME##_ff, float, KEEP, float, KEEP, STORE, OP)                                  \
    CLONES static void NAME(void *o, const void *a, const void *b, Py_ssize_t m, int how,       \
                            float d) {                                                          \
        int fa = how & H_A32, fb = how & H_B32;                                                 \
        if (how & H_OUT) {                                                                      \
            uint16_t *y = (uint16_t *)o;                                                        \
            int avg = how & H_AVG;                                                              \
            if (fa && fb) NAME##_ff_out(y, (const float *)a, (const float *)b, m, avg, d);      \
            else if (fa) NAME##_fr_out(y, (const float *)a, (const uint16_t *)b, m, avg, d);    \
            else if (fb) NAME##_rf_out(y, (const uint16_t *)a, (const float *)b, m, avg, d);    \
            else NAME##_rr_out(y, (const uint16_t *)a, (const uint16_t *)b, m, avg, d);         \
            return;                                                                             \
        }                                                                                       \
        float *x = (float *)o;                                                                  \
        if (o == a && o == b) {                                                                 \
            for (Py_ssize_t i = 0; i < m; ++i) x[i] = OP(x[i], x[i]);                           \
        } else if (o == a) { /* a is scratch */                                                 \
            if (fb) NAME##_ff_left(x, (const float *)b, m);                                     \
            else NAME##_fr_left(x, (const uint16_t *)b, m);                                     \
        } else if (o == b) {                                                                    \
            if (fa) NAME##_ff_right(x, (const float *)a, m);                                    \
            else NAME##_rf_right(x, (const uint16_t *)a, m);                                    \
        } else if (fa && fb) NAME##_ff(x, (const float *)a, (const float *)b, m);               \
        else if (fa) NAME##_fr(x, (const float *)a, (const uint16_t *)b, m);                    \
        else if (fb) NAME##_rf(x, (const uint16_t *)a, (const float *)b, m);                    \
        else NAME##_rr(x, (const uint16_t *)a, (const uint16_t *)b, m);                         \
    }

#define INT_PAIRS(U, S, P)                                                                      \
    DEFINE_PAIR(P##_add, U, F_ADD)                                                              \
    DEFINE_PAIR(P##_mul, U, F_MUL)                                                              \
    DEFINE_PAIR(P##_and, U, F_AND)                                                              \
    DEFINE_PAIR(P##_or, U, F_OR)                                                                \
    DEFINE_PAIR(P##_xor, U, F_XOR)                                                              \
    DEFINE_PAIR(P##_umin, U, F_IMIN)                                                            \
    DEFINE_PAIR(P##_umax, U, F_IMAX)                                                            \
    DEFINE_PAIR(P##_smin, S, F_IMIN)                                                            \
    DEFINE_PAIR(P##_smax, S, F_IMAX)

INT_PAIRS(uint8_t, int8_t, k8)
INT_PAIRS(uint16_t, int16_t, k16)
INT_PAIRS(uint32_t, int32_t, k32)
INT_PAIRS(uint64_t, int64_t, k64)
DEFINE_PAIR(f32_add, float, F_ADD)
DEFINE_PAIR(f32_mul, float, F_MUL)
DEFINE_PAIR(f32_min, float, F_FMIN)
DEFINE_PAIR(f32_max, float, F_FMAX)
DEFINE_PAIR(f64_add, double, F_ADD)
DEFINE_PAIR(f64_mul, double, F_MUL)
DEFINE_PAIR(f64_min, double, F_FMIN)
DEFINE_PAIR(f64_max, double, F_FMAX)
DEFINE_HALF(h16_add, f16_to_f32, f32_to_f16, F_ADD)
DEFINE_HALF(h16_mul, f16_to_f32, f32_to_f16, F_MUL)
DEFINE_HALF(h16_min, f16_to_f32, f32_to_f16, F_FMIN)
DEFINE_HALF(h16_max, f16_to_f32, f32_to_f16, F_FMAX)
DEFINE_HALF(b16_add, bf16_to_f32, f32_to_bf16, F_ADD)
DEFINE_HALF(b16_mul, bf16_to_f32, f32_to_bf16, F_MUL)
DEFINE_HALF(b16_min, bf16_to_f32, f32_to_bf16, F_FMIN)
DEFINE_HALF(b16_max, bf16_to_f32, f32_to_bf16, F_FMAX)

/* avg of float32/float64 (and their complex pairs): the result divided by n in its own type */
CLONES static void divide_f32(char *o, Py_ssize_t m, float d) {
    float *x = (float *)o;
    for (Py_ssize_t i = 0; i < m; ++i) x[i] = x[i] / d;
}

CLONES static void divide_f64(char *o, Py_ssize_t m, double d) {
    double *x = (double *)o;
    for (Py_ssize_t i = 0; i < m; ++i) x[i] = x[i] / d;
}

typedef void (*half_fn)(void *o, const void *a, const void *b, Py_ssize_t m, int how, float d);
typedef void (*tri_fn)(char *o, const char *x, const char *a, const char *b, Py_ssize_t m,
                       int right);
typedef void (*quad_fn)(char *o, const char *a, const char *b, const char *c, const char *d,
                        Py_ssize_t m);

/* the kernel of each (type, op); NULL where fcoll never asks for it */
static const pair_fn pairs[T_COUNT][O_COUNT] = {
    [T_U8] = {k8_add, k8_mul, k8_umin, k8_umax, k8_and, k8_or, k8_xor},
    [T_I8] = {k8_add, k8_mul, k8_smin, k8_smax, k8_and, k8_or, k8_xor},
    [T_U16] = {k16_add, k16_mul, k16_umin, k16_umax, k16_and, k16_or, k16_xor},
    [T_I16] = {k16_add, k16_mul, k16_smin, k16_smax, k16_and, k16_or, k16_xor},
    [T_U32] = {k32_add, k32_mul, k32_umin, k32_umax, k32_and, k32_or, k32_xor},
    [T_I32] = {k32_add, k32_mul, k32_smin, k32_smax, k32_and, k32_or, k32_xor},
    [T_U64] = {k64_add, k64_mul, k64_umin, k64_umax, k64_and, k64_or, k64_xor},
    [T_I64] = {k64_add, k64_mul, k64_smin, k64_smax, k64_and, k64_or, k64_xor},
    [T_F32] = {f32_add, f32_mul, f32_min, f32_max},
    [T_F64] = {f64_add, f64_mul, f64_min, f64_max},
    [T_C64] = {f32_add},  /* complex sum: the real and imaginary parts, as floats */
    [T_C128] = {f64_add},
};
static const half_fn halves[2][O_COUNT] = { /* T_F16, T_BF16 */
    {h16_add, h16_mul, h16_min, h16_max},
    {b16_add, b16_mul, b16_min, b16_max},
};
/* the same, two ops in one pass */
static const tri_fn tris[T_COUNT][O_COUNT] = {
    [T_U8] = {k8_add_3, k8_mul_3, k8_umin_3, k8_umax_3, k8_and_3, k8_or_3, k8_xor_3},
    [T_I8] = {k8_add_3, k8_mul_3, k8_smin_3, k8_smax_3, k8_and_3, k8_or_3, k8_xor_3},
    [T_U16] = {k16_add_3, k16_mul_3, k16_umin_3, k16_umax_3, k16_and_3, k16_or_3, k16_xor_3},
    [T_I16] = {k16_add_3, k16_mul_3, k16_smin_3, k16_smax_3, k16_and_3, k16_or_3, k16_xor_3},
    [T_U32] = {k32_add_3, k32_mul_3, k32_umin_3, k32_umax_3, k32_and_3, k32_or_3, k32_xor_3},
    [T_I32] = {k32_add_3, k32_mul_3, k32_smin_3, k32_smax_3, k32_and_3, k32_or_3, k32_xor_3},
    [T_U64] = {k64_add_3, k64_mul_3, k64_umin_3, k64_umax_3, k64_and_3, k64_or_3, k64_xor_3},
    [T_I64] = {k64_add_3, k64_mul_3, k64_smin_3, k64_smax_3, k64_and_3, k64_or_3, k64_xor_3},
    [T_F32] = {f32_add_3, f32_mul_3, f32_min_3, f32_max_3},
    [T_F64] = {f64_add_3, f64_mul_3, f64_min_3, f64_max_3},
    [T_C64] = {f32_add_3},
    [T_C128] = {f64_add_3},
};
/* and three */
static const quad_fn quads[T_COUNT][O_COUNT] = {
    [T_U8] = {k8_add_4, k8_mul_4, k8_umin_4, k8_umax_4, k8_and_4, k8_or_4, k8_xor_4},
    [T_I8] = {k8_add_4, k8_mul_4, k8_smin_4, k8_smax_4, k8_and_4, k8_or_4, k8_xor_4},
    [T_U16] = {k16_add_4, k16_mul_4, k16_umin_4, k16_umax_4, k16_and_4, k16_or_4, k16_xor_4},
    [T_I16] = {k16_add_4, k16_mul_4, k16_smin_4, k16_smax_4, k16_and_4, k16_or_4, k16_xor_4},
    [T_U32] = {k32_add_4, k32_mul_4, k32_umin_4, k32_umax_4, k32_and_4, k32_or_4, k32_xor_4},
    [T_I32] = {k32_add_4, k32_mul_4, k32_smin_4, k32_smax_4, k32_and_4, k32_or_4, k32_xor_4},
    [T_U64] = {k64_add_4, k64_mul_4, k64_umin_4, k64_umax_4, k64_and_4, k64_or_4, k64_xor_4},
    [T_I64] = {k64_add_4, k64_mul_4, k64_smin_4, k64_smax_4, k64_and_4, k64_or_4, k64_xor_4},
    [T_F32] = {f32_add_4, f32_mul_4, f32_min_4, f32_max_4},
    [T_F64] = {f64_add_4, f64_mul_4, f64_min_4, f64_max_4},
    [T_C64] = {f32_add_4},
    [T_C128] = {f64_add_4},
};
const int elem_size[T_COUNT] = {1, 1, 2, 2, 4, 4, 8, 8, 2, 2, 4, 8, 8, 16};
const int fold_size[T_COUNT] = {1, 1, 2, 2, 4, 4, 8, 8, 2, 2, 4, 8, 4, 8};

static inline int is_half(int type) { return type == T_F16 || type == T_BF16; }

int fold_exists(int type, int op) {
    if (type < 0 || type >= T_COUNT || op < 0 || op >= O_COUNT) return 0;
    return is_half(type) ? halves[type - T_F16][op] != NULL : pairs[type][op] != NULL;
}

pair_fn pair_of(int type, int op) { return is_half(type) ? NULL : pairs[type][op]; }

/* ---- programs: the tree, block by block -------------------------------------------------- */

/* Scratch buffers: float32 for the halves (every temp), else the fold type (temp 0 is the
 * output itself, as in order.execute: it only ever holds the result's running left operand) */
static inline int scratch_buffers(const Program *p, int type) {
    return is_half(type) ? p->temps : (p->temps > 1 ? p->temps - 1 : 0);
}

static inline Py_ssize_t block_of(Py_ssize_t count) { return count < BLOCK ? count : BLOCK; }

size_t fold_scratch(const Program *p, int type, Py_ssize_t count) {
    size_t width = is_half(type) ? sizeof(float) : (size_t)fold_size[type];
    return (size_t)scratch_buffers(p, type) * (size_t)block_of(count) * width;
}

/* Whether scratch buffer t is not read from op ``from`` on before it is written again */
static int dead_from(const Program *p, int t, int from) {
    for (int j = from; j < p->k; ++j) {
        const int32_t *r = p->ops + 3 * j;
        if (r[1] == t || r[2] == t) return 0;
        if (r[0] == t) return 1;
    }
    return 1;
}

/* Which ops run as one pass, no store of a scratch buffer between (fuse[i]; greedy, in
 * order): FUSE_3 where op i's result is a buffer that op i + 1 alone reads, once (o = x op
 * (a op b)); FUSE_4 where ops i and i + 1 make two buffers that op i + 2 alone combines
 * (o = (a op b) op (c op d)). The tree of 4 is one pass, of 8 three, where the rank-order
 * fold made n - 1 (and the op-by-op tree 10-20 % slower than it at n = 4 to 8, in L2 or L3).
 * fold_program may still run them op by op (an output that is an operand too; float16 and
 * bfloat16, whose conversions bound their folds, are not fused). */
void program_plan(Program *p, int n) {
    for (int i = 0; i < p->k; ++i) p->fuse[i] = 0;
    for (int i = 0; i + 1 < p->k; ++i) {
        const int32_t *o = p->ops + 3 * i, *q = o + 3, *r = q + 3;
        int t = o[0], u = q[0];
        if (t < n) continue; /* OUT */
        if (i + 2 < p->k && u >= n && u != t && q[1] != t && q[2] != t && r[1] != r[2] &&
            (r[1] == t || r[1] == u) && (r[2] == t || r[2] == u) &&
            (r[0] == t || dead_from(p, t, i + 3)) && (r[0] == u || dead_from(p, u, i + 3))) {
            p->fuse[i] = FUSE_4;
            i += 2;
        } else if ((q[1] == t) != (q[2] == t) && (q[0] == t || dead_from(p, t, i + 2))) {
            p->fuse[i++] = FUSE_3;
        }
    }
}

/* operand v of block ``at`` (bytes in): a row, the output, or scratch buffer t (``stride``
 * bytes each; for the fold types temp 0 is the output itself) */
static inline char *operand(int v, int n, const char *const *rows, char *out, Py_ssize_t at,
                            char *scratch, size_t stride, int half) {
    if (v == OUT) return out + at;
    if (v < n) return (char *)rows[v] + at; /* (a row is never written) */
    if (half) return scratch + (size_t)(v - n) * stride;
    return v == n ? out + at : scratch + (size_t)(v - n - 1) * stride;
}

void fold_program(const Program *p, int type, int op, int avg, int n, const char *const *rows,
                  char *out, Py_ssize_t count, char *scratch) {
    int fsz = fold_size[type], half = is_half(type);
    if (p->k == 0) { /* a row is the result, or there is none */
        if (p->result >= 0 && count) memcpy(out, rows[p->result], (size_t)(count * fsz));
        return;
    }
    size_t stride = (size_t)block_of(count) * (half ? sizeof(float) : (size_t)fsz);
    pair_fn pair = half ? NULL : pairs[type][op];
    tri_fn tri = half ? NULL : tris[type][op];
    quad_fn quad = half ? NULL : quads[type][op];
    half_fn hop = half ? halves[type - T_F16][op] : NULL;
    int divide = avg && (type == T_F32 || type == T_F64 || type == T_C64 || type == T_C128);
    float d = (float)n;
#define AT(v) operand(v, n, rows, out, at, scratch, stride, half)
    for (Py_ssize_t s = 0; s < count; s += BLOCK) {
        Py_ssize_t m = block_of(count - s), at = s * fsz;
        for (int i = 0; i < p->k; ++i) {
            const int32_t *o = p->ops + 3 * i, *q = o + 3;
            if (p->fuse[i] == FUSE_3 && !half) { /* q: dst = x op t or t op x, t = a op b (o) */
                int right = q[2] == o[0];
                char *to = AT(q[0]), *a = AT(o[1]), *b = AT(o[2]);
                if (to != a && to != b) {
                    tri(to, AT(right ? q[1] : q[2]), a, b, m, right);
                    ++i;
                    continue;
                } /* else: the two ops, one by one */
            } else if (p->fuse[i] == FUSE_4 && !half) { /* q + 3: dst = t op u (or u op t) */
                const int32_t *l = q[3 + 1] == o[0] ? o : q, *r = l == o ? q : o;
                char *to = AT(q[3]), *a = AT(l[1]), *b = AT(l[2]), *c = AT(r[1]), *e = AT(r[2]);
                if (to != a && to != b && to != c && to != e) {
                    quad(to, a, b, c, e, m);
                    i += 2;
                    continue;
                }
            }
            if (half)
                hop(AT(o[0]), AT(o[1]), AT(o[2]), m,
                    (o[1] >= n ? H_A32 : 0) | (o[2] >= n ? H_B32 : 0) |
                        (o[0] == OUT ? H_OUT | (avg ? H_AVG : 0) : 0), d);
            else
                pair(AT(o[0]), AT(o[1]), AT(o[2]), m);
        }
        if (divide && fsz == 4) divide_f32(out + at, m, d);
        else if (divide) divide_f64(out + at, m, (double)n);
    }
#undef AT
}

/* premul_sum: each rank's data scaled at copy-in (x * factor in its own type, as numpy) */
void scale_copy(char *dst, const char *src, int type, Py_ssize_t count, double factor) {
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

