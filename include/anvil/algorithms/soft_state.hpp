#pragma once
/// @file
/// What a checkpoint holds of a soft actor-critic (SAC and discrete SAC), written, read and
/// restored in one order for both: the actor, the critics and the temperature with their
/// Adam states, the target critics, the update count (which schedules the actor's and the
/// targets' updates) and the averaged actor. An algorithm that keeps these members
/// (`actor_opt_`, `critic_opt_`, `alpha_opt_`, `target_`, `updates_`, `ema_`) names
/// `detail::SoftState` its friend and forwards its `save`, `read` and `restore` here.

#include <cstdint>
#include <string>

#include <anvil/core/binary_io.hpp>
#include <anvil/core/tensor_io.hpp>
#include <anvil/optim/ema.hpp>
#include <anvil/optim/flat_adam.hpp>

namespace anvil::detail {

/// A soft actor-critic's state as read from a checkpoint, checked before it is applied.
struct SoftSaved {
  FlatAdam::Saved actor, critic, alpha;
  at::Tensor target;
  Ema::Saved ema;
  std::int64_t updates = 0;
};

/// Writes, reads (checking every size; `who` names the algorithm in errors) and restores a
/// soft actor-critic's state.
struct SoftState {
  template <class A>
  static void save(const A& a, BinaryWriter& w) {
    a.actor_opt_.save(w);
    a.critic_opt_.save(w);
    a.alpha_opt_.save(w);
    write_tensor(w, a.target_.flat(), "the target critic's weights");
    w.value(a.updates_);
    a.ema_.save(w);
  }
  template <class A>
  [[nodiscard]] static SoftSaved read(const A& a, BinaryReader& r, const std::string& who) {
    SoftSaved s;
    s.actor = a.actor_opt_.read(r, who + " actor");
    s.critic = a.critic_opt_.read(r, who + " critic");
    s.alpha = a.alpha_opt_.read(r, who + " temperature");
    s.target = read_tensor(r, (who + " target critic parameters").c_str(), a.target_.flat());
    s.updates = r.value<std::int64_t>((who + " update count").c_str());
    s.ema = a.ema_.read(r, (who + " averaged actor parameters").c_str(), a.actor_opt_.parameters().flat());
    return s;
  }
  template <class A>
  static void restore(A& a, const SoftSaved& s) {
    a.actor_opt_.restore(s.actor);
    a.critic_opt_.restore(s.critic);
    a.alpha_opt_.restore(s.alpha);
    torch::NoGradGuard no_grad;
    a.target_.flat().copy_(s.target);
    a.updates_ = s.updates;
    a.ema_.restore(s.ema);
  }
};

}  // namespace anvil::detail
