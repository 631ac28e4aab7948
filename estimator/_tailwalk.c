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
 * tails, draft log-probs, confidence, a stack of free ids, the slot map, the
 * settled buffers and two counters: free ids, settled blocks). A `Pool` binds them
 * once, checking each array's dtype, shape and layout, and holds them; the walker
 * binds a new one only when it replaces an array (the pool or a buffer grew). A step
 * is then two calls that take only the step, because the sampled walk's gather is a
 * Python callable that must run between them:
 *
 *   Pool.advance(batch, group, steps, one_rank)
 *                 walks every open block of the rank whose request is in the step
 *                 and opens (and walks) a block for each trimmed row it can walk;
 *                 returns the first mismatches of sampled blocks, whose target
 *                 log-probabilities only the step's verify distribution has, and
 *                 keeps the blocks that are done, in the order they settle;
 *   Pool.finish(log_p)
 *                 folds the gathered log-probabilities in and settles the done
 *                 blocks into the settled buffers, freeing their ids.
 *
 * When the gather fails, `Pool.abandon()` ends the step instead of `finish`: the done
 * blocks settle as censored.
 *
 * Every id taken from the free stack is checked against the pool (in range, not in
 * use), and every id on the pending lists again before `finish` uses it; a bad one
 * raises ValueError. Whatever error ends `advance` once the step's rows are in the slot
 * map, the map is restored (all -1 again), the free-id counter says which ids are in
 * use, and the blocks the step had already found done are settled as censored, so
 * that the walker stays consistent and the next step walks normally.
 *
 * Arithmetic is the numpy form's, position by position: a sampled position's
 * acceptance ratio is exp(min(p - q, 0)) (a zero probability gives 0; a NaN
 * poisons the products after it), its running product multiplies into the
 * block's, and the sums take the running product (and (2m - 1) times it):
 * `interval.running_sums`, which `running_sums` below lets the tests compare.
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
    CUM, LO_EXTRA, VAR_TERMS, RESOLVED_FCT, CENSORED, AWAY, LINK, FIELDS
};
static const char *FIELD_NAMES[FIELDS] = {
    "OPEN_PREFIX", "WINDOW", "OPEN_FCT", "GROUP", "GREEDY", "RANK", "POOL", "NEXT",
    "EXPECT", "SEEN", "CUM", "LO_EXTRA", "VAR_TERMS", "RESOLVED_FCT", "CENSORED", "AWAY", "LINK",
};

/* The counters array's entries (tails.py's N_FREE and N_SETTLED). */
enum { C_NFREE, C_SETTLED, COUNTERS };

/* An array checked for dtype, C order, shape and (writable) for being writable;
 * its data, or NULL with an exception set. */
static char *
checked(PyObject *obj, const char *name, int type, npy_intp rows, npy_intp cols, int writable)
{
    if (!PyArray_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s: expected a numpy array", name);
        return NULL;
    }
    PyArrayObject *a = (PyArrayObject *)obj;
    int nd = cols < 0 ? 1 : 2;
    if (PyArray_TYPE(a) != type || PyArray_NDIM(a) != nd || !PyArray_IS_C_CONTIGUOUS(a)
        || (rows >= 0 && PyArray_DIM(a, 0) != rows) || (nd == 2 && PyArray_DIM(a, 1) != cols)
        || (writable && !PyArray_ISWRITEABLE(a))) {
        PyErr_Format(PyExc_ValueError, "%s: wrong dtype, shape or layout%s", name,
                     writable ? ", or not writable" : "");
        return NULL;
    }
    return PyArray_DATA(a);
}

/* Accumulates one evaluated sampled position j (ratio from log p - log q) into a block:
 * the arithmetic of interval.running_sums (with acceptance_log_ratio), position by
 * position. */
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

/* ---- the pool ------------------------------------------------------------------ */

/* The arrays a Pool binds, in the order (and with the keywords) it takes them. */
enum { B_COUNTERS, B_BLK, B_LIVE, B_PRID, B_PTAIL, B_PQ, B_PCONF, B_FREE, B_ROW_OF,
       B_SET_F, B_SET_RID, B_SET_CONF, B_AWAY, BOUND };

typedef struct {
    PyObject_HEAD
    int g, assume;
    npy_intp cap, slots, room; /* pool ids, slot map entries, settled buffer rows */
    PyObject *bound[BOUND];    /* references held while bound */
    int64_t *counters, *ptail, *freestack, *row_of;
    double *blk, *pq, *pconf, *sf, *sconf;
    char *live;
    PyObject **prid, **srid;
    PyObject *away; /* rid -> the first id of a chain (LINK) of parked blocks */
    /* a step's pending work, from `advance` to `finish`: gathers (block, row, offset,
     * token) and done blocks (id, censored), at most one entry per pool id each; and
     * room for one rid's chain */
    int64_t *gb, *grow, *goff, *gtok, *done, *chain;
    int8_t *done_c;
    int64_t ngather, ndone;
    double fct; /* the pending step's forward_ct */
} Pool;

