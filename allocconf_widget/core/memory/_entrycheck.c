/* The inline path of core/memory/snapshot_fields._entries, compiled: which trace entries pass
 * the common-entry test without the generic per-field checks.
 *
 * first_irregular(entries, start) returns the index of the first entry from ``start`` that is not
 * a common entry (or len(entries)); the caller sends that one through the generic checks, which
 * word any error, and asks again from the next. The test is the Python inline test, term for
 * term: an exact dict whose "action" is an exact str; "addr", "size" and "device_free" (default
 * 0) exact ints in 0..2^63-1; "stream" (default 0) an exact int in -2^63..2^64-1; "time_us"
 * (default 0) an exact int or float strictly between -2^63 and 2^63; "frames" (default a list)
 * an exact list. It reads the entries and changes nothing; tests/unit/test_entry_fast_path.py
 * holds it to the generic checks' verdicts.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>

static PyObject *k_action, *k_addr, *k_size, *k_stream, *k_time_us, *k_device_free, *k_frames;

/* the value under key, NULL where absent; -1 on an error */
static int lookup(PyObject *d, PyObject *key, PyObject **out) {
    *out = PyDict_GetItemWithError(d, key);
    return (*out == NULL && PyErr_Occurred()) ? -1 : 0;
}

/* an exact int in [0, 2^63) */
static int natural(PyObject *v) {
    if (!PyLong_CheckExact(v)) return 0;
    int overflow = 0;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (x == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    return overflow == 0 && x >= 0;
}

/* 1: a common entry; 0: not; -1: an error */
static int common(PyObject *e) {
    PyObject *v;
    if (!PyDict_CheckExact(e)) return 0;
    if (lookup(e, k_action, &v) < 0) return -1;
    if (v == NULL || !PyUnicode_CheckExact(v)) return 0;
    if (lookup(e, k_addr, &v) < 0) return -1;
    if (v == NULL || !natural(v)) return 0;
    if (lookup(e, k_size, &v) < 0) return -1;
    if (v == NULL || !natural(v)) return 0;
    if (lookup(e, k_stream, &v) < 0) return -1;
    if (v != NULL) {
        if (!PyLong_CheckExact(v)) return 0;
        int overflow = 0;
        long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
        (void)x;
        if (PyErr_Occurred()) {
            PyErr_Clear();
            return 0;
        }
        if (overflow < 0) return 0;
        if (overflow > 0) { /* at least 2^63: below 2^64 still passes */
            PyLong_AsUnsignedLongLong(v);
            if (PyErr_Occurred()) {
                PyErr_Clear();
                return 0;
            }
        }
    }
    if (lookup(e, k_device_free, &v) < 0) return -1;
    if (v != NULL && !natural(v)) return 0;
    if (lookup(e, k_time_us, &v) < 0) return -1;
    if (v != NULL) {
        if (PyLong_CheckExact(v)) {
            int overflow = 0;
            long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
            if (x == -1 && PyErr_Occurred()) {
                PyErr_Clear();
                return 0;
            }
            if (overflow != 0 || x == INT64_MIN) return 0;
        } else if (PyFloat_CheckExact(v)) {
            double f = PyFloat_AsDouble(v);
            if (!(f > -9223372036854775808.0 && f < 9223372036854775808.0)) return 0;
        } else {
            return 0;
        }
    }
    if (lookup(e, k_frames, &v) < 0) return -1;
    if (v != NULL && !PyList_CheckExact(v)) return 0;
    return 1;
}

static PyObject *first_irregular(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *entries;
    Py_ssize_t start;
    if (!PyArg_ParseTuple(args, "O!n", &PyList_Type, &entries, &start)) return NULL;
    Py_ssize_t n = PyList_Size(entries);
    if (n < 0) return NULL;
    for (Py_ssize_t i = start < 0 ? 0 : start; i < n; i++) {
        PyObject *e = PyList_GetItem(entries, i); /* borrowed; nothing here can change the list */
        if (e == NULL) return NULL;
        int ok = common(e);
        if (ok < 0) return NULL;
        if (!ok) return PyLong_FromSsize_t(i);
    }
    return PyLong_FromSsize_t(n);
}

/* scalar_dicts(node, start, scalar_types) -> (their lengths added up, the next index)
 *
 * core/untrusted.check_structure's leaf rule over a run of a list's children from ``start``: each
 * exact dict whose values' exact types are all in ``scalar_types`` (a tuple of types) counts its
 * length and is not walked; the run ends at the first child that is anything else. */
static PyObject *scalar_dicts(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *node, *types;
    Py_ssize_t start;
    if (!PyArg_ParseTuple(args, "O!nO!", &PyList_Type, &node, &start, &PyTuple_Type, &types)) return NULL;
    Py_ssize_t n = PyList_Size(node), ntypes = PyTuple_Size(types);
    if (n < 0 || ntypes < 0) return NULL;
    long long total = 0;
    Py_ssize_t i = start < 0 ? 0 : start;
    for (; i < n; i++) {
        PyObject *child = PyList_GetItem(node, i);
        if (!child) return NULL;
        if (!PyDict_CheckExact(child)) break;
        Py_ssize_t pos = 0;
        PyObject *key, *value;
        int scalar = 1;
        while (scalar && PyDict_Next(child, &pos, &key, &value)) {
            scalar = 0;
            for (Py_ssize_t t = 0; t < ntypes; t++) {
                if ((PyObject *)Py_TYPE(value) == PyTuple_GetItem(types, t)) {
                    scalar = 1;
                    break;
                }
            }
        }
        if (!scalar) break;
        total += (long long)PyDict_Size(child);
    }
    return Py_BuildValue("(Ln)", total, i);
}

static PyMethodDef methods[] = {
    {"scalar_dicts", scalar_dicts, METH_VARARGS,
     "Lengths of the run of scalar dicts from start added up, and the index after the run."},
    {"first_irregular", first_irregular, METH_VARARGS,
     "The index of the first trace entry from start that is not a common one (or the length)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_entrycheck", "The trace-entry check's inline path, compiled.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__entrycheck(void) {
    k_action = PyUnicode_InternFromString("action");
    k_addr = PyUnicode_InternFromString("addr");
    k_size = PyUnicode_InternFromString("size");
    k_stream = PyUnicode_InternFromString("stream");
    k_time_us = PyUnicode_InternFromString("time_us");
    k_device_free = PyUnicode_InternFromString("device_free");
    k_frames = PyUnicode_InternFromString("frames");
    if (!k_action || !k_addr || !k_size || !k_stream || !k_time_us || !k_device_free || !k_frames) return NULL;
    return PyModule_Create(&module);
}
