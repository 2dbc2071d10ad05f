/* proctor._provtok: the provenance tokeniser and keyed digests in C.
 *
 * Why C: indexing a 100 KB tool result must cost <= 2 ms (issue #19), and a page of addresses holds
 * ~8,000 tokens; in Python each token costs a string object, a hash and a dict insert (~0.3 us, about
 * 2.5 ms before any tokenising). Here one call tokenises a case-folded text, computes each entry's
 * keyed digest and inserts it into the index's dict. proctor/provenance.py keeps the same tokeniser
 * in pure Python (used when this module did not build: the extension is optional); tests check that
 * both give the same tokens (tests/test_provenance_native.py).
 *
 * The input is untrusted (tool results): every buffer is sized from the input's length with overflow
 * checks, nothing is written through a fixed-size buffer, recursion is bounded (depth <= 4), and the
 * number of entries one call may produce is capped by its `budget` argument.
 *
 * What counts as a token is documented in proctor/provenance.py; every rule below names the regular
 * expression of the Python path it implements.
 *
 * Digest: SipHash-1-3 (Aumasson & Bernstein) with a 128-bit key drawn per index, over the text's
 * UTF-8 (a lone surrogate encoded as any other code point); 0 is read as 1 (0 marks an empty slot).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

typedef Py_UCS4 ch;

/* ---- SipHash ------------------------------------------------------------------------------- */

typedef struct {
    uint64_t k0, k1;
} Key;

#define ROTL(x, b) (uint64_t)(((x) << (b)) | ((x) >> (64 - (b))))
#define SIPROUND                                                                                   \
    do {                                                                                           \
        v0 += v1; v1 = ROTL(v1, 13); v1 ^= v0; v0 = ROTL(v0, 32);                                  \
        v2 += v3; v3 = ROTL(v3, 16); v3 ^= v2;                                                     \
        v0 += v3; v3 = ROTL(v3, 21); v3 ^= v0;                                                     \
        v2 += v1; v1 = ROTL(v1, 17); v1 ^= v2; v2 = ROTL(v2, 32);                                  \
    } while (0)

static inline uint64_t
load_le64(const uint8_t *p)
{
    return (uint64_t)p[0] | ((uint64_t)p[1] << 8) | ((uint64_t)p[2] << 16) | ((uint64_t)p[3] << 24) |
           ((uint64_t)p[4] << 32) | ((uint64_t)p[5] << 40) | ((uint64_t)p[6] << 48) | ((uint64_t)p[7] << 56);
}

/* SipHash-c-d over a buffer, with the rounds fixed at compile time. */
#define SIP_FUNCTION(name, CROUNDS, DROUNDS)                                                       \
    static uint64_t name(const Key *key, const uint8_t *in, size_t len)                            \
    {                                                                                              \
        uint64_t v0 = 0x736f6d6570736575ULL ^ key->k0;                                             \
        uint64_t v1 = 0x646f72616e646f6dULL ^ key->k1;                                             \
        uint64_t v2 = 0x6c7967656e657261ULL ^ key->k0;                                             \
        uint64_t v3 = 0x7465646279746573ULL ^ key->k1;                                             \
        const uint8_t *end = in + (len - (len % 8));                                               \
        uint64_t b = ((uint64_t)len) << 56;                                                        \
        for (; in != end; in += 8) {                                                               \
            uint64_t m = load_le64(in);                                                            \
            v3 ^= m;                                                                               \
            for (int r = 0; r < CROUNDS; r++)                                                      \
                SIPROUND;                                                                          \
            v0 ^= m;                                                                               \
        }                                                                                          \
        for (size_t t = 0; t < (len & 7); t++)                                                     \
            b |= ((uint64_t)in[t]) << (8 * t);                                                     \
        v3 ^= b;                                                                                   \
        for (int r = 0; r < CROUNDS; r++)                                                          \
            SIPROUND;                                                                              \
        v0 ^= b;                                                                                   \
        v2 ^= 0xff;                                                                                \
        for (int r = 0; r < DROUNDS; r++)                                                          \
            SIPROUND;                                                                              \
        return v0 ^ v1 ^ v2 ^ v3;                                                                  \
    }

/* The digest's: SipHash-1-3, as CPython's and Rust's keyed string hashes. */
SIP_FUNCTION(sip13, 1, 3)
/* The reference's: for its published test vectors, which check the same code. */
SIP_FUNCTION(sip24, 2, 4)

static inline uint64_t
finish(uint64_t h)
{
    return h ? h : 1;
}

/* The digest of a text: SipHash-2-4 of its code points in UTF-8 (surrogates encoded as any other code
 * point), `bytes` a scratch buffer of at least 4 * n bytes. */
static uint64_t
text_digest(const Key *key, const ch *t, size_t n, uint8_t *bytes)
{
    uint8_t *o = bytes;
    for (size_t p = 0; p < n; p++) {
        ch c = t[p];
        if (c < 0x80)
            *o++ = (uint8_t)c;
        else if (c < 0x800) {
            *o++ = (uint8_t)(0xc0 | (c >> 6));
            *o++ = (uint8_t)(0x80 | (c & 0x3f));
        }
        else if (c < 0x10000) {
            *o++ = (uint8_t)(0xe0 | (c >> 12));
            *o++ = (uint8_t)(0x80 | ((c >> 6) & 0x3f));
            *o++ = (uint8_t)(0x80 | (c & 0x3f));
        }
        else {
            *o++ = (uint8_t)(0xf0 | ((c >> 18) & 0x07));
            *o++ = (uint8_t)(0x80 | ((c >> 12) & 0x3f));
            *o++ = (uint8_t)(0x80 | ((c >> 6) & 0x3f));
            *o++ = (uint8_t)(0x80 | (c & 0x3f));
        }
    }
    return finish(sip13(key, bytes, (size_t)(o - bytes)));
}

static int
parse_key(PyObject *obj, Key *key)
{
    if (!PyBytes_Check(obj) || PyBytes_GET_SIZE(obj) != 16) {
        PyErr_SetString(PyExc_ValueError, "the provenance key must be 16 bytes");
        return -1;
    }
    const uint8_t *p = (const uint8_t *)PyBytes_AS_STRING(obj);
    key->k0 = load_le64(p);
    key->k1 = load_le64(p + 8);
    return 0;
}

/* ---- character classes (Python's `re` for str patterns, and str.split()) ----------------------- */

/* Classes of a code point, one bit each: a table for ASCII (filled at import), Python's tables beyond. */
enum { W = 1, SEP = 2, DEC = 4, ALNUM = 8, JOIN = 16, SPACE = 32, DASH = 64 };
static uint8_t ascii_class[128];

static unsigned
wide_class(ch c)
{
    unsigned k = 0;
    if (Py_UNICODE_ISALNUM(c))
        k |= W | ALNUM;
    if (Py_UNICODE_ISDECIMAL(c))
        k |= DEC;
    if (Py_UNICODE_ISSPACE(c))
        k |= SPACE;
    return k;
}

static void
fill_ascii_class(void)
{
    for (ch c = 0; c < 128; c++) {
        unsigned k = 0;
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))
            k |= W | ALNUM; /* [^\W_] */
        if (c >= '0' && c <= '9')
            k |= DEC; /* \d */
        if (c == '_')
            k |= W | JOIN; /* \w, and a joiner of [.@/:#+_%~=?&-] */
        if (c && strchr(".@/:#+%~=?&,-", (int)c))
            k |= SEP; /* the separators of _TOKEN's class */
        if (c && strchr(".@/:#+%~=?&-", (int)c))
            k |= JOIN;
        if (Py_UNICODE_ISSPACE(c))
            k |= SPACE; /* str.split() */
        if (c == '-')
            k |= DASH;
        ascii_class[c] = (uint8_t)k;
    }
}

/* The BMP's classes, each found in Python's tables at its first use (KNOWN set): a non-ASCII character costs up
 * to six lookups there (ISALNUM alone is four), ~25 ns, and the tokeniser asks several times per character: 100 KB
 * of Chinese mail took 2.3 ms to index against 0.55 ms for as much ASCII mail. 64 KB, filled only as far as
 * the texts go. Always under the GIL (no call here releases it), and a byte written twice gets the same value. */
#define KNOWN 128
static uint8_t bmp_class[0x10000];

static inline unsigned
klass(ch c)
{
    if (c < 128)
        return ascii_class[c];
    if (c >= 0x10000)
        return wide_class(c);
    unsigned k = bmp_class[c];
    if (!k)
        bmp_class[c] = (uint8_t)(k = wide_class(c) | KNOWN);
    return k & ~(unsigned)KNOWN;
}

static inline int
is_alnum(ch c) /* [^\W_] */
{
    return (klass(c) & ALNUM) != 0;
}

static inline int
is_w(ch c) /* \w */
{
    return (klass(c) & W) != 0;
}

static inline int
is_dec(ch c) /* \d */
{
    return (klass(c) & DEC) != 0;
}

static inline int
in_class(ch c) /* [\w.@/:#+%~=?&,-] */
{
    return (klass(c) & (W | SEP)) != 0;
}

