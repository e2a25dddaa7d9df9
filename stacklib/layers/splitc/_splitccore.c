/* Split-C's scalar reads answered in C: the request handler of a rank over UAM.
 *
 * A Split-C read of a remote scalar is one request carrying the address and one reply
 * carrying the value (paper 000 §6: a read "map[s] into a request/reply Active Message
 * pair"); the target's part is to read the element and reply with it.  ScalarReadHandler is
 * that request handler as an object: calling it calls the runtime's Python handler
 * (SplitC._on_request, the reference, which every other request takes), and its
 * `native_handler` table (stacklib/layers/uam/native_handler.h) lets the UAM core's express
 * poll answer a well-formed read of one whole element of a scalar region itself, with the
 * reply the Python handler's fast path makes: the same words, nothing else changed.  Made
 * with the rank's table of operations (`ops`), the same type is the reader's reply handler:
 * it calls SplitC._on_reply, and its table completes a VALUE or ACK with status OK for an
 * operation outstanding as that handler's fast path does (the operation leaves the table,
 * its Pending's _complete gets the value's bytes).  tests/layers/splitc/test_splitc_native.py
 * compares both with the Python handlers.  `stacklib compile` builds it
 * into the compiled copy; without it the runtime registers its Python handler alone.
 *
 * Words (stacklib/layers/splitc/wire.py): a read request is (READ << 28 | size << 24 |
 * region << 16 | op, byte offset, 0, 0); the reply is (VALUE << 28 | size << 24 | op, 0,
 * high, low), the element's bytes big-endian in high then low, zero-padded on the right.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "layers/uam/native_handler.h"

#define READ_CODE 1u
#define VALUE_CODE 5u
#define ACK_CODE 6u
#define MAX_REGIONS 256

typedef struct {
    Py_buffer view;  /* the region's bytes (held while the handler lives) */
    Py_ssize_t size; /* its element size when scalar (1, 2, 4, 8), else 0 */
} Region;

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *fallback; /* the Python handler */
    PyObject *ops;      /* the reply handler's: the rank's operations by op id; NULL: requests */
    long reply_handler; /* the reply's handler index; -1: not set (every request declined) */
    Py_ssize_t count;
    Region regions[MAX_REGIONS];
} Handler;

static PyObject *s_complete;

static PyObject *Handler_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf,
                                    PyObject *kwnames) {
    return PyObject_Vectorcall(((Handler *)callable)->fallback, args, nargsf, kwnames);
}

static PyObject *Handler_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *fallback, *ops = Py_None;
    static char *names[] = {"fallback", "ops", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|O:ScalarReadHandler", names, &fallback,
                                     &ops)) {
        return NULL;
    }
    if (ops != Py_None && !PyDict_CheckExact(ops)) {
        PyErr_Format(PyExc_TypeError,
                     "ScalarReadHandler(fallback, ops): ops must be the rank's dict of "
                     "operations by op id (or None for the request handler), not %.100s",
                     Py_TYPE(ops)->tp_name);
        return NULL;
    }
    if (!PyCallable_Check(fallback)) {
        PyErr_Format(PyExc_TypeError,
                     "ScalarReadHandler(fallback): the fallback must be the Python request "
                     "handler (a callable), not %.100s",
                     Py_TYPE(fallback)->tp_name);
        return NULL;
    }
    Handler *self = (Handler *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->vectorcall = Handler_vectorcall;
    Py_INCREF(fallback);
    self->fallback = fallback;
    if (ops != Py_None) {
        Py_INCREF(ops);
        self->ops = ops;
    }
    self->reply_handler = -1;
    self->count = 0;
    return (PyObject *)self;
}

static int Handler_traverse(Handler *self, visitproc visit, void *arg) {
    /* The regions' exporters are not visited: the collector must never take one (a
     * memoryview) for garbage while this holds its buffer, for a memoryview cleared with an
     * export outstanding drops its buffer all the same and the release here would then touch
     * freed memory.  Unvisited, they count as referenced from outside any cycle. */
    Py_VISIT(self->fallback);
    Py_VISIT(self->ops);
    return 0;
}

static int Handler_clear(Handler *self) {
    Py_CLEAR(self->fallback);
    Py_CLEAR(self->ops);
    for (Py_ssize_t i = 0; i < self->count; i++) {
        PyBuffer_Release(&self->regions[i].view);
    }
    self->count = 0;
    return 0;
}

