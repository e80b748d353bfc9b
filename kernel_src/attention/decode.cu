// Translation unit of the batch-decode kernels (attention/decode/kernels.cuh); DecodeParams comes from the generated
// preamble (cuinfer/decode/specs.py).
#include "attention/decode/kernels.cuh"
