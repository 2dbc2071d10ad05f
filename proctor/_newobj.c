/* proctor._newobj: build instances of slotted classes without running their __init__.
 *
 * Why C: the gate builds five or six small objects on every tool call (a `CallRecord`, its
 * `CallOutcome`, the `Redacted` arguments, the call in flight, its quiet span, the request). In
 * CPython 3.11 calling a class whose __init__ is Python costs ~2.4k instructions before the first
 * field is stored, and a field stored through its slot's descriptor ~0.6k more: a `CallRecord` (11
 * fields) cost 9.6k instructions, about a twelfth of the host's whole round trip (callgrind). A
 * maker allocates the instance and stores each argument in its slot directly: ~0.4k for any of them.
 *
 * A maker is bound to one class and an ordered list of its slots (`maker(cls, names, defaults)`).
 * (A slot may be a base class's.) Called with positional arguments only, as many as the slots or fewer (the missing ones take the
 * trailing `defaults`), it returns a new instance with those slots set and every other slot empty;
 * given anything else (keywords, too few or too many arguments) it calls the class itself, which
 * says what is wrong as the class always did. Only plain object slots (`__slots__` members, not
 * read-only) of exactly that class are accepted, and the class must allocate as `object` does, so
 * an instance built here is indistinguishable from one whose __init__ stored the same values.
 * proctor/_frozen.py uses the class itself where this module did not build (it is optional).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "structmember.h"

typedef struct {
    PyObject_HEAD
    PyTypeObject *cls;
    PyObject *defaults;      /* tuple: values of the last len(defaults) slots when not given */
    Py_ssize_t nslots;
    Py_ssize_t nrequired;    /* nslots - len(defaults) */
    Py_ssize_t *offsets;     /* where each slot lives in an instance */
    vectorcallfunc vectorcall;
} Maker;

static PyObject *
maker_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Maker *m = (Maker *)self;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if ((kwnames != NULL && PyTuple_GET_SIZE(kwnames) > 0) || nargs < m->nrequired || nargs > m->nslots) {
        return PyObject_Vectorcall((PyObject *)m->cls, args, nargsf, kwnames);
    }
    PyObject *obj = m->cls->tp_alloc(m->cls, 0);
    if (obj == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < m->nslots; i++) {
        PyObject *value = i < nargs ? args[i] : PyTuple_GET_ITEM(m->defaults, i - m->nrequired);
        *(PyObject **)((char *)obj + m->offsets[i]) = Py_NewRef(value);
    }
    return obj;
}

static int
maker_traverse(Maker *m, visitproc visit, void *arg)
{
    Py_VISIT(m->cls);
    Py_VISIT(m->defaults);
    return 0;
}

static int
maker_clear(Maker *m)
{
    Py_CLEAR(m->cls);
    Py_CLEAR(m->defaults);
    return 0;
}

static void
maker_dealloc(Maker *m)
{
    PyObject_GC_UnTrack(m);
    maker_clear(m);
    PyMem_Free(m->offsets);
    PyObject_GC_Del(m);
}

static PyObject *
maker_repr(Maker *m)
{
    return PyUnicode_FromFormat("<maker of %s>", m->cls->tp_name);
}

static PyTypeObject MakerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "proctor._newobj.Maker",
    .tp_basicsize = sizeof(Maker),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_vectorcall_offset = offsetof(Maker, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_traverse = (traverseproc)maker_traverse,
    .tp_clear = (inquiry)maker_clear,
    .tp_dealloc = (destructor)maker_dealloc,
    .tp_repr = (reprfunc)maker_repr,
    .tp_doc = "Builds instances of one slotted class from positional slot values (see proctor._newobj).",
};

static destructor python_class_dealloc; /* tp_dealloc of a class made by a class statement */

