/* The shm ring's two per-message operations in C: append one record, take one record.
 *
 * This is the C form of stacklib/transports/shm/ring_core.py's RingCore (the reference, in
 * Python): the same record format, the same checks of every value read from the peer, the
 * same results, proved equal by tests/transports/test_ring_core.py.  `stacklib compile`
 * builds it into the compiled copy; without it the Python form runs.
 *
 * Ordering: the producer writes the record, then publishes the tail with a sequentially
 * consistent store (it must also stay ahead of the load of the consumer's sleeping flag that
 * follows); the consumer reads the tail with an acquire load before it reads the record, and
 * publishes its head after copying the record out, before it reads the producer's waiting
 * flag.  (The Python form relies on x86-64's store order instead.)
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "unet/native_queue.h"

#define ALIGN 16
#define KIND_MESSAGE 1
#define KIND_PAD 2
#define WRITTEN 1
#define WRITTEN_WAKE 2
/* Word offsets within a ring's block of the header page (ring.py: _TAIL, _HEAD, ...). */
#define W_TAIL 0
#define W_HEAD 8
#define W_SLEEPING 16
#define W_WAITING 24
#define BROKEN (-1)

typedef struct {
    PyObject_HEAD
    Py_buffer words_buffer;
    Py_buffer data_buffer;
    int held; /* the two buffers are held (released by release()) */
    uint64_t *words; /* this ring's block of the header page */
    unsigned char *data;
    int64_t capacity;
    int64_t max_message;
    int64_t tail;
    int64_t head;
    int64_t cached_head;
    int64_t peek_head;  /* where the record ring_peek lent out starts (after any pad) */
    int64_t peek_size;  /* that record's size (0: none lent out) */
    PyObject *wake; /* called when take() made room for a waiting producer, or None */
    PyObject *failure; /* why the last BROKEN result broke the ring (a str), or None */
} RingCore;

static inline uint64_t load_acquire(uint64_t *word) {
    return __atomic_load_n(word, __ATOMIC_ACQUIRE);
}

/* Sequentially consistent: the store must not pass the load of the other side's flag that
 * follows it (the sleeping and waiting flags), or a wake-up could be lost. */
static inline void store_publish(uint64_t *word, uint64_t value) {
    __atomic_store_n(word, value, __ATOMIC_SEQ_CST);
}

/* Note why the ring broke (`why` a new str, or NULL if making it failed): NQ_BROKEN, or
 * NQ_ERROR with the exception of the failed formatting. */
static int fail(RingCore *self, PyObject *why) {
    if (why == NULL) {
        return NQ_ERROR;
    }
    Py_XSETREF(self->failure, why);
    return NQ_BROKEN;
}

static int RingCore_init(RingCore *self, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"words", "base", "data", "max_message", "tail", "head", NULL};
    PyObject *words, *data;
    Py_ssize_t base, max_message;
    long long tail, head;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OnOnLL", keywords, &words, &base, &data,
                                     &max_message, &tail, &head)) {
        return -1;
    }
    if (self->held) {
        PyErr_SetString(PyExc_RuntimeError, "RingCore is already initialised");
        return -1;
    }
    if (PyObject_GetBuffer(words, &self->words_buffer, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        return -1;
    }
    if (PyObject_GetBuffer(data, &self->data_buffer, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&self->words_buffer);
        return -1;
    }
    self->held = 1;
    if (base < 0 || (base + W_WAITING + 1) * 8 > self->words_buffer.len
        || ((uintptr_t)self->words_buffer.buf & 7) || ((uintptr_t)self->data_buffer.buf & 7)
        || self->data_buffer.len <= 0 || self->data_buffer.len % ALIGN || max_message < 0
        || tail < 0 || head < 0) {
        PyErr_SetString(PyExc_ValueError, "RingCore: words, base or data do not make a ring");
        return -1;
    }
    self->words = (uint64_t *)self->words_buffer.buf + base;
    self->data = (unsigned char *)self->data_buffer.buf;
    self->capacity = self->data_buffer.len;
    self->max_message = max_message;
    self->tail = tail;
    self->head = head;
    self->cached_head = head;
    Py_INCREF(Py_None);
    Py_XSETREF(self->wake, Py_None);
    Py_INCREF(Py_None);
    Py_XSETREF(self->failure, Py_None);
    return 0;
}

static PyObject *RingCore_release(RingCore *self, PyObject *unused) {
    if (self->held) {
        self->held = 0;
        self->words = NULL;
        self->data = NULL;
        PyBuffer_Release(&self->words_buffer);
        PyBuffer_Release(&self->data_buffer);
    }
    Py_RETURN_NONE;
}

