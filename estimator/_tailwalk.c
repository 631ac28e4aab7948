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

/* The dimensions of `obj`, an array of `nd` dimensions, into `dims`; -1 with TypeError (not
 * an array) or ValueError (another number of dimensions) set. The arrays' other properties
 * are `checked`'s, once their sizes are known. */
static int
array_dims(PyObject *obj, const char *name, int nd, npy_intp *dims)
{
    if (!PyArray_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s: expected a numpy array", name);
        return -1;
    }
    if (PyArray_NDIM((PyArrayObject *)obj) != nd) {
        PyErr_Format(PyExc_ValueError, "%s: expected %d dimensions", name, nd);
        return -1;
    }
    for (int i = 0; i < nd; i++)
        dims[i] = PyArray_DIM((PyArrayObject *)obj, i);
    return 0;
}

/* Gamma within 1..64, the most positions a block has (the kernels' fixed buffers); -1
 * with ValueError set, naming the kernel. */
static int
gamma_ok(npy_intp g, const char *kernel)
{
    if (g >= 1 && g <= 64)
        return 0;
    PyErr_Format(PyExc_ValueError, "%s: gamma outside 1..64", kernel);
    return -1;
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
    if (gamma_ok(g, "Pool") < 0)
        return NULL;
    if (assume < -1 || assume > 1) {
        PyErr_SetString(PyExc_ValueError, "Pool: assume_greedy not -1, 0, 1");
        return NULL;
    }
    /* the sizes come from blk, row_of and set_f; `checked` holds every array to them */
    npy_intp blk_dims[2], slots, set_dims[2];
    if (array_dims(o[B_BLK], "blk", 2, blk_dims) < 0 || array_dims(o[B_ROW_OF], "row_of", 1, &slots) < 0
        || array_dims(o[B_SET_F], "set_f", 2, set_dims) < 0)
        return NULL;
    const npy_intp cap = blk_dims[0], room = set_dims[0];
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

/* A filter of the parked rids' hashes, a bit per hash modulo its size. Most rows' rids are
 * not parked, and keys that compare equal hash equal, so a row whose rid's bit is clear has
 * no chain: its bit costs less than the dictionary lookup that would miss (the rids' hashes
 * are cached in them). Rebuilt each step, as the walker's Python side parks and unparks
 * blocks too; the parked rids are few. */
enum { HASH_WORDS = 64 };

static int
parked_hashes(PyObject *away, uint64_t *filter)
{
    memset(filter, 0, HASH_WORDS * sizeof(uint64_t));
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    while (PyDict_Next(away, &pos, &key, &value)) {
        const Py_hash_t h = PyObject_Hash(key);
        if (h == -1)
            return -1;
        filter[((uint64_t)h >> 6) % HASH_WORDS] |= 1ull << ((uint64_t)h & 63);
    }
    return 0;
}

static inline int
hash_admitted(const uint64_t *filter, Py_hash_t h)
{
    return (filter[((uint64_t)h >> 6) % HASH_WORDS] >> ((uint64_t)h & 63)) & 1;
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
    /* the parked blocks whose rid this step shows: a dictionary lookup for each row whose
       rid's hash the parked rids' hashes admit (`parked_hashes`) */
    if (!failed && PyDict_GET_SIZE(self->away)) {
        uint64_t filter[HASH_WORDS];
        failed = parked_hashes(self->away, filter) < 0;
        for (npy_intp r = 0; r < n && !failed; r++) {
            if (RID[r] == Py_None)
                continue;
            const Py_hash_t h = PyObject_Hash(RID[r]);
            if (h == -1 || (hash_admitted(filter, h) && take_back(&st, r, rank_d) < 0))
                failed = 1;
        }
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

/* ---- the estimator's batch kernels ----------------------------------------------- */

/*
 * Every 32 steps the estimator checks its extrapolation on the batch's known positions,
 * teaches the batch to its models, and extrapolates the walks that ended. In numpy each
 * of those is a few dozen whole-array passes over about 8,000 rows (or 3,000 blocks) of
 * gamma positions; here each is one loop. The numpy forms stay (population.py,
 * confidence_rates.py, extrapolation_check.py, interval.py) and give the same numbers to
 * the last bit: the same operations on the same values, every sum taken in the order
 * numpy takes it (tests/test_estimator_kernels.py). Nothing transcendental is computed
 * here, since numpy's exp, log and tanh differ from the C library's in the last bits:
 * the acceptance ratios are exponentiated by numpy (known_log_ratios writes only a log of
 * 0 as its ratio, 1), and the smooth model's rates are numpy's (blend_cells only finds the
 * cells of the ended walks that take them).
 */

/* numpy's clip of a double: NaN stays NaN, and each bound is taken as numpy's maximum and
 * minimum take it. */
static inline double
clip(double x, double lo, double hi)
{
    if (!isnan(x))
        x = x > lo ? x : lo;
    if (!isnan(x))
        x = x < hi ? x : hi;
    return x;
}

/* A column of a queued step (the tuple the estimator queues: group, window, accepted,
 * confidence, greedy, target and draft log-probabilities, forward_ct) as an array of the
 * type and dimensions (a new reference; None gives NULL with no exception where allowed). */
static PyArrayObject *
step_column(PyObject *row, int item, int type, int nd, int optional)
{
    PyObject *obj = PyTuple_GET_ITEM(row, item);
    if (obj == Py_None) {
        if (!optional)
            PyErr_Format(PyExc_TypeError, "queued step: item %d is None", item);
        return NULL;
    }
    return as_input(obj, type, nd);
}

/* The queued steps' columns, row counts and row offsets. */
typedef struct {
    Py_ssize_t steps;
    npy_intp rows;
    PyArrayObject **col; /* [steps * STEP_COLUMNS] */
    npy_intp *start;     /* [steps + 1] */
} Queued;

enum { Q_GROUP, Q_WINDOW, Q_ACCEPTED, Q_CONF, Q_GREEDY, Q_TLP, Q_DLP, STEP_COLUMNS };
static const struct {
    int type, nd, optional;
} Q_SPEC[STEP_COLUMNS] = {
    {NPY_INT64, 1, 0}, {NPY_INT64, 1, 0}, {NPY_INT64, 1, 0}, {NPY_FLOAT64, 2, 1},
    {NPY_INT8, 1, 0},  {NPY_FLOAT64, 2, 1}, {NPY_FLOAT64, 2, 1},
};

static void
queued_free(Queued *q)
{
    if (q->col != NULL)
        for (Py_ssize_t i = 0; i < q->steps * STEP_COLUMNS; i++)
            Py_XDECREF(q->col[i]);
    PyMem_Free(q->col);
    PyMem_Free(q->start);
    q->col = NULL;
    q->start = NULL;
}

/* Reads the columns `want` (a bit per column) of a list of queued steps, each checked for
 * shape against the step's rows and gamma; -1 with an exception set. */
static int
queued_read(PyObject *list, int g, unsigned want, Queued *q)
{
    q->col = NULL;
    q->start = NULL;
    if (!PyList_Check(list)) {
        PyErr_SetString(PyExc_TypeError, "queued steps: expected a list of tuples");
        return -1;
    }
    q->steps = PyList_GET_SIZE(list);
    q->rows = 0;
    size_t n = q->steps > 0 ? (size_t)q->steps : 1;
    q->col = PyMem_Calloc(n * STEP_COLUMNS, sizeof(PyArrayObject *));
    q->start = PyMem_Malloc((n + 1) * sizeof(npy_intp));
    if (q->col == NULL || q->start == NULL) {
        queued_free(q);
        PyErr_NoMemory();
        return -1;
    }
    q->start[0] = 0;
    for (Py_ssize_t s = 0; s < q->steps; s++) {
        PyObject *row = PyList_GET_ITEM(list, s);
        if (!PyTuple_Check(row) || PyTuple_GET_SIZE(row) < STEP_COLUMNS) {
            PyErr_SetString(PyExc_TypeError, "queued step: expected a tuple of its columns");
            queued_free(q);
            return -1;
        }
        PyArrayObject **col = q->col + s * STEP_COLUMNS;
        npy_intp rows = -1;
        for (int i = 0; i < STEP_COLUMNS; i++) {
            if (!(want >> i & 1))
                continue;
            col[i] = step_column(row, i, Q_SPEC[i].type, Q_SPEC[i].nd, Q_SPEC[i].optional);
            if (col[i] == NULL) {
                if (PyErr_Occurred()) {
                    queued_free(q);
                    return -1;
                }
                continue;
            }
            if (rows < 0)
                rows = PyArray_DIM(col[i], 0);
            if (PyArray_DIM(col[i], 0) != rows
                || (Q_SPEC[i].nd == 2 && PyArray_DIM(col[i], 1) != g)) {
                PyErr_Format(PyExc_ValueError,
                             "queued step %zd: item %d does not match the step's rows and "
                             "gamma",
                             s, i);
                queued_free(q);
                return -1;
            }
        }
        q->rows += rows < 0 ? 0 : rows;
        q->start[s + 1] = q->rows;
    }
    return 0;
}

#define QCOL(q, s, i) ((q)->col[(s) * STEP_COLUMNS + (i)])
#define QDATA(q, s, i) (QCOL(q, s, i) ? PyArray_DATA(QCOL(q, s, i)) : NULL)
#define QROWS(q, s) ((q)->start[(s) + 1] - (q)->start[s])

/* The data of a C-ordered array of this type and `size` elements in all (writable: and
 * writable), or NULL with an exception set. */
static char *
flat_array(PyObject *obj, const char *name, int type, npy_intp size, int writable)
{
    PyArrayObject *a = (PyArrayObject *)obj;
    if (!PyArray_Check(obj) || PyArray_TYPE(a) != type || !PyArray_IS_C_CONTIGUOUS(a)
        || PyArray_SIZE(a) != size || (writable && !PyArray_ISWRITEABLE(a))) {
        PyErr_Format(PyExc_ValueError, "%s: wrong dtype, size or layout%s", name,
                     writable ? ", or not writable" : "");
        return NULL;
    }
    return PyArray_DATA(a);
}

/* A new zeroed array of these dimensions. */
static PyObject *
zeros(int nd, npy_intp *dims, int type)
{
    return PyArray_ZEROS(nd, dims, type, 0);
}

/* A bin of [0, 1] in `bins` equal bins, as numpy's (c * bins).astype(int64) clipped to the
 * last bin gives it; kept in range whatever c is (validate_steps refuses the others). */
static inline int
bin_of(double c, int bins)
{
    double x = c * bins;
    return x > 0.0 ? (x < bins - 1 ? (int)x : bins - 1) : 0;
}

/* The known positions of a queued step: the verified drafts (j < window) of its sampled
 * rows (greedy 0) whose acceptance ratio both log-probabilities give (not NaN). Every kernel
 * walks them in this order, row by row; ratios[k] is the k-th one's. */
typedef struct {
    const double *t, *d;
    const int64_t *w;
    const int8_t *greedy;
    npy_intp r, rows;
    int j, g;
} KnownPositions;

static void
known_start(KnownPositions *it, Queued *q, Py_ssize_t s, int g)
{
    it->t = QDATA(q, s, Q_TLP);
    it->d = QDATA(q, s, Q_DLP);
    it->w = QDATA(q, s, Q_WINDOW);
    it->greedy = QDATA(q, s, Q_GREEDY);
    it->rows = it->t && it->d ? QROWS(q, s) : 0;
    it->r = 0;
    it->j = -1;
    it->g = g;
}

/* The step's next known position (row *r, position *j); 0 once there is none. */
static inline int
known_next(KnownPositions *it, npy_intp *r, int *j)
{
    for (; it->r < it->rows; it->r++, it->j = -1) {
        if (it->greedy[it->r] != 0)
            continue;
        const int64_t wr = it->w[it->r] < it->g ? it->w[it->r] : it->g;
        const double *t = it->t + it->r * it->g, *d = it->d + it->r * it->g;
        while (++it->j < wr)
            if (!isnan(t[it->j] - d[it->j])) {
                *r = it->r;
                *j = it->j;
                return 1;
            }
    }
    return 0;
}

/* The population model's tables as the kernels read them: hazard float64 and data bool
 * [groups, gamma, bins + 1] (the pooled stratum last), and where asked at_risk int64 of the
 * same shape. */
typedef struct {
    npy_intp groups, width; /* width: bins + 1 */
    int g;
    const double *hazard;
    const char *data;
    const int64_t *at_risk;
} Tables;

/* Reads the tables (at_risk: NULL where not wanted); -1 with an exception set. */
static int
tables_of(PyObject *hz, PyObject *dt, PyObject *ar, Tables *t)
{
    npy_intp dims[3];
    if (array_dims(hz, "hazard", 3, dims) < 0 || gamma_ok(dims[1], "hazard") < 0)
        return -1;
    if (dims[2] < 2 || dims[2] > 255) {
        PyErr_SetString(PyExc_ValueError, "hazard: bins outside 1..254");
        return -1;
    }
    t->groups = dims[0];
    t->g = (int)dims[1];
    t->width = dims[2];
    const npy_intp size = dims[0] * dims[1] * dims[2];
    t->at_risk = NULL;
    if ((t->hazard = (double *)flat_array(hz, "hazard", NPY_FLOAT64, size, 0)) == NULL
        || (t->data = flat_array(dt, "data", NPY_BOOL, size, 0)) == NULL
        || (ar != NULL
            && (t->at_risk = (int64_t *)flat_array(ar, "at_risk", NPY_INT64, size, 0)) == NULL))
        return -1;
    return 0;
}

enum { KNOWN_COLUMNS = 1u << Q_GROUP | 1u << Q_WINDOW | 1u << Q_GREEDY | 1u << Q_TLP | 1u << Q_DLP };

/* What is wrong with a queued step's rows (flags), checked over every row as
 * HazardModel.update checks them: windows within 0..gamma, accepted drafts within
 * 0..window, group ids within 0..groups - 1; the largest group id goes into *top. */
enum { BAD_WINDOW = 1, BAD_ACCEPTED = 2, BAD_GROUP = 4 };

static int
step_rows_bad(Queued *q, Py_ssize_t s, int g, npy_intp groups, int64_t *top)
{
    const int64_t *grp = QDATA(q, s, Q_GROUP), *w = QDATA(q, s, Q_WINDOW),
                  *a = QDATA(q, s, Q_ACCEPTED);
    int bad_w = 0, bad_a = 0, bad_g = 0;
    int64_t t = *top;
    for (npy_intp r = 0; r < QROWS(q, s); r++) {
        bad_w |= (w[r] < 0) | (w[r] > g);
        bad_a |= (a[r] < 0) | (a[r] > w[r]);
        bad_g |= (grp[r] < 0) | (grp[r] >= groups);
        t = grp[r] > t ? grp[r] : t;
    }
    *top = t;
    return (bad_w ? BAD_WINDOW : 0) | (bad_a ? BAD_ACCEPTED : 0) | (bad_g ? BAD_GROUP : 0);
}

/* ValueError for the first of `bad`'s flags, in HazardModel.update's words (`bounded`:
 * whether the groups had an upper bound); -1. */
static int
refuse_rows(int bad, int bounded)
{
    PyErr_SetString(PyExc_ValueError,
                    bad & BAD_WINDOW     ? "window outside 0..gamma"
                    : bad & BAD_ACCEPTED ? "accepted outside 0..window"
                    : bounded            ? "group id outside the model's groups"
                                         : "group ids must be >= 0");
    return -1;
}

PyDoc_STRVAR(validate_steps_doc,
"validate_steps(steps, gamma) -> int\n\n"
"Refuses queued steps (population.QueuedStep tuples) whose rows are outside the models'\n"
"bounds, with HazardModel.update's ValueError (windows within 0..gamma, accepted drafts\n"
"within 0..window, group ids >= 0, confidence within [0, 1]); returns the largest group\n"
"id (-1: no rows). The kernels below stay in bounds whatever they are given, but only\n"
"what this passes gives numpy's numbers.");

static PyObject *
validate_steps(PyObject *self, PyObject *args)
{
    PyObject *list;
    int g;
    if (!PyArg_ParseTuple(args, "Oi:validate_steps", &list, &g) || gamma_ok(g, "validate_steps") < 0)
        return NULL;
    Queued q;
    if (queued_read(list, g, 1u << Q_GROUP | 1u << Q_WINDOW | 1u << Q_ACCEPTED | 1u << Q_CONF, &q)
        < 0)
        return NULL;
    /* each condition over every row, in the order HazardModel.update checks them */
    int bad = 0, bad_c = 0;
    int64_t top = -1;
    for (Py_ssize_t s = 0; s < q.steps; s++) {
        bad |= step_rows_bad(&q, s, g, INT64_MAX, &top);
        const double *conf = QDATA(&q, s, Q_CONF);
        if (conf == NULL)
            continue;
        /* NaN (no confidence) passes; a branch-free loop the compiler vectorises */
        const npy_intp m = QROWS(&q, s) * g;
        for (npy_intp i = 0; i < m; i++)
            bad_c |= (conf[i] < 0.0) | (conf[i] > 1.0);
    }
    queued_free(&q);
    if (bad) {
        refuse_rows(bad, 0);
        return NULL;
    }
    if (bad_c) {
        PyErr_SetString(PyExc_ValueError, "confidence outside [0, 1]");
        return NULL;
    }
    return PyLong_FromLongLong(top);
}

PyDoc_STRVAR(known_log_ratios_doc,
"known_log_ratios(steps, gamma)\n"
"    -> (float64 [known], int64 [steps + 1], int64 [logs], int64 [known])\n\n"
"The acceptance ratios of the queued steps' known positions, in row order, where each\n"
"step's begin, which of them are still logs, and each one's row and position in its step\n"
"(row * 64 + position, as smooth_sums takes them): a log ratio\n"
"(interval.acceptance_log_ratio) of 0 (p >= q, three in four on P2's traffic) is written\n"
"as its ratio 1 (exp(0) is 1 in every libm), a negative one as itself, its index in\n"
"`logs`; the caller exponentiates those with numpy's exp, as the numpy form takes every\n"
"ratio: what the check and the smooth model take.");

static PyObject *
known_log_ratios(PyObject *self, PyObject *args)
{
    PyObject *list;
    int g;
    if (!PyArg_ParseTuple(args, "Oi:known_log_ratios", &list, &g)
        || gamma_ok(g, "known_log_ratios") < 0)
        return NULL;
    Queued q;
    if (queued_read(list, g, KNOWN_COLUMNS, &q) < 0)
        return NULL;
    /* one pass into room for every position, then shrunk to the known ones */
    npy_intp room = q.rows * g, nsteps = q.steps + 1, r;
    int j;
    KnownPositions it;
    PyObject *out = PyArray_SimpleNew(1, &room, NPY_FLOAT64);
    PyObject *offsets = out ? PyArray_SimpleNew(1, &nsteps, NPY_INT64) : NULL;
    PyObject *logs = offsets ? PyArray_SimpleNew(1, &room, NPY_INT64) : NULL;
    PyObject *where = logs ? PyArray_SimpleNew(1, &room, NPY_INT64) : NULL;
    if (where == NULL) {
        Py_XDECREF(out);
        Py_XDECREF(offsets);
        Py_XDECREF(logs);
        queued_free(&q);
        return NULL;
    }
    double *o = PyArray_DATA((PyArrayObject *)out);
    int64_t *off = PyArray_DATA((PyArrayObject *)offsets);
    int64_t *lg = PyArray_DATA((PyArrayObject *)logs);
    int64_t *at = PyArray_DATA((PyArrayObject *)where);
    npy_intp k = 0, m = 0;
    for (Py_ssize_t s = 0; s < q.steps; s++) {
        off[s] = k;
        for (known_start(&it, &q, s, g); known_next(&it, &r, &j);) {
            /* numpy's clip to [LOG_RATIO_FLOOR, 0] (a NaN never gets here) */
            const double x = it.t[r * g + j] - it.d[r * g + j];
            at[k] = (int64_t)r * 64 + j;
            if (x < 0.0) {
                lg[m++] = k;
                o[k++] = x < -1e300 ? -1e300 : x;
            }
            else
                o[k++] = 1.0;
        }
    }
    off[q.steps] = k;
    queued_free(&q);
    PyArray_Dims shape = {&k, 1}, log_shape = {&m, 1};
    PyObject *resized = PyArray_Resize((PyArrayObject *)out, &shape, 0, NPY_CORDER);
    PyObject *log_resized =
        resized ? PyArray_Resize((PyArrayObject *)logs, &log_shape, 0, NPY_CORDER) : NULL;
    PyObject *at_resized =
        log_resized ? PyArray_Resize((PyArrayObject *)where, &shape, 0, NPY_CORDER) : NULL;
    Py_XDECREF(resized);
    Py_XDECREF(log_resized);
    Py_XDECREF(at_resized);
    if (at_resized == NULL) {
        Py_DECREF(out);
        Py_DECREF(offsets);
        Py_DECREF(logs);
        Py_DECREF(where);
        return NULL;
    }
    return Py_BuildValue("(NNNN)", out, offsets, logs, where);
}

/* The known ratios and where each step's begin, checked against the steps. */
static int
known_ratios_of(PyObject *ratio_obj, PyObject *offsets_obj, Queued *q, const double **ratio,
                const int64_t **offsets)
{
    npy_intp n = PyArray_Check(ratio_obj) ? PyArray_SIZE((PyArrayObject *)ratio_obj) : 0;
    if ((*ratio = (double *)checked(ratio_obj, "ratios", NPY_FLOAT64, -1, -1, 0)) == NULL
        || (*offsets = (int64_t *)checked(offsets_obj, "offsets", NPY_INT64, q->steps + 1, -1, 0))
               == NULL)
        return -1;
    for (Py_ssize_t s = 0; s < q->steps; s++)
        if ((*offsets)[s] < 0 || (*offsets)[s] > (*offsets)[s + 1]
            || (*offsets)[s + 1] > n) {
            PyErr_SetString(PyExc_ValueError, "offsets: not where the steps' ratios begin");
            return -1;
        }
    return 0;
}

/* A step's rows' groups within [0, groups); -1 with ValueError set. */
static int
groups_within(Queued *q, Py_ssize_t s, npy_intp groups)
{
    const int64_t *grp = QDATA(q, s, Q_GROUP);
    int bad = 0;
    for (npy_intp r = 0; r < QROWS(q, s); r++)
        bad |= (grp[r] < 0) | (grp[r] >= groups);
    if (bad)
        PyErr_SetString(PyExc_ValueError, "group id outside the model's groups");
    return bad ? -1 : 0;
}

PyDoc_STRVAR(check_sums_doc,
"check_sums(steps, checked, ratios, offsets, hazard, data, at_risk, calibration_bins)\n"
"    -> (sums, (group, position, confidence, rate, ratio))\n\n"
"ExtrapolationCheck._check over the known positions of the queued steps that `checked`\n"
"(bool per step) marks, whose acceptance ratios (float64) `ratios[offsets[s]:]` holds\n"
"(known_log_ratios' order); hazard, data and at_risk [groups, gamma, bins + 1] are the\n"
"population model's tables. Returns the sums to add, float64 [groups, 2, 5,\n"
"calibration_bins] (identified cells, then the others), and the known positions in\n"
"unidentified cells with a confidence, for the blend's moments.");

static PyObject *
check_sums(PyObject *self, PyObject *args)
{
    PyObject *list, *checked_obj, *ratio_obj, *offsets_obj, *hz, *dt, *ar;
    int cbins;
    if (!PyArg_ParseTuple(args, "OOOOOOOi:check_sums", &list, &checked_obj, &ratio_obj,
                          &offsets_obj, &hz, &dt, &ar, &cbins))
        return NULL;
    if (cbins < 1) {
        PyErr_SetString(PyExc_ValueError, "check_sums: calibration_bins < 1");
        return NULL;
    }
    Tables t;
    if (tables_of(hz, dt, ar, &t) < 0)
        return NULL;
    const npy_intp G = t.groups, W = t.width;
    const int g = t.g;
    const double *hazard = t.hazard, *ratio;
    const char *data = t.data, *checked_steps;
    const int64_t *at_risk = t.at_risk, *offsets;
    Queued q;
    if (queued_read(list, g, KNOWN_COLUMNS | 1u << Q_CONF, &q) < 0)
        return NULL;
    PyObject *sums_out = NULL, *cand[5] = {NULL}, *result = NULL;
    double *cbuf = NULL;
    if ((checked_steps = checked(checked_obj, "checked", NPY_BOOL, q.steps, -1, 0)) == NULL
        || known_ratios_of(ratio_obj, offsets_obj, &q, &ratio, &offsets) < 0)
        goto done;
    npy_intp dims[4] = {G, 2, 5, cbins};
    if ((sums_out = zeros(4, dims, NPY_FLOAT64)) == NULL)
        goto done;
    double *sums = PyArray_DATA((PyArrayObject *)sums_out);
    npy_intp ncand = 0, room = 0;
    for (Py_ssize_t s = 0; s < q.steps; s++)
        if (checked_steps[s])
            room += offsets[s + 1] - offsets[s];
    if ((cbuf = PyMem_Malloc((size_t)(room > 0 ? room : 1) * 5 * sizeof(double))) == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    const int bins = (int)W - 1;
    /* per known position: its cell's rate and flag, in the calibration bins of the rate,
       a count and the sums of the rate, the ratio, its square and the rate's standard
       error, added in row order as calibration_sums adds them */
    for (Py_ssize_t s = 0; s < q.steps; s++) {
        if (!checked_steps[s])
            continue;
        if (groups_within(&q, s, G) < 0)
            goto done;
        const int64_t *grp = QDATA(&q, s, Q_GROUP);
        const double *conf = QDATA(&q, s, Q_CONF);
        npy_intp k = offsets[s], r;
        int j;
        KnownPositions it;
        for (known_start(&it, &q, s, g); known_next(&it, &r, &j);) {
            if (k >= offsets[s + 1]) {
                PyErr_SetString(PyExc_ValueError, "ratios: fewer than the step's known positions");
                goto done;
            }
            const double x = ratio[k++];
            const double c = conf ? conf[r * g + j] : NAN;
            const npy_intp cell = (grp[r] * g + j) * W + (isnan(c) ? bins : bin_of(c, bins));
            const double h = hazard[cell], rate = 1.0 - h;
            const int ident = data[cell] != 0;
            double se = 0.0;
            if (ident)
                se = sqrt(h * (1.0 - h) / (double)(at_risk[cell] > 1 ? at_risk[cell] : 1));
            double *sum = sums + (grp[r] * 2 + !ident) * 5 * cbins + bin_of(rate, cbins);
            sum[0] += 1.0;
            sum[cbins] += rate;
            sum[2 * cbins] += x;
            sum[3 * cbins] += x * x;
            sum[4 * cbins] += se;
            if (!ident && !isnan(c)) {
                double *e = cbuf + 5 * ncand++;
                e[0] = (double)grp[r];
                e[1] = j;
                e[2] = c;
                e[3] = rate;
                e[4] = x;
            }
        }
    }
    for (int k = 0; k < 5; k++)
        if ((cand[k] = PyArray_SimpleNew(1, &ncand, k < 2 ? NPY_INT64 : NPY_FLOAT64)) == NULL)
            goto done;
    for (npy_intp i = 0; i < ncand; i++) {
        const double *e = cbuf + 5 * i;
        ((int64_t *)PyArray_DATA((PyArrayObject *)cand[0]))[i] = (int64_t)e[0];
        ((int64_t *)PyArray_DATA((PyArrayObject *)cand[1]))[i] = (int64_t)e[1];
        for (int k = 2; k < 5; k++)
            ((double *)PyArray_DATA((PyArrayObject *)cand[k]))[i] = e[k];
    }
    result = Py_BuildValue("(N(NNNNN))", sums_out, cand[0], cand[1], cand[2], cand[3], cand[4]);
    sums_out = NULL;
    for (int k = 0; k < 5; k++)
        cand[k] = NULL;
done:
    Py_XDECREF(sums_out);
    for (int k = 0; k < 5; k++)
        Py_XDECREF(cand[k]);
    PyMem_Free(cbuf);
    queued_free(&q);
    return result;
}

PyDoc_STRVAR(smooth_sums_doc,
"smooth_sums(steps, ratios, offsets, where, groups, gamma, bins) -> (sums, known)\n\n"
"ConfidenceRates.update's sums over the queued steps' known positions with a confidence\n"
"(ratios, offsets and where, each position's row * 64 + position, as known_log_ratios\n"
"gives them; a position outside its step is refused): float64 [groups, 2, gamma, bins], a\n"
"count and the sum of the ratio per (group, position, confidence bin) cell, added in row\n"
"order; known: how many positions they hold.");

static PyObject *
smooth_sums(PyObject *self, PyObject *args)
{
    PyObject *list, *ratio_obj, *offsets_obj, *where_obj;
    Py_ssize_t groups;
    int g, sbins;
    if (!PyArg_ParseTuple(args, "OOOOnii:smooth_sums", &list, &ratio_obj, &offsets_obj,
                          &where_obj, &groups, &g, &sbins))
        return NULL;
    if (gamma_ok(g, "smooth_sums") < 0)
        return NULL;
    if (sbins < 1 || groups < 0) {
        PyErr_SetString(PyExc_ValueError, "smooth_sums: groups or bins out of range");
        return NULL;
    }
    Queued q;
    if (queued_read(list, g, KNOWN_COLUMNS | 1u << Q_CONF, &q) < 0)
        return NULL;
    PyObject *sums_out = NULL, *result = NULL;
    const double *ratio;
    const int64_t *offsets, *where;
    if (known_ratios_of(ratio_obj, offsets_obj, &q, &ratio, &offsets) < 0
        || (where = (int64_t *)checked(where_obj, "where", NPY_INT64,
                                       PyArray_SIZE((PyArrayObject *)ratio_obj), -1, 0))
               == NULL)
        goto done;
    npy_intp dims[4] = {groups, 2, g, sbins};
    if ((sums_out = zeros(4, dims, NPY_FLOAT64)) == NULL)
        goto done;
    double *sums = PyArray_DATA((PyArrayObject *)sums_out);
    long long known = 0;
    for (Py_ssize_t s = 0; s < q.steps; s++) {
        const int64_t *grp = QDATA(&q, s, Q_GROUP);
        const double *conf = QDATA(&q, s, Q_CONF);
        if (conf == NULL)
            continue;
        if (groups_within(&q, s, groups) < 0)
            goto done;
        const npy_intp rows = QROWS(&q, s);
        for (npy_intp k = offsets[s]; k < offsets[s + 1]; k++) {
            const int64_t r = where[k] >> 6, j = where[k] & 63;
            if (where[k] < 0 || r >= rows || j >= g) {
                PyErr_SetString(PyExc_ValueError, "where: a position outside its step");
                goto done;
            }
            const double x = ratio[k], c = conf[r * g + j];
            if (!isnan(c)) {
                double *sum = sums + (grp[r] * 2 * g + j) * sbins + bin_of(c, sbins);
                sum[0] += 1.0;
                sum[g * sbins] += x;
                known++;
            }
        }
    }
    result = Py_BuildValue("(NL)", sums_out, known);
    sums_out = NULL;
done:
    Py_XDECREF(sums_out);
    queued_free(&q);
    return result;
}

/* A cell's part of a chunk's counts: blocks, blocks at risk, the sum of their confidence. */
typedef struct {
    int64_t blocks, at_risk;
    double conf;
} CellPart;

PyDoc_STRVAR(count_blocks_doc,
"count_blocks(steps, bins, chunk, n0, d0, n, d, ccnt, csum, ring, head, fill) -> None\n\n"
"HazardModel.update over the queued steps' rows, `chunk` rows at a time as it adds them:\n"
"the counts (n0, d0 int64 [groups, gamma]; n, d, ccnt int64 and csum float64 [groups,\n"
"gamma, bins]) take each chunk's blocks by reach and by rejected position, and per\n"
"stratified cell its blocks, those at risk in it, those rejected in it and the sum of\n"
"their confidence; each row's bin codes go into its group's reservoir (ring uint8\n"
"[groups, size, gamma], head and fill int64 [groups]) one row after another.");

static PyObject *
count_blocks(PyObject *self, PyObject *args)
{
    PyObject *list, *o[9];
    int bins;
    Py_ssize_t chunk;
    if (!PyArg_ParseTuple(args, "OinOOOOOOOOO:count_blocks", &list, &bins, &chunk, &o[0], &o[1],
                          &o[2], &o[3], &o[4], &o[5], &o[6], &o[7], &o[8]))
        return NULL;
    npy_intp n0_dims[2], ring_dims[3];
    if (array_dims(o[0], "n0", 2, n0_dims) < 0 || array_dims(o[6], "ring", 3, ring_dims) < 0
        || gamma_ok(n0_dims[1], "count_blocks") < 0)
        return NULL;
    if (bins < 1 || bins > 254 || chunk < 1 || ring_dims[1] < 1) {
        PyErr_SetString(PyExc_ValueError, "count_blocks: bins, chunk or ring out of range");
        return NULL;
    }
    const npy_intp G = n0_dims[0], R = ring_dims[1];
    const int g = (int)n0_dims[1];
    const npy_intp strat = G * g * bins;
    int64_t *n0, *d0, *cn, *cd, *ccnt, *head, *fill;
    double *csum;
    uint8_t *ring;
    if ((n0 = (int64_t *)flat_array(o[0], "n0", NPY_INT64, G * g, 1)) == NULL
        || (d0 = (int64_t *)flat_array(o[1], "d0", NPY_INT64, G * g, 1)) == NULL
        || (cn = (int64_t *)flat_array(o[2], "n", NPY_INT64, strat, 1)) == NULL
        || (cd = (int64_t *)flat_array(o[3], "d", NPY_INT64, strat, 1)) == NULL
        || (ccnt = (int64_t *)flat_array(o[4], "ccnt", NPY_INT64, strat, 1)) == NULL
        || (csum = (double *)flat_array(o[5], "csum", NPY_FLOAT64, strat, 1)) == NULL
        || (ring = (uint8_t *)flat_array(o[6], "ring", NPY_UINT8, G * R * g, 1)) == NULL
        || (head = (int64_t *)flat_array(o[7], "head", NPY_INT64, G, 1)) == NULL
        || (fill = (int64_t *)flat_array(o[8], "fill", NPY_INT64, G, 1)) == NULL)
        return NULL;
    for (npy_intp k = 0; k < G; k++)
        if (head[k] < 0 || head[k] >= R || fill[k] < 0 || fill[k] > R) {
            PyErr_SetString(PyExc_ValueError, "count_blocks: a reservoir's head or fill is off");
            return NULL;
        }
    Queued q;
    if (queued_read(list, g, 1u << Q_GROUP | 1u << Q_WINDOW | 1u << Q_ACCEPTED | 1u << Q_CONF, &q)
        < 0)
        return NULL;
    PyObject *result = NULL;
    int64_t *hist = NULL;
    /* the rows index the counts: refused outside them, whoever validated them before */
    int64_t top = -1;
    for (Py_ssize_t s = 0; s < q.steps; s++) {
        const int bad = step_rows_bad(&q, s, g, G, &top);
        if (bad && refuse_rows(bad, 1) < 0)
            goto done;
    }
    /* per chunk: blocks by reach and by rejected position per group, rejections per cell,
       and each cell's CellPart */
    const size_t nhist = (size_t)(2 * G * (g + 1) + strat);
    if ((hist = PyMem_Malloc(nhist * sizeof(int64_t) + (size_t)strat * sizeof(CellPart)))
        == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    int64_t *stop = hist + G * (g + 1), *pd = stop + G * (g + 1);
    CellPart *part = (CellPart *)(pd + strat);
    Py_ssize_t s = 0;
    for (npy_intp lo = 0; lo < q.rows; lo += chunk) {
        const npy_intp hi = lo + chunk < q.rows ? lo + chunk : q.rows;
        memset(hist, 0, nhist * sizeof(int64_t));
        memset(part, 0, (size_t)strat * sizeof(CellPart));
        /* the chunk's rows step by step, each step's columns read once */
        for (npy_intp row = lo; row < hi; s++) {
            if (q.start[s + 1] <= row)
                continue; /* a step of no rows, or one the previous chunk finished */
            const npy_intp first = row - q.start[s];
            const npy_intp end = (q.start[s + 1] < hi ? q.start[s + 1] : hi) - q.start[s];
            const int64_t *GRP = QDATA(&q, s, Q_GROUP), *W = QDATA(&q, s, Q_WINDOW),
                          *A = QDATA(&q, s, Q_ACCEPTED);
            const double *conf = QDATA(&q, s, Q_CONF);
            for (npy_intp r = first; r < end; r++) {
                const int64_t grp = GRP[r], w = W[r], a = A[r];
                /* the reservoir keeps the group's newest rows: this one at its head */
                uint8_t *code = ring + (grp * R + head[grp]) * g;
                head[grp] = head[grp] + 1 < R ? head[grp] + 1 : 0;
                fill[grp] += fill[grp] < R;
                const int64_t reach = a + 1 < w ? a + 1 : w; /* at risk at 0..reach - 1 */
                hist[grp * (g + 1) + reach]++;
                if (a < w)
                    stop[grp * (g + 1) + a]++;
                if (conf == NULL) {
                    memset(code, bins, (size_t)g);
                    continue;
                }
                const double *c = conf + r * g;
                CellPart *cells = part + grp * g * bins;
                for (int j = 0; j < g; j++, cells += bins) {
                    if (isnan(c[j])) {
                        code[j] = (uint8_t)bins; /* the pooled stratum */
                        continue;
                    }
                    const int b = bin_of(c[j], bins);
                    code[j] = (uint8_t)b;
                    cells[b].blocks++;
                    cells[b].at_risk += j < reach;
                    cells[b].conf += c[j];
                }
                if (a < w && code[a] != bins)
                    pd[(grp * g + a) * bins + code[a]]++;
            }
            row += end - first;
            if (row < q.start[s + 1])
                break; /* the chunk ends inside this step: the next chunk goes on in it */
        }
        for (npy_intp k = 0; k < G; k++) {
            int64_t past = 0; /* blocks whose reach is past position j - 1 */
            for (int j = g; j >= 1; j--) {
                past += hist[k * (g + 1) + j];
                n0[k * g + j - 1] += past;
            }
            for (int j = 0; j < g; j++)
                d0[k * g + j] += stop[k * (g + 1) + j];
        }
        for (npy_intp c = 0; c < strat; c++) {
            cn[c] += part[c].at_risk;
            cd[c] += pd[c];
            ccnt[c] += part[c].blocks;
            csum[c] += part[c].conf;
        }
    }
    result = Py_None;
    Py_INCREF(result);
done:
    PyMem_Free(hist);
    queued_free(&q);
    return result;
}

PyDoc_STRVAR(cell_rates_doc,
"cell_rates(hazard, data, groups, confidence, start=None) -> (rates, identified)\n\n"
"HazardModel.acceptance from its tables (hazard float64 and data bool [groups, gamma,\n"
"bins + 1]): each block's acceptance rate 1 - hazard and from-data flag at its own cell\n"
"per position (confidence float64 [k, gamma], NaN or None: the pooled stratum), as\n"
"[k, gamma] views of position-major arrays, the layout numpy's form gives. With start\n"
"(int64 [k]), only the positions from each block's start on are looked up, the earlier\n"
"ones left NaN and unidentified: what the ended walks' extrapolation reads.");

static PyObject *
cell_rates(PyObject *self, PyObject *args)
{
    PyObject *hz, *dt, *grp_obj, *conf_obj, *start_obj = Py_None;
    Tables t;
    if (!PyArg_ParseTuple(args, "OOOO|O:cell_rates", &hz, &dt, &grp_obj, &conf_obj, &start_obj)
        || tables_of(hz, dt, NULL, &t) < 0)
        return NULL;
    const npy_intp G = t.groups, g = t.g, W = t.width;
    const double *hazard = t.hazard;
    const char *data = t.data;
    PyArrayObject *grp = as_input(grp_obj, NPY_INT64, 1), *conf = NULL;
    if (grp == NULL)
        return NULL;
    const npy_intp k = PyArray_DIM(grp, 0);
    PyObject *rates = NULL, *ident = NULL, *result = NULL;
    if (conf_obj != Py_None) {
        if ((conf = as_input(conf_obj, NPY_FLOAT64, 2)) == NULL)
            goto done;
        if (PyArray_DIM(conf, 0) != k || PyArray_DIM(conf, 1) != g) {
            PyErr_Format(PyExc_ValueError, "confidence has shape (%zd, %zd), expected (%zd, %zd)",
                         (Py_ssize_t)PyArray_DIM(conf, 0), (Py_ssize_t)PyArray_DIM(conf, 1),
                         (Py_ssize_t)k, (Py_ssize_t)g);
            goto done;
        }
    }
    const int64_t *gid = PyArray_DATA(grp), *start = NULL;
    const double *c = conf ? PyArray_DATA(conf) : NULL;
    if (start_obj != Py_None
        && (start = (int64_t *)checked(start_obj, "start", NPY_INT64, k, -1, 0)) == NULL)
        goto done;
    for (npy_intp b = 0; b < k; b++) {
        if (gid[b] < 0 || gid[b] >= G) {
            PyErr_SetString(PyExc_ValueError, gid[b] < 0 ? "group ids must be >= 0"
                                                         : "group id outside the model's groups");
            goto done;
        }
        for (npy_intp j = 0; c && j < g; j++)
            if (c[b * g + j] < 0.0 || c[b * g + j] > 1.0) {
                PyErr_SetString(PyExc_ValueError, "confidence outside [0, 1]");
                goto done;
            }
    }
    npy_intp dims[2] = {g, k};
    if ((rates = PyArray_SimpleNew(2, dims, NPY_FLOAT64)) == NULL
        || (ident = PyArray_SimpleNew(2, dims, NPY_BOOL)) == NULL)
        goto done;
    double *r = PyArray_DATA((PyArrayObject *)rates);
    char *id = PyArray_DATA((PyArrayObject *)ident);
    const int bins = (int)W - 1;
    for (npy_intp b = 0; b < k; b++) {
        const npy_intp from = start == NULL ? 0 : start[b] < 0 ? 0 : start[b] < g ? start[b] : g;
        for (npy_intp j = 0; j < from; j++) {
            r[j * k + b] = NAN;
            id[j * k + b] = 0;
        }
        for (npy_intp j = from; j < g; j++) {
            const double x = c ? c[b * g + j] : NAN;
            npy_intp cell = (gid[b] * g + j) * W + (isnan(x) ? bins : bin_of(x, bins));
            r[j * k + b] = 1.0 - hazard[cell];
            id[j * k + b] = data[cell];
        }
    }
    result = Py_BuildValue("(NN)", PyArray_Transpose((PyArrayObject *)rates, NULL),
                           PyArray_Transpose((PyArrayObject *)ident, NULL));
done:
    Py_XDECREF(rates);
    Py_XDECREF(ident);
    Py_XDECREF(grp);
    Py_XDECREF(conf);
    return result;
}

PyDoc_STRVAR(extra_parts_doc,
"extra_parts(rates, identified, margin, start) -> float64 [4, k]\n\n"
"interval.extra_parts over position-major rates (float64 [n, k]) and identified flags\n"
"(bool [n, k]), margin float64 [k], start int64 [k]: the running products of each\n"
"block's three sets of rates from `start` on, summed position by position in order, and\n"
"the part of the first on unidentified positions.");

static PyObject *
extra_parts(PyObject *self, PyObject *args)
{
    PyObject *o[4];
    if (!PyArg_ParseTuple(args, "OOOO:extra_parts", &o[0], &o[1], &o[2], &o[3]))
        return NULL;
    npy_intp dims_in[2];
    if (array_dims(o[0], "rates", 2, dims_in) < 0)
        return NULL;
    const npy_intp n = dims_in[0], k = dims_in[1];
    const double *rates, *margin;
    const char *ident;
    const int64_t *start;
    if ((rates = (double *)checked(o[0], "rates", NPY_FLOAT64, n, k, 0)) == NULL
        || (ident = checked(o[1], "identified", NPY_BOOL, n, k, 0)) == NULL
        || (margin = (double *)checked(o[2], "margin", NPY_FLOAT64, k, -1, 0)) == NULL
        || (start = (int64_t *)checked(o[3], "start", NPY_INT64, k, -1, 0)) == NULL)
        return NULL;
    /* here, where the compiler sees the bound of the loops below */
    if (n > 64) {
        PyErr_SetString(PyExc_ValueError, "extra_parts: more positions than a block has");
        return NULL;
    }
    npy_intp dims[2] = {4, k};
    PyObject *out = PyArray_SimpleNew(2, dims, NPY_FLOAT64);
    if (out == NULL)
        return NULL;
    double *o4 = PyArray_DATA((PyArrayObject *)out);
    for (npy_intp b = 0; b < k; b++) {
        const double m = margin[b];
        double run[3] = {1.0, 1.0, 1.0}, sum[4] = {0.0, 0.0, 0.0, 0.0};
        for (npy_intp j = 0; j < n; j++) {
            const double r = rates[j * k + b];
            const int id = ident[j * k + b] != 0;
            double t[3] = {1.0, 1.0, 1.0};
            if (j >= start[b]) {
                t[0] = clip(r, 0.0, 1.0);
                t[1] = id ? clip(r - m, 0.0, 1.0) : 0.0;
                t[2] = id ? clip(r + m, 0.0, 1.0) : 1.0;
            }
            for (int i = 0; i < 3; i++) {
                run[i] = j ? t[i] * run[i] : t[i];
                /* positions before `start` hold 0 once the products are taken */
                double term = j >= start[b] ? run[i] : 0.0;
                sum[i] = j ? sum[i] + term : term;
            }
            double unident = j >= start[b] && !id ? run[0] : 0.0;
            sum[3] = j ? sum[3] + unident : unident;
        }
        for (int i = 0; i < 4; i++)
            o4[i * k + b] = sum[i];
    }
    return out;
}

PyDoc_STRVAR(blend_cells_doc,
"blend_cells(identified, confidence, start) -> (rows int64 [m], positions int64 [m])\n\n"
"The cells of ended walks whose rate ExtrapolationCheck blends with the smooth model's:\n"
"unidentified (identified: bool position-major [n, k], as cell_rates gives it), with a\n"
"confidence (float64 [k, n], not NaN) and at or past the block's start (int64 [k]), in\n"
"row-major order.");

static PyObject *
blend_cells(PyObject *self, PyObject *args)
{
    PyObject *o[3];
    if (!PyArg_ParseTuple(args, "OOO:blend_cells", &o[0], &o[1], &o[2]))
        return NULL;
    npy_intp dims_in[2];
    if (array_dims(o[0], "identified", 2, dims_in) < 0)
        return NULL;
    const npy_intp n = dims_in[0], k = dims_in[1];
    const char *ident;
    const double *conf;
    const int64_t *start;
    if ((ident = checked(o[0], "identified", NPY_BOOL, n, k, 0)) == NULL
        || (conf = (double *)checked(o[1], "confidence", NPY_FLOAT64, k, n, 0)) == NULL
        || (start = (int64_t *)checked(o[2], "start", NPY_INT64, k, -1, 0)) == NULL)
        return NULL;
    npy_intp room = n * k, m = 0;
    PyObject *rows = PyArray_SimpleNew(1, &room, NPY_INT64);
    PyObject *positions = rows ? PyArray_SimpleNew(1, &room, NPY_INT64) : NULL;
    if (positions == NULL) {
        Py_XDECREF(rows);
        return NULL;
    }
    int64_t *R = PyArray_DATA((PyArrayObject *)rows), *J = PyArray_DATA((PyArrayObject *)positions);
    for (npy_intp b = 0; b < k; b++)
        for (npy_intp j = start[b] > 0 ? start[b] : 0; j < n; j++)
            if (!ident[j * k + b] && !isnan(conf[b * n + j])) {
                R[m] = b;
                J[m++] = j;
            }
    PyArray_Dims shape = {&m, 1};
    PyObject *r1 = PyArray_Resize((PyArrayObject *)rows, &shape, 0, NPY_CORDER);
    PyObject *r2 = r1 ? PyArray_Resize((PyArrayObject *)positions, &shape, 0, NPY_CORDER) : NULL;
    Py_XDECREF(r1);
    Py_XDECREF(r2);
    if (r2 == NULL) {
        Py_DECREF(rows);
        Py_DECREF(positions);
        return NULL;
    }
    return Py_BuildValue("(NN)", rows, positions);
}

/* ---- the estimator's folds ------------------------------------------------------- */

PyDoc_STRVAR(window_sums_doc,
"window_sums(steps, item) -> int64 [steps]\n\n"
"Per queued step (a tuple), the sum of its int64 array at `item`.");

static PyObject *
window_sums(PyObject *self, PyObject *args)
{
    PyObject *list;
    int item;
    if (!PyArg_ParseTuple(args, "O!i:window_sums", &PyList_Type, &list, &item))
        return NULL;
    npy_intp n = PyList_GET_SIZE(list);
    PyObject *out = PyArray_SimpleNew(1, &n, NPY_INT64);
    if (out == NULL)
        return NULL;
    int64_t *o = PyArray_DATA((PyArrayObject *)out);
    for (npy_intp s = 0; s < n; s++) {
        PyObject *row = PyList_GET_ITEM(list, s);
        if (!PyTuple_Check(row) || item < 0 || item >= PyTuple_GET_SIZE(row)) {
            PyErr_SetString(PyExc_TypeError, "window_sums: expected tuples holding the item");
            Py_DECREF(out);
            return NULL;
        }
        PyArrayObject *w = as_input(PyTuple_GET_ITEM(row, item), NPY_INT64, 1);
        if (w == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        const int64_t *x = PyArray_DATA(w);
        int64_t sum = 0;
        for (npy_intp r = 0; r < PyArray_DIM(w, 0); r++)
            sum += x[r];
        o[s] = sum;
        Py_DECREF(w);
    }
    return out;
}

/* One queued step's int64 and bool columns `items` (tuple items), each of `rows` rows
 * (the first sets it); new references in `col`, -1 with an exception set. */
static int
tuple_columns(PyObject *row, const int *items, const int *types, int count, PyArrayObject **col,
              npy_intp *rows)
{
    if (!PyTuple_Check(row)) {
        PyErr_SetString(PyExc_TypeError, "queued step: expected a tuple");
        return -1;
    }
    for (int i = 0; i < count; i++) {
        if (items[i] >= PyTuple_GET_SIZE(row)) {
            PyErr_SetString(PyExc_TypeError, "queued step: too few items");
            return -1;
        }
        if ((col[i] = as_input(PyTuple_GET_ITEM(row, items[i]), types[i], 1)) == NULL)
            return -1;
        if (i == 0)
            *rows = PyArray_DIM(col[0], 0);
        else if (PyArray_DIM(col[i], 0) != *rows) {
            PyErr_SetString(PyExc_ValueError, "queued step: columns of different lengths");
            return -1;
        }
    }
    return 0;
}

PyDoc_STRVAR(count_rows_doc,
"count_rows(counts, gamma, groups) -> float64 [4, groups]\n\n"
"The estimator's row counts over its queued steps (tuples: group, window, accepted,\n"
"opened, skipped) per group: rows whose ceiling is observed (rejected inside the window,\n"
"or the window is the whole block), the sum of their accepted drafts, rows that opened\n"
"a walk, rows no walk can follow.");

static PyObject *
count_rows(PyObject *self, PyObject *args)
{
    PyObject *list;
    int g;
    Py_ssize_t groups;
    if (!PyArg_ParseTuple(args, "O!in:count_rows", &PyList_Type, &list, &g, &groups))
        return NULL;
    if (groups < 0) {
        PyErr_SetString(PyExc_ValueError, "count_rows: groups < 0");
        return NULL;
    }
    npy_intp dims[2] = {4, groups};
    PyObject *out = zeros(2, dims, NPY_FLOAT64);
    if (out == NULL)
        return NULL;
    double *o = PyArray_DATA((PyArrayObject *)out);
    static const int items[5] = {0, 1, 2, 3, 4};
    static const int types[5] = {NPY_INT64, NPY_INT64, NPY_INT64, NPY_BOOL, NPY_BOOL};
    for (Py_ssize_t s = 0; s < PyList_GET_SIZE(list); s++) {
        PyArrayObject *col[5] = {NULL};
        npy_intp rows = 0;
        int rc = tuple_columns(PyList_GET_ITEM(list, s), items, types, 5, col, &rows);
        if (rc == 0) {
            const int64_t *grp = PyArray_DATA(col[0]), *w = PyArray_DATA(col[1]),
                          *a = PyArray_DATA(col[2]);
            const char *opened = PyArray_DATA(col[3]), *skipped = PyArray_DATA(col[4]);
            for (npy_intp r = 0; r < rows; r++) {
                if (grp[r] < 0 || grp[r] >= groups) {
                    PyErr_SetString(PyExc_ValueError, "count_rows: group id outside the groups");
                    rc = -1;
                    break;
                }
                double *cell = o + grp[r];
                if (a[r] < w[r] || w[r] == g) {
                    cell[0] += 1.0;
                    cell[groups] += (double)a[r];
                }
                cell[2 * groups] += opened[r] != 0;
                cell[3 * groups] += skipped[r] != 0;
            }
        }
        for (int i = 0; i < 5; i++)
            Py_XDECREF(col[i]);
        if (rc < 0) {
            Py_DECREF(out);
            return NULL;
        }
    }
    return out;
}

static PyObject *name_correct_drafts, *name_cap_trim;

PyDoc_STRVAR(trim_rows_doc,
"trim_rows(steps, gamma, groups, own, static, priced, modes, forward_ct)\n"
"    -> (sums, first) or None\n\n"
"TrimCostFold's sums over its queued steps (tuples: batch, group, window, opened) per\n"
"group, float64 [6, groups] in TRIM_COLUMNS' order: committed tokens, each priced row's\n"
"share of its step's own and static seconds (own, static: float64 per step, added in\n"
"row order), and static's committed lo, point and hi (a bonus token per row plus its\n"
"ceiling: exact where the step's mode (modes: int8 MODE_CODE per step) reveals it or\n"
"the row was not trimmed, the window and gamma around a walked tail); only the steps\n"
"`priced` (bool per step) marks count. `first`: per group the first forward_ct priced\n"
"(inf: none). None where a priced trimmed row opened no walk: the population model\n"
"prices its tail, which the numpy form computes.");

static PyObject *
trim_rows(PyObject *self, PyObject *args)
{
    PyObject *list, *own_obj, *static_obj, *priced_obj, *modes_obj, *fct_obj;
    int g;
    Py_ssize_t groups;
    if (!PyArg_ParseTuple(args, "O!inOOOOO:trim_rows", &PyList_Type, &list, &g, &groups, &own_obj,
                          &static_obj, &priced_obj, &modes_obj, &fct_obj))
        return NULL;
    const npy_intp steps = PyList_GET_SIZE(list);
    const double *own, *stat;
    const char *priced;
    const int8_t *modes;
    const int64_t *fct;
    if (groups < 0
        || (own = (double *)checked(own_obj, "own", NPY_FLOAT64, steps, -1, 0)) == NULL
        || (stat = (double *)checked(static_obj, "static", NPY_FLOAT64, steps, -1, 0)) == NULL
        || (priced = checked(priced_obj, "priced", NPY_BOOL, steps, -1, 0)) == NULL
        || (modes = (int8_t *)checked(modes_obj, "modes", NPY_INT8, steps, -1, 0)) == NULL
        || (fct = (int64_t *)checked(fct_obj, "forward_ct", NPY_INT64, steps, -1, 0)) == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "trim_rows: groups < 0");
        return NULL;
    }
    npy_intp dims[2] = {6, groups}, gdims[1] = {groups};
    PyObject *sums_out = zeros(2, dims, NPY_FLOAT64), *first_out = NULL, *result = NULL;
    if (sums_out == NULL || (first_out = PyArray_SimpleNew(1, gdims, NPY_FLOAT64)) == NULL) {
        Py_XDECREF(sums_out);
        return NULL;
    }
    double *o = PyArray_DATA((PyArrayObject *)sums_out), *first = PyArray_DATA((PyArrayObject *)first_out);
    int64_t *bonus = PyMem_Calloc(groups > 0 ? (size_t)groups : 1, sizeof(int64_t));
    if (bonus == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (npy_intp k = 0; k < groups; k++)
        first[k] = INFINITY;
    static const int items[3] = {1, 2, 3};
    static const int types[3] = {NPY_INT64, NPY_INT64, NPY_BOOL};
    int modelled = 0;
    for (npy_intp s = 0; s < steps && !modelled; s++) {
        if (!priced[s])
            continue;
        PyObject *row = PyList_GET_ITEM(list, s);
        PyArrayObject *col[3] = {NULL}, *acc = NULL, *cap = NULL;
        npy_intp rows = 0;
        int rc = tuple_columns(row, items, types, 3, col, &rows);
        if (rc == 0) {
            PyObject *batch = PyTuple_GET_ITEM(row, 0);
            PyObject *dict = PyObject_GetAttr(batch, name_dict);
            if (dict != NULL && !PyDict_Check(dict))
                Py_CLEAR(dict);
            PyErr_Clear();
            PyObject *x = batch_attr(batch, dict, name_correct_drafts);
            acc = x ? as_input(x, NPY_INT64, 1) : NULL;
            Py_XDECREF(x);
            x = acc ? batch_attr(batch, dict, name_cap_trim) : NULL;
            cap = x ? as_input(x, NPY_INT64, 1) : NULL;
            Py_XDECREF(x);
            Py_XDECREF(dict);
            if (cap == NULL || PyArray_DIM(acc, 0) != rows || PyArray_DIM(cap, 0) != rows) {
                if (!PyErr_Occurred())
                    PyErr_SetString(PyExc_ValueError, "trim_rows: a step's columns differ in length");
                rc = -1;
            }
        }
        if (rc == 0) {
            const int64_t *grp = PyArray_DATA(col[0]), *w = PyArray_DATA(col[1]),
                          *a = PyArray_DATA(acc), *ct = PyArray_DATA(cap);
            const char *opened = PyArray_DATA(col[2]);
            const double own_share = own[s], static_share = stat[s];
            for (npy_intp r = 0; r < rows; r++) {
                if (grp[r] < 0 || grp[r] >= groups) {
                    PyErr_SetString(PyExc_ValueError, "trim_rows: group id outside the groups");
                    rc = -1;
                    break;
                }
                /* ceiling_rule, then the row's own rule where the mode censors it */
                int64_t known = modes[s] == 0 ? a[r] : modes[s] == 2 ? a[r] + ct[r] : -1;
                int64_t exact = known >= 0 ? known : (a[r] < w[r] || w[r] >= g) ? a[r] : -1;
                double lo = (double)exact, point = lo, hi = lo;
                if (exact < 0) {
                    if (!opened[r]) {
                        modelled = 1;
                        break;
                    }
                    lo = point = (double)w[r];
                    hi = g;
                }
                double *cell = o + grp[r];
                cell[0] += (double)(a[r] + 1);
                cell[groups] += own_share;
                cell[2 * groups] += static_share;
                cell[3 * groups] += lo;
                cell[4 * groups] += point;
                cell[5 * groups] += hi;
                bonus[grp[r]]++;
                if ((double)fct[s] < first[grp[r]])
                    first[grp[r]] = (double)fct[s];
            }
        }
        for (int i = 0; i < 3; i++)
            Py_XDECREF(col[i]);
        Py_XDECREF(acc);
        Py_XDECREF(cap);
        if (rc < 0)
            goto done;
    }
    if (modelled) {
        result = Py_None;
        Py_INCREF(result);
        goto done;
    }
    /* static's committed tokens: a bonus token per row, then its ceiling's sum */
    for (npy_intp k = 0; k < groups; k++)
        for (int c = 3; c < 6; c++)
            o[c * groups + k] = (double)bonus[k] + o[c * groups + k];
    result = Py_BuildValue("(NN)", sums_out, first_out);
    sums_out = first_out = NULL;
done:
    PyMem_Free(bonus);
    Py_XDECREF(sums_out);
    Py_XDECREF(first_out);
    return result;
}

PyDoc_STRVAR(block_ceilings_doc,
"block_ceilings(f, extra, extra_lo, extra_hi, unidentified, unreached)\n"
"    -> (lo, point, hi, var, point_lo, point_hi, unidentified, var_hi)\n\n"
"The settled blocks' ceilings (f float64 [k, FIELDS], their state rows) from their\n"
"extrapolated parts (float64 [k] each) and unreached positions (int64 [k]): what\n"
"TailWalker._emit computes with interval.block_interval, point_range and\n"
"reach_all_variance, block by block.");

/* numpy's maximum(x, 0.0): NaN stays NaN. */
static inline double
at_least_zero(double x)
{
    return isnan(x) || x >= 0.0 ? x : 0.0;
}

static PyObject *
block_ceilings(PyObject *self, PyObject *args)
{
    PyObject *f_obj, *o[5];
    if (!PyArg_ParseTuple(args, "OOOOOO:block_ceilings", &f_obj, &o[0], &o[1], &o[2], &o[3], &o[4]))
        return NULL;
    npy_intp f_dims[2];
    const double *f;
    if (array_dims(f_obj, "f", 2, f_dims) < 0
        || (f = (double *)checked(f_obj, "f", NPY_FLOAT64, f_dims[0], FIELDS, 0)) == NULL)
        return NULL;
    const npy_intp k = f_dims[0];
    PyArrayObject *in[5] = {NULL};
    PyObject *out[8] = {NULL}, *result = NULL;
    for (int i = 0; i < 5; i++) {
        if ((in[i] = as_input(o[i], i < 4 ? NPY_FLOAT64 : NPY_INT64, 1)) == NULL)
            goto done;
        if (PyArray_DIM(in[i], 0) != k) {
            PyErr_SetString(PyExc_ValueError, "block_ceilings: the parts do not match the blocks");
            goto done;
        }
    }
    npy_intp dims[1] = {k};
    for (int i = 0; i < 8; i++)
        if ((out[i] = PyArray_SimpleNew(1, dims, NPY_FLOAT64)) == NULL)
            goto done;
    const double *extra = PyArray_DATA(in[0]), *elo = PyArray_DATA(in[1]),
                 *ehi = PyArray_DATA(in[2]), *eun = PyArray_DATA(in[3]);
    const int64_t *unreached = PyArray_DATA(in[4]);
    double *d[8];
    for (int i = 0; i < 8; i++)
        d[i] = PyArray_DATA((PyArrayObject *)out[i]);
    for (npy_intp b = 0; b < k; b++) {
        const double *fb = f + b * FIELDS;
        const int greedy = fb[GREEDY] == 1.0;
        const int64_t window = (int64_t)fb[WINDOW], reached = (int64_t)fb[NEXT];
        /* greedy: the matched run is certain (its running products are 1) */
        const double run = (double)(reached - window), u = (double)unreached[b];
        const double p = greedy ? 1.0 : fb[CUM];
        const double lo_extra = greedy ? run : fb[LO_EXTRA];
        const double var_terms = greedy ? run * run : fb[VAR_TERMS];
        const double lo = (double)window + lo_extra;
        double e = isnan(extra[b]) ? 0.0 : extra[b];
        const double var = at_least_zero(var_terms - lo_extra * lo_extra);
        d[0][b] = lo;
        d[1][b] = lo + p * clip(e, 0.0, u);
        d[2][b] = lo + p * u;
        d[3][b] = var;
        d[4][b] = lo + p * clip(elo[b], 0.0, u);
        d[5][b] = lo + p * clip(ehi[b], 0.0, u);
        d[6][b] = p * clip(eun[b], 0.0, u);
        const double walked_extra = lo - (double)window;
        const double spread = u * u * p * (1.0 - p) + 2.0 * u * p * (run - walked_extra);
        d[7][b] = at_least_zero(var + spread);
    }
    result = Py_BuildValue("(NNNNNNNN)", out[0], out[1], out[2], out[3], out[4], out[5], out[6],
                           out[7]);
    for (int i = 0; i < 8; i++)
        out[i] = NULL;
done:
    for (int i = 0; i < 5; i++)
        Py_XDECREF(in[i]);
    for (int i = 0; i < 8; i++)
        Py_XDECREF(out[i]);
    return result;
}

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
    npy_intp dims_in[2];
    if (array_dims(o[0], "log_p", 2, dims_in) < 0)
        return NULL;
    npy_intp k = dims_in[0], n = dims_in[1];
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
    {"validate_steps", validate_steps, METH_VARARGS, validate_steps_doc},
    {"known_log_ratios", known_log_ratios, METH_VARARGS, known_log_ratios_doc},
    {"check_sums", check_sums, METH_VARARGS, check_sums_doc},
    {"smooth_sums", smooth_sums, METH_VARARGS, smooth_sums_doc},
    {"count_blocks", count_blocks, METH_VARARGS, count_blocks_doc},
    {"cell_rates", cell_rates, METH_VARARGS, cell_rates_doc},
    {"window_sums", window_sums, METH_VARARGS, window_sums_doc},
    {"count_rows", count_rows, METH_VARARGS, count_rows_doc},
    {"trim_rows", trim_rows, METH_VARARGS, trim_rows_doc},
    {"block_ceilings", block_ceilings, METH_VARARGS, block_ceilings_doc},
    {"extra_parts", extra_parts, METH_VARARGS, extra_parts_doc},
    {"blend_cells", blend_cells, METH_VARARGS, blend_cells_doc},
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
        || (name_dict = PyUnicode_InternFromString("__dict__")) == NULL
        || (name_correct_drafts = PyUnicode_InternFromString("correct_drafts")) == NULL
        || (name_cap_trim = PyUnicode_InternFromString("cap_trim")) == NULL)
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
