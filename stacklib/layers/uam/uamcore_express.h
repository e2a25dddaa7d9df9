/* The UAM core's express lane: a lean poll and a transmission that read and write a native
 * queue (unet/native_queue.h; the shm ring's core) themselves, so that a round trip over shm
 * makes no Python call between the ring and the machine.  Included by _uamcore.c only, after
 * the core's operations it reuses (receive_small, take, emit_datagrams).
 *
 * The contract is the lean path's (stacklib/layers/uam/lean_path.py, whose general forms are
 * the reference, compared by tests/layers/test_uam_express.py):
 *   express_poll(rx, clock, handlers, service, peer) is LeanPath._poll_arrivals for one
 *   machine whose peer's datagrams arrive on the queue rx: each message is fed to the machine
 *   (the small path here, the rest through _receive_other) and what it made ready is handled
 *   at once, requests and replies by calling their handlers from `handlers` as
 *   UamService._run_handlers does (setting the service's current request around a request
 *   handler), everything else by service._dispatch; the clock (a callable, or a float: the
 *   offset of trio's default clock, perf_counter() + offset) is read once, at the first
 *   message, and left in service._poll_now for the handlers' replies.  Returns how many
 *   messages it took, or -1 minus that number if it found the queue broken (one call tells
 *   an empty poll); express_handled counts the arrivals handled (when no handler raised:
 *   the reference's count stops short of the call that raised), express_taken,
 *   express_bytes and express_broken what it took, for the endpoint's counters (read them
 *   also after an exception).
 *   express_send(tx, now) is datagrams_to_send(now) written to the queue tx in order (small
 *   PDUs packed straight into it, no bytes object): None when there was nothing to send, else
 *   (sent, sent_bytes, wakes, rest), rest None when all went, else the list of those from the
 *   first the queue refused (full, too long, broken) on, for the endpoint's general send;
 *   express_sent, express_sent_bytes and express_wakes hold the same counts (wakes: writes
 *   that found the consumer asleep).
 * One difference remains, on an error path: when the queue's wake-up of a waiting producer
 * raises in the release of a message, this form has already fed the message to the machine
 * (and counted it), while the reference's take() raised before it had the message; both
 * raise, and go-back-N makes either right.
 */
#ifndef STACKLIB_UAMCORE_EXPRESS_H
#define STACKLIB_UAMCORE_EXPRESS_H

#include "layers/uam/native_handler.h"
#include "unet/native_queue.h"

static PyObject *s_native_queue, *s_dispatch, *s_poll_now, *s_current_machine;
static PyObject *s_current_token, *s_current_peer, *s_unknown_handler, *s_native_handler;

/* A field of the service set without PyObject_SetAttr's lookup (some 200 instructions: the
 * type's MRO, then the descriptor's __set__): where the service's type keeps the field in a
 * data descriptor with a C setter (a compiled class's attribute), that setter, found once per
 * type and version tag (a type changed since, or another type, looks again; a type without a
 * valid tag always takes PyObject_SetAttr).  The setter checks the value's type as
 * PyObject_SetAttr would have it checked. */
typedef struct {
    PyObject **name;          /* the interned attribute name */
    PyTypeObject *type;       /* compared only, never dereferenced while stale */
    unsigned int version;     /* type->tp_version_tag when looked up */
    setter set;               /* NULL: PyObject_SetAttr */
    void *closure;
} FieldSetter;

static FieldSetter set_poll_now = {&s_poll_now}, set_current_machine = {&s_current_machine},
                   set_current_token = {&s_current_token}, set_current_peer = {&s_current_peer};

