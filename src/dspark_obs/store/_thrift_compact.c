/*
 * Parquet's metadata (Thrift's compact protocol) read into `{field id: value}` dicts,
 * compiled: the twin of `part_bounds._Thrift.struct`.
 *
 * Why C: every part a reader opens has its footer and every page header read before
 * polars decodes a byte of it (`part_bounds.py`), about forty structs a part. In Python
 * that is a few hundred function calls a struct, most of what checking a large run's
 * parts cost; here it is one pass over the bytes. Both forms give the same dicts, the
 * same error messages and the same bounds (tests/test_hostile_parquet.py feeds both the
 * same bytes, honest and mutated).
 *
 * read_struct(data, pos) -> (dict, end): the struct starting at byte `pos` of `data` (any
 * bytes-like object) and the position just past it. ValueError, with part_bounds'
 * message, for bytes that are no struct: a read past the end, a varint over 64 bits or
 * 10 bytes, a string, list or map longer than the bytes left, a field id outside i16,
 * nesting past MAX_NESTING, an unknown type.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>

#define MAX_NESTING 16

typedef struct {
    const unsigned char *data;
    Py_ssize_t len;
    Py_ssize_t pos;
} Reader;

static PyObject *read_struct_at(Reader *r, int depth);

static int fail(const char *message) {
    PyErr_SetString(PyExc_ValueError, message);
    return -1;
}

static int read_byte(Reader *r, unsigned int *out) {
    if (r->pos < 0 || r->pos >= r->len) return fail("metadata ends early");
    *out = r->data[r->pos++];
    return 0;
}

/* A ULEB128 varint of at most 64 bits (and 10 bytes). */
static int read_varint(Reader *r, uint64_t *out) {
    uint64_t value = 0;
    int shift = 0;
    for (;;) {
        unsigned int b;
        if (read_byte(r, &b) < 0) return -1;
        uint64_t bits = b & 0x7F;
        if (shift == 63 && bits > 1) return fail("varint too long");
        value |= bits << shift;
        if (!(b & 0x80)) {
            *out = value;
            return 0;
        }
        shift += 7;
        if (shift > 63) return fail("varint too long");
    }
}

static int read_zigzag(Reader *r, int64_t *out) {
    uint64_t n;
    if (read_varint(r, &n) < 0) return -1;
    *out = (int64_t)(n >> 1) ^ -(int64_t)(n & 1);
    return 0;
}

/* Room for `n` more elements of at least one byte each (false past the end). */
static int fits(const Reader *r, uint64_t n) {
    return r->pos <= r->len && n <= (uint64_t)(r->len - r->pos);
}

static PyObject *read_value(Reader *r, unsigned int kind, int depth) {
    if (kind >= 4 && kind <= 6) {
        int64_t v;
        if (read_zigzag(r, &v) < 0) return NULL;
        return PyLong_FromLongLong(v);
    }
    if (kind == 1 || kind == 2) return PyBool_FromLong(kind == 1);
    if (kind == 3) {
        unsigned int b;
        if (read_byte(r, &b) < 0) return NULL;
        return PyLong_FromLong(b);
    }
    if (kind == 7) {
        r->pos += 8;
        Py_RETURN_NONE;
    }
    if (kind == 8) {
        uint64_t n;
        if (read_varint(r, &n) < 0) return NULL;
        if (!fits(r, n)) {
            fail("string longer than the metadata");
            return NULL;
        }
        PyObject *out = PyBytes_FromStringAndSize((const char *)r->data + r->pos, (Py_ssize_t)n);
        r->pos += (Py_ssize_t)n;
        return out;
    }
    if (kind == 9 || kind == 10 || kind == 11) {
        if (depth > MAX_NESTING) {
            fail("metadata nested too deeply");
            return NULL;
        }
    }
    if (kind == 9 || kind == 10) {
        unsigned int head;
        if (read_byte(r, &head) < 0) return NULL;
        uint64_t n = head >> 4;
        unsigned int inner = head & 0x0F;
        if (n == 15 && read_varint(r, &n) < 0) return NULL;
        if (!fits(r, n)) {
            fail("list longer than the metadata");
            return NULL;
        }
        PyObject *list = PyList_New((Py_ssize_t)n);
        if (list == NULL) return NULL;
        for (Py_ssize_t i = 0; i < (Py_ssize_t)n; i++) {
            PyObject *item = read_value(r, inner, depth + 1);
            if (item == NULL) {
                Py_DECREF(list);
                return NULL;
            }
            PyList_SET_ITEM(list, i, item);
        }
        return list;
    }
    if (kind == 11) {
        uint64_t n;
        unsigned int types = 0;
        if (read_varint(r, &n) < 0) return NULL;
        if (!fits(r, n)) {
            fail("map longer than the metadata");
            return NULL;
        }
        if (n && read_byte(r, &types) < 0) return NULL;
        PyObject *list = PyList_New((Py_ssize_t)n);
        if (list == NULL) return NULL;
        for (Py_ssize_t i = 0; i < (Py_ssize_t)n; i++) {
            PyObject *k = read_value(r, types >> 4, depth + 1);
            PyObject *v = k == NULL ? NULL : read_value(r, types & 0x0F, depth + 1);
            PyObject *pair = v == NULL ? NULL : PyTuple_Pack(2, k, v);
            Py_XDECREF(k);
            Py_XDECREF(v);
            if (pair == NULL) {
                Py_DECREF(list);
                return NULL;
            }
            PyList_SET_ITEM(list, i, pair);
        }
        return list;
    }
    if (kind == 12) return read_struct_at(r, depth + 1);
    PyErr_Format(PyExc_ValueError, "unknown field type %u", kind);
    return NULL;
}

static PyObject *read_struct_at(Reader *r, int depth) {
    if (depth > MAX_NESTING) {
        fail("metadata nested too deeply");
        return NULL;
    }
    PyObject *out = PyDict_New();
    if (out == NULL) return NULL;
    int64_t last = 0;
    for (;;) {
        unsigned int head;
        if (read_byte(r, &head) < 0) goto error;
        unsigned int kind = head & 0x0F;
        if (kind == 0) return out;
        unsigned int delta = head >> 4;
        if (delta) {
            last += delta;
        } else if (read_zigzag(r, &last) < 0) {
            goto error;
        }
        if (last < -32768 || last > 32767) {
            fail("field id out of range");
            goto error;
        }
        PyObject *value = read_value(r, kind, depth);
        if (value == NULL) goto error;
        PyObject *key = PyLong_FromLongLong(last);
        int rc = key == NULL ? -1 : PyDict_SetItem(out, key, value);
        Py_XDECREF(key);
        Py_DECREF(value);
        if (rc < 0) goto error;
    }
error:
    Py_DECREF(out);
    return NULL;
}

static PyObject *read_struct(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t pos;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*n", &view, &pos)) return NULL;
    Reader r = {(const unsigned char *)view.buf, view.len, pos};
    PyObject *out = read_struct_at(&r, 0);
    PyBuffer_Release(&view);
    if (out == NULL) return NULL;
    return Py_BuildValue("(Nn)", out, r.pos);
}

static PyMethodDef methods[] = {
    {"read_struct", read_struct, METH_VARARGS,
     "read_struct(data, pos) -> (dict, end): the Thrift compact struct at data[pos:]."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_thrift_compact",
    "Parquet metadata (Thrift compact protocol) read into dicts; see part_bounds.py.", -1,
    methods,
};

PyMODINIT_FUNC PyInit__thrift_compact(void) { return PyModule_Create(&module); }
