/* Fast: one fast path's whole call as a C callable (fcoll.backends._shmcore.Fast).
 *
 * fcoll.collectives._fast keeps, per group and (op, dtype), the function a repeated call
 * takes. Once the group's segment steps in C, that function can be this object:
 * ``fast(x)`` checks that the core takes ``x`` (a C-contiguous numpy array the segment holds),
 * counts the call on the group (``group.seq += 1``), writes the flight recorder's entry
 * ``(key, seq, name, "numpy", x.shape, x.dtype, clock())`` and, when the call returns, its end
 * time, as the Python closures do, and steps the segment: one C call where a closure costs a
 * Python frame (about 0.6 us here). It returns None where the core does not take ``x``
 * or ``x`` has ``limit`` bytes or more
 * (nothing counted or sent: the caller takes its full path), and raises what ``told(step)``
 * returns when ranks announced different calls (fcoll's CollectiveMismatchError).
 *
 * It looks up ``group.shm.core`` at every call, so a segment that grew (a new Core) serves at
 * once. Calls through it have no deadline (fast paths never do). The steps run without the
 * GIL: shm_run (_shmcore.c) makes the result with it, releases it for the loop of steps and
 * takes it back before it returns or raises; the count, the record and its end time are
 * written here, with the GIL, before and after.
 *
 * Fast_traverse and Fast_clear list the same eight fields, as CPython's garbage collector
 * asks of every type that holds references (one visits them, the other drops them).
 */
#define NO_IMPORT_ARRAY
#include "_shmcore.h"

#include <stddef.h>

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    Step step;
    PyObject *group, *name, *calls, *ends, *pos, *key, *clock, *told;
    Py_ssize_t mask, limit; /* limit: the bytes from which a call is left to the caller (-1: none) */
} Fast;

static PyObject *S_shm, *S_core, *S_seq, *S_shape, *S_numpy, *ONE;

/* group.seq += 1; the new value (a new reference) */
static PyObject *count_call(PyObject *group) {
    PyObject *seq = PyObject_GetAttr(group, S_seq);
    if (seq == NULL) return NULL;
    PyObject *next = PyNumber_Add(seq, ONE);
    Py_DECREF(seq);
    if (next == NULL || PyObject_SetAttr(group, S_seq, next) < 0) {
        Py_XDECREF(next);
        return NULL;
    }
    return next;
}

/* The recorder's entry for this call: its slot, or -1 when recording is off; -2 on error */
static Py_ssize_t record(Fast *f, PyObject *x, PyObject *seq) {
    if (f->calls == Py_None) return -1;
    Py_ssize_t i = PyLong_AsSsize_t(PyList_GET_ITEM(f->pos, 0));
    PyObject *next = PyLong_FromSsize_t(i + 1);
    if (next == NULL || PyList_SetItem(f->pos, 0, next) < 0) return -2;
    Py_ssize_t slot = i & f->mask;
    PyObject *shape = PyObject_GetAttr(x, S_shape);
    PyObject *now = shape == NULL ? NULL : PyObject_CallNoArgs(f->clock);
    PyObject *entry = now == NULL ? NULL : PyTuple_Pack(7, f->key, seq, f->name, S_numpy, shape,
                                                        (PyObject *)PyArray_DESCR((PyArrayObject *)x), now);
    Py_XDECREF(shape);
    Py_XDECREF(now);
    if (entry == NULL || PyList_SetItem(f->calls, slot, entry) < 0) return -2;
    return slot;
}

/* A Mismatch(step) from the core, told as fcoll's error (``told(step)``'s exception) */
static void tell(Fast *f) {
    if (!PyErr_ExceptionMatches(Mismatch)) return;
    PyObject *type, *value, *trace;
    PyErr_Fetch(&type, &value, &trace);
    PyErr_NormalizeException(&type, &value, &trace);
    PyObject *args = value == NULL ? NULL : PyObject_GetAttrString(value, "args");
    PyObject *told = args == NULL || !PyTuple_Check(args) || PyTuple_GET_SIZE(args) != 1
                         ? NULL : PyObject_CallOneArg(f->told, PyTuple_GET_ITEM(args, 0));
    Py_XDECREF(args);
    if (told == NULL) { /* keep the core's error where fcoll's could not be made */
        if (!PyErr_Occurred()) PyErr_Restore(type, value, trace);
        else { Py_XDECREF(type); Py_XDECREF(value); Py_XDECREF(trace); }
        return;
    }
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(trace);
    PyErr_SetObject((PyObject *)Py_TYPE(told), told);
    Py_DECREF(told);
}

/* The group's Core, a new reference; NULL without an error where there is none yet */
static Core *core_of(PyObject *group) {
    PyObject *seg = PyObject_GetAttr(group, S_shm);
    if (seg == NULL) return NULL;
    PyObject *core = NULL;
    if (seg != Py_None && seg != Py_False) core = PyObject_GetAttr(seg, S_core);
    Py_DECREF(seg);
    if (core != NULL && !PyObject_TypeCheck(core, &CoreType)) Py_CLEAR(core);
    return (Core *)core;
}

