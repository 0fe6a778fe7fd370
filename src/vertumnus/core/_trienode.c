/* The prefix index's node, kept out of Python's cyclic garbage collector:
 * TrieNode of vertumnus/core/trie.py, compiled.
 *
 * Why: the index holds one node and one set of holders per cached block, and
 * the router's holds a million of them at 1,000 GPUs. CPython's cyclic
 * collector tracks every container object, and a full collection walks them
 * all, and the dict that maps keys to nodes with them: 270 ms at a million
 * blocks, paid by whichever placement decision triggers it
 * (bench/gc_pause.py). The index holds no reference cycle and never can: a
 * node refers to ints, None and sets of ints (its parent and children are
 * named by their keys), so reference counting alone frees a dropped block.
 *
 * So this node is a type the collector does not know (no Py_TPFLAGS_HAVE_GC):
 * a dict of int keys and such nodes stays untracked (CPython tracks a dict
 * only once it holds an object the collector knows), and a full collection
 * no longer touches the index at all. The node's sets hold only ints; they
 * are untracked too (untrack(), also used for the children set trie.py
 * makes). CPython does the same by itself for tuples and dicts of atomic
 * values; it cannot see that these objects are in that case.
 *
 * Contract: the same attributes as the Python class (key, depth, parent,
 * children, holders, generation; the same constructor and repr), and nothing
 * else (like __slots__). A node must never refer to an object that could
 * refer back to it: a cycle through it would never be collected (a leak).
 * tests/store/ checks the index with it and without it.
 *
 * Pure: no I/O, no global state (the type is a constant).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

typedef struct {
    PyObject_HEAD
    PyObject *key;
    PyObject *depth;
    PyObject *parent;
    PyObject *children;
    PyObject *holders;
    PyObject *generation;
} TrieNode;

/* A new empty set the collector does not walk (it will hold ints only). */
static PyObject *
untracked_set(void)
{
    PyObject *s = PySet_New(NULL);
    if (s != NULL && PyObject_GC_IsTracked(s))
        PyObject_GC_UnTrack(s);
    return s;
}

static PyObject *
node_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *names[] = {"key", "depth", "parent", "generation", NULL};
    PyObject *key, *depth, *parent, *generation;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOO:TrieNode", names, &key, &depth, &parent,
                                     &generation))
        return NULL;
    TrieNode *self = (TrieNode *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->holders = untracked_set();
    if (self->holders == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    self->key = Py_NewRef(key);
    self->depth = Py_NewRef(depth);
    self->parent = Py_NewRef(parent);
    self->children = Py_NewRef(Py_None);
    self->generation = Py_NewRef(generation);
    return (PyObject *)self;
}

static void
node_dealloc(TrieNode *self)
{
    Py_XDECREF(self->key);
    Py_XDECREF(self->depth);
    Py_XDECREF(self->parent);
    Py_XDECREF(self->children);
    Py_XDECREF(self->holders);
    Py_XDECREF(self->generation);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
node_repr(TrieNode *self)
{
    /* A deleted attribute reads as the Python twin's does: AttributeError. */
    const char *gone = self->depth == NULL ? "depth" : self->holders == NULL ? "holders" : NULL;
    if (gone != NULL) {
        PyErr_Format(PyExc_AttributeError, "'TrieNode' object has no attribute '%s'", gone);
        return NULL;
    }
    PyObject *held = PySequence_List(self->holders);
    if (held == NULL || PyList_Sort(held) < 0) {
        Py_XDECREF(held);
        return NULL;
    }
    PyObject *out = PyUnicode_FromFormat("TrieNode(depth=%R, holders=%R)", self->depth, held);
    Py_DECREF(held);
    return out;
}

/* T_OBJECT_EX, as a __slots__ attribute is: CPython 3.11 specialises attribute
 * reads of these only (LOAD_ATTR_SLOT), and placement reads holders per block. */
static PyMemberDef node_members[] = {
    {"key", T_OBJECT_EX, offsetof(TrieNode, key), 0, "The block's key."},
    {"depth", T_OBJECT_EX, offsetof(TrieNode, depth), 0,
     "Blocks on the root-to-z path, z included (the prefix length in blocks)."},
    {"parent", T_OBJECT_EX, offsetof(TrieNode, parent), 0,
     "The parent's key; None for a first block or while not known."},
    {"children", T_OBJECT_EX, offsetof(TrieNode, children), 0,
     "The children's keys: None, the key alone, or a set from the second on."},
    {"holders", T_OBJECT_EX, offsetof(TrieNode, holders), 0, "The workers that hold the block."},
    {"generation", T_OBJECT_EX, offsetof(TrieNode, generation), 0,
     "When the block was created in this index (a counter)."},
    {NULL},
};

static PyTypeObject TrieNodeType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "vertumnus.core._trienode.TrieNode",
    .tp_doc = PyDoc_STR("One block of the prefix index (see vertumnus.core.trie.TrieNode)."),
    .tp_basicsize = sizeof(TrieNode),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = node_new,
    .tp_dealloc = (destructor)node_dealloc,
    .tp_repr = (reprfunc)node_repr,
    .tp_members = node_members,
};

static PyObject *
untrack(PyObject *self, PyObject *obj)
{
    if (PyObject_IS_GC(obj) && PyObject_GC_IsTracked(obj))
        PyObject_GC_UnTrack(obj);
    return Py_NewRef(obj);
}

static PyMethodDef methods[] = {
    {"untrack", untrack, METH_O,
     "untrack(obj)\n--\n\nTake obj out of the cyclic garbage collector and return it; only for "
     "objects that can never be part of a reference cycle (a set of ints)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "vertumnus.core._trienode",
    "The prefix index's node, outside the cyclic garbage collector (see vertumnus.core.trie).",
    -1, methods,
};

PyMODINIT_FUNC
PyInit__trienode(void)
{
    if (PyType_Ready(&TrieNodeType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&moduledef);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "TrieNode", (PyObject *)&TrieNodeType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
