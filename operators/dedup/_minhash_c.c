/* MinHash signatures of word shingles, one pass per document from UTF-8 bytes (operators/dedup/accel.py).

   The same hash as the numpy reference (operators/dedup/shingles.py, minhash.py): token bytes into the
   polynomial hash, token fmix64, the window of the last n token hashes combined with the position
   constants, fmix64, the scheme's premix, then per permutation a multiply-add and the minimum over the
   document's shingles. A plain C extension, not a JIT: a worker process pays a few kB for it, where
   numba's LLVM cost ~150 MB per process. The GIL is released while a batch is hashed. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define TOKEN_BASE 0x100000001B3ULL /* TOKEN_BASE in shingles.py */

/* The kernels are built for AVX-512, AVX2 and baseline x86-64, the widest the CPU has chosen at load time
   (GCC function multi-versioning): the permutation loop runs 16, 8 or 4 lanes wide. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define WIDEST_SIMD __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define WIDEST_SIMD
#endif

static inline uint64_t fmix64(uint64_t h) { /* MurmurHash3 fmix64 */
    h ^= h >> 33;
    h *= 0xFF51AFD7ED558CCDULL;
    h ^= h >> 33;
    h *= 0xC4CEB9FE1A85EC53ULL;
    h ^= h >> 33;
    return h;
}

static inline uint32_t premix32(uint64_t h) { /* low 32 bits, then MurmurHash3 fmix32 */
    uint32_t x = (uint32_t)h;
    x ^= x >> 16;
    x *= 0x85EBCA6BU;
    x ^= x >> 13;
    x *= 0xC2B2AE35U;
    x ^= x >> 16;
    return x;
}

static inline int is_space(uint8_t c) { return c == 32 || (c >= 9 && c <= 13); } /* ASCII whitespace */

static inline uint64_t shingle(const uint64_t *window, Py_ssize_t count, const uint64_t *consts) {
    uint64_t combined = 0;
    for (Py_ssize_t k = 0; k < count; k++) combined += window[k] * consts[k];
    return fmix64(combined);
}

/* One document's word shingle hashes into `shingles`; returns how many. */
static Py_ssize_t token_windows(const uint8_t *data, int64_t start, int64_t end, const uint64_t *consts,
                                Py_ssize_t n, uint64_t *window, uint64_t *shingles) {
    Py_ssize_t count = 0, made = 0;
    int64_t i = start;
    while (i < end) {
        if (is_space(data[i])) {
            i++;
            continue;
        }
        uint64_t h = 0, power = 1;
        while (i < end && !is_space(data[i])) {
            h += ((uint64_t)data[i] + 1) * power;
            power *= TOKEN_BASE;
            i++;
        }
        uint64_t token = fmix64(h);
        if (count < n) {
            window[count] = token;
        } else {
            memmove(window, window + 1, (size_t)(n - 1) * sizeof(uint64_t));
            window[n - 1] = token;
        }
        count++;
        if (count >= n) shingles[made++] = shingle(window, n, consts);
    }
    if (count > 0 && count < n) shingles[made++] = shingle(window, count, consts); /* fewer tokens than n */
    return made;
}

/* 32-bit lanes: wrapping multiply-add mod 2**32, then the minimum (the compiler vectorizes the inner loop) */
WIDEST_SIMD static void kernel32(const uint8_t *data, const int64_t *offsets, Py_ssize_t n_docs, const uint64_t *consts,
                     Py_ssize_t n, const uint32_t *a, const uint32_t *b, Py_ssize_t perms, uint32_t *out,
                     uint64_t *window, uint64_t *shingles, uint32_t *mixed) {
    for (Py_ssize_t d = 0; d < n_docs; d++) {
        Py_ssize_t made = token_windows(data, offsets[d], offsets[d + 1], consts, n, window, shingles);
        for (Py_ssize_t j = 0; j < made; j++) mixed[j] = premix32(shingles[j]);
        uint32_t *row = out + d * perms;
        for (Py_ssize_t k = 0; k < perms; k++) {
            const uint32_t ak = a[k], bk = b[k];
            uint32_t low = 0xFFFFFFFFU;
            for (Py_ssize_t j = 0; j < made; j++) {
                uint32_t v = ak * mixed[j] + bk;
                low = v < low ? v : low;
            }
            row[k] = low;
        }
    }
}

