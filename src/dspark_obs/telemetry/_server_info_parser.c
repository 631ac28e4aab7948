/*
 * A one-pass parser for SGLang's `dspark_info_record` JSON, straight into columns.
 *
 * `telemetry/server_info_columnar.py` turns a payload into `StepBatch`es. Through msgspec
 * and numpy that costs a Python object per request and a text scan per list; this parser
 * reads the payload once and writes the per-request integers and the per-position lists
 * of every request into flat C buffers, which become the numpy columns of the whole
 * payload (`_compiled_columns` there). Everything after that (workloads, validation,
 * slicing into steps) stays in Python, shared with the msgspec path.
 *
 * It accepts only the narrow grammar SGLang emits: the documented keys (any order,
 * each at most once, no escapes in keys), JSON whitespace, numbers of the types the
 * wire structs declare, null where they allow it, and other keys with plain values
 * (skipped, as msgspec skips unknown fields). Anything else, valid JSON or not,
 * is DECLINED: `parse` returns None and the Python path decodes the payload, so
 * results and error messages never depend on this file. A decline costs time, never
 * correctness; when in doubt, decline.
 *
 * The input comes from the network, so:
 *   - every read is bounds-checked against `end` (the buffer is not NUL-terminated);
 *   - there is no recursion: the grammar has a fixed depth (envelope, records,
 *     record, reqs, request, list), each level its own function;
 *   - lists are at most MAX_LIST long, and buffer growth checks size_t overflow;
 *   - integers outside int64 and numbers that do not parse to a finite double are
 *     declined.
 *
 * Doubles must equal msgspec's bit for bit. A decimal whose digits fit in 53 bits and
 * whose power of ten is at most 22 is one IEEE multiplication or division of two exact
 * doubles, so correctly rounded (Clinger's fast path); the rest go to CPython's
 * correctly rounded `PyOS_string_to_double`. Correct rounding has one answer, so both
 * equal msgspec's (tests/test_sglang_compiled.py checks this on random decimals).
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

/* Longest per-position list accepted: MAX_GAMMA in telemetry/batch.py. */
#define MAX_LIST 64
/* Largest step counter: MAX_FORWARD_CT in telemetry/batch.py. */
#define MAX_FORWARD_CT (INT64_C(1) << 53)

/* Function results: OK, DECLINE (not our grammar: the Python path decides), or ERROR
 * (a Python exception is set, e.g. MemoryError). */
#define OK 0
#define DECLINE 1
#define ERROR (-1)
#define TRY(expr)                                                                          \
    do {                                                                                   \
        int rc_ = (expr);                                                                  \
        if (rc_ != OK)                                                                     \
            return rc_;                                                                    \
    } while (0)

/* A growable byte buffer. */
typedef struct {
    char *data;
    size_t len, cap;
} Buf;

static int
buf_grow(Buf *b, size_t extra)
{
    if (extra > SIZE_MAX - b->len) {
        PyErr_NoMemory();
        return ERROR;
    }
    size_t need = b->len + extra;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < need) {
        if (cap > SIZE_MAX / 2 || cap > (size_t)PY_SSIZE_T_MAX / 2) {
            PyErr_NoMemory();
            return ERROR;
        }
        cap *= 2;
    }
    char *data = PyMem_Realloc(b->data, cap);
    if (data == NULL) {
        PyErr_NoMemory();
        return ERROR;
    }
    b->data = data;
    b->cap = cap;
    return OK;
}

/* Room for `extra` more bytes (the common case is one comparison). */
static inline int
buf_reserve(Buf *b, size_t extra)
{
    return extra <= b->cap - b->len ? OK : buf_grow(b, extra);
}

/* `ReqDetail`'s integer fields, in server_info_wire.REQ_INT_FIELDS order. */
#define N_REQ_INTS 7
typedef struct {
    const char *name;
    size_t len;
} Key;
#define KEY(name) {name, sizeof(name) - 1}
static const Key REQ_KEYS[] = {
    KEY("req_pool_index"), KEY("prefix_len"), KEY("verify_len"),   KEY("acc_len"),
    KEY("correct_drafts"), KEY("cap_trim"),   KEY("bonus_token"),  KEY("draft_tokens"),
    KEY("rid"),            KEY("confidence"), KEY("survival"),
};
#define N_REQ_KEYS 11
#define K_DRAFT 7
#define K_RID 8
#define K_CONF 9
#define K_SURV 10
/* A request needs the seven integers and draft_tokens (no default in `ReqDetail`). */
#define REQ_REQUIRED ((1u << 8) - 1)

/* The step scalars a record hands to `StepBatch`, in server_info_wire._RECORD_SCALARS
 * order; server_info_columnar.py checks that order against STEP_FIELDS before using this
 * module. */
enum { INT_MINUS1, OPT_INT, OPT_FLOAT };
static const struct {
    const char *name;
    int kind;
} STEP_SCALARS[] = {
    {"bs", INT_MINUS1},
    {"num_running_reqs", INT_MINUS1},
    {"num_verify_tokens", INT_MINUS1},
    {"verify_tokens_local", INT_MINUS1},
    {"verify_tokens_dp_synced", INT_MINUS1},
    {"verify_tokens_graph_key", INT_MINUS1},
    {"budget", OPT_INT},
    {"lag_steps", OPT_INT},
    {"predicted_step_ms", OPT_FLOAT},
    {"predicted_theta", OPT_FLOAT},
    {"step_cpu_ms", OPT_FLOAT},
    {"step_gpu_ms", OPT_FLOAT},
    {"draft_gpu_ms", OPT_FLOAT},
    {"target_verify_gpu_ms", OPT_FLOAT},
};
#define N_SCALARS 14
/* Record keys in SGLang's order (`DecodeStepRecord`), each with its slot in
 * STEP_SCALARS or one of these three. */