static void Handler_dealloc(Handler *self) {
    PyObject_GC_UnTrack(self);
    Handler_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Handler_add_region(Handler *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError,
                     "add_region(buffer, itemsize) takes 2 arguments (%zd given)", nargs);
        return NULL;
    }
    if (self->count >= MAX_REGIONS) {
        PyErr_SetString(PyExc_ValueError, "ScalarReadHandler: at most 256 regions");
        return NULL;
    }
    Py_ssize_t size = PyLong_AsSsize_t(args[1]);
    if (size == -1 && PyErr_Occurred()) {
        return NULL;
    }
    Region *region = &self->regions[self->count];
    if (PyObject_GetBuffer(args[0], &region->view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    /* Elements of 1, 2, 4 or 8 bytes are scalars; any other size declines every read. */
    region->size = (size == 1 || size == 2 || size == 4 || size == 8) ? size : 0;
    return PyLong_FromSsize_t(self->count++);
}

/* The native table's request: a read of one whole element inside a scalar region. */
static int native_request(PyObject *object, const uint32_t *words, Py_ssize_t nwords,
                          long *reply_handler, uint32_t reply[4]) {
    Handler *self = (Handler *)object;
    if (nwords != 4 || self->reply_handler < 0 || self->ops != NULL) {
        return NH_DECLINED;
    }
    uint32_t first = words[0];
    uint32_t index = (first >> 16) & 0xFF;
    if (first >> 28 != READ_CODE || (Py_ssize_t)index >= self->count) {
        return NH_DECLINED;
    }
    Region *region = &self->regions[index];
    uint32_t size = (first >> 24) & 0xF;
    uint64_t offset = words[1];
    if (region->size == 0 || (Py_ssize_t)size != region->size ||
        offset + size > (uint64_t)region->view.len) {
        return NH_DECLINED;
    }
    unsigned char value[8] = {0};
    memcpy(value, (const unsigned char *)region->view.buf + offset, size);
    reply[0] = (VALUE_CODE << 28) | (size << 24) | (first & 0xFFFF);
    reply[1] = 0;
    reply[2] = (uint32_t)value[0] << 24 | (uint32_t)value[1] << 16 | (uint32_t)value[2] << 8 |
               value[3];
    reply[3] = (uint32_t)value[4] << 24 | (uint32_t)value[5] << 16 | (uint32_t)value[6] << 8 |
               value[7];
    *reply_handler = self->reply_handler;
    return NH_REPLIED;
}

/* The native table's reply: a VALUE or ACK with status OK for an operation outstanding,
 * completed with the value's bytes (the Python handler's fast path): the operation leaves
 * the rank's table and its Pending's _complete(raw) is called. */
static int native_reply(PyObject *object, const uint32_t *words, Py_ssize_t nwords) {
    Handler *self = (Handler *)object;
    if (nwords != 4 || self->ops == NULL) {
        return NH_DECLINED;
    }
    uint32_t first = words[0];
    uint32_t code = first >> 28, size = (first >> 24) & 0xF;
    if (code < VALUE_CODE || code > ACK_CODE || ((first >> 16) & 0xFF) != 0 ||
        !((size > 0 && size <= 8 && !(size & (size - 1))) || (size == 0 && code == ACK_CODE))) {
        return NH_DECLINED;
    }
    PyObject *op = PyLong_FromUnsignedLong(first & 0xFFFF);
    if (op == NULL) {
        return NH_ERROR;
    }
    PyObject *pending = PyDict_GetItemWithError(self->ops, op);
    if (pending == NULL) {
        Py_DECREF(op);
        return PyErr_Occurred() ? NH_ERROR : NH_DECLINED;
    }
    Py_INCREF(pending);
    int failed = PyDict_DelItem(self->ops, op);
    Py_DECREF(op);
    unsigned char value[8];
    for (int i = 0; i < 4; i++) {
        value[i] = (unsigned char)(words[2] >> (24 - 8 * i));
        value[4 + i] = (unsigned char)(words[3] >> (24 - 8 * i));
    }
    PyObject *raw = failed ? NULL : PyBytes_FromStringAndSize((const char *)value, size);
    PyObject *done = raw == NULL ? NULL : PyObject_CallMethodOneArg(pending, s_complete, raw);
    Py_XDECREF(raw);
    Py_DECREF(pending);
    if (done == NULL) {
        return NH_ERROR;
    }
    Py_DECREF(done);
    return NH_HANDLED;
}

/* The test entries' words: at most 4, each 32 bits, into words[]; -1 with an exception
 * naming `what` otherwise. */
static int parse_words(const char *what, PyObject *const *args, Py_ssize_t nargs,
                       uint32_t words[4]) {
    if (nargs > 4) {
        PyErr_Format(PyExc_TypeError, "%s(*words) takes at most 4 words (%zd given)", what,
                     nargs);
        return -1;
    }
    for (Py_ssize_t i = 0; i < nargs; i++) {
        unsigned long value = PyLong_AsUnsignedLong(args[i]);
        if (value == (unsigned long)-1 && PyErr_Occurred()) {
            return -1;
        }
        if (value > 0xFFFFFFFFUL) {
            PyErr_Format(PyExc_ValueError, "%s(*words): a word is 32 bits", what);
            return -1;
        }
        words[i] = (uint32_t)value;
    }
    return 0;
}

/* answer_reply(*words): whether the native table took this reply, for tests. */
static PyObject *Handler_answer_reply(Handler *self, PyObject *const *args, Py_ssize_t nargs) {
    uint32_t words[4];
    if (parse_words("answer_reply", args, nargs, words) < 0) {
        return NULL;
    }
    int done = native_reply((PyObject *)self, words, nargs);
    if (done == NH_ERROR) {
        return NULL;
    }
    return PyBool_FromLong(done == NH_HANDLED);
}

/* answer(*words): what the native table answers a request of these words, for tests:
 * (reply handler, (four reply words)) or None (declined: the fallback would be called). */
static PyObject *Handler_answer(Handler *self, PyObject *const *args, Py_ssize_t nargs) {
    uint32_t words[4], reply[4];
    if (parse_words("answer", args, nargs, words) < 0) {
        return NULL;
    }
    long handler = -1;
    if (native_request((PyObject *)self, words, nargs, &handler, reply) != NH_REPLIED) {
        Py_RETURN_NONE;
    }
    return Py_BuildValue("l(kkkk)", handler, (unsigned long)reply[0], (unsigned long)reply[1],
                         (unsigned long)reply[2], (unsigned long)reply[3]);
}

static PyObject *Handler_get_reply_handler(Handler *self, void *closure) {
    return PyLong_FromLong(self->reply_handler);
}

static int Handler_set_reply_handler(Handler *self, PyObject *value, void *closure) {
    long index = value == NULL ? -2 : PyLong_AsLong(value);
    if (index == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (index < -1 || index > 255) {
        PyErr_SetString(PyExc_ValueError,
                        "ScalarReadHandler.reply_handler: a handler index 0..255 (-1: none)");
        return -1;
    }
    self->reply_handler = index;
    return 0;
}

static PyObject *Handler_get_regions(Handler *self, void *closure) {
    return PyLong_FromSsize_t(self->count);
}

static PyObject *Handler_get_ops(Handler *self, void *closure) {
    PyObject *ops = self->ops == NULL ? Py_None : self->ops;
    Py_INCREF(ops);
    return ops;
}

static PyObject *Handler_get_fallback(Handler *self, void *closure) {
    Py_INCREF(self->fallback);
    return self->fallback;
}

static PyGetSetDef Handler_getset[] = {
    {"reply_handler", (getter)Handler_get_reply_handler, (setter)Handler_set_reply_handler,
     "The reply's handler index (-1 until set: every request declined).", NULL},
    {"regions", (getter)Handler_get_regions, NULL, "How many regions were added.", NULL},
    {"fallback", (getter)Handler_get_fallback, NULL, "The Python handler.", NULL},
    {"ops", (getter)Handler_get_ops, NULL,
     "The reply handler's table of operations (None: the request handler).", NULL},
    {NULL},
};

static PyMethodDef Handler_methods[] = {
    {"add_region", (PyCFunction)(void (*)(void))Handler_add_region, METH_FASTCALL,
     "add_region(buffer, itemsize): the next region's bytes and element size; its index."},
    {"answer", (PyCFunction)(void (*)(void))Handler_answer, METH_FASTCALL,
     "answer(*words): the native table's answer, (handler, words) or None (for tests)."},
    {"answer_reply", (PyCFunction)(void (*)(void))Handler_answer_reply, METH_FASTCALL,
     "answer_reply(*words): whether the native table took this reply (for tests)."},
    {NULL},
};

static PyTypeObject HandlerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "stacklib.layers.splitc._splitccore.ScalarReadHandler",
    .tp_doc = "Split-C's request handler: calls fallback; the UAM core may answer reads in C.",
    .tp_basicsize = sizeof(Handler),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_vectorcall_offset = offsetof(Handler, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_new = Handler_new,
    .tp_dealloc = (destructor)Handler_dealloc,
    .tp_traverse = (traverseproc)Handler_traverse,
    .tp_clear = (inquiry)Handler_clear,
    .tp_methods = Handler_methods,
    .tp_getset = Handler_getset,
};

static NativeHandlerAPI native_api = {&HandlerType, native_request, native_reply};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_splitccore",
    .m_doc = "Split-C's scalar reads answered in C (see runtime.py).",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__splitccore(void) {
    if ((s_complete = PyUnicode_InternFromString("_complete")) == NULL ||
        PyType_Ready(&HandlerType) < 0) {
        return NULL;
    }
    PyObject *capsule = PyCapsule_New(&native_api, NATIVE_HANDLER_CAPSULE, NULL);
    if (capsule == NULL) {
        return NULL;
    }
    int failed = PyDict_SetItemString(HandlerType.tp_dict, "native_handler", capsule);
    Py_DECREF(capsule);
    if (failed < 0) {
        return NULL;
    }
    PyType_Modified(&HandlerType);
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) {
        return NULL;
    }
    Py_INCREF(&HandlerType);
    if (PyModule_AddObject(m, "ScalarReadHandler", (PyObject *)&HandlerType) < 0) {
        Py_DECREF(&HandlerType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
