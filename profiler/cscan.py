"""A compiled single pass over a Kineto trace's JSON text: the fields `scan_trace` reads, into arrays.

Built on first use with the system C compiler into ~/.cache/kernelbot (or $KERNELBOT_CACHE) and loaded
with ctypes. The scanner validates the whole document (grammar, escapes, UTF-8) but handles only the
common shape of a trace; on anything else (an id that is not an integer, a key with escapes, a
missing ts, invalid JSON...) it gives up and the caller runs the pure-Python scan, which then decides
or raises. No compiler, or KERNELBOT_PURE_PYTHON=1, means the pure-Python scan always.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from kernelbot.paths import cache_dir

# event kinds, by "cat"
CPU_OP, KERNEL, MEMCPY, MEMSET, RUNTIME, DRIVER, ANNOTATION, PYFUNC = range(8)
CATS = ("cpu_op", "kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime", "cuda_driver", "user_annotation",
        "python_function")
# integer fields, columns of `ids`; their state: 0 missing, 1 an integer, 2 null
PID, TID, EXT, CORR, DEVICE, STREAM, PY_ID, PY_PARENT = range(8)

SOURCE = r"""
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { N_IDS = 8 };
static const char *CATS[8] = {"cpu_op", "kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime", "cuda_driver",
                              "user_annotation", "python_function"};
static const char *EVENT_KEYS[7] = {"ph", "cat", "name", "ts", "dur", "pid", "tid"};
static const char *ID_KEYS[N_IDS] = {"pid", "tid", "External id", "correlation", "device", "stream",
                                     "Python id", "Python parent id"};

static unsigned char PLAIN[256];  /* bytes a string can hold as they are: ASCII, not '"', '\\' or control */

typedef struct {
    const unsigned char *p, *end, *base;
    int bail;
    int64_t cap, n, n_names, table_size;
    int8_t *kind; int32_t *name; double *ts, *dur; int64_t *ids; int8_t *state; int64_t *shape; int64_t *names;
    int64_t *table;
} S;

#define FAIL(s) do { (s)->bail = 1; return 0; } while (0)

static void ws(S *s) {
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\n' || *s->p == '\r' || *s->p == '\t')) s->p++;
}

/* a string at s->p; sets its span (quotes included) and whether it has escapes */
static int string(S *s, const unsigned char **start, int64_t *len, int *escaped) {
    if (s->p >= s->end || *s->p != '"') FAIL(s);
    const unsigned char *q = s->p + 1;
    *escaped = 0;
    for (;;) {
        while (q < s->end && PLAIN[*q]) q++;
        if (q >= s->end) FAIL(s);
        unsigned c = *q;
        if (c == '"') break;
        if (c < 0x20) FAIL(s);
        if (c == '\\') {
            *escaped = 1;
            if (q + 1 >= s->end) FAIL(s);
            unsigned e = q[1];
            if (e == 'u') {
                if (q + 6 > s->end) FAIL(s);
                unsigned v = 0;
                for (int i = 2; i < 6; i++) {
                    unsigned h = q[i];
                    v <<= 4;
                    if (h >= '0' && h <= '9') v |= h - '0';
                    else if (h >= 'a' && h <= 'f') v |= h - 'a' + 10;
                    else if (h >= 'A' && h <= 'F') v |= h - 'A' + 10;
                    else FAIL(s);
                }
                if (v >= 0xD800 && v <= 0xDFFF) FAIL(s);  /* surrogates: left to the pure-Python scan */
                q += 6;
            } else if (e == '"' || e == '\\' || e == '/' || e == 'b' || e == 'f' || e == 'n' || e == 'r' || e == 't') {
                q += 2;
            } else FAIL(s);
            continue;
        }
        if (c < 0x80) { q++; continue; }
        int more; unsigned lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) more = 1;
        else if (c == 0xE0) { more = 2; lo = 0xA0; }
        else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) more = 2;
        else if (c == 0xED) { more = 2; hi = 0x9F; }
        else if (c == 0xF0) { more = 3; lo = 0x90; }
        else if (c >= 0xF1 && c <= 0xF3) more = 3;
        else if (c == 0xF4) { more = 3; hi = 0x8F; }
        else FAIL(s);
        if (q + more >= s->end) FAIL(s);
        if (q[1] < lo || q[1] > hi) FAIL(s);
        for (int i = 2; i <= more; i++) if (q[i] < 0x80 || q[i] > 0xBF) FAIL(s);
        q += more + 1;
    }
    *start = s->p;
    *len = (q + 1) - s->p;
    s->p = q + 1;
    return 1;
}