static int set_field(FieldSetter *field, PyObject *object, PyObject *value) {
    PyTypeObject *type = Py_TYPE(object);
    if (field->type != type || field->version != type->tp_version_tag ||
        !(type->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG)) {
        field->set = NULL;
        field->type = NULL;
        if (type->tp_setattro == PyObject_GenericSetAttr) {
            PyObject *descriptor = _PyType_Lookup(type, *field->name); /* (borrowed) */
            if (descriptor != NULL && Py_IS_TYPE(descriptor, &PyGetSetDescr_Type)) {
                PyGetSetDef *def = ((PyGetSetDescrObject *)descriptor)->d_getset;
                field->set = def->set;
                field->closure = def->closure;
            }
        }
        if (type->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG) { /* (the lookup may assign one) */
            field->type = type;
            field->version = type->tp_version_tag;
        }
    }
    if (field->set != NULL) {
        return field->set(object, value, field->closure);
    }
    return PyObject_SetAttr(object, *field->name, value);
}

/* The table of the last queue type seen (a type's table is fetched once from its capsule). */
static PyTypeObject *queue_type = NULL;
static NativeQueueAPI *queue_api = NULL;
static PyObject *queue_capsule = NULL; /* kept, so the table's module stays loaded */

static NativeQueueAPI *api_of(PyObject *queue) {
    if (Py_TYPE(queue) == queue_type) {
        return queue_api;
    }
    PyObject *capsule = PyObject_GetAttr(queue, s_native_queue);
    if (capsule == NULL) {
        PyErr_Format(PyExc_TypeError,
                     "the express lane needs a native queue (an object with a native_queue "
                     "capsule), not %.100s",
                     Py_TYPE(queue)->tp_name);
        return NULL;
    }
    NativeQueueAPI *api = PyCapsule_GetPointer(capsule, NATIVE_QUEUE_CAPSULE);
    if (api == NULL || api->type != Py_TYPE(queue)) {
        Py_DECREF(capsule);
        if (api != NULL) {
            PyErr_Format(PyExc_TypeError, "%.100s.native_queue serves another type",
                         Py_TYPE(queue)->tp_name);
        }
        return NULL;
    }
    Py_XSETREF(queue_capsule, capsule);
    queue_type = Py_TYPE(queue);
    queue_api = api;
    return api;
}

/* The native table of a request handler (native_handler.h), or NULL (none; or an error, set).
 * The last type that had one and the last that had none are remembered: a poll meets the
 * same few handler types over and over. */
static PyTypeObject *native_type = NULL, *plain_type = NULL;
static NativeHandlerAPI *native_api = NULL;
static PyObject *native_capsule = NULL; /* kept, so the table's module stays loaded */

static NativeHandlerAPI *native_handler_of(PyObject *handler) {
    PyTypeObject *type = Py_TYPE(handler);
    if (type == native_type) {
        return native_api;
    }
    if (type == plain_type) {
        return NULL;
    }
    /* On the type, not the object: a bound method's attributes are its function's. */
    PyObject *capsule = PyObject_GetAttr((PyObject *)type, s_native_handler);
    if (capsule == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)) {
            return NULL;
        }
        PyErr_Clear();
        plain_type = type;
        return NULL;
    }
    NativeHandlerAPI *api = PyCapsule_GetPointer(capsule, NATIVE_HANDLER_CAPSULE);
    if (api == NULL || api->type != type) {
        Py_DECREF(capsule);
        if (api != NULL) {
            PyErr_Format(PyExc_TypeError, "%.100s.native_handler serves another type",
                         type->tp_name);
        }
        return NULL;
    }
    Py_XSETREF(native_capsule, capsule);
    native_type = type;
    native_api = api;
    return api;
}

/* Let handler's native table answer the request `item` (words: a tuple of exact ints, as
 * receive_small makes them): 1 replied (the reply made, as the service's reply() from the
 * handler makes it, at the poll's `now`), 0 declined (call the handler), -1 error. */
