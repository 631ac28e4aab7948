/*
 * The request-row folds, compiled: the live aggregates', and a stored run's calibration.
 *
 * Why C: every request row of every step lands in a few histogram cells (six token
 * histograms; two calibration histograms per block position). In numpy that is about
 * fifteen whole-array passes per fold (labels, clipping, bin numbers, three
 * bincounts, the adds) after joining the steps' columns, ~10 ns per position; as one
 * loop over each step's own columns it is one read of the row and one add per cell.
 * `tokens.py` and `confidence.py` keep the numpy forms, used where this did not
 * build; both forms write the same cells (tests/test_rowfold.py).
 *
 * `tokens` and `confidence` take the fold's steps (`rows.RequestRows`: validated
 * StepBatches with request rows, each one's verify-mode code, and the group of every
 * row, in order) and add into the windowed sums' current block (`window.py`), a
 * C-ordered array the caller owns, in place. `histograms` is the same kind of loop over a
 * stored run's request rows, read a window at a time as plain columns, into the
 * report's calibration histograms (`analysis/reliability.py`, whose numpy fold is its
 * other form; tests/test_calibration_windows.py holds them together). Every column is
 * checked for its dtype, layout and length, and every cell index against the block, so a
 * wrong argument raises instead of reading or writing outside an array.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

#include <math.h>
#include <stdint.h>

/* The calibration histograms' bins, as confidence.py lays them out (a constant divisor
 * is a multiply, a variable one a division; tests/test_rowfold.py checks both files
 * agree). */
#define ECE_BINS 15
#define FINE_PER_ECE_BIN 68
#define FINE_BINS (ECE_BINS * FINE_PER_ECE_BIN)

/* The token histograms, in the column order of tokens.HISTOGRAMS. */
enum { H_WINDOW, H_ACCEPTED, H_COMMITTED, H_CEILING_OBSERVED, H_CEILING_SHADOW,
       H_ACCEPTED_KNOWN, N_HISTOGRAMS };

/* Verify-mode codes, as telemetry.batch.MODE_CODE numbers them. */
enum { MODE_STATIC = 0, MODE_CAP_ACCEPT = 2 };

/* The StepBatch columns read, interned at import. */
enum { C_VERIFY_LEN, C_CORRECT_DRAFTS, C_ACC_LEN, C_CAP_TRIM, C_SHADOW, C_SURVIVAL, N_COLUMNS };
static const char *COLUMN_NAMES[N_COLUMNS] = {
    "verify_len", "correct_drafts", "acc_len", "cap_trim", "shadow_ceiling", "survival",
};
static PyObject *column_names[N_COLUMNS];

/* An array checked for dtype, C order and shape (cols < 0: one dimension); its data. */
static void *
array_data(PyObject *obj, int type, npy_intp rows, npy_intp cols, const char *name)
{
    PyArrayObject *a = (PyArrayObject *)obj;
    int nd = cols < 0 ? 1 : 2;
    if (!PyArray_Check(obj) || PyArray_TYPE(a) != type || PyArray_NDIM(a) != nd
        || !PyArray_IS_C_CONTIGUOUS(a) || (rows >= 0 && PyArray_DIM(a, 0) != rows)
        || (nd == 2 && PyArray_DIM(a, 1) != cols)) {
        PyErr_Format(PyExc_ValueError, "%s: expected a C-ordered %s array, %s", name,
                     type == NPY_DOUBLE ? "float64" : "int64",
                     nd == 2 ? "[rows, gamma]" : "one value per row");
        return NULL;
    }
    return PyArray_DATA(a);
}

/* A writable block of whole rows of `width` cells; the number of rows in *rows. */
static void *
block_data(PyObject *obj, int type, npy_intp width, npy_intp *rows, const char *name)
{
    PyArrayObject *a = (PyArrayObject *)obj;
    if (!PyArray_Check(obj) || PyArray_TYPE(a) != type || !PyArray_IS_C_CONTIGUOUS(a)
        || !PyArray_ISWRITEABLE(a) || width < 1 || PyArray_SIZE(a) % width != 0) {
        PyErr_Format(PyExc_ValueError, "%s: expected a writable C-ordered block of rows", name);
        return NULL;
    }
    *rows = PyArray_SIZE(a) / width;
    return PyArray_DATA(a);
}

