/* Compiled what-if replay: whatif.replay_py of vertumnus/core/whatif.py.
 *
 * Why C: the what-if check replays a window's requests on every candidate
 * composition. In CPython one request costs ~5 us (a heap look-up per degree,
 * the holders of its prefix, the bookkeeping), so a 1,024-GPU pool's window
 * (~10,000 requests) takes ~70 ms per candidate; the check's budget is 50 ms
 * for all of them (issue 12, bench/planner_speed.py). Here it is well under
 * a millisecond per thousand requests.
 *
 * Contract: the TTFTs are *identical* to replay_py's -- same operations in
 * the same order, the same tie-breaks (the first minimum over the degrees'
 * least-loaded workers, then over the prefix's holders least recent first;
 * the least-loaded worker of a degree is the least (free time, worker)).
 * tests/core/test_whatif.py checks both on random tables. setup.py compiles
 * this file with -ffp-contract=off so that no fused multiply-add changes a bit.
 *
 * Where it differs in *how*, for speed (22 % fewer instructions, counted by
 * callgrind): a degree's workers are an indexed heap whose chosen worker sifts
 * down in place (the Python twin pushes a new entry and drops stale ones
 * lazily: the same top), each entry holding its key; only the best worker and
 * its cost are carried through the candidates, its start and prefill time
 * read again after; a request's holders are marked once per request
 * instead of looked up once per degree; a waiting worker has one entry in the
 * pending heap, moved on to its latest request's start when the first is
 * passed, instead of one per waiting request (the same count of waiting
 * workers at every arrival); a composition of some of the table's degrees
 * reads their rows in place (``index``) instead of a copy of them; and beta_i is
 * read from a table per count of waiting workers, not divided out per request.
 *
 * Pure: no I/O, no global state.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <string.h>

#include "_minheap.h"

/* Per degree an indexed min-heap of its workers keyed by (free time, worker):
 * the top is the least-loaded worker; a worker's key only grows (it is given
 * a request), so an update sifts it down from where it is. Each entry holds
 * its key, so that a sift reads one array. */
typedef struct {
    Entry *e; /* heap order */
    Py_ssize_t n;
} WHeap;

static void
wheap_sift_up(WHeap *h, Py_ssize_t *pos, Py_ssize_t i)
{
    Entry x = h->e[i];
    while (i > 0) {
        Py_ssize_t p = (i - 1) / 2;
        if (!less(&x, &h->e[p]))
            break;
        h->e[i] = h->e[p];
        pos[h->e[i].w] = i;
        i = p;
    }
    h->e[i] = x;
    pos[x.w] = i;
}

/* The entry at i got the later key t: down to where it belongs. e[n] is a sentinel
 * greater than every entry, so that a node's right child can always be read, and
 * the child is picked without a branch (half those picks would be mispredicted). */
static void
wheap_sift_down(WHeap *h, Py_ssize_t *pos, Py_ssize_t i, double t)
{
    Entry x = {t, h->e[i].w};
    Entry *e = h->e;
    for (;;) {
        Py_ssize_t c = 2 * i + 1;
        if (c >= h->n)
            break;
        const Entry *l = &e[c], *r = &e[c + 1];
        c += (r->t < l->t) | ((r->t == l->t) & (r->w < l->w));
        if (!less(&e[c], &x))
            break;
        e[i] = e[c];
        pos[e[i].w] = i;
        i = c;
    }
    e[i] = x;
    pos[x.w] = i;
}

/* whatif.HOLDERS: the workers a prefix is kept at in the replay. */
#define HOLDERS 8

typedef struct {
    Py_ssize_t w[HOLDERS];
    Py_ssize_t n;
} Holders;

