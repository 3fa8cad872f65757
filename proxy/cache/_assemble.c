/*
 * C twin of proxy.cache.assembled.py_answer: a get_partitions_by_names reply assembled from
 * partitions held in process, judged and joined in one pass.
 *
 * Why C: a request names a hundred partitions; finding each one's item, judging it (its
 * stamp, two expiry times, another name of the same partition) and joining the reply was
 * ~100 us of Python per request warm and ~140 us after the metastore's work had emptied the
 * CPU's caches, most of an assembled hit (docs/benchmarks.md, issue 16's twelfth step).
 * Here the same work reads each object's slots directly. The behaviour is the Python
 * twin's, which stays as reference and fallback; tests hold the two to the same answers.
 *
 * configure() learns where Item's and Entry's slots are (their member descriptors), once;
 * answer() refuses (None) anything it is not sure of (it is stricter than the twin where
 * the types are not the ones L1 keeps: a stamp that is not an int, say), and the caller then
 * takes the way that decides everything in Python.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <structmember.h>

typedef struct {
    PyTypeObject *item_type, *entry_type;
    Py_ssize_t judged_under, expires_at, entry, used;  /* Item's slots */
    Py_ssize_t flags, payload, entry_expires_at;        /* Entry's */
    long absent;                                        /* Entry.flags bit: not a partition */
} Layout;

static Layout layout;  /* item_type NULL: not configured */

typedef struct {
    const char *name;
    Py_ssize_t name_len;
    const char *data;
    Py_ssize_t data_len;
} Part;

/* The offset of slot ``name`` of ``type`` (a __slots__ member holding an object). */
static int slot_offset(PyTypeObject *type, const char *name, Py_ssize_t *offset) {
    PyObject *descr = PyObject_GetAttrString((PyObject *)type, name);
    if (descr == NULL)
        return -1;
    /* (the type's own: another class's descriptor would give another layout's offset) */
    int ok = Py_IS_TYPE(descr, &PyMemberDescr_Type) &&
             PyDescr_TYPE(descr) == type &&
             ((PyMemberDescrObject *)descr)->d_member->type == T_OBJECT_EX;
    if (ok)
        *offset = ((PyMemberDescrObject *)descr)->d_member->offset;
    Py_DECREF(descr);
    if (!ok) {
        PyErr_Format(PyExc_TypeError, "%s.%s is not a slot", type->tp_name, name);
        return -1;
    }
    return 0;
}

static PyObject *configure(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyType_Check(args[0]) || !PyType_Check(args[1]) || !PyLong_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "configure(Item, Entry, absent_flag)");
        return NULL;
    }
    Layout l;
    l.item_type = (PyTypeObject *)args[0];
    l.entry_type = (PyTypeObject *)args[1];
    l.absent = PyLong_AsLong(args[2]);
    if (l.absent == -1 && PyErr_Occurred())
        return NULL;
    if (slot_offset(l.item_type, "judged_under", &l.judged_under) < 0 ||
        slot_offset(l.item_type, "expires_at", &l.expires_at) < 0 ||
        slot_offset(l.item_type, "entry", &l.entry) < 0 ||
        slot_offset(l.item_type, "used", &l.used) < 0 ||
        slot_offset(l.entry_type, "flags", &l.flags) < 0 ||
        slot_offset(l.entry_type, "payload", &l.payload) < 0 ||
        slot_offset(l.entry_type, "expires_at", &l.entry_expires_at) < 0)
        return NULL;
    Py_INCREF(l.item_type);
    Py_INCREF(l.entry_type);
    Layout old = layout;
    layout = l;
    Py_XDECREF(old.item_type);
    Py_XDECREF(old.entry_type);
    Py_RETURN_NONE;
}

#define SLOT(obj, offset) (*(PyObject **)((char *)(obj) + (offset)))

/* A float slot's value; NAN (never later than anything) for anything else. */
static double seconds(PyObject *value) {
    if (value != NULL && PyFloat_CheckExact(value))
        return PyFloat_AS_DOUBLE(value);
    if (value != NULL && PyLong_CheckExact(value)) {
        double d = PyLong_AsDouble(value);
        if (d == -1.0 && PyErr_Occurred()) {
            PyErr_Clear();
            return NAN;
        }
        return d;
    }
    return NAN;
}

