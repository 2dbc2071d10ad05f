/* The native half of AuditLog's group commit (proctor/audit/log.py; docs/audit.md §3).
 *
 * One thread with no Python state fdatasyncs the log while durable bytes are pending, round after
 * round, so the next fdatasync starts the moment the last one ends; a waiting append sleeps here with
 * the GIL released until a round that began after its bytes were written has completed. In pure Python
 * every round had to get the GIL back twice (the leader after its fdatasync, then the next leader),
 * with eight interpreter threads competing for it.
 *
 * Rounds alternate between two condition variables, so a round wakes only the appends it covers.
 * A failed fdatasync ends the thread: every waiter and every later sync() raises OSError (the log
 * then fails closed). stop() ends the thread after the round in flight; a forked child never touches
 * the parent's thread, mutex or condition variables (the pid is checked).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct {
    PyObject_HEAD
    int fd;
    int trace_fd;              /* tests: after each fdatasync, "S <file size before it>\n" is written here */
    pid_t pid;                 /* the process whose thread this is */
    pthread_mutex_t mu;
    pthread_cond_t work;       /* to the thread: bytes to sync, or stop */
    pthread_cond_t idle;       /* no round in flight any more (stop() waits for it) */
    pthread_cond_t done[2];    /* to the waiters of an even / odd round */
    long long want;            /* bytes some waiter needs on disk */
    long long synced;          /* bytes known to be on disk */
    long long inflight;        /* bytes the round in flight covers */
    unsigned long long rounds; /* rounds started */
    int busy;                  /* a round is in flight */
    long long waiting;         /* appends asleep in sync() (tests read it) */
    int err;                   /* errno of a failed fdatasync: no more rounds */
    int stop;
    int running;               /* the thread exists and has not been joined */
    int joining;               /* a stop() is joining it (or did) */
    int ready;                 /* mutex and condition variables initialised */
    pthread_t thread;
} Syncer;

/* One round: fdatasync everything asked for so far. Called holding `mu` with no round in flight (it
   is released over the fdatasync); returns holding it. Run by an appending thread that finds no round
   in flight (no wake-up on the way), and back to back by the thread while bytes keep waiting. */
static void round_(Syncer *s) {
    long long upto = s->want;
    unsigned long long r = ++s->rounds;
    s->busy = 1;
    s->inflight = upto;
    int trace_fd = s->trace_fd;
    pthread_mutex_unlock(&s->mu);
    struct stat st;
    long long seen = trace_fd >= 0 && fstat(s->fd, &st) == 0 ? (long long)st.st_size : -1;
    int rc = fdatasync(s->fd);
    int e = rc == 0 ? 0 : errno;
    if (rc == 0 && seen >= 0) { /* before any waiter wakes: the note precedes what they do next */
        char note[32];
        int n = snprintf(note, sizeof note, "S %lld\n", seen);
        if (write(trace_fd, note, (size_t)n) < 0)
            e = errno;
    }
    pthread_mutex_lock(&s->mu);
    s->busy = 0;
    if (e != 0) {
        s->err = e;
        /* No round follows a failed one: the waiters for the next round (their bytes were written
           while this one was in flight) wake to the error too, and the thread ends. Without this an
           appending thread's failed round left them asleep for ever (redteam: test_audit_io_errors hung). */
        pthread_cond_broadcast(&s->done[(r + 1) & 1]);
        pthread_cond_signal(&s->work);
    } else if (upto > s->synced)
        s->synced = upto;
    pthread_cond_broadcast(&s->done[r & 1]);
    pthread_cond_broadcast(&s->idle);
}

static void *run(void *arg) {
    Syncer *s = (Syncer *)arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->stop && s->err == 0 && (s->busy || s->want <= s->synced))
            pthread_cond_wait(&s->work, &s->mu);
        if (s->stop || s->err != 0)
            break;
        round_(s);
    }
    pthread_cond_broadcast(&s->done[0]); /* stopped or failed: nobody waits for ever */
    pthread_cond_broadcast(&s->done[1]);
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