#define K_FORWARD_CT N_SCALARS
#define K_MODE (N_SCALARS + 1)
#define K_REQS (N_SCALARS + 2)
#define N_RECORD_KEYS (N_SCALARS + 3)
static const Key RECORD_KEYS[N_RECORD_KEYS] = {
    KEY("forward_ct"),          KEY("bs"),
    KEY("mode"),                KEY("budget"),
    KEY("lag_steps"),           KEY("num_running_reqs"),
    KEY("num_verify_tokens"),   KEY("verify_tokens_local"),
    KEY("verify_tokens_dp_synced"), KEY("verify_tokens_graph_key"),
    KEY("predicted_step_ms"),   KEY("predicted_theta"),
    KEY("step_cpu_ms"),         KEY("step_gpu_ms"),
    KEY("draft_gpu_ms"),        KEY("target_verify_gpu_ms"),
    KEY("reqs"),
};
static const int RECORD_SLOTS[N_RECORD_KEYS] = {
    K_FORWARD_CT, 0, K_MODE, 6, 7, 1, 2, 3, 4, 5, 8, 9, 10, 11, 12, 13, K_REQS,
};

static const Key ENVELOPE_KEYS[] = {
    KEY("mode"),       KEY("gamma"),   KEY("verify_num_draft_tokens"),
    KEY("components"), KEY("records"), KEY("simulate_acc_len"),
};
#define N_ENVELOPE_KEYS 6
#define ENVELOPE_REQUIRED 0x1F /* all but simulate_acc_len */

typedef struct {
    const unsigned char *p, *end;
    Py_ssize_t list_len; /* length of every per-position list; -1 before the first */
    Py_ssize_t n;        /* request rows so far */
    Py_ssize_t n_rids;   /* rows with a rid (not absent, not null) */
    Buf ints[N_REQ_INTS];
    Buf draft, conf, surv;
    Py_ssize_t n_conf, n_surv; /* rows that carried confidence / survival */
    Buf scratch;               /* for unescaping strings */
    PyObject *rids;            /* list of str: the rids, a rid the previous step had at
                                * the same position not repeated */
    Buf rid_text;              /* per row: a RidText, to reuse the previous step's str */
    Py_ssize_t step_first;     /* first row of the step being read */
    Py_ssize_t prev_first, prev_rows; /* rows of the last step read with reqs */
    PyObject *records;         /* list: one tuple per step record */
} Parser;

/* ---- lexical helpers ------------------------------------------------------------- */

/* memcmp(a, b, n) == 0 for the short texts compared per request (keys, rids), inlined:
 * a call each cost about 3% of the parse. Word loads, the last one overlapping. */
static inline int
same_bytes(const void *a, const void *b, size_t n)
{
    const unsigned char *x = a, *y = b;
    if (n >= 8) {
        uint64_t u, v;
        for (size_t i = 0; i + 8 < n; i += 8) {
            memcpy(&u, x + i, 8);
            memcpy(&v, y + i, 8);
            if (u != v)
                return 0;
        }
        memcpy(&u, x + n - 8, 8);
        memcpy(&v, y + n - 8, 8);
        return u == v;
    }
    if (n >= 4) {
        uint32_t u, v, w, z;
        memcpy(&u, x, 4);
        memcpy(&v, y, 4);
        memcpy(&w, x + n - 4, 4);
        memcpy(&z, y + n - 4, 4);
        return u == v && w == z;
    }
    for (size_t i = 0; i < n; i++)
        if (x[i] != y[i])
            return 0;
    return 1;
}

/* JSON whitespace is exactly these four (msgspec refuses e.g. form feed). */
static inline void
skip_ws(Parser *s)
{
    while (s->p < s->end &&
           (*s->p == ' ' || *s->p == '\n' || *s->p == '\r' || *s->p == '\t'))
        s->p++;
}

/* The next non-blank byte, not consumed; -1 at the end. */
static inline int
peek(Parser *s)
{
    skip_ws(s);
    return s->p < s->end ? *s->p : -1;
}

static inline int
expect(Parser *s, unsigned char c)
{
    if (peek(s) != c)
        return DECLINE;
    s->p++;
    return OK;
}

/* After an item of a list or object: `,` (more follow: returns OK, *more = 1) or the
 * closing byte (*more = 0). */
static inline int
next_item(Parser *s, unsigned char close, int *more)
{
    int c = peek(s);
    if (c == ',') {
        s->p++;
        *more = 1;
        return OK;
    }
    if (c == close) {
        s->p++;
        *more = 0;
        return OK;
    }
    return DECLINE;
}

/* The literal `word` (null, true, false) at s->p: consumed and 1, else 0. */
static int
take_word(Parser *s, const char *word, size_t len)
{
    if ((size_t)(s->end - s->p) >= len && same_bytes(s->p, word, len)) {
        s->p += len;
        return 1;
    }
    return 0;
}

static int
take_null(Parser *s)
{
    return take_word(s, "null", 4);
}

/* ---- numbers --------------------------------------------------------------------- */

typedef struct {
    const unsigned char *start;
    size_t len;
    uint64_t mant;  /* the digits as an integer, dot removed */
    int64_t exp10;  /* value = mant * 10**exp10 (when !overflow) */
    int neg, is_int, overflow;
} Num;