/* One step's columns: new references to the arrays (released by `release_step`). */
typedef struct {
    PyObject *obj[N_COLUMNS];
    npy_intp n;
    int mode;
    const int64_t *verify_len, *accepted, *committed, *cap_trim, *shadow;
    const double *survival; /* NULL: the step has none */
} Step;

static void
release_step(Step *st)
{
    for (int c = 0; c < N_COLUMNS; c++)
        Py_CLEAR(st->obj[c]);
}

static int
get_step(PyObject *batch, PyObject *mode, int gamma, Step *st)
{
    memset(st, 0, sizeof(*st));
    st->mode = (int)PyLong_AsLong(mode);
    if (st->mode == -1 && PyErr_Occurred())
        return -1;
    for (int c = 0; c < N_COLUMNS; c++)
        if ((st->obj[c] = PyObject_GetAttr(batch, column_names[c])) == NULL)
            return -1;
    if (!PyArray_Check(st->obj[C_VERIFY_LEN])) {
        PyErr_SetString(PyExc_ValueError, "verify_len: expected an array");
        return -1;
    }
    st->n = PyArray_SIZE((PyArrayObject *)st->obj[C_VERIFY_LEN]);
    const int64_t **cols[] = {&st->verify_len, &st->accepted, &st->committed, &st->cap_trim,
                              &st->shadow};
    for (int c = 0; c < C_SURVIVAL; c++)
        if ((*cols[c] = array_data(st->obj[c], NPY_INT64, st->n, -1, COLUMN_NAMES[c])) == NULL)
            return -1;
    if (gamma > 0 && st->obj[C_SURVIVAL] != Py_None
        && (st->survival = array_data(st->obj[C_SURVIVAL], NPY_DOUBLE, st->n, gamma,
                                      "survival")) == NULL)
        return -1;
    return 0;
}

/* The arguments every fold shares: the steps, their mode codes, each row's group. */
typedef struct {
    PyObject *batches, *modes; /* sequences (PySequence_Fast) */
    Py_ssize_t steps;
    const int64_t *group;
    npy_intp rows;
} Fold;

static int
get_fold(PyObject *batches, PyObject *modes, PyObject *group, Fold *f)
{
    f->batches = PySequence_Fast(batches, "batches must be a sequence");
    f->modes = f->batches ? PySequence_Fast(modes, "modes must be a sequence") : NULL;
    if (f->modes == NULL)
        return -1;
    f->steps = PySequence_Fast_GET_SIZE(f->batches);
    if (PySequence_Fast_GET_SIZE(f->modes) != f->steps) {
        PyErr_SetString(PyExc_ValueError, "one mode code per batch");
        return -1;
    }
    if ((f->group = array_data(group, NPY_INT64, -1, -1, "group")) == NULL)
        return -1;
    f->rows = PyArray_SIZE((PyArrayObject *)group);
    return 0;
}

static void
release_fold(Fold *f)
{
    Py_XDECREF(f->batches);
    Py_XDECREF(f->modes);
}

/* The ceiling a verify mode reveals (static: accepted; cap-accept: accepted + cap_trim),
 * -1 where the mode censors it: `telemetry.batch.ceiling_rule`, which defines it;
 * `ceiling` below exposes this for tests/test_rowfold.py to hold the two together. */
static inline int64_t
ceiling_rule(int mode, int64_t accepted, int64_t cap_trim)
{
    return mode == MODE_STATIC ? accepted : mode == MODE_CAP_ACCEPT ? accepted + cap_trim : -1;
}

/* Row i's window: drafts verified, SGLang's verify_len counting the anchor token (the
 * vocabulary table of telemetry.batch, VOCABULARY; `accepted` and `committed` are
 * SGLang's correct_drafts and acc_len as they are). */
static inline int64_t
window_of(const Step *st, npy_intp i)
{
    return st->verify_len[i] - 1;
}

/* Row i's ceiling as its step's mode reveals it. */
static inline int64_t
mode_ceiling(const Step *st, npy_intp i)
{
    return ceiling_rule(st->mode, st->accepted[i], st->cap_trim[i]);
}