static inline int
in_joiners(ch c) /* [.@/:#+_%~=?&-] */
{
    return (klass(c) & JOIN) != 0;
}

static inline int
is_space(ch c)
{
    return (klass(c) & SPACE) != 0;
}

static inline int
is_az(ch c)
{
    return c >= 'a' && c <= 'z';
}

static inline int
is_az09(ch c)
{
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
}

static inline int
starts_www(const ch *t, size_t n)
{
    return n >= 4 && t[0] == 'w' && t[1] == 'w' && t[2] == 'w' && t[3] == '.';
}

/* _TOKEN's lookahead over a run: a digit, or a letter-or-digit, joiners, a letter-or-digit. */
static int
token_like(const ch *t, size_t n)
{
    size_t p;
    for (p = 0; p < n; p++)
        if (is_dec(t[p]))
            return 1;
    p = 0;
    while (p < n) {
        if (is_alnum(t[p])) {
            size_t q = p + 1;
            while (q < n && in_joiners(t[q]))
                q++;
            if (q > p + 1 && q < n && is_alnum(t[q]))
                return 1;
            p = q > p + 1 ? q : p + 1;
        }
        else {
            p++;
        }
    }
    return 0;
}

/* _TOKEN.fullmatch(t) */
static int
token_fullmatch(const ch *t, size_t n)
{
    if (n == 0 || !is_w(t[0]))
        return 0;
    for (size_t p = 0; p < n; p++)
        if (!in_class(t[p]))
            return 0;
    return token_like(t, n);
}

/* \d+\.\d*0 as a whole */
static int
decimal_with_trailing_zero(const ch *t, size_t n)
{
    size_t p = 0;
    while (p < n && is_dec(t[p]))
        p++;
    if (p == 0 || p >= n || t[p] != '.')
        return 0;
    p++;
    if (p >= n || t[n - 1] != '0')
        return 0;
    for (; p < n; p++)
        if (!is_dec(t[p]))
            return 0;
    return 1;
}

/* _SIMPLE.fullmatch(t): (?!www\.)(?!_)(?!\d+\.\d*0$)[\w.@+%~#-]*[^\W_] */
static int
is_simple(const ch *t, size_t n)
{
    if (n == 0 || starts_www(t, n) || t[0] == '_' || decimal_with_trailing_zero(t, n))
        return 0;
    for (size_t p = 0; p < n; p++) {
        ch c = t[p];
        if (!(is_w(c) || c == '.' || c == '@' || c == '+' || c == '%' || c == '~' || c == '#' || c == '-'))
            return 0;
    }
    return is_alnum(t[n - 1]);
}

/* _NUMBER.fullmatch(t): \d{1,3}(?:,\d{3})+(?:\.\d+)? | \d+(?:\.\d+)? */
static int
is_number(const ch *t, size_t n)
{
    size_t p = 0;
    while (p < n && is_dec(t[p]))
        p++;
    if (p == 0)
        return 0;
    if (p < n && t[p] == ',') { /* thousands groups */
        if (p > 3)
            return 0;
        int groups = 0;
        while (p < n && t[p] == ',') {
            if (p + 4 > n || !is_dec(t[p + 1]) || !is_dec(t[p + 2]) || !is_dec(t[p + 3]))
                return 0;
            p += 4;
            groups++;
        }
        if (groups == 0)
            return 0;
    }
    if (p == n)
        return 1;
    if (t[p] != '.')
        return 0;
    p++;
    if (p == n)
        return 0;
    for (; p < n; p++)
        if (!is_dec(t[p]))
            return 0;
    return 1;
}

/* _DASHED: groups [a-z]*\d[a-z0-9]* joined by '-', two or more */
static int
is_dashed(const ch *t, size_t n)
{
    size_t p = 0, groups = 0;
    for (;;) {
        size_t q = p;
        while (q < n && t[q] != '-')
            q++;
        if (q == p)
            return 0;
        size_t a = p;
        while (a < q && is_az(t[a]))
            a++;
        if (a == q || !is_dec(t[a]))
            return 0;
        for (size_t b = a + 1; b < q; b++)
            if (!is_az09(t[b]))
                return 0;
        groups++;
        if (q == n)
            break;
        p = q + 1;
    }
    return groups >= 2;
}

/* ---- Digests: an index's entries (digest -> label mask) in C ------------------------------------ */

/* Why not a dict: each entry of a dict costs an int object for the digest, another for the mask, a hash of
 * the key and ~80 bytes; inserting 10,000 entries from one result was a quarter of its indexing. Here an
 * entry is two 64-bit words side by side in open addressing (linear probing, at most half full). The slot of a digest is
 * its low bits: digests are keyed SipHash outputs, which nobody without the index's key can aim at one
 * slot. A digest is never 0 (`finish`), which marks an empty slot. Masks hold label bits 0..63;
 * proctor/provenance.py moves the entries to a dict before it gives a label bit 64. */
typedef struct {
    uint64_t key; /* 0: an empty slot */
    uint64_t mask;
} Slot;

typedef struct {
    PyObject_HEAD
    Slot *slots; /* a digest next to its mask: one cache line a probe */
    size_t cap;  /* a power of two; 0 before the first entry */
    size_t len;
} Digests;

static PyTypeObject DigestsType;

static inline size_t
digests_slot(const Digests *d, uint64_t h) /* d->cap > 0: the slot holding h, or the empty one it would go to */
{
    size_t at = (size_t)h & (d->cap - 1);
    while (d->slots[at].key && d->slots[at].key != h)
        at = (at + 1) & (d->cap - 1);
    return at;
}

static int
digests_grow(Digests *d)
{
    size_t cap = d->cap ? d->cap * 2 : 1024;
    if (cap > PY_SSIZE_T_MAX / sizeof(Slot)) {
        PyErr_NoMemory();
        return -1;
    }
    Slot *slots = PyMem_Calloc(cap, sizeof(Slot));
    if (slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (size_t i = 0; i < d->cap; i++) {
        uint64_t h = d->slots[i].key;
        if (h) {
            size_t at = (size_t)h & (cap - 1);
            while (slots[at].key)
                at = (at + 1) & (cap - 1);
            slots[at] = d->slots[i];
        }
    }
    PyMem_Free(d->slots);
    d->slots = slots;
    d->cap = cap;
    return 0;
}

/* Or `mask` into the entry of `h`, or add it when `*room` > 0 (then 1 is returned and *room decremented);
 * 0: it was there; 2: no room for it; -1: an error (memory). */
static int
digests_put(Digests *d, uint64_t h, uint64_t mask, Py_ssize_t *room)
{
    size_t at = 0;
    if (d->cap) {
        at = digests_slot(d, h);
        if (d->slots[at].key) {
            d->slots[at].mask |= mask;
            return 0;
        }
    }
    if (*room <= 0)
        return 2;
    if ((d->len + 1) * 2 > d->cap) {
        if (digests_grow(d) < 0)
            return -1;
        at = digests_slot(d, h);
    }
    d->slots[at].key = h;
    d->slots[at].mask = mask;
    d->len++;
    (*room)--;
    return 1;
}

/* A digest given from Python: 0 (never an entry) for anything that is no int in 1..2**64-1. */
static uint64_t
digest_arg(PyObject *key)
{
    if (!PyLong_Check(key))
        return 0;
    uint64_t h = PyLong_AsUnsignedLongLong(key);
    if (h == (uint64_t)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    return h;
}

static int
mask_arg(PyObject *obj, uint64_t *mask)
{
    if (!PyLong_Check(obj)) {
        PyErr_SetString(PyExc_TypeError, "a label mask must be an int");
        return -1;
    }
    *mask = PyLong_AsUnsignedLongLong(obj); /* OverflowError past bit 63: the caller moves to a dict first */
    return *mask == (uint64_t)-1 && PyErr_Occurred() ? -1 : 0;
}

static PyObject *
digests_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    if (PyTuple_GET_SIZE(args) || (kwds && PyDict_GET_SIZE(kwds))) {
        PyErr_SetString(PyExc_TypeError, "Digests() takes no arguments");
        return NULL;
    }
    return type->tp_alloc(type, 0); /* zeroed: no table yet */
}

static void
digests_dealloc(Digests *d)
{
    PyMem_Free(d->slots);
    Py_TYPE(d)->tp_free((PyObject *)d);
}

static Py_ssize_t
digests_len(Digests *d)
{
    return (Py_ssize_t)d->len;
}

static int
digests_contains(Digests *d, PyObject *key)
{
    uint64_t h = digest_arg(key);
    return h && d->cap && d->slots[digests_slot(d, h)].key == h;
}

static PyObject *
digests_get(Digests *d, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "get() takes (digest[, default])");
        return NULL;
    }
    uint64_t h = digest_arg(args[0]);
    if (h && d->cap) {
        const Slot *slot = &d->slots[digests_slot(d, h)];
        if (slot->key)
            return PyLong_FromUnsignedLongLong(slot->mask);
    }
    PyObject *dflt = nargs == 2 ? args[1] : Py_None;
    Py_INCREF(dflt);
    return dflt;
}