static void
Pool_dealloc(Pool *self)
{
    for (int i = 0; i < BOUND; i++)
        Py_XDECREF(self->bound[i]);
    PyMem_Free(self->gb); /* one block holds every pending list */
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
Pool_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"gamma", "assume_greedy", "counters", "blk", "live", "prid",
                             "ptail", "pq", "pconf", "freestack", "row_of", "set_f",
                             "set_rid", "set_conf", "away", NULL};
    int g, assume;
    PyObject *o[BOUND];
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "iiOOOOOOOOOOOOO!:Pool", kwlist, &g,
                                     &assume, &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6],
                                     &o[7], &o[8], &o[9], &o[10], &o[11], &PyDict_Type, &o[12]))
        return NULL;
    if (g < 1 || g > 64 || assume < -1 || assume > 1) {
        PyErr_SetString(PyExc_ValueError, "Pool: gamma outside 1..64 or assume_greedy not -1, 0, 1");
        return NULL;
    }
    if (!PyArray_Check(o[B_BLK]) || !PyArray_Check(o[B_ROW_OF]) || !PyArray_Check(o[B_SET_F])
        || PyArray_NDIM((PyArrayObject *)o[B_BLK]) < 1
        || PyArray_NDIM((PyArrayObject *)o[B_ROW_OF]) < 1
        || PyArray_NDIM((PyArrayObject *)o[B_SET_F]) < 1) {
        PyErr_SetString(PyExc_TypeError, "Pool: blk, row_of and set_f must be numpy arrays");
        return NULL;
    }
    npy_intp cap = PyArray_DIM((PyArrayObject *)o[B_BLK], 0);
    npy_intp slots = PyArray_DIM((PyArrayObject *)o[B_ROW_OF], 0);
    npy_intp room = PyArray_DIM((PyArrayObject *)o[B_SET_F], 0);
    Pool *self = (Pool *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->g = g;
    self->assume = assume;
    self->cap = cap;
    self->slots = slots;
    self->room = room;
    if ((self->counters = (int64_t *)checked(o[B_COUNTERS], "counters", NPY_INT64, COUNTERS, -1, 1)) == NULL
        || (self->blk = (double *)checked(o[B_BLK], "blk", NPY_FLOAT64, cap, FIELDS, 1)) == NULL
        || (self->live = checked(o[B_LIVE], "live", NPY_BOOL, cap, -1, 1)) == NULL
        || (self->prid = (PyObject **)checked(o[B_PRID], "prid", NPY_OBJECT, cap, -1, 1)) == NULL
        || (self->ptail = (int64_t *)checked(o[B_PTAIL], "ptail", NPY_INT64, cap, g, 1)) == NULL
        || (self->pq = (double *)checked(o[B_PQ], "pq", NPY_FLOAT64, cap, g, 1)) == NULL
        || (self->pconf = (double *)checked(o[B_PCONF], "pconf", NPY_FLOAT64, cap, g, 1)) == NULL
        || (self->freestack = (int64_t *)checked(o[B_FREE], "freestack", NPY_INT64, cap, -1, 1)) == NULL
        || (self->row_of = (int64_t *)checked(o[B_ROW_OF], "row_of", NPY_INT64, slots, -1, 1)) == NULL
        || (self->sf = (double *)checked(o[B_SET_F], "set_f", NPY_FLOAT64, room, FIELDS, 1)) == NULL
        || (self->srid = (PyObject **)checked(o[B_SET_RID], "set_rid", NPY_OBJECT, room, -1, 1)) == NULL
        || (self->sconf = (double *)checked(o[B_SET_CONF], "set_conf", NPY_FLOAT64, room, g, 1)) == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    self->away = o[B_AWAY];
    /* one allocation for the pending lists: six int64 lists and one int8 list */
    size_t n = cap > 0 ? (size_t)cap : 1;
    if ((self->gb = PyMem_Malloc(n * (6 * sizeof(int64_t) + sizeof(int8_t)))) == NULL) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    self->grow = self->gb + n;
    self->goff = self->grow + n;
    self->gtok = self->goff + n;
    self->done = self->gtok + n;
    self->chain = self->done + n;
    self->done_c = (int8_t *)(self->chain + n);
    for (int i = 0; i < BOUND; i++) {
        Py_INCREF(o[i]);
        self->bound[i] = o[i];
    }
    return (PyObject *)self;
}

/* The counters, checked against the bound arrays (Python may write them). */
static int
read_counters(Pool *self, int64_t *nfree, int64_t *scount)
{
    *nfree = self->counters[C_NFREE];
    *scount = self->counters[C_SETTLED];
    if (*nfree < 0 || *nfree > self->cap || *scount < 0 || *scount > self->room) {
        PyErr_SetString(PyExc_ValueError, "Pool: counters outside the bound arrays");
        return -1;
    }
    return 0;
}

/* Moves block b's result into the settled buffers and frees its id. The caller has
 * checked b, and that the free stack and the settled buffers have room. */
static void
settle(Pool *self, int64_t b, int64_t *nfree, int64_t *scount, int censored)
{
    const int g = self->g;
    int64_t s = (*scount)++;
    double *src = self->blk + b * FIELDS, *dst = self->sf + s * FIELDS;
    for (int i = 0; i < FIELDS; i++)
        dst[i] = src[i];
    dst[RESOLVED_FCT] = self->fct;
    dst[CENSORED] = censored;
    for (int j = 0; j < g; j++)
        self->sconf[s * g + j] = self->pconf[b * g + j];
    PyObject *old = self->srid[s];
    self->srid[s] = self->prid[b]; /* the reference moves */
    Py_INCREF(Py_None);
    self->prid[b] = Py_None;
    Py_XDECREF(old);
    self->live[b] = 0;
    self->freestack[(*nfree)++] = b;
}

/* Every id on the pending lists within the pool, and room to settle them all; else
 * ValueError, before anything changes. */
static int
check_pending(Pool *self, int64_t nfree, int64_t scount)
{
    for (int64_t i = 0; i < self->ngather; i++)
        if (self->gb[i] < 0 || self->gb[i] >= self->cap) {
            PyErr_Format(PyExc_ValueError, "gathered block id %lld outside the pool of %lld",
                         (long long)self->gb[i], (long long)self->cap);
            return -1;
        }
    for (int64_t i = 0; i < self->ndone; i++)
        if (self->done[i] < 0 || self->done[i] >= self->cap || !self->live[self->done[i]]) {
            PyErr_Format(PyExc_ValueError, "done block id %lld outside the pool or not in use",
                         (long long)self->done[i]);
            return -1;
        }
    if (nfree + self->ndone > self->cap || scount + self->ndone > self->room) {
        PyErr_SetString(PyExc_ValueError, "no room to settle the step's done blocks");
        return -1;
    }
    return 0;
}

/* Settles the pending done blocks as censored and drops the gathers: the end of a step
 * whose walk failed, or whose gather raised (`abandon`). */
static void
abandon_pending(Pool *self)
{
    int64_t nfree, scount;
    if (self->ndone && read_counters(self, &nfree, &scount) == 0
        && check_pending(self, nfree, scount) == 0) {
        for (int64_t i = 0; i < self->ndone; i++)
            settle(self, self->done[i], &nfree, &scount, 1);
        self->counters[C_NFREE] = nfree;
        self->counters[C_SETTLED] = scount;
    }
    /* a check that failed leaves its exception only if there was none already */
    self->ngather = self->ndone = 0;
}

/* The step's columns, read from the batch by these names (StepBatch's own, SGLang's:
 * the accepted count is correct_drafts, the window verify_len - 1, as the vocabulary table
 * of telemetry.batch has them; `window_of` below), converted when they are not already
 * C-ordered arrays of the right dtype (they usually are; then no copy). */
enum { IN_PREFIX, IN_ACC, IN_VLEN, IN_SLOT, IN_GREEDY, IN_BONUS, IN_BLP, IN_RID, IN_DRAFT,
       IN_TLP, IN_DLP, IN_CONF, INPUTS };
static const struct {
    const char *name;
    int type, matrix, optional;
} INPUT_SPEC[INPUTS] = {
    {"prefix_len", NPY_INT64, 0, 0},       {"correct_drafts", NPY_INT64, 0, 0},
    {"verify_len", NPY_INT64, 0, 0},       {"req_pool_index", NPY_INT64, 0, 0},
    {"greedy", NPY_INT8, 0, 0},            {"bonus_token", NPY_INT64, 0, 0},
    {"bonus_logprob", NPY_FLOAT64, 0, 0},  {"rid", NPY_OBJECT, 0, 0},
    {"draft_tokens", NPY_INT64, 1, 0},     {"target_logprobs", NPY_FLOAT64, 1, 1},
    {"draft_logprobs", NPY_FLOAT64, 1, 1}, {"confidence", NPY_FLOAT64, 1, 1},
};
static PyObject *input_names[INPUTS], *name_forward_ct, *name_rank, *name_dict;

/* An array of the spec's type and dimensions from `obj` (a new reference). */
static PyArrayObject *
as_input(PyObject *obj, int type, int nd)
{
    PyArrayObject *a = (PyArrayObject *)obj;
    if (PyArray_Check(obj) && PyArray_TYPE(a) == type && PyArray_NDIM(a) == nd
        && PyArray_ISCARRAY_RO(a)) {
        Py_INCREF(obj); /* the usual case, without PyArray_FromAny's general path */
        return a;
    }
    return (PyArrayObject *)PyArray_FROMANY(obj, type, nd, nd, NPY_ARRAY_IN_ARRAY);
}

/* The drafts row r verified: SGLang's verify_len counts the anchor token. */
static inline int64_t
window_of(const int64_t *verify_len, npy_intp r)
{
    return verify_len[r] - 1;
}

/* Attribute `name` of the batch (a new reference): from its instance dictionary where it
 * has one holding the name (a StepBatch's columns; a dictionary lookup is several times
 * cheaper than the full attribute protocol), else by the attribute protocol. */
static PyObject *
batch_attr(PyObject *batch, PyObject *dict, PyObject *name)
{
    if (dict != NULL) {
        PyObject *v = PyDict_GetItemWithError(dict, name);
        if (v != NULL) {
            Py_INCREF(v);
            return v;
        }
        if (PyErr_Occurred())
            return NULL;
    }
    return PyObject_GetAttr(batch, name);
}

/* Reads the step's columns into `in` (new references, NULL for an allowed None), the
 * group into `*group`; the number of rows in *n. */
static int
step_inputs(PyObject *batch, PyObject *dict, PyObject *group_obj, int g, PyArrayObject **in,
            PyArrayObject **group, npy_intp *n)
{
    for (int i = 0; i < INPUTS; i++) {
        PyObject *obj = batch_attr(batch, dict, input_names[i]);
        if (obj == NULL)
            return -1;
        if (obj == Py_None && INPUT_SPEC[i].optional) {
            Py_DECREF(obj);
            continue;
        }
        int nd = INPUT_SPEC[i].matrix ? 2 : 1;
        in[i] = as_input(obj, INPUT_SPEC[i].type, nd);
        Py_DECREF(obj);
        if (in[i] == NULL)
            return -1;
        if (i == 0)
            *n = PyArray_DIM(in[0], 0);
        if (PyArray_DIM(in[i], 0) != *n || (nd == 2 && PyArray_DIM(in[i], 1) != g)) {
            PyErr_Format(PyExc_ValueError, "%s: shape does not match the step",
                         INPUT_SPEC[i].name);
            return -1;
        }
    }
    if ((*group = as_input(group_obj, NPY_INT64, 1)) == NULL)
        return -1;
    if (PyArray_DIM(*group, 0) != *n) {
        PyErr_SetString(PyExc_ValueError, "group: shape does not match the step");
        return -1;
    }
    return 0;
}

/* A step scalar of the batch as a long long. */
static int
batch_int(PyObject *batch, PyObject *dict, PyObject *name, long long *out)
{
    PyObject *v = batch_attr(batch, dict, name);
    if (v == NULL)
        return -1;
    *out = PyLong_AsLongLong(v);
    Py_DECREF(v);
    return *out == -1 && PyErr_Occurred() ? -1 : 0;
}

/* An int64 array of the first n entries of `src`. */
static PyObject *
int64_list(const int64_t *src, npy_intp n)
{
    PyObject *a = PyArray_SimpleNew(1, &n, NPY_INT64);
    if (a != NULL && n)
        memcpy(PyArray_DATA((PyArrayObject *)a), src, (size_t)n * sizeof(int64_t));
    return a;
}

static PyObject *walk(Pool *self, long long steps, long long fct, long long rank, int one_rank,
                      PyArrayObject **in, PyArrayObject *group, npy_intp n);

PyDoc_STRVAR(advance_doc,
"advance(batch, group, steps, one_rank)\n"
"    -> (gathers, done, opened, skipped, n_opened, n_skipped)\n\n"
"Walks one validated step (a StepBatch with draft tokens; group: int64 per row) over\n"
"the bound pool: `steps` is the walker's step count (a block's SEEN), `one_rank`\n"
"whether every step so far came from this rank. gathers: None, or (rows, offsets,\n"
"tokens) int64 arrays, the first mismatches of sampled blocks whose target\n"
"log-probabilities `finish` takes; done: the blocks to settle; opened, skipped: bool\n"
"per row, the trimmed rows that opened a block and those no walk can follow. The\n"
"pool must have a free id for every row, the settled buffers room for the whole\n"
"pool, and row_of an entry (-1) for every slot in the step.");

static PyObject *
Pool_advance(Pool *self, PyObject *args)
{
    PyObject *batch, *group_obj;
    long long steps;
    int one_rank;
    if (!PyArg_ParseTuple(args, "OOLp:advance", &batch, &group_obj, &steps, &one_rank))
        return NULL;
    if (self->ngather || self->ndone) {
        PyErr_SetString(PyExc_ValueError,
                        "advance: the previous step was neither finished nor abandoned");
        return NULL;
    }
    /* the instance dictionary, where the batch has one */
    PyObject *dict = PyObject_GetAttr(batch, name_dict);
    if (dict != NULL && !PyDict_Check(dict))
        Py_CLEAR(dict);
    if (dict == NULL && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError))
            return NULL;
        PyErr_Clear();
    }
    long long fct, rank;
    PyArrayObject *in[INPUTS] = {NULL}, *group = NULL;
    npy_intp n = 0;
    PyObject *result = NULL;
    if (batch_int(batch, dict, name_forward_ct, &fct) == 0
        && batch_int(batch, dict, name_rank, &rank) == 0
        && step_inputs(batch, dict, group_obj, self->g, in, &group, &n) == 0)
        result = walk(self, steps, fct, rank, one_rank, in, group, n);
    for (int i = 0; i < INPUTS; i++)
        Py_XDECREF(in[i]);
    Py_XDECREF(group);
    Py_XDECREF(dict);
    return result;
}