static PyObject *
maker_new(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyType_Check(args[0]) || !PyTuple_Check(args[1]) || !PyTuple_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "maker(cls, names: tuple[str, ...], defaults: tuple)");
        return NULL;
    }
    PyTypeObject *cls = (PyTypeObject *)args[0];
    PyObject *names = args[1], *defaults = args[2];
    Py_ssize_t n = PyTuple_GET_SIZE(names);
    if (PyTuple_GET_SIZE(defaults) > n) {
        PyErr_SetString(PyExc_ValueError, "more defaults than slots");
        return NULL;
    }
    /* Allocated as `object` allocates (no __new__ of its own, no variable size), so that a fresh
     * instance with its slots set is all __init__ would have left. */
    if (cls->tp_new != PyBaseObject_Type.tp_new || cls->tp_alloc != PyType_GenericAlloc || cls->tp_itemsize != 0) {
        PyErr_Format(PyExc_TypeError, "%s: not a plain slotted class", cls->tp_name);
        return NULL;
    }
    /* Every class from cls up to object made by a class statement: a C type whose tp_new is object's
     * (instances made only from C, e.g. _ssl._SSLSocket) has state no slot holds. */
    for (PyTypeObject *t = cls; t != NULL && t != &PyBaseObject_Type; t = t->tp_base) {
        if (!(t->tp_flags & Py_TPFLAGS_HEAPTYPE) || t->tp_dealloc != python_class_dealloc) {
            PyErr_Format(PyExc_TypeError, "%s: not a plain slotted class", cls->tp_name);
            return NULL;
        }
    }
    Py_ssize_t *offsets = PyMem_Calloc(n ? n : 1, sizeof(Py_ssize_t));
    if (offsets == NULL) {
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *name = PyTuple_GET_ITEM(names, i);
        /* The slot as attribute lookup finds it (the class's own, or a base's not hidden by another name). */
        PyObject *descr = PyUnicode_Check(name) ? _PyType_Lookup(cls, name) : NULL;
        if (descr == NULL || !Py_IS_TYPE(descr, &PyMemberDescr_Type)
            || !PyType_IsSubtype(cls, PyDescr_TYPE(descr))) {
            PyErr_Format(PyExc_TypeError, "%s: %R is not a slot of this class", cls->tp_name, name);
            PyMem_Free(offsets);
            return NULL;
        }
        PyMemberDef *member = ((PyMemberDescrObject *)descr)->d_member;
        if (member->type != T_OBJECT_EX || (member->flags & READONLY) || member->offset <= 0
            || member->offset > cls->tp_basicsize - (Py_ssize_t)sizeof(PyObject *)) {
            PyErr_Format(PyExc_TypeError, "%s: %R is not a writable object slot", cls->tp_name, name);
            PyMem_Free(offsets);
            return NULL;
        }
        for (Py_ssize_t j = 0; j < i; j++) {
            if (offsets[j] == member->offset) {
                PyErr_Format(PyExc_ValueError, "%s: slot %R named twice", cls->tp_name, name);
                PyMem_Free(offsets);
                return NULL;
            }
        }
        offsets[i] = member->offset;
    }
    Maker *m = PyObject_GC_New(Maker, &MakerType);
    if (m == NULL) {
        PyMem_Free(offsets);
        return NULL;
    }
    m->cls = (PyTypeObject *)Py_NewRef(cls);
    m->defaults = Py_NewRef(defaults);
    m->nslots = n;
    m->nrequired = n - PyTuple_GET_SIZE(defaults);
    m->offsets = offsets;
    m->vectorcall = maker_vectorcall;
    PyObject_GC_Track(m);
    return (PyObject *)m;
}

static PyMethodDef module_methods[] = {
    {"maker", (PyCFunction)(void (*)(void))maker_new, METH_FASTCALL,
     "maker(cls, names, defaults) -> a callable building cls instances from positional slot values"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "proctor._newobj", "Instances of slotted classes built without __init__.", -1,
    module_methods,
};

PyMODINIT_FUNC
PyInit__newobj(void)
{
    if (PyType_Ready(&MakerType) < 0) {
        return NULL;
    }
    PyObject *probe = PyObject_CallFunction((PyObject *)&PyType_Type, "s()N", "_probe", PyDict_New());
    if (probe == NULL) {
        return NULL;
    }
    python_class_dealloc = ((PyTypeObject *)probe)->tp_dealloc;
    Py_DECREF(probe);
    PyObject *module = PyModule_Create(&module_def);
    if (module == NULL) {
        return NULL;
    }
    PyObject *all = Py_BuildValue("(s)", "maker");
    if (all == NULL || PyModule_AddObject(module, "__all__", all) < 0) {
        Py_XDECREF(all);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
