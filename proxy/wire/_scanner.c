/*
 * C twin of proxy.wire.binary.PyStructScanner: finds where a binary-protocol struct ends in
 * bytes that arrive in pieces, resuming where it stopped, skipping values without decoding.
 *
 * Why C: the pure-Python scanner needs about 0.3 s for a 12 MB reply of 10,000 partitions,
 * as long as the HMS takes to produce it. This one needs a few milliseconds. The behaviour
 * (positions, errors, limits) is the same; tests run both over the same random messages.
 *
 * Also here, twins of proxy.wire.fields' walks over a list of strings: a request names a
 * hundred partitions, and one Python call per name was a tenth of answering it from cache.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <structmember.h>

enum { TT_STOP = 0, TT_BOOL = 2, TT_BYTE = 3, TT_DOUBLE = 4, TT_I16 = 6, TT_I32 = 8, TT_I64 = 10,
       TT_STRING = 11, TT_STRUCT = 12, TT_MAP = 13, TT_SET = 14, TT_LIST = 15, TT_UUID = 16 };
enum { IN_STRUCT = 0, IN_SEQUENCE = 1, IN_MAP = 2 };

static PyObject *ProtocolError;
static PyObject *LimitExceeded;

typedef struct {
    int kind;
    int64_t remaining;
    int t1, t2;
} Frame;

typedef struct {
    PyObject_HEAD
    Py_ssize_t pos;
    Py_ssize_t limit;
    int max_depth;
    int depth;
    int pending;
    Frame *stack;
} Scanner;

/* Bytes of a fixed-size type, 0 for variable-size, -1 for no such type. */
static int fixed_size(int t) {
    switch (t) {
    case TT_BOOL: case TT_BYTE: return 1;
    case TT_I16: return 2;
    case TT_I32: return 4;
    case TT_DOUBLE: case TT_I64: return 8;
    case TT_UUID: return 16;
    case TT_STRING: case TT_STRUCT: case TT_MAP: case TT_SET: case TT_LIST: return 0;
    default: return -1;
    }
}

static int min_size(int t) {
    switch (t) {
    case TT_STRING: return 4;
    case TT_STRUCT: return 1;
    case TT_MAP: return 6;
    case TT_SET: case TT_LIST: return 5;
    default: return fixed_size(t);
    }
}

static int32_t read_i32(const unsigned char *p) {
    return (int32_t)(((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) |
                     (uint32_t)p[3]);
}

static int Scanner_init(Scanner *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"pos", "limit", "max_depth", NULL};
    Py_ssize_t pos, limit;
    int max_depth = 64;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "nn|i", kwlist, &pos, &limit, &max_depth))
        return -1;
    if (max_depth < 1 || max_depth > 4096) {
        PyErr_SetString(PyExc_ValueError, "max_depth must be between 1 and 4096");
        return -1;
    }
    PyMem_Free(self->stack);
    self->stack = PyMem_Calloc((size_t)max_depth, sizeof(Frame));
    if (self->stack == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    self->pos = pos;
    self->limit = limit;
    self->max_depth = max_depth;
    self->depth = 1;
    self->stack[0].kind = IN_STRUCT;
    self->pending = -1;
    return 0;
}

