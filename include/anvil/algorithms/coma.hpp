#pragma once
/// @file
/// COMA, counterfactual multi-agent policy gradients (Foerster, Farquhar, Afouras, Nardelli,
/// Whiteson 2018, "Counterfactual Multi-Agent Policy Gradients", AAAI), with the two
/// baselines that isolate its counterfactual baseline: a centralised V critic (central-V)
/// and independent actor-critic (each agent's V from its own observation). All three share
/// the networks' shapes, the loop and the schedule, so `coma.critic` alone changes.
///
/// - **Actor**, shared by the agents: an MLP on [the agent's observation, its id one-hot]
///   giving logits over its actions, or with `coma.actor.gru` > 0 hidden layers, a GRU cell
///   that remembers the episode so far (each agent its own state, forgotten where a row's
///   first-step flag says an episode starts) and a linear output; trained on whole
///   episodes, unrolled from their start; unavailable actions get no probability; exploration
///   mixes the policy with a uniform choice over the available actions, epsilon annealed
///   linearly over episodes (`epsilon_start` -> `epsilon_finish` over `epsilon_anneal_episodes`).
/// - **Critic** (`counterfactual`): for agent a, Q of every action of a with the others'
///   actions fixed; input [global state, a's observation, a's id, the other agents'
///   actions one-hot (a's own block zero), the previous joint action one-hot]. The
///   advantage of a's action u_a is the counterfactual one:
///       A_a = Q(s, u)[u_a] - sum_u' pi_a(u' | o_a) Q(s, u)[u'].
///   `central_v`: V(state, a's observation, a's id), advantage G^lambda - V.
///   `independent`: V(a's observation, a's id), advantage G^lambda - V.
/// - **Targets**: TD(lambda) from a target critic copied from the critic every
///   `target_update_interval` critic steps (a hard update):
///       y_t = r_t + gamma (1 - d_t) [(1 - lambda) v_{t+1} + lambda y_{t+1}],
///   where v is the target critic's value of the taken (joint) action (Q) or of the state
///   (V), and y after an episode's last step is v there: 0 after a terminal step, after a
///   time limit the target critic's value of the last observation with actions sampled
///   from the policy (as PyMARL bootstraps). Targets and log-softmax are float32 under
///   any precision.
/// - **Schedule** (our users'): episodes are collected (one per env per round of the
///   episodic loop) until `batch_size x batch_number` agent-transitions are held; then
///   `data_passes` passes, each over a fresh permutation of them in `batch_number`
///   minibatches of `batch_size`, each minibatch a critic step then an actor step (whose
///   advantages use the stepped critic). Under FP16 the two steps are one step of the
///   loss scaler. With DDP every rank collects its own episodes; the decision to train
///   and the number of minibatches are the same on every rank, so gradients are averaged
///   step by step.
///
/// Multi-agent envs reach it through `envs::Joint` (envs/multi_agent/): the spec's
/// `AgentLayout` says how observation rows and joint actions are laid out.

#include <torch/nn/module.h>
#include <torch/utils.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <anvil/algorithms/categorical.hpp>
#include <anvil/algorithms/coma_config.hpp>
#include <anvil/algorithms/coma_graph.hpp>
#include <anvil/algorithms/td_lambda.hpp>
#include <anvil/core/batch.hpp>
#include <anvil/core/binary_io.hpp>
#include <anvil/core/concepts.hpp>
#include <anvil/core/policy_tensors.hpp>
#include <anvil/core/context.hpp>
#include <anvil/core/error.hpp>
#include <anvil/core/param.hpp>
#include <anvil/core/spaces.hpp>
#include <anvil/core/tensor_io.hpp>
#include <anvil/nn/gru_actor.hpp>
#include <anvil/nn/map_encoder.hpp>
#include <anvil/nn/mlp.hpp>
#include <anvil/optim/flat_adam.hpp>
#include <anvil/optim/graphed_update.hpp>
#include <anvil/optim/step_context.hpp>

namespace anvil {

struct EpisodicLoop;  // train/loops/episodic.hpp (a layer above; the Trainer includes it)

/// Algorithm policy: COMA and its baselines (see file comment).
class COMA {
 public:
  using policy_kind = AlgorithmKind;
  static constexpr FixedString config_section = "coma";
  static constexpr bool on_policy = true;
  using Batch = EpisodeBatch;
  using loop = EpisodicLoop;

  /// Its config section (algorithms/coma_config.hpp).
  using Config = ComaConfig;
  using NetConfig = ComaNetConfig;
  using ActorConfig = ComaActorConfig;

