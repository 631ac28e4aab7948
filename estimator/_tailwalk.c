/*
 * The tail walker's per-step pass, compiled.
 *
 * Why C: the walk touches about 25 open blocks and opens about 170 new ones per
 * step at B = 256, with at most gamma positions each. Vectorised in numpy it
 * costs ~50 array calls per step whatever the sizes, which is most of the
 * estimator's budget; the same pass as a plain loop is a few microseconds.
 * `tails.py` keeps the numpy form as the fallback where this did not build and
 * owns everything that is not per step (settling idle blocks, emitting ceilings).
 *
 * The block pool is the Python walker's own numpy arrays (state rows, rids,
 * tails, draft log-probs, confidence, a stack of free ids); this file reads and
 * writes them in place. A step is two calls, because the sampled walk's gather
 * is a Python callable that must run between them:
 *
 *   advance(...)  walks every open block of the rank whose request is in the step
 *                 and opens (and walks) a block for each trimmed row it can walk;
 *                 lists the first mismatches of sampled blocks, whose target
 *                 log-probabilities only the step's verify distribution has, and
 *                 the blocks that are done, in the order they settle;
 *   finish(...)   folds the gathered log-probabilities in and settles the done
 *                 blocks into the settled buffers, freeing their ids.
 *
 * Arithmetic is the numpy form's, position by position: a sampled position's
 * acceptance ratio is exp(min(p - q, 0)) (a zero probability gives 0; a NaN
 * poisons the products after it), its running product multiplies into the
 * block's, and the sums take the running product (and (2m - 1) times it).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

#include <math.h>
#include <stdint.h>

/* The state row's fields, in the order of tails.py's constants (tests/test_tails.py checks). */
enum {
    OPEN_PREFIX, WINDOW, OPEN_FCT, GROUP, GREEDY, RANK, POOL, NEXT, EXPECT, SEEN,
    CUM, LO_EXTRA, VAR_TERMS, RESOLVED_FCT, CENSORED, FIELDS
};
static const char *FIELD_NAMES[FIELDS] = {
    "OPEN_PREFIX", "WINDOW", "OPEN_FCT", "GROUP", "GREEDY", "RANK", "POOL", "NEXT",
    "EXPECT", "SEEN", "CUM", "LO_EXTRA", "VAR_TERMS", "RESOLVED_FCT", "CENSORED",
};

/* An array argument checked for dtype, C order and shape; NULL data for an allowed None. */
typedef struct {
    PyArrayObject *arr;
    char *data;
} View;

static int
view(PyObject *obj, View *v, const char *name, int type, npy_intp rows, npy_intp cols,
     int allow_none)
{
    v->arr = NULL;
    v->data = NULL;
    if (obj == Py_None && allow_none)
        return 0;
    if (!PyArray_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s: expected a numpy array", name);
        return -1;
    }
    PyArrayObject *a = (PyArrayObject *)obj;
    int nd = cols < 0 ? 1 : 2;
    if (PyArray_TYPE(a) != type || PyArray_NDIM(a) != nd || !PyArray_IS_C_CONTIGUOUS(a)
        || (rows >= 0 && PyArray_DIM(a, 0) != rows) || (nd == 2 && PyArray_DIM(a, 1) != cols)) {
        PyErr_Format(PyExc_ValueError, "%s: wrong dtype, shape or layout", name);
        return -1;
    }
    v->arr = a;
    v->data = PyArray_DATA(a);
    return 0;
}

#define I64(v) ((int64_t *)(v).data)
#define F64(v) ((double *)(v).data)
#define I8(v) ((int8_t *)(v).data)
#define OBJ(v) ((PyObject **)(v).data)