static void Scanner_dealloc(Scanner *self) {
    PyMem_Free(self->stack);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Push a list/set/map, or skip it whole when its items have a fixed size. 0 ok, -1 error. */
static int open_container(Scanner *self, Py_ssize_t *pos, int64_t size, int t1, int t2,
                          int kind) {
    if (size < 0) {
        PyErr_Format(ProtocolError, "negative container size %lld", (long long)size);
        return -1;
    }
    int m1 = min_size(t1), m2 = kind == IN_MAP ? min_size(t2) : 0;
    if (m1 < 0 || m2 < 0) {
        if (size == 0) return 0; /* Java writes a zero element type for some empty containers */
        PyErr_Format(ProtocolError, "unknown element type %d", m1 < 0 ? t1 : t2);
        return -1;
    }
    if (*pos + size * (int64_t)(m1 + m2) > self->limit) {
        PyErr_Format(LimitExceeded, "container of %lld items cannot fit the message size limit",
                     (long long)size);
        return -1;
    }
    if (size == 0) return 0;
    int w1 = fixed_size(t1), w2 = kind == IN_MAP ? fixed_size(t2) : 1;
    if (w1 > 0 && w2 > 0) {
        *pos += size * (int64_t)(w1 + (kind == IN_MAP ? w2 : 0));
        return 0;
    }
    if (self->depth >= self->max_depth) {
        PyErr_Format(ProtocolError, "containers nested deeper than %d", self->max_depth);
        return -1;
    }
    Frame *f = &self->stack[self->depth++];
    f->kind = kind;
    f->remaining = kind == IN_MAP ? size * 2 : size;
    f->t1 = t1;
    f->t2 = t2;
    return 0;
}

/* The scanning loop; returns 1 done, 0 needs more bytes, -1 error. */
static int run(Scanner *self, const unsigned char *buf, Py_ssize_t end) {
    Py_ssize_t pos = self->pos;
    Py_ssize_t limit = self->limit;
    int pending = self->pending;
    int result = 0;
    if (end < 0) end = 0;
    while (self->depth > 0) {
        if (pending < 0) {
            Frame *f = &self->stack[self->depth - 1];
            if (f->kind == IN_STRUCT) {
                if (pos >= end) goto need_more;
                int ftype = buf[pos];
                if (ftype == TT_STOP) {
                    pos += 1;
                    self->depth--;
                    continue;
                }
                if (pos + 3 > end) goto need_more;
                pos += 3;
                pending = ftype;
            } else {
                if (f->remaining == 0) {
                    self->depth--;
                    continue;
                }
                int64_t remaining = f->remaining--;
                pending = (f->kind == IN_SEQUENCE || remaining % 2 == 0) ? f->t1 : f->t2;
            }
        }
        switch (pending) {
        case TT_STRING: {
            if (pos + 4 > end) goto need_more;
            int32_t size = read_i32(buf + pos);
            if (size < 0) {
                PyErr_Format(ProtocolError, "negative string length %d", (int)size);
                goto error;
            }
            pos += 4 + (Py_ssize_t)size;
            if (pos > limit) {
                PyErr_SetString(LimitExceeded, "string runs past the message size limit");
                goto error;
            }
            break;
        }
        case TT_STRUCT:
            if (self->depth >= self->max_depth) {
                PyErr_Format(ProtocolError, "structs nested deeper than %d", self->max_depth);
                goto error;
            }
            self->stack[self->depth].kind = IN_STRUCT;
            self->stack[self->depth].remaining = 0;
            self->depth++;
            break;
        case TT_LIST:
        case TT_SET: {
            if (pos + 5 > end) goto need_more;
            int etype = buf[pos];
            int32_t size = read_i32(buf + pos + 1);
            pos += 5;
            if (open_container(self, &pos, size, etype, 0, IN_SEQUENCE) < 0) goto error;
            break;
        }
        case TT_MAP: {
            if (pos + 6 > end) goto need_more;
            int ktype = buf[pos], vtype = buf[pos + 1];
            int32_t size = read_i32(buf + pos + 2);
            pos += 6;
            if (open_container(self, &pos, size, ktype, vtype, IN_MAP) < 0) goto error;
            break;
        }
        default: {
            int width = fixed_size(pending);
            if (width <= 0) {
                PyErr_Format(ProtocolError, "unknown field type %d", pending);
                goto error;
            }
            pos += width;
            if (pos > limit) {
                PyErr_SetString(LimitExceeded, "value runs past the message size limit");
                goto error;
            }
        }
        }
        pending = -1;
    }
    result = 1;
    goto out;
need_more:
    result = 0;
    goto out;
error:
    result = -1;
out:
    self->pos = pos;
    self->pending = pending;
    return result;
}

static PyObject *Scanner_scan(Scanner *self, PyObject *args) {
    PyObject *obj;
    Py_ssize_t end;
    if (!PyArg_ParseTuple(args, "On", &obj, &end)) return NULL;
    if (self->depth == 0) Py_RETURN_TRUE;
    Py_buffer view;
    if (PyObject_GetBuffer(obj, &view, PyBUF_SIMPLE) < 0) return NULL;
    if (end > view.len) end = view.len;
    int r = run(self, (const unsigned char *)view.buf, end);
    PyBuffer_Release(&view);
    if (r < 0) return NULL;
    return PyBool_FromLong(r);
}

static PyObject *Scanner_rebase(Scanner *self, PyObject *arg) {
    Py_ssize_t dropped = PyLong_AsSsize_t(arg);
    if (dropped == -1 && PyErr_Occurred()) return NULL;
    self->pos -= dropped;
    self->limit -= dropped;
    Py_RETURN_NONE;
}

static PyObject *Scanner_get_done(Scanner *self, void *closure) {
    return PyBool_FromLong(self->depth == 0);
}

static PyMethodDef Scanner_methods[] = {
    {"scan", (PyCFunction)Scanner_scan, METH_VARARGS,
     "scan($self, buf, end, /)\n--\n\n"
     "advance over buf[:end]; True once the struct is complete."},
    {"rebase", (PyCFunction)Scanner_rebase, METH_O,
     "rebase($self, dropped, /)\n--\n\n"
     "the caller removed this many bytes from the front of its buffer."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef Scanner_members[] = {
    {"pos", T_PYSSIZET, offsetof(Scanner, pos), 0, "offset of the next unread byte"},
    {"limit", T_PYSSIZET, offsetof(Scanner, limit), 0, "offset the struct may not pass"},
    {"max_depth", T_INT, offsetof(Scanner, max_depth), READONLY, "nesting limit"},
    {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef Scanner_getset[] = {
    {"done", (getter)Scanner_get_done, NULL, "whether the struct is complete", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject ScannerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "proxy.wire._scanner.StructScanner",
    .tp_basicsize = sizeof(Scanner),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "StructScanner(pos, limit, max_depth=64)\n--\n\n"
              "C twin of proxy.wire.binary.PyStructScanner.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Scanner_init,
    .tp_dealloc = (destructor)Scanner_dealloc,
    .tp_methods = Scanner_methods,
    .tp_members = Scanner_members,
    .tp_getset = Scanner_getset,
};

/* Walk ``count`` binary strings from ``pos``, none past ``limit``: the end, or -1 (raised).
 * With ``out``, each string is appended to it as bytes. */
static Py_ssize_t walk_strings(const unsigned char *buf, Py_ssize_t pos, Py_ssize_t count,
                               Py_ssize_t limit, PyObject *out) {
    if (count < 0) {
        PyErr_Format(ProtocolError, "negative container size %zd", count);
        return -1;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        if (pos + 4 > limit) {
            PyErr_SetString(ProtocolError, "a string runs past its end");
            return -1;
        }
        int32_t size = read_i32(buf + pos);
        if (size < 0 || pos + 4 + (Py_ssize_t)size > limit) {
            PyErr_SetString(ProtocolError, "a string runs past its end");
            return -1;
        }
        if (out != NULL) {
            PyObject *item = PyBytes_FromStringAndSize((const char *)buf + pos + 4, size);
            if (item == NULL) return -1;
            int failed = PyList_Append(out, item);
            Py_DECREF(item);
            if (failed) return -1;
        }
        pos += 4 + (Py_ssize_t)size;
    }
    return pos;
}

static int limit_of(Py_buffer *view, Py_ssize_t pos, Py_ssize_t limit, Py_ssize_t *out) {
    if (limit > view->len) limit = view->len;
    if (pos < 0 || pos > limit) {
        PyErr_SetString(ProtocolError, "a string list starts past its end");
        return -1;
    }
    *out = limit;
    return 0;
}

static PyObject *skip_strings(PyObject *module, PyObject *args) {
    Py_buffer view;
    Py_ssize_t pos, count, limit;
    if (!PyArg_ParseTuple(args, "y*nnn", &view, &pos, &count, &limit)) return NULL;
    Py_ssize_t end = -1;
    if (limit_of(&view, pos, limit, &limit) == 0)
        end = walk_strings((const unsigned char *)view.buf, pos, count, limit, NULL);
    PyBuffer_Release(&view);
    return end < 0 ? NULL : PyLong_FromSsize_t(end);
}

static PyObject *read_strings(PyObject *module, PyObject *args) {
    Py_buffer view;
    Py_ssize_t pos, count, limit;
    if (!PyArg_ParseTuple(args, "y*nnn", &view, &pos, &count, &limit)) return NULL;
    PyObject *out = NULL;
    if (limit_of(&view, pos, limit, &limit) == 0 && (out = PyList_New(0)) != NULL &&
        walk_strings((const unsigned char *)view.buf, pos, count, limit, out) < 0) {
        Py_CLEAR(out);
    }
    PyBuffer_Release(&view);
    return out;
}

/* ---- The list of strings one field of a request holds --------------------------------------
 * Twin of proxy.wire.fields.py_names_list: a get_partitions_by_names request never answered
 * before is known by its other fields and read for its names, and the Python walk of its
 * fields, its copy and its names were a fifth of such a hit after the metastore's work had
 * emptied the CPU's caches (docs/benchmarks.md, issue 16's fifteenth step). */

/* The end of the struct at ``pos``, none of it past ``end``, scanned as a StructScanner
 * nested at most ``max_depth`` (at most 64) deep would; -1 if it is bad or cut short
 * (nothing is raised here). */
static Py_ssize_t struct_end(const unsigned char *buf, Py_ssize_t pos, Py_ssize_t end,
                             int max_depth) {
    Frame stack[64];
    Scanner scanner;
    scanner.pos = pos;
    scanner.limit = end;
    scanner.max_depth = max_depth;
    scanner.depth = 1;
    scanner.pending = -1;
    scanner.stack = stack;
    stack[0].kind = IN_STRUCT;
    stack[0].remaining = 0;
    int r = run(&scanner, buf, end);
    if (r < 0) PyErr_Clear();
    return r == 1 ? scanner.pos : -1;
}

/* The end of one value of type ``t`` at ``pos``, as fields.skip_value finds it (``depth``
 * its depth there); -1 where it raises (nothing is raised here). */
static Py_ssize_t skip_value(const unsigned char *buf, Py_ssize_t len, Py_ssize_t pos, int t,
                             int depth) {
    if (depth > 64) return -1;
    Py_ssize_t end;
    int width = fixed_size(t);
    if (width > 0) {
        end = pos + width;
    } else if (t == TT_STRING) {
        if (pos + 4 > len) return -1;
        int32_t size = read_i32(buf + pos);
        if (size < 0) return -1;
        end = pos + 4 + (Py_ssize_t)size;
    } else if (t == TT_STRUCT) {
        /* (fields' _skip_struct: a StructScanner nested at most 65 - its depth deep) */
        end = struct_end(buf, pos, len, 65 - (depth + 1) < 1 ? 1 : 65 - (depth + 1));
        if (end < 0) return -1;
    } else if (t == TT_LIST || t == TT_SET || t == TT_MAP) {
        int map = t == TT_MAP, head = map ? 6 : 5;
        if (pos + head > len) return -1;
        int t1 = buf[pos], t2 = map ? buf[pos + 1] : 0;
        int32_t count = read_i32(buf + pos + head - 4);
        if (count < 0) return -1;
        end = pos + head;
        if (!map && t1 == TT_STRING) {
            end = walk_strings(buf, end, count, len, NULL);
            if (end < 0) {
                PyErr_Clear();
                return -1;
            }
        } else {
            for (int32_t i = 0; i < count; i++) {
                end = skip_value(buf, len, end, t1, depth + 1);
                if (end >= 0 && map) end = skip_value(buf, len, end, t2, depth + 1);
                if (end < 0) return -1;
            }
        }
    } else {
        return -1;
    }
    return end > len ? -1 : end;
}

static PyObject *names_list(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyBytes_Check(args[0]) || !PyLong_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "names_list(buf: bytes, fid: int)");
        return NULL;
    }
    long fid = PyLong_AsLong(args[1]);
    if (fid == -1 && PyErr_Occurred()) return NULL;
    const unsigned char *buf = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    Py_ssize_t len = PyBytes_GET_SIZE(args[0]);
    /* fields.only_field: the field there exactly once, the struct whole and alone */
    Py_ssize_t start = -1, end = -1, pos = 0;
    while (1) {
        if (pos >= len) Py_RETURN_NONE;
        int t = buf[pos];
        if (t == TT_STOP) {
            if (pos + 1 != len) Py_RETURN_NONE;
            break;
        }
        Py_ssize_t next = skip_value(buf, len, pos + 3, t, 0);
        if (next < 0) Py_RETURN_NONE;
        if ((int16_t)((buf[pos + 1] << 8) | buf[pos + 2]) == fid) {
            if (start >= 0) Py_RETURN_NONE;
            start = pos;
            end = next;
        }
        pos = next;
    }
    /* a list of strings (a set is skipped by the decoders) */
    if (start < 0 || buf[start] != TT_LIST || buf[start + 3] != TT_STRING) Py_RETURN_NONE;
    PyObject *names = PyList_New(0);
    if (names == NULL) return NULL;
    if (walk_strings(buf, start + 8, read_i32(buf + start + 4), end, names) < 0) {
        Py_DECREF(names);
        return NULL;  /* (not reached: the walk above read them) */
    }
    PyObject *other = PyBytes_FromStringAndSize(NULL, len - (end - start));
    if (other == NULL) {
        Py_DECREF(names);
        return NULL;
    }
    memcpy(PyBytes_AS_STRING(other), buf, (size_t)start);
    memcpy(PyBytes_AS_STRING(other) + start, buf + end, (size_t)(len - end));
    PyObject *result = PyTuple_Pack(2, other, names);
    Py_DECREF(other);
    Py_DECREF(names);
    return result;
}

/* ---- Message headers, whole requests, a call's bytes without its seqid -------------------
 * Twins of proxy.wire.binary.parse_header, proxy.wire.framing.whole_message's test and
 * proxy.wire.framing.call_without_seqid: each request (and each reply a forwarded call
 * relays) went through several Python calls here before the proxy decided anything, and
 * from cold memory those cost more than the decision (docs/benchmarks.md, issue 16). */

#define VERSION_1 0x80010000u
#define VERSION_MASK 0xFFFF0000u
enum { TYPE_MASK = 0xFF, MAX_NAME_LENGTH = 1024, REPEAT_BYTES = 16384, MT_CALL = 1 };

static PyTypeObject *HeaderType; /* proxy.wire.binary.MessageHeader (configure_header) */

typedef struct {
    Py_ssize_t name_start, name_length, length;
    int32_t seqid;
    int type;
    int strict;
} Header;

/* Whether a method name may be ``length`` bytes long (raised if not): binary's
 * _check_name_length, for both forms of header. */
static int plausible_name_length(int32_t length) {
    if (length > 0 && length <= MAX_NAME_LENGTH) return 1;
    PyErr_Format(ProtocolError, "implausible method name length %d", (int)length);
    return 0;
}

/* The header at buf[start:end]: 1 found, 0 more bytes needed, -1 bad (raised). */
static int read_header(const unsigned char *buf, Py_ssize_t start, Py_ssize_t end, Header *h) {
    if (end - start < 4) return 0;
    int32_t first = read_i32(buf + start);
    if (first < 0) {
        if (((uint32_t)first & VERSION_MASK) != VERSION_1) {
            char text[48];
            snprintf(text, sizeof text, "bad protocol version 0x%08x", (unsigned int)first);
            PyErr_SetString(ProtocolError, text);
            return -1;
        }
        if (end < start + 8) return 0;
        int32_t name_length = read_i32(buf + start + 4);
        if (!plausible_name_length(name_length)) return -1;
        Py_ssize_t seq_at = start + 8 + name_length;
        if (end < seq_at + 4) return 0;
        h->name_start = start + 8;
        h->name_length = name_length;
        h->type = (int)((uint32_t)first & TYPE_MASK);
        h->seqid = read_i32(buf + seq_at);
        h->strict = 1;
        h->length = seq_at + 4 - start;
        return 1;
    }
    /* Old clients (TBinaryProtocol with strictWrite off) start with the name's length. */
    if (!plausible_name_length(first)) return -1;
    Py_ssize_t type_at = start + 4 + first;
    if (end < type_at + 5) return 0;
    h->name_start = start + 4;
    h->name_length = first;
    h->type = buf[type_at];
    h->seqid = read_i32(buf + type_at + 1);
    h->strict = 0;
    h->length = type_at + 5 - start;
    return 1;
}

/* A MessageHeader of ``h`` (its name decoded), or NULL (raised). */
static PyObject *header_object(const unsigned char *buf, const Header *h) {
    PyObject *name = PyUnicode_DecodeUTF8((const char *)buf + h->name_start, h->name_length,
                                          "strict");
    if (name == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) return NULL;
        PyErr_Clear();
        PyErr_SetString(ProtocolError, "method name is not UTF-8");
        return NULL;
    }
    PyObject *items[5] = {name, PyLong_FromLong(h->type), PyLong_FromLong(h->seqid),
                          PyBool_FromLong(h->strict), PyLong_FromSsize_t(h->length)};
    PyObject *header = NULL, *values = NULL, *args = NULL;
    if (items[1] != NULL && items[2] != NULL && items[4] != NULL)
        values = PyTuple_Pack(5, items[0], items[1], items[2], items[3], items[4]);
    if (values != NULL) args = PyTuple_Pack(1, values);
    /* tuple.__new__(MessageHeader, values): what the named tuple's own __new__ does, without
     * its Python frame (and whatever a tuple holds beside its items set as tuples set it). */
    if (args != NULL) header = PyTuple_Type.tp_new(HeaderType, args, NULL);
    for (int i = 0; i < 5; i++) Py_XDECREF(items[i]);
    Py_XDECREF(values);
    Py_XDECREF(args);
    return header;
}

static int configured(void) {
    if (HeaderType == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "proxy.wire._scanner: configure_header() first");
        return 0;
    }
    return 1;
}

static int get_buffer(PyObject *obj, Py_buffer *view) {
    return PyObject_GetBuffer(obj, view, PyBUF_SIMPLE);
}

static PyObject *configure_header(PyObject *module, PyObject *type) {
    if (!PyType_Check(type) || !PyType_IsSubtype((PyTypeObject *)type, &PyTuple_Type) ||
        ((PyTypeObject *)type)->tp_basicsize != PyTuple_Type.tp_basicsize) {
        PyErr_SetString(PyExc_TypeError, "configure_header() takes a named tuple class");
        return NULL;
    }
    Py_INCREF(type);
    Py_XSETREF(HeaderType, (PyTypeObject *)type);
    Py_RETURN_NONE;
}

static PyObject *parse_header(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "parse_header(buf, start, end) takes 3 arguments");
        return NULL;
    }
    if (!configured()) return NULL;
    Py_ssize_t start = PyLong_AsSsize_t(args[1]);
    if (start == -1 && PyErr_Occurred()) return NULL;
    Py_ssize_t end = PyLong_AsSsize_t(args[2]);
    if (end == -1 && PyErr_Occurred()) return NULL;
    Py_buffer view;
    if (get_buffer(args[0], &view) < 0) return NULL;
    PyObject *out = NULL;
    Header h;
    if (start < 0 || end > view.len) {
        PyErr_SetString(PyExc_ValueError, "parse_header: start and end must lie in buf");
    } else {
        int found = read_header(view.buf, start, end, &h);
        if (found == 0) out = Py_NewRef(Py_None);
        else if (found > 0) out = header_object(view.buf, &h);
    }
    PyBuffer_Release(&view);
    return out;
}

