/* A U-Net queue's face to C: how one C extension reads and writes another's message queue
 * without a Python call per message.
 *
 * A queue object (the shm ring's core, stacklib/transports/shm/_ringcore.c) offers this table
 * as a capsule named NATIVE_QUEUE_CAPSULE in its `native_queue` attribute; a consumer in C (the
 * UAM machine's express lane, stacklib/layers/uam/uamcore_express.h) fetches it once and then
 * calls through it.  A queue carries whole messages, as U-Net's send and receive queues do
 * (paper 000 §3.1): the consumer sees each message in place and frees it when done.
 */
#ifndef STACKLIB_NATIVE_QUEUE_H
#define STACKLIB_NATIVE_QUEUE_H

#include <Python.h>

#define NATIVE_QUEUE_CAPSULE "stacklib.unet.native_queue"

/* Results of the calls below (each says which it returns). */
#define NQ_ERROR (-2)  /* a Python exception is set */
#define NQ_BROKEN (-1) /* the peer broke the queue; the queue's `failure` says how */
#define NQ_NONE 0      /* nothing waiting (peek), no room (write) */
#define NQ_DONE 1      /* a message (peek), written (write) */
#define NQ_WAKE 2      /* written, and the consumer sleeps: the caller wakes it (write) */
#define NQ_TOO_LONG 3  /* longer than the queue's largest message: not written (write) */

typedef struct {
    /* The type of the queue objects this table serves (callers check it before a call). */
    PyTypeObject *type;
    /* The next message, in place: NQ_DONE with *data and *length valid until release(), or
     * NQ_NONE, NQ_BROKEN, NQ_ERROR.  A second peek before release() sees the same message. */
    int (*peek)(PyObject *queue, const unsigned char **data, Py_ssize_t *length);
    /* Free the message peek() returned (and wake a producer waiting for room): 0, or NQ_ERROR
     * (the wake-up raised; the message is freed all the same). */
    int (*release)(PyObject *queue);
    /* Append one message: NQ_DONE, NQ_WAKE, NQ_NONE (full), NQ_TOO_LONG, NQ_BROKEN, NQ_ERROR. */
    int (*write)(PyObject *queue, const char *data, Py_ssize_t length);
} NativeQueueAPI;

#endif