static int Syncer_init(Syncer *s, PyObject *args, PyObject *Py_UNUSED(kw)) {
    int fd;
    if (!PyArg_ParseTuple(args, "i", &fd))
        return -1;
    if (s->ready) {
        PyErr_SetString(PyExc_RuntimeError, "a Syncer is initialised once");
        return -1;
    }
    s->fd = fd;
    s->trace_fd = -1;
    s->pid = getpid();
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->work, NULL);
    pthread_cond_init(&s->idle, NULL);
    pthread_cond_init(&s->done[0], NULL);
    pthread_cond_init(&s->done[1], NULL);
    s->ready = 1;
    int rc = pthread_create(&s->thread, NULL, run, s);
    if (rc != 0) {
        s->stop = 1;
        errno = rc;
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    s->running = 1;
    return 0;
}

static int ours(Syncer *s) {
    if (!s->ready || s->pid != getpid()) {
        PyErr_SetString(PyExc_RuntimeError, "this audit log's syncer belongs to another process");
        return 0;
    }
    return 1;
}

static long long as_size(PyObject *arg) {
    long long n = PyLong_AsLongLong(arg);
    if (n < 0 && !PyErr_Occurred())
        PyErr_SetString(PyExc_ValueError, "a byte count is not negative");
    return n;
}

/* sync(upto) -> True once the first `upto` bytes are on disk; False if stopped first; OSError if an
   fdatasync failed. The GIL is released while waiting. */
static PyObject *Syncer_sync(Syncer *s, PyObject *arg) {
    long long upto = as_size(arg);
    if (upto < 0 || !ours(s))
        return NULL;
    int err, ok;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&s->mu);
    if (s->synced < upto && s->err == 0 && !s->stop) {
        if (upto > s->want)
            s->want = upto;
        if (!s->busy) {
            /* no round in flight: run it here, then hand what arrived meanwhile to the thread */
            round_(s);
            if (s->want > s->synced && s->err == 0 && !s->stop)
                pthread_cond_signal(&s->work);
        } else {
            /* the round in flight covers `upto` if it began with those bytes asked for, else the next one
               (the thread's, started as soon as this one ends, or an appending thread's if it is idle then) */
            unsigned long long r = s->inflight >= upto ? s->rounds : s->rounds + 1;
            s->waiting++;
            while (s->synced < upto && s->err == 0 && !s->stop)
                pthread_cond_wait(&s->done[r & 1], &s->mu);
            s->waiting--;
        }
    }
    ok = s->synced >= upto;
    err = s->err;
    pthread_mutex_unlock(&s->mu);
    Py_END_ALLOW_THREADS
    if (err != 0) { /* first, even if covered: a failed writeback may be told to one overlapping fdatasync only */
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    if (ok)
        Py_RETURN_TRUE;
    Py_RETURN_FALSE;
}

/* covered(upto): the first `upto` bytes were made durable by someone else (a checkpoint's fsync). */
static PyObject *Syncer_covered(Syncer *s, PyObject *arg) {
    long long upto = as_size(arg);
    if (upto < 0 || !ours(s))
        return NULL;
    pthread_mutex_lock(&s->mu); /* never held for long: the thread does not hold it over fdatasync */
    if (upto > s->synced) {
        s->synced = upto;
        pthread_cond_broadcast(&s->done[0]);
        pthread_cond_broadcast(&s->done[1]);
    }
    pthread_mutex_unlock(&s->mu);
    Py_RETURN_NONE;
}

/* trace(fd): tests only (the crash harnesses): note each completed fdatasync in fd, as above. */
static PyObject *Syncer_trace(Syncer *s, PyObject *arg) {
    int fd = PyLong_AsLong(arg);
    if (fd == -1 && PyErr_Occurred())
        return NULL;
    if (!ours(s))
        return NULL;
    pthread_mutex_lock(&s->mu);
    s->trace_fd = fd;
    pthread_mutex_unlock(&s->mu);
    Py_RETURN_NONE;
}

/* Ends the thread, once: two stop() calls in two threads (the GIL is released here) must not both
   join it (joining a joined thread is undefined); the second waits until the first has joined it. */
static void halt(Syncer *s) {
    pthread_mutex_lock(&s->mu);
    s->stop = 1;
    pthread_cond_signal(&s->work);
    while (s->busy) /* an appending thread's round: the descriptor must outlive its fdatasync */
        pthread_cond_wait(&s->idle, &s->mu);
    if (s->joining) {
        while (s->running)
            pthread_cond_wait(&s->idle, &s->mu);
        pthread_mutex_unlock(&s->mu);
        return;
    }
    int join = s->running;
    s->joining = 1;
    pthread_mutex_unlock(&s->mu);
    if (join)
        pthread_join(s->thread, NULL);
    pthread_mutex_lock(&s->mu);
    s->running = 0;
    pthread_cond_broadcast(&s->idle);
    pthread_mutex_unlock(&s->mu);
}

