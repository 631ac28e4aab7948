/*
 * The live aggregates' request-row fold, compiled.
 *
 * Why C: every request row of every step lands in a few histogram cells (six token
 * histograms; two calibration histograms per block position). In numpy that is about
 * fifteen whole-array passes per fold (labels, clipping, bin numbers, three
 * bincounts, the adds), ~10 ns per position; as one loop it is one read of the row
 * and one add per cell. `tokens.py` and `confidence.py` keep the numpy forms, used
 * where this did not build; both forms write the same cells (tests/test_rowfold.py).
 *
 * Both functions add into the windowed sums' current block (`window.py`), a C-ordered
 * array the caller owns, in place. The rows come from validated batches, yet every
 * cell index is still checked against the block, so a wrong argument raises
 * ValueError instead of writing outside it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

/* The calibration histograms' bins, as confidence.py lays them out (a constant divisor
 * is a multiply, a variable one a division; tests/test_rowfold.py checks both files
 * agree). */
#define ECE_BINS 15
#define FINE_PER_ECE_BIN 68
#define FINE_BINS (ECE_BINS * FINE_PER_ECE_BIN)

/* The token histograms, in the column order of tokens.HISTOGRAMS. */
enum { H_WINDOW, H_ACCEPTED, H_COMMITTED, H_CEILING_OBSERVED, H_CEILING_SHADOW,
       H_ACCEPTED_KNOWN, N_HISTOGRAMS };

/* A C-contiguous buffer of 8-byte items of one kind: 'i' (int64) or 'd' (double). */
static int
get_buffer(PyObject *obj, Py_buffer *view, char kind, int writable, const char *name)
{
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    int ok = PyObject_GetBuffer(obj, view, flags) == 0;
    if (ok) {
        const char *f = view->format;
        if (f && (*f == '<' || *f == '=' || *f == '@'))
            f++;
        ok = view->itemsize == 8 && f && f[1] == '\0'
             && (kind == 'd' ? *f == 'd' : (*f == 'q' || *f == 'l'));
        if (!ok)
            PyBuffer_Release(view);
    }
    if (!ok) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s: expected a C-ordered%s %s array", name,
                     writable ? " writable" : "", kind == 'd' ? "float64" : "int64");
        return -1;
    }
    return 0;
}

/* Acquire `n` buffers; on failure release those already held. */
static int
get_buffers(PyObject **obj, Py_buffer *views, const char *kinds, const char *writable,
            const char *const *names, int n)
{
    for (int i = 0; i < n; i++) {
        if (get_buffer(obj[i], &views[i], kinds[i], writable[i] == 'w', names[i]) < 0) {
            while (i--)
                PyBuffer_Release(&views[i]);
            return -1;
        }
    }
    return 0;
}

static void
release(Py_buffer *views, int n)
{
    for (int i = 0; i < n; i++)
        PyBuffer_Release(&views[i]);
}

static Py_ssize_t
items(const Py_buffer *v)
{
    return v->len / 8;
}

/* A row outside the ranges validation guarantees: the rows before it are added. */
static PyObject *
out_of_range(const char *what)
{
    PyErr_Format(PyExc_ValueError, "%s: a row outside its validated range", what);
    return NULL;
}

/* tokens(block, width, starts, group, window, accepted, committed, ceiling, shadow)
 *
 * block: int64 [groups, width]; starts: the first column of each histogram (a tuple of
 * N_HISTOGRAMS ints); the six row columns int64 [n]. Every row counts its window,
 * accepted and committed; a row with an observed ceiling (>= 0) counts it, else one
 * with a shadow ceiling counts that; either way it counts its accepted among the rows
 * whose ceiling is known. */
