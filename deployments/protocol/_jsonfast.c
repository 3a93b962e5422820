/* A JSON `data` list of numbers to a tensor's bytes in one pass, or None.
 *
 * What deployments.protocol.jsondata does in Python for a flat list (the types looked at,
 * the values read as float64 or int64, the range checked, then cast), done in one loop
 * over the list: ~1 us for 256 values instead of ~12. It only ever answers what the Python
 * path would answer without an error; anything else (a value of another type, an integer
 * past int64, a value outside the datatype's range) returns None and the Python path runs,
 * with its own error message. So the Python path stays the definition, and this module
 * is optional: built by `make setup` where a C compiler is, skipped where not.
 *
 * flat(list, code) -> bytearray | None
 *   code: "f4" "f8" (floats: JSON integers and numbers), "i1" "i2" "i4" "i8",
 *   "u1" "u2" "u4" "u8" (integers only); native byte order.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

static PyObject *flat_floats(PyObject *list, Py_ssize_t n, int size) {
    PyObject *out = PyByteArray_FromStringAndSize(NULL, n * size);
    if (out == NULL) return NULL;
    char *buf = PyByteArray_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = PyList_GET_ITEM(list, i);
        double d;
        if (PyFloat_CheckExact(v)) {
            d = PyFloat_AS_DOUBLE(v);
        } else if (PyLong_CheckExact(v)) {  /* bool is not exact int: refused here */
            int overflow = 0;
            long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
            if (overflow || (x == -1 && PyErr_Occurred())) goto fallback;
            /* exact as a double; past 2**53 numpy may round an all-integer list once
               (int64 -> float32) where this would round twice: the Python path */
            if (x > (1LL << 53) || x < -(1LL << 53)) goto fallback;
            d = (double)x;
        } else {
            goto fallback;
        }
        if (!isfinite(d)) goto fallback;
        if (size == 4) {
            if (fabs(d) > FLT_MAX) goto fallback;  /* the Python path says what is wrong */
            float f = (float)d;
            memcpy(buf + i * 4, &f, 4);
        } else {
            memcpy(buf + i * 8, &d, 8);
        }
    }
    return out;
fallback:
    PyErr_Clear();
    Py_DECREF(out);
    Py_RETURN_NONE;
}

static PyObject *flat_ints(PyObject *list, Py_ssize_t n, int size, int is_signed) {
    PyObject *out = PyByteArray_FromStringAndSize(NULL, n * size);
    if (out == NULL) return NULL;
    char *buf = PyByteArray_AS_STRING(out);
    long long lo, hi;
    if (is_signed) {
        hi = size == 8 ? INT64_MAX : (1LL << (size * 8 - 1)) - 1;
        lo = -hi - 1;
    } else {
        lo = 0;
        hi = size == 8 ? INT64_MAX : (1LL << (size * 8)) - 1;  /* u8 past int64: Python */
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = PyList_GET_ITEM(list, i);
        if (!PyLong_CheckExact(v)) goto fallback;
        int overflow = 0;
        long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (overflow || (x == -1 && PyErr_Occurred())) goto fallback;
        if (x < lo || x > hi) goto fallback;
        switch (size) {
            case 1: { int8_t y = (int8_t)x; memcpy(buf + i, &y, 1); break; }
            case 2: { int16_t y = (int16_t)x; memcpy(buf + i * 2, &y, 2); break; }
            case 4: { int32_t y = (int32_t)x; memcpy(buf + i * 4, &y, 4); break; }
            default: memcpy(buf + i * 8, &x, 8);
        }
    }
    return out;
fallback:
    PyErr_Clear();
    Py_DECREF(out);
    Py_RETURN_NONE;
}

static PyObject *flat(PyObject *self, PyObject *args) {
    PyObject *list;
    const char *code;
    if (!PyArg_ParseTuple(args, "O!s:flat", &PyList_Type, &list, &code)) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(list);
    if (n == 0 || strlen(code) != 2) Py_RETURN_NONE;
    int size = code[1] - '0';
    if (size != 1 && size != 2 && size != 4 && size != 8) Py_RETURN_NONE;
    if (n > PY_SSIZE_T_MAX / 8) Py_RETURN_NONE;
    switch (code[0]) {
        case 'f':
            if (size != 4 && size != 8) Py_RETURN_NONE;
            return flat_floats(list, n, size);
        case 'i':
            return flat_ints(list, n, size, 1);
        case 'u':
            return flat_ints(list, n, size, 0);
        default:
            Py_RETURN_NONE;
    }
}

static PyMethodDef methods[] = {
    {"flat", flat, METH_VARARGS,
     "flat(list, code) -> bytearray | None: a flat JSON list of numbers as a tensor's "
     "native bytes (code f4 f8 i1 i2 i4 i8 u1 u2 u4 u8), or None where the Python "
     "path must decide."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_jsonfast",
    "A flat JSON list of numbers to a tensor's bytes in one pass (see the C source's note).",
    -1, methods,
};

PyMODINIT_FUNC PyInit__jsonfast(void) { return PyModule_Create(&module); }
