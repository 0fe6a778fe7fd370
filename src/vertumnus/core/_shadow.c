/* Compiled shadow pool: the serving core of shadow.Shadow (vertumnus/core/shadow.py).
 *
 * Why C: a shadow places every request the pool serves. In CPython one placement
 * costs 50-90 us (a heap per degree, the holders of the request's prefix, an
 * OrderedDict per worker's cache), and each cached block ~450 bytes; seven shadows of
 * a 1,024-GPU pool took a third of a core and gigabytes, so the controller kept none
 * above 64 GPUs (docs/benchmarks/adaptive.md, "Shadow pools that scale"). Here a
 * placement costs a few microseconds and a cached block a few dozen bytes.
 *
 * Contract: the TTFTs, free times and every cache's LRU order are *identical* to
 * Shadow's searched path (Shadow._search): the same candidates costed with the same
 * floating-point operations in the same order, the same tie-breaks (cost, then free
 * time, then worker number). tests/core/test_shadow.py holds the two to each other
 * request by request. setup.py compiles this file with -ffp-contract=off so that no
 * fused multiply-add changes a bit. Only monotone profiles (shadow.monotone) come
 * here: a composition whose profile is not is scanned, in Python.
 *
 * How it keeps its state:
 *   - per degree a lazy min-heap of (free time, worker) (_minheap.h, shared with
 *     _whatif.c); a stale top (the worker's free time moved on) is dropped when it
 *     comes up, as heapq's twin does;
 *   - the workers with a request waiting: a heap of (start, worker), a flag each;
 *   - the caches: one node per (worker, cached block) in a pool of nodes, each on
 *     its worker's LRU list (least recent at the head) and on its block's list of
 *     holders; a hash of (block key, worker) -> node, and a hash of block key ->
 *     (holders' count, first holder). Both hashes probe linearly, are kept at
 *     most three quarters full and delete by shifting back, so they need no
 *     tombstones; the node pool grows by half (it is most of the memory).
 *
 * Pure: no I/O, no global state. The GIL is held throughout (one placement is short).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "_minheap.h"

/* heap_push with the GIL held: a Python MemoryError when it cannot grow. */
static int
push(Heap *h, double t, int32_t w)
{
    if (heap_push(h, t, w) < 0) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static uint64_t
mix64(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ULL;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

/* One worker's cached block. */
typedef struct {
    uint64_t key;
    int32_t worker;
    int32_t prev, next;   /* the worker's LRU list, least recent first; -1 ends */
    int32_t hprev, hnext; /* the block's holders; -1 ends */
} Node;

/* A block some worker holds: how many do, and the first of them (count 0: an empty slot). */
typedef struct {
    uint64_t key;
    int32_t count;
    int32_t head;
} Held;

typedef struct {
    PyObject_HEAD
    int32_t n;       /* workers, degrees ascending */
    int32_t groups;  /* degrees */
    int32_t *degree; /* per worker */
    int32_t *group;  /* per worker: its degree's number */
    int32_t *first;  /* per degree: its first worker (they are contiguous) */
    double *lam, *d, *a;
    int64_t *max_tokens, *capacity, *size;
    double b, c, alpha, beta, extra;
    int64_t block_size;
    double *free;
    Heap *heaps;
    /* The workers with a request waiting (whatif.WaitingWorkers). */
    double *last_start;
    char *waiting;
    int32_t n_waiting;
    Heap pending;
    /* The caches. */
    int32_t *lru_head, *lru_tail;
    Node *nodes;
    int32_t n_nodes, nodes_cap, free_node;
    int32_t *slots; /* (key, worker) -> node, -1 empty */
    uint32_t slots_mask;
    int64_t slots_used;
    Held *held;
    uint32_t held_mask;
    int64_t held_used;
    /* Per placement. */
    uint32_t *seen;
    uint32_t stamp;
    int32_t *path;
    int64_t path_cap;
    char *open;
    Entry *soonest_new;
} Core;

/* Deleting slot i of a linearly probed table: the entry at j, whose home is k,
 * stays where it is when k lies cyclically in (i, j] (moving it to i would put it
 * before its home); else it moves back to i. */
static int
stays(uint32_t i, uint32_t j, uint32_t k)
{
    return i <= j ? (i < k && k <= j) : (i < k || k <= j);
}

static uint32_t
node_hash(uint64_t key, int32_t worker)
{
    return (uint32_t)mix64(key ^ ((uint64_t)(uint32_t)worker * 0xD6E8FEB86659FD93ULL));
}

/* The slot of (key, worker): where its node is, or the empty slot it would take. */
static uint32_t
slot_of(const Core *s, uint64_t key, int32_t worker)
{
    uint32_t i = node_hash(key, worker) & s->slots_mask;
    for (;;) {
        int32_t nd = s->slots[i];
        if (nd < 0 || (s->nodes[nd].key == key && s->nodes[nd].worker == worker))
            return i;
        i = (i + 1) & s->slots_mask;
    }
}

static int
slots_grow(Core *s)
{
    if (s->slots_mask >= 0x3fffffffu) {
        PyErr_SetString(PyExc_MemoryError, "shadow: cache index past 2^30 slots");
        return -1;
    }
    uint32_t size = 2 * (s->slots_mask + 1);
    int32_t *slots = PyMem_Malloc((size_t)size * sizeof(int32_t));
    if (slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    memset(slots, 0xff, (size_t)size * sizeof(int32_t));
    uint32_t old = s->slots_mask + 1;
    int32_t *prev = s->slots;
    s->slots = slots;
    s->slots_mask = size - 1;
    for (uint32_t i = 0; i < old; i++) {
        int32_t nd = prev[i];
        if (nd >= 0)
            slots[slot_of(s, s->nodes[nd].key, s->nodes[nd].worker)] = nd;
    }
    PyMem_Free(prev);
    return 0;
}

static void
slots_delete(Core *s, uint32_t i)
{
    uint32_t mask = s->slots_mask;
    uint32_t j = i;
    for (;;) {
        j = (j + 1) & mask;
        int32_t nd = s->slots[j];
        if (nd < 0)
            break;
        if (stays(i, j, node_hash(s->nodes[nd].key, s->nodes[nd].worker) & mask))
            continue;
        s->slots[i] = nd;
        i = j;
    }
    s->slots[i] = -1;
    s->slots_used--;
}

static uint32_t
held_slot(const Core *s, uint64_t key)
{
    uint32_t i = (uint32_t)mix64(key) & s->held_mask;
    while (s->held[i].count != 0 && s->held[i].key != key)
        i = (i + 1) & s->held_mask;
    return i;
}

static int
held_grow(Core *s)
{
    if (s->held_mask >= 0x3fffffffu) {
        PyErr_SetString(PyExc_MemoryError, "shadow: block index past 2^30 slots");
        return -1;
    }
    uint32_t size = 2 * (s->held_mask + 1);
    Held *held = PyMem_Calloc(size, sizeof(Held));
    if (held == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    uint32_t old = s->held_mask + 1;
    Held *prev = s->held;
    s->held = held;
    s->held_mask = size - 1;
    for (uint32_t i = 0; i < old; i++)
        if (prev[i].count != 0)
            held[held_slot(s, prev[i].key)] = prev[i];
    PyMem_Free(prev);
    return 0;
}

static void
held_delete(Core *s, uint32_t i)
{
    uint32_t mask = s->held_mask;
    uint32_t j = i;
    for (;;) {
        j = (j + 1) & mask;
        if (s->held[j].count == 0)
            break;
        if (stays(i, j, (uint32_t)mix64(s->held[j].key) & mask))
            continue;
        s->held[i] = s->held[j];
        i = j;
    }
    s->held[i].count = 0;
    s->held_used--;
}

static void
lru_unlink(Core *s, int32_t nd)
{
    Node *x = &s->nodes[nd];
    if (x->prev >= 0)
        s->nodes[x->prev].next = x->next;
    else
        s->lru_head[x->worker] = x->next;
    if (x->next >= 0)
        s->nodes[x->next].prev = x->prev;
    else
        s->lru_tail[x->worker] = x->prev;
}

static void
lru_append(Core *s, int32_t nd)
{
    Node *x = &s->nodes[nd];
    int32_t w = x->worker;
    x->next = -1;
    x->prev = s->lru_tail[w];
    if (x->prev >= 0)
        s->nodes[x->prev].next = nd;
    else
        s->lru_head[w] = nd;
    s->lru_tail[w] = nd;
}

/* A new node for ``key`` at ``worker``: the most recently used, one more holder. */
static int32_t
node_new(Core *s, uint64_t key, int32_t worker, uint32_t slot)
{
    int32_t nd;
    if (s->free_node >= 0) {
        nd = s->free_node;
        s->free_node = s->nodes[nd].next;
    }
    else {
        if (s->n_nodes == s->nodes_cap) {
            if (s->nodes_cap >= INT32_MAX / 2) {
                PyErr_SetString(PyExc_MemoryError, "shadow: more than 2^30 cached blocks");
                return -1;
            }
            /* By half again, not double: the pool is most of a shadow's memory. */
            int32_t cap = s->nodes_cap ? s->nodes_cap + s->nodes_cap / 2 : 1024;
            Node *nodes = PyMem_Realloc(s->nodes, (size_t)cap * sizeof(Node));
            if (nodes == NULL) {
                PyErr_NoMemory();
                return -1;
            }
            s->nodes = nodes;
            s->nodes_cap = cap;
        }
        nd = s->n_nodes++;
    }
    Node *x = &s->nodes[nd];
    x->key = key;
    x->worker = worker;
    lru_append(s, nd);
    s->size[worker]++;
    s->slots[slot] = nd;
    s->slots_used++;
    uint32_t h = held_slot(s, key);
    Held *rec = &s->held[h];
    if (rec->count == 0) {
        rec->key = key;
        rec->head = -1;
        s->held_used++;
    }
    x->hprev = -1;
    x->hnext = rec->head;
    if (rec->head >= 0)
        s->nodes[rec->head].hprev = nd;
    rec->head = nd;
    rec->count++;
    return nd;
}

/* Evict ``worker``'s least recently used block. */
static void
evict(Core *s, int32_t worker)
{
    int32_t nd = s->lru_head[worker];
    Node *x = &s->nodes[nd];
    lru_unlink(s, nd);
    s->size[worker]--;
    uint32_t h = held_slot(s, x->key);
    Held *rec = &s->held[h];
    if (x->hprev >= 0)
        s->nodes[x->hprev].hnext = x->hnext;
    else
        rec->head = x->hnext;
    if (x->hnext >= 0)
        s->nodes[x->hnext].hprev = x->hprev;
    if (--rec->count == 0)
        held_delete(s, h);
    slots_delete(s, slot_of(s, x->key, worker));
    x->next = s->free_node;
    s->free_node = nd;
}

/* BlockCache.match: how many of the leading keys ``worker`` holds. */
static int64_t
match(const Core *s, int32_t worker, const uint64_t *keys, int64_t nk)
{
    int64_t m = 0;
    while (m < nk && s->slots[slot_of(s, keys[m], worker)] >= 0)
        m++;
    return m;
}

/* BlockCache.insert: cache the prefix (as far as the capacity allows), touch it
 * leaf first, and evict least recently used blocks past the capacity. */
static int
insert(Core *s, int32_t worker, const uint64_t *keys, int64_t nk)
{
    int64_t n = nk < s->capacity[worker] ? nk : s->capacity[worker];
    if (n == 0)
        return 0;
    if (n > s->path_cap) {
        int32_t *path = PyMem_Realloc(s->path, (size_t)n * sizeof(int32_t));
        if (path == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        s->path = path;
        s->path_cap = n;
    }
    for (int64_t i = 0; i < n; i++) {
        /* Room for one more in both hashes: at most three quarters full. */
        if (4 * (s->slots_used + 1) > 3 * ((int64_t)s->slots_mask + 1) && slots_grow(s) < 0)
            return -1;
        if (4 * (s->held_used + 1) > 3 * ((int64_t)s->held_mask + 1) && held_grow(s) < 0)
            return -1;
        uint32_t slot = slot_of(s, keys[i], worker);
        int32_t nd = s->slots[slot];
        if (nd < 0 && (nd = node_new(s, keys[i], worker, slot)) < 0)
            return -1;
        s->path[i] = nd;
    }
    for (int64_t i = n - 1; i >= 0; i--) {
        lru_unlink(s, s->path[i]);
        lru_append(s, s->path[i]);
    }
    while (s->size[worker] > s->capacity[worker])
        evict(s, worker);
    return 0;
}

/* PrefillModel.predict for ``worker``'s degree, the same operations in the same order. */
static double
predict(const Core *s, int32_t w, int64_t uncached, int64_t cached)
{
    int64_t pairs = uncached * cached + uncached * (uncached + 1) / 2;
    return s->d[w] + s->a[w] * (double)uncached + s->b * (double)cached +
           (s->c * (double)uncached + s->alpha * (double)pairs) / (double)s->degree[w];
}

static int64_t
cached_tokens(int64_t matched, int64_t length, int64_t block_size)
{
    int64_t t = matched * block_size;
    if (t > length - 1)
        t = length - 1;
    return t > 0 ? t : 0;
}

typedef struct {
    double cost, free, start, e;
    int32_t w;
} Pick;

static int
pick_less(const Pick *x, const Pick *y)
{
    if (x->cost != y->cost)
        return x->cost < y->cost;
    if (x->free != y->free)
        return x->free < y->free;
    return x->w < y->w;
}

/* Shadow._cost: worker ``w``'s placement key with ``m`` blocks cached there. */
static Pick
cost(const Core *s, double arrival, int64_t length, double beta, int32_t w, int64_t m)
{
    int64_t reused = cached_tokens(m, length, s->block_size);
    Pick p;
    p.e = predict(s, w, length - reused, reused);
    p.free = s->free[w];
    p.start = p.free > arrival ? p.free : arrival;
    p.cost = (p.start - arrival) + (beta + s->lam[w]) * p.e;
    p.w = w;
    return p;
}

typedef struct {
    int32_t g;
    double wait;
    int64_t m;
} Soonest;

/* Shadow._search: the worker a scan of all of them would pick; 0 when none can hold
 * the request. */
static int
search(Core *s, double arrival, int64_t length, double beta, const uint64_t *keys, int64_t nk,
       Soonest *soonest, Pick *best)
{
    if (++s->stamp == 0) {
        memset(s->seen, 0, (size_t)s->n * sizeof(uint32_t));
        s->stamp = 1;
    }
    int found = 0, n_soonest = 0;
    for (int32_t g = 0; g < s->groups; g++) {
        if (length > s->max_tokens[s->first[g]])
            continue;
        Heap *h = &s->heaps[g];
        while (h->a[0].t != s->free[h->a[0].w])
            heap_pop(h);
        double f = h->a[0].t;
        int32_t w = (int32_t)h->a[0].w;
        int64_t m = match(s, w, keys, nk);
        soonest[n_soonest++] = (Soonest){g, f > arrival ? f - arrival : 0.0, m};
        Pick p = cost(s, arrival, length, beta, w, m);
        s->seen[w] = s->stamp;
        if (!found || pick_less(&p, best)) {
            *best = p;
            found = 1;
        }
    }
    if (!found)
        return 0;
    int64_t depth = 0;
    while (depth < nk && s->held[held_slot(s, keys[depth])].count != 0)
        depth++;
    int32_t held_before = 0;
    for (int64_t i = depth - 1; i >= 0; i--) {
        const Held *rec = &s->held[held_slot(s, keys[i])];
        if (rec->count == held_before)
            continue; /* nobody new holds this shorter prefix (the holders nest) */
        held_before = rec->count;
        int64_t level = i + 1;
        int64_t reused = cached_tokens(level, length, s->block_size);
        int any = 0;
        memset(s->open, 0, (size_t)s->groups);
        for (int k = 0; k < n_soonest; k++) {
            const Soonest *o = &soonest[k];
            int32_t w0 = s->first[o->g];
            if (o->m < level &&
                o->wait + (beta + s->lam[w0]) * predict(s, w0, length - reused, reused) <=
                    best->cost) {
                s->open[o->g] = 1;
                any = 1;
            }
        }
        if (!any)
            break; /* and at every shorter prefix: each bound only grows */
        for (int32_t g = 0; g < s->groups; g++)
            s->soonest_new[g].w = -1;
        for (int32_t nd = rec->head; nd >= 0; nd = s->nodes[nd].hnext) {
            int32_t w = s->nodes[nd].worker;
            if (s->seen[w] == s->stamp)
                continue;
            s->seen[w] = s->stamp;
            int32_t g = s->group[w];
            if (!s->open[g])
                continue;
            Entry fw = {s->free[w], w};
            if (s->soonest_new[g].w < 0 || less(&fw, &s->soonest_new[g]))
                s->soonest_new[g] = fw;
        }
        for (int32_t g = 0; g < s->groups; g++) {
            if (s->soonest_new[g].w < 0)
                continue;
            Pick p = cost(s, arrival, length, beta, (int32_t)s->soonest_new[g].w, level);
            if (pick_less(&p, best))
                *best = p;
        }
    }
    return 1;
}

/* serve(arrival, length, keys) -> TTFT or None: place a request (keys: its block
 * keys, a buffer of uint64) and serve it; None when no worker can hold it. */
static PyObject *
core_serve(Core *s, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "serve(arrival, length, keys) takes 3 arguments");
        return NULL;
    }
    double arrival = PyFloat_AsDouble(args[0]);
    if (arrival == -1.0 && PyErr_Occurred())
        return NULL;
    long long length = PyLong_AsLongLong(args[1]);
    if (length == -1 && PyErr_Occurred())
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[2], &view, PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    if (view.len % 8 != 0) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_TypeError, "serve: keys must be a buffer of uint64");
        return NULL;
    }
    const uint64_t *keys = view.buf;
    int64_t nk = view.len / 8;

    /* whatif.WaitingWorkers.beta */
    Heap *pending = &s->pending;
    while (pending->n && pending->a[0].t <= arrival) {
        Entry top = pending->a[0];
        heap_pop(pending);
        if (s->last_start[top.w] == top.t && s->waiting[top.w]) {
            s->waiting[top.w] = 0;
            s->n_waiting--;
        }
    }
    double beta = s->extra == 0.0 ? s->beta
                                  : s->beta + s->extra * (double)s->n_waiting / (double)s->n;

    Soonest soonest[64];
    Soonest *many = NULL, *so = soonest;
    if (s->groups > 64 && (so = many = PyMem_Malloc((size_t)s->groups * sizeof(Soonest))) == NULL) {
        PyBuffer_Release(&view);
        return PyErr_NoMemory();
    }
    Pick best;
    int found = search(s, arrival, (int64_t)length, beta, keys, nk, so, &best);
    PyMem_Free(many);
    if (!found) {
        PyBuffer_Release(&view);
        Py_RETURN_NONE; /* refused, not served */
    }
    int32_t w = best.w;
    double done = best.start + best.e;
    s->free[w] = done;
    int err = push(&s->heaps[s->group[w]], done, w) < 0;
    /* whatif.WaitingWorkers.placed */
    s->last_start[w] = best.start;
    if (!err && best.start > arrival) {
        if (!s->waiting[w]) {
            s->waiting[w] = 1;
            s->n_waiting++;
        }
        err = push(pending, best.start, w) < 0;
    }
    if (!err)
        err = insert(s, w, keys, nk) < 0;
    PyBuffer_Release(&view);
    if (err)
        return NULL;
    return PyFloat_FromDouble(done - arrival);
}

static PyObject *
core_free_times(Core *s, PyObject *Py_UNUSED(ignored))
{
    PyObject *out = PyList_New(s->n);
    if (out == NULL)
        return NULL;
    for (int32_t w = 0; w < s->n; w++) {
        PyObject *f = PyFloat_FromDouble(s->free[w]);
        if (f == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, w, f);
    }
    return out;
}

static int
worker_arg(const Core *s, PyObject *arg, int32_t *w)
{
    long v = PyLong_AsLong(arg);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (v < 0 || v >= s->n) {
        PyErr_Format(PyExc_IndexError, "worker %ld out of range (%d workers)", v, (int)s->n);
        return -1;
    }
    *w = (int32_t)v;
    return 0;
}

static PyObject *
core_cached(Core *s, PyObject *arg)
{
    int32_t w;
    if (worker_arg(s, arg, &w) < 0)
        return NULL;
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    for (int32_t nd = s->lru_head[w]; nd >= 0; nd = s->nodes[nd].next) {
        PyObject *k = PyLong_FromUnsignedLongLong(s->nodes[nd].key);
        if (k == NULL || PyList_Append(out, k) < 0) {
            Py_XDECREF(k);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(k);
    }
    return out;
}

static PyObject *
core_nbytes(Core *s, PyObject *Py_UNUSED(ignored))
{
    size_t n = (size_t)s->n;
    size_t bytes = sizeof(Core) + n * (3 * sizeof(int32_t) + 6 * sizeof(double) +
                                       3 * sizeof(int64_t) + sizeof(char) + 3 * sizeof(int32_t));
    bytes += (size_t)s->groups * (sizeof(int32_t) + sizeof(Heap) + 1 + sizeof(Entry));
    for (int32_t g = 0; g < s->groups; g++)
        bytes += (size_t)s->heaps[g].cap * sizeof(Entry);
    bytes += (size_t)s->pending.cap * sizeof(Entry);
    bytes += (size_t)s->nodes_cap * sizeof(Node);
    bytes += (size_t)(s->slots_mask + 1) * sizeof(int32_t);
    bytes += (size_t)(s->held_mask + 1) * sizeof(Held);
    bytes += (size_t)s->path_cap * sizeof(int32_t);
    return PyLong_FromSize_t(bytes);
}

static void
core_dealloc(Core *s)
{
    PyMem_Free(s->degree);
    PyMem_Free(s->group);
    PyMem_Free(s->first);
    PyMem_Free(s->lam);
    PyMem_Free(s->d);
    PyMem_Free(s->a);
    PyMem_Free(s->max_tokens);
    PyMem_Free(s->capacity);
    PyMem_Free(s->size);
    PyMem_Free(s->free);
    if (s->heaps != NULL)
        for (int32_t g = 0; g < s->groups; g++)
            PyMem_RawFree(s->heaps[g].a); /* _minheap.h grows them raw */
    PyMem_Free(s->heaps);
    PyMem_Free(s->last_start);
    PyMem_Free(s->waiting);
    PyMem_RawFree(s->pending.a);
    PyMem_Free(s->lru_head);
    PyMem_Free(s->lru_tail);
    PyMem_Free(s->nodes);
    PyMem_Free(s->slots);
    PyMem_Free(s->held);
    PyMem_Free(s->seen);
    PyMem_Free(s->path);
    PyMem_Free(s->open);
    PyMem_Free(s->soonest_new);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

/* A list/tuple of n floats (or ints) into out. */
static int
read_numbers(PyObject *seq, Py_ssize_t n, const char *name, double *dout, int64_t *iout)
{
    PyObject *fast = PySequence_Fast(seq, name);
    if (fast == NULL)
        return -1;
    if (PySequence_Fast_GET_SIZE(fast) != n) {
        PyErr_Format(PyExc_ValueError, "%s: expected %zd values, got %zd", name, n,
                     PySequence_Fast_GET_SIZE(fast));
        Py_DECREF(fast);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = PySequence_Fast_GET_ITEM(fast, i);
        if (dout != NULL) {
            dout[i] = PyFloat_AsDouble(v);
            if (dout[i] == -1.0 && PyErr_Occurred())
                goto fail;
        }
        else {
            iout[i] = PyLong_AsLongLong(v);
            if (iout[i] == -1 && PyErr_Occurred())
                goto fail;
        }
    }
    Py_DECREF(fast);
    return 0;
fail:
    Py_DECREF(fast);
    return -1;
}

/* Core(degrees, lam, d, a, max_tokens, capacity, b, c, alpha, beta, extra, block_size,
 *      started_s): per worker (degrees ascending) its degree, λ term, d_C, a_C, longest
 *      prompt and cache capacity in blocks; the profile's b, c, α; placement's β and
 *      β_busy − β; the cache's block size in tokens; when the workers start free. */
static PyObject *
core_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *degrees, *lam, *d, *a, *max_tokens, *capacity;
    double b, c, alpha, beta, extra, started;
    long long block_size;
    if (kwds != NULL && PyDict_GET_SIZE(kwds) != 0) {
        PyErr_SetString(PyExc_TypeError, "Core() takes positional arguments only");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "OOOOOOdddddLd", &degrees, &lam, &d, &a, &max_tokens,
                          &capacity, &b, &c, &alpha, &beta, &extra, &block_size, &started))
        return NULL;
    Py_ssize_t n = PySequence_Size(degrees);
    if (n < 0)
        return NULL;
    if (n == 0 || n > INT32_MAX / 4) {
        PyErr_Format(PyExc_ValueError, "Core: a composition of 1 to 2^29 workers, got %zd", n);
        return NULL;
    }
    if (block_size < 1) {
        PyErr_Format(PyExc_ValueError, "Core: block_size must be >= 1, got %lld", block_size);
        return NULL;
    }
    Core *s = (Core *)type->tp_alloc(type, 0);
    if (s == NULL)
        return NULL;
    s->n = (int32_t)n;
    s->b = b;
    s->c = c;
    s->alpha = alpha;
    s->beta = beta;
    s->extra = extra;
    s->block_size = block_size;
    s->free_node = -1;
    size_t un = (size_t)n;
    int64_t *deg64 = PyMem_Malloc(un * sizeof(int64_t));
    s->degree = PyMem_Malloc(un * sizeof(int32_t));
    s->group = PyMem_Malloc(un * sizeof(int32_t));
    s->first = PyMem_Malloc(un * sizeof(int32_t));
    s->lam = PyMem_Malloc(un * sizeof(double));
    s->d = PyMem_Malloc(un * sizeof(double));
    s->a = PyMem_Malloc(un * sizeof(double));
    s->max_tokens = PyMem_Malloc(un * sizeof(int64_t));
    s->capacity = PyMem_Malloc(un * sizeof(int64_t));
    s->size = PyMem_Calloc(un, sizeof(int64_t));
    s->free = PyMem_Malloc(un * sizeof(double));
    s->last_start = PyMem_Calloc(un, sizeof(double));
    s->waiting = PyMem_Calloc(un, 1);
    s->lru_head = PyMem_Malloc(un * sizeof(int32_t));
    s->lru_tail = PyMem_Malloc(un * sizeof(int32_t));
    s->seen = PyMem_Calloc(un, sizeof(uint32_t));
    s->slots = PyMem_Malloc(1024 * sizeof(int32_t));
    s->held = PyMem_Calloc(1024, sizeof(Held));
    if (deg64 == NULL || s->degree == NULL || s->group == NULL || s->first == NULL ||
        s->lam == NULL || s->d == NULL || s->a == NULL || s->max_tokens == NULL ||
        s->capacity == NULL || s->size == NULL || s->free == NULL || s->last_start == NULL ||
        s->waiting == NULL || s->lru_head == NULL || s->lru_tail == NULL || s->seen == NULL ||
        s->slots == NULL || s->held == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    s->slots_mask = 1023;
    s->held_mask = 1023;
    memset(s->slots, 0xff, 1024 * sizeof(int32_t));
    if (read_numbers(degrees, n, "degrees", NULL, deg64) < 0 ||
        read_numbers(lam, n, "lam", s->lam, NULL) < 0 ||
        read_numbers(d, n, "d", s->d, NULL) < 0 || read_numbers(a, n, "a", s->a, NULL) < 0 ||
        read_numbers(max_tokens, n, "max_tokens", NULL, s->max_tokens) < 0 ||
        read_numbers(capacity, n, "capacity", NULL, s->capacity) < 0)
        goto fail;
    for (Py_ssize_t w = 0; w < n; w++) {
        if (deg64[w] < 1 || deg64[w] > 1 << 20 || (w > 0 && deg64[w] < deg64[w - 1])) {
            PyErr_SetString(PyExc_ValueError, "Core: degrees must be ascending and >= 1");
            goto fail;
        }
        if (s->capacity[w] < 0) {
            PyErr_SetString(PyExc_ValueError, "Core: cache capacity must be >= 0 blocks");
            goto fail;
        }
        s->degree[w] = (int32_t)deg64[w];
        if (w == 0 || deg64[w] != deg64[w - 1])
            s->first[s->groups++] = (int32_t)w;
        s->group[w] = s->groups - 1;
        s->free[w] = started;
        s->lru_head[w] = s->lru_tail[w] = -1;
    }
    s->heaps = PyMem_Calloc((size_t)s->groups, sizeof(Heap));
    s->open = PyMem_Malloc((size_t)s->groups);
    s->soonest_new = PyMem_Malloc((size_t)s->groups * sizeof(Entry));
    if (s->heaps == NULL || s->open == NULL || s->soonest_new == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t w = 0; w < n; w++)
        if (push(&s->heaps[s->group[w]], started, (int32_t)w) < 0)
            goto fail;
    PyMem_Free(deg64);
    return (PyObject *)s;
fail:
    PyMem_Free(deg64);
    Py_DECREF(s);
    return NULL;
}

static PyMethodDef core_methods[] = {
    {"serve", (PyCFunction)(void (*)(void))core_serve, METH_FASTCALL,
     "serve(arrival, length, keys)\n--\n\nPlace and serve one request (keys: a uint64 buffer "
     "of its block keys); its TTFT, or None when no worker can hold it."},
    {"free_times", (PyCFunction)core_free_times, METH_NOARGS,
     "free_times()\n--\n\nWhen each worker is next free."},
    {"cached", (PyCFunction)core_cached, METH_O,
     "cached(worker)\n--\n\nThe worker's cached block keys, least recently used first."},
    {"nbytes", (PyCFunction)core_nbytes, METH_NOARGS,
     "nbytes()\n--\n\nBytes this shadow holds (its arrays and tables, as allocated)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject CoreType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "vertumnus.core._shadow.Core",
    .tp_basicsize = sizeof(Core),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One composition's shadow pool, compiled (shadow.Shadow's searched path).",
    .tp_new = core_new,
    .tp_dealloc = (destructor)core_dealloc,
    .tp_methods = core_methods,
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "vertumnus.core._shadow",
    "Compiled shadow pool (see vertumnus.core.shadow).", -1, NULL,
};

PyMODINIT_FUNC
PyInit__shadow(void)
{
    if (PyType_Ready(&CoreType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&moduledef);
    if (m == NULL)
        return NULL;
    Py_INCREF(&CoreType);
    if (PyModule_AddObject(m, "Core", (PyObject *)&CoreType) < 0) {
        Py_DECREF(&CoreType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
