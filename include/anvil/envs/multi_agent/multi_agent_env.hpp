#pragma once
/// @file
/// Cooperative multi-agent envs: the `MultiAgentEnv` concept (k agents, each with its own
/// observation and a discrete action set with an availability mask, a global state for a
/// centralised critic, one team reward, terminated/truncated for the team) and `Joint<M>`,
/// which makes such an env an `Env` so that everything built for envs serves it unchanged:
/// `VecEnv` (N copies on the thread pool, batched tensors, autoreset, seeds, checkpoints),
/// the episodic loop, `EpisodeBuffer`, evaluation, DDP.
///
/// `Joint<M>` lays a step out as `AgentLayout` says (core/spaces.hpp): one observation row
/// `[obs_0 .. obs_k-1 | avail_0 .. avail_k-1 | state | first]` and one joint action index whose
/// base-`num_actions` digits are the agents' actions (agent 0 least significant). A joint
/// action that gives an agent an unavailable action is refused with an EnvError naming the
/// agent, the action and the step. Light header: no torch.

#include <concepts>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <anvil/core/binary_io.hpp>
#include <anvil/core/error.hpp>
#include <anvil/envs/env.hpp>

namespace anvil::envs {

/// What one step of a team returns.
struct TeamStep {
  double reward = 0.0;      ///< the team's reward
  bool terminated = false;  ///< the team reached a terminal state: do not bootstrap
  bool truncated = false;   ///< stopped by a time limit (a budget)
};

/// A cooperative multi-agent env (see file comment). `observe`, `available_actions` and
/// `write_state` write into spans of `agent_observation_size()`, `num_actions()` and
/// `state_size()` floats; `step` takes one action per agent and `reset(seed)` starts an
/// episode that depends on its seed alone.
template <class M>
concept MultiAgentEnv = std::movable<M> &&
    requires(M& m, const M& cm, std::uint64_t seed, std::span<const std::int64_t> actions, std::int64_t agent,
             std::span<float> out) {
      { M::name } -> std::convertible_to<std::string_view>;
      { cm.num_agents() } -> std::convertible_to<std::int64_t>;
      { cm.agent_observation_size() } -> std::convertible_to<std::int64_t>;
      { cm.num_actions() } -> std::convertible_to<std::int64_t>;
      { cm.state_size() } -> std::convertible_to<std::int64_t>;
      { m.reset(seed) };
      { m.step(actions) } -> std::same_as<TeamStep>;
      { cm.observe(agent, out) };
      { cm.available_actions(agent, out) };
      { cm.write_state(out) };
    };

/// A multi-agent env that writes and reads its own state for checkpoints (one that is
/// trivially copyable is saved as bytes without this).
template <class M>
concept MultiAgentSavesState = MultiAgentEnv<M> && requires(const M& cm, M& m, BinaryWriter& w, BinaryReader& r) {
  cm.save_state(w);
  m.load_state(r);
};

/// The joint action of `actions` (one per agent, each below `num_actions`).
[[nodiscard]] inline std::int64_t encode_joint_action(std::span<const std::int64_t> actions, std::int64_t num_actions) {
  std::int64_t joint = 0;
  for (std::size_t i = actions.size(); i-- > 0;) joint = joint * num_actions + actions[i];
  return joint;
}
/// The agents' actions in `joint` (written to `out`, one per agent).
inline void decode_joint_action(std::int64_t joint, std::int64_t num_actions, std::span<std::int64_t> out) {
  for (auto& a : out) {
    a = joint % num_actions;
    joint /= num_actions;
  }
}

/// A multi-agent env as one `Env` (see file comment).
template <MultiAgentEnv M>
class Joint {
 public:
  static constexpr std::string_view name = M::name;

  explicit Joint(M env = M{}) : env_(std::move(env)) { layout(); }

  /// Each agent's observation unbounded, the availability flags in [0, 1], the state
  /// unbounded, the first-step flag in [0, 1].
  [[nodiscard]] Box observation_space() const {
    const auto l = agent_layout();
    constexpr float kInf = std::numeric_limits<float>::infinity();
    Box b{std::vector<float>(static_cast<std::size_t>(l.row_size()), -kInf),
          std::vector<float>(static_cast<std::size_t>(l.row_size()), kInf)};
    for (std::int64_t i = l.avail_offset(); i < l.state_offset(); ++i) {
      b.low[static_cast<std::size_t>(i)] = 0.0f;
      b.high[static_cast<std::size_t>(i)] = 1.0f;
    }
    b.low[static_cast<std::size_t>(l.first_offset())] = 0.0f;
    b.high[static_cast<std::size_t>(l.first_offset())] = 1.0f;
    return b;
  }
  /// Every joint action: num_actions ^ agents.
  [[nodiscard]] Discrete action_space() const { return Discrete{agent_layout().joint_actions()}; }
  /// The layout; an env that declares maps at the start of its observations and state
  /// (`observation_map()`, `state_map()`: a MapShape) has them read through a CNN by COMA.
  [[nodiscard]] AgentLayout agent_layout() const {
    AgentLayout l{static_cast<std::int64_t>(env_.num_agents()), static_cast<std::int64_t>(env_.agent_observation_size()),
                  static_cast<std::int64_t>(env_.num_actions()), static_cast<std::int64_t>(env_.state_size())};
    if constexpr (requires { { env_.observation_map() } -> std::convertible_to<MapShape>; }) l.obs_map = env_.observation_map();
    if constexpr (requires { { env_.state_map() } -> std::convertible_to<MapShape>; }) l.state_map = env_.state_map();
    return l;
  }