/* a number at s->p: *is_int when it has no fraction or exponent and fits in int64 */
static int number(S *s, int *is_int, int64_t *ival, double *dval) {
    const unsigned char *q = s->p, *start = s->p;
    int neg = 0, digits = 0, integral = 1;
    if (q < s->end && *q == '-') { neg = 1; q++; }
    if (q >= s->end) FAIL(s);
    if (*q == '0') { q++; digits = 1; }
    else if (*q >= '1' && *q <= '9') { while (q < s->end && *q >= '0' && *q <= '9') { q++; digits++; } }
    else FAIL(s);
    if (q < s->end && *q == '.') {
        integral = 0; q++;
        if (q >= s->end || *q < '0' || *q > '9') FAIL(s);
        while (q < s->end && *q >= '0' && *q <= '9') q++;
    }
    if (q < s->end && (*q == 'e' || *q == 'E')) {
        integral = 0; q++;
        if (q < s->end && (*q == '+' || *q == '-')) q++;
        if (q >= s->end || *q < '0' || *q > '9') FAIL(s);
        while (q < s->end && *q >= '0' && *q <= '9') q++;
    }
    if (integral && digits > 18) FAIL(s);  /* big integers: left to the pure-Python scan */
    *is_int = integral;
    if (integral) {
        int64_t v = 0;
        for (const unsigned char *d = start + neg; d < q; d++) v = v * 10 + (*d - '0');
        *ival = neg ? -v : v;
        *dval = (double)*ival;  /* exact below 2^53; above, rounded as Python's float(int) rounds */
        if (v > ((int64_t)1 << 53)) {
            char buf[32]; memcpy(buf, start, q - start); buf[q - start] = 0; *dval = strtod(buf, NULL);
        }
    } else {
        char buf[64];
        if (q - start >= (long)sizeof buf) FAIL(s);
        memcpy(buf, start, q - start); buf[q - start] = 0;
        *dval = strtod(buf, NULL);
    }
    s->p = q;
    return 1;
}

static int literal(S *s, const char *word) {
    size_t n = strlen(word);
    if ((size_t)(s->end - s->p) < n || memcmp(s->p, word, n)) FAIL(s);
    s->p += n;
    return 1;
}

static int value(S *s, int depth);

static int container(S *s, int depth) {
    unsigned char open = *s->p, close = open == '{' ? '}' : ']';
    if (depth > 1000) FAIL(s);
    s->p++; ws(s);
    if (s->p < s->end && *s->p == close) { s->p++; return 1; }
    for (;;) {
        if (open == '{') {
            const unsigned char *k; int64_t kl; int esc;
            if (!string(s, &k, &kl, &esc)) return 0;
            ws(s);
            if (s->p >= s->end || *s->p != ':') FAIL(s);
            s->p++; ws(s);
        }
        if (!value(s, depth + 1)) return 0;
        ws(s);
        if (s->p >= s->end) FAIL(s);
        if (*s->p == ',') { s->p++; ws(s); continue; }
        if (*s->p == close) { s->p++; return 1; }
        FAIL(s);
    }
}

static int value(S *s, int depth) {
    if (s->p >= s->end) FAIL(s);
    const unsigned char *k; int64_t kl; int esc, is_int; int64_t iv; double dv;
    switch (*s->p) {
    case '{': case '[': return container(s, depth);
    case '"': return string(s, &k, &kl, &esc);
    case 't': return literal(s, "true");
    case 'f': return literal(s, "false");
    case 'n': return literal(s, "null");
    default: return number(s, &is_int, &iv, &dv);
    }
}

static int key_is(const unsigned char *k, int64_t kl, const char *word) {
    /* kl == strlen + 2 is checked first: most keys differ in length from most words */
    return kl >= 3 && k[1] == (unsigned char)word[0] && (size_t)kl == strlen(word) + 2 && !memcmp(k + 1, word, kl - 2);
}

/* an integer field: state 1 with its value, 2 for null; *bad for anything else */
static int id_value(S *s, int64_t *v, int8_t *st, int *bad) {
    int is_int; double dv;
    if (s->p < s->end && *s->p == 'n') { *st = 2; return literal(s, "null"); }
    if (s->p < s->end && (*s->p == '-' || (*s->p >= '0' && *s->p <= '9'))) {
        if (!number(s, &is_int, v, &dv)) return 0;
        if (is_int) *st = 1; else *bad = 1;
        return 1;
    }
    *bad = 1;
    return value(s, 1);
}

