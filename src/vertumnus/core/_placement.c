/* Compiled placement hot path: place_fields() of vertumnus/core/placement.py.
 *
 * Why C: a placement decision runs once per arriving request over every
 * worker of the pool. In CPython the loop over 64 workers costs ~30 µs however
 * it is written (each pass over the workers is ~1.5-4 µs and the cost model
 * needs several); here it is one pass and a few µs, which is what lets the
 * router make >= 20,000 decisions/s on one core (issue 4,
 * bench/placement_speed.py).
 *
 * Contract: the result is *identical* to the Python implementation
 * (placement.place_fields_py) -- same worker, same floats, same preferred
 * degree, same tie-breaks (placement._tie_key: idle before busy, the longest
 * idle first, then the caller's order).
 * tests/policies/test_hot_path.py checks both against the naive reference.
 * Identical floats need the same operations in the same order as
 * PrefillModel.predict and no fused multiply-add: setup.py compiles this
 * file with -ffp-contract=off.
 *
 * Pure: no I/O, no global state (the interned attribute names are
 * immutable constants created at import).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* Attribute names, interned once at import. */
static PyObject *s_available, *s_degree, *s_id, *s_outstanding_s, *s_queued, *s_free_at;
static PyObject *s_d, *s_a, *s_alpha, *s_c, *s_b, *s_max_tokens_per_gpu;
static PyObject *s_beta, *s_lam, *s_beta_busy, *s_get, *s_zero;

/* Distinct degrees are few (1, 2, 4, 8, ...): a small table, linear search. */
#define MAX_DEGREES 64

typedef struct {
    long long degree;
    double d, a;
    int supported; /* degree is in the model and the request fits there */
} DegreeRow;

typedef struct {
    PyObject *worker; /* borrowed from the candidates list */
    long long degree;
    double outstanding;
    int queued;
    int row;
} Cand;

static int
get_double(PyObject *obj, PyObject *name, double *out)
{
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL)
        return -1;
    *out = PyFloat_AsDouble(v);
    Py_DECREF(v);
    return (*out == -1.0 && PyErr_Occurred()) ? -1 : 0;
}

static int
get_longlong(PyObject *obj, PyObject *name, long long *out)
{
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL)
        return -1;
    *out = PyLong_AsLongLong(v);
    Py_DECREF(v);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

/* model.d[degree] / model.a[degree] as doubles; 0 = absent, 1 = found, -1 = error. */
static int
coefficient(PyObject *mapping, long long degree, double *out)
{
    PyObject *key = PyLong_FromLongLong(degree);
    if (key == NULL)
        return -1;
    /* `in` then `[]`, as the Python code does: a mapping with a default
     * (defaultdict) must not grow an entry. */
    int found = PySequence_Contains(mapping, key);
    PyObject *v = found > 0 ? PyObject_GetItem(mapping, key) : NULL;
    Py_DECREF(key);
    if (found <= 0)
        return found;
    if (v == NULL)
        return -1;
    *out = PyFloat_AsDouble(v);
    Py_DECREF(v);
    return (*out == -1.0 && PyErr_Occurred()) ? -1 : 1;
}