static PyObject *
digests_put_method(Digests *d, PyObject *const *args, Py_ssize_t nargs)
{
    uint64_t mask;
    if (nargs != 3 || !PyList_CheckExact(args[0])) {
        PyErr_SetString(PyExc_TypeError, "put() takes (digests: list[int], mask: int, room: int)");
        return NULL;
    }
    if (mask_arg(args[1], &mask) < 0)
        return NULL;
    Py_ssize_t room = PyLong_AsSsize_t(args[2]);
    if (room == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t added = 0;
    int cut = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(args[0]); i++) {
        uint64_t h = digest_arg(PyList_GET_ITEM(args[0], i));
        if (h == 0) {
            PyErr_SetString(PyExc_ValueError, "a digest is an int in 1..2**64-1");
            return NULL;
        }
        int r = digests_put(d, h, mask, &room);
        if (r < 0)
            return NULL;
        added += r == 1;
        cut |= r == 2;
    }
    return Py_BuildValue("(nO)", added, cut ? Py_True : Py_False);
}

static PyObject *
digests_items(Digests *d, PyObject *unused)
{
    PyObject *list = PyList_New(0);
    for (size_t i = 0; list != NULL && i < d->cap; i++) {
        if (!d->slots[i].key)
            continue;
        PyObject *item = Py_BuildValue("(KK)", (unsigned long long)d->slots[i].key,
                                       (unsigned long long)d->slots[i].mask);
        if (item == NULL || PyList_Append(list, item) < 0)
            Py_CLEAR(list);
        Py_XDECREF(item);
    }
    return list;
}

static PyObject *
digests_iter(Digests *d)
{
    PyObject *keys = PyList_New(0);
    for (size_t i = 0; keys != NULL && i < d->cap; i++) {
        if (!d->slots[i].key)
            continue;
        PyObject *key = PyLong_FromUnsignedLongLong(d->slots[i].key);
        if (key == NULL || PyList_Append(keys, key) < 0)
            Py_CLEAR(keys);
        Py_XDECREF(key);
    }
    if (keys == NULL)
        return NULL;
    PyObject *it = PyObject_GetIter(keys);
    Py_DECREF(keys);
    return it;
}

static PyMethodDef digests_methods[] = {
    {"get", (PyCFunction)(void (*)(void))digests_get, METH_FASTCALL,
     "get(digest, default=None, /): the label mask of an entry, or default"},
    {"put", (PyCFunction)(void (*)(void))digests_put_method, METH_FASTCALL,
     "put(digests, mask, room, /) -> (new entries, whether one found no room): or `mask` into each digest's entry,\n"
     "adding at most `room` new ones"},
    {"items", (PyCFunction)digests_items, METH_NOARGS, "items(): a list of (digest, label mask)"},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods digests_as_sequence = {
    .sq_length = (lenfunc)digests_len,
    .sq_contains = (objobjproc)digests_contains,
};

static PyTypeObject DigestsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "proctor._provtok.Digests",
    .tp_basicsize = sizeof(Digests),
    .tp_dealloc = (destructor)digests_dealloc,
    .tp_as_sequence = &digests_as_sequence,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Digests(): an index's entries, 64-bit digest -> label mask (bits 0..63), in C.",
    .tp_iter = (getiterfunc)digests_iter,
    .tp_methods = digests_methods,
    .tp_new = digests_new,
};

/* ---- transient blocks, kept for the next call -------------------------------------------------- */

/* Why: indexing 100 KB takes ~1 MB of transient buffers (the UCS-4 copy, the UTF-8 bytes, the call's digest
 * set). Past glibc's mmap threshold each is fresh memory, mapped for the call and unmapped after, and touching it
 * costs a page fault per 4 KB: ~600 a call, about half of the 1.9 ms a page of addresses and IBANs took where
 * the threshold had not risen (0.95 ms without the faults). Up to SPARE_BLOCKS freed blocks of at most
 * SPARE_MAX bytes each are kept for the next call (8 MB held at most; ~1 MB after 100 KB results). Always under
 * the GIL, and nothing here calls Python code: a call re-entered from Python (a caller's own int subclass in
 * add_digest) takes other blocks. */
#define SPARE_BLOCKS 4
#define SPARE_MAX ((size_t)2 << 20)

typedef struct {
    size_t size;
    size_t pad; /* the data after the head stays 16-byte aligned */
} BlockHead;

static BlockHead *spare[SPARE_BLOCKS];

/* At least `size` bytes (zeroed when `zero`): the smallest spare block that fits, else a new one. NULL with
 * MemoryError set. */
static void *
block_alloc(size_t size, int zero)
{
    if (size > (size_t)PY_SSIZE_T_MAX - sizeof(BlockHead)) {
        PyErr_NoMemory();
        return NULL;
    }
    int best = -1;
    for (int i = 0; i < SPARE_BLOCKS; i++)
        if (spare[i] != NULL && spare[i]->size >= size && (best < 0 || spare[i]->size < spare[best]->size))
            best = i;
    BlockHead *head;
    if (best >= 0) {
        head = spare[best];
        spare[best] = NULL;
    }
    else {
        head = PyMem_Malloc(sizeof(BlockHead) + (size ? size : 1));
        if (head == NULL) {
            PyErr_NoMemory();
            return NULL;
        }
        head->size = size;
    }
    if (zero)
        memset(head + 1, 0, size);
    return head + 1;
}

/* Give back a block of block_alloc (NULL: nothing): kept when small enough and a slot is free or holds a smaller
 * one, else freed. */
static void
block_free(void *data)
{
    if (data == NULL)
        return;
    BlockHead *head = (BlockHead *)data - 1;
    if (head->size <= SPARE_MAX) {
        int slot = -1;
        for (int i = 0; i < SPARE_BLOCKS && slot < 0; i++)
            if (spare[i] == NULL)
                slot = i;
        if (slot < 0) {
            int least = 0;
            for (int i = 1; i < SPARE_BLOCKS; i++)
                if (spare[i]->size < spare[least]->size)
                    least = i;
            if (spare[least]->size < head->size) {
                PyMem_Free(spare[least]);
                slot = least;
            }
        }
        if (slot >= 0) {
            spare[slot] = head;
            return;
        }
    }
    PyMem_Free(head);
}

/* The code points of `text` and a 0 after them, in a block; NULL with an exception set. */
static ch *
ucs4_block(PyObject *text)
{
    size_t len = (size_t)PyUnicode_GET_LENGTH(text);
    if (len >= (size_t)PY_SSIZE_T_MAX / sizeof(ch)) {
        PyErr_NoMemory();
        return NULL;
    }
    ch *s = block_alloc((len + 1) * sizeof(ch), 0);
    if (s != NULL && PyUnicode_AsUCS4(text, s, (Py_ssize_t)len + 1, 1) == NULL) {
        block_free(s);
        return NULL;
    }
    return s;
}

/* ---- the sink: where tokens go (a set of str, or digests into the index's entries) -------------- */

#define DASHLESS_MIN 7
#define MAX_DEPTH 4

typedef struct {
    ch *data;
    size_t cap;
} Buf;

typedef struct {
    int digests;        /* 0: collect str objects in `set`; 1: digests into `entries` */
    PyObject *set;      /* mode 0 */
    Key key;            /* mode 1 */
    PyObject *entries;  /* mode 1: dict digest -> label mask, or NULL when `table` is given */
    PyObject *mask;     /* mode 1 */
    Digests *dtable;    /* mode 1: the entries in C (instead of `entries`) */
    uint64_t umask;     /* mode 1, with `dtable`: `mask` */
    Py_ssize_t room;    /* mode 1: entries the dict may still take */
    size_t budget;      /* mode 1: distinct entries this call may produce */
    size_t count;       /* mode 1: distinct entries produced */
    Py_ssize_t added;   /* mode 1: new keys put in `entries` */
    uint64_t *table;    /* mode 1: open addressing set of the digests produced (0: empty) */
    size_t table_cap;
    int over_budget;    /* mode 1: more distinct entries than `budget` */
    int over_room;      /* mode 1: a new entry found no room */
    int stop;           /* an error, or the budget is spent */
    int iban_head;      /* a token looked like an IBAN's first group (gb29) */
    Buf scratch;        /* numbers, IBANs: rewritten forms */
    Buf dashless;       /* forms without their dashes */
    uint8_t *bytes;     /* mode 1: UTF-8 of the text being digested, 4 bytes per code point of the input */
    const ch *base;     /* mode 1: the input's code points */
    size_t base_n;
    const uint8_t *ascii; /* mode 1: the input's data when it is ASCII (a form inside it is hashed there) */
    int dash;           /* the token being processed holds a '-' */
    void *windows;      /* windows of groups joined already (seen_window), allocated at the first one */
    /* Short ASCII tokens (up to 7 bytes, with their length in the top byte) emitted already, one per slot: such a
     * token repeated (a column of small numbers, "1 1 1 …") skips its SipHash and table probe. 0: empty. */
    uint64_t recent[256];
    size_t grouped_cap; /* mode 1: distinct joined forms (of numbers laid out in groups) a text may give */
    uint64_t *joined;   /* mode 1: their digests, an open addressing set (0: empty), put in at the end */
    size_t joined_cap, joined_count;
    int joined_cut;     /* mode 1: more than grouped_cap: none of them is put in */
} Sink;

