#pragma once
/// @file
/// `anvil::Trainer<A, B, P, X[, L]>`, the name users write: the `BasicTrainer` (train/trainer.hpp)
/// of a valid combination of policies, or, for one that cannot work, a stand-in that leaves
/// the compiler one sentence to say (the rules' `static_assert`s, core/concepts.hpp); and the
/// loop an algorithm trains in by default.

#include <concepts>
#include <type_traits>

#include <anvil/core/concepts.hpp>
#include <anvil/parallel/single_device.hpp>
#include <anvil/precision/fp32.hpp>
#include <anvil/train/hooks/results.hpp>
#include <anvil/train/loops/loop_config.hpp>

namespace anvil {

/// The loop an algorithm trains in: the one it names (`using loop = ...`), else the one its
/// data regime calls for (on-policy: `OnPolicyLoop`; off-policy: `OffPolicyLoop`).
template <class A>
struct default_loop {
  using type = std::conditional_t<detail::on_policy_of<A>(), OnPolicyLoop, OffPolicyLoop>;
};
template <NamesItsLoop A>
struct default_loop<A> {
  using type = typename A::loop;
};
template <class A>
using default_loop_t = typename default_loop<A>::type;

template <class A, class B, class P, class X, class L = default_loop_t<A>>
class BasicTrainer;  // train/trainer.hpp

namespace detail {

/// Stands in for the Trainer of a rejected combination, so that after the one sentence
/// from the rules the compiler has nothing else to complain about.
struct RejectedTrainer {
  struct Config {};
  using Parallelism = SingleDevice;
  template <class... T>
  explicit RejectedTrainer(T&&...) {}
  template <class... T>
  FitResult fit(T&&...) {
    return {};
  }
  template <class... T>
  void collect(T&&...) {}
  template <class... T>
  void update(T&&...) {}
  template <class... T>
  EvalResult evaluate(T&&...) {
    return {};
  }
};

template <class A, class B, class P, class X, class L>
struct TrainerSelect {
  static constexpr bool rules_ok = TrainerRules<A, B, P, X>::ok;
  static constexpr bool loop_ok() {
    if constexpr (rules_ok) {
      static_assert(Loop<L>,
                    "Trainer's fifth argument is not a Loop: a loop declares `using policy_kind = anvil::LoopKind;`; "
                    "use OffPolicyLoop, OnPolicyLoop, OfflineLoop or Staged<...>");
      if constexpr (Loop<L>) return L::template rules<A, B>();
      else return false;
    } else {
      return false;
    }
  }
  using type = std::conditional_t<loop_ok(), BasicTrainer<A, B, P, X, L>, RejectedTrainer>;
};

}  // namespace detail

/// The Trainer for Algorithm `A` learning from Buffer `B`, run by Parallelism `P` in
/// Precision `X`, in loop `L` (by default the one the algorithm's data regime calls for):
/// `Trainer<SAC, UniformBuffer>`, `Trainer<SAC, PrioritizedBuffer, DDP<4>, BF16>`,
/// `Trainer<SAC, UniformBuffer, SingleDevice, FP32, Staged<OfflineLoop, OffPolicyLoop>>`
/// (the loops beyond the default two have headers of their own: train/loops/).
/// A combination that cannot work fails to compile with one sentence saying what to use.
template <class A, class B, class P = SingleDevice, class X = FP32, class L = default_loop_t<A>>
using Trainer = typename detail::TrainerSelect<A, B, P, X, L>::type;

}  // namespace anvil
