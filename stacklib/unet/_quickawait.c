/* An awaitable that finishes in its first send when it can: the cheap form of an `await`
 * call that usually does not wait.
 *
 * quick(fast, slow) returns a call; its call(obj, *args) (at most two args) returns an
 * awaitable.  When awaited (its first send), that calls fast(obj, *args): a result other than
 * NotImplemented is the await's result at once (no coroutine, no StopIteration: the
 * interpreter takes it through the am_send slot).  NotImplemented means the call must wait,
 * yield or be cancelled: the awaitable then creates the coroutine slow(obj, *args) and passes
 * every send, throw and close on to it until it finishes.  Nothing runs before the first send,
 * as with a coroutine.
 *
 * quick(fast, slow, test=None, method=None, arity=-1) adds, for a call that stands in for a
 * method of a class:
 * - test: called with no arguments at the first send, before fast; a true result skips fast
 *   (the slow coroutine does the whole call).  The cancellation test an `await` makes every
 *   time, called from here rather than from fast.
 * - method: the method the call replaces in its class's dict.  The call is then a method
 *   descriptor as a Python function is (obj.name(...) calls it with obj first and makes no
 *   bound method), shows the method's name and docstring (and __wrapped__), and passes on to
 *   it every call it does not take: keyword arguments, or other than `arity` arguments after
 *   obj (-1: from none to two).
 * fast, when it is a method descriptor of a C class taking fast-call arguments (a compiled
 * method), is called at its C function for an obj of its class.
 *
 * The reference is the one coroutine the caller would otherwise await: fast returns
 * NotImplemented whenever that would await anything, having done only what slow then takes
 * into account, and otherwise returns what it would have returned, with the same effects
 * (stacklib/transports/shm/endpoint.py keeps the pairs; tests/unet/test_quick_await.py pins
 * this type, tests/transports/test_shm_await.py runs the endpoint's calls in both forms).
 *
 * A mypyc coroutine costs an `await` that does not wait some 800 instructions beyond the call
 * it wraps (its objects, created and freed, and the send protocol).  This one is called as one
 * object (the pair's call: no bound method, no argument tuple; a form with both cost more than
 * the coroutine it replaced), reuses freed awaitables, and is tracked by the collector only
 * once it holds a coroutine.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <string.h>

#define MAX_ARGS 3 /* obj and up to two arguments */
#define FREE_LIST 16

/* quick(fast, slow): the call that makes the awaitables of one pair of halves. */
typedef struct {
    PyObject_HEAD
    PyObject *fast, *slow;
    vectorcallfunc vectorcall;
    PyObject *test;   /* or NULL */
    PyCFunction test_c; /* test's C function, where test is a no-argument builtin */
    PyObject *test_self;
    PyObject *method; /* the method this call replaces, or NULL */
    Py_ssize_t arity; /* the arguments after obj it takes; -1: 0 to MAX_ARGS - 1 */
    _PyCFunctionFastWithKeywords fast_c; /* fast's C function (a C method), or NULL */
    PyTypeObject *fast_class;              /* the class fast_c takes obj of */
} Maker;

typedef struct {
    PyObject_HEAD
    Maker *maker;
    PyObject *args[MAX_ARGS]; /* obj, then the call's arguments */
    Py_ssize_t nargs;
    PyObject *delegate; /* slow(obj, ...) once fast declined; NULL before and after */
    int state;          /* FRESH, DELEGATING or DONE */
} Quick;

enum { FRESH, DELEGATING, DONE };

static PyTypeObject MakerType, QuickType;
static PyObject *s_throw, *s_close;

/* Freed awaitables kept for the next ones (an await that does not wait makes one and frees
 * it at once: the allocator's and the collector's work, each time, was a third of its cost). */
static Quick *free_list[FREE_LIST];
static int free_count = 0;