static void RingCore_dealloc(RingCore *self) {
    PyObject_GC_UnTrack(self);
    if (self->held) {
        PyBuffer_Release(&self->words_buffer);
        PyBuffer_Release(&self->data_buffer);
    }
    Py_CLEAR(self->wake);
    Py_CLEAR(self->failure);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int RingCore_traverse(RingCore *self, visitproc visit, void *arg) {
    Py_VISIT(self->wake);
    Py_VISIT(self->failure);
    return 0;
}

static int RingCore_clear(RingCore *self) {
    Py_CLEAR(self->wake);
    Py_CLEAR(self->failure);
    return 0;
}

static int check_open(RingCore *self) {
    if (!self->held) {
        PyErr_SetString(PyExc_ValueError, "RingCore: released");
        return -1;
    }
    return 0;
}

/* Append one record of n bytes from source (the native queue's write): NQ_DONE, NQ_WAKE (the
 * consumer sleeps), NQ_NONE (full), NQ_TOO_LONG (over max_message: only for callers in C, as
 * try_write's callers check lengths themselves), NQ_BROKEN (the consumer published an
 * impossible head; `failure` says which) or NQ_ERROR. */
static int ring_write_checked(RingCore *self, const char *source, Py_ssize_t n) {
    if (check_open(self) < 0) {
        return NQ_ERROR;
    }
    int64_t size = (n + 8 + ALIGN - 1) & ~(int64_t)(ALIGN - 1);
    int64_t tail = self->tail;
    int64_t capacity = self->capacity;
    int64_t offset = tail % capacity;
    int64_t to_end = capacity - offset;
    int64_t need = size <= to_end ? size : to_end + size;
    if (tail + need - self->cached_head > capacity) {
        uint64_t head = load_acquire(&self->words[W_HEAD]);
        /* The consumer's head: aligned, never behind our last view of it nor past our tail. */
        if (head % ALIGN || head > (uint64_t)tail || (int64_t)head < self->cached_head) {
            return fail(self, PyUnicode_FromFormat("the consumer published head %llu (tail %lld)",
                                                   (unsigned long long)head, (long long)tail));
        }
        self->cached_head = (int64_t)head;
        if (tail + need - (int64_t)head > capacity) {
            return NQ_NONE;
        }
    }
    if (size > to_end) {
        ((uint64_t *)self->data)[offset >> 3] = (uint64_t)to_end | ((uint64_t)KIND_PAD << 32);
        tail += to_end;
        offset = 0;
    }
    ((uint64_t *)self->data)[offset >> 3] = (uint64_t)n | ((uint64_t)KIND_MESSAGE << 32);
    memcpy(self->data + offset + 8, source, (size_t)n);
    tail += size;
    self->tail = tail;
    store_publish(&self->words[W_TAIL], (uint64_t)tail);
    return __atomic_load_n(&self->words[W_SLEEPING], __ATOMIC_SEQ_CST) ? NQ_WAKE : NQ_DONE;
}

static int ring_write(PyObject *queue, const char *source, Py_ssize_t n) {
    RingCore *self = (RingCore *)queue;
    if (n > self->max_message) {
        return NQ_TOO_LONG;
    }
    return ring_write_checked(self, source, n);
}

/* try_write(payload) -> 1 (WRITTEN), 2 (WRITTEN_WAKE: the consumer sleeps), 0 (full), or -1
 * (BROKEN: the consumer published an impossible head; `failure` says which). */
static PyObject *RingCore_try_write(RingCore *self, PyObject *payload) {
    int result;
    if (PyBytes_CheckExact(payload)) {
        result = ring_write_checked(self, PyBytes_AS_STRING(payload), PyBytes_GET_SIZE(payload));
    } else {
        Py_buffer view;
        if (PyObject_GetBuffer(payload, &view, PyBUF_C_CONTIGUOUS) < 0) {
            return NULL;
        }
        result = ring_write_checked(self, (const char *)view.buf, view.len);
        PyBuffer_Release(&view);
    }
    if (result == NQ_ERROR) {
        return NULL;
    }
    return PyLong_FromLong(result == NQ_BROKEN ? BROKEN : result == NQ_WAKE ? WRITTEN_WAKE
                                               : result == NQ_DONE ? WRITTEN : 0);
}

/* The next record, in place (the native queue's peek, see unet/native_queue.h): NQ_DONE with
 * the message at *data, *length (its record kept until ring_release), NQ_NONE (empty), NQ_BROKEN
 * (the producer published an impossible tail or record; `failure` says which) or NQ_ERROR. */
static int ring_peek(PyObject *queue, const unsigned char **data, Py_ssize_t *length_out) {
    RingCore *self = (RingCore *)queue;
    if (check_open(self) < 0) {
        return NQ_ERROR;
    }
    uint64_t *words = self->words;
    int64_t head = self->head;
    uint64_t published = load_acquire(&words[W_TAIL]);
    if ((uint64_t)head == published) {
        return NQ_NONE;
    }
    int64_t capacity = self->capacity;
    /* (A tail below the head shows as a huge unsigned difference.) */
    uint64_t avail_u = published - (uint64_t)head;
    if (avail_u > (uint64_t)capacity || avail_u % ALIGN) {
        /* Formatted as Python does: the tail as written, and so a negative difference. */
        return fail(self, PyUnicode_FromFormat("the producer published tail %llu (head %lld)",
                                               (unsigned long long)published, (long long)head));
    }
    int64_t avail = (int64_t)avail_u;
    uint64_t *records = (uint64_t *)self->data;
    int64_t offset = head % capacity;
    uint64_t header = records[offset >> 3];
    uint64_t length = header & 0xFFFFFFFFu;
    uint64_t kind = header >> 32;
    if (kind == KIND_PAD) {
        if (length != (uint64_t)(capacity - offset) || length > (uint64_t)avail) {
            return fail(self, PyUnicode_FromFormat("a pad record of length %llu at offset %lld",
                                                   (unsigned long long)length, (long long)offset));
        }
        head += (int64_t)length;
        avail -= (int64_t)length;
        if (!avail) {
            self->head = head;
            store_publish(&words[W_HEAD], (uint64_t)head);
            return NQ_NONE;
        }
        offset = 0;
        header = records[0];
        length = header & 0xFFFFFFFFu;
        kind = header >> 32;
    }
    int64_t size = ((int64_t)length + 8 + ALIGN - 1) & ~(int64_t)(ALIGN - 1);
    if (kind != KIND_MESSAGE || length > (uint64_t)self->max_message
        || size > capacity - offset || size > avail) {
        return fail(self,
                    PyUnicode_FromFormat("a record of kind %llu and length %llu at offset %lld",
                                         (unsigned long long)kind, (unsigned long long)length,
                                         (long long)offset));
    }
    *data = self->data + offset + 8;
    *length_out = (Py_ssize_t)length;
    self->peek_head = head;
    self->peek_size = size;
    return NQ_DONE;
}

/* Free the record ring_peek lent out: publish the head, then wake a producer that waits for
 * room (0, or NQ_ERROR if the wake-up raised; the record is freed all the same). */
static int ring_release(PyObject *queue) {
    RingCore *self = (RingCore *)queue;
    if (!self->held || !self->peek_size) {
        return 0;
    }
    uint64_t *words = self->words;
    int64_t head = self->peek_head + self->peek_size;
    self->peek_size = 0;
    self->head = head;
    store_publish(&words[W_HEAD], (uint64_t)head);
    if (__atomic_load_n(&words[W_WAITING], __ATOMIC_SEQ_CST)) {
        /* The producer waits for room: we just made some. */
        words[W_WAITING] = 0;
        if (self->wake != Py_None) {
            PyObject *result = PyObject_CallNoArgs(self->wake);
            if (result == NULL) {
                return NQ_ERROR;
            }
            Py_DECREF(result);
        }
    }
    return 0;
}

/* take() -> a copy of the next message (its record freed), None (empty), or -1 (BROKEN: the
 * producer published an impossible tail or record; `failure` says which). */
static PyObject *RingCore_take(RingCore *self, PyObject *unused) {
    const unsigned char *data;
    Py_ssize_t length;
    int found = ring_peek((PyObject *)self, &data, &length);
    if (found == NQ_ERROR) {
        return NULL;
    }
    if (found == NQ_NONE) {
        Py_RETURN_NONE;
    }
    if (found == NQ_BROKEN) {
        return PyLong_FromLong(BROKEN);
    }
    PyObject *message = PyBytes_FromStringAndSize((const char *)data, length);
    if (message == NULL) {
        return NULL;
    }
    if (ring_release((PyObject *)self) < 0) {
        Py_DECREF(message);
        return NULL;
    }
    return message;
}

static PyObject *get_int64(int64_t value) { return PyLong_FromLongLong(value); }

static int set_int64(int64_t *field, PyObject *value) {
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "RingCore counters cannot be deleted");
        return -1;
    }
    long long v = PyLong_AsLongLong(value);
    if (v == -1 && PyErr_Occurred()) {
        return -1;
    }
    *field = (int64_t)v;
    return 0;
}