  COMA(const EnvSpec& spec, const Config& cfg, const RunContext& ctx)
      : cfg_(cfg), device_(ctx.device), layout_(spec.agents) {
    if (!layout_.multi_agent())
      throw ConfigError("COMA: " + spec.name +
                        " is not a multi-agent env; wrap a MultiAgentEnv in envs::Joint (envs/multi_agent/)");
    if (ctx.micro_batches > cfg.batch_size)
      throw ConfigError("train.grad_accumulation (" + std::to_string(ctx.micro_batches) + ") is larger than coma.batch_size (" +
                        std::to_string(*cfg.batch_size) + "): micro-batches would be empty");
    k_ = layout_.agents;
    n_ = layout_.num_actions;
    const auto f = at::TensorOptions().dtype(at::kFloat).device(device_);
    eye_ = at::eye(k_, f);
    powers_ = at::ones({k_}, f.dtype(at::kLong));
    for (std::int64_t i = 1; i < k_; ++i) powers_[i] = powers_[i - 1] * n_;
    // Row j of others_mask_ zeroes agent j's block of a joint one-hot.
    others_mask_ = (1 - eye_).repeat_interleave(n_, 1);  // [k, k*n]

    // An env's maps go through a CNN first (coma.map_encoder), the actor's from the
    // agent's observation, the critic's from the state's and the observation's.
    std::int64_t actor_in = layout_.obs_dim + k_, critic_in = critic_input_size();
    if (maps()) {
      actor_enc_ = nn::MapEncoder(actor_in, std::vector<nn::MapSegment>{{0, layout_.obs_map}}, *cfg.map_encoder->channels);
      std::vector<nn::MapSegment> seen;
      if (*cfg_.critic != ComaCritic::independent && layout_.state_map.any()) seen.push_back({0, layout_.state_map});
      seen.push_back({*cfg_.critic == ComaCritic::independent ? 0 : layout_.state_dim, layout_.obs_map});
      critic_enc_ = nn::MapEncoder(critic_in, seen, *cfg.map_encoder->channels);
      actor_enc_->to(device_), critic_enc_->to(device_);
      actor_in = actor_enc_->output_size(), critic_in = critic_enc_->output_size();
    }
    if (recurrent()) {
      gru_ = nn::GruActor(actor_in, nn::widths(cfg.actor->hidden), cfg.actor->gru, n_, cfg.actor->activation);
      gru_->to(device_);
    } else {
      actor_ = nn::Mlp(actor_in, nn::widths(cfg.actor->hidden), n_, cfg.actor->activation);
      actor_->to(device_);
    }
    critic_ = nn::Mlp(critic_in, nn::widths(cfg.critic_net->hidden), q_critic() ? n_ : 1, cfg.critic_net->activation);
    critic_->to(device_);
    auto actor_params = recurrent() ? gru_->parameters() : actor_->parameters();
    auto critic_params = critic_->parameters();
    if (maps()) {
      for (auto& p : actor_enc_->parameters()) actor_params.push_back(p);
      for (auto& p : critic_enc_->parameters()) critic_params.push_back(p);
      target_enc_ = std::dynamic_pointer_cast<nn::MapEncoderImpl>(critic_enc_->clone());
      for (auto& p : target_enc_->parameters()) p.set_requires_grad(false);
    }
    actor_opt_ = FlatAdam(actor_params, {.lr = cfg.actor_lr * ctx.lr_scale(cfg.batch_size)});
    critic_opt_ = FlatAdam(critic_params, {.lr = cfg.critic_lr * ctx.lr_scale(cfg.batch_size)});
    target_ = std::dynamic_pointer_cast<nn::MlpImpl>(critic_->clone());
    for (auto& p : target_->parameters()) p.set_requires_grad(false);
  }

  /// Joint actions [N] (int64) for observation rows [N, row]: each agent samples from its
  /// epsilon-mixed policy to explore, or takes its most likely available action. A
  /// recurrent actor steps its memory of each env's episode (rows are envs, in the same
  /// order from call to call; a row's first-step flag starts a new memory).
  at::Tensor act(const at::Tensor& obs, ActMode mode) {
    torch::NoGradGuard no_grad;
    const auto rows = obs.to(device_, at::kFloat);
    const auto avail = split_avail(rows);
    const auto logits = categorical::masked(recurrent() ? step_memory(rows) : mlp_logits(split_obs(rows)), avail);
    const auto u = mode == ActMode::explore ? categorical::sample(categorical::mixed(logits.softmax(-1), avail, epsilon()))
                                            : logits.argmax(-1);
    return encode(u);
  }

  /// Learns from a round of episodes: holds them until batch_size x batch_number
  /// agent-transitions are collected (on average over the ranks), then trains on them all
  /// (see file comment). Reports nothing for a round that is only held. On a GPU, with
  /// `cuda_graph` on and steps a graph can hold (one process, an MLP actor),
  /// each minibatch's critic and actor steps are replayed from a CUDA graph
  /// (algorithms/coma_graph.hpp).
  UpdateInfo update(const EpisodeBatch& b, StepContext& ctx) {
    return hold(b, ctx, detail::ComaGraphed::graphable(*this, ctx) ? StepsAs::graph : StepsAs::eager);
  }
  /// `update` with each minibatch's steps run as a CUDA graph holds them, op by op on any
  /// device: device work alone (the losses stay tensors until the training's end), then the
  /// host's counts. It gives what `update` gives within float rounding; the tests check the
  /// two agree on the CPU, where no graph runs. Refused, saying why, where a graph could not
  /// hold the steps.
  UpdateInfo update_as_captured(const EpisodeBatch& b, StepContext& ctx) {
    const std::string why = detail::ComaGraphed::why_not(*this, ctx);
    if (!why.empty()) throw Error("coma: these steps cannot be captured: " + why);
    return hold(b, ctx, StepsAs::captured);
  }
  /// Minibatches replayed from a CUDA graph so far (0 without CUDA or with `cuda_graph` off).
  [[nodiscard]] std::int64_t graphed_updates() const noexcept { return graphs_.replays(); }
  /// What the run header says of CUDA graphs on a GPU: what is captured, and why not where not.
  [[nodiscard]] std::string cuda_graph_note(const StepContext& ctx) const {
    const std::string why = detail::ComaGraphed::why_not(*this, ctx);
    if (!why.empty()) return "coma's update runs op by op: " + why + "; acting runs op by op";
    return "coma's critic and actor steps are captured (a graph per minibatch size, after " +
           std::to_string(GraphedUpdate::kWarmups) + " warm-ups op by op each); acting runs op by op";
  }