/* Scan one JSON number: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? */
static int
scan_number(Parser *s, Num *n)
{
    const unsigned char *p = s->p, *end = s->end;
    n->start = p;
    n->mant = 0;
    n->exp10 = 0;
    n->neg = n->overflow = 0;
    n->is_int = 1;
    if (p < end && *p == '-') {
        n->neg = 1;
        p++;
    }
    if (p >= end)
        return DECLINE;
    /* digits beyond 19 set `overflow` and are not folded in: such numbers take the
     * slow path, which rereads the text, so mant and exp10 no longer matter */
#define DIGIT(d)                                                                           \
    do {                                                                                   \
        if (n->mant <= (UINT64_MAX - 9) / 10)                                              \
            n->mant = n->mant * 10 + (uint64_t)(d);                                        \
        else                                                                               \
            n->overflow = 1;                                                               \
    } while (0)
    if (*p == '0') {
        p++;
    }
    else if (*p >= '1' && *p <= '9') {
        for (; p < end && *p >= '0' && *p <= '9'; p++)
            DIGIT(*p - '0');
    }
    else {
        return DECLINE;
    }
    if (p < end && *p == '.') {
        p++;
        n->is_int = 0;
        if (p >= end || *p < '0' || *p > '9')
            return DECLINE;
        for (; p < end && *p >= '0' && *p <= '9'; p++) {
            DIGIT(*p - '0');
            n->exp10--; /* bounded by the text's length, which fits in Py_ssize_t */
        }
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        n->is_int = 0;
        int eneg = 0;
        if (p < end && (*p == '+' || *p == '-'))
            eneg = *p++ == '-';
        if (p >= end || *p < '0' || *p > '9')
            return DECLINE;
        int64_t e = 0;
        while (p < end && *p >= '0' && *p <= '9') {
            if (e < 1000000000) /* saturate: far past any double's range either way */
                e = e * 10 + (*p - '0');
            p++;
        }
        n->exp10 += eneg ? -e : e;
    }
#undef DIGIT
    n->len = (size_t)(p - n->start);
    s->p = p;
    return OK;
}

static int
scan_int64_general(Parser *s, int64_t *out)
{
    Num n;
    TRY(scan_number(s, &n));
    /* msgspec refuses a float token for an int field; beyond int64, numpy would */
    if (!n.is_int || n.overflow)
        return DECLINE;
    if (n.neg) {
        if (n.mant > (uint64_t)INT64_MAX + 1)
            return DECLINE;
        *out = n.mant == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)n.mant;
    }
    else {
        if (n.mant > (uint64_t)INT64_MAX)
            return DECLINE;
        *out = (int64_t)n.mant;
    }
    return OK;
}

static const double POW10[23] = {
    1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
    1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22,
};

static int
scan_double_general(Parser *s, double *out)
{
    Num n;
    TRY(scan_number(s, &n));
    if (n.is_int) {
        /* msgspec reads an integer token as an int and converts it: "-0" gives +0.0.
         * Exact below 2**53; larger ones are declined rather than reasoned about. */
        if (n.overflow || n.mant > (UINT64_C(1) << 53))
            return DECLINE;
        double d = (double)n.mant;
        *out = n.neg && n.mant ? -d : d;
        return OK;
    }
#if FLT_EVAL_METHOD == 0 /* doubles evaluated as doubles (SSE2, not x87) */
    if (!n.overflow && n.mant <= (UINT64_C(1) << 53) && n.exp10 >= -22 && n.exp10 <= 22) {
        double d = (double)n.mant;
        d = n.exp10 < 0 ? d / POW10[-n.exp10] : d * POW10[n.exp10];
        *out = n.neg ? -d : d;
        return OK;
    }
#endif
    if (!n.overflow && n.mant == 0) { /* 0.0e999 and the like: a signed zero */
        *out = n.neg ? -0.0 : 0.0;
        return OK;
    }
    char tmp[64];
    if (n.len >= sizeof(tmp))
        return DECLINE;
    memcpy(tmp, n.start, n.len);
    tmp[n.len] = '\0';
    char *endp = NULL;
    double d = PyOS_string_to_double(tmp, &endp, NULL);
    if (d == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        return DECLINE;
    }
    /* overflow (msgspec: "Number out of range") and underflow to zero or subnormals
     * are left to the Python path */
    if (endp != tmp + n.len || !isfinite(d) || fabs(d) < DBL_MIN)
        return DECLINE;
    *out = d;
    return OK;
}

/* A byte that could continue a number token. */
static inline int
in_number(const unsigned char *p, const unsigned char *end)
{
    return p < end && ((unsigned)(*p - '0') < 10 || *p == '.' || *p == 'e' || *p == 'E');
}

/* The spellings SGLang writes (most numbers of a payload) without the general
 * scanner; anything else is rescanned by it from the same place. */
static inline int
scan_int64(Parser *s, int64_t *out)
{
    skip_ws(s);
    const unsigned char *p = s->p, *end = s->end;
    if (p < end && (unsigned)(*p - '1') < 9) {
        /* up to 18 digits: below 10**18, inside int64 */
        const unsigned char *stop = end - p > 18 ? p + 18 : end;
        uint64_t v = 0;
        for (; p < stop && (unsigned)(*p - '0') < 10; p++)
            v = v * 10 + (uint64_t)(*p - '0');
        if (!in_number(p, end)) {
            s->p = p;
            *out = (int64_t)v;
            return OK;
        }
    }
    else if (p < end && *p == '0' && !in_number(p + 1, end)) {
        s->p = p + 1;
        *out = 0;
        return OK;
    }
    return scan_int64_general(s, out);
}

static inline int
scan_double(Parser *s, double *out)
{
    skip_ws(s);
#if FLT_EVAL_METHOD == 0 /* doubles evaluated as doubles (SSE2, not x87) */
    const unsigned char *p = s->p, *end = s->end;
    /* unsigned, no exponent, at most 15 digits in all: the digits are below
     * 10**15 < 2**53 and the power of ten at most 10**15, so one division of two
     * exact doubles is the correctly rounded value */
    if (p < end && (unsigned)(*p - '0') < 10 &&
        !(*p == '0' && p + 1 < end && (unsigned)(p[1] - '0') < 10)) {
        const unsigned char *stop = end - p > 15 ? p + 15 : end;
        uint64_t m = 0;
        for (; p < stop && (unsigned)(*p - '0') < 10; p++)
            m = m * 10 + (uint64_t)(*p - '0');
        if (!in_number(p, end)) { /* an integer token */
            s->p = p;
            *out = (double)m;
            return OK;
        }
        if (*p == '.' && p + 1 < end && (unsigned)(p[1] - '0') < 10) {
            const unsigned char *dot = p++;
            /* 15 digits in all: 16 bytes with the dot */
            stop = end - s->p > 16 ? s->p + 16 : end;
            for (; p < stop && (unsigned)(*p - '0') < 10; p++)
                m = m * 10 + (uint64_t)(*p - '0');
            if (!in_number(p, end)) {
                s->p = p;
                *out = (double)m / POW10[p - dot - 1];
                return OK;
            }
        }
    }
#endif
    return scan_double_general(s, out);
}

