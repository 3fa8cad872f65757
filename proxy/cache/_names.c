/*
 * C twin of proxy.cache.keys.py_name_parts: a partition name, as a request's bytes carry it
 * -> (its columns, its values as the version field's digest reads them), in one pass.
 *
 * Why C: a get_partitions_by_names request assembled from partitions other requests cached
 * brings names this proxy has not read for assembly; in Python each cost ~10 us warm (decode,
 * split, unescape, lower, escape twice to check the name is written as the metastore writes
 * it, a JSON text of the values), ~3.5 us where the planner's memos held its parts: a third
 * of a request of new names (docs/benchmarks.md, issue 16's fifteenth step). Here ~0.1 us.
 *
 * Hive's escaping (FileUtils.escapePathName) writes a control character, 0x7f and each of
 * "#%'*:=?\/{[]^ as %XX in upper-case hex and leaves everything else as it is, so a name the
 * metastore wrote is one whose every '%' starts such an escape of such a character and whose
 * other characters are none of them; column names are lower case. A name ending with a blank
 * is refused as well: the database matches it to the name without (PAD SPACE comparison),
 * so the partition it finds is not certain (keys.certain_partition_name). Names of ASCII
 * only are judged here; a name with any other byte goes to the Python twin, given to
 * configure() (which refuses it too, today: keys.certain_partition_name). The tests hold the
 * two to the same answers.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

static PyObject *fallback;  /* the Python twin; NULL: not configured */

/* Characters escapePathName escapes (all of them ASCII). */
static unsigned char escaped[128];

static int hex_digit(unsigned char c) {  /* as escapePathName writes them: upper case */
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/*
 * One key or value [p, end): its characters unescaped, into ``out`` (NULL: only judged).
 * -1 if it is not as the metastore writes it, else how many characters it unescapes to.
 */
static Py_ssize_t unescape(const unsigned char *p, const unsigned char *end, unsigned char *out) {
    Py_ssize_t n = 0;
    while (p < end) {
        unsigned char c = *p;
        if (c == '%') {
            if (end - p < 3)
                return -1;
            int hi = hex_digit(p[1]), lo = hex_digit(p[2]);
            if (hi < 0 || lo < 0)
                return -1;
            c = (unsigned char)(hi * 16 + lo);
            if (c >= 128 || !escaped[c])  /* (an escape the metastore would not write) */
                return -1;
            p += 3;
        } else {
            if (escaped[c])
                return -1;
            p += 1;
        }
        if (out != NULL)
            out[n] = c;
        n++;
    }
    return n;
}

/* A value's characters into a JSON string's body, as json.dumps(ensure_ascii=False) writes
 * them: only '"', '\' and control characters are escaped. */
static char *json_body(const unsigned char *value, Py_ssize_t n, char *out) {
    static const char hex[] = "0123456789abcdef";
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char c = value[i];
        const char *brief = NULL;
        switch (c) {
        case '"': brief = "\\\""; break;
        case '\\': brief = "\\\\"; break;
        case '\b': brief = "\\b"; break;
        case '\f': brief = "\\f"; break;
        case '\n': brief = "\\n"; break;
        case '\r': brief = "\\r"; break;
        case '\t': brief = "\\t"; break;
        }
        if (brief != NULL) {
            *out++ = brief[0];
            *out++ = brief[1];
        } else if (c < 0x20) {
            memcpy(out, "\\u00", 4);
            out[4] = hex[c >> 4];
            out[5] = hex[c & 15];
            out += 6;
        } else {
            *out++ = (char)c;
        }
    }
    return out;
}