static PyObject *RingCore_get_tail(RingCore *self, void *c) { return get_int64(self->tail); }
static int RingCore_set_tail(RingCore *self, PyObject *v, void *c) {
    return set_int64(&self->tail, v);
}
static PyObject *RingCore_get_head(RingCore *self, void *c) { return get_int64(self->head); }
static int RingCore_set_head(RingCore *self, PyObject *v, void *c) {
    return set_int64(&self->head, v);
}
static PyObject *RingCore_get_cached_head(RingCore *self, void *c) {
    return get_int64(self->cached_head);
}
static int RingCore_set_cached_head(RingCore *self, PyObject *v, void *c) {
    return set_int64(&self->cached_head, v);
}
static PyObject *RingCore_get_wake(RingCore *self, void *c) {
    Py_INCREF(self->wake);
    return self->wake;
}
static int RingCore_set_wake(RingCore *self, PyObject *v, void *c) {
    if (v == NULL) {
        v = Py_None;
    }
    if (v != Py_None && !PyCallable_Check(v)) {
        PyErr_SetString(PyExc_TypeError, "RingCore.wake: a callable or None");
        return -1;
    }
    Py_INCREF(v);
    Py_XSETREF(self->wake, v);
    return 0;
}
static PyObject *RingCore_get_max_message(RingCore *self, void *c) {
    return get_int64(self->max_message);
}
static PyObject *RingCore_get_failure(RingCore *self, void *c) {
    Py_INCREF(self->failure);
    return self->failure;
}

