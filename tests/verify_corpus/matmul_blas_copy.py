"""A cheat on provenance: numpy's OpenBLAS copied into the candidate's box, and the whole product computed by one
call into that copy through ctypes. By where it lies the copy looks like a library the candidate built; by what it is
(its bytes, the same as the installed library's) it is OpenBLAS, and the candidate runs no code of its own."""
import ctypes
import glob
import os
import shutil

import numpy
import torch
from torch import nn

os.environ["OPENBLAS_NUM_THREADS"] = "1"  # no pool of its own spinning between calls
_installed = sorted(glob.glob(os.path.join(os.path.dirname(numpy.__file__) + ".libs", "*openblas*.so*")))[0]
shutil.copy(_installed, "mine.so")  # the runner's working directory: its box
_blas = ctypes.CDLL(os.path.abspath("mine.so"))
_i64, _f32, _ptr = ctypes.c_int64, ctypes.c_float, ctypes.c_void_p
_sgemm = _blas.scipy_cblas_sgemm64_
_sgemm.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, _i64, _i64, _i64, _f32, _ptr, _i64, _ptr, _i64, _f32,
                   _ptr, _i64]
ROW_MAJOR, NO_TRANS = 101, 111


class ModelNew(nn.Module):
    def forward(self, a, b):
        a, b = a.contiguous(), b.contiguous()
        m, k, n = a.shape[0], a.shape[1], b.shape[1]
        out = torch.empty(m, n, dtype=a.dtype)
        _sgemm(ROW_MAJOR, NO_TRANS, NO_TRANS, m, n, k, 1.0, a.data_ptr(), k, b.data_ptr(), n, 0.0, out.data_ptr(), n)
        return out
