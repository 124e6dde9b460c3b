/* Shared by the compiled shared-memory core's files (fcoll.backends._shmcore): the segment's
 * layout, the core's state and programs, the folds and the step description. See _shmcore.c. */
#ifndef FCOLL_SHMCORE_H
#define FCOLL_SHMCORE_H
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#define PY_ARRAY_UNIQUE_SYMBOL fcoll_shmcore_ARRAY_API /* one numpy C-API table for the files */
#include <numpy/arrayobject.h>

#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#define LINE 64
#define PER_RANK 192 /* two step Lines (by parity), then the Wake line */
#define WAKE_AT 128  /* the Wake line's offset in a rank's control area */
#define INLINE 40
#define BLOCK 1024
#define MAX_RANKS 256

typedef struct {
    _Atomic int64_t step;
    int64_t fp;
    int64_t count;
    unsigned char data[INLINE];
} Line;

_Static_assert(sizeof(Line) == LINE, "a control line is one cache line");

/* Where waiters sleep on a rank's arrival (_shmcore.c, "Waiting"): ``word`` (the futex word,
 * written by the owner alone: the low 32 bits of its last step) and ``sleepers`` (how many
 * waiters are asleep or about to sleep on ``word``; any rank adds and subtracts). */
typedef struct {
    _Atomic uint32_t word;
    _Atomic uint32_t sleepers;
    unsigned char unused[LINE - 8];
} Wake;

_Static_assert(sizeof(Wake) == LINE && sizeof(_Atomic uint32_t) == 4, "a wake line is one cache line");
_Static_assert(ATOMIC_INT_LOCK_FREE == 2, "the wake word is shared between processes: lock-free");
_Static_assert(WAKE_AT + LINE == PER_RANK && 2 * LINE <= WAKE_AT, "a rank's control area holds its lines");

/* wire types and ops (fcoll/backends/native.py names them) */
enum { T_U8, T_I8, T_U16, T_I16, T_U32, T_I32, T_U64, T_I64, T_F16, T_BF16, T_F32, T_F64,
       T_C64, T_C128, T_COUNT };
enum { O_ADD, O_MUL, O_MIN, O_MAX, O_AND, O_OR, O_XOR, O_COUNT };
enum { F_AVG = 1, F_SCALE = 2, F_INCLUSIVE = 4, F_EXCLUSIVE = 8 };
/* the kinds of call the core takes */
enum { K_REDUCE, K_SCAN, K_REDUCE_SCATTER, K_ALLGATHER, K_BROADCAST, K_ALLTOALL, K_COUNT };

/* A reduction order as a program (fcoll/backends/tree/order.py, `Program`): ``k`` ops
 * (dst, a, b) in ``ops`` (3 k ints, malloc'ed), each dst = a op b elementwise; an operand is
 * rank j's row (0..n-1), scratch buffer t (n + t, t < temps) or OUT (the result: a dst
 * only). With ops ``result`` is OUT; without, the row that is the result, or NONE. */
enum { OUT = -1, NONE = -2 };
enum { P_ALLREDUCE, P_SCAN, P_EXSCAN, P_COUNT }; /* a rank's programs (Core.programs) */
#define MAX_TEMPS 16
typedef struct {
    int k, result, temps;
    int32_t *ops;
    unsigned char *fuse; /* k flags: op i and the next (FUSE_3) or two (FUSE_4), one pass */
} Program;
enum { FUSE_3 = 1, FUSE_4 = 2 }; /* program_plan */

typedef struct {
    PyObject_HEAD
    Py_buffer view;
    char *base;
    int n, rank, oversubscribed, programmed;
    Py_ssize_t capacity, head, chunk;
    int64_t step;
    PyObject *serve;
    Program programs[P_COUNT]; /* this rank's: allreduce (and reduce_scatter), scan, exscan */
    /* all-to-alls' blocks read straight from the peers' inputs (_shmalltoall.c, "Direct"):
     * ``direct`` 1 (where the platform has it), 0 (off), 2 (the reads report failure: tests);
     * ``pid`` this process; ``nonce`` a value only this process's memory holds */
    int direct;
    int64_t pid;
    uint64_t nonce;
} Core;

/* Whether this build reads other processes' memory (Linux's process_vm_readv, the cross-memory
 * attach MPICH and Open MPI use on one node): the all-to-alls' direct reads (_shmalltoall.c) */
#if defined(__linux__) && !defined(FCOLL_NO_DIRECT)
#define FCOLL_DIRECT 1
#else
#define FCOLL_DIRECT 0
#endif
static inline int shm_direct_available(void) { return FCOLL_DIRECT; }
#define DIRECT_MIN ((Py_ssize_t)64 << 10) /* bytes in the largest block from which they read */

/* What one call does: its kind, fold (type, op, flags, factor), root, fingerprint, deadline */
typedef struct {
    int kind, type, op, flags, root;
    double factor;
    int64_t fp;
    double deadline;
} Step;