static PyObject *Maker_call(Maker *maker, PyObject *const *args, size_t nargsf,
                            PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs < 1 || nargs > MAX_ARGS || (kwnames != NULL && PyTuple_GET_SIZE(kwnames)) ||
        (maker->arity >= 0 && nargs != maker->arity + 1)) {
        if (maker->method != NULL) { /* a call the pair does not take: the method's */
            return PyObject_Vectorcall(maker->method, args, nargsf, kwnames);
        }
        if (maker->arity >= 0) {
            PyErr_Format(PyExc_TypeError,
                         "a quick call takes obj and %zd more positional arguments, no keywords "
                         "(%zd given)",
                         maker->arity, nargs);
        } else {
            PyErr_Format(PyExc_TypeError,
                         "a quick call takes obj and at most %d more positional arguments, no "
                         "keywords (%zd given)",
                         MAX_ARGS - 1, nargs);
        }
        return NULL;
    }
    Quick *self;
    if (free_count) {
        self = free_list[--free_count];
        PyObject_Init((PyObject *)self, &QuickType);
    } else {
        self = PyObject_GC_New(Quick, &QuickType);
        if (self == NULL) {
            return NULL;
        }
    }
    Py_INCREF(maker);
    self->maker = maker;
    self->nargs = nargs;
    for (Py_ssize_t i = 0; i < MAX_ARGS; i++) {
        self->args[i] = i < nargs ? Py_NewRef(args[i]) : NULL;
    }
    self->delegate = NULL;
    self->state = FRESH;
    /* Tracked by the collector only once it holds a coroutine (the one reference that can
     * lead back to it); until then it holds the maker and the call's arguments. */
    return (PyObject *)self;
}

static PyObject *make_maker(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"fast", "slow", "test", "method", "arity", NULL};
    PyObject *fast, *slow, *test = Py_None, *method = Py_None;
    Py_ssize_t arity = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|OOn:quick", keywords, &fast, &slow, &test,
                                     &method, &arity)) {
        return NULL;
    }
    if (arity < -1 || arity > MAX_ARGS - 1) {
        PyErr_Format(PyExc_ValueError, "quick(): arity must be -1 to %d, not %zd", MAX_ARGS - 1,
                     arity);
        return NULL;
    }
    Maker *maker = PyObject_GC_New(Maker, &MakerType);
    if (maker == NULL) {
        return NULL;
    }
    maker->fast = Py_NewRef(fast);
    maker->slow = Py_NewRef(slow);
    maker->vectorcall = (vectorcallfunc)Maker_call;
    maker->test = test == Py_None ? NULL : Py_NewRef(test);
    maker->test_c = NULL;
    maker->test_self = NULL;
    if (maker->test != NULL && PyCFunction_Check(test) &&
        (PyCFunction_GET_FLAGS(test) & ~METH_COEXIST) == METH_NOARGS) {
        maker->test_c = PyCFunction_GET_FUNCTION(test);
        maker->test_self = PyCFunction_GET_SELF(test);
    }
    maker->method = method == Py_None ? NULL : Py_NewRef(method);
    maker->arity = arity;
    maker->fast_c = NULL;
    maker->fast_class = NULL;
    if (Py_IS_TYPE(fast, &PyMethodDescr_Type)) {
        PyMethodDef *def = ((PyMethodDescrObject *)fast)->d_method;
        if ((def->ml_flags & ~METH_COEXIST) == (METH_FASTCALL | METH_KEYWORDS)) {
            maker->fast_c = (_PyCFunctionFastWithKeywords)(void (*)(void))def->ml_meth;
            maker->fast_class = PyDescr_TYPE(fast); /* (held by the descriptor) */
        }
    }
    PyObject_GC_Track(maker);
    return (PyObject *)maker;
}

static int Maker_traverse(Maker *maker, visitproc visit, void *arg) {
    Py_VISIT(maker->fast);
    Py_VISIT(maker->slow);
    Py_VISIT(maker->test);
    Py_VISIT(maker->method);
    return 0;
}

