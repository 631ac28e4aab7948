/*
 * The runtime's keyed normal tables, compiled.
 *
 * Why C: every verify step the synthetic runtime fills two `[rows, vocab]` tables of keyed
 * normals per block position (the target's base logits and the drafter's noise), about
 * half a million values a step at 256 requests. Each value is three splitmix64 rounds and
 * an Irwin-Hall sum, which numpy does as some twenty whole-table passes, each reading and
 * writing the table; here it is one pass that keeps every value in registers, and the
 * runtime spends most of its step in the tables otherwise. `hashing.py` keeps the numpy
 * form as the fallback where this did not build, and owns every other draw.
 *
 *   normal_table(keys, width, tag)
 *                 a new float64 array `[len(keys), width]`, row r column v holding
 *                 `normal(keys[r], v, tag)`: the hash chain of the three keys, then
 *                 `gaussian` of it.
 *
 * Arithmetic is the numpy form's, bit for bit: the integer steps are exact, and the one
 * float step, `(bits as a double - offset) * scale`, is two IEEE operations in the same
 * order (no fused multiply-add can form from them). `tests/test_runtime_hashing.py` holds
 * the two forms equal.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

#include <stdint.h>
#include <string.h>

/* splitmix64's constants, as in hashing.py */
#define GOLDEN 0x9E3779B97F4A7C15ULL
#define M1 0xBF58476D1CE4E5B9ULL
#define M2 0x94D049BB133111EBULL
/* gaussian's: two 16-bit fields a 32-bit lane, and the double 2**52 + n from n < 2**52 */
#define LANES16 0x0000FFFF0000FFFFULL
#define LOW32 0xFFFFFFFFULL
#define EXPONENT_2_52 0x4330000000000000ULL
/* 2**52 plus the Irwin-Hall mean (4 x 2**15), and sqrt(3) / 2**16 */
static const double NORMAL_OFFSET = 4503599627370496.0 + 131072.0;
static const double NORMAL_SCALE = 1.7320508075688772 / 65536.0;

static inline uint64_t
splitmix(uint64_t x)
{
    x += GOLDEN;
    x = (x ^ (x >> 30)) * M1;
    x = (x ^ (x >> 27)) * M2;
    return x ^ (x >> 31);
}

static inline double
gaussian(uint64_t h)
{
    uint64_t pairs = (h & LANES16) + ((h >> 16) & LANES16);
    uint64_t sum = (pairs & LOW32) + (pairs >> 32);
    uint64_t bits = sum | EXPONENT_2_52;
    double value;
    memcpy(&value, &bits, sizeof value);
    return (value - NORMAL_OFFSET) * NORMAL_SCALE;
}

static PyObject *
normal_table(PyObject *self, PyObject *args)
{
    PyObject *obj, *tag_obj;
    Py_ssize_t width;
    if (!PyArg_ParseTuple(args, "OnO", &obj, &width, &tag_obj))
        return NULL;
    if (!PyArray_Check(obj) || PyArray_TYPE((PyArrayObject *)obj) != NPY_UINT64
        || PyArray_NDIM((PyArrayObject *)obj) != 1
        || !PyArray_IS_C_CONTIGUOUS((PyArrayObject *)obj)) {
        PyErr_SetString(PyExc_ValueError, "keys: expected a contiguous 1-D uint64 array");
        return NULL;
    }
    if (width < 0) {
        PyErr_SetString(PyExc_ValueError, "width must be >= 0");
        return NULL;
    }
    uint64_t tag = PyLong_AsUnsignedLongLong(tag_obj);
    if (tag == (uint64_t)-1 && PyErr_Occurred())
        return NULL;
    PyArrayObject *keys = (PyArrayObject *)obj;
    npy_intp rows = PyArray_DIM(keys, 0);
    npy_intp dims[2] = {rows, width};
    PyArrayObject *out = (PyArrayObject *)PyArray_SimpleNew(2, dims, NPY_FLOAT64);
    if (out == NULL)
        return NULL;
    const uint64_t *key = (const uint64_t *)PyArray_DATA(keys);
    double *value = (double *)PyArray_DATA(out);
    Py_BEGIN_ALLOW_THREADS
    for (npy_intp r = 0; r < rows; r++) {
        uint64_t prefix = splitmix(key[r]);
        double *row = value + r * width;
        for (npy_intp v = 0; v < width; v++)
            row[v] = gaussian(splitmix(splitmix(prefix ^ (uint64_t)v) ^ tag));
    }
    Py_END_ALLOW_THREADS
    return (PyObject *)out;
}

static PyMethodDef methods[] = {
    {"normal_table", normal_table, METH_VARARGS,
     "normal_table(keys, width, tag): keyed normals [len(keys), width], as hashing.normal."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_hashing", "The runtime's keyed normal tables, compiled.", -1,
    methods,
};

PyMODINIT_FUNC
PyInit__hashing(void)
{
    import_array();
    return PyModule_Create(&module);
}