/* A read-only contiguous buffer of the given item size. */
static int
get_buffer(PyObject *obj, Py_buffer *view, Py_ssize_t itemsize, const char *name)
{
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return -1;
    if (view->itemsize != itemsize) {
        PyErr_Format(PyExc_TypeError, "%s: expected items of %zd bytes", name, itemsize);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* replay(arrivals, hit, miss, index, reused, carry_ptr, carry_ids, n_prefixes, starts,
 *        lam_terms, beta, extra, out[, held]) -> None; out (float64, n, writable) receives
 *        the TTFTs (nan: no worker can hold the request).
 * hit/miss: float64 (table rows, n), one row per degree of the table; index: per degree
 * of the composition (ascending) its table row, so that a composition of some of the
 * table's degrees reads the table in place; starts: per degree of the composition a
 * sequence of the start times of its workers (0.0 for those serving from the
 * beginning), its length that degree's worker count; held (int64, n_prefixes, or None):
 * per prefix id the worker (numbered as starts, degree by degree) holding it before
 * the first request, -1 for none. */
static PyObject *
replay(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 13 && nargs != 14) {
        PyErr_SetString(PyExc_TypeError, "replay takes 13 or 14 arguments");
        return NULL;
    }
    Py_buffer arr = {0}, hit = {0}, miss = {0}, reused = {0}, cptr = {0}, cids = {0}, outb = {0};
    Py_buffer heldb = {0};
    PyObject *result = NULL;
    WHeap *heaps = NULL;
    Heap pending = {NULL, 0, 0};
    Py_ssize_t *pos = NULL, *mark = NULL;
    Holders *holders = NULL;
    double *free_t = NULL, *last_start = NULL, *lam = NULL, *beta_of = NULL;
    Py_ssize_t *row_of = NULL;
    const double **hit_row = NULL, **miss_row = NULL; /* per degree of the composition */
    char *waiting = NULL;
    Py_ssize_t rows = 0, n_workers = 0, n_prefixes = 0;

    if (get_buffer(args[0], &arr, 8, "arrivals") < 0)
        goto done;
    if (get_buffer(args[1], &hit, 8, "hit") < 0 || get_buffer(args[2], &miss, 8, "miss") < 0)
        goto done;
    if (get_buffer(args[4], &reused, 8, "reused") < 0 || get_buffer(args[5], &cptr, 8, "carry_ptr") < 0 ||
        get_buffer(args[6], &cids, 8, "carry_ids") < 0)
        goto done;
    if (PyObject_GetBuffer(args[12], &outb, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE | PyBUF_FORMAT) < 0)
        goto done;
    n_prefixes = PyLong_AsSsize_t(args[7]);
    if (n_prefixes < 0 && PyErr_Occurred())
        goto done;
    /* held (optional): per prefix id, the worker holding it before the first request
     * (-1: none), as replay_py's ``held``. */
    if (nargs == 14 && args[13] != Py_None) {
        if (get_buffer(args[13], &heldb, 8, "held") < 0)
            goto done;
        if (heldb.len < n_prefixes * 8) {
            PyErr_SetString(PyExc_ValueError, "replay: held is shorter than n_prefixes");
            goto done;
        }
    }
    PyObject *starts = PySequence_Fast(args[8], "starts must be a sequence");
    if (starts == NULL)
        goto done;
    PyObject *lam_seq = PySequence_Fast(args[9], "lam_terms must be a sequence");
    if (lam_seq == NULL) {
        Py_DECREF(starts);
        goto done;
    }
    PyObject *index = PySequence_Fast(args[3], "index must be a sequence");
    if (index == NULL) {
        Py_DECREF(starts);
        Py_DECREF(lam_seq);
        goto done;
    }
    double beta = PyFloat_AsDouble(args[10]);
    double extra = PyFloat_AsDouble(args[11]);
    rows = PySequence_Fast_GET_SIZE(starts);
    Py_ssize_t n = arr.len / 8;
    Py_ssize_t table_rows = n > 0 ? hit.len / (n * 8) : 0;
    const double *a_t = arr.buf, *hit_t = hit.buf, *miss_t = miss.buf;
    const long long *reused_t = reused.buf, *cptr_t = cptr.buf, *cids_t = cids.buf;
    if (PyErr_Occurred() || rows < 1 || PySequence_Fast_GET_SIZE(lam_seq) != rows ||
        PySequence_Fast_GET_SIZE(index) != rows || hit.len != table_rows * n * 8 ||
        miss.len != hit.len || reused.len != n * 8 || cptr.len != (n + 1) * 8 ||
        outb.len != n * 8 || outb.itemsize != 8) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "replay: inconsistent table shapes");
        Py_DECREF(starts);
        Py_DECREF(lam_seq);
        Py_DECREF(index);
        goto done;
    }
    heaps = PyMem_Calloc((size_t)rows, sizeof(WHeap));
    lam = PyMem_Calloc((size_t)rows, sizeof(double));
    hit_row = PyMem_Calloc((size_t)rows, sizeof(double *));
    miss_row = PyMem_Calloc((size_t)rows, sizeof(double *));
    if (heaps == NULL || lam == NULL || hit_row == NULL || miss_row == NULL) {
        PyErr_NoMemory();
        Py_DECREF(starts);
        Py_DECREF(lam_seq);
        Py_DECREF(index);
        goto done;
    }
    for (Py_ssize_t k = 0; k < rows; k++) {
        Py_ssize_t r = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(index, k));
        if (!PyErr_Occurred() && (r < 0 || r >= table_rows))
            PyErr_SetString(PyExc_ValueError, "replay: an index outside the table's rows");
        if (PyErr_Occurred()) {
            Py_DECREF(starts);
            Py_DECREF(lam_seq);
            Py_DECREF(index);
            goto done;
        }
        hit_row[k] = hit_t + r * n;
        miss_row[k] = miss_t + r * n;
    }
    Py_DECREF(index);
    for (Py_ssize_t k = 0; k < rows; k++) {
        lam[k] = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(lam_seq, k));
        PyObject *row = PySequence_Fast(PySequence_Fast_GET_ITEM(starts, k), "starts rows must be sequences");
        if (row == NULL || PyErr_Occurred()) {
            Py_XDECREF(row);
            Py_DECREF(starts);
            Py_DECREF(lam_seq);
            goto done;
        }
        n_workers += PySequence_Fast_GET_SIZE(row);
        Py_DECREF(row);
    }
    free_t = PyMem_Calloc((size_t)n_workers + 1, sizeof(double));
    last_start = PyMem_Calloc((size_t)n_workers + 1, sizeof(double));
    row_of = PyMem_Calloc((size_t)n_workers + 1, sizeof(Py_ssize_t));
    pos = PyMem_Calloc((size_t)n_workers + 1, sizeof(Py_ssize_t));
    mark = PyMem_Calloc((size_t)n_workers + 1, sizeof(Py_ssize_t));
    waiting = PyMem_Calloc((size_t)n_workers + 1, 1);
    beta_of = PyMem_Calloc((size_t)n_workers + 1, sizeof(double));
    holders = PyMem_Calloc((size_t)n_prefixes + 1, sizeof(Holders));
    if (free_t == NULL || last_start == NULL || row_of == NULL || pos == NULL || mark == NULL ||
        waiting == NULL || beta_of == NULL || holders == NULL) {
        PyErr_NoMemory();
        Py_DECREF(starts);
        Py_DECREF(lam_seq);
        goto done;
    }
    Py_ssize_t w = 0;
    for (Py_ssize_t k = 0; k < rows; k++) {
        PyObject *row = PySequence_Fast(PySequence_Fast_GET_ITEM(starts, k), "starts rows must be sequences");
        Py_ssize_t m = PySequence_Fast_GET_SIZE(row);
        heaps[k].e = PyMem_Calloc((size_t)m + 1, sizeof(Entry));
        if (heaps[k].e == NULL) {
            PyErr_NoMemory();
            Py_DECREF(row);
            Py_DECREF(starts);
            Py_DECREF(lam_seq);
            goto done;
        }
        for (Py_ssize_t j = 0; j < m; j++, w++) {
            double f = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(row, j));
            free_t[w] = f;
            row_of[w] = k;
            heaps[k].e[heaps[k].n++] = (Entry){f, w};
            wheap_sift_up(&heaps[k], pos, heaps[k].n - 1);
        }
        heaps[k].e[m] = (Entry){INFINITY, PY_SSIZE_T_MAX}; /* the sentinel */
        Py_DECREF(row);
    }
    Py_DECREF(starts);
    Py_DECREF(lam_seq);
    if (PyErr_Occurred())
        goto done;
    for (Py_ssize_t k = 0; k < rows; k++) {
        if (heaps[k].n == 0) {
            PyErr_SetString(PyExc_ValueError, "replay: a degree without workers");
            goto done;
        }
    }

    if (heldb.obj != NULL) {
        const long long *held_t = heldb.buf;
        for (Py_ssize_t p = 0; p < n_prefixes; p++) {
            if (held_t[p] >= 0 && held_t[p] < n_workers) {
                holders[p].w[0] = (Py_ssize_t)held_t[p];
                holders[p].n = 1;
            }
        }
    }

    /* beta_i per count of waiting workers, the same floats as per request: a division
     * on every request's path is gone. */
    for (Py_ssize_t q = 0; q <= n_workers; q++)
        beta_of[q] = extra != 0.0 ? beta + extra * (double)q / (double)n_workers : beta;
    double *out_t = outb.buf;
    Py_ssize_t n_waiting = 0;
    int out_of_memory = 0;
    /* The loop touches no Python object: other threads (the other candidates'
     * replays, see control.Controller) run meanwhile. */
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        double at = a_t[i];
        /* A waiting worker has one entry: when its oldest waiting request was to
         * start. Past it, the worker waits on if a later request of it has not
         * started yet (its entry moves to that one's start), else it stops. */
        while (pending.n > 0 && pending.a[0].t <= at) {
            Py_ssize_t pw = pending.a[0].w;
            heap_pop(&pending);
            if (last_start[pw] > at) {
                if (heap_push(&pending, last_start[pw], pw) < 0) {
                    out_of_memory = 1;
                    break;
                }
            } else {
                waiting[pw] = 0;
                n_waiting--;
            }
        }
        if (out_of_memory)
            break;
        double b = beta_of[n_waiting];
        long long pid = reused_t[i];
        Holders *hold = (pid >= 0 && pid < n_prefixes) ? &holders[pid] : NULL;
        if (hold != NULL)
            for (Py_ssize_t j = 0; j < hold->n; j++)
                mark[hold->w[j]] = i + 1; /* the holders of this request's prefix */
        /* Only the best worker and its cost are carried through the loops (the
         * compiler selects them without a branch); its start and prefill time
         * are read again after, the same floats. */
        Py_ssize_t best_w = -1;
        double best_cost = INFINITY;
        for (Py_ssize_t k = 0; k < rows; k++) {
            Py_ssize_t top = heaps[k].e[0].w;
            double f = heaps[k].e[0].t;
            double e = mark[top] == i + 1 ? hit_row[k][i] : miss_row[k][i];
            double start = f > at ? f : at;
            double cost = (start - at) + (b + lam[k]) * e;
            int better = cost < best_cost;
            best_w = better ? top : best_w;
            best_cost = better ? cost : best_cost;
        }
        if (hold != NULL) {
            for (Py_ssize_t j = 0; j < hold->n; j++) {
                Py_ssize_t hw = hold->w[j];
                Py_ssize_t k = row_of[hw];
                double f = free_t[hw];
                double start = f > at ? f : at;
                double cost = (start - at) + (b + lam[k]) * hit_row[k][i];
                int better = cost < best_cost;
                best_w = better ? hw : best_w;
                best_cost = better ? cost : best_cost;
            }
        }
        if (best_w < 0) {
            out_t[i] = NAN;
            continue;
        }
        Py_ssize_t best_k = row_of[best_w];
        double best_e = mark[best_w] == i + 1 ? hit_row[best_k][i] : miss_row[best_k][i];
        double best_start = free_t[best_w] > at ? free_t[best_w] : at;
        double finish = best_start + best_e;
        free_t[best_w] = finish;
        wheap_sift_down(&heaps[best_k], pos, pos[best_w], finish);
        last_start[best_w] = best_start;
        if (best_start > at && !waiting[best_w]) {
            waiting[best_w] = 1;
            n_waiting++;
            if (heap_push(&pending, best_start, best_w) < 0) {
                out_of_memory = 1;
                break;
            }
        }
        for (long long c = cptr_t[i]; c < cptr_t[i + 1]; c++) {
            long long p = cids_t[c];
            if (p < 0 || p >= n_prefixes)
                continue;
            /* The last HOLDERS workers that served the prefix, least recent first. */
            Holders *hp = &holders[p];
            Py_ssize_t j = 0;
            while (j < hp->n && hp->w[j] != best_w)
                j++;
            if (j < hp->n)
                hp->n--; /* served again: it moves to the end */
            else if (hp->n >= HOLDERS)
                j = 0, hp->n--; /* the least recent holder has evicted it */
            memmove(hp->w + j, hp->w + j + 1, (size_t)(hp->n - j) * sizeof(Py_ssize_t));
            hp->w[hp->n++] = best_w;
        }
        out_t[i] = finish - at;
    }
    Py_END_ALLOW_THREADS
    if (out_of_memory)
        PyErr_NoMemory();
    else
        result = Py_NewRef(Py_None);