 private:
  // How `train` runs each minibatch's critic and actor steps: op by op, from a CUDA graph,
  // or the graph's work op by op (`update_as_captured`).
  enum class StepsAs { eager, graph, captured };

  // `update`'s body: holds the round's episodes, and trains once enough are held.
  UpdateInfo hold(const EpisodeBatch& b, StepContext& ctx, StepsAs as) {
    // Held past this round: copies, as a buffer's batch may view storage the next round reuses.
    pending_.push_back(EpisodeBatch{b.obs.clone(), b.action.clone(), b.reward.clone(), b.terminated.clone(),
                                    b.mask.clone(), b.length.clone(), b.last_obs.clone()});
    pending_rows_ += b.mask.sum().item<std::int64_t>() * k_;
    episodes_ += b.obs.size(0);
    const double wanted = static_cast<double>(*cfg_.batch_size) * cfg_.batch_number;
    if (ctx.mean_over_ranks(static_cast<double>(pending_rows_)) < wanted) return {};
    UpdateInfo info = train(ctx, as);
    pending_.clear();
    pending_rows_ = 0;
    ++updates_;
    return info;
  }

 public:
  /// The epsilon of the current episode count.
  [[nodiscard]] double epsilon() const noexcept {
    const double f = std::min(1.0, static_cast<double>(episodes_) / static_cast<double>(*cfg_.epsilon_anneal_episodes));
    return cfg_.epsilon_start + f * (cfg_.epsilon_finish - cfg_.epsilon_start);
  }

  // --- The pieces, public for tests and custom mains ------------------------------------

  /// Each agent's observation [..., k, obs_dim] of observation rows [..., row].
  [[nodiscard]] at::Tensor split_obs(const at::Tensor& rows) const {
    auto s = rows.sizes().vec();
    s.back() = k_;
    s.push_back(layout_.obs_dim);
    return rows.narrow(-1, 0, k_ * layout_.obs_dim).reshape(s);
  }
  /// Each agent's available actions [..., k, n] (1/0).
  [[nodiscard]] at::Tensor split_avail(const at::Tensor& rows) const {
    auto s = rows.sizes().vec();
    s.back() = k_;
    s.push_back(n_);
    return rows.narrow(-1, layout_.avail_offset(), k_ * n_).reshape(s);
  }
  /// The global state [..., state_dim].
  [[nodiscard]] at::Tensor split_state(const at::Tensor& rows) const {
    return rows.narrow(-1, layout_.state_offset(), layout_.state_dim);
  }
  /// The first-step flags [...] (1 on an episode's first row).
  [[nodiscard]] at::Tensor split_first(const at::Tensor& rows) const { return rows.select(-1, layout_.first_offset()); }
  /// The agents' actions [..., k] of joint actions [...].
  [[nodiscard]] at::Tensor decode(const at::Tensor& joint) const {
    return joint.to(device_).unsqueeze(-1).div(powers_, "floor").remainder(n_);
  }
  /// Joint actions [...] of agents' actions [..., k].
  [[nodiscard]] at::Tensor encode(const at::Tensor& u) const { return (u * powers_).sum(-1); }

  /// Whether the env's maps are read through CNNs (it declares maps, coma.map_encoder.channels > 0).
  [[nodiscard]] bool maps() const noexcept { return layout_.obs_map.any() && cfg_.map_encoder->channels > 0; }
  /// Whether the actor has memory (`coma.actor.gru` > 0).
  [[nodiscard]] bool recurrent() const noexcept { return cfg_.actor->gru > 0; }
  /// The actor's logits [..., k, n] (float32, unmasked) for observation rows: per row for
  /// an MLP; a recurrent actor reads rows [B, T, row] as B episodes of T steps from their
  /// start (and rows [N, row] as first steps).
  at::Tensor logits(const at::Tensor& rows) {
    if (!recurrent()) return mlp_logits(split_obs(rows));
    const auto seq = rows.dim() == 2 ? rows.unsqueeze(1) : rows;  // [B, T, row]
    const auto B = seq.size(0), T = seq.size(1);
    const auto x = actor_features(actor_input(split_obs(seq))).transpose(0, 1).reshape({T, B * k_, -1});  // time first, rows b*k + a
    auto first = split_first(seq).transpose(0, 1).repeat_interleave(k_, 1);               // [T, B*k]
    first.select(0, 0).fill_(1.0);                                                          // every sequence starts afresh
    const auto out = gru_->unroll(x, first).reshape({T, B, k_, n_}).transpose(0, 1);       // [B, T, k, n]
    return rows.dim() == 2 ? out.squeeze(1) : out;
  }
  /// The policy [..., k, n] for observation rows (see `logits`): softmax over the
  /// available actions, mixed with epsilon of a uniform choice among them.
  at::Tensor policy(const at::Tensor& rows, double eps) {
    const auto avail = split_avail(rows);
    return categorical::mixed(categorical::masked(logits(rows), avail).softmax(-1), avail, eps);
  }
  /// The counterfactual baseline of each row: sum_u' pi(u') Q[u'] ([R] from [R, n] twice).
  static at::Tensor counterfactual_baseline(const at::Tensor& pi, const at::Tensor& q) { return (pi * q).sum(-1); }

