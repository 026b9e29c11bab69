#pragma once
/// @file
/// `OnPolicyLoop`: the loop of on-policy algorithms (PPO, ...) with a rollout buffer. Each
/// iteration collects a rollout (`rollout.steps` steps of every env with the current
/// policy, the value of a truncated episode's last state kept to bootstrap from), computes
/// its advantages, and learns from it: the algorithm's `epochs()` passes in shuffled
/// minibatches of `minibatch_size()` rows, after each of which the algorithm's
/// `end_epoch` says whether to go on (PPO stops early once the policy has moved too far:
/// `ppo.target_kl`). Then the rollout is cleared: no step is learned from by a policy other
/// than the one that collected it and the epochs right after.
///
/// A recurrent policy (`CarriesMemory`) acts from each training env's memory, which the
/// collector holds and resets where an episode ends; the rollout keeps the memory beside
/// each step, and the epochs hand out sequences of the policy's `sequence_length()` steps
/// (whole runs of one env, shuffled) instead of single rows.

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>

#include <anvil/core/agent_memory.hpp>
#include <anvil/core/batch.hpp>
#include <anvil/core/concepts.hpp>
#include <anvil/core/error.hpp>
#include <anvil/core/param.hpp>
#include <anvil/envs/vec_env.hpp>
#include <anvil/train/loops/loop.hpp>
#include <anvil/train/loops/loop_config.hpp>
#include <anvil/train/loops/stage.hpp>

namespace anvil {

/// Loop policy for on-policy algorithms (see file comment).
struct OnPolicyLoop : loops::LoopTag<"on-policy", "on_policy", loops::OnPolicyConfig, ClockUnit::env_steps> {
  /// Runs the loop: a rollout of every env, learnt from and cleared, until train.steps env steps.
  template <class A, class B>
  class Runner : public loops::Stage<Runner<A, B>, OnPolicyLoop, A, B> {
    using Runner::Stage::Stage, Runner::Stage::cfg_, Runner::Stage::p_;

   public:
    /// At the stage's start and after a resume: the rollout is sized for the envs. A
    /// minibatch larger than a rollout is refused, naming both.
    void prepare() {
      p_.collector.envs().set_discount(p_.algorithm.discount());
      StoragePlan plan{p_.collector.num_envs(), cfg_.steps, p_.algorithm.discount()};
      if constexpr (CarriesMemory<A>) plan.memory = p_.algorithm.memory_width();
      p_.buffer.plan(plan);
      const std::int64_t rows = p_.buffer.capacity(), envs = p_.collector.num_envs();
      if constexpr (CarriesMemory<A>) {
        p_.collector.memory().plan(envs, p_.algorithm.memory_width(), p_.step.device());
        const std::int64_t steps = rows / envs, length = p_.algorithm.sequence_length();
        if (length < 0 || length > steps || (length > 0 && steps % length != 0))
          throw ConfigError(std::string(A::config_section.view()) + ".sequence_length (" + std::to_string(length) +
                            ") must divide " + std::string(B::config_section.view()) + ".steps (" +
                            std::to_string(steps) + "): sequences are cut from each env's steps of a rollout");
      }
      if (p_.algorithm.minibatch_size() > rows)
        throw ConfigError(std::string(A::config_section.view()) + ".minibatch_size (" +
                          std::to_string(p_.algorithm.minibatch_size()) + ") is larger than a rollout: " +
                          std::string(B::config_section.view()) + ".steps (" + std::to_string(rows / envs) +
                          ") x env.num_envs (" + std::to_string(envs) + ") = " + std::to_string(rows) + " rows");
    }

    /// One iteration: collect a rollout, learn from it.
    void iterate(std::int64_t /*quiet_until*/ = INT64_MAX) {
      collect_rollout();
      learn_rollout();
    }

    /// Fills the rollout buffer with `rollout.steps` steps of every env, acting with the
    /// current policy, and computes its advantages.
    void collect_rollout() {
      p_.buffer.clear();
      while (!p_.buffer.full()) step();
      ScopedPhase ph(p_.times, Phase::buffer_add);
      if constexpr (CarriesMemory<A>)
        p_.buffer.finish(p_.algorithm.value(p_.collector.observations(), p_.collector.memory()));
      else
        p_.buffer.finish(p_.algorithm.value(p_.collector.observations()));
    }