static int
buf_reserve(Buf *buf, size_t n)
{
    if (n <= buf->cap)
        return 0;
    if (n > PY_SSIZE_T_MAX / sizeof(ch)) {
        PyErr_NoMemory();
        return -1;
    }
    ch *data = PyMem_Realloc(buf->data, n * sizeof(ch));
    if (data == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    buf->data = data;
    buf->cap = n;
    return 0;
}

/* A set of digests (open addressing, 0: empty) moved into a new one of `cap` slots, a power of two; the old one is
 * given back. NULL with MemoryError set (the old one kept). */
static uint64_t *
rehashed(uint64_t *old, size_t old_cap, size_t cap)
{
    uint64_t *table = block_alloc(cap * sizeof(uint64_t), 1);
    if (table == NULL)
        return NULL;
    for (size_t i = 0; i < old_cap; i++) {
        uint64_t h = old[i];
        if (h) {
            size_t at = (size_t)h & (cap - 1);
            while (table[at])
                at = (at + 1) & (cap - 1);
            table[at] = h;
        }
    }
    block_free(old);
    return table;
}

static int
table_grow(Sink *sk)
{
    size_t cap = sk->table ? sk->table_cap * 2 : sk->table_cap; /* the first call: table_cap, set by the caller */
    if (cap > PY_SSIZE_T_MAX / sizeof(uint64_t)) {
        PyErr_NoMemory();
        return -1;
    }
    uint64_t *table = rehashed(sk->table, sk->table ? sk->table_cap : 0, cap);
    if (table == NULL)
        return -1;
    sk->table = table;
    sk->table_cap = cap;
    return 0;
}

/* Put one digest in the index: once per call, within the budget and the room left. */
static void
add_digest(Sink *sk, uint64_t h)
{
    if ((sk->count + 1) * 2 > sk->table_cap && table_grow(sk) < 0) {
        sk->stop = 1;
        return;
    }
    size_t at = (size_t)h & (sk->table_cap - 1);
    while (sk->table[at]) {
        if (sk->table[at] == h)
            return; /* produced already by this call */
        at = (at + 1) & (sk->table_cap - 1);
    }
    if (sk->count >= sk->budget) { /* one more distinct entry than the result may add */
        sk->over_budget = 1;
        sk->stop = 1;
        return;
    }
    sk->table[at] = h;
    sk->count++;
    if (sk->dtable != NULL) {
        int r = digests_put(sk->dtable, h, sk->umask, &sk->room);
        if (r < 0)
            sk->stop = 1;
        sk->added += r == 1;
        sk->over_room |= r == 2;
        return;
    }
    PyObject *key = PyLong_FromUnsignedLongLong(h);
    if (key == NULL) {
        sk->stop = 1;
        return;
    }
    PyObject *old; /* borrowed */
    if (sk->room > 0) { /* one lookup: the entry, put there with `mask` when it was new */
        Py_ssize_t before = PyDict_GET_SIZE(sk->entries);
        old = PyDict_SetDefault(sk->entries, key, sk->mask);
        if (old == NULL)
            sk->stop = 1;
        else if (PyDict_GET_SIZE(sk->entries) != before) {
            sk->room--;
            sk->added++;
            old = sk->mask;
        }
    }
    else {
        old = PyDict_GetItemWithError(sk->entries, key);
        if (old == NULL) {
            if (PyErr_Occurred())
                sk->stop = 1;
            else
                sk->over_room = 1;
        }
    }
    if (old != NULL && old != sk->mask) {
        /* `old` is borrowed from the dict, and PyNumber_Or can run Python code (a caller's own
           int subclass or dict) that drops it from there: hold it for the merge. */
        Py_INCREF(old);
        PyObject *both = PyNumber_Or(old, sk->mask);
        if (both == NULL)
            sk->stop = 1;
        else {
            int differs = PyObject_RichCompareBool(both, old, Py_NE);
            if (differs < 0 || (differs && PyDict_SetItem(sk->entries, key, both) < 0))
                sk->stop = 1;
            Py_DECREF(both);
        }
        Py_DECREF(old);
    }
    Py_DECREF(key);
}

static void
emit(Sink *sk, const ch *t, size_t n)
{
    if (sk->stop)
        return;
    if (sk->digests) {
        if (sk->ascii != NULL && t >= sk->base && t + n <= sk->base + sk->base_n) { /* its UTF-8 is in the text */
            const uint8_t *u = sk->ascii + (t - sk->base);
            uint64_t packed = 0;
            if (n >= 1 && n <= 7) { /* emitted before in this text: its digest is in already (`recent`) */
                memcpy(&packed, u, n);
                packed |= (uint64_t)n << 56;
                uint64_t *slot = &sk->recent[(packed * 0x9e3779b97f4a7c15ULL) >> 56];
                if (*slot == packed)
                    return;
                *slot = packed;
            }
            add_digest(sk, finish(sip13(&sk->key, u, n)));
        }
        else
            add_digest(sk, text_digest(&sk->key, t, n, sk->bytes));
        return;
    }
    PyObject *s = PyUnicode_FromKindAndData(PyUnicode_4BYTE_KIND, t, (Py_ssize_t)n);
    if (s == NULL || PySet_Add(sk->set, s) < 0)
        sk->stop = 1;
    Py_XDECREF(s);
}

/* A form of a token: it, and (_dashless) without its dashes when it is letter-and-digit groups. */
static void
emit_form(Sink *sk, const ch *t, size_t n)
{
    emit(sk, t, n);
    if (!sk->dash)
        return;
    size_t dashes = 0;
    for (size_t p = 0; p < n; p++)
        dashes += t[p] == '-';
    if (dashes == 0 || n - dashes < DASHLESS_MIN || !is_dashed(t, n))
        return;
    if (buf_reserve(&sk->dashless, n) < 0) {
        sk->stop = 1;
        return;
    }
    size_t m = 0;
    for (size_t p = 0; p < n; p++)
        if (t[p] != '-')
            sk->dashless.data[m++] = t[p];
    emit(sk, sk->dashless.data, m);
}

static int
is_trailing(ch c) /* _TRAILING = ".,:;!?/#-=&_~" */
{
    switch (c) {
    case '.': case ',': case ':': case ';': case '!': case '?': case '/':
    case '#': case '-': case '=': case '&': case '_': case '~':
        return 1;
    default:
        return 0;
    }
}

static inline int
is_scheme_sep(const ch *t, size_t n, size_t p) /* "://" at p */
{
    return p + 3 <= n && t[p] == ':' && t[p + 1] == '/' && t[p + 2] == '/';
}

/* _token_forms */
static void
token_forms(Sink *sk, const ch *t, size_t n, int depth)
{
    if (sk->stop || depth > MAX_DEPTH)
        return;
    while (n > 0 && is_trailing(t[n - 1]))
        n--;
    while (n > 0 && (t[0] == '_' || t[0] == '~')) {
        t++;
        n--;
    }
    if (n == 0)
        return;
    if (is_number(t, n)) { /* _number: no commas; trailing decimal zeros and a bare point dropped */
        if (buf_reserve(&sk->scratch, n) < 0) {
            sk->stop = 1;
            return;
        }
        size_t m = 0;
        int point = 0;
        for (size_t p = 0; p < n; p++) {
            if (t[p] != ',')
                sk->scratch.data[m++] = t[p];
            point |= t[p] == '.';
        }
        if (point) {
            while (m > 0 && sk->scratch.data[m - 1] == '0')
                m--;
            while (m > 0 && sk->scratch.data[m - 1] == '.')
                m--;
        }
        emit_form(sk, sk->scratch.data, m);
        return;
    }
    size_t p;
    for (p = 0; p < n && t[p] != ','; p++)
        ;
    if (p < n) { /* a list written without spaces: each part */
        size_t start = 0;
        for (p = 0; p <= n; p++) {
            if (p == n || t[p] == ',') {
                token_forms(sk, t + start, p - start, depth + 1);
                start = p + 1;
            }
        }
        return;
    }
    emit_form(sk, t, n);
    /* key=value, a query string, mailto:x: the pieces between = & ? : (a piece holding :// is none) */
    int has_piece_sep = 0;
    for (p = 0; p < n;) {
        if (is_scheme_sep(t, n, p))
            p += 3;
        else {
            if (t[p] == '=' || t[p] == '&' || t[p] == '?' || t[p] == ':')
                has_piece_sep = 1;
            p++;
        }
    }
    if (has_piece_sep) {
        size_t start = 0;
        int scheme_inside = 0;
        for (p = 0; p <= n;) {
            if (p < n && is_scheme_sep(t, n, p)) {
                scheme_inside = 1;
                p += 3;
                continue;
            }
            if (p == n || t[p] == '=' || t[p] == '&' || t[p] == '?' || t[p] == ':') {
                if (!scheme_inside && p > start && token_fullmatch(t + start, p - start))
                    token_forms(sk, t + start, p - start, depth + 1);
                start = p + 1;
                scheme_inside = 0;
            }
            p++;
        }
    }
    /* a URL: also without its scheme, without www., its host, and the host without its port */
    size_t scheme = n;
    for (p = 0; p + 3 <= n; p++)
        if (is_scheme_sep(t, n, p)) {
            scheme = p;
            break;
        }
    const ch *rest;
    size_t rn;
    if (scheme != n && scheme > 0) {
        rest = t + scheme + 3;
        rn = n - scheme - 3;
    }
    else if (starts_www(t, n)) {
        rest = t;
        rn = n;
    }
    else
        return;
    if (rn == 0)
        return;
    emit_form(sk, rest, rn);
    if (starts_www(rest, rn) && rn > 4)
        emit_form(sk, rest + 4, rn - 4);
    size_t hn = 0;
    while (hn < rn && rest[hn] != '/' && rest[hn] != '?')
        hn++;
    if (hn > 0 && hn != rn)
        emit_form(sk, rest, hn);
    size_t bn = hn; /* _PORT: ":\d+$" */
    size_t colon = hn;
    for (p = hn; p > 0; p--)
        if (rest[p - 1] == ':') {
            colon = p - 1;
            break;
        }
    if (colon < hn && colon + 1 < hn) {
        size_t q;
        for (q = colon + 1; q < hn && is_dec(rest[q]); q++)
            ;
        if (q == hn)
            bn = colon;
    }
    if (bn != hn)
        emit_form(sk, rest, bn);
    if (starts_www(rest, bn) && bn > 4)
        emit_form(sk, rest + 4, bn - 4);
}

/* One token found by _TOKEN: itself when _SIMPLE, else its forms. */
static void
token(Sink *sk, const ch *t, size_t n)
{
    if (n == 4 && is_az(t[0]) && is_az(t[1]) && is_dec(t[2]) && is_dec(t[3]))
        sk->iban_head = 1;
    if (is_simple(t, n))
        emit_form(sk, t, n);
    else
        token_forms(sk, t, n, 0);
}

/* _IBAN.findall over the folded text, each match without its spaces:
 * (?<!\w)[a-z]{2}\d{2}(?: [a-z0-9]{4}){2,7}(?: [a-z0-9]{1,4})?(?!\w) */
static void
ibans(Sink *sk, const ch *s, size_t n)
{
    size_t i = 0;
    while (i + 14 <= n && !sk->stop) { /* a head and two groups at least */
        if (s[i + 4] == ' ' && (i == 0 || !is_w(s[i - 1])) && is_az(s[i]) && is_az(s[i + 1]) && is_dec(s[i + 2]) &&
            is_dec(s[i + 3])) {
            size_t head = i + 4, groups = 0, q = head, end = 0;
            int matched = 0;
            while (groups < 7 && q + 5 <= n && s[q] == ' ' && is_az09(s[q + 1]) && is_az09(s[q + 2]) &&
                   is_az09(s[q + 3]) && is_az09(s[q + 4])) {
                groups++;
                q += 5;
            }
            for (size_t g = groups; g >= 2 && !matched; g--) {
                size_t at = head + 5 * g;
                if (at < n && s[at] == ' ') {
                    size_t t = 0;
                    while (t < 4 && at + 1 + t < n && is_az09(s[at + 1 + t]))
                        t++;
                    for (size_t tt = t; tt >= 1; tt--) {
                        size_t e = at + 1 + tt;
                        if (e == n || !is_w(s[e])) {
                            matched = 1;
                            end = e;
                            break;
                        }
                    }
                }
                if (!matched && (at == n || !is_w(s[at]))) {
                    matched = 1;
                    end = at;
                }
            }
            if (matched) {
                if (buf_reserve(&sk->scratch, end - i) < 0) {
                    sk->stop = 1;
                    return;
                }
                size_t m = 0;
                for (size_t p = i; p < end; p++)
                    if (s[p] != ' ')
                        sk->scratch.data[m++] = s[p];
                emit(sk, sk->scratch.data, m);
                i = end;
                continue;
            }
        }
        i++;
    }
}

/* ---- numbers laid out in groups (_grouped) ------------------------------------------------------ */

#define GROUPED_MIN 7
#define GROUPED_MAX 34
/* Groups joined at most, outside an IBAN (_GROUPED_GROUPS): bounds the joined forms per group to 11, so a
 * result of tiny groups without end ("1 2 1 2 …") costs at most a few times an ordinary one. */
#define GROUPED_GROUPS 12
/* The groups of a sequence kept for joining: a joined form of GROUPED_MAX characters or fewer spans at most
 * GROUPED_MAX groups (each one character or more), so the last RING > GROUPED_MAX + 1 of them suffice. */
#define RING 64

typedef struct {
    size_t at, len;
    int brk; /* a line break in the gap before this group */
} Group;

static inline int
is_ascii_digit(ch c)
{
    return c >= '0' && c <= '9';
}

static inline int
is_group_gap(ch c) /* _GROUP_SEP: [\s./()_-] */
{
    return c == '-' || c == '.' || c == '/' || c == '(' || c == ')' || c == '_' || is_space(c);
}

static inline int
is_line_break(ch c) /* _LINE_BREAKS: what str.splitlines() splits at */
{
    switch (c) {
    case '\n': case '\r': case 0x0b: case 0x0c: case 0x1c: case 0x1d: case 0x1e: case 0x85: case 0x2028: case 0x2029:
        return 1;
    default:
        return 0;
    }
}

static inline int
is_iban_first(const ch *t, size_t n) /* _IBAN_FIRST: [a-z]{2}[0-9]{2} */
{
    return n == 4 && is_az(t[0]) && is_az(t[1]) && is_ascii_digit(t[2]) && is_ascii_digit(t[3]);
}

/* A joined form's digest, kept aside (index: `grouped_cap`): the forms of a text are indexed all, at the end of
 * the scan, or none when there are more than grouped_cap distinct ones. */
static void
add_joined(Sink *sk, uint64_t h)
{
    if (sk->joined_cut)
        return;
    if ((sk->joined_count + 1) * 2 > sk->joined_cap) {
        size_t cap = sk->joined_cap ? sk->joined_cap * 2 : 4096;
        uint64_t *table = rehashed(sk->joined, sk->joined_cap, cap);
        if (table == NULL) {
            sk->stop = 1;
            return;
        }
        sk->joined = table;
        sk->joined_cap = cap;
    }
    size_t at = (size_t)h & (sk->joined_cap - 1);
    while (sk->joined[at]) {
        if (sk->joined[at] == h)
            return;
        at = (at + 1) & (sk->joined_cap - 1);
    }
    if (sk->joined_count >= sk->grouped_cap) { /* one more than the cap: none is indexed, and no more looked for */
        sk->joined_cut = 1;
        block_free(sk->joined);
        sk->joined = NULL;
        sk->joined_cap = sk->joined_count = 0;
        return;
    }
    sk->joined[at] = h;
    sk->joined_count++;
}

/* Emit groups first..last (counted from the sequence's start; kept in `ring`) joined, `size` characters. */
static void
emit_joined(Sink *sk, const ch *s, const Group *ring, size_t first, size_t last, size_t size)
{
    if (sk->digests) { /* groups are ASCII: their UTF-8 is their code points, digested without a copy in UCS-4 */
        if (sk->stop || sk->joined_cut)
            return;
        uint8_t *o = sk->bytes; /* 4 bytes per character of the text: room for any part of it */
        for (size_t g = first; g <= last; g++) {
            const Group *gr = &ring[g % RING];
            for (size_t p = 0; p < gr->len; p++)
                *o++ = (uint8_t)s[gr->at + p];
        }
        add_joined(sk, finish(sip13(&sk->key, sk->bytes, size)));
        return;
    }
    if (buf_reserve(&sk->scratch, size) < 0) {
        sk->stop = 1;
        return;
    }
    size_t m = 0;
    for (size_t g = first; g <= last; g++) {
        const Group *gr = &ring[g % RING];
        memcpy(sk->scratch.data + m, s + gr->at, gr->len * sizeof(ch));
        m += gr->len;
    }
    emit(sk, sk->scratch.data, m);
}

/* Windows of groups already joined by this call. The joined forms ending at a group depend only on the groups a
 * form may reach back to (their characters, and the line breaks between them), so on the text from the first of
 * them to the last: when the same text was such a window before, every one of its forms is kept already
 * (add_joined; a set of str in mode 0), and its up to 11 SipHashes are skipped. (The same groups with other gaps
 * are joined again: rarer, and only slower.) A text of tiny groups ("1 2 1 2 …", a table of small numbers)
 * repeats its windows: 6.1 ms for 100 KB of "1 " without this. A slot: the window's 64-bit hash (0: empty), where
 * its text starts and its length (the text is the call's own, alive until it returns): nothing is copied. The
 * table is small and probed at most WINDOW_PROBES times: full or unlucky, a window is just joined again (what it
 * costs without the table), so a crafted text cannot make it slower than that. */
#define WINDOW_SLOTS 1024
#define WINDOW_PROBES 8
#define WINDOW_SPAN 1024 /* code points; a window of 12 groups of 34 characters in all has gaps of ~80 each */

typedef struct {
    uint64_t hash;
    uint32_t at, len;
} Window;

static int
seen_window(Sink *sk, const ch *s, const Group *ring, size_t first, size_t last)
{
    size_t at = ring[first % RING].at, len = ring[last % RING].at + ring[last % RING].len - at;
    if (len > WINDOW_SPAN || at > UINT32_MAX)
        return 0;
    /* The window's bytes: the text's own when it is ASCII (index), else its code points. */
    int ascii = sk->ascii != NULL && s == sk->base;
    const uint8_t *bytes = ascii ? sk->ascii + at : (const uint8_t *)(s + at);
    size_t size = ascii ? len : len * sizeof(ch);
    uint64_t h = 0x9e3779b97f4a7c15ULL ^ size, word;
    size_t w = 0;
    for (; w + 8 <= size; w += 8) {
        memcpy(&word, bytes + w, 8);
        h = ROTL((h ^ word) * 0xff51afd7ed558ccdULL, 31);
    }
    word = 0;
    memcpy(&word, bytes + w, size - w);
    h = ROTL((h ^ word) * 0xff51afd7ed558ccdULL, 31);
    h = (h ^ (h >> 29)) | 1; /* never 0: an empty slot */
    if (sk->windows == NULL && (sk->windows = block_alloc(WINDOW_SLOTS * sizeof(Window), 1)) == NULL) {
        PyErr_Clear();
        return 0; /* no table: joined as without one (and the next window tries again) */
    }
    Window *table = (Window *)sk->windows;
    for (size_t i = 0; i < WINDOW_PROBES; i++) {
        Window *slot = &table[((size_t)h + i) & (WINDOW_SLOTS - 1)];
        if (slot->hash == 0) {
            *slot = (Window){h, (uint32_t)at, (uint32_t)len};
            return 0;
        }
        if (slot->hash == h && slot->len == len &&
            memcmp(ascii ? sk->ascii + slot->at : (const uint8_t *)(s + slot->at), bytes, size) == 0)
            return 1;
    }
    return 0;
}

/* _grouped: the joined forms of the numbers laid out in groups. A sequence starts at a group holding an ASCII
 * digit (found by skipping to the next digit) not inside a longer word, and goes on over gaps of [\s./()_-] to
 * the next group (one holding a digit, or four letters right after an IBAN's first group); a group
 * [a-z]{2}[0-9]{2} starts a new sequence (an IBAN). Each group added emits the joined runs ending at it: for an
 * IBAN the prefix from its first group, otherwise every run of two groups or more crossing at most one line
 * break; only those of GROUPED_MIN to GROUPED_MAX characters. */
static void
grouped(Sink *sk, const ch *s, size_t n, size_t *done, size_t from, size_t to)
{
    /* Called by scan() for each of its runs [from, to) that holds a digit (every ASCII digit is in one), so the
     * text between runs is never searched for digits; *done: where the last sequence looked at ended. */
    Group ring[RING];
    if (sk->joined_cut)
        return; /* none of this text's joined forms is indexed: no need to find more */
    size_t pos = from > *done ? from : *done; /* s[pos] is no letter or digit inside a word not looked at yet */
    while (pos < to && !sk->stop && !sk->joined_cut) {
        size_t d = pos;
        while (d < to && !is_ascii_digit(s[d]))
            d++;
        if (d == to)
            break;
        size_t a = d, b = d;
        while (a > pos && is_az09(s[a - 1]))
            a--;
        while (b < n && is_az09(s[b]))
            b++;
        if ((a > 0 && is_alnum(s[a - 1])) || (b < n && is_alnum(s[b]))) { /* inside a longer word */
            pos = b;
            continue;
        }
        size_t count = 1, size = b - a;
        int iban = is_iban_first(s + a, b - a), head = iban;
        ring[0] = (Group){a, b - a, 0};
        for (;;) {
            size_t q = b;
            int brk = 0;
            while (q < n && is_group_gap(s[q])) {
                brk |= is_line_break(s[q]);
                q++;
            }
            pos = q;
            if (q == b || q == n || !is_az09(s[q]))
                break;
            size_t c = q;
            int digit = 0;
            while (c < n && is_az09(s[c])) {
                digit |= is_ascii_digit(s[c]);
                c++;
            }
            size_t len = c - q;
            if ((c < n && is_alnum(s[c])) || (!digit && !(head && len == 4))) { /* no group: the sequence ends */
                pos = c;
                break;
            }
            head = digit && is_iban_first(s + q, len);
            if (head) { /* an IBAN starts here: a new sequence */
                count = 0;
                size = 0;
                iban = 1;
            }
            ring[count % RING] = (Group){q, len, brk};
            count++;
            b = c;
            if (iban) {
                size += len;
                if (count >= 2 && size >= GROUPED_MIN && size <= GROUPED_MAX)
                    emit_joined(sk, s, ring, 0, count - 1, size);
            }
            else {
                /* The window first: the groups a form ending here may start at, and how many forms it gives. */
                size_t joined = len, first = count - 1, forms = 0;
                int lines = 0;
                for (size_t i = count - 1; i-- > 0 && count - i <= GROUPED_GROUPS;) {
                    lines += ring[(i + 1) % RING].brk;
                    joined += ring[i % RING].len;
                    if (joined > GROUPED_MAX || lines > 1)
                        break;
                    first = i;
                    forms += joined >= GROUPED_MIN;
                }
                if (forms > 1 && seen_window(sk, s, ring, first, count - 1))
                    forms = 0;
                joined = len;
                for (size_t i = count - 1; forms && i-- > first;) {
                    joined += ring[i % RING].len;
                    if (joined >= GROUPED_MIN)
                        emit_joined(sk, s, ring, i, count - 1, joined);
                }
            }
            if (sk->stop || sk->joined_cut)
                return;
        }
    }
    if (pos > *done)
        *done = pos;
}

/* Every token of the folded text `s` (the _TOKEN matches; IBANs in groups when one was seen). */
static void
scan(Sink *sk, const ch *s, size_t n)
{
    size_t i = 0, grouped_done = 0;
    while (i < n && !sk->stop) {
        if (!in_class(s[i])) {
            i++;
            continue;
        }
        size_t r = i;
        unsigned flags = 0, k1;
        while (i < n && ((k1 = klass(s[i])) & (W | SEP))) {
            flags |= k1;
            i++;
        }
        if ((flags & DEC) && i > grouped_done) /* (a non-ASCII digit too: grouped() looks for ASCII ones) */
            grouped(sk, s, n, &grouped_done, r, i);
        if (!(flags & W) || !(flags & (DEC | JOIN))) /* no word character, or neither a digit nor a joiner */
            continue;
        size_t k = r;
        while (k < i && !is_w(s[k]))
            k++;
        if (k < i && token_like(s + k, i - k)) {
            sk->dash = (flags & DASH) != 0;
            token(sk, s + k, i - k);
        }
    }
    if (sk->iban_head) {
        sk->dash = 0;
        ibans(sk, s, n);
    }
}

/* " ".join(s.split()) into `out` (at least n long); its length. */
static size_t
whole_of(const ch *s, size_t n, ch *out)
{
    size_t m = 0, i = 0;
    while (i < n) {
        while (i < n && is_space(s[i]))
            i++;
        if (i == n)
            break;
        if (m)
            out[m++] = ' ';
        while (i < n && !is_space(s[i]))
            out[m++] = s[i++];
    }
    return m;
}

static void
sink_free(Sink *sk)
{
    block_free(sk->table);
    PyMem_Free(sk->scratch.data);
    PyMem_Free(sk->dashless.data);
    block_free(sk->bytes);
    block_free(sk->windows);
    block_free(sk->joined);
}

/* The text's code points and its whole form; NULL with an exception set on failure. */
static ch *
code_points(PyObject *text, size_t *n, ch **whole, size_t *wn)
{
    Py_ssize_t len = PyUnicode_GET_LENGTH(text);
    ch *s = ucs4_block(text); /* len + 1 code points */
    if (s == NULL)
        return NULL;
    ch *w = block_alloc(((size_t)len + 1) * sizeof(ch), 0);
    if (w == NULL) {
        block_free(s);
        return NULL;
    }
    *n = (size_t)len;
    *wn = whole_of(s, (size_t)len, w);
    *whole = w;
    return s;
}

/* ---- module functions -------------------------------------------------------------------------- */

PyDoc_STRVAR(analyze_doc,
"analyze(folded: str) -> tuple[str, set[str]]\n\n"
"The whole form (whitespace collapsed) and the tokens of an already case-folded text, as\n"
"proctor.provenance's pure-Python tokeniser gives them.");

static PyObject *
analyze(PyObject *module, PyObject *text)
{
    if (!PyUnicode_Check(text)) {
        PyErr_SetString(PyExc_TypeError, "analyze() takes a str");
        return NULL;
    }
    size_t n, wn;
    ch *whole;
    ch *s = code_points(text, &n, &whole, &wn);
    if (s == NULL)
        return NULL;
    Sink sk = {0};
    PyObject *result = NULL, *whole_str = NULL;
    sk.set = PySet_New(NULL);
    if (sk.set == NULL)
        goto done;
    scan(&sk, s, n);
    if (PyErr_Occurred())
        goto done;
    whole_str = PyUnicode_FromKindAndData(PyUnicode_4BYTE_KIND, whole, (Py_ssize_t)wn);
    if (whole_str == NULL)
        goto done;
    result = PyTuple_Pack(2, whole_str, sk.set);
done:
    Py_XDECREF(whole_str);
    Py_XDECREF(sk.set);
    sink_free(&sk);
    block_free(whole);
    block_free(s);
    return result;
}

PyDoc_STRVAR(digest_doc,
"digest(key: bytes, text: str) -> int\n\n"
"The 64-bit keyed digest (SipHash-1-3 under the 16-byte key) of an already normalised text.");

static PyObject *
digest(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    Key key;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "digest() takes (key, text)");
        return NULL;
    }
    if (parse_key(args[0], &key) < 0)
        return NULL;
    PyObject *text = args[1];
    if (!PyUnicode_Check(text)) {
        PyErr_SetString(PyExc_TypeError, "digest() takes a str");
        return NULL;
    }
    Py_ssize_t len = PyUnicode_GET_LENGTH(text);
    uint64_t h;
    if (PyUnicode_IS_ASCII(text)) /* its UTF-8 is its data */
        h = finish(sip13(&key, (const uint8_t *)PyUnicode_DATA(text), (size_t)len));
    else {
        if ((size_t)len > PY_SSIZE_T_MAX / 8)
            return PyErr_NoMemory();
        ch *copy = PyUnicode_AsUCS4Copy(text);
        if (copy == NULL)
            return NULL;
        uint8_t *bytes = PyMem_Malloc((size_t)len * 4 + 1);
        if (bytes == NULL) {
            PyMem_Free(copy);
            return PyErr_NoMemory();
        }
        h = text_digest(&key, copy, (size_t)len, bytes);
        PyMem_Free(bytes);
        PyMem_Free(copy);
    }
    return PyLong_FromUnsignedLongLong(h);
}