static PyObject *
tokens(PyObject *self, PyObject *args)
{
    PyObject *obj[7], *starts_obj;
    Py_ssize_t width;
    if (!PyArg_ParseTuple(args, "OnOOOOOOO", &obj[0], &width, &starts_obj, &obj[1], &obj[2],
                          &obj[3], &obj[4], &obj[5], &obj[6]))
        return NULL;
    int64_t start[N_HISTOGRAMS];
    PyObject *seq = PySequence_Fast(starts_obj, "starts must be a sequence");
    if (seq == NULL)
        return NULL;
    if (PySequence_Fast_GET_SIZE(seq) != N_HISTOGRAMS) {
        Py_DECREF(seq);
        PyErr_SetString(PyExc_ValueError, "starts: one column per token histogram");
        return NULL;
    }
    for (int h = 0; h < N_HISTOGRAMS; h++)
        start[h] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, h));
    Py_DECREF(seq);
    if (PyErr_Occurred())
        return NULL;

    static const char *const names[] = {"block", "group", "window", "accepted",
                                        "committed", "ceiling", "shadow"};
    Py_buffer v[7];
    if (get_buffers(obj, v, "iiiiiii", "wrrrrrr", names, 7) < 0)
        return NULL;
    Py_ssize_t n = items(&v[1]);
    for (int i = 2; i < 7; i++) {
        if (items(&v[i]) != n) {
            release(v, 7);
            PyErr_SetString(PyExc_ValueError, "tokens: row columns differ in length");
            return NULL;
        }
    }
    int64_t *block = v[0].buf;
    const int64_t *group = v[1].buf, *window = v[2].buf, *accepted = v[3].buf,
                  *committed = v[4].buf, *ceiling = v[5].buf, *shadow = v[6].buf;
    const int64_t groups = width > 0 ? items(&v[0]) / width : 0;
    if (width < 1 || groups * width != items(&v[0])) {
        release(v, 7);
        PyErr_SetString(PyExc_ValueError, "tokens: the block is not rows of `width` cells");
        return NULL;
    }
    int bad = 0;
    for (Py_ssize_t i = 0; i < n && !bad; i++) {
        if (group[i] < 0 || group[i] >= groups) {
            bad = 1;
            break;
        }
        int64_t *row = block + group[i] * width;
        int64_t cols[N_HISTOGRAMS];
        int k = 0;
        cols[k++] = start[H_WINDOW] + window[i];
        cols[k++] = start[H_ACCEPTED] + accepted[i];
        cols[k++] = start[H_COMMITTED] + committed[i];
        if (ceiling[i] >= 0)
            cols[k++] = start[H_CEILING_OBSERVED] + ceiling[i];
        else if (shadow[i] >= 0)
            cols[k++] = start[H_CEILING_SHADOW] + shadow[i];
        if (k > 3)
            cols[k++] = start[H_ACCEPTED_KNOWN] + accepted[i];
        for (int c = 0; c < k; c++)
            bad |= cols[c] < 0 || cols[c] >= width;
        if (!bad)
            for (int c = 0; c < k; c++)
                row[cols[c]]++;
    }
    release(v, 7);
    if (bad)
        return out_of_range("tokens");
    Py_RETURN_NONE;
}

/* confidence(fine, coarse, gamma, eps, group, survival, accepted, window, ceiling)
 *
 * The label rule of calibration.prefix_labels, as confidence.py applies it: position j
 * of a row is labelled j < reach, reach being the ceiling where known (>= 0) and the
 * accepted count otherwise; a row without a known ceiling whose whole window was
 * accepted reveals only its first `accepted` positions. A kept position's prediction
 * p (clipped to [eps, 1 - eps]) adds one to its fine bin, and to its ECE bin one, p,
 * and p * p to the position's squared sum.
 *
 * fine: int64 [groups, gamma * 2 * FINE_BINS]; coarse: float64
 * [groups, gamma * (4 * ECE_BINS + 1)], the layouts of ConfidenceAggregate. */
