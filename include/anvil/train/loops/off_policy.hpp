#pragma once
/// @file
/// `OffPolicyLoop`: the loop of off-policy algorithms (SAC, TD3, ...) with a replay buffer.
/// Each iteration steps every env once (uniform random actions until
/// `train.learning_starts`, then the algorithm's exploration), stores the step, and once
/// the buffer holds a batch runs `train.updates_per_interval` updates every
/// `train.update_interval` env steps of this rank, each on a fresh batch; prioritized
/// buffers get each batch's TD errors back. An algorithm with `shaped_rewards(step, env_steps)`
/// (reward shaping) gives the rewards each step is stored with.
///
/// With `env.mode=async` the envs step in the background while the updates run: after a
/// step lands and is stored, the next actions are chosen and the next step started, then
/// the updates run. So the policy that acts is one round of updates behind the one a sync
/// run would act with; the data the updates see is the same (the newest step included).
/// An env whose step costs about as much as the updates takes about half the time.

#include <cstdint>
#include <string>

#include <anvil/core/batch.hpp>
#include <anvil/core/concepts.hpp>
#include <anvil/core/error.hpp>
#include <anvil/core/param.hpp>
#include <anvil/envs/vec_env.hpp>
#include <anvil/train/loops/loop.hpp>
#include <anvil/train/loops/loop_config.hpp>
#include <anvil/train/loops/stage.hpp>

namespace anvil {

/// An algorithm that shapes the rewards it learns from (CollectiveStudent): the loop stores
/// `shaped_rewards(step, env steps of the stage)` in place of the env's.
template <class A>
concept ShapesRewards = requires(A& a, const StepBatch& step) {
  { a.shaped_rewards(step, std::int64_t{}) } -> std::same_as<at::Tensor>;
};

/// Loop policy for off-policy algorithms (see file comment).
struct OffPolicyLoop : loops::LoopTag<"off-policy", "off_policy", loops::OffPolicyConfig, ClockUnit::env_steps> {
  /// Runs the loop (see file comment).
  template <class A, class B>
  class Runner : public loops::Stage<Runner<A, B>, OffPolicyLoop, A, B> {
    using Runner::Stage::cfg_, Runner::Stage::p_, Runner::Stage::origin_;

   public:
    Runner(const Config& cfg, LoopParts<A, B> parts) : Runner::Stage(cfg, parts) {
      if (p_.algorithm.batch_size() > p_.buffer.capacity())
        throw ConfigError(std::string(A::config_section.view()) + ".batch_size (" +
                          std::to_string(p_.algorithm.batch_size()) + ") is larger than " +
                          std::string(B::config_section.view()) + ".capacity (" + std::to_string(p_.buffer.capacity()) +
                          "): the buffer could never hold a batch, so the run would never update");
    }

    /// At the stage's start and after a resume: the buffer learns the plan.
    void prepare() {
      p_.collector.envs().set_discount(p_.algorithm.discount());
      p_.buffer.plan(StoragePlan{p_.collector.num_envs(), cfg_.steps, p_.algorithm.discount()});
    }

    /// One iteration: a step of every env, stored, then the updates due.
    void iterate(std::int64_t quiet_until = INT64_MAX) {
      if (async()) {
        if (!p_.collector.in_flight()) launch();
        store(p_.collector.land());
        // The envs take their next step while this iteration's updates run, unless a hook
        // is due (it must see the run at rest) or the run is over.
        if (!this->done() && p_.clock.now() < quiet_until) launch();
      } else {
        act_now();
        store(p_.collector.step(actions_));
      }
      update_when_due();
    }

    /// Steps the envs until at least `n` more env steps are stored (a custom main's own
    /// schedule; no updates).
    void collect(std::int64_t n) {
      const std::int64_t target = p_.clock.env_steps + n;
      while (p_.clock.env_steps < target) {
        if (p_.collector.in_flight()) {
          store(p_.collector.land());
        } else {
          act_now();
          store(p_.collector.step(actions_));
        }
      }
    }

    /// `n` gradient updates, each on a fresh batch from the buffer.
    void update(int n) {
      for (int i = 0; i < n; ++i) {
        ReplayBatch batch;
        {
          ScopedPhase ph(p_.times, Phase::sample);
          batch = p_.buffer.sample(p_.algorithm.batch_size());
        }
        const auto info = loops::update_once(p_, batch, cfg_.update->ema_decay);
        if constexpr (PrioritizedReplay<B>)
          if (info.td_error.defined()) p_.buffer.update_priorities(batch.index, info.td_error);
      }
    }

