/* The UAM C core's attributes: its state as the reference's properties and fields, under
 * the same names.  Included by _uamcore.c only, after the Core type. */
#ifndef STACKLIB_UAMCORE_STATE_H
#define STACKLIB_UAMCORE_STATE_H

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
    READ_ONLY("express_taken", T_LONG, express_taken),
    READ_ONLY("express_bytes", T_LONG, express_bytes),
    READ_ONLY("express_handled", T_LONG, express_handled),
    READ_ONLY("express_broken", T_BOOL, express_broken),
    READ_ONLY("express_sent", T_LONG, express_sent),
    READ_ONLY("express_sent_bytes", T_LONG, express_sent_bytes),
    READ_ONLY("express_wakes", T_LONG, express_wakes),
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

#endif