PyDoc_STRVAR(index_doc,
"index(key: bytes, folded: str, entries: dict, mask: int, room: int, budget: int, grouped: int)\n"
"    -> tuple[int, int, int, bool, bool, int]\n\n"
"Index one case-folded text: its whole form and every token, as digests put in `entries` with\n"
"`mask` (or'ed into an existing entry's). At most `room` new keys are added and at most `budget`\n"
"distinct entries produced. Returns (the whole form's digest, new keys added, distinct entries\n"
"produced, whether the budget was exceeded, whether a new entry found no room, and how many distinct joined\n"
"forms of numbers laid out in groups the text gave: `grouped` + 1 when more than `grouped`, and then none of\n"
"them is indexed).");

static PyObject *
index_text(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    Sink sk = {0};
    uint64_t whole_digest = 0;
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "index() takes (key, folded, entries, mask, room, budget, grouped)");
        return NULL;
    }
    if (parse_key(args[0], &sk.key) < 0)
        return NULL;
    PyObject *text = args[1];
    int table = Py_IS_TYPE(args[2], &DigestsType);
    if (!PyUnicode_Check(text) || !(table || PyDict_CheckExact(args[2])) || !PyLong_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "index() takes (bytes, str, dict or Digests, int, int, int)");
        return NULL;
    }
    if (table) {
        sk.dtable = (Digests *)args[2];
        if (mask_arg(args[3], &sk.umask) < 0)
            return NULL;
    }
    Py_ssize_t room = PyLong_AsSsize_t(args[4]);
    if (room == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t budget = PyLong_AsSsize_t(args[5]);
    if (budget == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t grouped_cap = PyLong_AsSsize_t(args[6]);
    if (grouped_cap == -1 && PyErr_Occurred())
        return NULL;
    sk.grouped_cap = grouped_cap > 0 ? (size_t)grouped_cap : 0;
    sk.digests = 1;
    sk.entries = args[2];
    sk.mask = args[3];
    sk.room = room;
    sk.budget = budget > 0 ? (size_t)budget : 0;
    size_t n, wn;
    ch *whole = NULL;
    const uint8_t *ascii = PyUnicode_IS_ASCII(text) ? (const uint8_t *)PyUnicode_DATA(text) : NULL;
    ch *s = ascii ? ucs4_block(text) : code_points(text, &n, &whole, &wn);
    if (s == NULL)
        return NULL;
    n = (size_t)PyUnicode_GET_LENGTH(text);
    if (n > PY_SSIZE_T_MAX / 8) {
        PyErr_NoMemory();
        goto done;
    }
    if ((sk.bytes = block_alloc(n * 4 + 1, 0)) == NULL)
        goto done;
    sk.base = s;
    sk.base_n = n;
    sk.ascii = ascii;
    sk.table_cap = 1024; /* or two slots per 16 characters */
    while (sk.table_cap < n / 8 && sk.table_cap < ((size_t)1 << 40))
        sk.table_cap *= 2;
    if (table_grow(&sk) < 0)
        goto done;
    if (ascii) { /* the whole form in bytes: words joined by one space */
        uint8_t *o = sk.bytes;
        size_t i = 0;
        while (i < n) {
            while (i < n && (ascii_class[ascii[i]] & SPACE))
                i++;
            if (i == n)
                break;
            if (o != sk.bytes)
                *o++ = ' ';
            while (i < n && !(ascii_class[ascii[i]] & SPACE))
                *o++ = ascii[i++];
        }
        whole_digest = finish(sip13(&sk.key, sk.bytes, (size_t)(o - sk.bytes)));
    }
    else
        whole_digest = text_digest(&sk.key, whole, wn, sk.bytes);
    add_digest(&sk, whole_digest);
    scan(&sk, s, n);
    for (size_t i = 0; i < sk.joined_cap && !sk.stop; i++) /* slot order: arbitrary, as a set's */
        if (sk.joined[i])
            add_digest(&sk, sk.joined[i]);
done:
    sink_free(&sk);
    block_free(whole);
    block_free(s);
    if (PyErr_Occurred())
        return NULL;
    return Py_BuildValue("(KnnOOn)", (unsigned long long)whole_digest, sk.added, (Py_ssize_t)sk.count,
                         sk.over_budget ? Py_True : Py_False, sk.over_room ? Py_True : Py_False,
                         sk.joined_cut ? (Py_ssize_t)sk.grouped_cap + 1 : (Py_ssize_t)sk.joined_count);
}

PyDoc_STRVAR(siphash_doc,
"siphash(key: bytes, data: bytes, rounds: int) -> int\n\n"
"SipHash-1-3 (rounds=13: the digest's primitive) or SipHash-2-4 (rounds=24) of `data` under the 16-byte\n"
"`key`, for tests: SipHash-2-4's published vectors check the code both share.");

static PyObject *
siphash(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    Key key;
    if (nargs != 3 || !PyBytes_Check(args[1]) || !PyLong_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "siphash() takes (key: bytes, data: bytes, rounds: 13 or 24)");
        return NULL;
    }
    if (parse_key(args[0], &key) < 0)
        return NULL;
    long rounds = PyLong_AsLong(args[2]);
    if (rounds != 13 && rounds != 24) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "siphash() rounds: 13 (the digest's) or 24 (the reference's)");
        return NULL;
    }
    const uint8_t *data = (const uint8_t *)PyBytes_AS_STRING(args[1]);
    size_t len = (size_t)PyBytes_GET_SIZE(args[1]);
    return PyLong_FromUnsignedLongLong(rounds == 13 ? sip13(&key, data, len) : sip24(&key, data, len));
}

