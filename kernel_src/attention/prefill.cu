// Translation unit of the FA2-class batch prefill kernel. The generated preamble (cuinfer/prefill/specs.py) declares
// `PrefillParams`; the instances come from NVRTC name expressions (cuinfer::batch_prefill<cuinfer::PrefillTraits<...>>).
#include "attention/prefill_sm80/kernel.cuh"