done:
    if (heaps != NULL) {
        for (Py_ssize_t k = 0; k < rows; k++)
            PyMem_Free(heaps[k].e);
        PyMem_Free(heaps);
    }
    PyMem_Free(holders);
    PyMem_RawFree(pending.a);
    PyMem_Free(free_t);
    PyMem_Free(last_start);
    PyMem_Free(row_of);
    PyMem_Free(pos);
    PyMem_Free(mark);
    PyMem_Free(waiting);
    PyMem_Free(beta_of);
    PyMem_Free(lam);
    PyMem_Free((void *)hit_row);
    PyMem_Free((void *)miss_row);
    if (arr.obj) PyBuffer_Release(&arr);
    if (hit.obj) PyBuffer_Release(&hit);
    if (miss.obj) PyBuffer_Release(&miss);
    if (reused.obj) PyBuffer_Release(&reused);
    if (cptr.obj) PyBuffer_Release(&cptr);
    if (cids.obj) PyBuffer_Release(&cids);
    if (outb.obj) PyBuffer_Release(&outb);
    if (heldb.obj) PyBuffer_Release(&heldb);
    return result;
}

/* Order statistics for the P90 of an estimate (whatif.p90): numpy's partition
 * costs ~7.6 ns per value, a fifth of a look's non-replay time at 1,024 GPUs. */