static PyObject *name_parts(PyObject *module, PyObject *raw) {
    if (!PyBytes_Check(raw)) {
        PyErr_SetString(PyExc_TypeError, "name_parts(raw: bytes)");
        return NULL;
    }
    if (fallback == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "name_parts: configure() first");
        return NULL;
    }
    const unsigned char *name = (const unsigned char *)PyBytes_AS_STRING(raw);
    Py_ssize_t size = PyBytes_GET_SIZE(raw);
    for (Py_ssize_t i = 0; i < size; i++)
        if (name[i] >= 128)
            return PyObject_CallOneArg(fallback, raw);
    if (size == 0 || name[size - 1] == ' ')  /* (a trailing blank: not certain) */
        Py_RETURN_NONE;

    /* Columns: the keys as written (an escape in one unescapes to a character that is not
     * a letter, which escapes back the same), at most ``size``; the value in hand,
     * unescaped, at most ``size``; the values' JSON text, '["v", "w"]': each value's body
     * at most twice its length in the name (%XX -> \u00xx), and per part (at least "k=v",
     * so at most (size + 1) / 4 of them) two quotes and a separator: under 4 * size + 6. */
    unsigned char small[512];
    Py_ssize_t need = 6 * size + 6;
    unsigned char *buf = need <= (Py_ssize_t)sizeof(small) ? small : PyMem_Malloc((size_t)need);
    if (buf == NULL)
        return PyErr_NoMemory();
    unsigned char *columns = buf;                   /* at most ``size`` */
    unsigned char *values = buf + size;             /* the unescaped value in hand */
    char *json = (char *)buf + 2 * size, *j = json;  /* the rest */
    Py_ssize_t columns_len = 0;
    PyObject *result = NULL;

    *j++ = '[';
    const unsigned char *p = name, *end = name + size;
    while (1) {
        const unsigned char *part_end = memchr(p, '/', (size_t)(end - p));
        if (part_end == NULL)
            part_end = end;
        const unsigned char *eq = memchr(p, '=', (size_t)(part_end - p));
        if (eq == NULL || eq == p)
            goto not_a_name;
        for (const unsigned char *k = p; k < eq; k++)
            if (*k >= 'A' && *k <= 'Z')  /* (upper case, in the key's escapes' hex too) */
                goto not_a_name;
        if (unescape(p, eq, NULL) < 0)
            goto not_a_name;
        Py_ssize_t value_len = unescape(eq + 1, part_end, values);
        if (value_len <= 0)  /* (an empty value is written __HIVE_DEFAULT_PARTITION__) */
            goto not_a_name;
        if (columns_len > 0)
            columns[columns_len++] = '/';
        memcpy(columns + columns_len, p, (size_t)(eq - p));
        columns_len += eq - p;
        if (j > json + 1) {
            *j++ = ',';
            *j++ = ' ';
        }
        *j++ = '"';
        j = json_body(values, value_len, j);
        *j++ = '"';
        if (part_end == end)
            break;
        p = part_end + 1;
    }
    *j++ = ']';

    PyObject *cols = PyUnicode_DecodeASCII((const char *)columns, columns_len, NULL);
    if (cols != NULL) {
        PyObject *text = PyBytes_FromStringAndSize(json, j - json);
        if (text != NULL) {
            result = PyTuple_Pack(2, cols, text);
            Py_DECREF(text);
        }
        Py_DECREF(cols);
    }
    goto done;
not_a_name:
    result = Py_NewRef(Py_None);
done:
    if (buf != small)
        PyMem_Free(buf);
    return result;
}

static PyObject *configure(PyObject *module, PyObject *twin) {
    if (!PyCallable_Check(twin)) {
        PyErr_SetString(PyExc_TypeError, "configure(py_name_parts)");
        return NULL;
    }
    Py_XSETREF(fallback, Py_NewRef(twin));
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"configure", configure, METH_O,
     "configure($module, twin, /)\n--\n\n"
     "the twin (py_name_parts) that judges names of other bytes than ASCII"},
    {"name_parts", name_parts, METH_O,
     "name_parts($module, raw, /)\n--\n\nsee proxy.cache.keys.py_name_parts"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "proxy.cache._names", NULL, -1, methods,
};

PyMODINIT_FUNC PyInit__names(void) {
    for (int c = 0; c < 0x20; c++)
        escaped[c] = 1;
    for (const char *s = "\"#%'*/:=?\\\x7f{[]^"; *s; s++)
        escaped[(unsigned char)*s] = 1;
    return PyModule_Create(&module);
}