/* One step's columns and pending work, shared by the passes of `walk`. */
typedef struct {
    Pool *pool;
    const int64_t *P, *A, *S, *BON, *D;
    const double *BLP, *TLP;
    PyObject **RID;
    double steps;
    int64_t ngather, ndone;
} Step;

/* Marks block b done (censored or resolved) for `finish`. */
static inline void
done_block(Step *st, int64_t b, int censored)
{
    st->pool->done[st->ndone] = b;
    st->pool->done_c[st->ndone++] = (int8_t)censored;
}

/* Walks block b along row r: compares its tail with the tokens the row commits, from
 * the block's next position on; the first mismatch of a sampled block becomes a gather. */
static void
walk_block(Step *st, int64_t b, int64_t r)
{
    Pool *self = st->pool;
    const int g = self->g;
    double *f = self->blk + b * FIELDS;
    const int64_t *PT = self->ptail + b * g, *D = st->D + r * g;
    int sampled = f[GREEDY] == 0.0;
    int64_t a = st->A[r];
    /* tail j sits at offset j + shift of the row; positions are doubles, as in the state
       row, so no prefix however large overflows */
    double shift = f[OPEN_PREFIX] - (double)st->P[r];
    int j = (int)f[NEXT];
    int resolved = 0;
    for (; j < g; j++) {
        double at = j + shift;
        if (at > (double)a)
            break; /* not committed in this step: the block stays open */
        /* below 0 cannot happen for a request that continues; kept in bounds */
        int64_t off = at < 0.0 ? 0 : (int64_t)at;
        int64_t tok = off < a ? D[off] : st->BON[r];
        int64_t want = PT[j];
        if (tok != want) {
            resolved = 1; /* the first mismatch, committed in this step */
            if (sampled) { /* at most one per block: room for the whole pool */
                int64_t k = st->ngather++;
                self->gb[k] = b;
                self->grow[k] = r;
                self->goff[k] = off;
                self->gtok[k] = want;
            }
            break;
        }
        if (sampled) {
            double p = off < a ? (st->TLP ? st->TLP[r * g + off] : NAN) : st->BLP[r];
            evaluate(f, p, self->pq[b * g + j], j);
        }
    }
    if (j >= g)
        resolved = 1;
    f[NEXT] = j;
    f[EXPECT] = (double)st->P[r] + (double)(a + 1);
    f[SEEN] = st->steps;
    if (resolved)
        done_block(st, b, 0);
}