    /// Learns from the collected rollout (see file comment), then clears it.
    void learn_rollout() {
      // Every rank normalises with the same statistics from here on.
      if (p_.ranks.world_size() > 1) p_.collector.envs().sync_statistics([this](at::Tensor& t) { p_.ranks.sum(t); });
      p_.algorithm.set_progress(static_cast<double>(this->elapsed()) / static_cast<double>(*cfg_.steps));
      int epochs = 0;
      for (int e = 0; e < p_.algorithm.epochs(); ++e) {
        std::optional<ScopedPhase> sampling(std::in_place, p_.times, Phase::sample);
        auto learn = [&](const auto& minibatches) {
          for (const auto& batch : minibatches) {
            sampling.reset();
            loops::update_once(p_, batch, cfg_.update->ema_decay);
            sampling.emplace(p_.times, Phase::sample);
          }
        };
        if constexpr (CarriesMemory<A>)
          learn(p_.buffer.sequences(p_.algorithm.minibatch_size(), p_.algorithm.sequence_length()));
        else
          learn(p_.buffer.minibatches(p_.algorithm.minibatch_size()));
        sampling.reset();
        ++epochs;
        if (!p_.algorithm.end_epoch(p_.step)) break;
      }
      p_.metrics.add("epochs", epochs);
      p_.buffer.clear();
    }

    void at_log_row() {}  // the normalisers were merged before the rollout's updates

    /// What the timing verdict suggests, in this loop's knobs and its algorithm's.
    [[nodiscard]] BottleneckAdvice advice(const AdviceKeys& k) const {
      const std::string epochs = k.find("epochs"), minibatch = k.find("minibatch_size");
      BottleneckAdvice a;
      a.env = "raise env.num_envs or env.threads";
      a.learn = loops::either(loops::either(epochs.empty() ? "" : "fewer " + epochs, " or ",
                                            minibatch.empty() ? "" : "a larger " + minibatch),
                              ", or ", "add ranks");
      a.comm = loops::either(minibatch.empty() ? "" : "a larger " + minibatch + " (fewer all-reduces per rollout)", " or ",
                             "fewer ranks");
      a.act = loops::act_advice();
      a.sample = minibatch.empty() ? "" : "a larger " + minibatch;
      a.side = loops::side_advice(k);
      return a;
    }

   private:
    // One step of every env for the rollout: act, step, and for rows cut by the time limit
    // the value of their true last state (the bootstrap; see RolloutBuffer). A recurrent
    // policy acts from the envs' memory and moves it on; the step's episode starts (taken
    // before the step marks the next ones) and the memory it acted from go with the step.
    void step() {
      RolloutAct act;
      at::Tensor first;
      {
        const auto& obs = p_.collector.observations();
        ScopedPhase ph(p_.times, Phase::act);
        if constexpr (CarriesMemory<A>) {
          first = p_.collector.memory().first.clone();
          act = p_.algorithm.act_for_rollout(obs, p_.collector.memory());
        } else {
          act = p_.algorithm.act_for_rollout(obs);
        }
      }
      const envs::VecStep& s = p_.collector.step(act.action);
      at::Tensor bootstrap;
      if (std::any_of(s.ended.begin(), s.ended.end(), [](const envs::EpisodeEnd& e) { return !e.terminated; })) {
        ScopedPhase ph(p_.times, Phase::act);
        if constexpr (CarriesMemory<A>) {
          // The memory has taken in the step's observation; the last one of an ended
          // episode goes on from it (the step marked that row as starting afresh).
          const auto& m = p_.collector.memory();
          AgentMemory going_on{m.state, at::zeros_like(m.first)};
          bootstrap = p_.algorithm.value(s.next_obs, going_on);
        } else {
          bootstrap = p_.algorithm.value(s.next_obs);
        }
      }
      {
        ScopedPhase ph(p_.times, Phase::buffer_add);
        p_.buffer.add(RolloutStep{p_.collector.previous_observations(), act.action, act.log_prob, act.value, s.reward,
                                  s.terminated, s.truncated, bootstrap, act.memory, first});
      }
      p_.clock.env_steps += p_.collector.num_envs() * p_.ranks.world_size();
    }
  };

  /// What this loop needs of the algorithm and the buffer, one sentence each (see loops/loop.hpp).
  template <class A, class B>
  static constexpr bool rules() {
    ANVIL_LOOP_RULE(OnPolicyAlgorithm<A>,
                    "on-policy loop needs act_for_rollout, value, epochs, minibatch_size, end_epoch, "
                    "set_progress and discount of the Algorithm; one is missing (see anvil::OnPolicyAlgorithm)")
    ANVIL_LOOP_RULE(RolloutStorage<B>,
                    "on-policy loop fills a rollout, computes its advantages and hands it out in minibatches; "
                    "the Buffer lacks full, finish, minibatches or clear (see anvil::RolloutStorage)")
    ANVIL_LOOP_RULE((std::same_as<typename B::Step, RolloutStep>),
                    "on-policy loop stores each env step as a RolloutStep, but the Buffer's Step is another type")
    ANVIL_LOOP_RULE(!CarriesMemory<A> || StoresSequences<B>,
                    "Algorithm carries memory (a recurrent policy) and learns from sequences, but the Buffer "
                    "keeps no memory beside its steps and hands out no sequences (see anvil::StoresSequences)")
    return true;
  }
};

}  // namespace anvil