/* ---- strings --------------------------------------------------------------------- */

/* Scan a string at s->p: its raw bytes between the quotes, whether it has escapes, and
 * whether it is all ASCII. Control characters are invalid JSON: declined. Escapes are
 * checked when decoded. */
static int
scan_string(Parser *s, const unsigned char **raw, size_t *len, int *escaped, int *ascii)
{
    if (peek(s) != '"')
        return DECLINE;
    const unsigned char *p = ++s->p, *end = s->end;
    int esc = 0, high = 0;
    for (;;) {
        if (p >= end)
            return DECLINE;
        unsigned char c = *p;
        if (c == '"')
            break;
        if (c == '\\') {
            /* the escaped byte may be a quote: step over it; checked when decoded */
            if (end - p < 2)
                return DECLINE;
            esc = 1;
            p += 2;
            continue;
        }
        if (c < 0x20)
            return DECLINE;
        high |= c >= 0x80;
        p++;
    }
    *raw = s->p;
    *len = (size_t)(p - s->p);
    *escaped = esc;
    *ascii = !high;
    s->p = p + 1;
    return OK;
}

static int
hex4(const unsigned char *p, unsigned *out)
{
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        unsigned c = p[i], d;
        if (c >= '0' && c <= '9')
            d = c - '0';
        else if (c >= 'a' && c <= 'f')
            d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F')
            d = c - 'A' + 10;
        else
            return DECLINE;
        v = v * 16 + d;
    }
    *out = v;
    return OK;
}

/* Decode escapes into s->scratch as UTF-8. The output is never longer than the raw
 * text (an escape of 2, 6 or 12 bytes gives 1, at most 3 or 4), so one reserve
 * suffices. A lone surrogate is declined (msgspec refuses it too). */
static int
unescape(Parser *s, const unsigned char *p, size_t len)
{
    s->scratch.len = 0;
    TRY(buf_reserve(&s->scratch, len));
    unsigned char *out = (unsigned char *)s->scratch.data;
    const unsigned char *end = p + len;
    while (p < end) {
        if (*p != '\\') {
            *out++ = *p++;
            continue;
        }
        if (end - p < 2)
            return DECLINE;
        unsigned char e = p[1];
        p += 2;
        switch (e) {
        case '"': *out++ = '"'; continue;
        case '\\': *out++ = '\\'; continue;
        case '/': *out++ = '/'; continue;
        case 'b': *out++ = '\b'; continue;
        case 'f': *out++ = '\f'; continue;
        case 'n': *out++ = '\n'; continue;
        case 'r': *out++ = '\r'; continue;
        case 't': *out++ = '\t'; continue;
        case 'u': break;
        default: return DECLINE;
        }
        unsigned cp;
        if (end - p < 4 || hex4(p, &cp) != OK)
            return DECLINE;
        p += 4;
        if (cp >= 0xDC00 && cp <= 0xDFFF)
            return DECLINE;
        if (cp >= 0xD800 && cp <= 0xDBFF) {
            unsigned lo;
            if (end - p < 6 || p[0] != '\\' || p[1] != 'u' || hex4(p + 2, &lo) != OK ||
                lo < 0xDC00 || lo > 0xDFFF)
                return DECLINE;
            p += 6;
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        }
        if (cp < 0x80) {
            *out++ = (unsigned char)cp;
        }
        else if (cp < 0x800) {
            *out++ = (unsigned char)(0xC0 | (cp >> 6));
            *out++ = (unsigned char)(0x80 | (cp & 0x3F));
        }
        else if (cp < 0x10000) {
            *out++ = (unsigned char)(0xE0 | (cp >> 12));
            *out++ = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
            *out++ = (unsigned char)(0x80 | (cp & 0x3F));
        }
        else {
            *out++ = (unsigned char)(0xF0 | (cp >> 18));
            *out++ = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
            *out++ = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
            *out++ = (unsigned char)(0x80 | (cp & 0x3F));
        }
    }
    s->scratch.len = (size_t)(out - (unsigned char *)s->scratch.data);
    return OK;
}

/* A string value as a new str in *out. Invalid UTF-8 is declined: msgspec refuses it,
 * and Python's strict decoder refuses the same (overlongs, surrogates, > U+10FFFF). */
static int
take_string(Parser *s, PyObject **out)
{
    const unsigned char *raw;
    size_t len;
    int escaped, ascii;
    TRY(scan_string(s, &raw, &len, &escaped, &ascii));
    if (len > PY_SSIZE_T_MAX)
        return DECLINE;
    PyObject *str;
    if (!escaped && ascii) {
        str = PyUnicode_New((Py_ssize_t)len, 127);
        if (str == NULL)
            return ERROR;
        memcpy(PyUnicode_1BYTE_DATA(str), raw, len);
    }
    else {
        if (escaped) {
            TRY(unescape(s, raw, len));
            raw = (const unsigned char *)s->scratch.data;
            len = s->scratch.len;
        }
        str = PyUnicode_DecodeUTF8((const char *)raw, (Py_ssize_t)len, "strict");
        if (str == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError))
                return ERROR;
            PyErr_Clear();
            return DECLINE;
        }
    }
    *out = str;
    return OK;
}