/* away[rid] = b, the head of the rid's chain; -1 with an exception set where it fails. */
static int
set_head(Pool *self, PyObject *rid, int64_t b)
{
    PyObject *id = PyLong_FromLongLong(b);
    if (id == NULL)
        return -1;
    int rc = PyDict_SetItem(self->away, rid, id);
    Py_DECREF(id);
    return rc;
}

/* Parks block b, whose request left its slot, at the head of its rid's chain in `away`;
 * -1 with an exception set, nothing changed, where the dictionary fails. */
static int
park(Pool *self, int64_t b)
{
    PyObject *rid = self->prid[b];
    PyObject *head = PyDict_GetItemWithError(self->away, rid);
    if (head == NULL && PyErr_Occurred())
        return -1;
    long long link = head == NULL ? -1 : PyLong_AsLongLong(head);
    if (link == -1 && PyErr_Occurred())
        return -1;
    if (set_head(self, rid, b) < 0)
        return -1;
    double *f = self->blk + b * FIELDS;
    f[LINK] = (double)link;
    f[AWAY] = 1.0;
    return 0;
}

/* Takes back the parked blocks of row r's rid that belong to this rank: each walks on
 * from row r where the row continues its prefix, else is censored (tokens are missing).
 * The chain keeps the other ranks' blocks. -1 with an exception set where the chain is
 * broken or the dictionary fails, before any block changed. */