/* Moves a block's result into the settled buffers and frees its id. */
static void
settle(double *blk, char *live, PyObject **prid, double *pconf, int64_t *freestack,
       int64_t *nfree, double *sf, PyObject **srid, double *sconf, int64_t *scount,
       int64_t b, int g, double fct, int censored)
{
    int64_t s = (*scount)++;
    double *src = blk + b * FIELDS, *dst = sf + s * FIELDS;
    for (int i = 0; i < FIELDS; i++)
        dst[i] = src[i];
    dst[RESOLVED_FCT] = fct;
    dst[CENSORED] = censored;
    for (int j = 0; j < g; j++)
        sconf[s * g + j] = pconf[b * g + j];
    PyObject *old = srid[s];
    srid[s] = prid[b]; /* the reference moves */
    Py_INCREF(Py_None);
    prid[b] = Py_None;
    Py_XDECREF(old);
    live[b] = 0;
    freestack[(*nfree)++] = b;
}

/* Accumulates one evaluated sampled position j (ratio from log p - log q) into a block:
 * the arithmetic of interval.running_sums (with acceptance_log_ratio), position by
 * position; `running_sums` below exposes it for tests/test_tails_compiled.py. */
static inline void
evaluate(double *f, double p, double q, int j)
{
    double d = p - q;
    if (d > 0.0)
        d = 0.0;
    double cum = f[CUM] * exp(d);
    f[CUM] = cum;
    f[LO_EXTRA] += cum;
    f[VAR_TERMS] += cum * (2.0 * (j - f[WINDOW]) + 1.0);
}

/* The step's columns, in the order `advance` takes them: converted when they are not
   already C-ordered arrays of the right dtype (they usually are; then no copy). */
enum { IN_PREFIX, IN_ACC, IN_WIN, IN_SLOT, IN_GREEDY, IN_GROUP, IN_BONUS, IN_BLP, IN_RID,
       IN_DRAFT, IN_TLP, IN_DLP, IN_CONF, INPUTS };
static const struct {
    const char *name;
    int type, matrix, optional;
} INPUT_SPEC[INPUTS] = {
    {"prefix", NPY_INT64, 0, 0},     {"accepted", NPY_INT64, 0, 0},
    {"window", NPY_INT64, 0, 0},     {"slot", NPY_INT64, 0, 0},
    {"greedy", NPY_INT8, 0, 0},      {"group", NPY_INT64, 0, 0},
    {"bonus", NPY_INT64, 0, 0},      {"bonus_lp", NPY_FLOAT64, 0, 0},
    {"rid", NPY_OBJECT, 0, 0},       {"draft", NPY_INT64, 1, 0},
    {"target_lp", NPY_FLOAT64, 1, 1}, {"draft_lp", NPY_FLOAT64, 1, 1},
    {"confidence", NPY_FLOAT64, 1, 1},
};

/* Converts the step's columns into `in` (new references, NULL for an allowed None). */
static int
step_inputs(PyObject **obj, PyArrayObject **in, int g, npy_intp *n)
{
    for (int i = 0; i < INPUTS; i++)
        in[i] = NULL;
    for (int i = 0; i < INPUTS; i++) {
        if (obj[i] == Py_None && INPUT_SPEC[i].optional)
            continue;
        int nd = INPUT_SPEC[i].matrix ? 2 : 1;
        PyArrayObject *a = (PyArrayObject *)obj[i];
        if (PyArray_Check(obj[i]) && PyArray_TYPE(a) == INPUT_SPEC[i].type
            && PyArray_NDIM(a) == nd && PyArray_ISCARRAY_RO(a)) {
            Py_INCREF(obj[i]); /* the usual case, without PyArray_FromAny's general path */
            in[i] = a;
        }
        else {
            in[i] = (PyArrayObject *)PyArray_FROMANY(obj[i], INPUT_SPEC[i].type, nd, nd,
                                                     NPY_ARRAY_IN_ARRAY);
            if (!in[i])
                return -1;
        }
        if (i == 0)
            *n = PyArray_DIM(in[0], 0);
        if (PyArray_DIM(in[i], 0) != *n || (nd == 2 && PyArray_DIM(in[i], 1) != g)) {
            PyErr_Format(PyExc_ValueError, "%s: shape does not match the step", INPUT_SPEC[i].name);
            return -1;
        }
    }
    return 0;
}

