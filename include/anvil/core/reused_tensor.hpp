#pragma once
/// @file
/// `detail::ReusedTensor`: a host tensor handed out again once its last taker has dropped it,
/// so per-step and per-batch outputs allocate nothing.

#include <ATen/ATen.h>

namespace anvil::detail {

/// Host tensors handed out call after call (a buffer's batches, the actions of a step):
/// `take` gives one of the two it holds again when nothing else holds it or its storage any
/// more (its taker has dropped it, views included) and it has the shape and dtype asked for;
/// else a new one, which it keeps in place of the older of the two. Two, because a taker may
/// still hold the last one when it asks for the next (an env keeps its last actions until
/// the next step). The taker writes every element, so nothing of an earlier call shows.
/// Drawing a batch then allocates nothing: the eight tensors of 1-17 KB allocated and freed
/// per batch before cost glibc's malloc a consolidation of its free chunks on most frees,
/// ~13% of a prioritized sample and update in perf on an Intel Xeon
/// (docs/benchmarks/peers.md). A taker that keeps what it got (a queue of batches, a graph
/// that saved them) gets new tensors, as before.
class ReusedTensor {
 public:
  at::Tensor take(at::IntArrayRef sizes, at::ScalarType dtype) {
    for (const auto& t : t_)
      if (t.defined() && t.use_count() == 1 && t.storage().use_count() == 1 && t.scalar_type() == dtype &&
          t.sizes() == sizes)
        return t;
    auto& slot = t_[next_];
    next_ ^= 1;
    slot = at::empty(sizes, at::TensorOptions().dtype(dtype));
    return slot;
  }

 private:
  at::Tensor t_[2];
  int next_ = 0;  // the slot the next new tensor takes (the older one)
};

}  // namespace anvil::detail