/* matched_blocks.get(worker_id, 0) */
static int
matched_of(PyObject *matched, PyObject *worker_id, long long *out)
{
    PyObject *v;
    if (PyDict_CheckExact(matched)) {
        v = PyDict_GetItemWithError(matched, worker_id); /* borrowed */
        if (v == NULL) {
            if (PyErr_Occurred())
                return -1;
            *out = 0;
            return 0;
        }
        *out = PyLong_AsLongLong(v);
    }
    else {
        /* Any other Mapping: its .get(), which never adds an entry. */
        v = PyObject_CallMethodObjArgs(matched, s_get, worker_id, s_zero, NULL);
        if (v == NULL)
            return -1;
        *out = PyLong_AsLongLong(v);
        Py_DECREF(v);
    }
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

/* E_C(R, P), written exactly as PrefillModel.predict evaluates it. */
static inline double
predict(const DegreeRow *row, double alpha, double c, double b, long long uncached, long long cached)
{
    long long pairs = uncached * cached + uncached * (uncached + 1) / 2;
    return row->d + row->a * (double)uncached + b * (double)cached
           + (c * (double)uncached + alpha * (double)pairs) / (double)row->degree;
}

static PyObject *
place_fields(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6) {
        PyErr_Format(PyExc_TypeError, "place_fields() takes 6 arguments (%zd given)", nargs);
        return NULL;
    }
    long long length = PyLong_AsLongLong(args[0]);
    if (length == -1 && PyErr_Occurred())
        return NULL;
    PyObject *matched = args[1], *workers = args[2], *model = args[3], *params = args[4];
    long long block_size = PyLong_AsLongLong(args[5]);
    if (block_size == -1 && PyErr_Occurred())
        return NULL;
    /* Token counts stay far below this; above it the int64 pair count
     * R·P + R(R+1)/2 could overflow where Python's ints would not. */
    if (block_size < 1) {
        PyErr_SetString(PyExc_ValueError, "place_fields: block_size must be >= 1");
        return NULL;
    }
    if (length > (1LL << 31) || block_size > (1LL << 31)) {
        PyErr_SetString(PyExc_OverflowError, "place_fields: length or block_size above 2**31");
        return NULL;
    }
    int has_matched = 0;
    if (matched != Py_None) {
        has_matched = PyObject_IsTrue(matched);
        if (has_matched < 0)
            return NULL;
    }

    double alpha, c, b, beta, lam, beta_busy;
    long long per_gpu_limit;
    if (get_double(model, s_alpha, &alpha) || get_double(model, s_c, &c) || get_double(model, s_b, &b)
        || get_longlong(model, s_max_tokens_per_gpu, &per_gpu_limit)
        || get_double(params, s_beta, &beta) || get_double(params, s_lam, &lam)
        || get_double(params, s_beta_busy, &beta_busy))
        return NULL;

    /* A tuple snapshot (a copy unless it already is one): attribute reads
     * could in principle run Python code that changes the caller's list, and
     * the candidates below borrow their references from this snapshot. */
    PyObject *seq = PySequence_Tuple(workers);
    if (seq == NULL)
        return NULL;
    PyObject *result = NULL, *d_map = NULL, *a_map = NULL;
    Py_ssize_t n_workers = PyTuple_GET_SIZE(seq);
    PyObject **items = &PyTuple_GET_ITEM(seq, 0);
    Cand *cands = PyMem_Malloc(sizeof(Cand) * (n_workers ? n_workers : 1));
    DegreeRow rows[MAX_DEGREES];
    int n_rows = 0;
    if (cands == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    d_map = PyObject_GetAttr(model, s_d);
    a_map = PyObject_GetAttr(model, s_a);
    if (d_map == NULL || a_map == NULL)
        goto done;

    /* One pass: available workers whose degree the model supports and whose
     * memory holds the request (== placement.candidates()). */
    Py_ssize_t n = 0;
    long long c_min = 0;
    for (Py_ssize_t i = 0; i < n_workers; i++) {
        PyObject *w = items[i];
        PyObject *v = PyObject_GetAttr(w, s_available);
        if (v == NULL)
            goto done;
        int available = PyObject_IsTrue(v);
        Py_DECREF(v);
        if (available < 0)
            goto done;
        if (!available)
            continue;
        long long degree;
        if (get_longlong(w, s_degree, &degree))
            goto done;
        int r = 0;
        while (r < n_rows && rows[r].degree != degree)
            r++;
        if (r == n_rows) {
            if (n_rows == MAX_DEGREES) {
                /* Far beyond any real pool (degrees are powers of two up to a domain). */
                PyErr_SetString(PyExc_ValueError, "more than 64 distinct worker degrees");
                goto done;
            }
            DegreeRow *row = &rows[n_rows++];
            row->degree = degree;
            int found = coefficient(d_map, degree, &row->d);
            if (found < 0)
                goto done;
            if (found && coefficient(a_map, degree, &row->a) < 0)
                goto done;
            row->supported = found && length <= per_gpu_limit * degree;
        }
        if (!rows[r].supported)
            continue;
        Cand *cand = &cands[n++];
        cand->worker = w;
        cand->degree = degree;
        cand->row = r;
        if (get_double(w, s_outstanding_s, &cand->outstanding))
            goto done;
        v = PyObject_GetAttr(w, s_queued);
        if (v == NULL)
            goto done;
        cand->queued = PyObject_IsTrue(v);
        Py_DECREF(v);
        if (cand->queued < 0)
            goto done;
        if (c_min == 0 || degree < c_min)
            c_min = degree;
    }
    if (n == 0) {
        result = Py_NewRef(Py_None);
        goto done;
    }

    if (beta_busy != beta) {
        /* β_i = β + (β_busy − β) · (share of candidates with requests waiting) */
        long long busy = 0;
        for (Py_ssize_t i = 0; i < n; i++)
            busy += cands[i].queued != 0;
        beta += (beta_busy - beta) * (double)busy / (double)n;
    }

    long long max_cached = length - 1;
    Py_ssize_t best = 0;
    double best_cost = 0.0, best_est = 0.0, pref_own = 0.0;
    long long best_p = 0, pref_degree = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        Cand *cand = &cands[i];
        long long m = 0;
        if (has_matched) {
            PyObject *wid = PyObject_GetAttr(cand->worker, s_id);
            if (wid == NULL)
                goto done;
            int err = matched_of(matched, wid, &m);
            Py_DECREF(wid);
            if (err)
                goto done;
        }
        /* == cached_tokens(m, length, block_size) */
        long long p = m <= 0 ? 0
                      : m > max_cached ? max_cached /* m·block_size > max_cached, no overflow */
                      : m * block_size <= max_cached ? m * block_size : max_cached;
        const DegreeRow *row = &rows[cand->row];
        double est = predict(row, alpha, c, b, length - p, p);
        double own = (beta + lam * ((double)cand->degree / (double)c_min - 1.0)) * est;
        double cost = cand->outstanding + own;
        int take = i == 0 || cost < best_cost;
        if (!take && cost == best_cost) {
            /* placement._tie_key: an idle worker before a busy one, the longest idle
             * first; otherwise the first in the caller's order. free_at is read
             * only here, so a decision without a tie reads nothing more. */
            int busy = cand->outstanding > 0.0, best_busy = cands[best].outstanding > 0.0;
            if (busy != best_busy) {
                take = !busy;
            } else if (!busy) {
                double since, best_since;
                if (get_double(cand->worker, s_free_at, &since) ||
                    get_double(cands[best].worker, s_free_at, &best_since))
                    goto done;
                take = since < best_since;
            }
        }
        if (take) {
            best = i;
            best_cost = cost;
            best_est = est;
            best_p = p;
        }
        if (i == 0 || own < pref_own) {
            pref_own = own;
            pref_degree = cand->degree;
        }
    }
    PyObject *best_id = PyObject_GetAttr(cands[best].worker, s_id);
    if (best_id == NULL)
        goto done;
    result = Py_BuildValue("(NdLdL)", best_id, best_est, best_p, best_cost, pref_degree);

done:
    PyMem_Free(cands);
    Py_XDECREF(d_map);
    Py_XDECREF(a_map);
    Py_DECREF(seq);
    return result;
}