/* Rearranges a[0..n) so that a[k] is the k-th smallest (0-based): Hoare's
 * selection with a median-of-three pivot. Exact always; quadratic only on
 * adversarial orders, which a replay's TTFTs are not. */
static void
select_kth(double *a, Py_ssize_t n, Py_ssize_t k)
{
    Py_ssize_t lo = 0, hi = n - 1;
    while (hi > lo) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        double x = a[lo], y = a[mid], z = a[hi];
        double pivot = x < y ? (y < z ? y : (x < z ? z : x)) : (x < z ? x : (y < z ? z : y));
        Py_ssize_t i = lo, j = hi;
        while (i <= j) {
            while (a[i] < pivot)
                i++;
            while (pivot < a[j])
                j--;
            if (i <= j) {
                double t = a[i];
                a[i] = a[j];
                a[j] = t;
                i++;
                j--;
            }
        }
        if (k <= j)
            hi = j;
        else if (k >= i)
            lo = i;
        else
            return; /* a[j+1..i) all equal the pivot */
    }
}

/* The least of a[0..n). */
static double
least(const double *a, Py_ssize_t n)
{
    double m = a[0];
    for (Py_ssize_t i = 1; i < n; i++)
        m = a[i] < m ? a[i] : m;
    return m;
}

/* order_pair(values, k) -> (the k-th smallest, the (k+1)-th smallest), 0-based,
 * of a float64 array without nan, 0 <= k < k + 1 < len(values).
 *
 * A strided sample brackets the k-th value; one branchless pass counts the
 * values below the bracket and copies those within it; a selection in that
 * copy finds both. Where the bracket misses (a sample unlike the whole, or more
 * within it than its room), a selection over a copy of every value does it.
 * Either way the exact values. The sample grows with the values (up to 8,192):
 * a shadow pool's comparison reads the P90 of ~460,000 TTFTs per shadow at 1,024
 * GPUs, where a narrower bracket leaves a tenth as many to select among. */