/* A row outside the ranges validation guarantees: the rows before it are added. */
static PyObject *
out_of_range(const char *what)
{
    PyErr_Format(PyExc_ValueError, "%s: a row outside its validated range", what);
    return NULL;
}

static PyObject *
too_few_groups(void)
{
    PyErr_SetString(PyExc_ValueError, "group: fewer entries than the steps have rows");
    return NULL;
}

/* tokens(block, width, starts, batches, modes, group)
 *
 * block: int64 [groups, width]; starts: the first column of each histogram (a tuple of
 * N_HISTOGRAMS ints). Every row counts its window (verify_len - 1), accepted and
 * committed; a row whose mode reveals its ceiling (static: accepted; cap-accept:
 * accepted + cap_trim) counts that, else one with a shadow ceiling counts it; either
 * way it counts its accepted among the rows whose ceiling is known. */
static PyObject *
tokens(PyObject *self, PyObject *args)
{
    PyObject *block_obj, *starts_obj, *batches, *modes, *group;
    Py_ssize_t width;
    if (!PyArg_ParseTuple(args, "OnOOOO", &block_obj, &width, &starts_obj, &batches, &modes,
                          &group))
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
    npy_intp groups;
    int64_t *block = block_data(block_obj, NPY_INT64, width, &groups, "block");
    Fold f = {0};
    if (block == NULL || get_fold(batches, modes, group, &f) < 0) {
        release_fold(&f);
        return NULL;
    }
    PyObject *result = Py_None;
    npy_intp at = 0; /* the first row of the step */
    for (Py_ssize_t s = 0; s < f.steps && result; s++) {
        Step st;
        if (get_step(PySequence_Fast_GET_ITEM(f.batches, s),
                     PySequence_Fast_GET_ITEM(f.modes, s), 0, &st) < 0) {
            result = NULL;
        }
        else if (st.n > f.rows - at) {
            result = too_few_groups();
        }
        for (npy_intp i = 0; result && i < st.n; i++) {
            const int64_t g = f.group[at + i], a = st.accepted[i];
            const int64_t ceiling = mode_ceiling(&st, i);
            int64_t cols[N_HISTOGRAMS];
            int k = 0, bad = g < 0 || g >= groups;
            cols[k++] = start[H_WINDOW] + window_of(&st, i);
            cols[k++] = start[H_ACCEPTED] + a;
            cols[k++] = start[H_COMMITTED] + st.committed[i];
            if (ceiling >= 0)
                cols[k++] = start[H_CEILING_OBSERVED] + ceiling;
            else if (st.shadow[i] >= 0)
                cols[k++] = start[H_CEILING_SHADOW] + st.shadow[i];
            if (k > 3)
                cols[k++] = start[H_ACCEPTED_KNOWN] + a;
            for (int c = 0; c < k; c++)
                bad |= cols[c] < 0 || cols[c] >= width;
            if (bad) {
                result = out_of_range("tokens");
                break;
            }
            int64_t *row = block + g * width;
            for (int c = 0; c < k; c++)
                row[cols[c]]++;
        }
        at += st.n;
        release_step(&st);
    }
    release_fold(&f);
    return Py_XNewRef(result);
}

/* confidence(fine, fine_window, coarse, gamma, eps, batches, modes, group)
 *
 * The label rule of calibration.prefix_labels, as confidence.py applies it: position j
 * of a row is labelled j < reach, reach being the ceiling where known (its mode's, else
 * a shadow twin's) and the accepted count otherwise; a row without a known ceiling
 * whose whole window was accepted reveals only its first `accepted` positions. A kept
 * position's survival p (clipped to [eps, 1 - eps]) adds one to its fine bin, and to
 * its ECE bin one, p, and p * p to the position's squared sum. Steps without survival
 * add nothing.
 *
 * fine: int64 [groups, gamma * 2 * FINE_BINS], and fine_window of the same shape (the
 * running window sum, `WindowedSums.win`), each fine count added to both; coarse: float64
 * [groups, gamma * (4 * ECE_BINS + 1)], the layouts of ConfidenceAggregate. */