static PyMethodDef methods[] = {
    {"place_fields", (PyCFunction)(void (*)(void))place_fields, METH_FASTCALL,
     "place_fields(length, matched_blocks, workers, model, params, block_size)\n"
     "--\n\n"
     "placement.place_fields, compiled: the same result, in C."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "vertumnus.core._placement",
    "Compiled placement hot path (see placement.place_fields).", -1, methods,
};

PyMODINIT_FUNC
PyInit__placement(void)
{
#define INTERN(var, text) \
    if ((var = PyUnicode_InternFromString(text)) == NULL) return NULL;
    INTERN(s_available, "available");
    INTERN(s_degree, "degree");
    INTERN(s_id, "id");
    INTERN(s_outstanding_s, "outstanding_s");
    INTERN(s_queued, "queued");
    INTERN(s_free_at, "free_at");
    INTERN(s_d, "d");
    INTERN(s_a, "a");
    INTERN(s_alpha, "alpha");
    INTERN(s_c, "c");
    INTERN(s_b, "b");
    INTERN(s_max_tokens_per_gpu, "max_tokens_per_gpu");
    INTERN(s_beta, "beta");
    INTERN(s_lam, "lam");
    INTERN(s_beta_busy, "beta_busy");
    INTERN(s_get, "get");
    if ((s_zero = PyLong_FromLong(0)) == NULL) return NULL;
#undef INTERN
    return PyModule_Create(&moduledef);
}