/* Whether ``value`` is the int ``wanted``. */
static int int_is(PyObject *value, long long wanted) {
    if (value == NULL || !PyLong_CheckExact(value))
        return 0;
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (v == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    return !overflow && v == wanted;
}

static int part_order(const void *a, const void *b) {
    const Part *x = a, *y = b;
    Py_ssize_t n = x->name_len < y->name_len ? x->name_len : y->name_len;
    int c = memcmp(x->name, y->name, (size_t)n);
    if (c != 0)
        return c;
    return (x->name_len > y->name_len) - (x->name_len < y->name_len);
}

/* Whether ``items`` (n pointers) holds one twice: an open-addressed set of 2n+ slots. */
static int has_twice(PyObject **items, Py_ssize_t n, int *failed) {
    size_t size = 8;
    while (size < (size_t)n * 2)
        size <<= 1;
    PyObject **seen = PyMem_Calloc(size, sizeof(PyObject *));
    if (seen == NULL) {
        *failed = 1;
        return 0;
    }
    int twice = 0;
    for (Py_ssize_t i = 0; i < n && !twice; i++) {
        size_t h = ((uintptr_t)items[i] >> 4) & (size - 1);
        while (seen[h] != NULL && seen[h] != items[i])
            h = (h + 1) & (size - 1);
        twice = seen[h] == items[i];
        seen[h] = items[i];
    }
    PyMem_Free(seen);
    return twice;
}

/* ``ref``'s object, a new reference (NULL: gone, or not a weak reference). */
static PyObject *alive(PyObject *ref) {
    if (ref == NULL || !PyWeakref_CheckRef(ref))
        return NULL;
#if PY_VERSION_HEX >= 0x030D0000
    PyObject *obj = NULL;
    if (PyWeakref_GetRef(ref, &obj) < 0) {
        PyErr_Clear();
        return NULL;
    }
    return obj;
#else
    PyObject *obj = PyWeakref_GET_OBJECT(ref);
    if (obj == Py_None)
        return NULL;
    Py_INCREF(obj);
    return obj;
#endif
}

/*
 * answer(found, names, mark, now, wall, head, before, closing, largest)
 * -> None | (reply | None, whole) | [index of a name not remembered, ...]: see
 * proxy.cache.assembled.py_answer.
 *
 * Every item and payload used is held by a strong reference until the end, so nothing the
 * pass reads can go, whatever runs meanwhile (a collection, a finalizer).
 */
static PyObject *answer(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 9 || !PyDict_Check(args[0]) || !PyList_Check(args[1]) ||
        !PyLong_Check(args[2]) || !PyFloat_Check(args[3]) || !PyFloat_Check(args[4]) ||
        !PyBytes_Check(args[5]) || !PyBytes_Check(args[6]) || !PyBytes_Check(args[7]) ||
        !PyLong_Check(args[8])) {
        PyErr_SetString(PyExc_TypeError,
                        "answer(found: dict, names: list, mark: int, now: float, "
                        "wall: float, head: bytes, before: bytes, closing: bytes, largest: int)");
        return NULL;
    }
    if (layout.item_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "configure() first");
        return NULL;
    }
    PyObject *found = args[0], *names = args[1];
    int overflow = 0;
    long long mark = PyLong_AsLongLongAndOverflow(args[2], &overflow);
    if (mark == -1 && PyErr_Occurred())
        return NULL;
    if (overflow)
        Py_RETURN_NONE;  /* (no stamp is one: marks are counts) */
    double now = PyFloat_AS_DOUBLE(args[3]), wall = PyFloat_AS_DOUBLE(args[4]);
    Py_ssize_t largest = PyLong_AsLongAndOverflow(args[8], &overflow);
    if (largest == -1 && PyErr_Occurred())
        return NULL;
    if (overflow)
        largest = overflow > 0 ? PY_SSIZE_T_MAX : -1;
    if (largest < 0)
        largest = -1;  /* (no reply fits; and largest - total cannot overflow below) */
    Py_ssize_t n = PyList_GET_SIZE(names);
    if (n == 0)
        Py_RETURN_NONE;

    PyObject *result = NULL, *reply = NULL;
    PyObject **items = PyMem_Calloc((size_t)n, sizeof(PyObject *));  /* strong references */
    PyObject **held = PyMem_Calloc((size_t)n, sizeof(PyObject *));   /* payloads, strong */
    Part *parts = PyMem_Malloc((size_t)n * sizeof(Part));
    Py_buffer *views = PyMem_Calloc((size_t)n, sizeof(Py_buffer));
    Py_ssize_t *missing = PyMem_Malloc((size_t)n * sizeof(Py_ssize_t));
    Py_ssize_t viewed = 0, present = 0, missed = 0;
    if (items == NULL || held == NULL || parts == NULL || views == NULL || missing == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    /* Every item remembered alive, held, judged at this mark, unexpired; the names
     * not remembered (or whose item is gone) listed. */
    Py_ssize_t total = PyBytes_GET_SIZE(args[5]) + PyBytes_GET_SIZE(args[6]) + 4 +
                       PyBytes_GET_SIZE(args[7]);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *name = PyList_GET_ITEM(names, i);
        if (!PyBytes_CheckExact(name))
            goto refuse;
        PyObject *ref = PyDict_GetItemWithError(found, name);
        if (ref == NULL && PyErr_Occurred())
            goto done;
        PyObject *item = alive(ref);
        if (item == NULL || !Py_IS_TYPE(item, layout.item_type)) {  /* gone, or not an item */
            Py_XDECREF(item);
            missing[missed++] = i;
            continue;
        }
        items[i] = item;
        PyObject *entry = SLOT(item, layout.entry);
        if (!int_is(SLOT(item, layout.judged_under), mark) ||
            !(seconds(SLOT(item, layout.expires_at)) > now) || entry == NULL ||
            !Py_IS_TYPE(entry, layout.entry_type) ||
            !(seconds(SLOT(entry, layout.entry_expires_at)) > wall))
            goto refuse;
        PyObject *flags = SLOT(entry, layout.flags), *payload = SLOT(entry, layout.payload);
        if (flags == NULL || !PyLong_CheckExact(flags) || payload == NULL)
            goto refuse;
        long bits = PyLong_AsLong(flags);
        if (bits == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            goto refuse;
        }
        if (bits & layout.absent || missed > 0)
            continue;  /* (with a name missing, no reply is made this time) */
        Part *part = &parts[present];
        part->name = PyBytes_AS_STRING(name);
        part->name_len = PyBytes_GET_SIZE(name);
        if (PyBytes_CheckExact(payload)) {
            part->data = PyBytes_AS_STRING(payload);
            part->data_len = PyBytes_GET_SIZE(payload);
        } else {
            if (PyObject_GetBuffer(payload, &views[viewed], PyBUF_SIMPLE) < 0) {
                PyErr_Clear();
                goto refuse;
            }
            part->data = views[viewed].buf;
            part->data_len = views[viewed].len;
            viewed++;
        }
        Py_INCREF(payload);
        held[present++] = payload;
        /* (the size checked as it grows: never past largest, so never overflowing) */
        total = part->data_len > largest - total ? largest + 1 : total + part->data_len;
    }
    if (missed > 0) {
        result = PyList_New(missed);
        for (Py_ssize_t i = 0; result != NULL && i < missed; i++) {
            PyObject *at = PyLong_FromSsize_t(missing[i]);
            if (at == NULL)
                Py_CLEAR(result);
            else
                PyList_SET_ITEM(result, i, at);
        }
        goto done;
    }
    int failed = 0, twice = has_twice(items, n, &failed);
    if (failed) {
        PyErr_NoMemory();
        goto done;
    }
    if (twice)
        goto refuse;  /* two names of one partition: the Python way decides */
    int whole = present == n;
    if (total <= largest && present <= INT32_MAX) {
        /* In name order, as the metastore sends them (names are distinct: their items are). */
        for (Py_ssize_t i = 1; i < present; i++) {
            if (part_order(&parts[i - 1], &parts[i]) > 0) {
                qsort(parts, (size_t)present, sizeof(Part), part_order);
                break;
            }
        }
        reply = PyBytes_FromStringAndSize(NULL, total);
        if (reply == NULL)
            goto done;
        char *out = PyBytes_AS_STRING(reply);
        memcpy(out, PyBytes_AS_STRING(args[5]), (size_t)PyBytes_GET_SIZE(args[5]));
        out += PyBytes_GET_SIZE(args[5]);
        memcpy(out, PyBytes_AS_STRING(args[6]), (size_t)PyBytes_GET_SIZE(args[6]));
        out += PyBytes_GET_SIZE(args[6]);
        uint32_t count = (uint32_t)present;
        out[0] = (char)(count >> 24);
        out[1] = (char)(count >> 16);
        out[2] = (char)(count >> 8);
        out[3] = (char)count;
        out += 4;
        for (Py_ssize_t i = 0; i < present; i++) {
            memcpy(out, parts[i].data, (size_t)parts[i].data_len);
            out += parts[i].data_len;
        }
        memcpy(out, PyBytes_AS_STRING(args[7]), (size_t)PyBytes_GET_SIZE(args[7]));
    }
    /* Used: L1's eviction gives them a second chance. Last, once nothing is read any more
     * (an old value's release may run code). */
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *old = SLOT(items[i], layout.used);
        if (old == Py_True)
            continue;
        Py_INCREF(Py_True);
        SLOT(items[i], layout.used) = Py_True;
        Py_XDECREF(old);
    }
    result = PyTuple_Pack(2, reply != NULL ? reply : Py_None, whole ? Py_True : Py_False);
    goto done;
refuse:
    result = Py_NewRef(Py_None);
done:
    Py_XDECREF(reply);
    for (Py_ssize_t i = 0; i < viewed; i++)
        PyBuffer_Release(&views[i]);
    for (Py_ssize_t i = 0; held != NULL && i < present; i++)
        Py_DECREF(held[i]);
    for (Py_ssize_t i = 0; items != NULL && i < n; i++)
        Py_XDECREF(items[i]);
    PyMem_Free(items);
    PyMem_Free(held);
    PyMem_Free(parts);
    PyMem_Free(views);
    PyMem_Free(missing);
    return result;
}

static PyMethodDef methods[] = {
    {"configure", (PyCFunction)(void (*)(void))configure, METH_FASTCALL,
     "configure($module, item_type, entry_type, absent_flag, /)\n--\n\n"
     "where the slots of Item and Entry are"},
    {"answer", (PyCFunction)(void (*)(void))answer, METH_FASTCALL,
     "answer($module, found, names, mark, now, wall, head, before, closing, largest, /)"
     "\n--\n\nsee proxy.cache.assembled.py_answer"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "proxy.cache._assemble", NULL, -1, methods,
};

PyMODINIT_FUNC PyInit__assemble(void) { return PyModule_Create(&module); }