static PyObject *
confidence(PyObject *self, PyObject *args)
{
    PyObject *fine_obj, *fine_win_obj, *coarse_obj, *batches, *modes, *group;
    int gamma;
    double eps;
    if (!PyArg_ParseTuple(args, "OOOidOOO", &fine_obj, &fine_win_obj, &coarse_obj, &gamma, &eps,
                          &batches, &modes, &group))
        return NULL;
    if (gamma < 1 || gamma > 64 || !(eps > 0.0 && eps < 0.5)) {
        /* eps > 0 keeps p * FINE_BINS below FINE_BINS */
        PyErr_SetString(PyExc_ValueError, "confidence: bad gamma or eps");
        return NULL;
    }
    const int64_t fine_stride = 2 * FINE_BINS, coarse_stride = 4 * ECE_BINS + 1;
    npy_intp groups, win_groups, coarse_groups;
    int64_t *fine = block_data(fine_obj, NPY_INT64, gamma * fine_stride, &groups, "fine");
    int64_t *fine_win = fine ? block_data(fine_win_obj, NPY_INT64, gamma * fine_stride,
                                          &win_groups, "fine_window")
                             : NULL;
    double *coarse = fine_win ? block_data(coarse_obj, NPY_DOUBLE, gamma * coarse_stride,
                                           &coarse_groups, "coarse")
                              : NULL;
    if (coarse == NULL)
        return NULL;
    if (coarse_groups != groups || win_groups != groups) {
        PyErr_SetString(PyExc_ValueError, "confidence: the blocks hold different groups");
        return NULL;
    }
    Fold f = {0};
    if (get_fold(batches, modes, group, &f) < 0) {
        release_fold(&f);
        return NULL;
    }
    const double lo = eps, hi = 1.0 - eps;
    PyObject *result = Py_None;
    npy_intp at = 0;
    for (Py_ssize_t s = 0; s < f.steps && result; s++) {
        Step st;
        if (get_step(PySequence_Fast_GET_ITEM(f.batches, s),
                     PySequence_Fast_GET_ITEM(f.modes, s), gamma, &st) < 0) {
            result = NULL;
        }
        else if (st.n > f.rows - at) {
            result = too_few_groups();
        }
        for (npy_intp i = 0; result && st.survival && i < st.n; i++) {
            const int64_t g = f.group[at + i], a = st.accepted[i], w = window_of(&st, i);
            int64_t ceiling = mode_ceiling(&st, i);
            if (ceiling < 0)
                ceiling = st.shadow[i];
            if (g < 0 || g >= groups) {
                result = out_of_range("confidence");
                break;
            }
            const int observed = ceiling >= 0;
            const int64_t reach = observed ? ceiling : a;
            const int64_t kept = observed || a < w ? gamma : (a < gamma ? a : gamma);
            const double *p_row = st.survival + i * gamma;
            for (int64_t j = 0; j < kept; j++) {
                double p = p_row[j];
                if (p != p) { /* NaN: not from a validated row */
                    result = out_of_range("confidence");
                    break;
                }
                p = p < lo ? lo : (p > hi ? hi : p);
                const int label = j < reach;
                const int fbin = (int)(p * FINE_BINS); /* p < 1, so below FINE_BINS */
                const int64_t slot = g * gamma + j;
                const int64_t cell_index = slot * fine_stride + label * FINE_BINS + fbin;
                fine[cell_index]++;
                fine_win[cell_index]++;
                double *c = coarse + slot * coarse_stride;
                const int cell = label * ECE_BINS + fbin / FINE_PER_ECE_BIN;
                c[cell] += 1.0;
                c[2 * ECE_BINS + cell] += p;
                c[4 * ECE_BINS] += p * p;
            }
        }
        at += st.n;
        release_step(&st);
    }
    release_fold(&f);
    return Py_XNewRef(result);
}

/* histograms(count, target_sum, pred_sum, fine_pos, fine_neg, sq_err_sum,
 *            group, accepted, window, known, pred, gamma, bins, auroc_bins, eps, raw) -> bool
 *
 * A stored run's request rows into `CalibrationAccumulator`'s histograms, one row of each
 * per group (`analysis/reliability.py`'s `_Totals`, whose numpy fold is the other form):
 * count, target_sum and pred_sum [groups, gamma * bins], fine_pos and fine_neg
 * [groups, gamma * auroc_bins], sq_err_sum [groups, gamma]. The label rule is
 * `prefix_labels` with `known` the observed ceiling (-1: censored), and a position counts
 * where its prediction is not NaN. With `raw`, `pred` holds confidence logits and the
 * prediction is the running product of their sigmoids, as `_Totals._fold` computes it, so
 * that no [rows, gamma] survival is built before the fold. Returns whether any row records
 * position 0.
 *
 * Every row is checked (prefix_labels' ranges, its group) before any is added, so a bad
 * row raises with nothing counted; the loops run without the GIL, beside the reader that
 * decodes the next window. */