  /// The critic's input [B, T, k, d] for rows [B, T, row] with the agents' actions u and
  /// the previous step's u_prev one-hot ([B, T, k, n]; zeros before an episode's first step).
  [[nodiscard]] at::Tensor critic_input(const at::Tensor& rows, const at::Tensor& onehot,
                                        const at::Tensor& onehot_prev) const {
    const auto obs_k = split_obs(rows);
    auto lead = obs_k.sizes().vec();
    lead.pop_back();  // [..., k]
    auto ids = eye_;
    for (std::size_t i = 0; i + 2 < lead.size(); ++i) ids = ids.unsqueeze(0);
    ids = ids.expand(with_last(lead, k_));
    if (*cfg_.critic == ComaCritic::independent) return at::cat({obs_k, ids}, -1);
    const auto state = split_state(rows).unsqueeze(-2).expand(with_last(lead, layout_.state_dim));
    if (*cfg_.critic == ComaCritic::central_v) return at::cat({state, obs_k, ids}, -1);
    auto flat_lead = lead;
    flat_lead.pop_back();
    const auto joint = onehot.reshape(with_last(flat_lead, k_ * n_)).unsqueeze(-2);           // [..., 1, k*n]
    const auto others = joint * others_mask_;                                                  // [..., k, k*n]
    const auto prev = onehot_prev.reshape(with_last(flat_lead, k_ * n_)).unsqueeze(-2).expand(with_last(lead, k_ * n_));
    return at::cat({state, obs_k, ids, others, prev}, -1);
  }
  [[nodiscard]] std::int64_t critic_input_size() const noexcept {
    const auto base = layout_.obs_dim + k_;
    if (*cfg_.critic == ComaCritic::independent) return base;
    if (*cfg_.critic == ComaCritic::central_v) return layout_.state_dim + base;
    return layout_.state_dim + base + 2 * k_ * n_;
  }
  [[nodiscard]] bool q_critic() const noexcept { return *cfg_.critic == ComaCritic::counterfactual; }

  /// The TD(lambda) targets [B, T, k] of a round of episodes, from the target critic.
  at::Tensor targets(const EpisodeBatch& b) {
    torch::NoGradGuard no_grad;
    const auto ext = extended(b);
    auto v = target_net(critic_input(ext.rows, ext.onehot, ext.onehot_prev)).to(at::kFloat);  // [B, T+1, k, .]
    v = q_critic() ? v.gather(-1, ext.u.unsqueeze(-1)).squeeze(-1) : v.squeeze(-1);
    const auto next = v.narrow(1, 1, b.obs.size(1));  // value of the step after each step
    return td_lambda_targets(b.reward.to(device_, at::kFloat), b.terminated.to(device_, at::kFloat),
                             b.mask.to(device_, at::kFloat), next, cfg_.gamma, cfg_.td_lambda);
  }

  [[nodiscard]] std::vector<std::pair<std::string, double>> learning_rates() const {
    return {{"actor", actor_opt_.lr()}, {"critic", critic_opt_.lr()}};
  }
  [[nodiscard]] std::vector<std::pair<std::string, at::Tensor>> flat_parameters() const {
    return {{"actor", actor_opt_.parameters().flat()}, {"critic", critic_opt_.parameters().flat()}};
  }

  /// State protocol: both networks with their Adam state, the target critic, the counts
  /// (episodes, for epsilon; critic steps, for the target's schedule) and the episodes held
  /// for the next training.
  struct Saved {
    FlatAdam::Saved actor, critic;
    std::vector<at::Tensor> target;
    std::int64_t episodes = 0, critic_steps = 0, updates = 0;
    std::vector<EpisodeBatch> pending;
  };
  void save(BinaryWriter& w) const {
    actor_opt_.save(w);
    critic_opt_.save(w);
    for (const auto& p : target_parameters()) write_tensor(w, p, "coma target critic");
    w.value(episodes_);
    w.value(critic_steps_);
    w.value(updates_);
    w.value(static_cast<std::int64_t>(pending_.size()));
    for (const auto& b : pending_) {
      w.value(b.obs.size(0));
      w.value(b.obs.size(1));
      for (const auto* t : {&b.obs, &b.action, &b.reward, &b.terminated, &b.mask, &b.length, &b.last_obs})
        write_tensor(w, *t, "coma held episodes");
    }
  }
  [[nodiscard]] Saved read(BinaryReader& r) const {
    Saved s;
    s.actor = actor_opt_.read(r, "coma actor");
    s.critic = critic_opt_.read(r, "coma critic");
    for (const auto& p : target_parameters()) s.target.push_back(read_tensor(r, "coma target critic", p));
    s.episodes = r.value<std::int64_t>("coma episode count");
    s.critic_steps = r.value<std::int64_t>("coma critic steps");
    s.updates = r.value<std::int64_t>("coma update count");
    const auto held = r.value<std::int64_t>("coma held rounds");
    if (held < 0 || held > 1 << 20) r.fail("coma held rounds", "is " + std::to_string(held));
    const auto f = at::TensorOptions().dtype(at::kFloat);
    for (std::int64_t i = 0; i < held; ++i) {
      const auto n = r.value<std::int64_t>("coma held episodes"), t = r.value<std::int64_t>("coma held steps");
      if (n < 1 || t < 1 || n * t > (std::int64_t{1} << 32)) r.fail("coma held episodes", "have an implausible shape");
      const auto row = layout_.row_size();
      EpisodeBatch b;
      b.obs = read_tensor(r, "coma held observations", at::empty({n, t, row}, f));
      b.action = read_tensor(r, "coma held actions", at::empty({n, t}, f.dtype(at::kLong)));
      b.reward = read_tensor(r, "coma held rewards", at::empty({n, t}, f));
      b.terminated = read_tensor(r, "coma held terminations", at::empty({n, t}, f));
      b.mask = read_tensor(r, "coma held masks", at::empty({n, t}, f));
      b.length = read_tensor(r, "coma held lengths", at::empty({n}, f.dtype(at::kLong)));
      b.last_obs = read_tensor(r, "coma held last observations", at::empty({n, row}, f));
      s.pending.push_back(std::move(b));
    }
    return s;
  }
  void restore(const Saved& s) {
    actor_opt_.restore(s.actor);
    critic_opt_.restore(s.critic);
    torch::NoGradGuard no_grad;
    const auto params = target_parameters();
    for (std::size_t i = 0; i < params.size(); ++i) params[i].copy_(s.target[i]);
    episodes_ = s.episodes;
    critic_steps_ = s.critic_steps;
    updates_ = s.updates;
    pending_.clear();
    pending_rows_ = 0;
    graphs_.clear();  // captured again from the restored state (warm-ups first)
    for (const auto& b : s.pending) {
      EpisodeBatch d{b.obs.to(device_), b.action.to(device_), b.reward.to(device_), b.terminated.to(device_),
                     b.mask.to(device_), b.length.to(device_), b.last_obs.to(device_)};
      pending_rows_ += d.mask.sum().item<std::int64_t>() * k_;
      pending_.push_back(std::move(d));
    }
  }

