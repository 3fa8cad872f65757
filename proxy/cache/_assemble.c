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
 * answer() refuses (None) anything it is not sure of, and the caller then takes the way
 * that decides everything in Python.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <structmember.h>

typedef struct {
    PyTypeObject *item_type, *entry_type;
    Py_ssize_t current_under, expires_at, entry, used;  /* Item's slots */
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
    int ok = Py_IS_TYPE(descr, &PyMemberDescr_Type) &&
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
    if (slot_offset(l.item_type, "current_under", &l.current_under) < 0 ||
        slot_offset(l.item_type, "expires_at", &l.expires_at) < 0 ||
        slot_offset(l.item_type, "entry", &l.entry) < 0 ||
        slot_offset(l.item_type, "used", &l.used) < 0 ||
        slot_offset(l.entry_type, "flags", &l.flags) < 0 ||
        slot_offset(l.entry_type, "payload", &l.payload) < 0 ||
        slot_offset(l.entry_type, "expires_at", &l.entry_expires_at) < 0)
        return NULL;
    Py_XDECREF(layout.item_type);
    Py_XDECREF(layout.entry_type);
    Py_INCREF(l.item_type);
    Py_INCREF(l.entry_type);
    layout = l;
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

/*
 * answer(found, names, generation, now, wall, head, prefix, closing, largest, refuse_whole)
 * -> None | (reply | None, whole) | [index of a name not remembered, ...]: see
 * proxy.cache.assembled.py_answer.
 */
static PyObject *answer(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 10 || !PyDict_Check(args[0]) || !PyList_Check(args[1]) ||
        !PyBytes_Check(args[5]) || !PyBytes_Check(args[6]) || !PyBytes_Check(args[7])) {
        PyErr_SetString(PyExc_TypeError,
                        "answer(found, names, generation, now, wall, head, prefix, closing, "
                        "largest, refuse_whole)");
        return NULL;
    }
    if (layout.item_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "configure() first");
        return NULL;
    }
    PyObject *found = args[0], *names = args[1];
    long long generation = PyLong_AsLongLong(args[2]);
    double now = PyFloat_AsDouble(args[3]), wall = PyFloat_AsDouble(args[4]);
    Py_ssize_t largest = PyLong_AsSsize_t(args[8]);
    int refuse_whole = PyObject_IsTrue(args[9]);
    if (PyErr_Occurred() || refuse_whole < 0)
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(names);
    if (n == 0)
        Py_RETURN_NONE;

    PyObject *result = NULL;
    PyObject **items = PyMem_Malloc((size_t)n * sizeof(PyObject *));
    Part *parts = PyMem_Malloc((size_t)n * sizeof(Part));
    Py_buffer *views = PyMem_Calloc((size_t)n, sizeof(Py_buffer));
    Py_ssize_t *missing = PyMem_Malloc((size_t)n * sizeof(Py_ssize_t));
    Py_ssize_t viewed = 0, present = 0, missed = 0;
    if (items == NULL || parts == NULL || views == NULL || missing == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    /* Every item remembered alive, held, judged under this generation, unexpired; the names
     * not remembered (or whose item is gone) listed. No borrowed reference here outlives
     * the pass, and no Python code runs in it (nothing is allocated). */
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *name = PyList_GET_ITEM(names, i);
        if (!PyBytes_CheckExact(name))
            goto refuse;
        PyObject *ref = PyDict_GetItemWithError(found, name);
        if (ref == NULL && PyErr_Occurred())
            goto done;
        PyObject *item = ref != NULL && PyWeakref_CheckRef(ref) ? PyWeakref_GET_OBJECT(ref) : NULL;
        if (item == NULL || !Py_IS_TYPE(item, layout.item_type)) {  /* (None: gone) */
            missing[missed++] = i;
            continue;
        }
        PyObject *entry = SLOT(item, layout.entry);
        if (!int_is(SLOT(item, layout.current_under), generation) ||
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
        items[i] = item;
        if (bits & layout.absent)
            continue;
        Part *part = &parts[present++];
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
    for (Py_ssize_t i = 0; i < n; i++) {  /* used: L1's eviction gives it a second chance */
        PyObject *old = SLOT(items[i], layout.used);
        Py_INCREF(Py_True);
        SLOT(items[i], layout.used) = Py_True;
        Py_XDECREF(old);  /* (a bool: nothing runs) */
    }
    int whole = present == n;
    if (whole && refuse_whole) {
        result = Py_BuildValue("(OO)", Py_None, Py_True);
        goto done;
    }
    Py_ssize_t head_len = PyBytes_GET_SIZE(args[5]), prefix_len = PyBytes_GET_SIZE(args[6]);
    Py_ssize_t closing_len = PyBytes_GET_SIZE(args[7]);
    Py_ssize_t total = head_len + prefix_len + 4 + closing_len;
    for (Py_ssize_t i = 0; i < present; i++)
        total += parts[i].data_len;
    if (total > largest || present > INT32_MAX) {
        result = Py_BuildValue("(OO)", Py_None, whole ? Py_True : Py_False);
        goto done;
    }
    /* In name order, as the metastore sends them (names are distinct: their items are). */
    for (Py_ssize_t i = 1; i < present; i++) {
        if (part_order(&parts[i - 1], &parts[i]) > 0) {
            qsort(parts, (size_t)present, sizeof(Part), part_order);
            break;
        }
    }
    PyObject *reply = PyBytes_FromStringAndSize(NULL, total);
    if (reply == NULL)
        goto done;
    char *out = PyBytes_AS_STRING(reply);
    memcpy(out, PyBytes_AS_STRING(args[5]), (size_t)head_len);
    out += head_len;
    memcpy(out, PyBytes_AS_STRING(args[6]), (size_t)prefix_len);
    out += prefix_len;
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
    memcpy(out, PyBytes_AS_STRING(args[7]), (size_t)closing_len);
    result = Py_BuildValue("(NO)", reply, whole ? Py_True : Py_False);
    goto done;
refuse:
    result = Py_NewRef(Py_None);
done:
    for (Py_ssize_t i = 0; i < viewed; i++)
        PyBuffer_Release(&views[i]);
    PyMem_Free(items);
    PyMem_Free(parts);
    PyMem_Free(views);
    PyMem_Free(missing);
    return result;
}

static PyMethodDef methods[] = {
    {"configure", (PyCFunction)(void (*)(void))configure, METH_FASTCALL,
     "configure(Item, Entry, absent_flag): where their slots are"},
    {"answer", (PyCFunction)(void (*)(void))answer, METH_FASTCALL,
     "answer(found, names, generation, now, wall, head, prefix, closing, largest, "
     "refuse_whole): see proxy.cache.assembled.py_answer"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "proxy.cache._assemble", NULL, -1, methods,
};

PyMODINIT_FUNC PyInit__assemble(void) { return PyModule_Create(&module); }