static PyObject *
order_pair(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "order_pair takes 2 arguments");
        return NULL;
    }
    Py_buffer view = {0};
    if (get_buffer(args[0], &view, 8, "values") < 0)
        return NULL;
    Py_ssize_t n = view.len / 8;
    Py_ssize_t k = PyLong_AsSsize_t(args[1]);
    if (k == -1 && PyErr_Occurred()) {
        PyBuffer_Release(&view);
        return NULL;
    }
    if (k < 0 || k + 1 >= n) {
        PyBuffer_Release(&view);
        PyErr_Format(PyExc_ValueError, "order_pair: k=%zd outside [0, %zd)", k, n - 1);
        return NULL;
    }
    const double *x = view.buf;
    double first = 0.0, second = 0.0;
    int found = 0, failed = 0;
    Py_BEGIN_ALLOW_THREADS
    Py_ssize_t m = n / 16 < 8192 ? n / 16 : 8192; /* the sample */
    if (m >= 64) {
        Py_ssize_t stride = n / m;
        /* The sample's ranks around k's, widened by ~3 standard deviations of
         * a sample rank (sqrt(m)/2 at most); rl < rh since r < m and g > 0. */
        Py_ssize_t r = (Py_ssize_t)((double)k * (double)m / (double)n);
        Py_ssize_t g = 2 + (Py_ssize_t)(1.5 * sqrt((double)m));
        Py_ssize_t rl = r - g < 0 ? 0 : r - g, rh = r + g + 1 >= m ? m - 1 : r + g + 1;
        /* The bracket holds about (rh - rl) / m of the values: room for twice that
         * (more, and the selection over every value below does it). */
        Py_ssize_t cap = (Py_ssize_t)(2.0 * (double)(rh - rl + 1) / (double)m * (double)n) + 64;
        cap = cap < m ? m : cap > n ? n : cap;
        double *buf = PyMem_RawMalloc((size_t)(cap + 1) * sizeof(double));
        if (buf != NULL) {
            for (Py_ssize_t i = 0; i < m; i++)
                buf[i] = x[i * stride];
            select_kth(buf, m, rh);
            double high = buf[rh];
            select_kth(buf, rh, rl);
            double low = buf[rl];
            Py_ssize_t below = 0, within = 0;
            for (Py_ssize_t i = 0; i < n; i++) {
                double v = x[i];
                below += v < low;
                buf[within] = v;
                within += (v >= low) & (v <= high) & (within < cap);
            }
            if (within < cap && below <= k && k + 1 < below + within) {
                select_kth(buf, within, k - below);
                first = buf[k - below];
                second = least(buf + (k - below) + 1, within - (k - below) - 1);
                found = 1;
            }
            PyMem_RawFree(buf);
        }
    }
    if (!found) {
        double *buf = PyMem_RawMalloc((size_t)n * sizeof(double));
        if (buf == NULL)
            failed = 1;
        else {
            memcpy(buf, x, (size_t)n * sizeof(double));
            select_kth(buf, n, k);
            first = buf[k];
            second = least(buf + k + 1, n - k - 1);
            PyMem_RawFree(buf);
        }
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    if (failed)
        return PyErr_NoMemory();
    return Py_BuildValue("(dd)", first, second);
}

static PyMethodDef methods[] = {
    {"replay", (PyCFunction)(void (*)(void))replay, METH_FASTCALL,
     "replay(arrivals, hit, miss, index, reused, carry_ptr, carry_ids, n_prefixes, starts, "
     "lam_terms, beta, extra, out)\n--\n\nwhatif.replay_py, compiled: the same TTFTs, in C, into out."},
    {"order_pair", (PyCFunction)(void (*)(void))order_pair, METH_FASTCALL,
     "order_pair(values, k)\n--\n\nThe k-th and (k+1)-th smallest of a float64 array "
     "without nan (0-based): np.partition's, faster."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "vertumnus.core._whatif",
    "Compiled what-if replay (see whatif.replay_py).", -1, methods,
};

PyMODINIT_FUNC
PyInit__whatif(void)
{
    return PyModule_Create(&moduledef);
}
