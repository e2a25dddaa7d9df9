/* The UAM machine's core in C: its state and its per-PDU operations.
 *
 * This is the C form of stacklib/layers/uam/machine_core.py's MachineCore (the reference, in
 * Python): the same fields under the same attribute names, the same operations, the same
 * datagrams, events, timers and counters for every input, proved equal by
 * tests/layers/test_uam_machine_core.py.  `stacklib compile` builds it into the compiled copy;
 * without it the Python form runs.  What the core leaves to the machine (bulk PDUs and their
 * events, the general parse path, the error messages, failure) it calls as methods on self,
 * exactly where the reference does.
 *
 * Protocol (paper 000 §5.1): go-back-N with a fixed window w; every PDU but ACK is numbered
 * modulo 65536 and carries the cumulative acknowledgment of what its sender has handled.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>

#define MASK 0xFFFF
#define HALF 0x8000
#define T_REQUEST 1
#define T_REPLY 2
#define T_ACK 3
#define HEADER_SIZE 8
#define MAX_ARGS 4
#define SMALL_MAX (HEADER_SIZE + 4 * MAX_ARGS)
#define WORD_MAX 0xFFFFFFFFUL

/* ------------------------------------------------------------------ a PDU kept until acked */

typedef struct {
    PyObject_HEAD
    long type;
    long handler;
    PyObject *args; /* a tuple of ints */
    PyObject *bulk; /* a Bulk, or None */
    PyObject *data; /* bytes */
    char credit;    /* consumes window space (requests, store chunks, gets) */
    char acked;
    long seq;
    long transmissions;
} Out;

static void Out_dealloc(Out *self) {
    Py_XDECREF(self->args);
    Py_XDECREF(self->bulk);
    Py_XDECREF(self->data);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef Out_members[] = {
    {"type", T_LONG, offsetof(Out, type), READONLY, NULL},
    {"handler", T_LONG, offsetof(Out, handler), READONLY, NULL},
    {"args", T_OBJECT, offsetof(Out, args), READONLY, NULL},
    {"bulk", T_OBJECT, offsetof(Out, bulk), READONLY, NULL},
    {"data", T_OBJECT, offsetof(Out, data), READONLY, NULL},
    {"credit", T_BOOL, offsetof(Out, credit), READONLY, NULL},
    {"acked", T_BOOL, offsetof(Out, acked), READONLY, NULL},
    {"seq", T_LONG, offsetof(Out, seq), READONLY, NULL},
    {"transmissions", T_LONG, offsetof(Out, transmissions), READONLY, NULL},
    {NULL},
};

static PyTypeObject OutType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "stacklib.layers.uam._uamcore._Out",
    .tp_doc = "A PDU kept until acknowledged (made by the core only).",
    .tp_basicsize = sizeof(Out),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = (destructor)Out_dealloc,
    .tp_members = Out_members,
};

static Out *new_out(long type, long handler, PyObject *args, PyObject *bulk, PyObject *data,
                    int credit) {
    Out *out = PyObject_New(Out, &OutType);
    if (out == NULL) {
        return NULL;
    }
    out->type = type;
    out->handler = handler;
    Py_INCREF(args);
    out->args = args;
    Py_INCREF(bulk);
    out->bulk = bulk;
    Py_INCREF(data);
    out->data = data;
    out->credit = (char)credit;
    out->acked = 0;
    out->seq = -1;
    out->transmissions = 0;
    return out;
}

/* ------------------------------------------------------------------ the core */

typedef struct {
    PyObject_HEAD
    long window;
    double rto;
    long max_retries;
    double ack_delay;
    long chunk_size;
    long ack_threshold;
    char failed;
    /* Sender half. */
    long next_seq;
    long credits_used;
    double deadline;
    char has_deadline;
    long retries;
    PyObject *unacked; /* list of Out */
    PyObject *backlog; /* list of Out: credit PDUs waiting for window space */
    PyObject *to_send; /* list of Out */
    /* Receiver half. */
    long expected;
    long handled_through;
    long owed;
    double ack_deadline;
    char has_ack_deadline;
    char ack_now;
    long open_token;
    char has_open_token;
    long open_type;
    PyObject *open_pdu; /* the arrival being handled that may be answered, or None */
    PyObject *ready;    /* list of arrival tuples */
    PyObject *events;   /* list of events */
    /* Counters. */
    long sent, retransmitted, timeouts, acks_sent, acks_received, received, handled;
    long duplicates, out_of_order, no_buffer, malformed, stale_acks, ignored;
} Core;

static PyObject *s_check_room, *s_check_args, *s_check_handler, *s_take_token;
static PyObject *s_receive_other, *s_event, *s_fail, *empty_bytes;

static int Core_traverse(Core *self, visitproc visit, void *arg) {
    Py_VISIT(self->unacked);
    Py_VISIT(self->backlog);
    Py_VISIT(self->to_send);
    Py_VISIT(self->open_pdu);
    Py_VISIT(self->ready);
    Py_VISIT(self->events);
    return 0;
}

static int Core_clear(Core *self) {
    Py_CLEAR(self->unacked);
    Py_CLEAR(self->backlog);
    Py_CLEAR(self->to_send);
    Py_CLEAR(self->open_pdu);
    Py_CLEAR(self->ready);
    Py_CLEAR(self->events);
    return 0;
}