/* An object key, looked up in `keys` (tried from `hint` on: SGLang writes its keys in
 * one order, so the next key is usually the one after the last). A key not in the
 * table gives *index = -1, and its value is the caller's to skip (`skip_value`), as
 * msgspec skips unknown fields. Keys with escapes are declined (unescaped, one might
 * name a known field), and so are keys outside ASCII. */
static int
take_key(Parser *s, const Key *keys, int nkeys, int hint, int *index)
{
    if (hint >= nkeys)
        hint = 0;
    /* The expected key compared in place: key names hold no quote or backslash, so
     * the name followed by a quote is the whole string. */
    if (peek(s) == '"') {
        const unsigned char *q = s->p + 1;
        size_t len = keys[hint].len;
        if ((size_t)(s->end - q) > len && q[len] == '"' && same_bytes(q, keys[hint].name, len)) {
            s->p = q + len + 1;
            *index = hint;
            return expect(s, ':');
        }
    }
    const unsigned char *raw;
    size_t len;
    int escaped, ascii;
    TRY(scan_string(s, &raw, &len, &escaped, &ascii));
    if (escaped || !ascii)
        return DECLINE;
    *index = -1;
    for (int i = 0; i < nkeys; i++) {
        int k = (hint + i) % nkeys;
        if (keys[k].len == len && same_bytes(keys[k].name, raw, len)) {
            *index = k;
            break;
        }
    }
    return expect(s, ':');
}

/* One plain JSON value of an unknown key: a number, an ASCII string without escapes,
 * true, false, null, or a flat list of those. A newer SGLang may add fields, which
 * msgspec ignores; skipping them here keeps such payloads on this path instead of
 * sending every poll down the slower one. Anything else (objects, nested lists,
 * escapes) declines, and msgspec decides whether it is valid JSON at all. */
static int
skip_scalar(Parser *s)
{
    int c = peek(s);
    if (c == '"') {
        const unsigned char *raw;
        size_t len;
        int escaped, ascii;
        TRY(scan_string(s, &raw, &len, &escaped, &ascii));
        return escaped || !ascii ? DECLINE : OK;
    }
    if (take_word(s, "null", 4) || take_word(s, "true", 4) || take_word(s, "false", 5))
        return OK;
    Num n;
    return scan_number(s, &n);
}

static int
skip_value(Parser *s)
{
    if (peek(s) != '[')
        return skip_scalar(s);
    s->p++;
    if (peek(s) == ']') {
        s->p++;
        return OK;
    }
    for (int more = 1; more;) {
        TRY(skip_scalar(s));
        TRY(next_item(s, ']', &more));
    }
    return OK;
}

/* ---- lists ----------------------------------------------------------------------- */

/* Every per-position list of the payload must have the same length (checked against
 * gamma once the envelope is read). */
static int
check_list_len(Parser *s, Py_ssize_t k)
{
    if (s->list_len < 0)
        s->list_len = k;
    return k == s->list_len ? OK : DECLINE;
}

/* A list of at most MAX_LIST numbers into dst (room for MAX_LIST): int64 when
 * `integers`, else double (both 8 bytes; the two call sites pass a constant, so each
 * gets its own specialised copy). *count is how many were written, also when it
 * declines. */
static inline int
take_number_list(Parser *s, void *dst, int integers, Py_ssize_t *count)
{
    *count = 0;
    TRY(expect(s, '['));
    Py_ssize_t k = 0;
    int more = 1;
    if (peek(s) == ']') {
        s->p++;
        more = 0;
    }
    while (more) {
        if (k >= MAX_LIST)
            return DECLINE;
        TRY(integers ? scan_int64(s, (int64_t *)dst + k) : scan_double(s, (double *)dst + k));
        *count = ++k;
        TRY(next_item(s, ']', &more));
    }
    *count = k;
    return check_list_len(s, k);
}

/* `components`: a list of strings, validated and dropped (no conversion uses them). */
static int
skip_string_list(Parser *s)
{
    TRY(expect(s, '['));
    if (peek(s) == ']') {
        s->p++;
        return OK;
    }
    for (int more = 1; more;) {
        PyObject *str;
        TRY(take_string(s, &str));
        Py_DECREF(str);
        TRY(next_item(s, ']', &more));
    }
    return OK;
}

/* ---- the three object levels ------------------------------------------------------ */

/* A row's rid: its index in s->rids (-1 for none) and, so that
 * the next step's request at the same position can be matched by its text (SGLang
 * keeps a batch's order from step to step), where its text lies: NULL unless plain
 * ASCII without escapes. */
typedef struct {
    const unsigned char *raw;
    size_t len;
    int64_t code;
} RidText;

static int
take_rid(Parser *s, RidText *text)
{
    const unsigned char *raw;
    size_t len;
    int escaped, ascii;
    const unsigned char *at = s->p;
    PyObject *str;
    TRY(scan_string(s, &raw, &len, &escaped, &ascii));
    if (escaped || !ascii) {
        s->p = at;
        TRY(take_string(s, &str));
        raw = NULL;
    }
    else {
        Py_ssize_t j = s->n - s->step_first;
        if (j < s->prev_rows) {
            const RidText *prev = (const RidText *)s->rid_text.data + s->prev_first + j;
            if (prev->raw && prev->len == len && same_bytes(prev->raw, raw, len)) {
                *text = *prev;
                return OK;
            }
        }
        if (len > PY_SSIZE_T_MAX)
            return DECLINE;
        if ((str = PyUnicode_New((Py_ssize_t)len, 127)) == NULL)
            return ERROR;
        memcpy(PyUnicode_1BYTE_DATA(str), raw, len);
    }
    text->raw = raw;
    text->len = len;
    text->code = PyList_GET_SIZE(s->rids);
    int rc = PyList_Append(s->rids, str) < 0 ? ERROR : OK;
    Py_DECREF(str);
    return rc;
}

/* One `ReqDetail`, as row s->n. Lists are parsed straight into the column buffers:
 * room for a row is reserved first, and a request that does not parse declines the
 * whole payload, so nothing half-written is ever used. */