/* _shmfold.c. Counts are of fold units (fold_size bytes: a complex is two). */
typedef void (*pair_fn)(char *out, const char *a, const char *b, Py_ssize_t count);
extern const int elem_size[T_COUNT], fold_size[T_COUNT];
int fold_exists(int type, int op); /* 1 where the core folds (type, op) */
/* out = a op b (out may be a or b itself); NULL for float16/bfloat16 and where none exists */
pair_fn pair_of(int type, int op);
/* plan ``p``'s passes (its ``fuse``, k bytes the caller allocated) */
void program_plan(Program *p, int n);
/* the scratch bytes fold_program needs for ``p`` on ``count`` units (or fewer) */
size_t fold_scratch(const Program *p, int type, Py_ssize_t count);
/* ``p`` on ``count`` units of every rank's row (``rows``: n pointers) into ``out`` (nothing
 * where it has no result), block by block; ``avg``: the float result divided by n */
void fold_program(const Program *p, int type, int op, int avg, int n, const char *const *rows,
                  char *out, Py_ssize_t count, char *scratch);
void scale_copy(char *dst, const char *src, int type, Py_ssize_t count, double factor);


/* Where things are in the segment (_shmcore.c's layout) */
static inline Line *line_of(Core *c, int rank, int64_t step) {
    return (Line *)(c->base + (Py_ssize_t)rank * PER_RANK + (step & 1) * LINE);
}

static inline char *slot_of(Core *c, int rank, int64_t step) {
    return c->base + c->head + ((step & 1) * c->n + rank) * c->capacity;
}

/* Where rank j's data of this step is: its line (small steps) or its slot. */
static inline char *data_of(Core *c, int j, int64_t step, Py_ssize_t nbytes) {
    return nbytes <= INLINE ? (char *)line_of(c, j, step)->data : slot_of(c, j, step);
}

static inline Py_ssize_t min_size(Py_ssize_t a, Py_ssize_t b) { return a < b ? a : b; }

extern PyObject *Mismatch, *Timeout; /* _shmcore.c */
extern PyTypeObject CoreType, FastType;

/* 1 where the core takes ``x`` for ``s`` (layout, sizes the segment holds), else 0: the
 * caller then takes the numpy path, before any step */
int shm_takes(Core *c, const Step *s, PyArrayObject *x);
/* the call (after shm_takes; with the GIL, which it releases for the steps and takes back): a
 * new array, NULL with Mismatch(step), Timeout or another error set; ``out``: allgather's or
 * allreduce's given result (x itself: in place) or Py_None */
PyObject *shm_run(Core *c, const Step *s, PyArrayObject *x, PyObject *out);
/* _shmcore.c, for the other files' calls: one step (publish fp and count, wait, compare;
 * without the GIL, ``*ts``): STEP_OK or what failed; a new array of x's dtype and shape (its
 * first dim ``first`` where >= 0); the GIL back and ``out`` or NULL with failed's error;
 * shm_takes then shm_run, or None where the core does not take x */
int shm_exchange(Core *c, int64_t fp, int64_t count, double deadline, PyThreadState **ts);
PyArrayObject *shm_new_like(PyArrayObject *x, npy_intp first);
PyObject *shm_finish(Core *c, PyThreadState *ts, int failed, PyArrayObject *out);
PyObject *shm_call(Core *c, Step *s, PyObject *x, PyObject *out);
/* with the GIL, after a step failed: its error set (Mismatch, Timeout; STEP_ERROR: already set) */
void shm_raise_failed(Core *c, int failed);

/* A kind of call a file of its own serves: shm_takes's and shm_run's case for it, the Core
 * methods and module functions it adds (tables ending in {NULL}), joined at module init */
typedef struct {
    int (*takes)(Core *c, const Step *s, PyArrayObject *x);
    PyObject *(*run)(Core *c, const Step *s, PyArrayObject *x);
    PyMethodDef *core_methods;
    PyMethodDef *module_methods;
} KindFile;
/* _shmalltoall.c: K_ALLTOALL (an even all_to_all_single); the Core methods alltoall,
 * alltoallv, alltoallv_rows; the module functions pack_chunks, unpack_chunks */
extern const KindFile shm_alltoall_kind;

/* 0 where the core folds (type, op), else -1 with ValueError set */
int shm_fold_ok(int type, int op);

/* What a step's loop hands back (raise_failed, or _shmxla.c's handler, makes the error) */
enum { STEP_OK = 0, STEP_ERROR = -1, STEP_TIMEOUT = 1, STEP_MISMATCH = 2 };
/* A reduction's steps (run_reduce's loop; the GIL released, ``*ts`` this thread's saved
 * state, or ``ts`` NULL on a thread without Python: its waits then never take the GIL):
 * ``total`` elements of ``src`` folded by ``prog`` into ``dst`` (which may be ``src``:
 * then ``published``), ``scratch`` of shm_scratch's bytes. STEP_OK or what failed. */
int shm_reduce_steps(Core *c, const Step *s, const Program *prog, const char *src, char *dst,
                     Py_ssize_t total, int published, char *scratch, PyThreadState **ts);
/* one step without data: publish (fp, count), wait for every rank, compare (as above) */
int shm_announce(Core *c, int64_t fp, int64_t count, double deadline, PyThreadState **ts);
/* the scratch bytes shm_reduce_steps needs for an all-reduce of ``total`` elements */
size_t shm_scratch(Core *c, const Step *s, Py_ssize_t total);

/* _shmxla.c: the XLA FFI handler's module functions (xla_handler, xla_setup, xla_channel,
 * xla_records) */
extern PyMethodDef xla_methods[];

#endif