static int
take_back(Step *st, int64_t r, double rank_d)
{
    Pool *self = st->pool;
    PyObject *rid = st->RID[r];
    PyObject *head = PyDict_GetItemWithError(self->away, rid);
    if (head == NULL)
        return PyErr_Occurred() ? -1 : 0;
    long long b = PyLong_AsLongLong(head);
    if (b == -1 && PyErr_Occurred())
        return -1;
    /* the chain, checked: the rank's blocks first in `chain`, the others after them */
    int64_t *chain = self->chain, taken = 0, kept = 0;
    for (int64_t hops = 0; b >= 0; hops++) {
        if (b >= self->cap || !self->live[b] || self->blk[b * FIELDS + AWAY] != 1.0
            || hops >= self->cap) {
            PyErr_Format(PyExc_ValueError, "parked block id %lld outside the pool or not parked",
                         b);
            return -1;
        }
        const double *f = self->blk + b * FIELDS;
        if (f[RANK] == rank_d)
            chain[taken++] = b;
        else
            chain[self->cap - 1 - kept++] = b; /* from the end: the two never meet */
        b = (long long)f[LINK];
    }
    if (taken == 0)
        return 0;
    if (kept == 0) {
        if (PyDict_DelItem(self->away, rid) < 0)
            return -1;
    }
    else {
        if (set_head(self, rid, chain[self->cap - 1]) < 0)
            return -1;
        for (int64_t k = 0; k < kept; k++)
            self->blk[chain[self->cap - 1 - k] * FIELDS + LINK] =
                k + 1 < kept ? (double)chain[self->cap - 2 - k] : -1.0;
    }
    for (int64_t k = 0; k < taken; k++) {
        double *f = self->blk + chain[k] * FIELDS;
        f[AWAY] = 0.0;
        if ((double)st->P[r] == f[EXPECT]) {
            f[POOL] = (double)st->S[r];
            walk_block(st, chain[k], r);
        }
        else
            done_block(st, chain[k], 1);
    }
    return 0;
}