static void Core_dealloc(Core *self) {
    PyObject_GC_UnTrack(self);
    Core_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Core_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    Core *self = (Core *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    /* Every field zero; the lists exist from the start, so no method meets a NULL. */
    self->unacked = PyList_New(0);
    self->backlog = PyList_New(0);
    self->to_send = PyList_New(0);
    self->ready = PyList_New(0);
    self->events = PyList_New(0);
    Py_INCREF(Py_None);
    self->open_pdu = Py_None;
    self->window = 1;
    self->ack_threshold = 1;
    if (!self->unacked || !self->backlog || !self->to_send || !self->ready || !self->events) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static int Core_init(Core *self, PyObject *args, PyObject *kwds) {
    long window, max_retries, chunk_size, initial_seq;
    double rto, ack_delay;
    static char *names[] = {"window", "rto", "max_retries", "ack_delay", "chunk_size",
                            "initial_seq", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "ldldll", names, &window, &rto, &max_retries,
                                     &ack_delay, &chunk_size, &initial_seq)) {
        return -1;
    }
    self->window = window;
    self->rto = rto;
    self->max_retries = max_retries;
    self->ack_delay = ack_delay;
    self->chunk_size = chunk_size;
    self->ack_threshold = window / 2 > 1 ? window / 2 : 1;
    self->next_seq = initial_seq;
    self->expected = initial_seq;
    self->handled_through = initial_seq;
    return 0;
}

/* ------------------------------------------------------------------ helpers */

/* The value of an exact int in [0, max], or -1 (no error set) if it is anything else. */
static inline long small_value(PyObject *obj, unsigned long max) {
    if (!PyLong_CheckExact(obj)) {
        return -1;
    }
    int overflow;
    long value = PyLong_AsLongAndOverflow(obj, &overflow);
    if (overflow || value < 0 || (unsigned long)value > max) {
        PyErr_Clear();
        return -1;
    }
    return value;
}

/* A handler index, checked as the reference does: fast for an exact int in 0..255, else the
 * machine's _check_handler decides (and raises, naming the problem).  -1 with an error set. */
static long handler_index(Core *self, PyObject *handler) {
    long value = small_value(handler, 255);
    if (value >= 0) {
        return value;
    }
    PyObject *checked = PyObject_CallMethodOneArg((PyObject *)self, s_check_handler, handler);
    if (checked == NULL) {
        return -1;
    }
    value = PyLong_AsLong(checked);
    Py_DECREF(checked);
    if (value == -1 && PyErr_Occurred()) {
        return -1;
    }
    return value;
}

/* args as a tuple of words (a new reference): itself when it is a tuple of at most four exact
 * ints that are words, else what the machine's _check_args makes of it (or raises). */
static PyObject *words_of(Core *self, PyObject *args) {
    if (PyTuple_CheckExact(args) && PyTuple_GET_SIZE(args) <= MAX_ARGS) {
        Py_ssize_t n = PyTuple_GET_SIZE(args), i;
        for (i = 0; i < n; i++) {
            if (small_value(PyTuple_GET_ITEM(args, i), WORD_MAX) < 0) {
                break;
            }
        }
        if (i == n) {
            Py_INCREF(args);
            return args;
        }
    }
    return PyObject_CallMethodOneArg((PyObject *)self, s_check_args, args);
}

static inline PyObject *optional_float(char has, double value) {
    if (!has) {
        Py_RETURN_NONE;
    }
    return PyFloat_FromDouble(value);
}

/* Give out the next seq and put it in the retransmission buffer (the reference's _assign). */
static int assign(Core *self, Out *out, double now) {
    out->seq = self->next_seq;
    self->next_seq = (self->next_seq + 1) & MASK;
    if (PyList_Append(self->unacked, (PyObject *)out) < 0) {
        return -1;
    }
    if (out->credit) {
        self->credits_used += 1;
    }
    if (PyList_Append(self->to_send, (PyObject *)out) < 0) {
        return -1;
    }
    if (!self->has_deadline) {
        self->deadline = now + self->rto;
        self->has_deadline = 1;
    }
    return 0;
}

/* A REQUEST, REPLY or ACK: the 8-byte header and the words, big-endian. */
static PyObject *pack_small(long type, long handler, long seq, long ack, PyObject *words) {
    Py_ssize_t nargs = words == NULL ? 0 : PyTuple_GET_SIZE(words);
    PyObject *result = PyBytes_FromStringAndSize(NULL, HEADER_SIZE + 4 * nargs);
    if (result == NULL) {
        return NULL;
    }
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(result);
    p[0] = (unsigned char)type;
    p[1] = (unsigned char)handler;
    p[2] = (unsigned char)(seq >> 8);
    p[3] = (unsigned char)seq;
    p[4] = (unsigned char)(ack >> 8);
    p[5] = (unsigned char)ack;
    p[6] = (unsigned char)nargs;
    p[7] = 0;
    for (Py_ssize_t i = 0; i < nargs; i++) {
        unsigned long word = PyLong_AsUnsignedLong(PyTuple_GET_ITEM(words, i));
        if (word == (unsigned long)-1 && PyErr_Occurred()) {
            Py_DECREF(result);
            return NULL;
        }
        unsigned char *w = p + HEADER_SIZE + 4 * i;
        w[0] = (unsigned char)(word >> 24);
        w[1] = (unsigned char)(word >> 16);
        w[2] = (unsigned char)(word >> 8);
        w[3] = (unsigned char)word;
    }
    return result;
}

/* Remove and return (a new reference) the first item of a non-empty list. */
static PyObject *pop_first(PyObject *list) {
    PyObject *item = PyList_GET_ITEM(list, 0);
    Py_INCREF(item);
    if (PyList_SetSlice(list, 0, 1, NULL) < 0) {
        Py_DECREF(item);
        return NULL;
    }
    return item;
}

/* The cumulative acknowledgment ack: release what it covers, restart the timer. */
static int on_ack(Core *self, long ack, double now) {
    PyObject *unacked = self->unacked;
    Py_ssize_t length = PyList_GET_SIZE(unacked);
    if (length == 0) {
        if (ack != self->next_seq) {
            self->stale_acks += 1;
        }
        return 0;
    }
    long count = (ack - ((Out *)PyList_GET_ITEM(unacked, 0))->seq) & MASK;
    if (count == 0) {
        return 0;
    }
    if (count > length) {
        self->stale_acks += 1; /* behind the window (late) or beyond it (garbage) */
        return 0;
    }
    for (long i = 0; i < count; i++) {
        Out *out = (Out *)PyList_GET_ITEM(unacked, i);
        out->acked = 1;
        if (out->credit) {
            self->credits_used -= 1;
        }
    }
    if (PyList_SetSlice(unacked, 0, count, NULL) < 0) {
        return -1;
    }
    self->retries = 0;
    if (PyList_GET_SIZE(unacked)) {
        self->deadline = now + self->rto;
        self->has_deadline = 1;
    } else {
        self->has_deadline = 0;
    }
    return 0;
}

/* The sequence check of a PDU that parsed: accept it in order, or count it. */
static int accept_arrival(Core *self, PyObject *arrival, long seq) {
    long distance = (seq - self->expected) & MASK;
    if (distance == 0) {
        if (PyList_GET_SIZE(self->ready) >= 2 * self->window) {
            self->no_buffer += 1; /* no arrival buffer: the sender will resend it */
            return 0;
        }
        self->expected = (seq + 1) & MASK;
        self->received += 1;
        return PyList_Append(self->ready, arrival);
    }
    if (distance >= HALF) {
        /* Already accepted: our acknowledgment was lost or is late.  Confirm again. */
        self->duplicates += 1;
        self->ack_now = 1;
    } else {
        self->out_of_order += 1;
    }
    return 0;
}

static int check_arrival(PyObject *arrival, long *seq) {
    if (!PyTuple_Check(arrival) || PyTuple_GET_SIZE(arrival) != 6) {
        PyErr_SetString(PyExc_TypeError, "UAM core: an arrival is a tuple of six items");
        return -1;
    }
    *seq = PyLong_AsLong(PyTuple_GET_ITEM(arrival, 3));
    if (*seq == -1 && PyErr_Occurred()) {
        return -1;
    }
    return 0;
}

/* Bind a METH_FASTCALL | METH_KEYWORDS call's arguments to the parameters ``names`` (all
 * required, positional or by keyword, as the reference's methods take them): out[i] is a
 * borrowed reference to the value of names[i].  -1 with TypeError naming the problem. */
static int bind(const char *method, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                const char *const *names, Py_ssize_t count, PyObject **out) {
    if (nargs > count) {
        PyErr_Format(PyExc_TypeError, "%s() takes %zd arguments (%zd given)", method, count,
                     nargs);
        return -1;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        out[i] = i < nargs ? args[i] : NULL;
    }
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t k = 0; k < nkw; k++) {
        PyObject *key = PyTuple_GET_ITEM(kwnames, k);
        Py_ssize_t i;
        for (i = 0; i < count; i++) {
            if (PyUnicode_CompareWithASCIIString(key, names[i]) == 0) {
                break;
            }
        }
        if (i == count) {
            PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument '%U'", method,
                         key);
            return -1;
        }
        if (out[i] != NULL) {
            PyErr_Format(PyExc_TypeError, "%s() got multiple values for argument '%s'", method,
                         names[i]);
            return -1;
        }
        out[i] = args[nargs + k];
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        if (out[i] == NULL) {
            PyErr_Format(PyExc_TypeError, "%s() missing required argument '%s'", method,
                         names[i]);
            return -1;
        }
    }
    return 0;
}

