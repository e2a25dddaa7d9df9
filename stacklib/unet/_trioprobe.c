/* The cheap half of a trio cancellation point, in C: polled.cancelled() without its three
 * Python-level attribute reads.
 *
 * The reference is stacklib/unet/polled.py's cancelled(): the calling trio task's
 * `_cancel_status.effectively_cancelled`, or True outside a trio task.  An `await` of the real
 * transports that does not wait costs some 300 ns compiled, a third of it that test: reading
 * trio's per-thread run context (a thread-local attribute) and two attributes of trio's
 * slotted classes, each through the generic attribute look-up.  Here the context's dict is
 * looked up once per thread switch (keyed by the thread state; looked up again when found
 * without a task, as a new thread may reuse a finished one's state; the task found is kept
 * while the dict's version tag is unchanged), and the two fields are read at their slots'
 * offsets, found once from the member descriptors of the classes given to install() and used
 * only for objects of exactly those classes; anything else takes the generic look-up.  tests/unet/test_trio_probe.py runs both forms side by side.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

static PyObject *run_context = NULL; /* trio's GLOBAL_RUN_CONTEXT (a threading.local) */
static PyTypeObject *task_type = NULL, *status_type = NULL;
static Py_ssize_t status_offset = -1, effective_offset = -1; /* -1: the generic look-up */
static PyObject *s_task, *s_dict, *s_cancel_status, *s_effectively_cancelled;

/* The last thread's context dict (a strong reference) and its thread state. */
static PyThreadState *cached_thread = NULL;
static PyObject *cached_dict = NULL;
/* The task last found in cached_dict (borrowed: the dict holds it while unchanged) and the
 * dict's version then.  Python 3.11 gives every change to a dict a new version tag, so an
 * unchanged tag means the same task (trio writes the field at every task switch) and saves
 * the look-up, a third of this test; later versions made the tag private: there, always the
 * look-up. */
#if PY_VERSION_HEX < 0x030C0000
#define DICT_VERSIONS 1
static PyObject *cached_task = NULL;
static uint64_t cached_version = 0; /* (0: no dict has it) */
#endif

/* The offset of the object slot `name` of `type` (a member descriptor), or -1. */
static Py_ssize_t slot_offset(PyTypeObject *type, PyObject *name) {
    PyObject *descriptor = PyDict_GetItemWithError(type->tp_dict, name);
    if (descriptor == NULL || Py_TYPE(descriptor) != &PyMemberDescr_Type) {
        PyErr_Clear();
        return -1;
    }
    PyMemberDef *member = ((PyMemberDescrObject *)descriptor)->d_member;
    if (member->type != T_OBJECT_EX && member->type != T_OBJECT) {
        return -1;
    }
    return member->offset;
}

static PyObject *install(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyType_Check(args[1]) || !PyType_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError,
                        "install(run_context, Task, CancelStatus): trio's run context and the "
                        "two classes");
        return NULL;
    }
    Py_INCREF(args[0]);
    Py_XSETREF(run_context, args[0]);
    Py_INCREF(args[1]);
    Py_XSETREF(task_type, (PyTypeObject *)args[1]);
    Py_INCREF(args[2]);
    Py_XSETREF(status_type, (PyTypeObject *)args[2]);
    status_offset = slot_offset(task_type, s_cancel_status);
    effective_offset = slot_offset(status_type, s_effectively_cancelled);
    cached_thread = NULL;
    Py_CLEAR(cached_dict);
#ifdef DICT_VERSIONS
    cached_task = NULL;
    cached_version = 0;
#endif
    return Py_BuildValue("(nn)", status_offset, effective_offset);
}

/* obj.<name>, at its slot where obj is exactly of `type` and the slot is known: a new
 * reference, or NULL (no error set) when it is unset or the generic look-up fails. */
static PyObject *field(PyObject *obj, PyTypeObject *type, Py_ssize_t offset, PyObject *name) {
    if (offset >= 0 && Py_TYPE(obj) == type) {
        PyObject *value = *(PyObject **)((char *)obj + offset);
        Py_XINCREF(value);
        return value;
    }
    PyObject *value = PyObject_GetAttr(obj, name);
    if (value == NULL) {
        PyErr_Clear();
    }
    return value;
}

/* The calling thread's trio task (a borrowed reference), or NULL (no error set). */
static PyObject *current_task(void) {
    PyThreadState *thread = PyThreadState_Get();
    if (thread == cached_thread && cached_dict != NULL) {
#ifdef DICT_VERSIONS
        uint64_t version = ((PyDictObject *)cached_dict)->ma_version_tag;
        if (version == cached_version) {
            return cached_task;
        }
#endif
        PyObject *task = PyDict_GetItemWithError(cached_dict, s_task);
        if (task != NULL) {
#ifdef DICT_VERSIONS
            cached_task = task;
            cached_version = version;
#endif
            return task;
        }
        PyErr_Clear();
    }
    PyObject *dict = PyObject_GetAttr(run_context, s_dict);
    if (dict == NULL || !PyDict_Check(dict)) {
        Py_XDECREF(dict);
        PyErr_Clear();
        return NULL;
    }
    Py_XSETREF(cached_dict, dict);
    cached_thread = thread;
    PyObject *task = PyDict_GetItemWithError(dict, s_task);
    if (task == NULL) {
        PyErr_Clear();
    }
#ifdef DICT_VERSIONS
    cached_task = task;
    cached_version = task != NULL ? ((PyDictObject *)dict)->ma_version_tag : 0;
#endif
    return task;
}

static PyObject *cancelled(PyObject *module, PyObject *unused) {
    if (run_context == NULL) {
        Py_RETURN_TRUE;
    }
    PyObject *task = current_task();
    if (task == NULL) {
        Py_RETURN_TRUE; /* not in a trio task: the caller asks trio */
    }
    Py_INCREF(task); /* (a generic look-up below may run Python code) */
    PyObject *status = field(task, task_type, status_offset, s_cancel_status);
    Py_DECREF(task);
    if (status == NULL) {
        Py_RETURN_TRUE;
    }
    PyObject *effective = field(status, status_type, effective_offset, s_effectively_cancelled);
    Py_DECREF(status);
    if (effective == NULL) {
        Py_RETURN_TRUE;
    }
    int truth = PyObject_IsTrue(effective);
    Py_DECREF(effective);
    if (truth < 0) {
        PyErr_Clear();
        Py_RETURN_TRUE;
    }
    return PyBool_FromLong(truth);
}

static PyMethodDef methods[] = {
    {"install", (PyCFunction)(void (*)(void))install, METH_FASTCALL,
     "install(run_context, Task, CancelStatus): what cancelled() reads; the two slot offsets "
     "found (-1: the generic look-up)."},
    {"cancelled", cancelled, METH_NOARGS,
     "cancelled(): whether the calling trio task is cancelled (True outside a task or before "
     "install)."},
    {NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_trioprobe",
    .m_doc = "The cheap half of a trio cancellation point, in C (see polled.py).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__trioprobe(void) {
#define INTERN(var, text)                                                                     \
    if ((var = PyUnicode_InternFromString(text)) == NULL) return NULL;
    INTERN(s_task, "task");
    INTERN(s_dict, "__dict__");
    INTERN(s_cancel_status, "_cancel_status");
    INTERN(s_effectively_cancelled, "effectively_cancelled");
#undef INTERN
    return PyModule_Create(&module);
}
