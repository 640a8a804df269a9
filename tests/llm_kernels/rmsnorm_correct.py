"""RMSNorm in C, built by the system compiler as a tiny CPython extension (no torch headers: it builds in
well under a second) that works on the tensors' raw pointers."""

import hashlib
import importlib.util
import os
import subprocess
import sysconfig
import tempfile

import torch
from torch import nn

SOURCE = r"""
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>

static PyObject* rmsnorm_f32(PyObject* self, PyObject* args) {
  unsigned long long xp, wp, op;
  long rows, n;
  double eps;
  if (!PyArg_ParseTuple(args, "KKKlld", &xp, &wp, &op, &rows, &n, &eps)) return NULL;
  const float* x = (const float*)xp;
  const float* w = (const float*)wp;
  float* out = (float*)op;
  for (long r = 0; r < rows; ++r) {
    const float* xr = x + r * n;
    float* o = out + r * n;
    float ss = 0.f;
    for (long i = 0; i < n; ++i) ss += xr[i] * xr[i];
    const float inv = 1.f / sqrtf(ss / (float)n + (float)eps);
    for (long i = 0; i < n; ++i) o[i] = w[i] * (xr[i] * inv);
  }
  Py_RETURN_NONE;
}

static PyMethodDef methods[] = {{"rmsnorm_f32", rmsnorm_f32, METH_VARARGS, ""}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "kb_rmsnorm_c", NULL, -1, methods};
PyMODINIT_FUNC PyInit_kb_rmsnorm_c(void) { return PyModule_Create(&module); }
"""


def _build(source):
    digest = hashlib.sha256(source.encode()).hexdigest()[:12]
    folder = os.path.join(tempfile.gettempdir(), f"kb_c_{digest}")
    os.makedirs(folder, exist_ok=True)
    lib = os.path.join(folder, "kb_rmsnorm_c" + sysconfig.get_config_var("EXT_SUFFIX"))
    if not os.path.exists(lib):
        src = os.path.join(folder, "kernel.c")
        with open(src, "w") as f:
            f.write(source)
        cmd = ["gcc", "-O3", "-shared", "-fPIC", f"-I{sysconfig.get_paths()['include']}", "-o", lib, src, "-lm"]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"gcc failed:\n{done.stderr[-1500:]}")
    spec = importlib.util.spec_from_file_location("kb_rmsnorm_c", lib)
    ext = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ext)
    return ext


class ModelNew(nn.Module):
    def __init__(self, hidden_size, eps, dtype="float32"):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=getattr(torch, dtype)))
        self.variance_epsilon = eps
        self._ext = _build(SOURCE)

    def forward(self, hidden_states):
        if hidden_states.dtype != torch.float32:
            raise TypeError("float32 only")
        x = hidden_states.contiguous()
        w = self.weight.to(x.dtype).contiguous()
        out = torch.empty_like(x)
        n = x.shape[-1]
        self._ext.rmsnorm_f32(x.data_ptr(), w.data_ptr(), out.data_ptr(), x.numel() // n, n, self.variance_epsilon)
        return out