static PyObject *walk(int g, long long steps, long long fct, long long rank, int one_rank,
                      int assume, int logprobs, PyArrayObject **in, npy_intp n, PyObject **o,
                      long long nfree_in);

/*
 * advance(gamma, steps, fct, rank, one_rank, assume_greedy, logprobs,
 *         prefix, accepted, window, slot, greedy, group, bonus, bonus_lp, rid,
 *         draft, target_lp, draft_lp, confidence,
 *         blk, live, prid, ptail, pq, pconf, freestack, nfree, row_of,
 *         opened, skipped, g_block, g_row, g_off, g_tok, done, done_censored)
 * -> (nfree, gathers, done, opened, skipped)
 *
 * Pool capacity must leave room for every row of the step (nfree >= n) and the
 * request/done lists room for every live block plus every row; row_of must be
 * all -1 and cover every slot in the step (it is restored before returning).
 * The pool and output arrays are written in place, so they are never converted.
 */
static PyObject *
advance(PyObject *self, PyObject *args)
{
    int g, one_rank, assume, logprobs;
    long long steps, fct, rank, nfree_in;
    PyObject *o[29];
    if (!PyArg_ParseTuple(args, "iLLLiii" "OOOOOOOOOOOOO" "OOOOOOOLO" "OOOOOOOO", &g, &steps,
                          &fct, &rank, &one_rank, &assume, &logprobs,
                          &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &o[7], &o[8], &o[9],
                          &o[10], &o[11], &o[12],
                          &o[13], &o[14], &o[15], &o[16], &o[17], &o[18], &o[19], &nfree_in,
                          &o[20],
                          &o[21], &o[22], &o[23], &o[24], &o[25], &o[26], &o[27], &o[28]))
        return NULL;
    if (g < 1 || g > 64) {
        PyErr_SetString(PyExc_ValueError, "gamma outside 1..64");
        return NULL;
    }
    PyArrayObject *in[INPUTS];
    npy_intp n = 0;
    PyObject *result = NULL;
    if (step_inputs(o, in, g, &n) == 0)
        result = walk(g, steps, fct, rank, one_rank, assume, logprobs, in, n, o + INPUTS,
                      nfree_in);
    for (int i = 0; i < INPUTS; i++)
        Py_XDECREF(in[i]);
    return result;
}