static int answer_natively(Core *self, NativeHandlerAPI *api, PyObject *handler,
                           PyObject *words, double now) {
    Py_ssize_t nwords = PyTuple_GET_SIZE(words);
    if (nwords > MAX_ARGS || !self->has_open_token || self->open_type != T_REQUEST ||
        self->failed) {
        return 0; /* (the call's reply raises as the reference's would) */
    }
    uint32_t in[MAX_ARGS], out[MAX_ARGS];
    for (Py_ssize_t i = 0; i < nwords; i++) {
        long value = small_value(PyTuple_GET_ITEM(words, i), WORD_MAX);
        if (value < 0) {
            return 0;
        }
        in[i] = (uint32_t)value;
    }
    long reply_handler = -1;
    if (api->request == NULL ||
        api->request(handler, in, nwords, &reply_handler, out) != NH_REPLIED ||
        reply_handler < 0 || reply_handler > 255) {
        return 0;
    }
    PyObject *args = PyTuple_New(MAX_ARGS);
    if (args == NULL) {
        return -1;
    }
    for (Py_ssize_t i = 0; i < MAX_ARGS; i++) {
        PyObject *word = PyLong_FromUnsignedLong(out[i]);
        if (word == NULL) {
            Py_DECREF(args);
            return -1;
        }
        PyTuple_SET_ITEM(args, i, word);
    }
    self->has_open_token = 0;
    Out *reply = new_out(T_REPLY, reply_handler, args, Py_None, empty_bytes, 0);
    Py_DECREF(args);
    if (reply == NULL) {
        return -1;
    }
    int failed = assign(self, reply, now);
    Py_DECREF(reply);
    return failed < 0 ? -1 : 1;
}

/* Let handler's native table take the reply whose words are `words` (a tuple of exact ints):
 * 1 handled, 0 declined (call the handler), -1 error. */
static int reply_natively(NativeHandlerAPI *api, PyObject *handler, PyObject *words) {
    Py_ssize_t nwords = PyTuple_GET_SIZE(words);
    if (api->reply == NULL || nwords > MAX_ARGS) {
        return 0;
    }
    uint32_t in[MAX_ARGS];
    for (Py_ssize_t i = 0; i < nwords; i++) {
        long value = small_value(PyTuple_GET_ITEM(words, i), WORD_MAX);
        if (value < 0) {
            return 0;
        }
        in[i] = (uint32_t)value;
    }
    int done = api->reply(handler, in, nwords);
    return done == NH_ERROR ? -1 : done == NH_HANDLED;
}

/* service.<name> += 1 (a rare count kept by the service). */
static int count_on(PyObject *service, PyObject *name) {
    PyObject *value = PyObject_GetAttr(service, name);
    if (value == NULL) {
        return -1;
    }
    PyObject *more = PyNumber_Add(value, one_int);
    Py_DECREF(value);
    if (more == NULL) {
        return -1;
    }
    int failed = PyObject_SetAttr(service, name, more);
    Py_DECREF(more);
    return failed;
}

