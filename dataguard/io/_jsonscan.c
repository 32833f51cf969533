/* Where a JSON byte stream's structure is: the compiled scanner behind
 * dataguard.io.json_structure.JsonScanner (the NumPy version there is the reference the
 * tests hold this one to, byte for byte).
 *
 * Why C: indexing a JSON array for input splits reads the whole file in one worker before
 * any unit can start, and the vectorised NumPy scan runs at about 250 MB/s (a translate,
 * a nonzero over every byte, escape runs, a searchsorted). One branchy pass here keeps up
 * with the disk.
 *
 * events(chunk, in_string, backslashes) -> (positions, kinds, in_string, backslashes)
 *   chunk        bytes-like: the next bytes of the stream
 *   in_string    whether the stream is inside a string where the chunk starts
 *   backslashes  length of the backslash run that ended the previous chunk
 * positions: a bytearray of int64 offsets in chunk of the structural characters outside
 * strings ([ { ] } , :), kinds: a bytearray of their codes (2 [, 3 {, 4 ], 5 }, 6 ",", 7 :),
 * and the state to carry into the next chunk. A quote toggles the string state unless an
 * odd run of backslashes precedes it (the run may start in earlier chunks), as in the
 * NumPy scanner; on invalid JSON both may mis-frame the same way, which only ever becomes
 * rejected rows.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static unsigned char kind_of[256];

static PyObject *events(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer chunk;
    int in_string;
    Py_ssize_t run;
    if (!PyArg_ParseTuple(args, "y*pn", &chunk, &in_string, &run))
        return NULL;
    if (run < 0) {
        PyBuffer_Release(&chunk);
        PyErr_SetString(PyExc_ValueError, "backslashes must be >= 0");
        return NULL;
    }
    const unsigned char *data = (const unsigned char *)chunk.buf;
    Py_ssize_t n = chunk.len, count = 0, cap = n / 8 + 16;
    int64_t *pos = malloc((size_t)cap * sizeof(int64_t));
    unsigned char *kinds = malloc((size_t)cap);
    int failed = pos == NULL || kinds == NULL;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n && !failed; i++) {
        unsigned char c = data[i];
        if (c == '\\') {
            run++;
            continue;
        }
        if (c == '"') {
            if ((run & 1) == 0)
                in_string = !in_string;
            run = 0;
            continue;
        }
        run = 0;
        unsigned char k = kind_of[c];
        if (k == 0 || in_string)
            continue;
        if (count == cap) {
            Py_ssize_t grown = cap * 2;
            int64_t *p2 = realloc(pos, (size_t)grown * sizeof(int64_t));
            if (p2 == NULL) {
                failed = 1;
                break;
            }
            pos = p2;
            unsigned char *k2 = realloc(kinds, (size_t)grown);
            if (k2 == NULL) {
                failed = 1;
                break;
            }
            kinds = k2;
            cap = grown;
        }
        pos[count] = (int64_t)i;
        kinds[count] = k;
        count++;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&chunk);
    PyObject *result = NULL, *positions = NULL, *codes = NULL;
    if (failed) {
        PyErr_NoMemory();
    } else {
        positions = PyByteArray_FromStringAndSize((const char *)pos, count * (Py_ssize_t)sizeof(int64_t));
        codes = positions ? PyByteArray_FromStringAndSize((const char *)kinds, count) : NULL;
        if (codes)
            result = Py_BuildValue("(OOOn)", positions, codes, in_string ? Py_True : Py_False, run);
    }
    Py_XDECREF(positions);
    Py_XDECREF(codes);
    free(pos);
    free(kinds);
    return result;
}

static PyMethodDef methods[] = {
    {"events", events, METH_VARARGS,
     "events(chunk, in_string, backslashes) -> (int64 positions, uint8 kinds, in_string, backslashes)\n\n"
     "The structural characters of a JSON chunk that lie outside strings (see the module source)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_jsonscan", "Compiled JSON structure scanner.", -1,
                                    methods};

PyMODINIT_FUNC PyInit__jsonscan(void)
{
    const char *structural = "[{]},:";
    for (int code = 2; *structural; structural++, code++)
        kind_of[(unsigned char)*structural] = (unsigned char)code;
    return PyModule_Create(&module);
}