  /// The acting network for policy.safetensors (`ExportsTensors`): the actor as `net.*` (an
  /// MLP's `fc0`, `fc1`, ...; a recurrent actor's hidden layers `fc*`, its GRU cell `gru`
  /// and output layer `head`), shared by the agents, each reading its observation followed
  /// by its one-hot id; an agent's deterministic action is its most likely available one.
  [[nodiscard]] PolicyTensors policy_tensors() const {
    PolicyTensors p{"ComaActor", {}, {}, false};
    if (recurrent()) add_module_tensors(p, "net.", *gru_);
    else add_module_tensors(p, "net.", *actor_);
    if (maps()) add_module_tensors(p, "encoder.", *actor_enc_);
    p.meta = {{"agents", std::to_string(k_)},
              {"obs_dim", std::to_string(layout_.obs_dim)},
              {"actions", std::to_string(n_)},
              {"hidden", comma_list(*cfg_.actor->hidden)},
              {"activation", enum_text(*cfg_.actor->activation)},
              {"memory", std::to_string(*cfg_.actor->gru)}};
    if (maps()) {  // the observation's first maps through encoder.conv0-2 (nn/map_encoder.hpp), then the rest
      const auto& m = layout_.obs_map;
      p.meta["map"] = std::to_string(m.channels) + "," + std::to_string(m.height) + "," + std::to_string(m.width);
      p.meta["map_channels"] = std::to_string(*cfg_.map_encoder->channels);
    }
    return p;
  }

  /// The actor's parameters as policy.safetensors names them (`WarmStarts`: `init.weights`).
  [[nodiscard]] std::vector<std::pair<std::string, at::Tensor>> policy_parameters() {
    auto named = recurrent() ? named_parameters_of(*gru_, "net.") : named_parameters_of(*actor_, "net.");
    if (maps())
      for (auto& e : named_parameters_of(*actor_enc_, "encoder.")) named.push_back(std::move(e));
    return named;
  }

  /// The MLP actor (null when the actor is recurrent) and the recurrent one (null otherwise).
  [[nodiscard]] nn::Mlp& actor() noexcept { return actor_; }
  [[nodiscard]] nn::GruActor& recurrent_actor() noexcept { return gru_; }
  [[nodiscard]] nn::Mlp& critic() noexcept { return critic_; }
  /// The target critic (the TD(lambda) targets' values; a copy of the critic every
  /// `target_update_interval` critic steps).
  [[nodiscard]] nn::Mlp& critic_target() noexcept { return target_; }
  /// The actor's and the critic's map encoders (null unless `maps()`).
  [[nodiscard]] nn::MapEncoder& actor_encoder() noexcept { return actor_enc_; }
  [[nodiscard]] nn::MapEncoder& critic_encoder() noexcept { return critic_enc_; }
  [[nodiscard]] const Config& config() const noexcept { return cfg_; }
  [[nodiscard]] const AgentLayout& layout() const noexcept { return layout_; }
  [[nodiscard]] std::int64_t episodes() const noexcept { return episodes_; }
  [[nodiscard]] std::int64_t critic_steps() const noexcept { return critic_steps_; }
  /// Trainings done (each of data_passes x batch_number minibatches).
  [[nodiscard]] std::int64_t updates() const noexcept { return updates_; }
  /// Agent-transitions held for the next training.
  [[nodiscard]] std::int64_t held_transitions() const noexcept { return pending_rows_; }