static int
take_request(Parser *s)
{
    int64_t ints[N_REQ_INTS];
    Py_ssize_t k;
    RidText text = {NULL, 0, -1};
    unsigned seen = 0;
    int rc = OK, key = N_REQ_KEYS - 1, more = 1;
    const size_t row = MAX_LIST * sizeof(int64_t); /* a list's most bytes */

    for (int i = 0; i < N_REQ_INTS; i++)
        TRY(buf_reserve(&s->ints[i], sizeof(int64_t)));
    TRY(buf_reserve(&s->draft, row));
    TRY(buf_reserve(&s->rid_text, sizeof(RidText)));
    TRY(expect(s, '{'));
    if (peek(s) == '}') /* required fields missing */
        return DECLINE;
    while (more) {
        int found;
        if ((rc = take_key(s, REQ_KEYS, N_REQ_KEYS, key + 1, &found)) != OK)
            goto done;
        if (found < 0) {
            if ((rc = skip_value(s)) != OK || (rc = next_item(s, '}', &more)) != OK)
                goto done;
            continue;
        }
        key = found;
        if (seen & (1u << key)) { /* a repeated key: msgspec keeps the last; decline */
            rc = DECLINE;
            goto done;
        }
        seen |= 1u << key;
        skip_ws(s);
        if (key < N_REQ_INTS) {
            rc = scan_int64(s, &ints[key]);
        }
        else if (key == K_DRAFT) {
            rc = take_number_list(s, s->draft.data + s->draft.len, 1, &k);
            s->draft.len += (size_t)k * sizeof(int64_t);
        }
        else if (key == K_RID) {
            rc = take_null(s) ? OK : take_rid(s, &text);
        }
        else if (!take_null(s)) { /* confidence or survival: null is as good as absent */
            Buf *b = key == K_CONF ? &s->conf : &s->surv;
            if ((rc = buf_reserve(b, row)) == OK) {
                rc = take_number_list(s, b->data + b->len, 0, &k);
                b->len += (size_t)k * sizeof(double);
                /* rows with them are counted: used only if every row has them */
                *(key == K_CONF ? &s->n_conf : &s->n_surv) += 1;
            }
        }
        if (rc != OK || (rc = next_item(s, '}', &more)) != OK)
            goto done;
    }
    if ((seen & REQ_REQUIRED) != REQ_REQUIRED) {
        rc = DECLINE;
        goto done;
    }
    for (int i = 0; i < N_REQ_INTS; i++) {
        memcpy(s->ints[i].data + s->ints[i].len, &ints[i], sizeof(int64_t));
        s->ints[i].len += sizeof(int64_t);
    }
    memcpy(s->rid_text.data + s->rid_text.len, &text, sizeof(text));
    s->rid_text.len += sizeof(text);
    s->n_rids += text.code >= 0;
    s->n++;
done:
    return rc;
}

/* One `DecodeStepRecord`: its requests become rows; its scalars a tuple
 * (forward_ct, mode, number of reqs or None, *STEP_SCALARS) appended to s->records. */
static int
take_record(Parser *s)
{
    int64_t ints[N_SCALARS];
    double floats[N_SCALARS];
    int is_null[N_SCALARS];
    int64_t forward_ct = 0;
    Py_ssize_t first_row = s->n, n_reqs = -1; /* -1: reqs absent or null */
    PyObject *mode = NULL, *tuple = NULL;
    unsigned seen = 0;
    int rc = OK, index = N_RECORD_KEYS - 1, more = 1;

    for (int i = 0; i < N_SCALARS; i++) {
        ints[i] = -1;
        is_null[i] = 1;
    }
    TRY(expect(s, '{'));
    if (peek(s) == '}') /* forward_ct missing */
        return DECLINE;
    while (more) {
        int found;
        if ((rc = take_key(s, RECORD_KEYS, N_RECORD_KEYS, index + 1, &found)) != OK)
            goto done;
        if (found < 0) {
            if ((rc = skip_value(s)) != OK || (rc = next_item(s, '}', &more)) != OK)
                goto done;
            continue;
        }
        index = found;
        int key = RECORD_SLOTS[index];
        if (seen & (1u << key)) {
            rc = DECLINE;
            goto done;
        }
        seen |= 1u << key;
        skip_ws(s);
        if (key == K_FORWARD_CT) {
            rc = scan_int64(s, &forward_ct);
        }
        else if (key == K_MODE) {
            rc = take_string(s, &mode);
        }
        else if (key == K_REQS) {
            if (!take_null(s)) {
                if ((rc = expect(s, '[')) != OK)
                    goto done;
                s->step_first = first_row;
                if (peek(s) == ']') {
                    s->p++;
                }
                else {
                    for (int more_reqs = 1; more_reqs && rc == OK;) {
                        rc = take_request(s);
                        if (rc == OK)
                            rc = next_item(s, ']', &more_reqs);
                    }
                }
                n_reqs = s->n - first_row;
                s->prev_first = first_row;
                s->prev_rows = n_reqs;
            }
        }
        else if (STEP_SCALARS[key].kind == OPT_FLOAT) {
            if (!take_null(s)) {
                rc = scan_double(s, &floats[key]);
                is_null[key] = 0;
            }
        }
        else if (STEP_SCALARS[key].kind == OPT_INT) {
            if (!take_null(s)) {
                rc = scan_int64(s, &ints[key]);
                is_null[key] = 0;
            }
        }
        else { /* a plain int: null is not allowed */
            rc = scan_int64(s, &ints[key]);
            is_null[key] = 0;
        }
        if (rc != OK || (rc = next_item(s, '}', &more)) != OK)
            goto done;
    }
    /* the one check of StepBatch.validate_step that the types read here do not make
     * already, so the steps of this parser need no second look (server_info_columnar._assemble) */
    if (!(seen & (1u << K_FORWARD_CT)) || forward_ct < 0 || forward_ct > MAX_FORWARD_CT) {
        rc = DECLINE;
        goto done;
    }
    rc = ERROR;
    tuple = PyTuple_New(3 + N_SCALARS);
    if (tuple == NULL)
        goto done;
    PyObject *item = PyLong_FromLongLong(forward_ct);
    if (item == NULL)
        goto done;
    PyTuple_SET_ITEM(tuple, 0, item);
    if (mode == NULL && (mode = PyUnicode_New(0, 127)) == NULL)
        goto done;
    PyTuple_SET_ITEM(tuple, 1, mode); /* the tuple owns it now */
    mode = NULL;
    item = n_reqs < 0 ? Py_NewRef(Py_None) : PyLong_FromSsize_t(n_reqs);
    if (item == NULL)
        goto done;
    PyTuple_SET_ITEM(tuple, 2, item);
    for (int i = 0; i < N_SCALARS; i++) {
        if (STEP_SCALARS[i].kind == INT_MINUS1)
            item = PyLong_FromLongLong(ints[i]);
        else if (is_null[i])
            item = Py_NewRef(Py_None);
        else if (STEP_SCALARS[i].kind == OPT_INT)
            item = PyLong_FromLongLong(ints[i]);
        else
            item = PyFloat_FromDouble(floats[i]);
        if (item == NULL)
            goto done;
        PyTuple_SET_ITEM(tuple, 3 + i, item);
    }
    if (PyList_Append(s->records, tuple) < 0)
        goto done;
    rc = OK;
done:
    Py_XDECREF(mode);
    Py_XDECREF(tuple);
    return rc;
}