static PyObject *
walk(Pool *self, long long steps, long long fct, long long rank, int one_rank,
     PyArrayObject **in, PyArrayObject *group, npy_intp n)
{
    const int g = self->g, assume = self->assume;
    const npy_intp cap = self->cap, slots = self->slots;
    int64_t nfree, scount;
    if (read_counters(self, &nfree, &scount) < 0)
        return NULL;
    if (nfree < n || self->room - scount < cap) {
        PyErr_SetString(PyExc_ValueError,
                        "the pool needs a free id per row and the settled buffers room for it");
        return NULL;
    }
#define IN_DATA(i) (in[i] ? PyArray_DATA(in[i]) : NULL)
    const int64_t *P = IN_DATA(IN_PREFIX), *A = IN_DATA(IN_ACC), *VL = IN_DATA(IN_VLEN);
    const int64_t *S = IN_DATA(IN_SLOT), *BON = IN_DATA(IN_BONUS), *D = IN_DATA(IN_DRAFT);
    const int64_t *GRP = PyArray_DATA(group);
    const int8_t *GR = IN_DATA(IN_GREEDY);
    const double *BLP = IN_DATA(IN_BLP), *TLP = IN_DATA(IN_TLP), *DLP = IN_DATA(IN_DLP);
    const double *CONF = IN_DATA(IN_CONF);
    PyObject **RID = IN_DATA(IN_RID);
#undef IN_DATA
    const int logprobs = TLP != NULL && DLP != NULL;
    for (npy_intp r = 0; r < n; r++) {
        const int64_t w = window_of(VL, r);
        if (S[r] < -1 || S[r] >= slots || A[r] < 0 || A[r] > w || w > g) {
            PyErr_SetString(PyExc_ValueError, "step rows outside the walker's bounds");
            return NULL;
        }
    }
    PyObject *opened_obj = PyArray_SimpleNew(1, &n, NPY_BOOL);
    PyObject *skipped_obj = opened_obj ? PyArray_SimpleNew(1, &n, NPY_BOOL) : NULL;
    if (skipped_obj == NULL) {
        Py_XDECREF(opened_obj);
        return NULL;
    }
    char *OPENED = PyArray_DATA((PyArrayObject *)opened_obj);
    char *SKIPPED = PyArray_DATA((PyArrayObject *)skipped_obj);
    memset(OPENED, 0, (size_t)n);
    memset(SKIPPED, 0, (size_t)n);
    double *BLK = self->blk, *PQ = self->pq, *PCONF = self->pconf;
    int64_t *PT = self->ptail, *FREE = self->freestack, *ROW = self->row_of;
    PyObject **PRID = self->prid;
    char *LIVE = self->live;
    int64_t n_opened = 0, n_skipped = 0;
    const double rank_d = (double)rank;
    Step st = {self, P, A, S, BON, D, BLP, TLP, RID, (double)steps, 0, 0};
    self->fct = (double)fct;
    self->ngather = self->ndone = 0;

    /* a row without a slot (-1: not recorded) is found by its rid alone; from here on
       every way out goes through `restore` */
    for (npy_intp r = 0; r < n; r++)
        if (S[r] >= 0)
            ROW[S[r]] = r;

    int failed = 0;
    /* the open blocks this step continues through their slot, in id order; one whose
       request is not there is parked (a rid-less one waits in its slot, or is censored by
       another request there) */
    for (int64_t b = 0; b < cap && !failed; b++) {
        if (!LIVE[b])
            continue;
        double *f = BLK + b * FIELDS;
        if (f[AWAY] != 0.0 || (!one_rank && f[RANK] != rank_d))
            continue;
        int keyed = PRID[b] != Py_None;
        int64_t sl = (int64_t)f[POOL];
        int64_t r = sl >= 0 && sl < slots ? ROW[sl] : -1;
        int same = 0;
        if (r >= 0 && (same = PyObject_RichCompareBool(RID[r], PRID[b], Py_EQ)) < 0) {
            failed = 1;
            break;
        }
        if (!same && keyed) {
            if (park(self, b) < 0)
                failed = 1;
        }
        else if (r < 0)
            continue; /* rid-less, its slot empty: it waits there */
        else if (!same || (double)P[r] != f[EXPECT])
            done_block(&st, b, 1);
        else
            walk_block(&st, b, r);
    }
    /* the parked blocks whose rid this step shows: one dictionary lookup per row */
    if (!failed && PyDict_GET_SIZE(self->away))
        for (npy_intp r = 0; r < n; r++)
            if (RID[r] != Py_None && take_back(&st, r, rank_d) < 0) {
                failed = 1;
                break;
            }
    /* a block per trimmed row that can be walked, walked from its own step */
    for (npy_intp r = 0; r < n && !failed; r++) {
        int flag = GR[r];
        if (flag < 0 && assume >= 0)
            flag = assume;
        const int64_t w = window_of(VL, r);
        int trimmed = A[r] == w && w < g;
        int can_walk = flag == 1 || (flag == 0 && logprobs);
        OPENED[r] = trimmed && can_walk;
        SKIPPED[r] = trimmed && !can_walk;
        n_opened += OPENED[r];
        n_skipped += SKIPPED[r];
        if (!OPENED[r])
            continue;
        int64_t b = FREE[nfree - 1]; /* nfree >= n: checked above */
        if (b < 0 || b >= cap || LIVE[b]) {
            PyErr_Format(PyExc_ValueError,
                         "free-slot id %lld on the stack is outside the pool of %lld "
                         "or in use",
                         (long long)b, (long long)cap);
            failed = 1;
            break;
        }
        nfree--;
        double *f = BLK + b * FIELDS;
        for (int k = 0; k < FIELDS; k++)
            f[k] = 0.0;
        f[OPEN_PREFIX] = (double)P[r];
        f[WINDOW] = f[NEXT] = (double)window_of(VL, r);
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
        walk_block(&st, b, r);
    }
    /* restore: the slot map is all -1 again, the counter says which ids are in use */
    for (npy_intp r = 0; r < n; r++)
        if (S[r] >= 0)
            ROW[S[r]] = -1;
    self->counters[C_NFREE] = nfree;
    int64_t ngather = self->ngather = st.ngather;
    int64_t ndone = self->ndone = st.ndone;
    if (failed) {
        /* the blocks found done leave the pool, censored; the exception stays */
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        abandon_pending(self);
        PyErr_Restore(type, value, tb);
        Py_DECREF(opened_obj);
        Py_DECREF(skipped_obj);
        return NULL;
    }
    PyObject *gathers = Py_None;
    Py_INCREF(Py_None);
    if (ngather) {
        Py_DECREF(gathers);
        gathers = Py_BuildValue("(NNN)", int64_list(self->grow, ngather),
                                int64_list(self->goff, ngather), int64_list(self->gtok, ngather));
        if (gathers == NULL) {
            Py_DECREF(opened_obj);
            Py_DECREF(skipped_obj);
            return NULL;
        }
    }
    return Py_BuildValue("(NLNNLL)", gathers, (long long)ndone, opened_obj, skipped_obj,
                         (long long)n_opened, (long long)n_skipped);
}

