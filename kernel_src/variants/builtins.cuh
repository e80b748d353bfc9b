// Every built-in variant piece, and the composition the flag-selected kernels use.
#pragma once
#include "variants/alibi.cuh"
#include "variants/causal.cuh"
#include "variants/contract.cuh"
#include "variants/custom_mask.cuh"
#include "variants/soft_cap.cuh"
#include "variants/window.cuh"

namespace cuinfer {
namespace variant {

template <bool On, class Piece> struct If {
  using type = Identity;
};
template <class Piece> struct If<true, Piece> {
  using type = Piece;
};

enum : int { kMaskCausal = 1, kMaskWindow = 2, kMaskCustom = 4 };

// Mask bits (kMask*) and the two logits flags -> the chain of built-in pieces (ALiBi before the soft cap).
template <int MASK, bool SOFT_CAP, bool ALIBI>
using FromFlags = Chain<typename If<(MASK & kMaskCausal) != 0, Causal>::type,
                        typename If<(MASK & kMaskWindow) != 0, Window>::type,
                        typename If<(MASK & kMaskCustom) != 0, CustomMask>::type, typename If<ALIBI, Alibi>::type,
                        typename If<SOFT_CAP, SoftCap>::type>;

}  // namespace variant
}  // namespace cuinfer
