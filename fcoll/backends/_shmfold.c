/* The compiled core's folds (fcoll.backends._shmcore): float16/bfloat16 conversions and the
 * rank-order fold of every (type, op), vectorised (see _shmcore.c's comment and setup.py). */
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
fold_fn folds[T_COUNT][O_COUNT] = {
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
const int elem_size[T_COUNT] = {1, 1, 2, 2, 4, 4, 8, 8, 2, 2, 4, 8, 8, 16};
const int fold_size[T_COUNT] = {1, 1, 2, 2, 4, 4, 8, 8, 2, 2, 4, 8, 4, 8};

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

