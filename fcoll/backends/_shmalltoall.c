/* All-to-all through the segment (fcoll.backends.shm_alltoall): the Core methods ``alltoall``
 * (even splits), ``alltoallv`` (counts in bytes, blocks packed in rank order) and
 * ``alltoallv_rows`` (all_to_all_single's uneven splits whole: their metadata in one step, its
 * check, then the data), the module functions ``pack_chunks``/``unpack_chunks``, and
 * shm_takes's and shm_run's K_ALLTOALL: all handed to _shmcore.c in ``shm_alltoall_kind``.
 *
 * Each data step carries the next piece of every block a rank sends (piece j at j * per of its
 * line or slot); after the step's arrival every rank copies piece ``me`` of every peer's slot
 * into its result, and its own block straight from its input. ``per`` (shm_alltoall_piece) is
 * all of the largest block where n of them fit a chunk, else a chunk's n-th, so every rank
 * takes the same steps from ``most``, the largest block of any rank.
 *
 * alltoallv_rows's first step publishes 2n + 1 int64 words: this rank's input split sizes,
 * its output split sizes (-1: not given) and a word for its rows' shape and dtype. Every rank
 * then reads every rank's words and reaches the same verdict: the data steps, the rows or
 * dtypes differ (the caller's pickled exchange names them), or a rank expects other sizes
 * than its peers send (the first such pair, for the caller's ValueError) — so ranks that
 * disagree fail together and none reads garbage. The words stay readable until every rank
 * reached the next step (the segment's parity rule).
 */
#define NO_IMPORT_ARRAY
#include "_shmcore.h"

#if FCOLL_DIRECT
#include <sys/uio.h>
#endif

/* Direct: from DIRECT_MIN bytes in the largest block, a rank reads its block of every peer's
 * input straight into its result (process_vm_readv, one copy: what MPICH's large messages do
 * on one node), instead of every block passing through the segment (two copies, and the
 * segment's pages, which measured 3-4x slower than private ones at times on a VM). Two
 * steps: the first publishes (pid, the nonce's address, the nonce, the address of the block
 * for each rank) and waits for every rank; the reads; the second publishes whether this
 * rank's reads all succeeded (and its nonce matched: the pid is the process that published
 * it) and waits, so no input is released while a peer may read it. Where any rank's reads
 * failed (no permission, another pid namespace, c->direct 2), every rank then takes the
 * segment's steps, the inputs still in place, and stops trying on this segment. The steps announce DIRECT_COUNT(count), so a
 * rank configured otherwise fails the step's comparison instead of reading garbage. */
#define DIRECT_COUNT(count) (-(count) - 1)

/* bytes of each block an all-to-all step carries, its largest block ``most`` bytes: all of it
 * where n of them fit a chunk, else a chunk's n-th (64-byte aligned pieces) */
static Py_ssize_t alltoall_piece(Core *c, Py_ssize_t most) {
    Py_ssize_t per = c->chunk / c->n;
    if (per > 64) per &= ~(Py_ssize_t)63;
    if (most < per) per = most;
    return per < 1 ? 1 : per;
}

/* all-to-all's steps (the GIL released, ``*ts``): block j of ``src`` (``scount[j]`` bytes at
 * ``sdispl[j]``) goes to rank j, rank j's block for this rank into ``dst`` at ``rdispl[j]``
 * (``rcount[j]`` bytes); ``most``, the largest block of any rank (the same on every rank),
 * sets the steps: each carries the next piece (shm_alltoall_piece) of every block, this rank's
 * own copied straight from ``src``. ``count``: what the steps announce. */
static int alltoall_steps(Core *c, const Step *s, const char *src, const Py_ssize_t *scount,
                          const Py_ssize_t *sdispl, char *dst, const Py_ssize_t *rcount,
                          const Py_ssize_t *rdispl, Py_ssize_t most, int64_t count,
                          PyThreadState **ts) {
    int n = c->n, me = c->rank, failed = STEP_OK;
    Py_ssize_t per = alltoall_piece(c, most);
    for (Py_ssize_t at = 0; at < most || (most == 0 && at == 0); at += per) {
        int64_t step = c->step + 1;
        char *mine = data_of(c, me, step, per * n);
        for (int j = 0; j < n; ++j) {
            Py_ssize_t m = min_size(scount[j] - at, per);
            if (j != me && m > 0) memcpy(mine + j * per, src + sdispl[j] + at, (size_t)m);
        }
        if ((failed = shm_exchange(c, s->fp, count, s->deadline, ts)) != STEP_OK) break;
        for (int j = 0; j < n; ++j) {
            Py_ssize_t m = min_size(rcount[j] - at, per);
            const char *from = j == me ? src + sdispl[me] + at : data_of(c, j, step, per * n) + me * per;
            if (m > 0) memcpy(dst + rdispl[j] + at, from, (size_t)m);
        }
        if (most == 0) break;
    }
    return failed;
}