static PyObject *
histograms(PyObject *self, PyObject *args)
{
    PyObject *sum_obj[6], *group_obj, *accepted_obj, *window_obj, *known_obj, *pred_obj;
    int gamma, bins, auroc_bins, raw;
    double eps;
    if (!PyArg_ParseTuple(args, "OOOOOOOOOOOiiidp", &sum_obj[0], &sum_obj[1], &sum_obj[2],
                          &sum_obj[3], &sum_obj[4], &sum_obj[5], &group_obj, &accepted_obj,
                          &window_obj, &known_obj, &pred_obj, &gamma, &bins, &auroc_bins, &eps,
                          &raw))
        return NULL;
    if (gamma < 1 || gamma > 64 || bins < 1 || auroc_bins < 1 || !(eps > 0.0 && eps < 0.5)) {
        PyErr_SetString(PyExc_ValueError, "histograms: bad gamma, bins or eps");
        return NULL;
    }
    static const char *SUM_NAMES[6] = {"count", "target_sum", "pred_sum",
                                       "fine_pos", "fine_neg", "sq_err_sum"};
    const npy_intp widths[6] = {(npy_intp)gamma * bins, (npy_intp)gamma * bins,
                                (npy_intp)gamma * bins, (npy_intp)gamma * auroc_bins,
                                (npy_intp)gamma * auroc_bins, gamma};
    void *sums[6];
    npy_intp groups = -1;
    for (int h = 0; h < 6; h++) {
        npy_intp rows;
        int type = h == 2 || h == 5 ? NPY_DOUBLE : NPY_INT64;
        if ((sums[h] = block_data(sum_obj[h], type, widths[h], &rows, SUM_NAMES[h])) == NULL)
            return NULL;
        if (groups >= 0 && rows != groups) {
            PyErr_SetString(PyExc_ValueError, "histograms: the sums hold different groups");
            return NULL;
        }
        groups = rows;
    }
    const int64_t *group = array_data(group_obj, NPY_INT64, -1, -1, "group");
    if (group == NULL)
        return NULL;
    const npy_intp n = PyArray_SIZE((PyArrayObject *)group_obj);
    const int64_t *accepted = array_data(accepted_obj, NPY_INT64, n, -1, "accepted");
    const int64_t *window = accepted ? array_data(window_obj, NPY_INT64, n, -1, "window") : NULL;
    const int64_t *known = window ? array_data(known_obj, NPY_INT64, n, -1, "known") : NULL;
    const double *pred = known ? array_data(pred_obj, NPY_DOUBLE, n, gamma, "pred") : NULL;
    if (pred == NULL)
        return NULL;
    int64_t *count = sums[0], *target_sum = sums[1], *fine_pos = sums[3], *fine_neg = sums[4];
    double *pred_sum = sums[2], *sq_err_sum = sums[5];
    const double lo = eps, hi = 1.0 - eps;
    const char *bad = NULL;
    int first = 0; /* whether any row records position 0 */
    Py_BEGIN_ALLOW_THREADS
    for (npy_intp i = 0; i < n && bad == NULL; i++) {
        if (window[i] < 0 || window[i] > gamma)
            bad = "window outside 0..gamma";
        else if (accepted[i] < 0 || accepted[i] > window[i])
            bad = "accepted outside 0..window";
        else if (known[i] < -1 || known[i] > gamma)
            bad = "ceiling outside -1..gamma";
        else if (group[i] < 0 || group[i] >= groups)
            bad = "group outside the sums";
    }
    for (npy_intp i = 0; i < n && bad == NULL; i++) {
        const int64_t a = accepted[i], k = known[i], g = group[i];
        const int64_t reach = k >= 0 ? k : a;
        const int64_t kept = k >= 0 || a < window[i] ? gamma : a;
        const double *x = pred + i * gamma;
        first |= x[0] == x[0];
        double survival = 1.0;
        for (int64_t j = 0; j < kept; j++) {
            double p = x[j];
            if (raw) {
                p = 1.0 / (1.0 + exp(-p));
                survival = j ? survival * p : p;
                p = survival;
            }
            if (p != p)
                continue;
            const int label = j < reach;
            p = p < lo ? lo : (p > hi ? hi : p);
            int64_t coarse = (int64_t)(p * bins), fine = (int64_t)(p * auroc_bins);
            coarse = coarse < bins ? coarse : bins - 1;
            fine = fine < auroc_bins ? fine : auroc_bins - 1;
            const int64_t cell = g * gamma + j;
            count[cell * bins + coarse]++;
            target_sum[cell * bins + coarse] += label;
            pred_sum[cell * bins + coarse] += p;
            (label ? fine_pos : fine_neg)[cell * auroc_bins + fine]++;
            sq_err_sum[cell] += (p - label) * (p - label);
        }
    }
    Py_END_ALLOW_THREADS
    if (bad != NULL) {
        PyErr_Format(PyExc_ValueError, "histograms: %s", bad);
        return NULL;
    }
    return PyBool_FromLong(first);
}