static uint64_t hash(const unsigned char *k, int64_t n) {
    uint64_t h = 1469598103934665603ULL;
    for (int64_t i = 0; i < n; i++) h = (h ^ k[i]) * 1099511628211ULL;
    return h;
}

static int grow(S *s) {
    int64_t size = s->table_size * 2, *table = malloc(size * sizeof(int64_t));
    if (!table) return 0;
    memset(table, 0xff, size * sizeof(int64_t));
    for (int64_t id = 0; id < s->n_names; id++) {
        uint64_t i = hash(s->base + s->names[2 * id], s->names[2 * id + 1]) & (size - 1);
        while (table[i] >= 0) i = (i + 1) & (size - 1);
        table[i] = id;
    }
    free(s->table);
    s->table = table; s->table_size = size;
    return 1;
}

static int32_t intern(S *s, const unsigned char *k, int64_t n) {
    if (2 * s->n_names >= s->table_size && !grow(s)) return -1;
    uint64_t mask = s->table_size - 1, i = hash(k, n) & mask;
    for (;;) {
        int64_t id = s->table[i];
        if (id < 0) {
            id = s->n_names++;
            s->names[2 * id] = k - s->base; s->names[2 * id + 1] = n;
            s->table[i] = id;
            return (int32_t)id;
        }
        if (s->names[2 * id + 1] == n && !memcmp(s->base + s->names[2 * id], k, n)) return (int32_t)id;
        i = (i + 1) & mask;
    }
}

static int args(S *s, int64_t *ids, int8_t *st, int64_t *shape, int *bad) {
    if (s->p < s->end && *s->p == 'n') return literal(s, "null");
    if (s->p >= s->end || *s->p != '{') { *bad = 1; return value(s, 1); }
    int seen = 0;
    s->p++; ws(s);
    if (s->p < s->end && *s->p == '}') { s->p++; return 1; }
    for (;;) {
        const unsigned char *k; int64_t kl; int esc, done = 0;
        if (!string(s, &k, &kl, &esc)) return 0;
        if (esc) *bad = 1;
        ws(s);
        if (s->p >= s->end || *s->p != ':') FAIL(s);
        s->p++; ws(s);
        for (int f = 2; f < N_IDS && !done; f++) {
            if (key_is(k, kl, ID_KEYS[f])) {
                done = 1;
                if (seen >> f & 1) { *bad = 1; if (!value(s, 2)) return 0; }  /* a repeated key */
                else if (!id_value(s, &ids[f], &st[f], bad)) return 0;
                seen |= 1 << f;
            }
        }
        for (int f = 0; f < 2 && !done; f++) {
            if (key_is(k, kl, f ? "Input type" : "Input Dims")) {
                done = 1;
                const unsigned char *v = s->p;
                if (!value(s, 2)) return 0;
                if (shape[2 * f] >= 0) *bad = 1;
                shape[2 * f] = v - s->base; shape[2 * f + 1] = s->p - v;
            }
        }
        if (!done && !value(s, 2)) return 0;
        ws(s);
        if (s->p >= s->end) FAIL(s);
        if (*s->p == ',') { s->p++; ws(s); continue; }
        if (*s->p == '}') { s->p++; return 1; }
        FAIL(s);
    }
}