/* Handle one thing take() returned, as UamService._run_handlers does. */
static int run_item(Core *self, PyObject *item, PyObject *handlers, PyObject *service,
                    PyObject *peer, double now) {
    if (!PyTuple_Check(item)) {
        PyObject *done =
            PyObject_CallMethodObjArgs(service, s_dispatch, peer, (PyObject *)self, item, NULL);
        Py_XDECREF(done);
        return done == NULL ? -1 : 0;
    }
    PyObject *index = PyTuple_GET_ITEM(item, 1);
    PyObject *handler = PyObject_GetItem(handlers, index);
    if (handler == NULL) {
        return -1;
    }
    if (handler == Py_None) {
        Py_DECREF(handler);
        return count_on(service, s_unknown_handler);
    }
    long kind = PyLong_AsLong(PyTuple_GET_ITEM(item, 0));
    int request = kind == T_REQUEST;
    if (PyTuple_CheckExact(PyTuple_GET_ITEM(item, 2))) {
        NativeHandlerAPI *api = native_handler_of(handler);
        int answered = api == NULL ? (PyErr_Occurred() ? -1 : 0)
                       : request   ? answer_natively(self, api, handler,
                                                     PyTuple_GET_ITEM(item, 2), now)
                                   : reply_natively(api, handler, PyTuple_GET_ITEM(item, 2));
        if (answered != 0) {
            Py_DECREF(handler);
            return answered < 0 ? -1 : 0;
        }
    }
    if (request && (set_field(&set_current_machine, service, (PyObject *)self) < 0 ||
                    set_field(&set_current_token, service, PyTuple_GET_ITEM(item, 3)) < 0 ||
                    set_field(&set_current_peer, service, peer) < 0)) {
        Py_DECREF(handler);
        return -1;
    }
    /* handler(peer, *words), without a tuple for the call (words are at most MAX_ARGS). */
    PyObject *words = PySequence_Tuple(PyTuple_GET_ITEM(item, 2)); /* (a tuple: a new ref) */
    PyObject *result = NULL;
    if (words != NULL) {
        Py_ssize_t nwords = PyTuple_GET_SIZE(words);
        if (nwords <= MAX_ARGS) {
            PyObject *call[1 + MAX_ARGS];
            call[0] = peer;
            for (Py_ssize_t i = 0; i < nwords; i++) {
                call[1 + i] = PyTuple_GET_ITEM(words, i);
            }
            result = PyObject_Vectorcall(handler, call, 1 + nwords, NULL);
        } else { /* (not from the small path; kept general) */
            PyObject *first = PyTuple_Pack(1, peer);
            PyObject *all = first == NULL ? NULL : PySequence_Concat(first, words);
            result = all == NULL ? NULL : PyObject_Call(handler, all, NULL);
            Py_XDECREF(first);
            Py_XDECREF(all);
        }
        Py_DECREF(words);
    }
    Py_DECREF(handler);
    if (result == NULL) {
        return -1; /* the current request stays set, as in _run_handlers; the poll clears it */
    }
    Py_DECREF(result);
    if (request && set_field(&set_current_machine, service, Py_None) < 0) {
        return -1;
    }
    return 0;
}

static PyObject *Core_take(Core *self, PyObject *unused);

/* offset + time.perf_counter(), as a float: trio's default clock, read without a Python call
 * where perf_counter is CLOCK_MONOTONIC (Linux; converted to seconds as CPython converts it),
 * elsewhere through time.perf_counter itself. */