#if FCOLL_DIRECT
/* Read ``nbytes`` of block ``me`` from the peer that published ``w`` into ``into``, with its
 * nonce: 1 where both arrived whole and the nonce is the published one, else 0 */
static int read_peer(const int64_t *w, int me, char *into, Py_ssize_t nbytes) {
    uint64_t nonce = 0;
    struct iovec local[2] = {{&nonce, sizeof nonce}, {into, (size_t)nbytes}};
    struct iovec remote[2] = {{(void *)(uintptr_t)w[1], sizeof nonce},
                              {(void *)(uintptr_t)w[3 + me], (size_t)nbytes}};
    ssize_t got = process_vm_readv((pid_t)w[0], local, 2, remote, 2, 0);
    return got == (ssize_t)(sizeof nonce + (size_t)nbytes) && nonce == (uint64_t)w[2];
}
#endif

/* The direct reads (see "Direct" above; the GIL released, ``*ts``): STEP_OK with ``*done`` 1
 * where every rank's reads succeeded, 0 where the caller must take the steps; else what
 * failed. Arguments as alltoall_steps'. */
static int alltoall_direct(Core *c, const Step *s, const char *src, const Py_ssize_t *sdispl,
                           char *dst, const Py_ssize_t *rcount, const Py_ssize_t *rdispl,
                           int64_t count, PyThreadState **ts, int *done) {
    int n = c->n, me = c->rank, ok = c->direct == 1, failed;
    Py_ssize_t width = (Py_ssize_t)(3 + n) * 8;
    int64_t *mine = (int64_t *)data_of(c, me, c->step + 1, width);
    mine[0] = c->pid;
    mine[1] = (int64_t)(uintptr_t)&c->nonce;
    mine[2] = (int64_t)c->nonce;
    for (int j = 0; j < n; ++j) mine[3 + j] = (int64_t)(uintptr_t)(src + sdispl[j]);
    if ((failed = shm_exchange(c, s->fp, DIRECT_COUNT(count), s->deadline, ts)) != STEP_OK)
        return failed;
    int64_t step = c->step;
    for (int j = 0; j < n && ok; ++j) {
        if (j == me || rcount[j] == 0) continue;
#if FCOLL_DIRECT
        ok = read_peer((const int64_t *)data_of(c, j, step, width), me, dst + rdispl[j], rcount[j]);
#endif
    }
    if (ok && rcount[me] > 0) memcpy(dst + rdispl[me], src + sdispl[me], (size_t)rcount[me]);
    *(int64_t *)data_of(c, me, step + 1, 8) = ok;
    if ((failed = shm_exchange(c, s->fp, DIRECT_COUNT(count), s->deadline, ts)) != STEP_OK)
        return failed;
    *done = 1;
    for (int j = 0; j < n; ++j) *done &= *(const int64_t *)data_of(c, j, step + 1, 8) == 1;
    return STEP_OK;
}

/* An all-to-all's data: the direct reads where the core has them and the largest block
 * (``most``, alike on every rank) reaches DIRECT_MIN, else (or where they failed on any rank)
 * the segment's steps. Arguments as alltoall_steps'. */
static int alltoall_move(Core *c, const Step *s, const char *src, const Py_ssize_t *scount,
                         const Py_ssize_t *sdispl, char *dst, const Py_ssize_t *rcount,
                         const Py_ssize_t *rdispl, Py_ssize_t most, int64_t count,
                         PyThreadState **ts) {
    if (c->direct && most >= DIRECT_MIN && (Py_ssize_t)(3 + c->n) * 8 <= c->capacity) {
        int done = 0, failed = alltoall_direct(c, s, src, sdispl, dst, rcount, rdispl, count, ts,
                                               &done);
        if (failed != STEP_OK || done) return failed;
        c->direct = 0; /* every rank alike (all saw the same verdicts): stop trying */
    }
    return alltoall_steps(c, s, src, scount, sdispl, dst, rcount, rdispl, most, count, ts);
}

