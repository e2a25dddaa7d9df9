/* A UAM request handler's face to C: how a layer above UAM answers its common requests
 * inside the UAM core's poll, without a Python call per request.
 *
 * Active Messages' request handlers are short and fixed (paper 000 §5: a handler "extracts
 * the message from the network and integrates it into the computation"); a Split-C read's is
 * "read the word, reply with it" (paper 000 §6).  A handler object whose C extension can do
 * that offers this table as a capsule named NATIVE_HANDLER_CAPSULE in its `native_handler`
 * attribute; the UAM core's express poll (stacklib/layers/uam/uamcore_express.h) fetches it
 * once per handler type and, for each request or reply to that handler, first asks the
 * table.  For a request the table either answers (the core then makes the reply itself, as
 * the service's `reply` from inside the handler would) or declines; for a reply it handles
 * it or declines; declined, the core calls the handler object as it calls any other.  Its contract: whatever it answers is exactly what a call of the handler object
 * would have done (the same reply, no other effect), so the two paths cannot be told apart
 * but by their cost.
 */
#ifndef STACKLIB_NATIVE_HANDLER_H
#define STACKLIB_NATIVE_HANDLER_H

#include <Python.h>
#include <stdint.h>

#define NATIVE_HANDLER_CAPSULE "stacklib.layers.uam.native_handler"

#define NH_ERROR (-1)  /* a Python exception is set */
#define NH_DECLINED 0  /* call the handler object instead */
#define NH_REPLIED 1   /* *reply_handler and reply[0..3] hold the reply's handler and words */
#define NH_HANDLED 2   /* handled (a reply handler's table): nothing more to do */

typedef struct {
    /* The type of the handler objects this table serves (callers check it before a call). */
    PyTypeObject *type;
    /* A request of nwords (0-4) 32-bit words: NH_REPLIED or NH_DECLINED; never raises. */
    int (*request)(PyObject *handler, const uint32_t *words, Py_ssize_t nwords,
                   long *reply_handler, uint32_t reply[4]);
    /* A reply of nwords (0-4) words: NH_HANDLED, NH_DECLINED or NH_ERROR. */
    int (*reply)(PyObject *handler, const uint32_t *words, Py_ssize_t nwords);
} NativeHandlerAPI;

#endif