static int Maker_clear(Maker *maker) {
    maker->fast_c = NULL;
    maker->test_c = NULL;
    Py_CLEAR(maker->fast);
    Py_CLEAR(maker->slow);
    Py_CLEAR(maker->test);
    Py_CLEAR(maker->method);
    return 0;
}

static void Maker_dealloc(Maker *maker) {
    PyObject_GC_UnTrack(maker);
    Maker_clear(maker);
    PyObject_GC_Del(maker);
}

/* A method descriptor, as a Python function is: bound to an instance it is a bound method. */
static PyObject *Maker_get(PyObject *self, PyObject *obj, PyObject *type) {
    if (obj == NULL || obj == Py_None) {
        return Py_NewRef(self);
    }
    return PyMethod_New(self, obj);
}

/* The replaced method's attribute named by the getset's closure (its name, qualified name or
 * docstring); without a method, "quick" for the names and None for the docstring. */
static PyObject *Maker_borrowed(Maker *maker, void *closure) {
    const char *name = closure;
    if (maker->method != NULL) {
        return PyObject_GetAttrString(maker->method, name);
    }
    if (strcmp(name, "__doc__") == 0) {
        Py_RETURN_NONE;
    }
    return PyUnicode_FromString("quick");
}

static PyObject *Maker_wrapped(Maker *maker, void *unused) {
    if (maker->method == NULL) {
        PyErr_SetString(PyExc_AttributeError, "a quick call made without method= wraps none");
        return NULL;
    }
    return Py_NewRef(maker->method);
}

static PyGetSetDef Maker_getset[] = {
    {"__name__", (getter)Maker_borrowed, NULL, "the replaced method's name", "__name__"},
    {"__qualname__", (getter)Maker_borrowed, NULL, "the replaced method's qualified name",
     "__qualname__"},
    {"__doc__", (getter)Maker_borrowed, NULL, "the replaced method's docstring", "__doc__"},
    {"__wrapped__", (getter)Maker_wrapped, NULL, "the replaced method", NULL},
    {NULL},
};

static int Quick_traverse(Quick *self, visitproc visit, void *arg) {
    Py_VISIT(self->maker);
    for (Py_ssize_t i = 0; i < MAX_ARGS; i++) {
        Py_VISIT(self->args[i]);
    }
    Py_VISIT(self->delegate);
    return 0;
}

/* (Also the collector's tp_clear: a cleared awaitable is done, so a call that reaches it
 * later raises instead of finding its references gone.) */
static int Quick_clear(Quick *self) {
    self->state = DONE;
    Py_CLEAR(self->maker);
    for (Py_ssize_t i = 0; i < MAX_ARGS; i++) {
        Py_CLEAR(self->args[i]);
    }
    Py_CLEAR(self->delegate);
    return 0;
}

static void Quick_dealloc(Quick *self) {
    if (PyObject_GC_IsTracked((PyObject *)self)) {
        PyObject_GC_UnTrack(self);
    }
    Quick_clear(self);
    if (free_count < FREE_LIST) {
        free_list[free_count++] = self;
    } else {
        PyObject_GC_Del(self);
    }
}

static PyObject *Quick_await(PyObject *self) {
    Py_INCREF(self);
    return self;
}

/* The delegate finished (returned or raised): the awaitable is done. */
static void finish(Quick *self) {
    self->state = DONE;
    Py_CLEAR(self->delegate);
}

