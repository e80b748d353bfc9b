// Translation unit of the Hopper batch prefill kernel. The generated preamble (cuinfer/prefill/sm90.py) declares
// `PrefillParams` and the variant chain; the instances come from NVRTC name expressions
// (cuinfer::batch_prefill_sm90<__nv_bfloat16, 128, false>).
#include "attention/prefill_sm90/kernel.cuh"
