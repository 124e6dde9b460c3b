/* fcoll's XLA FFI handler in C (fcoll.backends._shmcore.xla_handler): what a jitted JAX
 * function runs where it reaches fcoll.lax.psum.
 *
 * XLA calls ``handler(frame)`` on its own thread, without the GIL, with the call frame of the
 * C API (vendor/xla/ffi/api/c_api.h, copied from jaxlib with its licence). The custom call's
 * typed attributes say what to do: ``channel`` (i64: an entry of CHANNELS below, or -1), and
 * for a psum the compiled core's fold, ``wire`` (its type), ``fold`` (its op), ``flags``
 * (F_AVG) and ``fp`` (i64: the call's fingerprint). Where the channel is live and the
 * operands fit, the handler steps the channel's segment straight from XLA's input buffers
 * into its output buffers (one all-reduce per operand, in order; they may alias) with
 * shm_reduce_steps, the loop the eager calls run, so the bits are the eager call's: no GIL,
 * no Python, no MPI. A one-rank channel copies. Everything else (other collectives, groups
 * that span nodes, debug mode, a channel fcoll.xla.channel could not make) goes to the
 * Python handler (fcoll.xla.handler, a ctypes function given to xla_setup), which takes the
 * GIL itself.
 *
 * A channel (fcoll.xla.channel) is a group's own duplicate for jitted calls with its own
 * segment and step counter, so eager calls on the group never meet jitted ones. Its entry
 * here is set with the GIL on the main thread (xla_channel) while no jitted call runs
 * (fcoll.xla.channel waits for them first), or by the Python handler on XLA's thread after
 * it used the channel (its segment may have grown); calls of one process run one at a time
 * (JAX orders them by its effect token).
 *
 * Waiting runs shm_reduce_steps' three phases (spin, yield, futex sleep) and never takes
 * the GIL (no signal handlers, no flight-record serving on this thread). The deadline is the
 * group's (``timeout``, set by xla_channel; 0: none), from the call's start. A missed
 * deadline or a mismatch (ranks that announced different calls) takes the GIL once, to ask
 * ``told(channel, failed, step, call)`` (fcoll.xla.channel) for fcoll's error and its text, and
 * returns it to XLA: the jitted function's outputs raise it where they are read.
 *
 * Each call served here is counted on the channel (the group's call number: the Python side
 * reads and sets it, xla_calls, around the calls it makes on the duplicate) and recorded in
 * its ring (RECORDS entries: call number, elements, the core's type, start and end on CLOCK_MONOTONIC, which
 * is Python's perf_counter here), read by xla_records for the flight recorder.
 * The Metadata extension (XLA's query when the handler is registered) is answered with
 * FFI_MAJOR.FFI_MINOR, the oldest API whose fields the handler reads (0.1: the call frame,
 * typed attributes, Error_Create).
 */
#define NO_IMPORT_ARRAY
#include "_shmcore.h"

#include "xla/ffi/api/c_api.h"

#include <stdint.h>

#define FFI_MAJOR 0
#define FFI_MINOR 1
#define CHANNELS 256
#define RECORDS 64 /* a power of two */
#define MAX_OPERANDS 64

typedef struct {
    int64_t seq, count;
    int type;
    double start, end; /* end: 0 in flight, -1 failed */
} Record;

typedef struct {
    Core *core; /* a strong reference; NULL for one rank */
    int n, live;
    double timeout;
    int64_t calls;
    Record records[RECORDS];
} Channel;

static Channel channels[CHANNELS];
static int64_t served_calls; /* by this handler, in all (xla_served: tests and benchmarks) */
static XLA_FFI_Handler *fallback; /* the Python handler (fcoll.xla.handler, through ctypes) */
static PyObject *told;            /* told(channel, failed, step, call) -> str */

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* ---- the call frame ----------------------------------------------------------------------- */

/* 1 where ``frame`` is XLA's metadata query (answered here), else 0 */
static int answer_metadata(XLA_FFI_CallFrame *frame) {
    for (XLA_FFI_Extension_Base *e = frame->extension_start; e != NULL; e = e->next) {
        if (e->type != XLA_FFI_Extension_Metadata) continue;
        XLA_FFI_Metadata *m = ((XLA_FFI_Metadata_Extension *)e)->metadata;
        m->api_version.major_version = FFI_MAJOR;
        m->api_version.minor_version = FFI_MINOR;
        m->traits = 0;
        return 1;
    }
    return 0;
}