/* ---- visible: the fold's first step (provenance._fold) ----------------------------------------- */

PyDoc_STRVAR(visible_doc,
"visible(text, marks) -> (str, bool)\n\n"
"`text` without zero-width characters and soft hyphens (U+200B U+200C U+200D U+2060 U+FEFF U+00AD), with the\n"
"dashes U+2010..U+2014 and U+2212 as '-' and the ideographic full stops U+3002 and U+FF61 as '.'\n"
"(provenance._INVISIBLE), and whether that text holds a run of more than 30 characters each a BMP non-starter\n"
"(`marks`: a bitmap of the 65,536 BMP code points, 8,192 bytes) or astral: where unicodenorm.stream_safe could\n"
"change it. One pass in C: str.translate with a dict costs ~35 ns a character of any non-ASCII text.");

#define STREAM_SAFE_RUN 30 /* unicodenorm.MAX_NON_STARTERS */

static PyObject *
visible(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyUnicode_Check(args[0]) || !PyBytes_Check(args[1]) || PyBytes_GET_SIZE(args[1]) != 8192) {
        PyErr_SetString(PyExc_TypeError, "visible() takes (text: str, marks: bytes of 8192)");
        return NULL;
    }
    PyObject *text = args[0];
    const uint8_t *marks = (const uint8_t *)PyBytes_AS_STRING(args[1]);
    if (PyUnicode_READY(text) < 0)
        return NULL;
    if (PyUnicode_IS_ASCII(text))
        return Py_BuildValue("(OO)", text, Py_False);
    int kind = PyUnicode_KIND(text);
    const void *data = PyUnicode_DATA(text);
    Py_ssize_t n = PyUnicode_GET_LENGTH(text);
    Py_UCS4 *out = NULL; /* allocated at the first character that changes */
    Py_ssize_t m = 0;
    size_t run = 0;
    int suspect = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_UCS4 c = PyUnicode_READ(kind, data, i), to = c;
        switch (c) {
        case 0x200b: case 0x200c: case 0x200d: case 0x2060: case 0xfeff: case 0x00ad:
            to = 0x110000; /* removed */
            break;
        case 0x2010: case 0x2011: case 0x2012: case 0x2013: case 0x2014: case 0x2212:
            to = '-';
            break;
        case 0x3002: case 0xff61:
            to = '.';
            break;
        default:
            break;
        }
        if (to != c && out == NULL) {
            out = PyMem_Malloc((size_t)n * sizeof(Py_UCS4));
            if (out == NULL)
                return PyErr_NoMemory();
            for (Py_ssize_t j = 0; j < i; j++)
                out[j] = PyUnicode_READ(kind, data, j);
            m = i;
        }
        if (to == 0x110000)
            continue;
        if (out != NULL)
            out[m++] = to;
        if (to >= 0x10000 || (marks[to >> 3] >> (to & 7) & 1))
            suspect |= ++run > STREAM_SAFE_RUN;
        else
            run = 0;
    }
    PyObject *result = out == NULL ? Py_NewRef(text) : PyUnicode_FromKindAndData(PyUnicode_4BYTE_KIND, out, m);
    PyMem_Free(out);
    if (result == NULL)
        return NULL;
    PyObject *pair = Py_BuildValue("(NO)", result, suspect ? Py_True : Py_False);
    return pair;
}