static NativeQueueAPI native_queue_api = {NULL, ring_peek, ring_release, ring_write};

static PyObject *RingCore_get_native_queue(RingCore *self, void *c) {
    return PyCapsule_New(&native_queue_api, NATIVE_QUEUE_CAPSULE, NULL);
}

static PyGetSetDef RingCore_getset[] = {
    {"tail", (getter)RingCore_get_tail, (setter)RingCore_set_tail,
     "the producer's private tail (bytes written, free-running)", NULL},
    {"head", (getter)RingCore_get_head, (setter)RingCore_set_head,
     "the consumer's private head (bytes freed, free-running)", NULL},
    {"cached_head", (getter)RingCore_get_cached_head, (setter)RingCore_set_cached_head,
     "the producer's last view of the consumer's head", NULL},
    {"wake", (getter)RingCore_get_wake, (setter)RingCore_set_wake,
     "called when take() made room for a producer that waits, or None", NULL},
    {"failure", (getter)RingCore_get_failure, NULL,
     "why the last BROKEN result broke the ring, or None", NULL},
    {"max_message", (getter)RingCore_get_max_message, NULL,
     "the largest message a record may hold", NULL},
    {"native_queue", (getter)RingCore_get_native_queue, NULL,
     "the ring's face to C: a capsule of unet/native_queue.h's table", NULL},
    {NULL}};

static PyMethodDef RingCore_methods[] = {
    {"try_write", (PyCFunction)RingCore_try_write, METH_O,
     "Append one message: 1, 2 (the consumer sleeps), 0 (full) or -1 (broken)."},
    {"take", (PyCFunction)RingCore_take, METH_NOARGS,
     "A copy of the next message, its record freed; None if empty; -1 if broken."},
    {"release", (PyCFunction)RingCore_release, METH_NOARGS,
     "Let go of the two buffers (before the link releases its views)."},
    {NULL}};

static PyTypeObject RingCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "stacklib.transports.shm._ringcore.RingCore",
    .tp_doc = "One shm ring's counters and its per-message operations, in C.",
    .tp_basicsize = sizeof(RingCore),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)RingCore_init,
    .tp_dealloc = (destructor)RingCore_dealloc,
    .tp_traverse = (traverseproc)RingCore_traverse,
    .tp_clear = (inquiry)RingCore_clear,
    .tp_methods = RingCore_methods,
    .tp_getset = RingCore_getset,
};

static struct PyModuleDef ringcore_module = {
    PyModuleDef_HEAD_INIT, "_ringcore",
    "The shm ring's per-message operations in C (see ring_core.py for the reference).", -1,
    NULL};

PyMODINIT_FUNC PyInit__ringcore(void) {
    if (PyType_Ready(&RingCoreType) < 0) {
        return NULL;
    }
    native_queue_api.type = &RingCoreType;
    PyObject *module = PyModule_Create(&ringcore_module);
    if (module == NULL) {
        return NULL;
    }
    Py_INCREF(&RingCoreType);
    if (PyModule_AddObject(module, "RingCore", (PyObject *)&RingCoreType) < 0) {
        Py_DECREF(&RingCoreType);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