/* all_to_all_single with even splits: block j (x's rows split n ways) to rank j, a new array */
static PyObject *alltoall_run(Core *c, const Step *s, PyArrayObject *x) {
    int n = c->n;
    PyArrayObject *out = shm_new_like(x, -1);
    if (out == NULL) return NULL;
    Py_ssize_t block = PyArray_NBYTES(x) / n, counts[MAX_RANKS], displs[MAX_RANKS];
    for (int j = 0; j < n; ++j) {
        counts[j] = block;
        displs[j] = j * block;
    }
    const char *src = PyArray_BYTES(x);
    char *dst = PyArray_BYTES(out);
    PyThreadState *ts = PyEval_SaveThread(); /* no Python object touched until finish */
    int failed = alltoall_move(c, s, src, counts, displs, dst, counts, displs, block,
                               PyArray_SIZE(x), &ts);
    return shm_finish(c, ts, failed, out);
}

/* shm_takes's K_ALLTOALL: x C-contiguous, its rows split n ways, a step's pieces in the segment */
static int alltoall_takes(Core *c, const Step *s, PyArrayObject *x) {
    (void)s;
    if (!PyArray_IS_C_CONTIGUOUS(x) || PyArray_NDIM(x) == 0 || PyArray_DIMS(x)[0] % c->n) return 0;
    Py_ssize_t block = PyArray_NBYTES(x) / c->n;
    return min_size(block, alltoall_piece(c, block)) * c->n <= c->capacity;
}

static PyObject *Core_alltoall(Core *c, PyObject *args) {
    PyObject *x;
    long long fp;
    Step s = {.kind = K_ALLTOALL};
    if (!PyArg_ParseTuple(args, "OLd", &x, &fp, &s.deadline)) return NULL;
    s.fp = (int64_t)fp;
    return shm_call(c, &s, x, Py_None);
}

/* n byte counts or offsets from an int64 array: 0, or -1 with ValueError set */
static int sizes_from(Core *c, PyObject *given, Py_ssize_t *sizes, const char *name) {
    if (!PyArray_Check(given) || PyArray_TYPE((PyArrayObject *)given) != NPY_INT64 ||
        PyArray_NDIM((PyArrayObject *)given) != 1 || PyArray_DIMS((PyArrayObject *)given)[0] != c->n ||
        !PyArray_IS_C_CONTIGUOUS((PyArrayObject *)given)) {
        PyErr_Format(PyExc_ValueError, "_shmcore.alltoallv: expected %s to be an int64 array of "
                                       "%d entries", name, c->n);
        return -1;
    }
    const int64_t *v = (const int64_t *)PyArray_DATA((PyArrayObject *)given);
    for (int j = 0; j < c->n; ++j) {
        if (v[j] < 0) {
            PyErr_Format(PyExc_ValueError, "_shmcore.alltoallv: expected %s >= 0", name);
            return -1;
        }
        sizes[j] = (Py_ssize_t)v[j];
    }
    return 0;
}

/* alltoallv(x, scounts, out, rcounts, most, fp, count, deadline): bytes of the C-contiguous x
 * to the C-contiguous writable out, as MPI_Alltoallv on bytes with the blocks packed in rank
 * order (counts: int64 arrays of n); ``most``: the largest block of any rank (every rank's
 * alike). out, or None where the segment does not hold a step. */