/* The integer attribute ``name`` (i32 or i64) into ``*value``: 1, or 0 where there is none */
static int attribute(const XLA_FFI_Attrs *attrs, const char *name, int64_t *value) {
    size_t len = strlen(name);
    for (int64_t i = 0; i < attrs->size; ++i) {
        const XLA_FFI_ByteSpan *s = attrs->names[i];
        if (attrs->types[i] != XLA_FFI_AttrType_SCALAR || s->len != len || memcmp(s->ptr, name, len))
            continue;
        const XLA_FFI_Scalar *v = (const XLA_FFI_Scalar *)attrs->attrs[i];
        if (v->dtype == XLA_FFI_DataType_S64) *value = *(const int64_t *)v->value;
        else if (v->dtype == XLA_FFI_DataType_S32) *value = *(const int32_t *)v->value;
        else return 0;
        return 1;
    }
    return 0;
}

/* The buffers of an argument or result list, tokens left out: how many (at most ``max``) */
static int buffers(int64_t size, void **items, XLA_FFI_Buffer **out, int max) {
    int k = 0;
    for (int64_t i = 0; i < size; ++i) {
        XLA_FFI_Buffer *b = (XLA_FFI_Buffer *)items[i];
        if (b->dtype == XLA_FFI_DataType_TOKEN) continue;
        if (k == max) return max + 1;
        out[k++] = b;
    }
    return k;
}

/* The core's type of an XLA buffer's dtype (-1: none) */
static int core_type(XLA_FFI_DataType dtype) {
    switch (dtype) {
    case XLA_FFI_DataType_PRED: case XLA_FFI_DataType_U8: return T_U8;
    case XLA_FFI_DataType_S8: return T_I8;
    case XLA_FFI_DataType_U16: return T_U16;
    case XLA_FFI_DataType_S16: return T_I16;
    case XLA_FFI_DataType_U32: return T_U32;
    case XLA_FFI_DataType_S32: return T_I32;
    case XLA_FFI_DataType_U64: return T_U64;
    case XLA_FFI_DataType_S64: return T_I64;
    case XLA_FFI_DataType_F16: return T_F16;
    case XLA_FFI_DataType_BF16: return T_BF16;
    case XLA_FFI_DataType_F32: return T_F32;
    case XLA_FFI_DataType_F64: return T_F64;
    case XLA_FFI_DataType_C64: return T_C64;
    case XLA_FFI_DataType_C128: return T_C128;
    default: return -1;
    }
}

static int64_t elements(const XLA_FFI_Buffer *b) {
    int64_t count = 1;
    for (int64_t d = 0; d < b->rank; ++d) count *= b->dims[d];
    return count;
}

static XLA_FFI_Error *error(XLA_FFI_CallFrame *frame, const char *message, XLA_FFI_Error_Code code) {
    XLA_FFI_Error_Create_Args args = {XLA_FFI_Error_Create_Args_STRUCT_SIZE, NULL, message, code};
    return frame->api->XLA_FFI_Error_Create(&args);
}

/* ---- a psum ------------------------------------------------------------------------------- */

/* fcoll's error for a step that ``failed`` (told, with the GIL), as XLA's */
static XLA_FFI_Error *failure(XLA_FFI_CallFrame *frame, int channel, int failed, int64_t step) {
    PyGILState_STATE gil = PyGILState_Ensure();
    PyObject *text = told == NULL ? NULL : PyObject_CallFunction(told, "iiLL", channel, failed,
                                                                 (long long)step,
                                                                 (long long)channels[channel].calls);
    const char *message = text != NULL && PyUnicode_Check(text) ? PyUnicode_AsUTF8(text) : NULL;
    if (message == NULL) {
        PyErr_Clear();
        message = failed == STEP_TIMEOUT ? "fcoll: CollectiveTimeoutError: the deadline passed"
                                         : "fcoll: CollectiveMismatchError: ranks announced different calls";
    }
    XLA_FFI_Error *e = error(frame, message, failed == STEP_TIMEOUT ? XLA_FFI_Error_Code_DEADLINE_EXCEEDED
                                                                    : XLA_FFI_Error_Code_INTERNAL);
    Py_XDECREF(text);
    PyGILState_Release(gil);
    return e;
}