WIDEST_SIMD static void kernel64(const uint8_t *data, const int64_t *offsets, Py_ssize_t n_docs, const uint64_t *consts,
                     Py_ssize_t n, const uint64_t *a, const uint64_t *b, Py_ssize_t perms, uint64_t *out,
                     uint64_t *window, uint64_t *shingles) {
    for (Py_ssize_t d = 0; d < n_docs; d++) {
        Py_ssize_t made = token_windows(data, offsets[d], offsets[d + 1], consts, n, window, shingles);
        for (Py_ssize_t j = 0; j < made; j++) shingles[j] = fmix64(shingles[j]);
        uint64_t *row = out + d * perms;
        for (Py_ssize_t k = 0; k < perms; k++) {
            const uint64_t ak = a[k], bk = b[k];
            uint64_t low = 0xFFFFFFFFFFFFFFFFULL;
            for (Py_ssize_t j = 0; j < made; j++) {
                uint64_t v = ak * shingles[j] + bk;
                low = v < low ? v : low;
            }
            row[k] = low;
        }
    }
}

/* signatures(data, offsets, consts, a, b, out, width): C-contiguous buffers of uint8 text, int64 offsets,
   uint64 position constants, then a, b and out all of `width` bytes (4: affine32, 8: affine64); out has
   len(offsets) - 1 rows of len(a) values. */
static PyObject *signatures(PyObject *Py_UNUSED(self), PyObject *args) {
    Py_buffer data, offsets, consts, a, b, out;
    Py_ssize_t width;
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*w*n", &data, &offsets, &consts, &a, &b, &out, &width)) return NULL;
    PyObject *result = NULL;
    Py_ssize_t n_docs = offsets.len / 8 - 1, n = consts.len / 8, perms = (width == 4 || width == 8) ? a.len / width : 0;
    if ((width != 4 && width != 8) || offsets.len % 8 || consts.len % 8 || a.len % width || b.len != a.len ||
        n < 1 || n_docs < 0 || out.len != (n_docs > 0 ? n_docs : 0) * perms * width) {
        PyErr_SetString(PyExc_ValueError, "signatures: buffers of the wrong item size or length");
        goto done;
    }
    if (n_docs <= 0) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    const int64_t *off = (const int64_t *)offsets.buf;
    int64_t longest = 0;
    for (Py_ssize_t d = 0; d < n_docs; d++) {
        if (off[d] < 0 || off[d + 1] < off[d] || off[d + 1] > data.len) {
            PyErr_SetString(PyExc_ValueError, "signatures: offsets out of order or past the data");
            goto done;
        }
        if (off[d + 1] - off[d] > longest) longest = off[d + 1] - off[d];
    }
    Py_ssize_t most = (Py_ssize_t)(longest / 2 + 2); /* a token per two bytes, plus one */
    uint64_t *window = malloc((size_t)n * sizeof(uint64_t));
    uint64_t *shingles = malloc((size_t)most * sizeof(uint64_t));
    uint32_t *mixed = width == 4 ? malloc((size_t)most * sizeof(uint32_t)) : NULL;
    if (!window || !shingles || (width == 4 && !mixed)) {
        free(window), free(shingles), free(mixed);
        PyErr_NoMemory();
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    if (width == 4)
        kernel32(data.buf, off, n_docs, consts.buf, n, a.buf, b.buf, perms, out.buf, window, shingles, mixed);
    else
        kernel64(data.buf, off, n_docs, consts.buf, n, a.buf, b.buf, perms, out.buf, window, shingles);
    Py_END_ALLOW_THREADS
    free(window), free(shingles), free(mixed);
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&data), PyBuffer_Release(&offsets), PyBuffer_Release(&consts);
    PyBuffer_Release(&a), PyBuffer_Release(&b), PyBuffer_Release(&out);
    return result;
}

static PyMethodDef methods[] = {
    {"signatures", signatures, METH_VARARGS,
     "signatures(data, offsets, consts, a, b, out, width): MinHash of each document's word shingles into out."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_minhash_c", "Compiled MinHash (see accel.py).", -1,
                                    methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__minhash_c(void) { return PyModule_Create(&module); }
