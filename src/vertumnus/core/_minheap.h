/* A binary min-heap of (time, worker) entries, least first (ties: the lower worker),
 * shared by the compiled what-if replay (_whatif.c) and shadow pool (_shadow.c).
 *
 * heap_push returns -1 when it cannot grow, without setting a Python error: it may
 * run without the GIL, so the caller raises. The arrays are PyMem_Raw memory (free
 * them with PyMem_RawFree). Included by each extension (static functions: nothing
 * is exported). */
#ifndef VERTUMNUS_MINHEAP_H
#define VERTUMNUS_MINHEAP_H

#include <Python.h>

typedef struct {
    double t;
    Py_ssize_t w;
} Entry;

typedef struct {
    Entry *a;
    Py_ssize_t n, cap;
} Heap;

static int
less(const Entry *x, const Entry *y)
{
    return x->t < y->t || (x->t == y->t && x->w < y->w);
}

static int
heap_push(Heap *h, double t, Py_ssize_t w)
{
    if (h->n == h->cap) {
        Py_ssize_t cap = h->cap ? 2 * h->cap : 16;
        /* Raw: it may run without the GIL (the replay's loop releases it). */
        Entry *a = PyMem_RawRealloc(h->a, (size_t)cap * sizeof(Entry));
        if (a == NULL)
            return -1;
        h->a = a;
        h->cap = cap;
    }
    Py_ssize_t i = h->n++;
    Entry e = {t, w};
    while (i > 0) {
        Py_ssize_t p = (i - 1) / 2;
        if (!less(&e, &h->a[p]))
            break;
        h->a[i] = h->a[p];
        i = p;
    }
    h->a[i] = e;
    return 0;
}

static void
heap_pop(Heap *h)
{
    Entry last = h->a[--h->n];
    Py_ssize_t i = 0;
    for (;;) {
        Py_ssize_t c = 2 * i + 1;
        if (c >= h->n)
            break;
        if (c + 1 < h->n && less(&h->a[c + 1], &h->a[c]))
            c++;
        if (!less(&h->a[c], &last))
            break;
        h->a[i] = h->a[c];
        i = c;
    }
    if (h->n > 0)
        h->a[i] = last;
}

#endif