static PyObject *
walk(int g, long long steps, long long fct, long long rank, int one_rank, int assume,
     int logprobs, PyArrayObject **in, npy_intp n, PyObject **o, long long nfree_in)
{
    if (!PyArray_Check(o[0])) {
        PyErr_SetString(PyExc_TypeError, "blk: expected a numpy array");
        return NULL;
    }
    npy_intp cap = PyArray_DIM((PyArrayObject *)o[0], 0);
    View blk, live, prid, ptail, pq, pconf, freestack, row_of;
    View opened, skipped, gb, gr, go, gt, done, done_c;
    if (view(o[0], &blk, "blk", NPY_FLOAT64, cap, FIELDS, 0) < 0
        || view(o[1], &live, "live", NPY_BOOL, cap, -1, 0) < 0
        || view(o[2], &prid, "prid", NPY_OBJECT, cap, -1, 0) < 0
        || view(o[3], &ptail, "ptail", NPY_INT64, cap, g, 0) < 0
        || view(o[4], &pq, "pq", NPY_FLOAT64, cap, g, 0) < 0
        || view(o[5], &pconf, "pconf", NPY_FLOAT64, cap, g, 0) < 0
        || view(o[6], &freestack, "freestack", NPY_INT64, cap, -1, 0) < 0
        || view(o[7], &row_of, "row_of", NPY_INT64, -1, -1, 0) < 0
        || view(o[8], &opened, "opened", NPY_BOOL, n, -1, 0) < 0
        || view(o[9], &skipped, "skipped", NPY_BOOL, n, -1, 0) < 0
        || view(o[10], &gb, "g_block", NPY_INT64, -1, -1, 0) < 0
        || view(o[11], &gr, "g_row", NPY_INT64, -1, -1, 0) < 0
        || view(o[12], &go, "g_off", NPY_INT64, -1, -1, 0) < 0
        || view(o[13], &gt, "g_tok", NPY_INT64, -1, -1, 0) < 0
        || view(o[14], &done, "done", NPY_INT64, -1, -1, 0) < 0
        || view(o[15], &done_c, "done_censored", NPY_INT8, -1, -1, 0) < 0)
        return NULL;
#define IN_DATA(i) (in[i] ? PyArray_DATA(in[i]) : NULL)
    npy_intp slots = PyArray_DIM(row_of.arr, 0);
    npy_intp room = PyArray_DIM(gb.arr, 0);
    if (nfree_in < n || nfree_in > cap || PyArray_DIM(gr.arr, 0) < room
        || PyArray_DIM(go.arr, 0) < room || PyArray_DIM(gt.arr, 0) < room
        || PyArray_DIM(done.arr, 0) < room || PyArray_DIM(done_c.arr, 0) < room
        || room < cap - nfree_in + n) {
        PyErr_SetString(PyExc_ValueError, "pool or output buffers too small for the step");
        return NULL;
    }
    const int64_t *P = IN_DATA(IN_PREFIX), *A = IN_DATA(IN_ACC), *W = IN_DATA(IN_WIN);
    const int64_t *S = IN_DATA(IN_SLOT), *GRP = IN_DATA(IN_GROUP), *BON = IN_DATA(IN_BONUS);
    const int64_t *D = IN_DATA(IN_DRAFT);
    const int8_t *GR = IN_DATA(IN_GREEDY);
    const double *BLP = IN_DATA(IN_BLP), *TLP = IN_DATA(IN_TLP), *DLP = IN_DATA(IN_DLP);
    const double *CONF = IN_DATA(IN_CONF);
    PyObject **RID = IN_DATA(IN_RID), **PRID = OBJ(prid);
#undef IN_DATA
    double *BLK = F64(blk), *PQ = F64(pq), *PCONF = F64(pconf);
    int64_t *PT = I64(ptail), *FREE = I64(freestack), *ROW = I64(row_of);
    char *LIVE = (char *)live.data, *OPENED = (char *)opened.data, *SKIPPED = (char *)skipped.data;
    int64_t *GB = I64(gb), *GRW = I64(gr), *GO = I64(go), *GT = I64(gt), *DONE = I64(done);
    int8_t *DONE_C = I8(done_c);
    int64_t nfree = nfree_in, ngather = 0, ndone = 0, n_opened = 0, n_skipped = 0;
    double rank_d = (double)rank;

    for (npy_intp r = 0; r < n; r++) {
        if (S[r] < -1 || S[r] >= slots || A[r] < 0 || A[r] > W[r] || W[r] > g) {
            PyErr_SetString(PyExc_ValueError, "step rows outside the walker's bounds");
            return NULL;
        }
    }
    /* a row without a slot (-1: not recorded) opens blocks that no later step continues */
    for (npy_intp r = 0; r < n; r++)
        if (S[r] >= 0)
            ROW[S[r]] = r;

    /* one pass over the pool, in id order: first the open blocks this step continues,
       then (ids handed out below) the blocks it opens */
    for (int stage = 0; stage < 2; stage++) {
        npy_intp count = stage == 0 ? cap : 0;
        if (stage == 1) {
            /* open a block per trimmed row that can be walked */
            for (npy_intp r = 0; r < n; r++) {
                int flag = GR[r];
                if (flag < 0 && assume >= 0)
                    flag = assume;
                int trimmed = A[r] == W[r] && W[r] < g;
                int can_walk = flag == 1 || (flag == 0 && logprobs);
                OPENED[r] = trimmed && can_walk;
                SKIPPED[r] = trimmed && !can_walk;
                n_opened += OPENED[r];
                n_skipped += SKIPPED[r];
            }
            count = n;
        }
        for (npy_intp i = 0; i < count; i++) {
            int64_t b, r;
            if (stage == 0) {
                b = i;
                if (!LIVE[b])
                    continue;
                double *f = BLK + b * FIELDS;
                if (!one_rank && f[RANK] != rank_d)
                    continue;
                int64_t sl = (int64_t)f[POOL];
                if (sl < 0 || sl >= slots || ROW[sl] < 0)
                    continue;
                r = ROW[sl];
                int same = PyObject_RichCompareBool(RID[r], PRID[b], Py_EQ);
                if (same < 0)
                    return NULL;
                if (!same || (double)P[r] != f[EXPECT]) {
                    DONE[ndone] = b;
                    DONE_C[ndone++] = 1;
                    continue;
                }
            }
            else {
                r = i;
                if (!OPENED[r])
                    continue;
                b = FREE[--nfree];
                double *f = BLK + b * FIELDS;
                for (int k = 0; k < FIELDS; k++)
                    f[k] = 0.0;
                f[OPEN_PREFIX] = (double)P[r];
                f[WINDOW] = f[NEXT] = (double)W[r];
                f[OPEN_FCT] = (double)fct;
                f[GROUP] = (double)GRP[r];
                f[GREEDY] = GR[r] < 0 ? (double)assume : (double)GR[r];
                f[RANK] = rank_d;
                f[POOL] = (double)S[r];
                f[CUM] = 1.0;
                for (int j = 0; j < g; j++) {
                    PT[b * g + j] = D[r * g + j];
                    PQ[b * g + j] = DLP ? DLP[r * g + j] : NAN;
                    PCONF[b * g + j] = CONF ? CONF[r * g + j] : NAN;
                }
                Py_INCREF(RID[r]);
                Py_XSETREF(PRID[b], RID[r]);
                LIVE[b] = 1;
            }
            /* walk block b along row r */
            double *f = BLK + b * FIELDS;
            int sampled = f[GREEDY] == 0.0;
            int64_t a = A[r];
            /* tail j sits at offset j + shift of the row; positions are doubles, as in the
               state row, so no prefix however large overflows */
            double shift = f[OPEN_PREFIX] - (double)P[r];
            int j = (int)f[NEXT];
            int resolved = 0;
            for (; j < g; j++) {
                double at = j + shift;
                if (at > (double)a)
                    break; /* not committed in this step: the block stays open */
                /* below 0 cannot happen for a request that continues; kept in bounds */
                int64_t off = at < 0.0 ? 0 : (int64_t)at;
                int64_t tok = off < a ? D[r * g + off] : BON[r];
                int64_t want = PT[b * g + j];
                if (tok != want) {
                    resolved = 1; /* the first mismatch, committed in this step */
                    if (sampled && ngather < room) {
                        GB[ngather] = b;
                        GRW[ngather] = r;
                        GO[ngather] = off;
                        GT[ngather++] = want;
                    }
                    break;
                }
                if (sampled) {
                    double p = off < a ? (TLP ? TLP[r * g + off] : NAN) : BLP[r];
                    evaluate(f, p, PQ[b * g + j], j);
                }
            }
            if (j >= g)
                resolved = 1;
            f[NEXT] = j;
            f[EXPECT] = (double)P[r] + (double)(a + 1);
            f[SEEN] = (double)steps;
            if (resolved) {
                DONE[ndone] = b;
                DONE_C[ndone++] = 0;
            }
        }
    }
    for (npy_intp r = 0; r < n; r++)
        if (S[r] >= 0)
            ROW[S[r]] = -1;
    return Py_BuildValue("LLLLL", (long long)nfree, (long long)ngather, (long long)ndone,
                         (long long)n_opened, (long long)n_skipped);
}