PyDoc_STRVAR(phrases_doc,
"phrases(key: bytes, folded: str, longest: int, limit: int[, entries: Digests, mask: int, room: int])\n"
"    -> list[int] | tuple[int, int, bool] | None\n\n"
"The digests of every run of 2 to `longest` words (runs of ASCII letters, digits and _) of an ASCII\n"
"case-folded text, each run joined by one space, by length then position: what provenance.phrase_runs\n"
"gives, digested. At most `limit` + 1 of them (more than `limit`: the caller keeps `limit`). With `entries`,\n"
"the first `limit` are put there with `mask` (at most `room` new keys) instead, and (new keys, runs put,\n"
"whether a new one found no room, whether there were more than `limit`) is returned. None for a text that is not ASCII (the caller finds its words in\n"
"Python).");

static inline int
phrase_word(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

/* Why C: a page of prose has ~15,000 words, so ~45,000 runs of two to four; in Python each run costs a join
 * and a digest call (~0.4 us: 20 ms for 100 KB). Here the words are copied once, joined by single spaces,
 * and each run is a slice of that buffer digested in place. */
static PyObject *
phrases(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    Key key;
    Digests *table = NULL;
    uint64_t umask = 0;
    Py_ssize_t room = 0;
    if ((nargs != 4 && nargs != 7) || !PyUnicode_Check(args[1]) || !PyLong_Check(args[2]) || !PyLong_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "phrases() takes (key: bytes, folded: str, longest: int, limit: int"
                                         "[, entries: Digests, mask: int, room: int])");
        return NULL;
    }
    if (nargs == 7) {
        if (!Py_IS_TYPE(args[4], &DigestsType)) {
            PyErr_SetString(PyExc_TypeError, "phrases(): entries must be a Digests");
            return NULL;
        }
        table = (Digests *)args[4];
        if (mask_arg(args[5], &umask) < 0)
            return NULL;
        room = PyLong_AsSsize_t(args[6]);
        if (room == -1 && PyErr_Occurred())
            return NULL;
    }
    if (parse_key(args[0], &key) < 0)
        return NULL;
    PyObject *text = args[1];
    if (PyUnicode_READY(text) < 0)
        return NULL;
    if (!PyUnicode_IS_ASCII(text))
        Py_RETURN_NONE;
    Py_ssize_t longest = PyLong_AsSsize_t(args[2]);
    if (longest == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t limit = PyLong_AsSsize_t(args[3]);
    if (limit == -1 && PyErr_Occurred())
        return NULL;
    if (table != NULL && longest < 2)
        return Py_BuildValue("(nnOO)", (Py_ssize_t)0, (Py_ssize_t)0, Py_False, Py_False);
    PyObject *out = table != NULL ? NULL : PyList_New(0);
    if (table == NULL && (out == NULL || longest < 2 || limit < 0))
        return out;
    Py_ssize_t added = 0;
    int full = 0, failed = 0, over = 0;
    const char *s = (const char *)PyUnicode_DATA(text);
    size_t n = (size_t)PyUnicode_GET_LENGTH(text);
    size_t words_max = n / 2 + 1; /* a word and the character after it */
    if (n > PY_SSIZE_T_MAX / 4 || words_max > PY_SSIZE_T_MAX / (2 * sizeof(size_t))) {
        Py_XDECREF(out);
        return PyErr_NoMemory();
    }
    char *buf = PyMem_Malloc(n + 1);
    size_t *starts = PyMem_Malloc(words_max * sizeof(size_t));
    size_t *ends = PyMem_Malloc(words_max * sizeof(size_t));
    if (buf == NULL || starts == NULL || ends == NULL) {
        PyMem_Free(buf);
        PyMem_Free(starts);
        PyMem_Free(ends);
        Py_XDECREF(out);
        return PyErr_NoMemory();
    }
    size_t len = 0, m = 0;
    for (size_t i = 0; i < n;) {
        if (!phrase_word(s[i])) {
            i++;
            continue;
        }
        if (m)
            buf[len++] = ' '; /* at most one separator per word after the first: len <= n */
        starts[m] = len;
        while (i < n && phrase_word(s[i]))
            buf[len++] = s[i++];
        ends[m++] = len;
    }
    Py_ssize_t count = 0;
    for (size_t size = 2; size <= (size_t)longest && size <= m; size++) {
        for (size_t i = 0; i + size <= m; i++) {
            uint64_t h = finish(sip13(&key, (const uint8_t *)buf + starts[i], ends[i + size - 1] - starts[i]));
            if (table != NULL) {
                if (count >= limit) { /* one run more than the limit allows */
                    over = 1;
                    goto done;
                }
                int put = digests_put(table, h, umask, &room);
                if (put < 0) {
                    failed = 1;
                    goto done;
                }
                added += put == 1;
                full |= put == 2;
                count++;
                continue;
            }
            PyObject *item = PyLong_FromUnsignedLongLong(h);
            if (item == NULL || PyList_Append(out, item) < 0) {
                Py_XDECREF(item);
                Py_CLEAR(out);
                goto done;
            }
            Py_DECREF(item);
            if (++count > limit)
                goto done;
        }
    }
done:
    PyMem_Free(buf);
    PyMem_Free(starts);
    PyMem_Free(ends);
    if (table != NULL)
        return failed ? NULL : Py_BuildValue("(nnOO)", added, count, full ? Py_True : Py_False,
                                             over ? Py_True : Py_False);
    return out;
}

static PyMethodDef methods[] = {
    {"analyze", (PyCFunction)analyze, METH_O, analyze_doc},
    {"digest", (PyCFunction)(void (*)(void))digest, METH_FASTCALL, digest_doc},
    {"index", (PyCFunction)(void (*)(void))index_text, METH_FASTCALL, index_doc},
    {"phrases", (PyCFunction)(void (*)(void))phrases, METH_FASTCALL, phrases_doc},
    {"siphash", (PyCFunction)(void (*)(void))siphash, METH_FASTCALL, siphash_doc},
    {"visible", (PyCFunction)(void (*)(void))visible, METH_FASTCALL, visible_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "proctor._provtok",
    "The provenance tokeniser and keyed digests in C (see proctor/provenance.py).", -1, methods,
};

PyMODINIT_FUNC
PyInit__provtok(void)
{
    fill_ascii_class();
    if (PyType_Ready(&DigestsType) < 0)
        return NULL;
    PyObject *module = PyModule_Create(&module_def);
    if (module == NULL)
        return NULL;
    Py_INCREF(&DigestsType);
    if (PyModule_AddObject(module, "Digests", (PyObject *)&DigestsType) < 0) {
        Py_DECREF(&DigestsType);
        Py_DECREF(module);
        return NULL;
    }
    PyObject *all = Py_BuildValue("[sssssss]", "Digests", "analyze", "digest", "index", "phrases", "siphash",
                                  "visible");
    if (all == NULL || PyModule_AddObject(module, "__all__", all) < 0) {
        Py_XDECREF(all);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