/* One operand's all-reduce through ``ch``: STEP_OK or what failed */
static int reduce_one(Channel *ch, Step *s, const XLA_FFI_Buffer *in, XLA_FFI_Buffer *out,
                      int64_t total, char *scratch) {
    Py_ssize_t nbytes = (Py_ssize_t)total * elem_size[s->type];
    const char *src = (const char *)in->data;
    char *dst = (char *)out->data;
    if (ch->n == 1) {
        if (dst != src && nbytes) memmove(dst, src, (size_t)nbytes);
        return STEP_OK;
    }
    int published = ((uintptr_t)src % (uintptr_t)elem_size[s->type]) != 0 ||
                    (dst < src + nbytes && src < dst + nbytes);
    return shm_reduce_steps(ch->core, s, &ch->core->programs[P_ALLREDUCE], src, dst, total,
                            published, scratch, NULL);
}

/* The psum of ``k`` operands of ``count`` elements each through channel ``index``, or NULL
 * where the channel cannot take it (the caller then hands the frame to the Python handler) */
static XLA_FFI_Error *psum(XLA_FFI_CallFrame *frame, int index, Step *s, XLA_FFI_Buffer **ins,
                           XLA_FFI_Buffer **outs, int k, int *served) {
    Channel *ch = &channels[index];
    Core *c = ch->core;
    int64_t most = 0;
    *served = 0;
    for (int i = 0; i < k; ++i) {
        int64_t count = elements(ins[i]);
        if (ins[i]->dtype != outs[i]->dtype || core_type(ins[i]->dtype) != s->type ||
            elements(outs[i]) != count)
            return NULL;
        most = count > most ? count : most;
    }
    Py_ssize_t step_bytes = (Py_ssize_t)most * elem_size[s->type];
    if (ch->n > 1 && (c == NULL || !c->programmed || c->n != ch->n ||
                      (step_bytes < c->chunk ? step_bytes : c->chunk) > c->capacity))
        return NULL;
    *served = 1;
    _Alignas(64) char stack[16384];
    size_t need = ch->n > 1 ? shm_scratch(c, s, most) : 0;
    char *scratch = need <= sizeof stack ? stack : malloc(need);
    if (scratch == NULL) return error(frame, "fcoll: out of memory", XLA_FFI_Error_Code_RESOURCE_EXHAUSTED);
    Record *r = &ch->records[ch->calls++ & (RECORDS - 1)];
    r->seq = ch->calls;
    r->count = most;
    r->type = s->type;
    r->end = 0.0;
    r->start = now_s();
    s->deadline = ch->timeout > 0 ? r->start + ch->timeout : -1.0;
    /* several operands: first a step that announces how many, so that ranks with different
     * pytrees are told (each operand's step then compares its own element count) */
    int failed = ch->n > 1 && k > 1 ? shm_announce(c, s->fp, k, s->deadline, NULL) : STEP_OK;
    for (int i = 0; i < k && failed == STEP_OK; ++i)
        failed = reduce_one(ch, s, ins[i], outs[i], elements(ins[i]), scratch);
    if (scratch != stack) free(scratch);
    r->end = failed == STEP_OK ? now_s() : -1.0;
    ++served_calls;
    return failed == STEP_OK ? NULL : failure(frame, index, failed, c != NULL ? c->step : 0);
}

/* XLA_FFI_Handler: the whole call (see the top of this file) */
static XLA_FFI_Error *handler(XLA_FFI_CallFrame *frame) {
    if (answer_metadata(frame)) return NULL;
    if (frame->stage != XLA_FFI_ExecutionStage_EXECUTE) return NULL;
    int64_t index = -1, type = -1, op = -1, flags = 0, fp = 0;
    XLA_FFI_Buffer *ins[MAX_OPERANDS], *outs[MAX_OPERANDS];
    if (attribute(&frame->attrs, "channel", &index) && index >= 0 && index < CHANNELS &&
        channels[index].live && attribute(&frame->attrs, "wire", &type) && type >= 0 &&
        type < T_COUNT && attribute(&frame->attrs, "fold", &op) && fold_exists((int)type, (int)op) &&
        attribute(&frame->attrs, "flags", &flags) && attribute(&frame->attrs, "fp", &fp)) {
        int k = buffers(frame->args.size, frame->args.args, ins, MAX_OPERANDS);
        int m = buffers(frame->rets.size, frame->rets.rets, outs, MAX_OPERANDS);
        if (k == m && k >= 1 && k <= MAX_OPERANDS) {
            Step s = {.kind = K_REDUCE, .type = (int)type, .op = (int)op, .flags = (int)flags & F_AVG,
                      .root = -1, .factor = 1.0, .fp = fp};
            int served;
            XLA_FFI_Error *e = psum(frame, (int)index, &s, ins, outs, k, &served);
            if (served) return e;
        }
    }
    if (fallback == NULL)
        return error(frame, "fcoll: the Python handler is not set (fcoll.xla.handler)",
                     XLA_FFI_Error_Code_INTERNAL);
    return fallback(frame);
}