/*
 * finish(gamma, fct, g_block, g_tok_lp, gathers, blk, pq, done, done_censored, ndone,
 *        live, prid, pconf, freestack, nfree, sf, srid, sconf, scount) -> (nfree, scount)
 *
 * g_tok_lp: the gathered log-probabilities (NaN: unknown, the walk stops before it),
 * or None when there was no gather.
 */
static PyObject *
finish(PyObject *self, PyObject *args)
{
    int g;
    long long fct, ngather, ndone, nfree, scount;
    PyObject *o[13];
    if (!PyArg_ParseTuple(args, "iLOOLOOOOLOOOOLOOOL", &g, &fct, &o[0], &o[1], &ngather, &o[2],
                          &o[3], &o[4], &o[5], &ndone, &o[6], &o[7], &o[8], &o[9], &nfree, &o[10],
                          &o[11], &o[12], &scount))
        return NULL;
    if (g < 1 || g > 64 || !PyArray_Check(o[2])) {
        PyErr_SetString(PyExc_ValueError, "finish: bad gamma or pool");
        return NULL;
    }
    npy_intp cap = PyArray_DIM((PyArrayObject *)o[2], 0);
    View gb, glp, blk, pq, done, done_c, live, prid, pconf, freestack, sf, srid, sconf;
    if (view(o[0], &gb, "g_block", NPY_INT64, -1, -1, 0) < 0
        || view(o[1], &glp, "g_tok_lp", NPY_FLOAT64, -1, -1, 1) < 0
        || view(o[2], &blk, "blk", NPY_FLOAT64, cap, FIELDS, 0) < 0
        || view(o[3], &pq, "pq", NPY_FLOAT64, cap, g, 0) < 0
        || view(o[4], &done, "done", NPY_INT64, -1, -1, 0) < 0
        || view(o[5], &done_c, "done_censored", NPY_INT8, -1, -1, 0) < 0
        || view(o[6], &live, "live", NPY_BOOL, cap, -1, 0) < 0
        || view(o[7], &prid, "prid", NPY_OBJECT, cap, -1, 0) < 0
        || view(o[8], &pconf, "pconf", NPY_FLOAT64, cap, g, 0) < 0
        || view(o[9], &freestack, "freestack", NPY_INT64, cap, -1, 0) < 0
        || view(o[10], &sf, "sf", NPY_FLOAT64, -1, FIELDS, 0) < 0
        || view(o[11], &srid, "srid", NPY_OBJECT, -1, -1, 0) < 0
        || view(o[12], &sconf, "sconf", NPY_FLOAT64, -1, g, 0) < 0)
        return NULL;
    npy_intp settled_room = PyArray_DIM(sf.arr, 0);
    if (ngather < 0 || ngather > PyArray_DIM(gb.arr, 0)
        || (glp.data && PyArray_DIM(glp.arr, 0) < ngather) || ndone < 0
        || ndone > PyArray_DIM(done.arr, 0) || ndone > PyArray_DIM(done_c.arr, 0)
        || nfree < 0 || nfree + ndone > cap || scount < 0
        || PyArray_DIM(srid.arr, 0) < settled_room || PyArray_DIM(sconf.arr, 0) < settled_room
        || scount + ndone > settled_room) {
        PyErr_SetString(PyExc_ValueError, "finish: buffers too small");
        return NULL;
    }
    double *BLK = F64(blk), *PQ = F64(pq), *GLP = F64(glp);
    int64_t *GB = I64(gb), *DONE = I64(done), *FREE = I64(freestack);
    int64_t nf = nfree, sc = scount;
    if (GLP) {
        for (int64_t i = 0; i < ngather; i++) {
            int64_t b = GB[i];
            if (b < 0 || b >= cap)
                continue;
            double *f = BLK + b * FIELDS;
            int j = (int)f[NEXT];
            double p = GLP[i];
            if (isnan(p) || j >= g)
                continue; /* unknown: the walk reached the mismatch but cannot count it */
            evaluate(f, p, PQ[b * g + j], j);
            f[NEXT] = j + 1;
        }
    }
    int8_t *DC = I8(done_c);
    for (int64_t i = 0; i < ndone; i++) {
        int64_t b = DONE[i];
        if (b < 0 || b >= cap)
            continue;
        settle(BLK, (char *)live.data, OBJ(prid), F64(pconf), FREE, &nf, F64(sf), OBJ(srid),
               F64(sconf), &sc, b, g, (double)fct, DC[i]);
    }
    return Py_BuildValue("LL", (long long)nf, (long long)sc);
}