static PyObject *Core_alltoallv(Core *c, PyObject *args) {
    PyObject *x, *given, *sc, *rc;
    long long fp, count;
    Py_ssize_t most, scount[MAX_RANKS], sdispl[MAX_RANKS], rcount[MAX_RANKS], rdispl[MAX_RANKS];
    Step s = {.kind = K_ALLTOALL};
    if (!PyArg_ParseTuple(args, "OOOOnLLd", &x, &sc, &given, &rc, &most, &fp, &count, &s.deadline))
        return NULL;
    if (c->n > MAX_RANKS || sizes_from(c, sc, scount, "scounts") < 0 ||
        sizes_from(c, rc, rcount, "rcounts") < 0)
        return NULL;
    Py_ssize_t sends = 0, recvs = 0;
    for (int j = 0; j < c->n; ++j) {
        sdispl[j] = sends;
        rdispl[j] = recvs;
        sends += scount[j];
        recvs += rcount[j];
        if (scount[j] > most || rcount[j] > most) {
            PyErr_SetString(PyExc_ValueError, "_shmcore.alltoallv: a block exceeds most");
            return NULL;
        }
    }
    if (!PyArray_Check(x) || !PyArray_IS_C_CONTIGUOUS((PyArrayObject *)x) || !PyArray_Check(given) ||
        !PyArray_IS_C_CONTIGUOUS((PyArrayObject *)given) ||
        !PyArray_ISWRITEABLE((PyArrayObject *)given) || sends > PyArray_NBYTES((PyArrayObject *)x) ||
        recvs > PyArray_NBYTES((PyArrayObject *)given)) {
        PyErr_SetString(PyExc_ValueError, "_shmcore.alltoallv: expected C-contiguous x and a "
                                          "writable C-contiguous out that hold their blocks");
        return NULL;
    }
    if (min_size(most, alltoall_piece(c, most)) * c->n > c->capacity) Py_RETURN_NONE;
    s.fp = (int64_t)fp;
    const char *src = PyArray_BYTES((PyArrayObject *)x);
    char *dst = PyArray_BYTES((PyArrayObject *)given);
    PyThreadState *ts = PyEval_SaveThread();
    int failed = alltoall_move(c, &s, src, scount, sdispl, dst, rcount, rdispl, most,
                               (int64_t)count, &ts);
    return shm_finish(c, ts, failed, (PyArrayObject *)Py_NewRef(given));
}

/* ``seq`` (a sequence of n ints >= 0) into ``v``: 0, or -1 without an error set where it is
 * not one (the caller then leaves the call to its full path) */
static int words_from(PyObject *seq, int n, int64_t *v) {
    PyObject *fast = PySequence_Fast(seq, "");
    if (fast == NULL) {
        PyErr_Clear();
        return -1;
    }
    int ok = PySequence_Fast_GET_SIZE(fast) == n;
    for (int j = 0; ok && j < n; ++j) {
        PyObject *item = PySequence_Fast_GET_ITEM(fast, j);
        long long value = PyLong_Check(item) ? PyLong_AsLongLong(item) : -1;
        if (value == -1 && PyErr_Occurred()) PyErr_Clear();
        ok = value >= 0;
        v[j] = value;
    }
    Py_DECREF(fast);
    return ok ? 0 : -1;
}

/* The first disagreement in every rank's words (``w``: n rows of 2n + 1): rank p expects
 * ``outs_p[q]`` rows from q, which sends ``ins_q[p]``; 1 and the pair, or 0 */
static int disagreement(const int64_t *const *w, int n, int *p, int *q) {
    for (int a = 0; a < n; ++a) {
        if (w[a][n] < 0) continue; /* rank a gave no output sizes */
        for (int b = 0; b < n; ++b) {
            if (w[a][n + b] != w[b][a]) {
                *p = a;
                *q = b;
                return 1;
            }
        }
    }
    return 0;
}

/* alltoallv_rows(x, ins, outs, code, meta_fp, fp, ceiling, deadline): all_to_all_single with uneven
 * splits (rows of the C-contiguous x, ``ins`` rows to each rank; ``outs`` the rows expected
 * from each, or None; ``code`` a word for x's rows and dtype, equal where they agree). The
 * result array; None where the core does not take the call (before any step: sizes that are
 * not n ints >= 0 summing to x.shape[0], or a segment too small for the words); else a tuple
 * every rank gets alike: ("rows",) where codes differ, ("disagree", p, q, expected, sent),
 * ("grow", most, received) where the data needs a larger segment (most: the largest block in
 * bytes; received: the rows from each rank), ("mpi", most, received) where n blocks of ``most``
 * bytes reach ``ceiling`` (-1: none): MPI's copies are faster there. */