    /// What the timing verdict suggests, in this loop's knobs and its algorithm's.
    [[nodiscard]] BottleneckAdvice advice(const AdviceKeys& k) const {
      const std::string batch = k.find("batch_size"), interval = k.train + ".update_interval";
      BottleneckAdvice a;
      a.env = "raise env.num_envs, step the envs during updates (env.mode=async), or raise " + interval;
      a.learn = "raise " + interval + " (fewer updates per env step), or add ranks";
      a.comm = "fewer, larger updates (" + loops::either(batch, ", ", interval) + ") or fewer ranks";
      a.act = loops::act_advice();
      a.sample = "raise " + loops::either(batch, " or ", interval);
      a.side = loops::side_advice(k);
      return a;
    }

    /// State protocol: where the stage began and where the update schedule stands (the
    /// same on every rank).
    void save(BinaryWriter& w) const {
      w.value(origin_);
      w.value(since_update_);
    }
    struct Saved {
      std::int64_t origin = 0, since_update = 0;
    };
    [[nodiscard]] Saved read(BinaryReader& r) const {
      Saved s{r.value<std::int64_t>("stage origin"), r.value<std::int64_t>("env steps since the last updates")};
      if (s.origin < 0 || s.since_update < 0) r.fail("update schedule", "holds a negative count");
      return s;
    }
    void restore(const Saved& s) noexcept {
      origin_ = s.origin;
      since_update_ = s.since_update;
    }

   private:
    [[nodiscard]] bool async() const { return p_.collector.envs().mode() == envs::VecMode::async; }

    // Actions for the observations the envs show (random until learning starts), timed.
    void act_now() {
      const auto& obs = p_.collector.observations();
      ScopedPhase ph(p_.times, Phase::act);
      if (this->elapsed() < cfg_.learning_starts) {
        actions_ = p_.collector.random_actions();
      } else {
        actions_ = p_.algorithm.act(obs, ActMode::explore);
        if (!actions_.is_cpu()) actions_ = actions_.to(at::kCPU);
      }
    }
    void launch() {
      act_now();
      p_.collector.launch(actions_);
    }

    // The step that landed, into the buffer; the clock counts every rank's envs (they step
    // in lockstep).
    void store(const envs::VecStep& s) {
      {
        ScopedPhase ph(p_.times, Phase::buffer_add);
        StepBatch step{p_.collector.previous_observations(), actions_, s.reward, s.next_obs, s.terminated, s.truncated, s.task};
        // An algorithm that shapes its rewards (CollectiveStudent) gives the ones to store.
        if constexpr (ShapesRewards<A>)
          step.reward = p_.algorithm.shaped_rewards(step, this->elapsed());
        p_.buffer.add(step);
      }
      p_.clock.env_steps += p_.collector.num_envs() * p_.ranks.world_size();
    }

    void update_when_due() {
      if (this->elapsed() < cfg_.learning_starts || !can_update()) return;
      since_update_ += p_.collector.num_envs();
      while (since_update_ >= cfg_.update_interval) {
        update(cfg_.updates_per_interval);
        since_update_ -= cfg_.update_interval;
      }
    }

    // Whether the buffer can give a batch. Ranks must update in lockstep (each update is a
    // collective), so with several ranks all must be able to: their buffers can differ
    // after a resume (only rank 0 restores one). Asked each step until the answer is yes,
    // which stays yes: buffers only grow.
    bool can_update() {
      if (ready_) return true;
      const double short_of = p_.buffer.size() >= p_.algorithm.batch_size() ? 0.0 : 1.0;
      return ready_ = p_.ranks.sum(short_of) == 0.0;
    }

    at::Tensor actions_;            ///< the actions of the step in flight or last taken
    std::int64_t since_update_ = 0;  ///< this rank's env steps since the last round of updates
    bool ready_ = false;            ///< every rank's buffer can give a batch
  };

  /// What this loop needs of the algorithm and the buffer, one sentence each (see loops/loop.hpp).
  template <class A, class B>
  static constexpr bool rules() {
    ANVIL_LOOP_RULE(OffPolicyAlgorithm<A>,
                    "off-policy loop samples batch_size() transitions per update and stores n-step returns "
                    "with discount(); the Algorithm lacks one (see anvil::OffPolicyAlgorithm)")
    ANVIL_LOOP_RULE(ReplayBuffer<B>,
                    "off-policy loop samples random batches, but the Buffer has no sample(n) (see "
                    "anvil::ReplayBuffer); use UniformBuffer or PrioritizedBuffer")
    ANVIL_LOOP_RULE((std::same_as<typename B::Step, StepBatch>),
                    "off-policy loop stores each env step as a StepBatch, but the Buffer's Step is another type")
    return true;
  }
};

}  // namespace anvil