static PySendResult Quick_am_send(Quick *self, PyObject *arg, PyObject **result) {
    if (self->state == FRESH) {
        if (arg != Py_None) {
            PyErr_SetString(PyExc_TypeError,
                            "can't send non-None value to a just-started quick awaitable");
            *result = NULL;
            return PYGEN_ERROR;
        }
        Maker *maker = self->maker;
        PyObject *value;
        if (maker->fast == NULL) { /* (cleared by the collector: a cycle through its class) */
            PyErr_SetString(PyExc_RuntimeError, "quick awaitable: its call was cleared");
            self->state = DONE;
            *result = NULL;
            return PYGEN_ERROR;
        }
        int skip = 0; /* the test found the call must take the slow way */
        if (maker->test != NULL) {
            PyObject *verdict = maker->test_c != NULL ? maker->test_c(maker->test_self, NULL)
                                                      : PyObject_CallNoArgs(maker->test);
            if (verdict == NULL) {
                self->state = DONE;
                *result = NULL;
                return PYGEN_ERROR;
            }
            skip = verdict == Py_True ? 1 : verdict == Py_False ? 0 : PyObject_IsTrue(verdict);
            Py_DECREF(verdict);
            if (skip < 0) {
                self->state = DONE;
                *result = NULL;
                return PYGEN_ERROR;
            }
        }
        if (skip) {
            value = Py_NewRef(Py_NotImplemented);
        } else if (maker->fast_c != NULL && PyObject_TypeCheck(self->args[0], maker->fast_class)) {
            /* (what the descriptor's call does after its own class check) */
            value = maker->fast_c(self->args[0], self->args + 1, self->nargs - 1, NULL);
        } else {
            value = PyObject_Vectorcall(maker->fast, self->args, self->nargs, NULL);
        }
        if (value == NULL) {
            self->state = DONE;
            *result = NULL;
            return PYGEN_ERROR;
        }
        if (value != Py_NotImplemented) {
            self->state = DONE;
            *result = value;
            return PYGEN_RETURN;
        }
        Py_DECREF(value);
        self->delegate = PyObject_Vectorcall(maker->slow, self->args, self->nargs, NULL);
        if (self->delegate == NULL) {
            self->state = DONE;
            *result = NULL;
            return PYGEN_ERROR;
        }
        if (Py_TYPE(self->delegate)->tp_as_async == NULL ||
            Py_TYPE(self->delegate)->tp_as_async->am_send == NULL) {
            PyErr_Format(PyExc_TypeError, "quick awaitable: slow() returned %.100s, not a coroutine",
                         Py_TYPE(self->delegate)->tp_name);
            finish(self);
            *result = NULL;
            return PYGEN_ERROR;
        }
        self->state = DELEGATING;
        PyObject_GC_Track(self);
    } else if (self->state == DONE) {
        PyErr_SetString(PyExc_RuntimeError, "cannot reuse an already awaited quick awaitable");
        *result = NULL;
        return PYGEN_ERROR;
    }
    PyObject *delegate = self->delegate; /* (held: the send may run code that closes us) */
    Py_INCREF(delegate);
    PySendResult sent = PyIter_Send(delegate, arg, result);
    Py_DECREF(delegate);
    if (sent != PYGEN_NEXT) {
        finish(self);
    }
    return sent;
}

/* The generator protocol's send(), for callers that drive the object by hand (trio starts
 * a task's coroutine with it). */
static PyObject *Quick_send(Quick *self, PyObject *arg) {
    PyObject *result;
    PySendResult sent = Quick_am_send(self, arg, &result);
    if (sent == PYGEN_NEXT) {
        return result;
    }
    if (sent == PYGEN_RETURN) {
        if (result == Py_None) {
            PyErr_SetNone(PyExc_StopIteration);
        } else {
            PyObject *stop = PyObject_CallOneArg(PyExc_StopIteration, result);
            if (stop != NULL) {
                PyErr_SetObject(PyExc_StopIteration, stop);
                Py_DECREF(stop);
            }
        }
        Py_DECREF(result);
    }
    return NULL;
}

static PyObject *Quick_iternext(Quick *self) {
    return Quick_send(self, Py_None);
}

/* throw(): into the delegate while there is one; otherwise raised here, as a coroutine that
 * has not started or has finished raises what is thrown into it (and is done). */