#define BIND(method, ...)                                                                      \
    static const char *const names[] = {__VA_ARGS__};                                         \
    PyObject *arg[sizeof(names) / sizeof(names[0])];                                           \
    if (bind(method, args, nargs, kwnames, names, sizeof(names) / sizeof(names[0]), arg) < 0) \
        return NULL;

/* ------------------------------------------------------------------ inputs */

static PyObject *Core_request(Core *self, PyObject *const *args, Py_ssize_t nargs,
                              PyObject *kwnames) {
    BIND("request", "handler", "args", "now");
    long handler = handler_index(self, arg[0]);
    if (handler < 0) {
        return NULL;
    }
    PyObject *words = words_of(self, arg[1]);
    if (words == NULL) {
        return NULL;
    }
    if (self->failed || self->credits_used + PyList_GET_SIZE(self->backlog) >= self->window) {
        PyObject *checked = PyObject_CallMethodNoArgs((PyObject *)self, s_check_room);
        if (checked == NULL) {
            Py_DECREF(words);
            return NULL;
        }
        Py_DECREF(checked);
    }
    Out *out = new_out(T_REQUEST, handler, words, Py_None, empty_bytes, 1);
    Py_DECREF(words);
    if (out == NULL) {
        return NULL;
    }
    int failed = PyList_Append(self->backlog, (PyObject *)out);
    Py_DECREF(out);
    if (failed < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *Core_reply(Core *self, PyObject *const *args, Py_ssize_t nargs,
                            PyObject *kwnames) {
    BIND("reply", "token", "handler", "args", "now");
    double now = PyFloat_AsDouble(arg[3]);
    if (now == -1.0 && PyErr_Occurred()) {
        return NULL;
    }
    long handler = handler_index(self, arg[1]);
    if (handler < 0) {
        return NULL;
    }
    PyObject *words = words_of(self, arg[2]);
    if (words == NULL) {
        return NULL;
    }
    PyObject *token = arg[0];
    int mismatch;
    if (!self->has_open_token) {
        mismatch = 1;
    } else if (PyLong_CheckExact(token)) {
        int overflow;
        long value = PyLong_AsLongAndOverflow(token, &overflow);
        mismatch = overflow || value != self->open_token;
    } else {
        PyObject *open = PyLong_FromLong(self->open_token);
        int equal = open == NULL ? -1 : PyObject_RichCompareBool(token, open, Py_EQ);
        Py_XDECREF(open);
        if (equal < 0) {
            Py_DECREF(words);
            return NULL;
        }
        mismatch = !equal;
    }
    if (mismatch || self->open_type != T_REQUEST || self->failed) {
        /* The machine raises, naming the rule broken. */
        PyObject *kind = PyLong_FromLong(T_REQUEST);
        PyObject *taken =
            kind == NULL ? NULL
                         : PyObject_CallMethodObjArgs((PyObject *)self, s_take_token, token, kind,
                                                      NULL);
        Py_XDECREF(kind);
        if (taken == NULL) {
            Py_DECREF(words);
            return NULL;
        }
        Py_DECREF(taken);
    }
    self->has_open_token = 0;
    Out *out = new_out(T_REPLY, handler, words, Py_None, empty_bytes, 0);
    Py_DECREF(words);
    if (out == NULL) {
        return NULL;
    }
    int failed = assign(self, out, now);
    Py_DECREF(out);
    if (failed < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

/* _queue(kind, handler, args, bulk, data) and _send_now(..., now): bulk PDUs made by the
 * machine, the first waiting for window space, the second numbered and sent at once. */
static PyObject *bulk_out(Core *self, PyObject *const *args, Py_ssize_t nargs, int credit) {
    Py_ssize_t expected = credit ? 5 : 6;
    if (nargs != expected) {
        PyErr_Format(PyExc_TypeError, "the core's bulk input takes %zd positional arguments",
                     expected);
        return NULL;
    }
    long kind = PyLong_AsLong(args[0]);
    long handler = PyLong_AsLong(args[1]);
    if (PyErr_Occurred()) {
        return NULL;
    }
    if (!PyTuple_Check(args[2]) || !PyBytes_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError, "the core's bulk input: args a tuple, data bytes");
        return NULL;
    }
    Out *out = new_out(kind, handler, args[2], args[3], args[4], credit);
    if (out == NULL) {
        return NULL;
    }
    int failed;
    if (credit) {
        failed = PyList_Append(self->backlog, (PyObject *)out);
    } else {
        double now = PyFloat_AsDouble(args[5]);
        failed = (now == -1.0 && PyErr_Occurred()) ? -1 : assign(self, out, now);
    }
    Py_DECREF(out);
    if (failed < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *Core_queue(Core *self, PyObject *const *args, Py_ssize_t nargs) {
    return bulk_out(self, args, nargs, 1);
}

static PyObject *Core_send_now(Core *self, PyObject *const *args, Py_ssize_t nargs) {
    return bulk_out(self, args, nargs, 0);
}

/* The small path of receive(): a well-formed REQUEST, REPLY or ACK of size bytes at p.
 * Returns 1 if it took the datagram, 0 if the machine's general path must, -1 on error. */
static int receive_small(Core *self, const unsigned char *p, Py_ssize_t size, double now) {
    if (size < HEADER_SIZE || size > SMALL_MAX || (size & 3)) {
        return 0;
    }
    long nargs = (long)((size - HEADER_SIZE) >> 2);
    long kind = p[0], handler = p[1];
    long seq = ((long)p[2] << 8) | p[3];
    long ack = ((long)p[4] << 8) | p[5];
    if (p[6] != nargs) {
        return 0;
    }
    if (kind == T_REQUEST || kind == T_REPLY) {
        PyObject *unacked = self->unacked;
        Py_ssize_t length = PyList_GET_SIZE(unacked);
        if (length && ((ack - ((Out *)PyList_GET_ITEM(unacked, 0))->seq) & MASK) == 1) {
            /* The common acknowledgment: exactly the oldest PDU (ping-pong). */
            Out *out = (Out *)PyList_GET_ITEM(unacked, 0);
            out->acked = 1;
            if (out->credit) {
                self->credits_used -= 1;
            }
            if (PyList_SetSlice(unacked, 0, 1, NULL) < 0) {
                return -1;
            }
            self->retries = 0;
            if (length > 1) {
                self->deadline = now + self->rto;
                self->has_deadline = 1;
            } else {
                self->has_deadline = 0;
            }
        } else if (length || ack != self->next_seq) {
            if (on_ack(self, ack, now) < 0) {
                return -1;
            }
        }
        PyObject *words = PyTuple_New(nargs);
        if (words == NULL) {
            return -1;
        }
        for (long i = 0; i < nargs; i++) {
            const unsigned char *w = p + HEADER_SIZE + 4 * i;
            unsigned long word = ((unsigned long)w[0] << 24) | ((unsigned long)w[1] << 16) |
                                 ((unsigned long)w[2] << 8) | w[3];
            PyObject *value = PyLong_FromUnsignedLong(word);
            if (value == NULL) {
                Py_DECREF(words);
                return -1;
            }
            PyTuple_SET_ITEM(words, i, value);
        }
        /* (type, handler, args, seq, bulk, data), built field by field (no format string). */
        PyObject *arrival = PyTuple_New(6);
        PyObject *kind_int = PyLong_FromLong(kind), *handler_int = PyLong_FromLong(handler);
        PyObject *seq_int = PyLong_FromLong(seq);
        if (arrival == NULL || kind_int == NULL || handler_int == NULL || seq_int == NULL) {
            Py_XDECREF(arrival);
            Py_XDECREF(kind_int);
            Py_XDECREF(handler_int);
            Py_XDECREF(seq_int);
            Py_DECREF(words);
            return -1;
        }
        PyTuple_SET_ITEM(arrival, 0, kind_int);
        PyTuple_SET_ITEM(arrival, 1, handler_int);
        PyTuple_SET_ITEM(arrival, 2, words);
        PyTuple_SET_ITEM(arrival, 3, seq_int);
        Py_INCREF(Py_None);
        PyTuple_SET_ITEM(arrival, 4, Py_None);
        Py_INCREF(empty_bytes);
        PyTuple_SET_ITEM(arrival, 5, empty_bytes);
        int failed;
        if (seq == self->expected && PyList_GET_SIZE(self->ready) < 2 * self->window) {
            self->expected = (seq + 1) & MASK; /* in order, and a buffer free */
            self->received += 1;
            failed = PyList_Append(self->ready, arrival);
        } else {
            failed = accept_arrival(self, arrival, seq);
        }
        Py_DECREF(arrival);
        return failed < 0 ? -1 : 1;
    }
    if (kind == T_ACK && !(nargs || handler || seq)) {
        if (PyList_GET_SIZE(self->unacked) || ack != self->next_seq) {
            if (on_ack(self, ack, now) < 0) {
                return -1;
            }
        }
        self->acks_received += 1;
        return 1;
    }
    return 0;
}

static PyObject *Core_receive(Core *self, PyObject *const *args, Py_ssize_t nargs,
                              PyObject *kwnames) {
    BIND("receive", "datagram", "now");
    PyObject *datagram = arg[0];
    double now = PyFloat_AsDouble(arg[1]);
    if (now == -1.0 && PyErr_Occurred()) {
        return NULL;
    }
    if (self->failed) {
        self->ignored += 1;
        Py_RETURN_NONE;
    }
    int taken;
    if (PyBytes_CheckExact(datagram)) {
        taken = receive_small(self, (const unsigned char *)PyBytes_AS_STRING(datagram),
                              PyBytes_GET_SIZE(datagram), now);
    } else {
        Py_buffer view;
        if (PyObject_GetBuffer(datagram, &view, PyBUF_SIMPLE) < 0) {
            return NULL;
        }
        taken = receive_small(self, (const unsigned char *)view.buf, view.len, now);
        PyBuffer_Release(&view);
    }
    if (taken < 0) {
        return NULL;
    }
    if (taken) {
        Py_RETURN_NONE;
    }
    PyObject *when = PyFloat_FromDouble(now);
    if (when == NULL) {
        return NULL;
    }
    PyObject *result =
        PyObject_CallMethodObjArgs((PyObject *)self, s_receive_other, datagram, when, NULL);
    Py_DECREF(when);
    return result;
}

static PyObject *Core_accept(Core *self, PyObject *const *args, Py_ssize_t nargs,
                             PyObject *kwnames) {
    BIND("_accept", "arrival");
    PyObject *arrival = arg[0];
    long seq;
    if (check_arrival(arrival, &seq) < 0 || accept_arrival(self, arrival, seq) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *Core_on_ack(Core *self, PyObject *const *args, Py_ssize_t nargs,
                             PyObject *kwnames) {
    BIND("_on_ack", "ack", "now");
    long ack = PyLong_AsLong(arg[0]);
    double now = PyFloat_AsDouble(arg[1]);
    if (PyErr_Occurred() || on_ack(self, ack, now) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *Core_handle_timer(Core *self, PyObject *const *args, Py_ssize_t nargs,
                                   PyObject *kwnames) {
    BIND("handle_timer", "now");
    double now = PyFloat_AsDouble(arg[0]);
    if (now == -1.0 && PyErr_Occurred()) {
        return NULL;
    }
    if (self->has_ack_deadline && now >= self->ack_deadline) {
        self->ack_now = self->ack_now || self->owed > 0;
        self->has_ack_deadline = 0;
    }
    if (!self->has_deadline || now < self->deadline || PyList_GET_SIZE(self->unacked) == 0) {
        Py_RETURN_NONE;
    }
    if (self->retries >= self->max_retries) {
        return PyObject_CallMethodNoArgs((PyObject *)self, s_fail);
    }
    self->retries += 1;
    self->timeouts += 1;
    /* Go back N: everything unacknowledged goes again, oldest first. */
    PyObject *again = PyList_GetSlice(self->unacked, 0, PyList_GET_SIZE(self->unacked));
    if (again == NULL) {
        return NULL;
    }
    Py_SETREF(self->to_send, again);
    self->deadline = now + self->rto;
    self->has_deadline = 1;
    Py_RETURN_NONE;
}

static PyObject *Core_acknowledge_now(Core *self, PyObject *unused) {
    if (self->owed) {
        self->ack_now = 1;
    }
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ outputs */

static PyObject *Core_datagrams_to_send(Core *self, PyObject *const *args, Py_ssize_t nargs,
                                        PyObject *kwnames) {
    BIND("datagrams_to_send", "now");
    double now = PyFloat_AsDouble(arg[0]);
    if (now == -1.0 && PyErr_Occurred()) {
        return NULL;
    }
    PyObject *out = PyList_New(0);
    if (out == NULL || self->failed) {
        return out;
    }
    while (PyList_GET_SIZE(self->backlog) && self->credits_used < self->window) {
        PyObject *item = pop_first(self->backlog);
        if (item == NULL || assign(self, (Out *)item, now) < 0) {
            Py_XDECREF(item);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(item);
    }
    long ack = self->handled_through;
    if (PyList_GET_SIZE(self->to_send)) {
        /* Take the list (the reference iterates over it, then starts a new one). */
        PyObject *items = self->to_send;
        self->to_send = PyList_New(0);
        if (self->to_send == NULL) {
            self->to_send = items;
            Py_DECREF(out);
            return NULL;
        }
        Py_ssize_t count = PyList_GET_SIZE(items);
        for (Py_ssize_t i = 0; i < count; i++) {
            Out *item = (Out *)PyList_GET_ITEM(items, i);
            if (item->acked) {
                continue;
            }
            if (item->transmissions) {
                self->retransmitted += 1;
            } else {
                self->sent += 1;
            }
            item->transmissions += 1;
            PyObject *datagram;
            if (item->bulk == Py_None) {
                datagram = pack_small(item->type, item->handler, item->seq, ack, item->args);
            } else {
                datagram = PyObject_CallMethod((PyObject *)self, "_build", "llllOOO", item->type,
                                               item->seq, ack, item->handler, item->args,
                                               item->bulk, item->data);
            }
            if (datagram == NULL || PyList_Append(out, datagram) < 0) {
                Py_XDECREF(datagram);
                Py_DECREF(items);
                Py_DECREF(out);
                return NULL;
            }
            Py_DECREF(datagram);
        }
        Py_DECREF(items);
        if (PyList_GET_SIZE(out)) {
            self->owed = 0; /* advertised */
            self->ack_now = 0;
            self->has_ack_deadline = 0;
            return out;
        }
    }
    long owed = self->owed;
    if (!(owed || self->ack_now)) {
        return out;
    }
    if (owed && !self->has_ack_deadline) {
        self->ack_deadline = now + self->ack_delay;
        self->has_ack_deadline = 1;
    }
    if (self->ack_now ||
        (owed && (owed >= self->ack_threshold ||
                  (self->has_ack_deadline && now >= self->ack_deadline)))) {
        self->acks_sent += 1;
        self->owed = 0;
        self->ack_now = 0;
        self->has_ack_deadline = 0;
        PyObject *datagram = pack_small(T_ACK, 0, 0, ack, NULL);
        if (datagram == NULL || PyList_Append(out, datagram) < 0) {
            Py_XDECREF(datagram);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(datagram);
    }
    return out;
}

static PyObject *Core_take(Core *self, PyObject *unused) {
    self->has_open_token = 0;
    if (PyList_GET_SIZE(self->events)) {
        return pop_first(self->events);
    }
    while (PyList_GET_SIZE(self->ready)) {
        PyObject *arrival = pop_first(self->ready);
        if (arrival == NULL) {
            return NULL;
        }
        long seq = PyLong_AsLong(PyTuple_GET_ITEM(arrival, 3));
        long kind = PyLong_AsLong(PyTuple_GET_ITEM(arrival, 0));
        if (PyErr_Occurred()) {
            Py_DECREF(arrival);
            return NULL;
        }
        self->handled_through = (seq + 1) & MASK;
        self->owed += 1;
        self->handled += 1;
        if (kind == T_REQUEST) {
            self->open_token = seq;
            self->has_open_token = 1;
            self->open_type = T_REQUEST;
            Py_INCREF(arrival);
            Py_SETREF(self->open_pdu, arrival);
            return arrival;
        }
        if (kind == T_REPLY) {
            return arrival;
        }
        PyObject *event = PyObject_CallMethodOneArg((PyObject *)self, s_event, arrival);
        Py_DECREF(arrival);
        if (event != Py_None) {
            return event; /* or NULL: _event raised */
        }
        Py_DECREF(event);
    }
    Py_RETURN_NONE;
}

static PyObject *Core_get_timer(Core *self, PyObject *unused) {
    if (!self->has_ack_deadline) {
        return optional_float(self->has_deadline, self->deadline);
    }
    if (!self->has_deadline || self->ack_deadline < self->deadline) {
        return PyFloat_FromDouble(self->ack_deadline);
    }
    return PyFloat_FromDouble(self->deadline);
}

/* ------------------------------------------------------------------ state */

static PyObject *Core_request_room(Core *self, void *closure) {
    if (self->failed) {
        return PyLong_FromLong(0);
    }
    long room = self->window - self->credits_used - (long)PyList_GET_SIZE(self->backlog);
    return PyLong_FromLong(room > 0 ? room : 0);
}

static PyObject *Core_idle(Core *self, void *closure) {
    return PyBool_FromLong(!(PyList_GET_SIZE(self->unacked) || PyList_GET_SIZE(self->backlog)));
}

static PyObject *Core_backlog(Core *self, void *closure) {
    return PyLong_FromSsize_t(PyList_GET_SIZE(self->backlog));
}

static PyObject *Core_pending(Core *self, void *closure) {
    return PyBool_FromLong(PyList_GET_SIZE(self->events) || PyList_GET_SIZE(self->ready));
}

static PyObject *Core_arrivals_full(Core *self, void *closure) {
    return PyBool_FromLong(PyList_GET_SIZE(self->ready) >= 2 * self->window);
}

static PyObject *Core_has_output(Core *self, void *closure) {
    return PyBool_FromLong(PyList_GET_SIZE(self->backlog) || PyList_GET_SIZE(self->to_send) ||
                           self->owed || self->ack_now);
}

/* Optional floats and the optional token, as the reference's attributes (None or a value). */
static int set_optional_float(PyObject *value, char *has, double *field) {
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "the core's attributes cannot be deleted");
        return -1;
    }
    if (value == Py_None) {
        *has = 0;
        return 0;
    }
    double number = PyFloat_AsDouble(value);
    if (number == -1.0 && PyErr_Occurred()) {
        return -1;
    }
    *field = number;
    *has = 1;
    return 0;
}

static PyObject *Core_get_deadline(Core *self, void *closure) {
    return optional_float(self->has_deadline, self->deadline);
}

static int Core_set_deadline(Core *self, PyObject *value, void *closure) {
    return set_optional_float(value, &self->has_deadline, &self->deadline);
}

static PyObject *Core_get_ack_deadline(Core *self, void *closure) {
    return optional_float(self->has_ack_deadline, self->ack_deadline);
}

static int Core_set_ack_deadline(Core *self, PyObject *value, void *closure) {
    return set_optional_float(value, &self->has_ack_deadline, &self->ack_deadline);
}

static PyObject *Core_get_open_token(Core *self, void *closure) {
    if (!self->has_open_token) {
        Py_RETURN_NONE;
    }
    return PyLong_FromLong(self->open_token);
}

static int Core_set_open_token(Core *self, PyObject *value, void *closure) {
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "the core's attributes cannot be deleted");
        return -1;
    }
    if (value == Py_None) {
        self->has_open_token = 0;
        return 0;
    }
    long token = PyLong_AsLong(value);
    if (token == -1 && PyErr_Occurred()) {
        return -1;
    }
    self->open_token = token;
    self->has_open_token = 1;
    return 0;
}

static PyGetSetDef Core_getset[] = {
    {"request_room", (getter)Core_request_room, NULL,
     "How many more requests (or bulk operations) are accepted now (0 once failed).", NULL},
    {"idle", (getter)Core_idle, NULL,
     "Nothing sent is unacknowledged and nothing waits to be sent.", NULL},
    {"backlog", (getter)Core_backlog, NULL,
     "Requests and chunks accepted and waiting for window space.", NULL},
    {"pending", (getter)Core_pending, NULL, "Events are waiting to be taken.", NULL},
    {"arrivals_full", (getter)Core_arrivals_full, NULL,
     "2w arrivals wait for their handlers.", NULL},
    {"has_output", (getter)Core_has_output, NULL,
     "False only if datagrams_to_send would return nothing and change nothing.", NULL},
    {"_deadline", (getter)Core_get_deadline, (setter)Core_set_deadline, NULL, NULL},
    {"_ack_deadline", (getter)Core_get_ack_deadline, (setter)Core_set_ack_deadline, NULL, NULL},
    {"_open_token", (getter)Core_get_open_token, (setter)Core_set_open_token, NULL, NULL},
    {NULL},
};

#define MEMBER(name, type, field) {name, type, offsetof(Core, field), 0, NULL}
#define READ_ONLY(name, type, field) {name, type, offsetof(Core, field), READONLY, NULL}

static PyMemberDef Core_members[] = {
    MEMBER("window", T_LONG, window),
    MEMBER("rto", T_DOUBLE, rto),
    MEMBER("max_retries", T_LONG, max_retries),
    MEMBER("ack_delay", T_DOUBLE, ack_delay),
    MEMBER("chunk_size", T_LONG, chunk_size),
    MEMBER("_ack_threshold", T_LONG, ack_threshold),
    MEMBER("_failed", T_BOOL, failed),
    MEMBER("_next_seq", T_LONG, next_seq),
    MEMBER("_credits_used", T_LONG, credits_used),
    MEMBER("_retries", T_LONG, retries),
    READ_ONLY("_unacked", T_OBJECT, unacked),
    READ_ONLY("_backlog", T_OBJECT, backlog),
    READ_ONLY("_to_send", T_OBJECT, to_send),
    MEMBER("_expected", T_LONG, expected),
    MEMBER("_handled_through", T_LONG, handled_through),
    MEMBER("_owed", T_LONG, owed),
    MEMBER("_ack_now", T_BOOL, ack_now),
    MEMBER("_open_type", T_LONG, open_type),
    MEMBER("_open_pdu", T_OBJECT, open_pdu),
    READ_ONLY("_ready", T_OBJECT, ready),
    READ_ONLY("_events", T_OBJECT, events),
    MEMBER("_sent", T_LONG, sent),
    MEMBER("_retransmitted", T_LONG, retransmitted),
    MEMBER("_timeouts", T_LONG, timeouts),
    MEMBER("_acks_sent", T_LONG, acks_sent),
    MEMBER("_acks_received", T_LONG, acks_received),
    MEMBER("_received", T_LONG, received),
    MEMBER("_handled", T_LONG, handled),
    MEMBER("_duplicates", T_LONG, duplicates),
    MEMBER("_out_of_order", T_LONG, out_of_order),
    MEMBER("_no_buffer", T_LONG, no_buffer),
    MEMBER("_malformed", T_LONG, malformed),
    MEMBER("_stale_acks", T_LONG, stale_acks),
    MEMBER("_ignored", T_LONG, ignored),
    {NULL},
};

static PyMethodDef Core_methods[] = {
    {"request", (PyCFunction)(void (*)(void))Core_request, METH_FASTCALL | METH_KEYWORDS,
     "request(handler, args, now): queue a request."},
    {"reply", (PyCFunction)(void (*)(void))Core_reply, METH_FASTCALL | METH_KEYWORDS,
     "reply(token, handler, args, now): reply to the request being handled."},
    {"_queue", (PyCFunction)(void (*)(void))Core_queue, METH_FASTCALL,
     "_queue(kind, handler, args, bulk, data): a bulk PDU for the backlog."},
    {"_send_now", (PyCFunction)(void (*)(void))Core_send_now, METH_FASTCALL,
     "_send_now(kind, handler, args, bulk, data, now): a bulk PDU sent at once."},
    {"receive", (PyCFunction)(void (*)(void))Core_receive, METH_FASTCALL | METH_KEYWORDS,
     "receive(datagram, now): feed one datagram from the peer."},
    {"_accept", (PyCFunction)(void (*)(void))Core_accept, METH_FASTCALL | METH_KEYWORDS, "_accept(arrival): the sequence check."},
    {"_on_ack", (PyCFunction)(void (*)(void))Core_on_ack, METH_FASTCALL | METH_KEYWORDS,
     "_on_ack(ack, now): a cumulative acknowledgment."},
    {"handle_timer", (PyCFunction)(void (*)(void))Core_handle_timer, METH_FASTCALL | METH_KEYWORDS,
     "handle_timer(now): act on the expired timers."},
    {"acknowledge_now", (PyCFunction)Core_acknowledge_now, METH_NOARGS,
     "acknowledge_now(): advertise everything handled at the next datagrams_to_send."},
    {"datagrams_to_send", (PyCFunction)(void (*)(void))Core_datagrams_to_send,
     METH_FASTCALL | METH_KEYWORDS,
     "datagrams_to_send(now): the datagrams to transmit now, in order."},
    {"take", (PyCFunction)Core_take, METH_NOARGS, "take(): the next arrival or event, or None."},
    {"get_timer", (PyCFunction)Core_get_timer, METH_NOARGS,
     "get_timer(): when to call handle_timer next, or None."},
    {NULL},
};

static PyTypeObject CoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "stacklib.layers.uam._uamcore.MachineCore",
    .tp_doc = "The UAM machine's core in C (machine_core.MachineCore is its reference).",
    .tp_basicsize = sizeof(Core),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_new = Core_new,
    .tp_init = (initproc)Core_init,
    .tp_dealloc = (destructor)Core_dealloc,
    .tp_traverse = (traverseproc)Core_traverse,
    .tp_clear = (inquiry)Core_clear,
    .tp_methods = Core_methods,
    .tp_members = Core_members,
    .tp_getset = Core_getset,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_uamcore",
    .m_doc = "The UAM machine's core in C (see machine_core.py).",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__uamcore(void) {
    if (PyType_Ready(&OutType) < 0 || PyType_Ready(&CoreType) < 0) {
        return NULL;
    }
#define INTERN(var, text)                                                                     \
    if ((var = PyUnicode_InternFromString(text)) == NULL) return NULL;
    INTERN(s_check_room, "_check_room");
    INTERN(s_check_args, "_check_args");
    INTERN(s_check_handler, "_check_handler");
    INTERN(s_take_token, "_take_token");
    INTERN(s_receive_other, "_receive_other");
    INTERN(s_event, "_event");
    INTERN(s_fail, "_fail");
#undef INTERN
    if ((empty_bytes = PyBytes_FromStringAndSize(NULL, 0)) == NULL) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) {
        return NULL;
    }
    Py_INCREF(&CoreType);
    if (PyModule_AddObject(m, "MachineCore", (PyObject *)&CoreType) < 0) {
        Py_DECREF(&CoreType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