/* Whether buf[pos:end] is exactly one whole struct (scanned as a StructScanner would,
 * nested at most 64 deep); bad bytes are not one (the exception is cleared). */
static int exactly_one_struct(const unsigned char *buf, Py_ssize_t pos, Py_ssize_t end) {
    return struct_end(buf, pos, end, 64) == end;
}

static PyObject *whole_header(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "whole_header(data, framed, max_size) takes 3 arguments");
        return NULL;
    }
    if (!configured()) return NULL;
    int framed = PyObject_IsTrue(args[1]);
    if (framed < 0) return NULL;
    Py_ssize_t max_size = PyLong_AsSsize_t(args[2]);
    if (max_size == -1 && PyErr_Occurred()) return NULL;
    Py_buffer view;
    if (get_buffer(args[0], &view) < 0) return NULL;
    const unsigned char *buf = view.buf;
    Py_ssize_t start = framed ? 4 : 0, end = view.len;
    PyObject *out = NULL;
    Header h;
    int found = 0;
    if (end - start <= max_size && (!framed || (end >= 4 && read_i32(buf) == end - 4))) {
        found = read_header(buf, start, end, &h);
        if (found < 0) PyErr_Clear();
    }
    if (found > 0 && exactly_one_struct(buf, start + h.length, end)) {
        out = header_object(buf, &h);
        if (out == NULL && PyErr_ExceptionMatches(ProtocolError)) {
            PyErr_Clear(); /* (a name that is not UTF-8: not a message to answer at once) */
            out = Py_NewRef(Py_None);
        }
    } else {
        out = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&view);
    return out;
}