static PyObject *Quick_throw(Quick *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 3) {
        PyErr_SetString(PyExc_TypeError, "throw() takes 1 to 3 arguments");
        return NULL;
    }
    if (self->state == DELEGATING) {
        PyObject *delegate = self->delegate;
        Py_INCREF(delegate);
        PyObject *call[4] = {delegate, args[0], nargs > 1 ? args[1] : NULL,
                             nargs > 2 ? args[2] : NULL};
        PyObject *result = PyObject_VectorcallMethod(s_throw, call, (size_t)nargs + 1, NULL);
        Py_DECREF(delegate);
        if (result == NULL) {
            finish(self); /* it returned (StopIteration) or raised */
        }
        return result;
    }
    self->state = DONE;
    PyObject *type = args[0], *value = nargs > 1 ? args[1] : Py_None;
    if (PyExceptionInstance_Check(type)) {
        PyErr_SetObject((PyObject *)Py_TYPE(type), type);
    } else if (PyExceptionClass_Check(type)) {
        PyErr_SetObject(type, value);
    } else {
        PyErr_SetString(PyExc_TypeError,
                        "exceptions must be classes or instances deriving from BaseException");
    }
    return NULL;
}

static PyObject *Quick_close(Quick *self, PyObject *unused) {
    if (self->state == DELEGATING) {
        PyObject *delegate = self->delegate;
        Py_INCREF(delegate);
        PyObject *result = PyObject_CallMethodNoArgs(delegate, s_close);
        Py_DECREF(delegate);
        finish(self);
        return result;
    }
    self->state = DONE;
    Py_RETURN_NONE;
}

static PyMethodDef Quick_methods[] = {
    {"send", (PyCFunction)Quick_send, METH_O, "send(value): the coroutine protocol's send"},
    {"throw", (PyCFunction)(void (*)(void))Quick_throw, METH_FASTCALL,
     "throw(exception): into the waiting coroutine, else raised here"},
    {"close", (PyCFunction)Quick_close, METH_NOARGS, "close(): closes the waiting coroutine"},
    {NULL},
};

static PyAsyncMethods Quick_async = {
    .am_await = Quick_await,
    .am_send = (sendfunc)Quick_am_send,
};

static PyTypeObject QuickType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "stacklib.unet._quickawait.QuickAwait",
    .tp_basicsize = sizeof(Quick),
    .tp_dealloc = (destructor)Quick_dealloc,
    .tp_as_async = &Quick_async,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "An awaitable from quick(fast, slow)(obj, *args).",
    .tp_traverse = (traverseproc)Quick_traverse,
    .tp_clear = (inquiry)Quick_clear,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)Quick_iternext,
    .tp_methods = Quick_methods,
};

static PyTypeObject MakerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "stacklib.unet._quickawait.QuickCall",
    .tp_basicsize = sizeof(Maker),
    .tp_dealloc = (destructor)Maker_dealloc,
    .tp_vectorcall_offset = offsetof(Maker, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_HAVE_GC |
                Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_traverse = (traverseproc)Maker_traverse,
    .tp_clear = (inquiry)Maker_clear,
    .tp_descr_get = Maker_get,
    .tp_getset = Maker_getset,
};

static PyMethodDef methods[] = {
    {"quick", (PyCFunction)(void (*)(void))make_maker, METH_VARARGS | METH_KEYWORDS,
     "quick(fast, slow, test=None, method=None, arity=-1): a call whose (obj, *args) is an "
     "awaitable with the result of fast(obj, *args) unless that is NotImplemented (or test() "
     "is true), else that of awaiting slow(obj, *args); with method, a method descriptor "
     "standing in for it."},
    {NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_quickawait", "An await that finishes in its first send.", -1,
    methods,
};

PyMODINIT_FUNC PyInit__quickawait(void) {
    s_throw = PyUnicode_InternFromString("throw");
    s_close = PyUnicode_InternFromString("close");
    if (s_throw == NULL || s_close == NULL || PyType_Ready(&QuickType) < 0 ||
        PyType_Ready(&MakerType) < 0) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) {
        return NULL;
    }
    Py_INCREF(&QuickType);
    if (PyModule_AddObject(m, "QuickAwait", (PyObject *)&QuickType) < 0) {
        Py_DECREF(&QuickType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
