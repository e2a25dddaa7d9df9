/* The UAM core's express lane: a lean poll and a transmission that read and write a native
 * queue (unet/native_queue.h; the shm ring's core) themselves, so that a round trip over shm
 * makes no Python call between the ring and the machine.  Included by _uamcore.c only, after
 * the core's operations it reuses (receive_small, take, datagrams_to_send).
 *
 * The contract is the lean path's (stacklib/layers/uam/lean_path.py, whose general forms are
 * the reference, compared by tests/layers/test_uam_express.py):
 *   express_poll(rx, clock, handlers, service, peer) is LeanPath._poll_arrivals for one
 *   machine whose peer's datagrams arrive on the queue rx: each message is fed to the machine
 *   (the small path here, the rest through _receive_other) and what it made ready is handled
 *   at once, requests and replies by calling their handlers from `handlers` as
 *   UamService._run_handlers does (setting the service's current request around a request
 *   handler), everything else by service._dispatch; the clock is read once, at the first
 *   message, and left in service._poll_now for the handlers' replies.  Returns how many
 *   messages it took, or -1 minus that number if it found the queue broken (one call tells
 *   an empty poll); express_handled counts the arrivals handled (when no handler raised:
 *   the reference's count stops short of the call that raised), express_taken,
 *   express_bytes and express_broken what it took, for the endpoint's counters (read them
 *   also after an exception).
 *   express_send(tx, now) is datagrams_to_send(now) written to the queue tx in order: None
 *   when all went, else the list of those from the first the queue refused (full, too long,
 *   broken) on, for the endpoint's general send; express_sent, express_sent_bytes and
 *   express_wakes count what went (wakes: writes that found the consumer asleep).
 * One difference remains, on an error path: when the queue's wake-up of a waiting producer
 * raises in the release of a message, this form has already fed the message to the machine
 * (and counted it), while the reference's take() raised before it had the message; both
 * raise, and go-back-N makes either right.
 */
#ifndef STACKLIB_UAMCORE_EXPRESS_H
#define STACKLIB_UAMCORE_EXPRESS_H

#include "unet/native_queue.h"

static PyObject *s_native_queue, *s_dispatch, *s_poll_now, *s_current_machine;
static PyObject *s_current_token, *s_current_peer, *s_unknown_handler;

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
                    PyObject *peer) {
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
    int request = PyLong_AsLong(PyTuple_GET_ITEM(item, 0)) == T_REQUEST;
    if (request && (PyObject_SetAttr(service, s_current_machine, (PyObject *)self) < 0 ||
                    PyObject_SetAttr(service, s_current_token, PyTuple_GET_ITEM(item, 3)) < 0 ||
                    PyObject_SetAttr(service, s_current_peer, peer) < 0)) {
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
    if (request && PyObject_SetAttr(service, s_current_machine, Py_None) < 0) {
        return -1;
    }
    return 0;
}

static PyObject *Core_take(Core *self, PyObject *unused);

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
            PyObject *reading = PyObject_CallNoArgs(clock);
            int failed = reading == NULL;
            if (!failed) {
                now = PyFloat_AsDouble(reading);
                failed = (now == -1.0 && PyErr_Occurred()) ||
                         PyObject_SetAttr(service, s_poll_now, reading) < 0;
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
            int failed = run_item(self, item, handlers, service, peer);
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

static PyObject *datagrams_to_send(Core *self, double now);

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
    PyObject *datagrams = datagrams_to_send(self, now);
    if (datagrams == NULL) {
        return NULL;
    }
    Py_ssize_t count = PyList_GET_SIZE(datagrams);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *datagram = PyList_GET_ITEM(datagrams, i);
        /* (Small PDUs are bytes; a bulk PDU built otherwise goes the general way.) */
        Py_ssize_t length = PyBytes_CheckExact(datagram) ? PyBytes_GET_SIZE(datagram) : -1;
        int written = length < 0 ? NQ_NONE
                                 : api->write(tx, PyBytes_AS_STRING(datagram), length);
        if (written == NQ_DONE || written == NQ_WAKE) {
            self->express_sent += 1;
            self->express_sent_bytes += (long)length;
            self->express_wakes += written == NQ_WAKE;
            continue;
        }
        if (written == NQ_ERROR) {
            Py_DECREF(datagrams);
            return NULL;
        }
        /* Refused: the rest goes the general way, in order. */
        PyObject *rest = PyList_GetSlice(datagrams, i, count);
        Py_DECREF(datagrams);
        return rest;
    }
    Py_DECREF(datagrams);
    Py_RETURN_NONE;
}

#endif