 private:
  // A round's rows with the step after each episode's last one appended (its bootstrap
  // observation, and actions sampled there), the agents' actions and their one-hots.
  struct Extended {
    at::Tensor rows, u, onehot, onehot_prev;  // [B, T+1, ...]
  };
  Extended extended(const EpisodeBatch& b) {
    const auto B = b.obs.size(0), T = b.obs.size(1);
    const auto obs = b.obs.to(device_, at::kFloat);
    const auto last = b.last_obs.to(device_, at::kFloat);
    const auto len = b.length.to(device_);
    const auto batch = at::arange(B, len.options());
    Extended e;
    e.rows = at::cat({obs, at::zeros({B, 1, obs.size(2)}, obs.options())}, 1);
    e.rows.index_put_({batch, len}, last);
    auto u = at::cat({decode(b.action), at::zeros({B, 1, k_}, powers_.options())}, 1);
    {
      torch::NoGradGuard no_grad;
      // A recurrent policy at the bootstrap step needs the episode before it.
      const auto pi_last = recurrent() ? policy(e.rows, epsilon()).index({batch, len}) : policy(last, epsilon());
      u.index_put_({batch, len}, categorical::sample(pi_last));
    }
    e.u = u;
    e.onehot = at::one_hot(u, n_).to(at::kFloat);
    e.onehot_prev = at::cat({at::zeros({B, 1, k_, n_}, e.onehot.options()), e.onehot.narrow(1, 0, T)}, 1);
    return e;
  }

  // The MLP actor's logits [..., k, n] (float32) for each agent's observation [..., k, obs_dim].
  at::Tensor mlp_logits(const at::Tensor& obs_k) { return actor_net(actor_input(obs_k)).to(at::kFloat); }
  // The networks on their inputs, through the map encoders where the env has maps.
  at::Tensor actor_features(const at::Tensor& x) { return maps() ? actor_enc_->forward(x) : x; }
  at::Tensor actor_net(const at::Tensor& x) { return actor_->forward(actor_features(x)); }
  at::Tensor critic_net(const at::Tensor& x) { return critic_->forward(maps() ? critic_enc_->forward(x) : x); }
  at::Tensor target_net(const at::Tensor& x) { return target_->forward(maps() ? target_enc_->forward(x) : x); }
  // One step of the recurrent actor for rows [N, row] (one per env), from and into the
  // memory of each env's agents; a row that starts an episode starts from zero.
  at::Tensor step_memory(const at::Tensor& rows) {
    const auto N = rows.size(0);
    if (!memory_.defined() || memory_.size(0) != N * k_)
      memory_ = at::zeros({N * k_, gru_->memory()}, rows.options().dtype(at::kFloat));
    const auto keep = (1 - split_first(rows)).repeat_interleave(k_).unsqueeze(-1);
    auto [out, next] = gru_->step(actor_features(actor_input(split_obs(rows))).reshape({N * k_, -1}), memory_ * keep);
    memory_ = next;
    return out.reshape({N, k_, n_});
  }

  // The actor's input [..., k, obs_dim + k]: each agent's observation and id.
  [[nodiscard]] at::Tensor actor_input(const at::Tensor& obs_k) const {
    auto lead = obs_k.sizes().vec();
    lead.pop_back();
    auto ids = eye_;
    for (std::size_t i = 0; i + 2 < lead.size(); ++i) ids = ids.unsqueeze(0);
    return at::cat({obs_k, ids.expand(with_last(lead, k_))}, -1);
  }
  static std::vector<std::int64_t> with_last(std::vector<std::int64_t> s, std::int64_t last) {
    s.push_back(last);
    return s;
  }

  // What one training draws its minibatches from: one row per agent-transition (a
  // minibatch's `index` says which; a recurrent actor's inputs are the held sequences).
  struct Rows {
    at::Tensor actor_in, critic_in, avail, u, target, index;
  };
  // Exploration's mixing weights (1 - epsilon, epsilon) as float32 scalars on the device;
  // undefined when epsilon is 0 (no mixing).
  struct Mixing {
    at::Tensor keep, eps;
  };
  // The held episodes, for a recurrent actor: rows [B, T, row] and which of their
  // steps are real ([B*T], in flatten_rows' order).
  struct Sequences {
    at::Tensor rows, valid;
  };
  Rows flatten_rows() {
    std::vector<at::Tensor> ai, ci, av, uu, y;
    for (const auto& b : pending_) {
      const auto T = b.obs.size(1);
      const auto ext = extended(b);
      const auto rows = ext.rows.narrow(1, 0, T);
      const auto valid = (b.mask.to(device_) > 0.5).reshape({-1});
      auto pick = [&](const at::Tensor& x) {  // [B, T, k, ...] -> [V*k, ...]
        auto s = x.sizes().vec();
        std::vector<std::int64_t> flat{-1};
        flat.insert(flat.end(), s.begin() + 2, s.end());
        auto f = x.reshape(flat).index({valid});
        std::vector<std::int64_t> out{-1};
        out.insert(out.end(), s.begin() + 3, s.end());
        return f.reshape(out);
      };
      if (recurrent()) sequences_.push_back(Sequences{rows, valid});
      else ai.push_back(pick(actor_input(split_obs(rows))));
      ci.push_back(pick(critic_input(rows, ext.onehot.narrow(1, 0, T), ext.onehot_prev.narrow(1, 0, T))));
      av.push_back(pick(split_avail(rows)));
      uu.push_back(pick(ext.u.narrow(1, 0, T).unsqueeze(-1)).squeeze(-1));
      y.push_back(pick(targets(b).unsqueeze(-1)).squeeze(-1));
    }
    return Rows{recurrent() ? at::Tensor() : at::cat(ai), at::cat(ci), at::cat(av), at::cat(uu), at::cat(y), {}};
  }
  // The recurrent actor's logits [R, n] of every held agent-transition (in the order of
  // flatten_rows' rows), each episode unrolled from its start.
  at::Tensor sequence_logits() {
    std::vector<at::Tensor> out;
    for (const auto& s : sequences_) out.push_back(logits(s.rows).reshape({-1, k_, n_}).index({s.valid}).reshape({-1, n_}));
    return at::cat(out);
  }
  // Targets only (a pass after the first: the target critic may have been updated).
  at::Tensor flatten_targets() {
    std::vector<at::Tensor> y;
    for (const auto& b : pending_) {
      const auto valid = (b.mask.to(device_) > 0.5).reshape({-1});
      y.push_back(targets(b).reshape({-1, k_}).index({valid}).reshape({-1}));
    }
    return at::cat(y);
  }