/* stop(): no more rounds; returns once the thread has ended (after the round in flight). */
static PyObject *Syncer_stop(Syncer *s, PyObject *Py_UNUSED(unused)) {
    if (!ours(s))
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    halt(s);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static void Syncer_dealloc(Syncer *s) {
    if (s->ready && s->pid == getpid()) {
        Py_BEGIN_ALLOW_THREADS
        halt(s);
        Py_END_ALLOW_THREADS
    }
    Py_TYPE(s)->tp_free((PyObject *)s);
}

/* Read under the mutex (the thread writes these without the GIL), except in a forked child, where the
   mutex may have been held by the parent's thread at the fork and nothing writes them any more. */
static int lockable(Syncer *s) { return s->ready && s->pid == getpid(); }

static long long locked_ll(Syncer *s, const long long *field) {
    if (!lockable(s))
        return *field;
    pthread_mutex_lock(&s->mu);
    long long v = *field;
    pthread_mutex_unlock(&s->mu);
    return v;
}

static PyObject *Syncer_get_synced(Syncer *s, void *Py_UNUSED(unused)) { return PyLong_FromLongLong(locked_ll(s, &s->synced)); }
static PyObject *Syncer_get_waiting(Syncer *s, void *Py_UNUSED(unused)) { return PyLong_FromLongLong(locked_ll(s, &s->waiting)); }
static PyObject *Syncer_get_rounds(Syncer *s, void *Py_UNUSED(unused)) {
    unsigned long long r = s->rounds;
    if (lockable(s)) {
        pthread_mutex_lock(&s->mu);
        r = s->rounds;
        pthread_mutex_unlock(&s->mu);
    }
    return PyLong_FromUnsignedLongLong(r);
}
static PyObject *Syncer_get_running(Syncer *s, void *Py_UNUSED(unused)) {
    int r = s->running;
    if (lockable(s)) {
        pthread_mutex_lock(&s->mu);
        r = s->running;
        pthread_mutex_unlock(&s->mu);
    }
    return PyBool_FromLong(r);
}

static PyMethodDef Syncer_methods[] = {
    {"sync", (PyCFunction)Syncer_sync, METH_O,
     "sync(upto) -> True once the first upto bytes are on disk, False if stopped first; OSError if fdatasync failed."},
    {"covered", (PyCFunction)Syncer_covered, METH_O, "covered(upto): those bytes were made durable elsewhere."},
    {"trace", (PyCFunction)Syncer_trace, METH_O, "trace(fd): tests only: note each completed fdatasync in fd."},
    {"stop", (PyCFunction)Syncer_stop, METH_NOARGS, "stop(): end the thread after the fdatasync in flight."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Syncer_getset[] = {
    {"synced", (getter)Syncer_get_synced, NULL, "bytes known to be on disk", NULL},
    {"rounds", (getter)Syncer_get_rounds, NULL, "fdatasync rounds started", NULL},
    {"running", (getter)Syncer_get_running, NULL, "whether the thread is alive", NULL},
    {"waiting", (getter)Syncer_get_waiting, NULL, "appends asleep in sync(), waiting for a round", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject SyncerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "proctor.audit._syncer.Syncer",
    .tp_basicsize = sizeof(Syncer),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Syncer(fd): a thread without the GIL that fdatasyncs fd while durable bytes are pending.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Syncer_init,
    .tp_dealloc = (destructor)Syncer_dealloc,
    .tp_methods = Syncer_methods,
    .tp_getset = Syncer_getset,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "proctor.audit._syncer", "The native half of AuditLog's group commit.", -1,
    NULL, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__syncer(void) {
    if (PyType_Ready(&SyncerType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&SyncerType);
    if (PyModule_AddObject(m, "Syncer", (PyObject *)&SyncerType) < 0) {
        Py_DECREF(&SyncerType);
        Py_DECREF(m);
        return NULL;
    }
    PyObject *all = Py_BuildValue("[s]", "Syncer");
    if (all == NULL || PyModule_AddObject(m, "__all__", all) < 0) {
        Py_XDECREF(all);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