/* ---- the module's functions --------------------------------------------------------------- */

static PyObject *xla_handler(PyObject *module, PyObject *args) {
    return PyCapsule_New((void *)handler, NULL, NULL);
}

static PyObject *xla_setup(PyObject *module, PyObject *args) {
    unsigned long long address;
    PyObject *fn;
    if (!PyArg_ParseTuple(args, "KO", &address, &fn)) return NULL;
    if (!PyCallable_Check(fn)) {
        PyErr_SetString(PyExc_TypeError, "_shmcore.xla_setup: expected told to be callable");
        return NULL;
    }
    fallback = (XLA_FFI_Handler *)(uintptr_t)address;
    Py_XSETREF(told, Py_NewRef(fn));
    Py_RETURN_NONE;
}

static PyObject *xla_channel(PyObject *module, PyObject *args) {
    int index, n;
    PyObject *core;
    double timeout;
    if (!PyArg_ParseTuple(args, "iOid", &index, &core, &n, &timeout)) return NULL;
    if (index < 0 || index >= CHANNELS || n < 0 ||
        (core != Py_None && (!PyObject_TypeCheck(core, &CoreType) || ((Core *)core)->n != n))) {
        PyErr_Format(PyExc_ValueError, "_shmcore.xla_channel: expected an index in [0, %d) and "
                     "a Core of n ranks or None, got %d", CHANNELS, index);
        return NULL;
    }
    Channel *ch = &channels[index];
    Core *old = ch->core;
    ch->core = core == Py_None ? NULL : (Core *)Py_NewRef(core);
    ch->n = n;
    ch->timeout = timeout;
    ch->live = n == 1 || (n > 1 && ch->core != NULL);
    Py_XDECREF(old);
    Py_RETURN_NONE;
}

static PyObject *xla_calls(PyObject *module, PyObject *args) {
    int index;
    long long value = -1;
    if (!PyArg_ParseTuple(args, "i|L", &index, &value)) return NULL;
    if (index < 0 || index >= CHANNELS) {
        PyErr_Format(PyExc_ValueError, "_shmcore.xla_calls: expected an index in [0, %d), got %d",
                     CHANNELS, index);
        return NULL;
    }
    if (value >= 0) channels[index].calls = (int64_t)value;
    return PyLong_FromLongLong((long long)channels[index].calls);
}

static PyObject *xla_served(PyObject *module, PyObject *args) {
    return PyLong_FromLongLong((long long)served_calls);
}

static PyObject *xla_records(PyObject *module, PyObject *args) {
    int index;
    if (!PyArg_ParseTuple(args, "i", &index)) return NULL;
    if (index < 0 || index >= CHANNELS) {
        PyErr_Format(PyExc_ValueError, "_shmcore.xla_records: expected an index in [0, %d), got %d",
                     CHANNELS, index);
        return NULL;
    }
    Channel *ch = &channels[index];
    int64_t last = ch->calls, first = last > RECORDS ? last - RECORDS : 0;
    PyObject *list = PyList_New(0);
    for (int64_t i = first; list != NULL && i < last; ++i) {
        Record r = ch->records[i & (RECORDS - 1)];
        if (r.seq != i + 1) continue; /* a call the Python side made */
        PyObject *item = Py_BuildValue("(LLidd)", (long long)r.seq, (long long)r.count, r.type,
                                       r.start, r.end);
        if (item == NULL || PyList_Append(list, item) < 0) Py_CLEAR(list);
        Py_XDECREF(item);
    }
    return list;
}

PyMethodDef xla_methods[] = {
    {"xla_handler", xla_handler, METH_NOARGS,
     "xla_handler(): the XLA FFI handler (a PyCapsule for jax.ffi.register_ffi_target)"},
    {"xla_setup", xla_setup, METH_VARARGS,
     "xla_setup(fallback, told): the Python handler's address and told(channel, failed, step, call) -> str"},
    {"xla_channel", xla_channel, METH_VARARGS,
     "xla_channel(index, core, n, timeout): set a channel (core None: one rank, or off for n > 1)"},
    {"xla_calls", xla_calls, METH_VARARGS,
     "xla_calls(index[, calls]): the calls counted on the channel (set first where given)"},
    {"xla_served", xla_served, METH_NOARGS, "xla_served(): the calls this handler served"},
    {"xla_records", xla_records, METH_VARARGS,
     "xla_records(index): the channel's last calls, [(seq, count, type, start, end)]"},
    {NULL},
};