static PyObject *without_seqid(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "without_seqid(data, framed) takes 2 arguments");
        return NULL;
    }
    int framed = PyObject_IsTrue(args[1]);
    if (framed < 0) return NULL;
    Py_buffer view;
    if (get_buffer(args[0], &view) < 0) return NULL;
    const unsigned char *buf = view.buf;
    Py_ssize_t start = framed ? 4 : 0, end = view.len, at = 0;
    int small = !framed || (end >= 4 && read_i32(buf) == end - 4);
    small = small && end - start <= REPEAT_BYTES && end - start >= 12 && buf[start] == 0x80 &&
            buf[start + 1] == 0x01 && buf[start + 3] == MT_CALL;
    if (small) {
        at = start + 8 + (Py_ssize_t)read_i32(buf + start + 4);
        small = start + 8 < at && at <= end - 4;
    }
    PyObject *out = NULL;
    if (!small) {
        out = Py_NewRef(Py_None);
    } else {
        PyObject *rest = PyBytes_FromStringAndSize(NULL, end - start - 4);
        PyObject *seqid = PyLong_FromLong(read_i32(buf + at));
        if (rest != NULL && seqid != NULL) {
            char *to = PyBytes_AS_STRING(rest);
            memcpy(to, buf + start, (size_t)(at - start));
            memcpy(to + (at - start), buf + at + 4, (size_t)(end - at - 4));
            out = PyTuple_Pack(2, rest, seqid);
        }
        Py_XDECREF(rest);
        Py_XDECREF(seqid);
    }
    PyBuffer_Release(&view);
    return out;
}