static PyObject *Core_alltoallv_rows(Core *c, PyObject *args) {
    PyObject *x, *ins_given, *outs_given;
    long long code, meta_fp, fp;
    Py_ssize_t ceiling;
    Step s = {.kind = K_ALLTOALL};
    if (!PyArg_ParseTuple(args, "OOOLLLnd", &x, &ins_given, &outs_given, &code, &meta_fp, &fp,
                          &ceiling, &s.deadline))
        return NULL;
    int n = c->n, me = c->rank, width = 2 * c->n + 1;
    if (n > MAX_RANKS || !PyArray_Check(x) || PyArray_NDIM((PyArrayObject *)x) == 0 ||
        !PyArray_IS_C_CONTIGUOUS((PyArrayObject *)x) || (Py_ssize_t)width * 8 > c->capacity)
        Py_RETURN_NONE;
    PyArrayObject *a = (PyArrayObject *)x;
    int64_t words[2 * MAX_RANKS + 1], total = 0;
    if (words_from(ins_given, n, words) < 0) Py_RETURN_NONE;
    for (int j = 0; j < n; ++j) total += words[j];
    if (total != PyArray_DIMS(a)[0]) Py_RETURN_NONE;
    if (outs_given == Py_None) {
        for (int j = 0; j < n; ++j) words[n + j] = -1;
    } else if (words_from(outs_given, n, words + n) < 0) {
        Py_RETURN_NONE;
    }
    words[2 * n] = (int64_t)code;
    Py_ssize_t row = PyArray_DIMS(a)[0] ? PyArray_NBYTES(a) / PyArray_DIMS(a)[0]
                                       : PyArray_ITEMSIZE(a);
    for (int d = 1; PyArray_DIMS(a)[0] == 0 && d < PyArray_NDIM(a); ++d) row *= PyArray_DIMS(a)[d];
    /* the words' step */
    int64_t step = c->step + 1;
    memcpy(data_of(c, me, step, width * 8), words, (size_t)width * 8);
    PyThreadState *ts = PyEval_SaveThread();
    int failed = shm_exchange(c, (int64_t)meta_fp, width, s.deadline, &ts);
    PyEval_RestoreThread(ts);
    if (failed != STEP_OK) {
        shm_raise_failed(c, failed);
        return NULL;
    }
    const int64_t *w[MAX_RANKS];
    int64_t most = 0, received = 0;
    for (int j = 0; j < n; ++j) w[j] = (const int64_t *)data_of(c, j, step, width * 8);
    for (int j = 0; j < n; ++j) {
        if (w[j][2 * n] != w[0][2 * n]) return Py_BuildValue("(s)", "rows");
        for (int k = 0; k < n; ++k) most = w[j][k] > most ? w[j][k] : most;
    }
    int p, q;
    if (disagreement(w, n, &p, &q))
        return Py_BuildValue("(siiLL)", "disagree", p, q, (long long)w[p][n + q], (long long)w[q][p]);
    Py_ssize_t scount[MAX_RANKS], sdispl[MAX_RANKS], rcount[MAX_RANKS], rdispl[MAX_RANKS];
    for (int j = 0; j < n; ++j) {
        scount[j] = (Py_ssize_t)words[j] * row;
        rcount[j] = (Py_ssize_t)w[j][me] * row;
        sdispl[j] = j ? sdispl[j - 1] + scount[j - 1] : 0;
        rdispl[j] = j ? rdispl[j - 1] + rcount[j - 1] : 0;
        received += w[j][me];
    }
    most *= row;
    int to_mpi = ceiling >= 0 && most * n >= ceiling;
    if (to_mpi || min_size(most, alltoall_piece(c, most)) * n > c->capacity) {
        PyObject *rows = PyList_New(n);
        for (int j = 0; rows != NULL && j < n; ++j) {
            PyObject *v = PyLong_FromLongLong((long long)w[j][me]);
            if (v == NULL) Py_CLEAR(rows);
            else PyList_SET_ITEM(rows, j, v);
        }
        return rows == NULL ? NULL : Py_BuildValue("(snN)", to_mpi ? "mpi" : "grow", (Py_ssize_t)most,
                                                   rows);
    }
    PyArrayObject *out = shm_new_like(a, (npy_intp)received);
    if (out == NULL) return NULL;
    s.fp = (int64_t)fp;
    const char *src = PyArray_BYTES(a);
    char *dst = PyArray_BYTES(out);
    ts = PyEval_SaveThread();
    failed = alltoall_move(c, &s, src, scount, sdispl, dst, rcount, rdispl, most, most, &ts);
    return shm_finish(c, ts, failed, out);
}