  std::span<const float> reset(std::uint64_t seed) {
    env_.reset(seed);
    started_ = true;
    steps_ = 0;
    pack();
    return row_;
  }

  /// Steps every agent with its digit of `joint`. Throws EnvError for a joint action out of
  /// range or one that gives an agent an action it may not take now (the env is unchanged).
  StepResult step(std::int64_t joint) {
    const auto l = agent_layout();
    if (!started_) throw EnvError(std::string(name) + ": step before reset");
    if (joint < 0 || joint >= l.joint_actions())
      throw EnvError(std::string(name) + ": step " + std::to_string(steps_) + ": joint action " + std::to_string(joint) +
                     " is outside [0, " + std::to_string(l.joint_actions()) + ")");
    decode_joint_action(joint, l.num_actions, actions_);
    for (std::int64_t i = 0; i < l.agents; ++i) {
      const auto a = actions_[static_cast<std::size_t>(i)];
      if (row_[static_cast<std::size_t>(l.avail_offset() + i * l.num_actions + a)] < 0.5f)
        throw EnvError(std::string(name) + ": step " + std::to_string(steps_) + ": agent " + std::to_string(i) +
                       " took action " + std::to_string(a) + ", which is not available to it now");
    }
    const TeamStep r = env_.step(actions_);
    ++steps_;
    pack();
    return StepResult{row_, r.reward, r.terminated, r.truncated};
  }

  /// The name of this env (the wrapped env's own where it has several, e.g. "Climbing").
  [[nodiscard]] std::string_view id() const noexcept {
    if constexpr (requires { { env_.id() } -> std::convertible_to<std::string_view>; }) return env_.id();
    else return M::name;
  }

  /// The wrapped env.
  [[nodiscard]] const M& env() const noexcept { return env_; }
  [[nodiscard]] M& env() noexcept { return env_; }
  /// The row the env showed last (after `reset` or `step`).
  [[nodiscard]] std::span<const float> observation() const noexcept { return row_; }
  /// The agents' actions of the last step.
  [[nodiscard]] std::span<const std::int64_t> last_actions() const noexcept { return actions_; }

  /// Checkpoints: the env (as bytes when trivially copyable, else its own save_state) and
  /// the row it last showed.
  void save_state(BinaryWriter& w) const
    requires(std::is_trivially_copyable_v<M> || MultiAgentSavesState<M>)
  {
    if constexpr (std::is_trivially_copyable_v<M>) w.value(env_);
    else env_.save_state(w);
    w.value(started_);
    w.value(steps_);
  }
  void load_state(BinaryReader& r)
    requires(std::is_trivially_copyable_v<M> || MultiAgentSavesState<M>)
  {
    if constexpr (std::is_trivially_copyable_v<M>) env_ = r.value<M>("multi-agent env state");
    else env_.load_state(r);
    started_ = r.value<bool>("multi-agent env started");
    steps_ = r.value<std::int64_t>("multi-agent env steps");
    layout();
    if (started_) pack();
  }

 private:
  void layout() {
    const auto l = agent_layout();
    if (l.agents < 1 || l.num_actions < 1 || l.obs_dim < 0 || l.state_dim < 0)
      throw Error(std::string(name) + ": a multi-agent env needs at least one agent and one action (it has " +
                  std::to_string(l.agents) + " agents, " + std::to_string(l.num_actions) + " actions)");
    if (l.obs_map.numel() > l.obs_dim || l.state_map.numel() > l.state_dim)
      throw Error(std::string(name) + ": the declared maps (" + std::to_string(l.obs_map.numel()) + " and " +
                  std::to_string(l.state_map.numel()) + " numbers) do not fit in an observation of " +
                  std::to_string(l.obs_dim) + " and a state of " + std::to_string(l.state_dim));
    if (l.joint_actions() == 0)
      throw Error(std::string(name) + ": " + std::to_string(l.num_actions) + " actions ^ " + std::to_string(l.agents) +
                  " agents joint actions do not fit in an int64");
    row_.assign(static_cast<std::size_t>(l.row_size()), 0.0f);
    actions_.assign(static_cast<std::size_t>(l.agents), 0);
  }
  void pack() {
    const auto l = agent_layout();
    std::span<float> row(row_);
    for (std::int64_t i = 0; i < l.agents; ++i) {
      env_.observe(i, row.subspan(static_cast<std::size_t>(i * l.obs_dim), static_cast<std::size_t>(l.obs_dim)));
      env_.available_actions(i, row.subspan(static_cast<std::size_t>(l.avail_offset() + i * l.num_actions),
                                            static_cast<std::size_t>(l.num_actions)));
    }
    env_.write_state(row.subspan(static_cast<std::size_t>(l.state_offset()), static_cast<std::size_t>(l.state_dim)));
    row[static_cast<std::size_t>(l.first_offset())] = steps_ == 0 ? 1.0f : 0.0f;
  }

  M env_;
  std::vector<float> row_;
  std::vector<std::int64_t> actions_;
  bool started_ = false;
  std::int64_t steps_ = 0;
};

}  // namespace anvil::envs
