#pragma once
/// @file
/// `EpisodicLoop`: the loop of algorithms that learn from whole episodes (Monte-Carlo
/// policy gradients; COMA's rounds of episodes). Each iteration is a round: every env starts
/// a new episode, the envs step together with the algorithm's exploration until each has
/// finished its episode (an env whose episode ended runs on, but those steps are not kept),
/// the round's episodes go to the buffer as one padded batch, and the algorithm updates from
/// it (as many passes as it likes, inside its `update`). The clock counts the kept steps of
/// every rank (one sum over the ranks per round) and, every rank running as many episodes
/// per round, the ranks stay in lockstep.
///
/// An algorithm chooses this loop by naming it: `using loop = anvil::EpisodicLoop;`.

#include <cstdint>
#include <string>
#include <vector>

#include <anvil/core/batch.hpp>
#include <anvil/core/concepts.hpp>
#include <anvil/core/error.hpp>
#include <anvil/core/param.hpp>
#include <anvil/envs/vec_env.hpp>
#include <anvil/train/loops/loop.hpp>
#include <anvil/train/loops/loop_config.hpp>
#include <anvil/train/loops/stage.hpp>

namespace anvil {

/// What the episodic loop needs of its buffer: episode steps in, a round of episodes out.
template <class B>
concept EpisodeStorage = Buffer<B> && std::same_as<typename B::Step, EpisodeStep> &&
                         requires(B& b, const B& cb) {
                           { cb.episodes() } -> std::same_as<typename B::Batch>;
                           { b.clear() };
                         };

/// Loop policy for learning from whole episodes (see file comment); its `train` section is
/// the on-policy loop's.
struct EpisodicLoop : loops::LoopTag<"episodic", "episodic", loops::OnPolicyConfig, ClockUnit::env_steps> {
  /// Runs the loop: rounds of one episode per env, each followed by an update from them.
  template <class A, class B>
  class Runner : public loops::Stage<Runner<A, B>, EpisodicLoop, A, B> {
    using Runner::Stage::Stage, Runner::Stage::cfg_, Runner::Stage::p_;

   public:
    /// One round: an episode of every env, then an update from them.
    void iterate(std::int64_t /*quiet_until*/ = INT64_MAX) {
      collect_round();
      loops::update_once(p_, p_.buffer.episodes(), cfg_.update->ema_decay);
    }

    /// At the stage's start and after a resume: the buffer learns the plan.
    void prepare() { p_.buffer.plan(StoragePlan{p_.collector.num_envs(), cfg_.steps, 0.0}); }

    /// Collects one episode of every env into the buffer (cleared first).
    void collect_round() {
      p_.buffer.clear();
      p_.collector.restart();
      const std::int64_t n = p_.collector.num_envs();
      std::vector<bool> live(static_cast<std::size_t>(n), true);
      at::Tensor live_t = at::ones({n});
      std::int64_t running = n, kept = 0;
      while (running > 0) {
        at::Tensor action;
        {
          const auto& obs = p_.collector.observations();
          ScopedPhase ph(p_.times, Phase::act);
          action = p_.algorithm.act(obs, ActMode::explore).to(at::kCPU);
        }
        const envs::VecStep& s = p_.collector.step(action, /*count_episodes=*/false);
        {
          ScopedPhase ph(p_.times, Phase::buffer_add);
          p_.buffer.add(EpisodeStep{p_.collector.previous_observations(), action, s.reward, s.terminated, s.truncated,
                                    live_t.clone(), s.next_obs});
        }
        kept += running;
        for (const auto& e : s.ended) {
          const auto i = static_cast<std::size_t>(e.env);
          if (!live[i]) continue;
          live[i] = false;
          live_t[e.env] = 0.0f;
          --running;
          p_.collector.episodes().record(e.episode_return, e.length, p_.collector.env_step());
        }
      }
      p_.clock.env_steps += static_cast<std::int64_t>(p_.ranks.sum(static_cast<double>(kept)));
    }

    /// What the timing verdict suggests, in this loop's knobs and its algorithm's.
    [[nodiscard]] BottleneckAdvice advice(const AdviceKeys& k) const {
      const std::string passes = k.find("data_passes"), batch = k.find("batch_size");
      BottleneckAdvice a;
      a.env = "raise env.num_envs or env.threads";
      a.learn = loops::either(passes.empty() ? "" : "fewer " + passes, ", or ", "add ranks");
      a.comm = loops::either(batch.empty() ? "" : "a larger " + batch + " (fewer all-reduces per round)", " or ", "fewer ranks");
      a.act = loops::act_advice();
      a.side = loops::side_advice(k);
      return a;
    }

  };

  /// What this loop needs of the algorithm and the buffer, one sentence each (see loops/loop.hpp).
  template <class A, class B>
  static constexpr bool rules() {
    ANVIL_LOOP_RULE(EpisodeStorage<B>,
                    "episodic loop stores rounds of EpisodeSteps and learns from their episodes(); the Buffer "
                    "cannot (see anvil::EpisodeStorage); use EpisodeBuffer")
    ANVIL_LOOP_RULE((std::same_as<typename A::Batch, typename B::Batch>),
                    "episodic loop hands the Algorithm the Buffer's episodes, which are not its Batch")
    return true;
  }
};

}  // namespace anvil