/* ---- a list's chunks as self-describing blocks (fcoll.collectives._alltoall) ---------------- */

#define CHUNK_ALIGN 16 /* _alltoall.ALIGN */

static Py_ssize_t padded(Py_ssize_t n) { return (n + CHUNK_ALIGN - 1) / CHUNK_ALIGN * CHUNK_ALIGN; }

/* header words of a chunk of ``ndim`` dims: [code, nbytes, ndim, *shape], an even count */
static Py_ssize_t head_words(int ndim) { return 3 + ndim + (ndim % 2 == 0); }

/* pack_chunks(chunks, code): (buffer, sizes), every chunk (C-contiguous numpy arrays) as its
 * header words then its bytes padded to 16 (as _alltoall._packed), in one new uint8 array;
 * None where a chunk is not a C-contiguous numpy array (the caller packs in numpy) */
static PyObject *pack_chunks(PyObject *module, PyObject *args) {
    PyObject *chunks;
    long long code;
    (void)module;
    if (!PyArg_ParseTuple(args, "O!L", &PyList_Type, &chunks, &code)) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(chunks), total = 0;
    for (Py_ssize_t j = 0; j < n; ++j) {
        PyObject *c = PyList_GET_ITEM(chunks, j);
        if (!PyArray_CheckExact(c) || !PyArray_IS_C_CONTIGUOUS((PyArrayObject *)c)) Py_RETURN_NONE;
        PyArrayObject *a = (PyArrayObject *)c;
        total += 8 * head_words(PyArray_NDIM(a)) + padded(PyArray_NBYTES(a));
    }
    npy_intp dims[1] = {total};
    PyArrayObject *buf = (PyArrayObject *)PyArray_SimpleNew(1, dims, NPY_UINT8);
    PyObject *sizes = buf == NULL ? NULL : PyList_New(n);
    if (sizes == NULL) {
        Py_XDECREF(buf);
        return NULL;
    }
    char *at = PyArray_BYTES(buf);
    for (Py_ssize_t j = 0; j < n; ++j) {
        PyArrayObject *a = (PyArrayObject *)PyList_GET_ITEM(chunks, j);
        int ndim = PyArray_NDIM(a);
        Py_ssize_t words = head_words(ndim), nbytes = PyArray_NBYTES(a);
        int64_t head[3 + NPY_MAXDIMS + 1];
        head[0] = (int64_t)code;
        head[1] = (int64_t)nbytes;
        head[2] = ndim;
        for (int d = 0; d < ndim; ++d) head[3 + d] = (int64_t)PyArray_DIMS(a)[d];
        if (ndim % 2 == 0) head[3 + ndim] = 0;
        memcpy(at, head, (size_t)(8 * words));
        at += 8 * words;
        if (nbytes) memcpy(at, PyArray_BYTES(a), (size_t)nbytes);
        memset(at + nbytes, 0, (size_t)(padded(nbytes) - nbytes));
        at += padded(nbytes);
        PyObject *size = PyLong_FromSsize_t(8 * words + padded(nbytes));
        if (size == NULL) {
            Py_DECREF(buf);
            Py_DECREF(sizes);
            return NULL;
        }
        PyList_SET_ITEM(sizes, j, size);
    }
    return Py_BuildValue("(NN)", (PyObject *)buf, sizes);
}

/* unpack_chunks(buffer, dtype): (chunks, codes): the blocks of ``buffer`` (a C-contiguous
 * uint8 array of pack_chunks' blocks) as views of ``dtype`` (their base the buffer), and each
 * block's dtype word; a block whose size is not its shape's in ``dtype`` comes back as its
 * bytes (the dtypes differ: the caller sees it in the words). ValueError on a malformed
 * buffer. */