/* ceiling(modes, accepted, cap_trim) -> int64 array
 *
 * `ceiling_rule` row by row over three int64 columns of one length (a mode code per row):
 * the folds' own helper, exposed so that its parity with the Python rule is tested. */
static PyObject *
ceiling(PyObject *self, PyObject *args)
{
    PyObject *modes_obj, *accepted_obj, *cap_obj;
    if (!PyArg_ParseTuple(args, "OOO", &modes_obj, &accepted_obj, &cap_obj))
        return NULL;
    const int64_t *mode = array_data(modes_obj, NPY_INT64, -1, -1, "modes");
    if (mode == NULL)
        return NULL;
    npy_intp n = PyArray_SIZE((PyArrayObject *)modes_obj);
    const int64_t *accepted = array_data(accepted_obj, NPY_INT64, n, -1, "accepted");
    const int64_t *cap_trim = accepted ? array_data(cap_obj, NPY_INT64, n, -1, "cap_trim") : NULL;
    if (cap_trim == NULL)
        return NULL;
    PyArrayObject *out = (PyArrayObject *)PyArray_SimpleNew(1, &n, NPY_INT64);
    if (out == NULL)
        return NULL;
    int64_t *o = PyArray_DATA(out);
    for (npy_intp i = 0; i < n; i++) {
        /* a code outside int's range is no mode: censored, as the rule has it */
        const int m = mode[i] < INT32_MIN || mode[i] > INT32_MAX ? -1 : (int)mode[i];
        o[i] = ceiling_rule(m, accepted[i], cap_trim[i]);
    }
    return (PyObject *)out;
}

static PyMethodDef methods[] = {
    {"ceiling", ceiling, METH_VARARGS, "The ceiling each row's mode code reveals (-1: censored)."},
    {"tokens", tokens, METH_VARARGS, "Count the steps' request rows into the token block."},
    {"confidence", confidence, METH_VARARGS,
     "Count the steps' request rows' positions into the calibration blocks."},
    {"histograms", histograms, METH_VARARGS,
     "Count a stored run's request rows into the calibration histograms of its groups."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_rowfold", "The request-row folds, compiled.", -1,
    methods,
};

PyMODINIT_FUNC
PyInit__rowfold(void)
{
    import_array();
    for (int c = 0; c < N_COLUMNS; c++)
        if ((column_names[c] = PyUnicode_InternFromString(COLUMN_NAMES[c])) == NULL)
            return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m && (PyModule_AddIntConstant(m, "N_HISTOGRAMS", N_HISTOGRAMS) < 0
              || PyModule_AddIntConstant(m, "ECE_BINS", ECE_BINS) < 0
              || PyModule_AddIntConstant(m, "FINE_PER_ECE_BIN", FINE_PER_ECE_BIN) < 0
              || PyModule_AddIntConstant(m, "MODE_STATIC", MODE_STATIC) < 0
              || PyModule_AddIntConstant(m, "MODE_CAP_ACCEPT", MODE_CAP_ACCEPT) < 0)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
