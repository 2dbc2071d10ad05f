/* proctor._pipeio: read and write a non-blocking pipe without letting go of the GIL.
 *
 * os.read and os.write release the GIL around every system call. On a non-blocking descriptor the call
 * never waits, so releasing it buys nothing, and where other host threads wait for the GIL (several
 * Interpreters in threads of one process) each release hands it to one of them and this thread then
 * waits to get it back: two context switches for a call that took a microsecond. A host thread serving
 * a tool call reads the call and writes the reply this way; the one wait it needs (poll, with a
 * deadline) still releases the GIL. See docs/benchmarks.md, "Concurrency".
 *
 * Only for descriptors in non-blocking mode (O_NONBLOCK): on a blocking one these would hold the GIL
 * while they wait. proctor/interpreter/host.py falls back to os.read / os.write (the same results)
 * where this module did not build.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <unistd.h>

static PyObject *
pipeio_read(PyObject *self, PyObject *args)
{
    int fd;
    Py_ssize_t size;
    if (!PyArg_ParseTuple(args, "in:read", &fd, &size))
        return NULL;
    if (size < 0) { /* as os.read */
        errno = EINVAL;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, size);
    if (out == NULL)
        return NULL;
    ssize_t got;
    for (;;) {
        got = read(fd, PyBytes_AS_STRING(out), (size_t)size);
        if (got >= 0 || errno != EINTR)
            break;
        if (PyErr_CheckSignals() < 0) { /* as os.read does (PEP 475): a handler that raises wins */
            Py_DECREF(out);
            return NULL;
        }
    }
    if (got < 0) {
        Py_DECREF(out);
        return PyErr_SetFromErrno(PyExc_OSError); /* EAGAIN: BlockingIOError */
    }
    if (got != size && _PyBytes_Resize(&out, got) < 0)
        return NULL;
    return out;
}

static PyObject *
pipeio_write(PyObject *self, PyObject *args)
{
    int fd;
    Py_buffer data;
    if (!PyArg_ParseTuple(args, "iy*:write", &fd, &data))
        return NULL;
    ssize_t sent;
    for (;;) {
        sent = write(fd, data.buf, (size_t)data.len);
        if (sent >= 0 || errno != EINTR)
            break;
        if (PyErr_CheckSignals() < 0) {
            PyBuffer_Release(&data);
            return NULL;
        }
    }
    PyBuffer_Release(&data);
    if (sent < 0)
        return PyErr_SetFromErrno(PyExc_OSError); /* EAGAIN: BlockingIOError; EPIPE: BrokenPipeError */
    return PyLong_FromSsize_t(sent);
}

static PyMethodDef methods[] = {
    {"read", pipeio_read, METH_VARARGS,
     "read(fd, size) -> bytes: os.read(fd, size) holding the GIL. fd must be non-blocking."},
    {"write", pipeio_write, METH_VARARGS,
     "write(fd, data) -> int: os.write(fd, data) holding the GIL. fd must be non-blocking."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "proctor._pipeio",
    "os.read and os.write of a non-blocking pipe without releasing the GIL (see the C file's comment).",
    -1, methods,
};

PyMODINIT_FUNC
PyInit__pipeio(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    PyObject *all = Py_BuildValue("[ss]", "read", "write");
    if (all == NULL || PyModule_AddObject(m, "__all__", all) < 0) {
        Py_XDECREF(all);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