static PyMethodDef module_functions[] = {
    {"configure_header", configure_header, METH_O,
     "configure_header($module, header_type, /)\n--\n\n"
     "The class (MessageHeader) parse_header and whole_header return."},
    {"parse_header", (PyCFunction)(void (*)(void))parse_header, METH_FASTCALL,
     "parse_header($module, buf, start, end, /)\n--\n\n"
     "-> MessageHeader | None: binary.parse_header's twin."},
    {"whole_header", (PyCFunction)(void (*)(void))whole_header, METH_FASTCALL,
     "whole_header($module, data, framed, max_size, /)\n--\n\n"
     "-> MessageHeader | None: the header of the one whole message data holds, nothing more "
     "(framing.py_whole_header's twin)."},
    {"without_seqid", (PyCFunction)(void (*)(void))without_seqid, METH_FASTCALL,
     "without_seqid($module, data, framed, /)\n--\n\n"
     "-> (bytes, seqid) | None: framing.call_without_seqid's twin."},
    {"skip_strings", skip_strings, METH_VARARGS,
     "skip_strings($module, buf, pos, count, limit, /)\n--\n\n"
     "-> int: the end of count strings from pos."},
    {"read_strings", read_strings, METH_VARARGS,
     "read_strings($module, buf, pos, count, limit, /)\n--\n\n"
     "-> list[bytes]: count strings from pos."},
    {"names_list", (PyCFunction)(void (*)(void))names_list, METH_FASTCALL,
     "names_list($module, buf, fid, /)\n--\n\n"
     "-> (buf without field fid, its strings) | None: fields.py_names_list's twin."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "proxy.wire._scanner", "C struct scanner", -1, module_functions,
};

PyMODINIT_FUNC PyInit__scanner(void) {
    if (PyType_Ready(&ScannerType) < 0) return NULL;
    PyObject *errors = PyImport_ImportModule("proxy.wire.errors");
    if (errors == NULL) return NULL;
    ProtocolError = PyObject_GetAttrString(errors, "ProtocolError");
    LimitExceeded = PyObject_GetAttrString(errors, "LimitExceeded");
    Py_DECREF(errors);
    if (ProtocolError == NULL || LimitExceeded == NULL) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&ScannerType);
    if (PyModule_AddObject(m, "StructScanner", (PyObject *)&ScannerType) < 0) {
        Py_DECREF(&ScannerType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