  UpdateInfo train(StepContext& ctx, StepsAs as) {
    sequences_.clear();
    Rows rows = flatten_rows();
    const std::int64_t R = rows.u.size(0), bs = cfg_.batch_size;
    at::Tensor sums;  // the minibatches' losses and statistics (float64 [5], see `minibatch`)
    int steps = 0;
    const double eps = epsilon();
    // The mixing weights as device scalars (a graph reads them where they live): the same
    // float32 values the op-by-op mixing multiplies by.
    const auto f = at::TensorOptions().dtype(at::kFloat).device(device_);
    const Mixing mix = eps > 0 ? Mixing{at::scalar_tensor(1 - eps, f), at::scalar_tensor(eps, f)} : Mixing{};
    for (int pass = 0; pass < cfg_.data_passes; ++pass) {
      if (pass > 0) rows.target = flatten_targets();
      const auto perm = at::randperm(R, at::TensorOptions().dtype(at::kLong)).to(device_);
      for (int j = 0; j < cfg_.batch_number; ++j) {
        // Every rank takes batch_number minibatches; a rank with fewer rows wraps around.
        const auto idx = perm.index({(at::arange(bs, perm.options()) + j * bs).remainder(R)});
        const Rows mb{recurrent() ? at::Tensor() : rows.actor_in.index({idx}), rows.critic_in.index({idx}),
                      rows.avail.index({idx}), rows.u.index({idx}), rows.target.index({idx}), idx};
        at::Tensor m;
        if (as == StepsAs::graph) {
          m = detail::ComaGraphed::minibatch(*this, mb, ctx, mix);
        } else if (as == StepsAs::captured) {
          m = detail::ComaGraphed::as_captured(*this, mb, ctx, mix);
        } else {
          m = minibatch(mb, ctx, mix);
        }
        sums = sums.defined() ? sums + m : m;
        ++steps;
        if (++critic_steps_ % cfg_.target_update_interval == 0) update_target();
      }
    }
    const auto h = sums.to(at::kCPU).contiguous();  // one copy back, after every minibatch
    const double* v = h.data_ptr<double>();
    UpdateInfo info;
    info.metrics = {{"critic_loss", v[0] / steps}, {"actor_loss", v[2] / steps},
                    {"advantage_abs", v[3] / steps}, {"entropy", v[4] / steps},
                    {"q_taken", v[1] / steps},       {"epsilon", eps},
                    {"transitions", static_cast<double>(R)}};
    return info;
  }

  // A minibatch's critic step, then its actor step with advantages from the stepped critic,
  // as device work with no value read back (what a CUDA graph holds): the critic's loss and
  // mean Q of the taken actions, the actor's loss, mean |advantage| and entropy, each summed
  // over the micro-batches weighed by their shares, as float64 [5]. The two steps are one
  // step of a loss scaler (FP16): its scale changes once per minibatch, on the device too.
  at::Tensor minibatch(const Rows& mb, StepContext& ctx, const Mixing& mix) {
    std::pair<at::Tensor, at::Tensor> critic;
    std::array<at::Tensor, 3> actor;
    {
      const auto scaler_step = ctx.one_scaler_step();
      critic = critic_step(mb, ctx);
      actor = actor_step(mb, ctx, mix);
    }
    const auto& [critic_loss, q_taken] = critic;
    const auto& [actor_loss, adv_abs, entropy] = actor;
    torch::NoGradGuard no_grad;
    return at::stack({critic_loss, q_taken, actor_loss, adv_abs, entropy}).to(at::kDouble);
  }

  // A step's statistic over its micro-batches: a whole minibatch's value as it is, else the
  // sum of the parts' values weighed by their shares, in float64 (no autograd either way).
  static void add_share(at::Tensor& sum, const at::Tensor& value, const MicroBatch& part, bool whole) {
    torch::NoGradGuard no_grad;
    if (whole) {
      sum = value.detach();
      return;
    }
    const auto v = value.to(at::kDouble) * part.share;
    sum = sum.defined() ? sum + v : v;
  }