static int event(S *s) {
    int64_t ids[N_IDS] = {0}, shape[4] = {-1, 0, -1, 0};
    int8_t st[N_IDS] = {0};
    int kind = -1, ph_x = 0, bad = 0, seen = 0, has_ts = 0, has_args = 0;
    const unsigned char *name = NULL; int64_t name_len = 0;
    double ts = 0, dur = 0;
    s->p++; ws(s);
    if (s->p < s->end && *s->p == '}') { s->p++; return 1; }
    for (;;) {
        const unsigned char *k, *v; int64_t kl, vl; int esc, vesc, is_int, field = -1; int64_t iv;
        if (!string(s, &k, &kl, &esc)) return 0;
        if (esc) bad = 1;
        ws(s);
        if (s->p >= s->end || *s->p != ':') FAIL(s);
        s->p++; ws(s);
        for (int f = 0; f < 7; f++) if (key_is(k, kl, EVENT_KEYS[f])) field = f;
        if (field >= 0 && (seen >> field) & 1) { bad = 1; field = -1; }  /* a repeated key */
        if (field >= 0) seen |= 1 << field;
        if (field == 0 || field == 1) {  /* ph, cat */
            if (s->p < s->end && *s->p == '"') {
                if (!string(s, &v, &vl, &vesc)) return 0;
                if (vesc) bad = 1;
                if (field == 0) ph_x = vl == 3 && v[1] == 'X';
                else for (int c = 0; c < 8; c++) if (key_is(v, vl, CATS[c])) kind = c;
            } else if (!value(s, 1)) return 0;
        } else if (field == 2) {  /* name */
            if (s->p < s->end && *s->p == '"') {
                if (!string(s, &name, &name_len, &vesc)) return 0;
            } else { bad = 1; if (!value(s, 1)) return 0; }
        } else if (field == 3 || field == 4) {  /* ts, dur */
            if (field == 3) has_ts = 1;
            if (s->p < s->end && (*s->p == '-' || (*s->p >= '0' && *s->p <= '9'))) {
                if (!number(s, &is_int, &iv, field == 3 ? &ts : &dur)) return 0;
            } else { bad = 1; if (!value(s, 1)) return 0; }
        } else if (field == 5 || field == 6) {  /* pid, tid */
            if (!id_value(s, &ids[field - 5], &st[field - 5], &bad)) return 0;
        } else if (key_is(k, kl, "args") && !has_args) {
            has_args = 1;
            if (!args(s, ids, st, shape, &bad)) return 0;
        } else {
            if (key_is(k, kl, "args")) bad = 1;
            if (!value(s, 1)) return 0;
        }
        ws(s);
        if (s->p >= s->end) FAIL(s);
        if (*s->p == ',') { s->p++; ws(s); continue; }
        if (*s->p == '}') { s->p++; break; }
        FAIL(s);
    }
    if (kind < 0 || !ph_x) return 1;
    if (bad || !has_ts || !name) FAIL(s);  /* the pure-Python scan decides (or reports the malformed event) */
    if (s->n >= s->cap) FAIL(s);
    int64_t i = s->n++;
    s->kind[i] = (int8_t)kind;
    if ((s->name[i] = intern(s, name, name_len)) < 0) FAIL(s);
    s->ts[i] = ts; s->dur[i] = dur;
    memcpy(s->ids + i * N_IDS, ids, sizeof ids);
    memcpy(s->state + i * N_IDS, st, sizeof st);
    memcpy(s->shape + i * 4, shape, sizeof shape);
    return 1;
}

static int events(S *s) {
    if (s->p >= s->end || *s->p != '[') FAIL(s);
    s->p++; ws(s);
    if (s->p < s->end && *s->p == ']') { s->p++; return 1; }
    for (;;) {
        if (s->p < s->end && *s->p == '{') { if (!event(s)) return 0; }
        else if (!value(s, 2)) return 0;
        ws(s);
        if (s->p >= s->end) FAIL(s);
        if (*s->p == ',') { s->p++; ws(s); continue; }
        if (*s->p == ']') { s->p++; return 1; }
        FAIL(s);
    }
}