static PyObject *
confidence(PyObject *self, PyObject *args)
{
    PyObject *obj[7];
    int gamma;
    double eps;
    if (!PyArg_ParseTuple(args, "OOidOOOOO", &obj[0], &obj[1], &gamma, &eps, &obj[2], &obj[3],
                          &obj[4], &obj[5], &obj[6]))
        return NULL;
    if (gamma < 1 || gamma > 64 || !(eps > 0.0 && eps < 0.5)) {
        /* eps > 0 keeps p * FINE_BINS below FINE_BINS */
        PyErr_SetString(PyExc_ValueError, "confidence: bad layout arguments");
        return NULL;
    }
    static const char *const names[] = {"fine", "coarse", "group", "survival",
                                        "accepted", "window", "ceiling"};
    Py_buffer v[7];
    if (get_buffers(obj, v, "ididiii", "wwrrrrr", names, 7) < 0)
        return NULL;
    Py_ssize_t n = items(&v[2]);
    int bad = items(&v[3]) != n * gamma;
    for (int i = 4; i < 7; i++)
        bad |= items(&v[i]) != n;
    if (bad) {
        release(v, 7);
        PyErr_SetString(PyExc_ValueError, "confidence: row columns differ in length");
        return NULL;
    }
    int64_t *fine = v[0].buf;
    double *coarse = v[1].buf;
    const int64_t *group = v[2].buf, *accepted = v[4].buf, *window = v[5].buf,
                  *ceiling = v[6].buf;
    const double *survival = v[3].buf;
    const int64_t fine_stride = 2 * FINE_BINS, coarse_stride = 4 * ECE_BINS + 1;
    const int64_t slots = items(&v[0]) / fine_stride;
    if (slots % gamma != 0 || slots * fine_stride != items(&v[0])
        || slots * coarse_stride != items(&v[1])) {
        release(v, 7);
        PyErr_SetString(PyExc_ValueError, "confidence: the blocks do not fit gamma and the bins");
        return NULL;
    }
    const int64_t groups = slots / gamma;
    const double lo = eps, hi = 1.0 - eps;
    for (Py_ssize_t i = 0; i < n && !bad; i++) {
        if (group[i] < 0 || group[i] >= groups) {
            bad = 1;
            break;
        }
        const int observed = ceiling[i] >= 0;
        const int64_t reach = observed ? ceiling[i] : accepted[i];
        const int settled = observed || accepted[i] < window[i];
        const int64_t kept = settled ? gamma : (accepted[i] < gamma ? accepted[i] : gamma);
        const double *p_row = survival + i * gamma;
        for (int64_t j = 0; j < kept; j++) {
            double p = p_row[j];
            if (p != p) { /* NaN: not from a validated row */
                bad = 1;
                break;
            }
            p = p < lo ? lo : (p > hi ? hi : p);
            const int label = j < reach;
            const int fbin = (int)(p * FINE_BINS); /* p < 1, so below FINE_BINS */
            const int64_t slot = group[i] * gamma + j;
            fine[slot * fine_stride + label * FINE_BINS + fbin]++;
            double *c = coarse + slot * coarse_stride;
            const int cell = label * ECE_BINS + fbin / FINE_PER_ECE_BIN;
            c[cell] += 1.0;
            c[2 * ECE_BINS + cell] += p;
            c[4 * ECE_BINS] += p * p;
        }
    }
    release(v, 7);
    if (bad)
        return out_of_range("confidence");
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"tokens", tokens, METH_VARARGS, "Count request rows into the token histograms' block."},
    {"confidence", confidence, METH_VARARGS,
     "Count request rows' positions into the calibration histograms' blocks."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_rowfold", "The live aggregates' request-row fold, compiled.", -1,
    methods,
};

PyMODINIT_FUNC
PyInit__rowfold(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m && (PyModule_AddIntConstant(m, "N_HISTOGRAMS", N_HISTOGRAMS) < 0
              || PyModule_AddIntConstant(m, "ECE_BINS", ECE_BINS) < 0
              || PyModule_AddIntConstant(m, "FINE_PER_ECE_BIN", FINE_PER_ECE_BIN) < 0)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
