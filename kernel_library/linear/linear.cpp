// The linear family's extension: the small-M GEMMs of small_m_gemm.h, bound for Python.
#include "../small_m_gemm.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("small_m_linear", &small_m_linear);
  m.def("small_m_linear_bf16", &small_m_linear_bf16);
  m.def("gate_up_act", &gate_up_act);
  m.def("gate_up_act_bf16", &gate_up_act_bf16);
  m.def("has_avx512_bf16", &has_avx512_bf16);
  m.def("has_amx_bf16", &has_amx_bf16);
  m.def("gemm_engine", &gemm_engine);
}