  // One critic step on a minibatch (micro-batches summed): its loss and mean Q of the taken
  // actions (scalars on the device: float32 for a whole minibatch, float64 sums of parts).
  std::pair<at::Tensor, at::Tensor> critic_step(const Rows& mb, StepContext& ctx) {
    const auto parts = ctx.micro_batches(mb.u.size(0));
    at::Tensor grad, loss_sum, q_sum;
    for (const auto& part : parts) {
      const auto ci = mb.critic_in.narrow(0, part.begin, part.rows);
      const auto u = mb.u.narrow(0, part.begin, part.rows);
      const auto y = mb.target.narrow(0, part.begin, part.rows);
      at::Tensor loss, taken;
      {
        auto guard = ctx.autocast();
        const auto out = critic_net(ci).to(at::kFloat);
        taken = q_critic() ? out.gather(-1, u.unsqueeze(-1)).squeeze(-1) : out.squeeze(-1);
        loss = (taken - y).square().mean();
      }
      auto g = ctx.gradient(loss, critic_opt_);
      accumulate(grad, std::move(g), part);
      add_share(loss_sum, loss, part, parts.size() == 1);
      add_share(q_sum, taken.detach().mean(), part, parts.size() == 1);
    }
    ctx.apply(critic_opt_, grad, cfg_.max_grad_norm);
    return {loss_sum, q_sum};
  }

  // One actor step on a minibatch with advantages from the (just stepped) critic, its
  // exploration mixed in with `mix`: its loss, mean |advantage| and entropy (scalars on the
  // device, as `critic_step`'s).
  std::array<at::Tensor, 3> actor_step(const Rows& mb, StepContext& ctx, const Mixing& mix) {
    const auto parts = ctx.micro_batches(mb.u.size(0));
    at::Tensor grad, loss_sum, adv_sum, ent_sum;
    for (const auto& part : parts) {
      const auto ci = mb.critic_in.narrow(0, part.begin, part.rows);
      const auto av = mb.avail.narrow(0, part.begin, part.rows);
      const auto u = mb.u.narrow(0, part.begin, part.rows);
      const auto y = mb.target.narrow(0, part.begin, part.rows);
      at::Tensor loss, adv, h;
      {
        auto guard = ctx.autocast();
        // A recurrent actor unrolls every held episode (the gradient runs through time) and
        // takes the minibatch's rows.
        auto logits = categorical::masked(recurrent() ? sequence_logits().index({mb.index.narrow(0, part.begin, part.rows)})
                                       : actor_net(mb.actor_in.narrow(0, part.begin, part.rows)).to(at::kFloat),
                           av);
        auto pi = logits.softmax(-1);
        if (mix.keep.defined()) pi = categorical::mixed(pi, av, mix.keep, mix.eps);
        const auto log_pi = pi.gather(-1, u.unsqueeze(-1)).squeeze(-1).clamp_min(1e-10).log();
        {
          torch::NoGradGuard no_grad;
          const auto out = critic_net(ci).to(at::kFloat);
          if (q_critic()) adv = out.gather(-1, u.unsqueeze(-1)).squeeze(-1) - counterfactual_baseline(pi.detach(), out);
          else adv = y - out.squeeze(-1);
        }
        h = -(pi * pi.clamp_min(1e-10).log()).sum(-1).mean();
        loss = -(adv * log_pi).mean() - *cfg_.ent_coef * h;
      }
      auto g = ctx.gradient(loss, actor_opt_);
      accumulate(grad, std::move(g), part);
      const bool whole = parts.size() == 1;
      add_share(loss_sum, loss, part, whole);
      add_share(adv_sum, adv.abs().mean(), part, whole);
      add_share(ent_sum, h, part, whole);
    }
    ctx.apply(actor_opt_, grad, cfg_.max_grad_norm);
    return {loss_sum, adv_sum, ent_sum};
  }

  void update_target() {
    torch::NoGradGuard no_grad;
    const auto src = critic_->parameters(), dst = target_->parameters();
    for (std::size_t i = 0; i < src.size(); ++i) dst[i].copy_(src[i]);
    if (!maps()) return;
    const auto es = critic_enc_->parameters(), ed = target_enc_->parameters();
    for (std::size_t i = 0; i < es.size(); ++i) ed[i].copy_(es[i]);
  }
  // The target critic's parameters, its map encoder's after its MLP's.
  [[nodiscard]] std::vector<at::Tensor> target_parameters() const {
    auto t = target_->parameters();
    if (maps())
      for (auto& p : target_enc_->parameters()) t.push_back(p);
    return t;
  }

  Config cfg_;
  c10::Device device_;
  AgentLayout layout_;
  std::int64_t k_ = 0, n_ = 0;
  at::Tensor eye_, powers_, others_mask_;
  nn::Mlp actor_{nullptr}, critic_{nullptr}, target_{nullptr};
  nn::GruActor gru_{nullptr};
  nn::MapEncoder actor_enc_{nullptr}, critic_enc_{nullptr}, target_enc_{nullptr};  // with maps() only
  at::Tensor memory_;                 // the recurrent actor's state while acting, [envs * k, gru]
  std::vector<Sequences> sequences_;  // the held episodes while training a recurrent actor
  FlatAdam actor_opt_, critic_opt_;
  std::vector<EpisodeBatch> pending_;
  std::int64_t pending_rows_ = 0, episodes_ = 0, critic_steps_ = 0, updates_ = 0;
  detail::ComaGraphs graphs_;  // minibatch steps in CUDA graphs (algorithms/coma_graph.hpp)

  friend struct detail::ComaGraphed;
};

static_assert(Algorithm<COMA>);

}  // namespace anvil