/* returns 0 when the trace was scanned; meta: events, names, deviceProperties span (or -1) */
int kb_scan(const char *buf, int64_t len, int64_t cap, int8_t *kind, int32_t *name, double *ts, double *dur,
            int64_t *ids, int8_t *state, int64_t *shape, int64_t *names, int64_t *meta) {
    S s = {0};
    for (int c = 0; c < 256; c++) PLAIN[c] = c >= 0x20 && c < 0x80 && c != '"' && c != '\\';
    s.base = s.p = (const unsigned char *)buf; s.end = s.base + len; s.cap = cap;
    s.kind = kind; s.name = name; s.ts = ts; s.dur = dur; s.ids = ids; s.state = state; s.shape = shape;
    s.names = names;
    s.table_size = 1 << 12;
    s.table = malloc(s.table_size * sizeof(int64_t));
    if (!s.table) return 2;
    memset(s.table, 0xff, s.table_size * sizeof(int64_t));
    meta[2] = -1; meta[3] = 0;
    int found = 0, ok = 1;
    ws(&s);
    if (s.p < s.end && *s.p == '[') ok = events(&s), found = 1;
    else if (s.p < s.end && *s.p == '{') {
        s.p++; ws(&s);
        if (s.p < s.end && *s.p == '}') s.p++;
        else for (;;) {
            const unsigned char *k; int64_t kl; int esc;
            if (!(ok = string(&s, &k, &kl, &esc))) break;
            ws(&s);
            if (s.p >= s.end || *s.p != ':') { ok = 0; break; }
            s.p++; ws(&s);
            if (key_is(k, kl, "traceEvents") && !found) { found = 1; ok = events(&s); }
            else if (key_is(k, kl, "deviceProperties") && meta[2] < 0) {
                const unsigned char *v = s.p;
                ok = value(&s, 1);
                meta[2] = v - s.base; meta[3] = s.p - v;
            } else ok = value(&s, 1);
            if (!ok) break;
            ws(&s);
            if (s.p < s.end && *s.p == ',') { s.p++; ws(&s); continue; }
            if (s.p < s.end && *s.p == '}') { s.p++; break; }
            ok = 0; break;
        }
    } else ok = 0;
    free(s.table);
    ws(&s);
    if (!ok || !found || s.p != s.end) return 1;
    meta[0] = s.n; meta[1] = s.n_names;
    return 0;
}
"""

_lib: ctypes.CDLL | None = None
_tried = False


def _build() -> ctypes.CDLL | None:
    cc = os.environ.get("CC", "cc")
    if not shutil.which(cc):
        return None
    cache = cache_dir()
    target = cache / f"cscan-{hashlib.sha256(SOURCE.encode()).hexdigest()[:16]}.so"
    if not target.exists():
        try:
            cache.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=cache) as tmp:
                src, out = Path(tmp) / "cscan.c", Path(tmp) / "cscan.so"
                src.write_text(SOURCE)
                subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(out), str(src)], check=True,
                               capture_output=True, timeout=120)
                os.replace(out, target)  # atomic: a concurrent build leaves one whole library
        except (OSError, subprocess.SubprocessError):
            return None
    try:
        lib = ctypes.CDLL(str(target))
    except OSError:
        return None
    ptr = ctypes.c_void_p
    lib.kb_scan.argtypes = [ctypes.c_char_p, ctypes.c_int64, ctypes.c_int64, *[ptr] * 9]
    lib.kb_scan.restype = ctypes.c_int
    return lib


def library() -> ctypes.CDLL | None:
    """The compiled scanner, or None (no compiler, or KERNELBOT_PURE_PYTHON=1)."""
    global _lib, _tried
    if os.environ.get("KERNELBOT_PURE_PYTHON"):
        return None
    if not _tried:
        _tried = True
        _lib = _build()
    return _lib


class Scanned:
    """kb_scan's arrays, cut to the events found: one row per kept event (ph X, a category we read)."""

    def __init__(self, raw: bytes, lib: ctypes.CDLL) -> None:
        # a kept event is at least 42 bytes ({"ph":"X","cat":"kernel","name":"","ts":0}); untouched rows of
        # these arrays are never paged in
        cap = len(raw) // 40 + 1
        self.kind = np.empty(cap, np.int8)
        self.name = np.empty(cap, np.int32)
        self.ts, self.dur = np.empty(cap), np.empty(cap)
        self.ids = np.empty((cap, 8), np.int64)
        self.state = np.empty((cap, 8), np.int8)
        self.shape = np.empty((cap, 4), np.int64)
        names = np.empty((cap, 2), np.int64)
        meta = np.zeros(4, np.int64)
        arrays = (self.kind, self.name, self.ts, self.dur, self.ids, self.state, self.shape, names, meta)
        self.ok = lib.kb_scan(raw, len(raw), cap, *(a.ctypes.data for a in arrays)) == 0
        if not self.ok:
            return
        n, n_names = int(meta[0]), int(meta[1])
        for attr in ("kind", "name", "ts", "dur", "ids", "state", "shape"):
            setattr(self, attr, getattr(self, attr)[:n].copy())  # give back the unused capacity
        self.names = [_decode(raw[o:o + length]) for o, length in names[:n_names].tolist()]
        self.props_span = (int(meta[2]), int(meta[3]))

    def column(self, rows: np.ndarray, field: int) -> list:
        """An integer field of the given rows as Python values, None where null or missing."""
        values, state = self.ids[rows, field].tolist(), self.state[rows, field]
        if (state == 1).all():
            return values
        return [v if s == 1 else None for v, s in zip(values, state.tolist(), strict=True)]


def _decode(token: bytes) -> str:
    import json

    return json.loads(token) if b"\\" in token else token[1:-1].decode()