static PyObject *read_default_clock(PyObject *offset) {
#ifdef __linux__
    struct timespec ts;
    if (clock_gettime(CLOCK_MONOTONIC, &ts) != 0) {
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    int64_t ns = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
    double seconds = ns % 1000000000 == 0 ? (double)(ns / 1000000000) : (double)ns / 1e9;
#else
    PyObject *time = PyImport_ImportModule("time");
    PyObject *reading = time == NULL ? NULL : PyObject_CallMethod(time, "perf_counter", NULL);
    Py_XDECREF(time);
    if (reading == NULL) {
        return NULL;
    }
    double seconds = PyFloat_AsDouble(reading);
    Py_DECREF(reading);
    if (seconds == -1.0 && PyErr_Occurred()) {
        return NULL;
    }
#endif
    return PyFloat_FromDouble(PyFloat_AS_DOUBLE(offset) + seconds);
}

static PyObject *Core_express_poll(Core *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_Format(PyExc_TypeError,
                     "express_poll(rx, clock, handlers, service, peer) takes 5 arguments "
                     "(%zd given)",
                     nargs);
        return NULL;
    }
    PyObject *rx = args[0], *clock = args[1], *handlers = args[2], *service = args[3];
    PyObject *peer = args[4];
    self->express_taken = 0;
    self->express_bytes = 0;
    self->express_handled = 0;
    self->express_broken = 0;
    NativeQueueAPI *api = api_of(rx);
    if (api == NULL) {
        return NULL;
    }
    double now = 0.0;
    int have_now = 0;
    for (;;) {
        const unsigned char *data;
        Py_ssize_t length;
        int found = api->peek(rx, &data, &length);
        if (found == NQ_NONE) {
            break;
        }
        if (found == NQ_BROKEN) {
            self->express_broken = 1;
            break;
        }
        if (found != NQ_DONE) {
            return NULL;
        }
        if (!have_now) {
            PyObject *reading = PyFloat_CheckExact(clock) ? read_default_clock(clock)
                                                          : PyObject_CallNoArgs(clock);
            int failed = reading == NULL;
            if (!failed) {
                now = PyFloat_AsDouble(reading);
                failed = (now == -1.0 && PyErr_Occurred()) ||
                         set_field(&set_poll_now, service, reading) < 0;
                Py_DECREF(reading);
            }
            if (failed) {
                /* The message goes, uncounted, as in the reference (which took it before
                 * reading the clock) and the general lean poll: the peer resends it.  (A
                 * wake-up that raises in the release gives way to the clock's error.) */
                PyObject *type, *value, *traceback;
                PyErr_Fetch(&type, &value, &traceback);
                if (api->release(rx) < 0) {
                    PyErr_Clear();
                }
                PyErr_Restore(type, value, traceback);
                return NULL;
            }
            have_now = 1;
        }
        self->express_taken += 1;
        self->express_bytes += (long)length;
        int taken = 1;
        if (self->failed) {
            self->ignored += 1;
        } else {
            taken = receive_small(self, data, length, now);
        }
        if (taken) { /* decoded (or ignored): the record can go */
            if (api->release(rx) < 0 || taken < 0) {
                return NULL;
            }
        } else { /* the general path, on a copy */
            PyObject *datagram = PyBytes_FromStringAndSize((const char *)data, length);
            if (datagram == NULL || api->release(rx) < 0) {
                Py_XDECREF(datagram);
                return NULL;
            }
            PyObject *when = PyFloat_FromDouble(now);
            PyObject *done = when == NULL ? NULL
                                          : PyObject_CallMethodObjArgs((PyObject *)self,
                                                                       s_receive_other,
                                                                       datagram, when, NULL);
            Py_DECREF(datagram);
            Py_XDECREF(when);
            if (done == NULL) {
                return NULL;
            }
            Py_DECREF(done);
        }
        PyObject *item;
        while ((item = Core_take(self, NULL)) != Py_None) {
            if (item == NULL) {
                return NULL;
            }
            self->express_handled += 1;
            int failed = run_item(self, item, handlers, service, peer, now);
            Py_DECREF(item);
            if (failed) {
                return NULL;
            }
        }
        Py_DECREF(item);
    }
    long taken = self->express_taken;
    return PyLong_FromLong(self->express_broken ? -1 - taken : taken);
}

/* The emitter of express_send: each datagram straight into the queue (a small PDU packed on
 * the stack: no bytes object), until the queue refuses one; that one and the rest as bytes in
 * `rest`, for the endpoint's general send.  A write that raises stops the writing; the walk
 * goes on (the reference builds every datagram before it writes), and the error is raised at
 * the end. */
typedef struct {
    Emitter emit;
    Core *core;
    PyObject *tx;
    NativeQueueAPI *api;
    long count;     /* datagrams handed over */
    PyObject *rest; /* list, from the first refused datagram on (NULL: none refused) */
    int raised;     /* a write raised: its error is kept below */
    PyObject *error_type, *error_value, *error_traceback;
} QueueEmitter;

/* Write data unless an earlier datagram was refused or a write raised: 1 written (or dropped
 * after a raise), 0 refused (the caller appends it to rest), -1 error. */
static int queue_write(QueueEmitter *q, const char *data, Py_ssize_t length) {
    if (q->rest != NULL) {
        return 0;
    }
    if (q->raised) {
        return 1;
    }
    int written = q->api->write(q->tx, data, length);
    if (written == NQ_DONE || written == NQ_WAKE) {
        Core *self = q->core;
        self->express_sent += 1;
        self->express_sent_bytes += (long)length;
        self->express_wakes += written == NQ_WAKE;
        return 1;
    }
    if (written == NQ_ERROR) {
        q->raised = 1;
        PyErr_Fetch(&q->error_type, &q->error_value, &q->error_traceback);
        return 1;
    }
    q->rest = PyList_New(0); /* refused (full, too long, broken): it and the rest go on */
    return q->rest == NULL ? -1 : 0;
}