/*
 * running_sums(log_p, log_q, counted, window, cum) -> (cum, lo_extra, var_terms)
 *
 * `evaluate` over the counted positions of each row of [k, n] float64 log-probabilities
 * (counted: bool [k, n]), from a block state with the given window and running product
 * ([k] float64 each) and sums of 0: what interval.running_sums computes from
 * acceptance_log_ratio(log_p, log_q), for the tests to compare.
 */
static PyObject *
running_sums(PyObject *self, PyObject *args)
{
    PyObject *o[5];
    if (!PyArg_ParseTuple(args, "OOOOO", &o[0], &o[1], &o[2], &o[3], &o[4]))
        return NULL;
    if (!PyArray_Check(o[0]) || PyArray_NDIM((PyArrayObject *)o[0]) != 2) {
        PyErr_SetString(PyExc_ValueError, "log_p: expected a [k, n] array");
        return NULL;
    }
    npy_intp k = PyArray_DIM((PyArrayObject *)o[0], 0), n = PyArray_DIM((PyArrayObject *)o[0], 1);
    View lp, lq, counted, window, cum;
    if (view(o[0], &lp, "log_p", NPY_FLOAT64, k, n, 0) < 0
        || view(o[1], &lq, "log_q", NPY_FLOAT64, k, n, 0) < 0
        || view(o[2], &counted, "counted", NPY_BOOL, k, n, 0) < 0
        || view(o[3], &window, "window", NPY_FLOAT64, k, -1, 0) < 0
        || view(o[4], &cum, "cum", NPY_FLOAT64, k, -1, 0) < 0)
        return NULL;
    if (n > 64) {
        PyErr_SetString(PyExc_ValueError, "running_sums: more positions than a block has");
        return NULL;
    }
    PyObject *out[3] = {NULL, NULL, NULL};
    for (int i = 0; i < 3; i++)
        if ((out[i] = PyArray_SimpleNew(1, &k, NPY_FLOAT64)) == NULL) {
            for (int c = 0; c < i; c++)
                Py_DECREF(out[c]);
            return NULL;
        }
    double *oc = PyArray_DATA((PyArrayObject *)out[0]);
    double *olo = PyArray_DATA((PyArrayObject *)out[1]);
    double *ovar = PyArray_DATA((PyArrayObject *)out[2]);
    const char *C = counted.data;
    for (npy_intp r = 0; r < k; r++) {
        double f[FIELDS] = {0};
        f[WINDOW] = F64(window)[r];
        f[CUM] = F64(cum)[r];
        for (npy_intp j = 0; j < n; j++)
            if (C[r * n + j])
                evaluate(f, F64(lp)[r * n + j], F64(lq)[r * n + j], (int)j);
        oc[r] = f[CUM];
        olo[r] = f[LO_EXTRA];
        ovar[r] = f[VAR_TERMS];
    }
    return Py_BuildValue("(NNN)", out[0], out[1], out[2]);
}

static PyMethodDef methods[] = {
    {"running_sums", running_sums, METH_VARARGS,
     "The per-position arithmetic over [k, n] log-probabilities (see interval.running_sums)."},
    {"advance", advance, METH_VARARGS, "Walk one step's open and new blocks (see the file)."},
    {"finish", finish, METH_VARARGS, "Fold the gathers in and settle the done blocks."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_tailwalk", "The tail walker's per-step pass, compiled.", -1, methods,
};

PyMODINIT_FUNC
PyInit__tailwalk(void)
{
    import_array();
    PyObject *m = PyModule_Create(&module);
    if (!m)
        return NULL;
    PyObject *names = PyTuple_New(FIELDS);
    if (!names) {
        Py_DECREF(m);
        return NULL;
    }
    for (int i = 0; i < FIELDS; i++)
        PyTuple_SET_ITEM(names, i, PyUnicode_FromString(FIELD_NAMES[i]));
    if (PyModule_AddObject(m, "FIELD_NAMES", names) < 0) {
        Py_DECREF(names);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