static PyObject *Fast_vectorcall(Fast *f, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    if (PyVectorcall_NARGS(nargsf) != 1 || (kwnames != NULL && PyTuple_GET_SIZE(kwnames))) {
        PyErr_SetString(PyExc_TypeError, "_shmcore.Fast: expected one argument, the array");
        return NULL;
    }
    PyObject *x = args[0];
    if (!PyArray_Check(x) || (f->limit >= 0 && PyArray_NBYTES((PyArrayObject *)x) >= f->limit) ||
        (f->step.kind == K_ALLGATHER && PyArray_NDIM((PyArrayObject *)x) == 0))
        Py_RETURN_NONE; /* a 0-d all-gather has a shape of its own: the full path */
    Core *core = core_of(f->group);
    if (core == NULL) return PyErr_Occurred() ? NULL : Py_NewRef(Py_None);
    if (!shm_takes(core, &f->step, (PyArrayObject *)x)) {
        Py_DECREF(core);
        Py_RETURN_NONE;
    }
    PyObject *seq = count_call(f->group), *y = NULL;
    Py_ssize_t slot = seq == NULL ? -2 : record(f, x, seq);
    if (slot != -2) y = shm_run(core, &f->step, (PyArrayObject *)x, Py_None);
    if (y == NULL) tell(f);
    if (y != NULL && slot >= 0) {
        PyObject *now = PyObject_CallNoArgs(f->clock);
        if (now == NULL || PyList_SetItem(f->ends, slot, now) < 0) Py_CLEAR(y);
    }
    Py_XDECREF(seq);
    Py_DECREF(core);
    return y;
}

static int Fast_init(Fast *f, PyObject *args, PyObject *kwds) {
    static char *names[] = {"kind", "type", "op", "flags", "factor", "root", "fp", "group", "name",
                            "recorder", "told", "limit", NULL};
    long long fp;
    PyObject *group, *name, *recorder, *told, *calls, *ends, *pos, *key, *clock;
    Step s = {.deadline = -1.0};
    f->limit = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "iiiidiLOUOO|n", names, &s.kind, &s.type, &s.op,
                                     &s.flags, &s.factor, &s.root, &fp, &group, &name, &recorder,
                                     &told, &f->limit))
        return -1;
    if (!PyArg_ParseTuple(recorder, "OOOnOO", &calls, &ends, &pos, &f->mask, &key, &clock)) return -1;
    if (s.kind < 0 || s.kind >= K_COUNT ||
        ((s.kind == K_REDUCE || s.kind == K_SCAN || s.kind == K_REDUCE_SCATTER) &&
         shm_fold_ok(s.type, s.op) < 0))
        return -1;
    if ((calls != Py_None && (!PyList_Check(calls) || !PyList_Check(ends))) || !PyList_Check(pos) ||
        PyList_GET_SIZE(pos) != 1 || !PyCallable_Check(told) || !PyCallable_Check(clock)) {
        PyErr_SetString(PyExc_TypeError, "_shmcore.Fast: expected a recorder (calls, ends, [pos], "
                                         "mask, key, clock) of fcoll.diagnostics.flight and a callable told");
        return -1;
    }
    s.fp = (int64_t)fp;
    f->step = s;
    PyObject **fields[] = {&f->group, &f->name, &f->calls, &f->ends, &f->pos, &f->key, &f->clock,
                           &f->told};
    PyObject *given[] = {group, name, calls, ends, pos, key, clock, told};
    for (int i = 0; i < 8; ++i) Py_XSETREF(*fields[i], Py_NewRef(given[i]));
    f->vectorcall = (vectorcallfunc)Fast_vectorcall;
    return 0;
}

static int Fast_traverse(Fast *f, visitproc visit, void *arg) {
    Py_VISIT(f->group);
    Py_VISIT(f->name);
    Py_VISIT(f->calls);
    Py_VISIT(f->ends);
    Py_VISIT(f->pos);
    Py_VISIT(f->key);
    Py_VISIT(f->clock);
    Py_VISIT(f->told);
    return 0;
}

static int Fast_clear(Fast *f) {
    Py_CLEAR(f->group);
    Py_CLEAR(f->name);
    Py_CLEAR(f->calls);
    Py_CLEAR(f->ends);
    Py_CLEAR(f->pos);
    Py_CLEAR(f->key);
    Py_CLEAR(f->clock);
    Py_CLEAR(f->told);
    return 0;
}

static void Fast_dealloc(Fast *f) {
    PyObject_GC_UnTrack(f);
    Fast_clear(f);
    Py_TYPE(f)->tp_free((PyObject *)f);
}

static PyObject *Fast_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    if (S_shm == NULL) {
        S_shm = PyUnicode_InternFromString("shm");
        S_core = PyUnicode_InternFromString("core");
        S_seq = PyUnicode_InternFromString("seq");
        S_shape = PyUnicode_InternFromString("shape");
        S_numpy = PyUnicode_InternFromString("numpy");
        ONE = PyLong_FromLong(1);
        if (!S_shm || !S_core || !S_seq || !S_shape || !S_numpy || !ONE) return NULL;
    }
    Fast *f = (Fast *)type->tp_alloc(type, 0);
    if (f != NULL) f->vectorcall = (vectorcallfunc)Fast_vectorcall;
    return (PyObject *)f;
}

PyTypeObject FastType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "fcoll.backends._shmcore.Fast",
    .tp_basicsize = sizeof(Fast),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "Fast(kind, type, op, flags, factor, root, fp, group, name, recorder, told, limit=-1): a "
              "fast path's whole call through the group's segment (see _shmfast.c).",
    .tp_new = Fast_new,
    .tp_init = (initproc)Fast_init,
    .tp_dealloc = (destructor)Fast_dealloc,
    .tp_traverse = (traverseproc)Fast_traverse,
    .tp_clear = (inquiry)Fast_clear,
    .tp_vectorcall_offset = offsetof(Fast, vectorcall),
    .tp_call = PyVectorcall_Call,
};