/* The envelope: fills *mode (new reference) and *gamma. */
static int
take_envelope(Parser *s, PyObject **mode, int64_t *gamma)
{
    int64_t ignored;
    unsigned seen = 0;
    int key = N_ENVELOPE_KEYS - 1, more = 1;

    TRY(expect(s, '{'));
    if (peek(s) == '}')
        return DECLINE;
    while (more) {
        int found;
        TRY(take_key(s, ENVELOPE_KEYS, N_ENVELOPE_KEYS, key + 1, &found));
        if (found < 0) {
            TRY(skip_value(s));
            TRY(next_item(s, '}', &more));
            continue;
        }
        key = found;
        if (seen & (1u << key))
            return DECLINE;
        seen |= 1u << key;
        skip_ws(s);
        switch (key) {
        case 0:
            TRY(take_string(s, mode));
            break;
        case 1:
            TRY(scan_int64(s, gamma));
            break;
        case 2:
            TRY(scan_int64(s, &ignored));
            break;
        case 3:
            TRY(skip_string_list(s));
            break;
        case 4:
            TRY(expect(s, '['));
            if (peek(s) == ']') {
                s->p++;
                break;
            }
            for (int more_records = 1; more_records;) {
                TRY(take_record(s));
                TRY(next_item(s, ']', &more_records));
            }
            break;
        default: /* simulate_acc_len: int or null */
            if (!take_null(s))
                TRY(scan_int64(s, &ignored));
        }
        TRY(next_item(s, '}', &more));
    }
    if ((seen & ENVELOPE_REQUIRED) != ENVELOPE_REQUIRED)
        return DECLINE;
    skip_ws(s);
    return s->p == s->end ? OK : DECLINE; /* nothing but whitespace after the object */
}

/* ---- the module function ---------------------------------------------------------- */

/* The work buffers of the last call, kept for the next one. Fresh memory costs a page
 * fault per 4 KiB on first touch, and a 50-step poll at B=256 fills about 3 MB of
 * buffers: allocated anew each call, the faults cost more than the parsing. `busy`
 * guards against a second parse while one runs (a finaliser run by the garbage
 * collector during PyList_Append may call it, or let another thread in): that one
 * gets fresh buffers. Buffers grown past CACHE_LIMIT are freed, not kept. */
#define CACHE_LIMIT ((size_t)64 << 20)
static struct {
    int busy;
    Buf ints[N_REQ_INTS], draft, conf, surv, rid_text, scratch;
} cache;

static void
cache_lend(Parser *s)
{
    if (cache.busy)
        return;
    cache.busy = 1;
    for (int i = 0; i < N_REQ_INTS; i++)
        s->ints[i] = cache.ints[i];
    s->draft = cache.draft;
    s->conf = cache.conf;
    s->surv = cache.surv;
    s->rid_text = cache.rid_text;
    s->scratch = cache.scratch;
    memset(&cache, 0, sizeof(cache));
    cache.busy = 1;
}

/* Keep a buffer for the next call (emptied), or free it. */
static void
cache_keep(Buf *slot, Buf *b, int keep)
{
    if (keep && b->cap <= CACHE_LIMIT) {
        b->len = 0;
        *slot = *b;
    }
    else {
        PyMem_Free(b->data);
    }
}

/* Called with the cache lent to `s` (lent == 1) or not. */
static void
cache_return(Parser *s, int lent)
{
    for (int i = 0; i < N_REQ_INTS; i++)
        cache_keep(&cache.ints[i], &s->ints[i], lent);
    cache_keep(&cache.draft, &s->draft, lent);
    cache_keep(&cache.conf, &s->conf, lent);
    cache_keep(&cache.surv, &s->surv, lent);
    cache_keep(&cache.rid_text, &s->rid_text, lent);
    cache_keep(&cache.scratch, &s->scratch, lent);
    if (lent)
        cache.busy = 0;
}

