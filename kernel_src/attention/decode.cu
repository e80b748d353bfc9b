// Entry file of the batch-decode kernels (attention/decode.cuh); DecodeParams comes from the generated preamble.
#include "attention/decode.cuh"