static int queue_datagram(Emitter *emit, PyObject *datagram) {
    QueueEmitter *q = (QueueEmitter *)emit;
    q->count += 1;
    int written;
    if (PyBytes_CheckExact(datagram)) {
        written = queue_write(q, PyBytes_AS_STRING(datagram), PyBytes_GET_SIZE(datagram));
    } else if (q->raised) {
        written = 1;
    } else { /* (a bulk PDU built otherwise goes the general way, and the rest after it) */
        if (q->rest == NULL && (q->rest = PyList_New(0)) == NULL) {
            return -1;
        }
        written = 0;
    }
    if (written != 0) {
        return written < 0 ? -1 : 0;
    }
    return PyList_Append(q->rest, datagram);
}

static int queue_small(Emitter *emit, long type, long handler, long seq, long ack,
                       PyObject *words) {
    QueueEmitter *q = (QueueEmitter *)emit;
    if (q->rest != NULL || q->raised) { /* (the general way, as bytes; or dropped) */
        PyObject *datagram = pack_small(type, handler, seq, ack, words);
        int failed = datagram == NULL ? -1 : queue_datagram(emit, datagram);
        Py_XDECREF(datagram);
        return failed;
    }
    unsigned char buffer[SMALL_MAX];
    Py_ssize_t length = pack_small_into(buffer, type, handler, seq, ack, words);
    if (length < 0) {
        return -1;
    }
    q->count += 1;
    int written = queue_write(q, (const char *)buffer, length);
    if (written != 0) {
        return written < 0 ? -1 : 0;
    }
    PyObject *datagram = PyBytes_FromStringAndSize((const char *)buffer, length);
    int failed = datagram == NULL ? -1 : PyList_Append(q->rest, datagram);
    Py_XDECREF(datagram);
    return failed;
}

static PyObject *Core_express_send(Core *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "express_send(tx, now) takes 2 arguments (%zd given)",
                     nargs);
        return NULL;
    }
    PyObject *tx = args[0];
    self->express_sent = 0;
    self->express_sent_bytes = 0;
    self->express_wakes = 0;
    NativeQueueAPI *api = api_of(tx);
    double now = PyFloat_AsDouble(args[1]);
    if (api == NULL || (now == -1.0 && PyErr_Occurred())) {
        return NULL;
    }
    QueueEmitter q = {{queue_small, queue_datagram}, self, tx, api, 0, NULL, 0, NULL, NULL, NULL};
    int failed = emit_datagrams(self, now, &q.emit);
    if (q.raised) {
        if (failed < 0) { /* (the walk's own error wins; the write's is dropped) */
            Py_XDECREF(q.error_type);
            Py_XDECREF(q.error_value);
            Py_XDECREF(q.error_traceback);
        } else {
            PyErr_Restore(q.error_type, q.error_value, q.error_traceback);
            failed = -1;
        }
    }
    if (failed < 0) {
        Py_XDECREF(q.rest);
        return NULL;
    }
    if (q.count == 0) {
        Py_RETURN_NONE; /* nothing to send */
    }
    PyObject *result = PyTuple_New(4);
    if (result == NULL) {
        Py_XDECREF(q.rest);
        return NULL;
    }
    long counts[3] = {self->express_sent, self->express_sent_bytes, self->express_wakes};
    for (int i = 0; i < 3; i++) {
        PyObject *count = PyLong_FromLong(counts[i]);
        if (count == NULL) {
            Py_DECREF(result);
            Py_XDECREF(q.rest);
            return NULL;
        }
        PyTuple_SET_ITEM(result, i, count);
    }
    if (q.rest == NULL) {
        Py_INCREF(Py_None);
        q.rest = Py_None;
    }
    PyTuple_SET_ITEM(result, 3, q.rest); /* (the reference moves into the tuple) */
    return result;
}

#endif