static PyObject *unpack_chunks(PyObject *module, PyObject *args) {
    PyObject *given;
    PyArray_Descr *dtype;
    (void)module;
    if (!PyArg_ParseTuple(args, "OO&", &given, PyArray_DescrConverter, &dtype)) return NULL;
    if (!PyArray_CheckExact(given) || PyArray_TYPE((PyArrayObject *)given) != NPY_UINT8 ||
        !PyArray_IS_C_CONTIGUOUS((PyArrayObject *)given)) {
        Py_DECREF(dtype);
        PyErr_SetString(PyExc_ValueError, "_shmcore.unpack_chunks: expected a C-contiguous uint8 array");
        return NULL;
    }
    PyArrayObject *buf = (PyArrayObject *)given;
    const char *base = PyArray_BYTES(buf);
    Py_ssize_t size = PyArray_NBYTES(buf), at = 0, item = PyDataType_ELSIZE(dtype);
    PyObject *chunks = PyList_New(0), *codes = PyList_New(0);
    while (chunks != NULL && codes != NULL && at < size) {
        int64_t head[3];
        if (size - at < 24) goto malformed;
        memcpy(head, base + at, 24);
        int64_t nbytes = head[1], ndim = head[2];
        if (ndim < 0 || ndim > NPY_MAXDIMS || nbytes < 0) goto malformed;
        Py_ssize_t words = head_words((int)ndim);
        if (size - at < 8 * words || size - at - 8 * words < nbytes) goto malformed;
        npy_intp dims[NPY_MAXDIMS];
        int64_t count = 1;
        for (int d = 0; d < ndim; ++d) {
            int64_t v;
            memcpy(&v, base + at + 8 * (3 + d), 8);
            if (v < 0) goto malformed;
            dims[d] = (npy_intp)v;
            count *= v;
        }
        char *data = (char *)base + at + 8 * words;
        PyObject *chunk;
        Py_INCREF(dtype);
        if (item > 0 && count * item == nbytes) {
            chunk = PyArray_NewFromDescr(&PyArray_Type, dtype, (int)ndim, dims, NULL, data,
                                         NPY_ARRAY_CARRAY, NULL);
        } else { /* another dtype's block: its bytes */
            Py_DECREF(dtype);
            npy_intp length[1] = {(npy_intp)nbytes};
            chunk = PyArray_SimpleNewFromData(1, length, NPY_UINT8, data);
        }
        if (chunk == NULL) break;
        Py_INCREF(buf);
        if (PyArray_SetBaseObject((PyArrayObject *)chunk, (PyObject *)buf) < 0) {
            Py_DECREF(chunk);
            break;
        }
        PyObject *code = PyLong_FromLongLong((long long)head[0]);
        int failed = code == NULL || PyList_Append(chunks, chunk) < 0 || PyList_Append(codes, code) < 0;
        Py_DECREF(chunk);
        Py_XDECREF(code);
        if (failed) break;
        at += 8 * words + padded((Py_ssize_t)nbytes);
    }
    Py_DECREF(dtype);
    if (PyErr_Occurred() || chunks == NULL || codes == NULL) {
        Py_XDECREF(chunks);
        Py_XDECREF(codes);
        return NULL;
    }
    return Py_BuildValue("(NN)", chunks, codes);
malformed:
    Py_DECREF(dtype);
    Py_XDECREF(chunks);
    Py_XDECREF(codes);
    PyErr_SetString(PyExc_ValueError, "_shmcore.unpack_chunks: a malformed block");
    return NULL;
}

static PyMethodDef core_methods[] = {
    {"alltoall", (PyCFunction)Core_alltoall, METH_VARARGS,
     "alltoall(x, fp, deadline): x's rows in n blocks, block j to rank j; a new array, or None"},
    {"alltoallv", (PyCFunction)Core_alltoallv, METH_VARARGS,
     "alltoallv(x, scounts, out, rcounts, most, fp, count, deadline): out, or None"},
    {"alltoallv_rows", (PyCFunction)Core_alltoallv_rows, METH_VARARGS,
     "alltoallv_rows(x, ins, outs, code, meta_fp, fp, ceiling, deadline): uneven "
     "all_to_all_single: the result, None (not taken), or a tuple: (\"rows\",), (\"disagree\", "
     "p, q, expected, sent), (\"grow\", most, received), (\"mpi\", most, received)"},
    {NULL},
};

static PyMethodDef module_methods[] = {
    {"pack_chunks", pack_chunks, METH_VARARGS,
     "pack_chunks(chunks, code): (buffer, sizes), or None (a chunk not C-contiguous numpy)"},
    {"unpack_chunks", unpack_chunks, METH_VARARGS,
     "unpack_chunks(buffer, dtype): (chunks as views, their dtype words)"},
    {NULL},
};

const KindFile shm_alltoall_kind = {alltoall_takes, alltoall_run, core_methods, module_methods};