PyDoc_STRVAR(parse_doc,
"parse(payload, max_gamma) -> tuple | None\n\n"
"One rank's dspark_info_record JSON (a bytes-like object) as columns:\n"
"(mode, gamma, records, n, data, has_confidence, has_survival, rids, all_rids),\n"
"where\n"
"records holds one (forward_ct, mode, n_reqs | None, *STEP_FIELDS) tuple per step,\n"
"data is a bytearray holding, one after the other, 7 int64 columns of n rows\n"
"(REQ_INT_FIELDS order), each row's rid as an int64 index into rids (-1: none),\n"
"draft_tokens as [n, gamma] int64, then confidence and survival as [n, gamma]\n"
"float64 where present; rids a list of str (a rid that the previous step had\n"
"at the same position is not repeated), all_rids whether every row has one.\n"
"None: not taken (any payload outside the narrow grammar SGLang writes); decode\n"
"it the Python way.");

static PyObject *
parse(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer view;
    int max_gamma;
    if (!PyArg_ParseTuple(args, "y*i:parse", &view, &max_gamma))
        return NULL;
    Parser s;
    memset(&s, 0, sizeof(s));
    s.p = (const unsigned char *)view.buf;
    s.end = s.p + view.len;
    s.list_len = -1;
    int lent = !cache.busy;
    cache_lend(&s);
    PyObject *mode = NULL, *result = NULL, *data = NULL;
    int64_t gamma = 0;
    int rc = ERROR;
    if ((s.rids = PyList_New(0)) == NULL || (s.records = PyList_New(0)) == NULL)
        goto done;
    rc = take_envelope(&s, &mode, &gamma);
    if (rc != OK)
        goto done;
    /* gamma sizes every matrix; the Python path reports a bad one */
    if (gamma < 1 || gamma > max_gamma || gamma > MAX_LIST ||
        (s.list_len >= 0 && s.list_len != gamma) ||
        (s.n_conf != 0 && s.n_conf != s.n) || (s.n_surv != 0 && s.n_surv != s.n)) {
        rc = DECLINE;
        goto done;
    }
    /* One bytearray for all columns: ints (7 columns of n), draft_tokens, then
     * confidence and survival where present ([n, gamma] each). One allocation rather
     * than four also keeps it in malloc's heap from one call to the next (glibc
     * returns a large freed block to the system only past a threshold that it raises
     * to the largest block freed), so its pages are not faulted in anew each time. */
    rc = ERROR;
    size_t column = (size_t)s.n * sizeof(int64_t);
    size_t total = (N_REQ_INTS + 1) * column + s.draft.len + s.conf.len * (s.n_conf != 0) +
                   s.surv.len * (s.n_surv != 0);
    if ((data = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)total)) == NULL)
        goto done;
    char *out = PyByteArray_AS_STRING(data);
    for (int i = 0; i < N_REQ_INTS; i++, out += column)
        if (column)
            memcpy(out, s.ints[i].data, column);
    for (Py_ssize_t i = 0; i < s.n; i++, out += sizeof(int64_t))
        memcpy(out, &((const RidText *)s.rid_text.data)[i].code, sizeof(int64_t));
    const Buf *lists[3] = {&s.draft, s.n_conf ? &s.conf : NULL, s.n_surv ? &s.surv : NULL};
    for (int i = 0; i < 3; i++) {
        if (lists[i] && lists[i]->len) {
            memcpy(out, lists[i]->data, lists[i]->len);
            out += lists[i]->len;
        }
    }
    result = Py_BuildValue("(OLOnOiiOi)", mode, (long long)gamma, s.records, s.n, data,
                           s.n_conf != 0, s.n_surv != 0, s.rids, s.n_rids == s.n);
    rc = result ? OK : ERROR;
done:
    PyBuffer_Release(&view);
    cache_return(&s, lent);
    Py_XDECREF(s.rids);
    Py_XDECREF(s.records);
    Py_XDECREF(mode);
    Py_XDECREF(data);
    if (rc == DECLINE)
        Py_RETURN_NONE;
    return rc == OK ? result : NULL;
}

static PyMethodDef methods[] = {
    {"parse", parse, METH_VARARGS, parse_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_server_info_parser",
    .m_doc = "Compiled one-pass parser of SGLang's dspark_info_record JSON (see parse).",
    .m_size = -1,
    .m_methods = methods,
};

/* A module attribute: the keys as a tuple of str. */
static int
add_keys(PyObject *m, const char *name, const Key *keys, int n)
{
    PyObject *t = PyTuple_New(n);
    if (t == NULL)
        return -1;
    for (int i = 0; i < n; i++) {
        PyObject *k = PyUnicode_FromStringAndSize(keys[i].name, (Py_ssize_t)keys[i].len);
        if (k == NULL) {
            Py_DECREF(t);
            return -1;
        }
        PyTuple_SET_ITEM(t, i, k);
    }
    if (PyModule_AddObject(m, name, t) < 0) {
        Py_DECREF(t);
        return -1;
    }
    return 0;
}

PyMODINIT_FUNC
PyInit__server_info_parser(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    PyObject *fields = PyTuple_New(N_SCALARS);
    if (fields == NULL)
        goto fail;
    for (int i = 0; i < N_SCALARS; i++) {
        PyObject *name = PyUnicode_FromString(STEP_SCALARS[i].name);
        if (name == NULL) {
            Py_DECREF(fields);
            goto fail;
        }
        PyTuple_SET_ITEM(fields, i, name);
    }
    if (PyModule_AddObject(m, "STEP_FIELDS", fields) < 0) {
        Py_DECREF(fields);
        goto fail;
    }
    if (PyModule_AddIntConstant(m, "MAX_LIST", MAX_LIST) < 0)
        goto fail;
    /* the keys the parser takes, in SGLang's order, for the tests to hold against the
     * wire types (ReqDetail, DecodeStepRecord, InfoRecord) */
    if (add_keys(m, "REQ_KEYS", REQ_KEYS, N_REQ_KEYS) < 0
        || add_keys(m, "RECORD_KEYS", RECORD_KEYS, N_RECORD_KEYS) < 0
        || add_keys(m, "ENVELOPE_KEYS", ENVELOPE_KEYS, N_ENVELOPE_KEYS) < 0)
        goto fail;
    return m;
fail:
    Py_DECREF(m);
    return NULL;
}