PyDoc_STRVAR(finish_doc,
"finish(log_p) -> None\n\n"
"Ends the step `advance` walked: log_p holds the target's log-probability of each\n"
"gathered token (float64, one per gather; NaN: unknown, the walk stops before it), or\n"
"is None when there was no gather; then the done blocks settle into the settled\n"
"buffers, in order, and their ids go back on the free stack.");

static PyObject *
Pool_finish(Pool *self, PyObject *args)
{
    PyObject *logp_obj;
    if (!PyArg_ParseTuple(args, "O:finish", &logp_obj))
        return NULL;
    const int g = self->g;
    int64_t nfree, scount;
    if (read_counters(self, &nfree, &scount) < 0 || check_pending(self, nfree, scount) < 0)
        return NULL;
    const double *GLP = NULL;
    if (logp_obj != Py_None) {
        GLP = (const double *)checked(logp_obj, "log_p", NPY_FLOAT64, -1, -1, 0);
        if (GLP == NULL)
            return NULL;
        if (PyArray_DIM((PyArrayObject *)logp_obj, 0) < self->ngather) {
            PyErr_SetString(PyExc_ValueError, "log_p: fewer values than gathers");
            return NULL;
        }
    }
    if (GLP) {
        for (int64_t i = 0; i < self->ngather; i++) {
            double *f = self->blk + self->gb[i] * FIELDS;
            int j = (int)f[NEXT];
            double p = GLP[i];
            if (isnan(p) || j < 0 || j >= g)
                continue; /* unknown: the walk reached the mismatch but cannot count it */
            evaluate(f, p, self->pq[self->gb[i] * g + j], j);
            f[NEXT] = j + 1;
        }
    }
    for (int64_t i = 0; i < self->ndone; i++)
        settle(self, self->done[i], &nfree, &scount, self->done_c[i]);
    self->counters[C_NFREE] = nfree;
    self->counters[C_SETTLED] = scount;
    self->ngather = self->ndone = 0;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(abandon_doc,
"abandon() -> None\n\n"
"Ends the step `advance` walked without its gathers (the gather failed): the done\n"
"blocks settle as censored. Until `finish` or this ends a step, `advance` refuses\n"
"the next.");

static PyObject *
Pool_abandon(Pool *self, PyObject *Py_UNUSED(ignored))
{
    abandon_pending(self);
    if (PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef Pool_methods[] = {
    {"advance", (PyCFunction)Pool_advance, METH_VARARGS, advance_doc},
    {"finish", (PyCFunction)Pool_finish, METH_VARARGS, finish_doc},
    {"abandon", (PyCFunction)Pool_abandon, METH_NOARGS, abandon_doc},
    {NULL, NULL, 0, NULL},
};

PyDoc_STRVAR(Pool_doc,
"Pool(gamma, assume_greedy, counters, blk, live, prid, ptail, pq, pconf, freestack,\n"
"     row_of, set_f, set_rid, set_conf, away)\n\n"
"The walker's arrays, bound once (each checked for dtype, shape and layout, and held):\n"
"counters int64 [2] (free ids, settled blocks), the pool of `cap` blocks (blk float64\n"
"[cap, FIELDS], live bool, prid object, ptail int64 [cap, gamma], pq and pconf float64\n"
"[cap, gamma], freestack int64 [cap]: ids [0, free) are free), row_of int64 [slots]\n"
"(all -1), and the settled buffers (set_f float64 [rows, FIELDS], set_rid object,\n"
"set_conf float64 [rows, gamma]), and away, the dict of parked blocks (rid -> the\n"
"first id of a chain through the LINK field). Bind a new one when an array is replaced.");

static PyTypeObject PoolType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "dspark_obs.estimator._tailwalk.Pool",
    .tp_basicsize = sizeof(Pool),
    .tp_dealloc = (destructor)Pool_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = Pool_doc,
    .tp_methods = Pool_methods,
    .tp_new = Pool_new,
};

/* ---- the arithmetic, for the tests ---------------------------------------------- */

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
    const double *lp, *lq, *window, *cum;
    const char *counted;
    if ((lp = (double *)checked(o[0], "log_p", NPY_FLOAT64, k, n, 0)) == NULL
        || (lq = (double *)checked(o[1], "log_q", NPY_FLOAT64, k, n, 0)) == NULL
        || (counted = checked(o[2], "counted", NPY_BOOL, k, n, 0)) == NULL
        || (window = (double *)checked(o[3], "window", NPY_FLOAT64, k, -1, 0)) == NULL
        || (cum = (double *)checked(o[4], "cum", NPY_FLOAT64, k, -1, 0)) == NULL)
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
    for (npy_intp r = 0; r < k; r++) {
        double f[FIELDS] = {0};
        f[WINDOW] = window[r];
        f[CUM] = cum[r];
        for (npy_intp j = 0; j < n; j++)
            if (counted[r * n + j])
                evaluate(f, lp[r * n + j], lq[r * n + j], (int)j);
        oc[r] = f[CUM];
        olo[r] = f[LO_EXTRA];
        ovar[r] = f[VAR_TERMS];
    }
    return Py_BuildValue("(NNN)", out[0], out[1], out[2]);
}

static PyMethodDef methods[] = {
    {"running_sums", running_sums, METH_VARARGS,
     "The per-position arithmetic over [k, n] log-probabilities (see interval.running_sums)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_tailwalk", "The tail walker's per-step pass, compiled.", -1, methods,
};

PyMODINIT_FUNC
PyInit__tailwalk(void)
{
    import_array();
    for (int i = 0; i < INPUTS; i++)
        if ((input_names[i] = PyUnicode_InternFromString(INPUT_SPEC[i].name)) == NULL)
            return NULL;
    if ((name_forward_ct = PyUnicode_InternFromString("forward_ct")) == NULL
        || (name_rank = PyUnicode_InternFromString("rank")) == NULL
        || (name_dict = PyUnicode_InternFromString("__dict__")) == NULL)
        return NULL;
    if (PyType_Ready(&PoolType) < 0)
        return NULL;
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
    Py_INCREF(&PoolType);
    if (PyModule_AddObject(m, "Pool", (PyObject *)&PoolType) < 0
        || PyModule_AddIntConstant(m, "N_FREE", C_NFREE) < 0
        || PyModule_AddIntConstant(m, "N_SETTLED", C_SETTLED) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
