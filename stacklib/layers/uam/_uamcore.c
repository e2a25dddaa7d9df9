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
 * The types, the interned names and the small helpers are in uamcore_types.h, the attribute
 * tables in uamcore_state.h (one translation unit: both are included here only).
 *
 * Protocol (paper 000 §5.1): go-back-N with a fixed window w; every PDU but ACK is numbered
 * modulo 65536 and carries the cumulative acknowledgment of what its sender has handled.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#define MASK 0xFFFF
#define HALF 0x8000
#define T_REQUEST 1
#define T_REPLY 2
#define T_ACK 3
#define HEADER_SIZE 8
#define MAX_ARGS 4
#define SMALL_MAX (HEADER_SIZE + 4 * MAX_ARGS)
#define WORD_MAX 0xFFFFFFFFUL

#include "uamcore_types.h"

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
    drop_front(unacked, count);
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
            drop_front(unacked, 1);
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

/* Where the datagrams to send go, in order: a small PDU (to be packed from its fields, words
 * NULL for none) or a datagram built (bytes, a bulk PDU's).  Each returns 0, or -1 with an
 * error set (the walk then stops, as the reference's would on that error). */
typedef struct Emitter {
    int (*small)(struct Emitter *, long type, long handler, long seq, long ack, PyObject *words);
    int (*datagram)(struct Emitter *, PyObject *datagram);
} Emitter;

/* The reference's datagrams_to_send(now), each datagram handed to `emit`: 0, or -1. */
static int emit_datagrams(Core *self, double now, Emitter *emit) {
    if (self->failed) {
        return 0;
    }
    while (PyList_GET_SIZE(self->backlog) && self->credits_used < self->window) {
        PyObject *item = pop_first(self->backlog);
        if (item == NULL || assign(self, (Out *)item, now) < 0) {
            Py_XDECREF(item);
            return -1;
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
            return -1;
        }
        Py_ssize_t count = PyList_GET_SIZE(items);
        int emitted = 0;
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
            int failed;
            if (item->bulk == Py_None) {
                failed = emit->small(emit, item->type, item->handler, item->seq, ack, item->args);
            } else {
                PyObject *datagram = PyObject_CallMethod(
                    (PyObject *)self, "_build", "llllOOO", item->type, item->seq, ack,
                    item->handler, item->args, item->bulk, item->data);
                failed = datagram == NULL ? -1 : emit->datagram(emit, datagram);
                Py_XDECREF(datagram);
            }
            if (failed < 0) {
                Py_DECREF(items);
                return -1;
            }
            emitted = 1;
        }
        Py_DECREF(items);
        if (emitted) {
            self->owed = 0; /* advertised */
            self->ack_now = 0;
            self->has_ack_deadline = 0;
            return 0;
        }
    }
    long owed = self->owed;
    if (!(owed || self->ack_now)) {
        return 0;
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
        return emit->small(emit, T_ACK, 0, 0, ack, NULL);
    }
    return 0;
}

/* The emitter of datagrams_to_send: a list of bytes. */
typedef struct {
    Emitter emit;
    PyObject *list;
} ListEmitter;

static int list_datagram(Emitter *emit, PyObject *datagram) {
    return PyList_Append(((ListEmitter *)emit)->list, datagram);
}

static int list_small(Emitter *emit, long type, long handler, long seq, long ack,
                      PyObject *words) {
    PyObject *datagram = pack_small(type, handler, seq, ack, words);
    int failed = datagram == NULL ? -1 : list_datagram(emit, datagram);
    Py_XDECREF(datagram);
    return failed;
}

static PyObject *datagrams_to_send(Core *self, double now) {
    ListEmitter emit = {{list_small, list_datagram}, PyList_New(0)};
    if (emit.list == NULL) {
        return NULL;
    }
    if (emit_datagrams(self, now, &emit.emit) < 0) {
        Py_DECREF(emit.list);
        return NULL;
    }
    return emit.list;
}

static PyObject *Core_datagrams_to_send(Core *self, PyObject *const *args, Py_ssize_t nargs,
                                        PyObject *kwnames) {
    BIND("datagrams_to_send", "now");
    double now = PyFloat_AsDouble(arg[0]);
    if (now == -1.0 && PyErr_Occurred()) {
        return NULL;
    }
    return datagrams_to_send(self, now);
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

#include "uamcore_state.h"
#include "uamcore_express.h"

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
    {"express_poll", (PyCFunction)(void (*)(void))Core_express_poll, METH_FASTCALL,
     "express_poll(rx, clock, handlers, service, peer): the lean poll on a native queue."},
    {"express_send", (PyCFunction)(void (*)(void))Core_express_send, METH_FASTCALL,
     "express_send(tx, now): datagrams_to_send(now) written to a native queue."},
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
    INTERN(s_native_queue, "native_queue");
    INTERN(s_dispatch, "_dispatch");
    INTERN(s_poll_now, "_poll_now");
    INTERN(s_current_machine, "_current_machine");
    INTERN(s_current_token, "_current_token");
    INTERN(s_current_peer, "_current_peer");
    INTERN(s_unknown_handler, "unknown_handler");
    INTERN(s_native_handler, "native_handler");
#undef INTERN
    if ((one_int = PyLong_FromLong(1)) == NULL) {
        return NULL;
    }
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
