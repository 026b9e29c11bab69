#pragma once
/// @file
/// Diffusion Policy (Chi, Feng, Du, Xu, Cousineau, Burchfiel, Song 2023, "Diffusion Policy:
/// Visuomotor Policy Learning via Action Diffusion"): behaviour cloning in which the policy
/// is a conditional denoising diffusion model (Ho, Jain, Abbeel 2020, "DDPM") over a sequence
/// of future actions, so that it can represent several ways of acting where a regression
/// averages them.
///
/// What it learns from: windows of demonstrations (buffers/demo_dataset.hpp): the last
/// `obs_horizon` observations (2) and `horizon` actions (16) starting with the first of
/// those observations. It acts on envs wrapped in `envs::MultiStep` (envs/multi_step.hpp),
/// whose observation is the last `obs_horizon` observations and whose action is the
/// `action_horizon` (8) actions it executes before the policy is asked again: the actions
/// predicted for steps obs_horizon - 1 .. obs_horizon - 2 + action_horizon.
///
/// The paper's choices, each a config field: the temporal U-Net denoiser with FiLM
/// conditioning (nn/unet1d.hpp); 100 DDPM steps with the squared-cosine schedule (Nichol and
/// Dhariwal 2021), epsilon prediction and samples clipped to [-1, 1]; DDIM inference (Song,
/// Meng, Ermon 2021) with `inference_steps` steps, or DDPM with all of them; observations
/// and actions scaled to [-1, 1] by the demonstrations' minimum and maximum, kept in the
/// checkpoint; AdamW (lr 1e-4, betas 0.95 / 0.999, weight decay 1e-6) with a linear
/// warm-up of 500 steps and a cosine decay over the run; an average of the weights (EMA)
/// whose decay warms up as 1 - (1 + k)^-0.75 (k: updates so far minus one) up to
/// `train.ema_decay`, stepped once per optimizer step and with its count in the checkpoint.
///
/// `objective = mse` is the baseline: the same network and data, regressing the action
/// sequence directly (its input a zero sequence at step 0), trained on the squared error.
///
/// Observations with images (an env of rows of parts in `envs::MultiStep`, e.g. Push-T's
/// image variant; section IV-B of the paper): each step's images are cropped (`crop`: a
/// random crop in training, the centre when acting; the paper's 84 of 96), encoded by an
/// `nn::ObsEncoder` (`diffusion.encoder`: the small GroupNorm/spatial-softmax CNN by default,
/// `resnet18` for the paper's ResNet-18 with GroupNorm, at GPU scale) shared over the observation
/// steps and trained end to end with the denoiser, its features beside the min-max scaled
/// float parts; the concatenation over the steps conditions the U-Net. The images travel as
/// bytes to the device. CUDA graphs are not used for them (the crops are drawn on the host).

#include <torch/nn/module.h>
#include <torch/utils.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <memory>
#include <numbers>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <anvil/algorithms/diffusion_schedule.hpp>
#include <anvil/core/batch.hpp>
#include <anvil/core/binary_io.hpp>
#include <anvil/core/concepts.hpp>
#include <anvil/core/policy_tensors.hpp>
#include <anvil/core/context.hpp>
#include <anvil/core/error.hpp>
#include <anvil/core/spaces.hpp>
#include <anvil/core/tensor_io.hpp>
#include <anvil/nn/network_config.hpp>
#include <anvil/nn/observation_encoder.hpp>
#include <anvil/nn/unet1d.hpp>
#include <anvil/optim/ema.hpp>
#include <anvil/optim/flat_adam.hpp>
#include <anvil/optim/graphed_update.hpp>
#include <anvil/optim/step_context.hpp>

namespace anvil {

struct OfflineLoop;  // train/loops/offline.hpp (a layer above; the Trainer includes it)

/// What Diffusion Policy's network learns (see diffusion_policy.hpp).
enum class DiffusionObjective { ddpm, mse };
constexpr auto enum_names(DiffusionObjective) { return std::array<std::string_view, 2>{"ddpm", "mse"}; }
/// How actions are sampled at inference.
enum class DiffusionSampler { ddim, ddpm };
constexpr auto enum_names(DiffusionSampler) { return std::array<std::string_view, 2>{"ddim", "ddpm"}; }

/// Algorithm policy: Diffusion Policy, and MSE behaviour cloning on the same network (see
/// file comment).
class DiffusionPolicy {
 public:
  using policy_kind = AlgorithmKind;
  static constexpr FixedString config_section = "diffusion";
  static constexpr bool on_policy = false;
  static constexpr bool reads_images = true;
  using Batch = ReplayBatch;
  using loop = OfflineLoop;

  struct Config {
    Param<DiffusionObjective, "objective", "ddpm: denoise action sequences (Diffusion Policy); mse: regress them (BC baseline)">
        objective{DiffusionObjective::ddpm};
    Param<int, "obs_horizon", "observations the policy sees (the latest last)", in_range(1, 64)> obs_horizon{2};
    Param<int, "horizon", "actions predicted per sample", in_range(1, 1024)> horizon{16};
    Param<int, "action_horizon", "predicted actions executed before the policy is asked again", in_range(1, 1024)>
        action_horizon{8};
    Param<int, "train_steps", "diffusion steps of training (DDPM's K)", in_range(1, 10000)> train_steps{100};
    // How the trained denoiser samples: acting only, so an evaluation may change it.
    Param<int, "inference_steps", "DDIM steps at inference (diffusion.sampler=ddim)", in_range(1, 10000), FieldRole::acting>
        inference_steps{16};
    Param<DiffusionSampler, "sampler", "ddim: inference_steps steps; ddpm: all train_steps", any_value, FieldRole::acting>
        sampler{DiffusionSampler::ddim};
    Param<double, "ddim_eta", "DDIM's stochasticity (0: deterministic; 1 with all steps: DDPM)", in_range(0, 1),
          FieldRole::acting>
        ddim_eta{0.0};
    Param<bool, "clip_sample", "clip predicted clean samples to [-1, 1]", any_value, FieldRole::acting> clip_sample{true};
    Param<std::vector<int>, "widths", "the U-Net's channels per level", at_least(1)> widths{256, 512, 1024};
    Param<int, "kernel", "the U-Net's convolution width", in_range(1, 31)> kernel{5};
    Param<int, "groups", "GroupNorm groups", in_range(1, 1024)> groups{8};
    Param<int, "step_embed", "diffusion-step embedding width", in_range(2, 4096)> step_embed{256};
    Param<std::int64_t, "batch_size", "windows per gradient step (per rank)", at_least(1)> batch_size{256};
    Param<double, "lr", "AdamW learning rate", positive> lr{1e-4};
    Param<double, "beta1", "AdamW beta1", in_range(0, 1)> beta1{0.95};
    Param<double, "beta2", "AdamW beta2", in_range(0, 1)> beta2{0.999};
    Param<double, "weight_decay", "AdamW decoupled weight decay", at_least(0)> weight_decay{1e-6};
    Param<std::int64_t, "lr_warmup", "optimizer steps of linear learning-rate warm-up", at_least(0)> lr_warmup{500};
    Param<bool, "lr_cosine", "decay the learning rate to 0 along a cosine over the run's remaining updates"> lr_cosine{true};
    Param<double, "ema_power", "EMA warm-up power: decay 1 - (1 + k)^-power up to train.ema_decay (0: constant decay)",
          at_least(0)>
        ema_power{0.75};
    Param<double, "max_grad_norm", "clip the gradient's global norm (0: off)", at_least(0)> max_grad_norm{0.0};
    Param<bool, "cuda_graph",
          "on CUDA, capture the update as a CUDA graph and replay it (one process, or DDP with "
          "parallel.capture_all_reduce; FP16's loss scaler included, no gradient accumulation; false: op by op; "
          "never with image observations)">
        cuda_graph{true};
    Param<double, "crop",
          "image observations: the crop's side as a fraction of the image's, at a random place in training and at the "
          "centre when acting (0.875: 84 of Push-T's 96, the paper's; 1: none)",
          Range{.lo = 0, .hi = 1, .lo_open = true}>
        crop{0.875};
    /// Image observations: the encoder of each step's images, shared over the steps (no
    /// random shift by default: the crop is the paper's augmentation).
    Section<"encoder", nn::ObsEncoderConfig> encoder{[] {
      nn::ObsEncoderConfig c;
      c.shift = 0;
      return c;
    }()};

    /// A run of seconds (`run.smoke`): a small U-Net on small batches, a short warm-up.
    void shrink() {
      encoder->width = std::min(*encoder->width, 8);
      encoder->features = std::min(*encoder->features, 16);
      if (widths->size() > 2 || widths->front() > 16) widths = {16, 32};
      step_embed = std::min(*step_embed, 16);
      batch_size = std::min<std::int64_t>(batch_size, 64);
      lr_warmup = std::min<std::int64_t>(lr_warmup, 20);
    }
  };

  DiffusionPolicy(const EnvSpec& spec, const Config& cfg, const RunContext& ctx)
      : cfg_(cfg), device_(ctx.device), schedule_(cfg.train_steps) {
    if (spec.discrete()) throw ConfigError("DiffusionPolicy: " + spec.name + " has discrete actions; it needs a Box");
    const auto od = spec.obs_dim(), ad = spec.action_dim();
    if (spec.byte_rows()) {
      try {
        step_layout_ = spec.layout.unstacked(cfg.obs_horizon);
      } catch (const ConfigError& e) {
        throw ConfigError("diffusion.obs_horizon: " + spec.name + ": " + e.what());
      }
      std::int64_t side = 0;
      for (const auto& p : step_layout_.parts)
        if (p.image()) side = side == 0 ? std::min(p.shape[1], p.shape[2]) : std::min({side, p.shape[1], p.shape[2]});
      const auto crop = std::max<std::int64_t>(1, std::llround(*cfg.crop * static_cast<double>(side)));
      crop_layout_ = nn::cropped_layout(step_layout_, crop == side ? 0 : crop, "diffusion.crop");
      encoder_ = nn::ObsEncoder(crop_layout_, *cfg.encoder);
      encoder_->to(device_);
    } else if (od % cfg.obs_horizon != 0)
      throw ConfigError("diffusion.obs_horizon: " + spec.name + "'s observation has " + std::to_string(od) +
                        " numbers, not a multiple of " + std::to_string(*cfg.obs_horizon) +
                        " (wrap the env in envs::MultiStep with the same horizons)");
    if (ad % cfg.action_horizon != 0)
      throw ConfigError("diffusion.action_horizon: " + spec.name + "'s action has " + std::to_string(ad) +
                        " numbers, not a multiple of " + std::to_string(*cfg.action_horizon) +
                        " (wrap the env in envs::MultiStep with the same horizons)");
    if (cfg.obs_horizon - 1 + cfg.action_horizon > cfg.horizon)
      throw ConfigError("diffusion.horizon: is " + std::to_string(*cfg.horizon) + "; it must hold obs_horizon - 1 + action_horizon = " +
                        std::to_string(cfg.obs_horizon - 1 + cfg.action_horizon) + " actions");
    if (cfg.inference_steps > cfg.train_steps)
      throw ConfigError("diffusion.inference_steps: is " + std::to_string(*cfg.inference_steps) + ", more than diffusion.train_steps (" +
                        std::to_string(*cfg.train_steps) + ")");
    if (ctx.micro_batches > cfg.batch_size)
      throw ConfigError("train.grad_accumulation (" + std::to_string(ctx.micro_batches) + ") is larger than diffusion.batch_size (" +
                        std::to_string(*cfg.batch_size) + "): micro-batches would be empty");
    obs_dim_ = encoder_ ? step_layout_.float_numel() : od / cfg.obs_horizon;
    act_dim_ = ad / cfg.action_horizon;
    const auto& box = std::get<Box>(spec.action);
    act_low_ = at::tensor(std::vector<float>(box.low.begin(), box.low.begin() + act_dim_)).to(device_);
    act_high_ = at::tensor(std::vector<float>(box.high.begin(), box.high.begin() + act_dim_)).to(device_);
    nn::Unet1dImpl::Options o;
    o.action_dim = act_dim_;
    o.cond_dim = cfg.obs_horizon * (encoder_ ? encoder_->output_size() : obs_dim_);
    o.widths = std::vector<std::int64_t>(cfg.widths->begin(), cfg.widths->end());
    o.step_embed = cfg.step_embed;
    o.kernel = cfg.kernel;
    o.groups = cfg.groups;
    net_ = nn::Unet1d(o);
    net_->to(device_);
    base_lr_ = cfg.lr * ctx.lr_scale(cfg.batch_size);
    auto params = net_->parameters();
    if (encoder_)
      for (const auto& t : encoder_->parameters()) params.push_back(t);
    opt_ = FlatAdam(std::move(params), {.lr = base_lr_, .beta1 = cfg.beta1, .beta2 = cfg.beta2, .eps = 1e-8, .weight_decay = cfg.weight_decay});
    set_lr();
    ema_.set_device(device_);
    alpha_bars_ = at::tensor(schedule_.alpha_bars(), at::TensorOptions().dtype(at::kDouble)).to(device_);
  }

  /// The dataset windows this algorithm learns from: observations and actions per sample.
  [[nodiscard]] std::pair<std::int64_t, std::int64_t> sequence() const noexcept { return {*cfg_.obs_horizon, *cfg_.horizon}; }

  /// Fits the min-max normalisation to the data's ranges (obs [obs_dim], actions
  /// [act_dim]); a run restored from a checkpoint keeps the checkpoint's.
  void fit_normalizer(const at::Tensor& obs_min, const at::Tensor& obs_max, const at::Tensor& act_min, const at::Tensor& act_max) {
    if (obs_min.numel() != obs_dim_ || act_min.numel() != act_dim_)
      throw ConfigError("DiffusionPolicy: the demonstrations have observations of " + std::to_string(obs_min.numel()) + " and actions of " +
                        std::to_string(act_min.numel()) + " numbers; the env has " + std::to_string(obs_dim_) + " and " +
                        std::to_string(act_dim_));
    obs_norm_ = diffusion::MinMax::fit(obs_min.to(device_), obs_max.to(device_));
    act_norm_ = diffusion::MinMax::fit(act_min.to(device_), act_max.to(device_));
    condition_affine();
    graphs_.clear();  // they read the old normalisation's tensors
  }
  [[nodiscard]] bool has_normalizer() const noexcept { return obs_norm_.defined(); }

  /// The run's length in updates (for the cosine decay of the learning rate).
  void plan_updates(std::int64_t total) {
    total_updates_ = total;
    set_lr();
  }

  /// Actions for observations [N, obs_horizon * obs_dim] (env units): [N, action_horizon *
  /// act_dim] in the Trainer's normalised units ([-1, 1] over the env's bounds). Sampling
  /// is stochastic in both modes, as the paper evaluates.
  at::Tensor act(const at::Tensor& obs, ActMode /*mode*/) {
    torch::NoGradGuard no_grad;
    const auto seq = predict(obs);  // [N, horizon, act_dim], env units
    const auto chunk = seq.narrow(1, cfg_.obs_horizon - 1, cfg_.action_horizon);
    const auto unit = (chunk - act_low_) / (act_high_ - act_low_) * 2.0 - 1.0;
    return unit.reshape({obs.size(0), -1});
  }

  /// The whole predicted action sequence [N, horizon, act_dim] in env units.
  at::Tensor predict(const at::Tensor& obs) {
    torch::NoGradGuard no_grad;
    need_normalizer();
    const auto n = obs.size(0);
    const auto cond = condition(obs, /*train=*/false);
    at::Tensor x;
    if (*cfg_.objective == DiffusionObjective::mse) {
      x = net_->forward(at::zeros({n, cfg_.horizon, act_dim_}, cond.options()), at::zeros({n}, cond.options().dtype(at::kLong)), cond);
    } else {
      x = at::randn({n, cfg_.horizon, act_dim_}, cond.options());
      const auto steps = *cfg_.sampler == DiffusionSampler::ddpm ? ddpm_timesteps() : diffusion::ddim_timesteps(cfg_.train_steps, cfg_.inference_steps);
      for (std::size_t i = 0; i < steps.size(); ++i) {
        const int t = steps[i];
        const int prev = i + 1 < steps.size() ? steps[i + 1] : -1;
        const auto eps = net_->forward(x, at::full({n}, t, cond.options().dtype(at::kLong)), cond).to(at::kFloat);
        const auto z = at::randn_like(x);
        x = *cfg_.sampler == DiffusionSampler::ddpm ? diffusion::ddpm_step(schedule_, x, t, eps, cfg_.clip_sample, z)
                                                   : diffusion::ddim_step(schedule_, x, t, prev, eps, cfg_.clip_sample, cfg_.ddim_eta, z);
      }
    }
    return act_norm_.invert(x.to(at::kFloat));
  }

  /// One optimizer step on a batch of windows: obs [B, obs_horizon * obs_dim] and action
  /// [B, horizon * act_dim], in env units. With gradient accumulation the batch is split
  /// into the context's micro-batches, whose weighted gradients are summed before the step.
  UpdateInfo update(const ReplayBatch& b, StepContext& ctx) {
    need_normalizer();
    if (cuda::kCudaGraphs && cfg_.cuda_graph && !encoder_ && device_.is_cuda() && ctx.graphable()) return graphed_update(b, ctx);
    return eager_update(b, ctx);
  }

  /// Updates replayed from a CUDA graph so far (0 without CUDA or with `cuda_graph` off).
  [[nodiscard]] std::int64_t graphed_updates() const noexcept { return graphs_.replays(); }

 private:
  // The update op by op (what `update` runs when no graph holds it).
  UpdateInfo eager_update(const ReplayBatch& b, StepContext& ctx) {
    const auto parts = ctx.micro_batches(b.obs.size(0));
    at::Tensor grad;
    double loss_sum = 0;
    for (const auto& part : parts) {
      const bool whole = parts.size() == 1;
      const auto obs = whole ? b.obs : b.obs.narrow(0, part.begin, part.rows);
      const auto act = whole ? b.action : b.action.narrow(0, part.begin, part.rows);
      double l = 0;
      auto g = ctx.gradient(loss(obs, act, ctx, l), opt_);
      accumulate(grad, std::move(g), part);
      loss_sum += part.share * l;
    }
    ctx.apply(opt_, grad, cfg_.max_grad_norm);
    ++updates_;
    set_lr();
    UpdateInfo info;
    info.metrics = {{"loss", loss_sum}, {"lr", opt_.lr()}};
    return info;
  }

 public:
  /// The training loss of (obs, action) windows in env units (DDPM: the noise's squared
  /// error at random steps; mse: the actions'); `value` gets its float. DDPM's noise
  /// [B, horizon, act_dim] and steps [B] are drawn here unless given.
  at::Tensor loss(const at::Tensor& obs, const at::Tensor& action, StepContext& ctx, double& value,
                  const at::Tensor& given_noise = {}, const at::Tensor& given_k = {}) {
    const auto n = obs.size(0);
    const auto x0 = act_norm_.apply(action.to(device_, at::kFloat).view({n, cfg_.horizon, act_dim_}));
    at::Tensor l;
    {
      auto guard = ctx.autocast();
      const auto cond = condition(obs, /*train=*/true);
      if (*cfg_.objective == DiffusionObjective::mse) {
        const auto pred = net_->forward(at::zeros_like(x0), at::zeros({n}, x0.options().dtype(at::kLong)), cond).to(at::kFloat);
        l = (pred - x0).square().mean();
      } else {
        const auto noise = given_noise.defined() ? given_noise : at::randn_like(x0);
        const auto k = given_k.defined() ? given_k : at::randint(cfg_.train_steps, {n}, x0.options().dtype(at::kLong));
        const auto xk = diffusion::add_noise(alpha_bars_, x0, noise, k);
        const auto pred = net_->forward(xk, k, cond).to(at::kFloat);
        l = (pred - noise).square().mean();
      }
    }
    if (!ctx.capturing()) value = l.item().toDouble();
    return l;
  }

  [[nodiscard]] std::int64_t batch_size() const noexcept { return cfg_.batch_size; }
  /// Unused (no bootstrapping); the offline loop asks every algorithm for one.
  [[nodiscard]] double discount() const noexcept { return 0.99; }

  /// Moves the average towards the weights, with the warm-up of the paper's EMA (see file
  /// comment); `decay` (train.ema_decay) is its ceiling.
  void ema_update(double decay) {
    ema_.update(opt_.parameters().flat(), diffusion::ema_warmup_decay(ema_.updates(), cfg_.ema_power, decay));
  }
  template <class F>
  decltype(auto) with_ema_weights(F&& f) {
    return ema_.with_weights(opt_.parameters().flat(), std::forward<F>(f));
  }
  [[nodiscard]] std::vector<std::pair<std::string, double>> learning_rates() const { return {{"diffusion", opt_.lr()}}; }
  [[nodiscard]] std::vector<std::pair<std::string, at::Tensor>> flat_parameters() const { return {{"denoiser", opt_.parameters().flat()}}; }

  /// State protocol: the network with its AdamW state, the update count, the average (with
  /// its update count, which sets the EMA's warm-up), the normalisation.
  struct Saved {
    FlatAdam::Saved opt;
    std::int64_t updates = 0;
    Ema::Saved ema;
    std::array<at::Tensor, 4> norm;
  };
  void save(BinaryWriter& w) const {
    opt_.save(w);
    w.value(updates_);
    ema_.save(w);
    w.value(obs_norm_.defined());
    if (obs_norm_.defined()) {
      write_tensor(w, obs_norm_.scale, "observation scale");
      write_tensor(w, obs_norm_.offset, "observation offset");
      write_tensor(w, act_norm_.scale, "action scale");
      write_tensor(w, act_norm_.offset, "action offset");
    }
  }
  [[nodiscard]] Saved read(BinaryReader& r) const {
    Saved s;
    s.opt = opt_.read(r, "diffusion denoiser");
    s.updates = r.value<std::int64_t>("diffusion update count");
    s.ema = ema_.read(r, "diffusion averaged parameters", opt_.parameters().flat());
    if (r.value<bool>("diffusion normalisation flag")) {
      const auto o = at::zeros({obs_dim_}), a = at::zeros({act_dim_});
      s.norm = {read_tensor(r, "diffusion observation scale", o), read_tensor(r, "diffusion observation offset", o),
                read_tensor(r, "diffusion action scale", a), read_tensor(r, "diffusion action offset", a)};
    }
    return s;
  }
  void restore(const Saved& s) {
    opt_.restore(s.opt);
    updates_ = s.updates;
    ema_.restore(s.ema);
    if (s.norm[0].defined()) {
      obs_norm_ = {s.norm[0].to(device_), s.norm[1].to(device_)};
      act_norm_ = {s.norm[2].to(device_), s.norm[3].to(device_)};
      condition_affine();
    }
    graphs_.clear();  // captured again from the restored state (they read the old normalisation's tensors)
    set_lr();
  }

  /// The acting network for policy.safetensors (`ExportsTensors`): the U-Net as `net.*`
  /// (`step0`, `step1`, the `down`, `mid` and `up` lists, `out_block`, `out_conv`), the
  /// min-max normalisation (`norm.obs_scale`, `norm.obs_offset`, `norm.action_scale`,
  /// `norm.action_offset`: y = scale x + offset), the env's bounds of one action
  /// (`chunk_low`, `chunk_high`), and the schedule's alpha-bars (`schedule.alpha_bars`,
  /// float64); the metadata holds the horizons, the sampler and the network's shape. With
  /// image observations: the encoder (`encoder.*`, see nn::add_encoder_tensors), `crop` and
  /// `step_layout`.
  /// Acting: the sampler's loop from the given noise, the executed chunk in env units.
  [[nodiscard]] PolicyTensors policy_tensors() const {
    need_normalizer();
    PolicyTensors p{"DiffusionPolicy", {}, {}, true};
    add_module_tensors(p, "net.", *net_);
    auto cpu = [](const at::Tensor& t) { return t.detach().to(at::kCPU, at::kFloat).clone(); };
    p.tensors.emplace_back("norm.obs_scale", cpu(obs_norm_.scale));
    p.tensors.emplace_back("norm.obs_offset", cpu(obs_norm_.offset));
    p.tensors.emplace_back("norm.action_scale", cpu(act_norm_.scale));
    p.tensors.emplace_back("norm.action_offset", cpu(act_norm_.offset));
    p.tensors.emplace_back("chunk_low", cpu(act_low_));
    p.tensors.emplace_back("chunk_high", cpu(act_high_));
    p.tensors.emplace_back("schedule.alpha_bars", at::tensor(schedule_.alpha_bars(), at::TensorOptions().dtype(at::kDouble)));
    std::vector<int> widths(cfg_.widths->begin(), cfg_.widths->end());
    p.meta = {{"obs_dim", std::to_string(obs_dim_)},
              {"action_dim", std::to_string(act_dim_)},
              {"obs_horizon", std::to_string(*cfg_.obs_horizon)},
              {"horizon", std::to_string(*cfg_.horizon)},
              {"action_horizon", std::to_string(*cfg_.action_horizon)},
              {"objective", enum_text(*cfg_.objective)},
              {"sampler", enum_text(*cfg_.sampler)},
              {"train_steps", std::to_string(*cfg_.train_steps)},
              {"inference_steps", std::to_string(*cfg_.inference_steps)},
              {"ddim_eta", exact_text(*cfg_.ddim_eta)},
              {"clip_sample", *cfg_.clip_sample ? "1" : "0"},
              {"widths", comma_list(widths)},
              {"step_embed", std::to_string(*cfg_.step_embed)},
              {"kernel", std::to_string(*cfg_.kernel)},
              {"groups", std::to_string(*cfg_.groups)}};
    if (encoder_) {
      // The encoder of the cropped images (`encoder.*`, its `layout`), the parts as the env
      // hands them out per step (`step_layout`), and the crop's side (0: none).
      nn::add_encoder_tensors(p, *encoder_);
      p.meta["step_layout"] = step_layout_.describe();
      p.meta["crop"] = std::to_string(crop_layout_.row_bytes() == step_layout_.row_bytes() ? 0 : crop_side());
    }
    return p;
  }
  /// The U-Net's parameters as policy.safetensors names them (`WarmStarts`: `init.weights`).
  [[nodiscard]] std::vector<std::pair<std::string, at::Tensor>> policy_parameters() {
    auto out = named_parameters_of(*net_, "net.");
    if (encoder_)
      for (auto& p : named_parameters_of(*encoder_, "encoder.")) out.push_back(std::move(p));
    return out;
  }

  [[nodiscard]] nn::Unet1d& network() noexcept { return net_; }
  /// The image encoder (null without image observations).
  [[nodiscard]] nn::ObsEncoder& encoder() noexcept { return encoder_; }
  /// One step's observation parts, and the same with the images cropped (empty without images).
  [[nodiscard]] const ObsLayout& step_layout() const noexcept { return step_layout_; }
  [[nodiscard]] const ObsLayout& crop_layout() const noexcept { return crop_layout_; }
  [[nodiscard]] const diffusion::NoiseSchedule& schedule() const noexcept { return schedule_; }
  [[nodiscard]] const Config& config() const noexcept { return cfg_; }
  [[nodiscard]] std::int64_t updates() const noexcept { return updates_; }
  [[nodiscard]] const Ema& ema() const noexcept { return ema_; }
  [[nodiscard]] const FlatAdam& optimizer() const noexcept { return opt_; }
  [[nodiscard]] std::int64_t obs_dim() const noexcept { return obs_dim_; }
  [[nodiscard]] std::int64_t act_dim() const noexcept { return act_dim_; }

 private:
  [[nodiscard]] std::vector<int> ddpm_timesteps() const {
    std::vector<int> ts;
    for (int t = cfg_.train_steps - 1; t >= 0; --t) ts.push_back(t);
    return ts;
  }
  // The U-Net's condition [N, obs_horizon * features] from observations [N, obs_horizon *
  // obs_dim] (float rows) or [N, obs_horizon * row_bytes] (rows of parts: the images cropped,
  // at random when training, and encoded; the float parts min-max scaled).
  at::Tensor condition(const at::Tensor& obs, bool train) {
    const auto n = obs.size(0);
    if (!encoder_) return obs_norm_.apply(obs.to(device_, at::kFloat).view({n, cfg_.obs_horizon, obs_dim_})).reshape({n, -1});
    if (obs.scalar_type() != at::kByte)
      throw Error("DiffusionPolicy: observations of parts (" + step_layout_.describe() + " per step) come as uint8 rows; got " +
                  std::string(obs.dtype().name()));
    auto rows = obs.to(device_).contiguous().view({n * cfg_.obs_horizon, step_layout_.row_bytes()});
    rows = nn::crop_images(rows, step_layout_, crop_layout_, train);
    if (train) rows = nn::shift_images(rows, crop_layout_, cfg_.encoder->shift);
    const auto f = encoder_->forward(rows);
    return (f * cond_scale_.to(f.scalar_type()) + cond_offset_.to(f.scalar_type())).reshape({n, -1});
  }
  // The side of the cropped images.
  [[nodiscard]] std::int64_t crop_side() const {
    for (const auto& p : crop_layout_.parts)
      if (p.image()) return p.shape[1];
    return 0;
  }
  // The image encoder's features pass as they are; its float parts are min-max scaled.
  void condition_affine() {
    if (!encoder_) return;
    std::vector<at::Tensor> scale, offset;
    std::int64_t k = 0;
    const auto o = at::TensorOptions().device(device_);
    for (const auto& p : crop_layout_.parts) {
      if (p.image()) {
        scale.push_back(at::ones({encoder_->features()}, o));
        offset.push_back(at::zeros({encoder_->features()}, o));
      } else if (p.dtype == PartDtype::float32) {
        scale.push_back(obs_norm_.scale.narrow(0, k, p.numel()));
        offset.push_back(obs_norm_.offset.narrow(0, k, p.numel()));
        k += p.numel();
      }
    }
    cond_scale_ = at::cat(scale);
    cond_offset_ = at::cat(offset);
  }
  void need_normalizer() const {
    if (!obs_norm_.defined())
      throw Error("DiffusionPolicy: no normalisation yet: train on demonstrations (buffers/demo_dataset.hpp) or load a checkpoint first");
  }
  // Linear warm-up, then (lr_cosine) a cosine decay to 0 at the run's last update.
  void set_lr() {
    const double k = static_cast<double>(updates_);
    const double w = static_cast<double>(*cfg_.lr_warmup);
    double f = 1.0;
    if (k < w) f = (k + 1.0) / (w + 1.0);
    else if (cfg_.lr_cosine && total_updates_ > 0) {
      const double span = std::max(1.0, static_cast<double>(total_updates_) - w);
      f = 0.5 * (1.0 + std::cos(std::numbers::pi * std::min(1.0, (k - w) / span)));
    }
    opt_.set_lr(base_lr_ * f);
  }

  // The update from a CUDA graph (optim/graphed_update.hpp), one per batch size. DDPM's
  // noise and steps are drawn outside the graph in the order `loss` draws them, so a run
  // draws the same numbers with the graph or without.
  UpdateInfo graphed_update(const ReplayBatch& b, StepContext& ctx) {
    const auto n = b.obs.size(0);
    auto& g = graphs_.of(n, device_);
    if (g.update.warming()) {
      UpdateInfo info;
      g.update.warm_up([&] { info = eager_update(b, ctx); });
      return info;
    }
    at::Tensor noise, k;
    if (*cfg_.objective == DiffusionObjective::ddpm) {
      const auto o = at::TensorOptions().device(device_);
      noise = at::randn({n, cfg_.horizon, act_dim_}, o);
      k = at::randint(cfg_.train_steps, {n}, o.dtype(at::kLong));
    }
    // The batch may be on the host (the demonstration loader's): its fixed inputs are float32
    // on the device, and the replay's copy moves it there (a copy from the host inside the
    // graph would be captured).
    const std::vector<at::Tensor> values{b.obs, b.action, noise, k};
    opt_.sync_device_state();
    if (!g.update.captured()) {
      auto& u = g.update;
      const auto on_device = at::TensorOptions().device(device_).dtype(at::kFloat);
      const auto obs = u.input(b.obs.sizes(), on_device), act = u.input(b.action.sizes(), on_device);
      const auto in_noise = u.input(noise), in_k = u.input(k);
      u.capture(ctx, "diffusion", [&] {
        double unused = 0;
        const auto l = loss(obs, act, ctx, unused, in_noise, in_k);
        ctx.apply(opt_, ctx.gradient(l, opt_), cfg_.max_grad_norm);
        g.out = l.detach().to(at::kDouble);
      });
    }
    graphs_.replay(g, values);
    opt_.count_step();
    ctx.count_steps(1);
    ++updates_;
    const double value = g.out.item<double>();
    set_lr();
    UpdateInfo info;
    info.metrics = {{"loss", value}, {"lr", opt_.lr()}};
    return info;
  }

  Config cfg_;
  c10::Device device_;
  diffusion::NoiseSchedule schedule_;
  std::int64_t obs_dim_ = 0, act_dim_ = 0;
  at::Tensor act_low_, act_high_;
  nn::Unet1d net_{nullptr};
  ObsLayout step_layout_, crop_layout_;  // image observations: one step's parts, and cropped
  nn::ObsEncoder encoder_{nullptr};
  at::Tensor cond_scale_, cond_offset_;  // the condition's affine map per feature (images)
  double base_lr_ = 0;
  FlatAdam opt_;
  std::int64_t updates_ = 0;
  std::int64_t total_updates_ = 0;
  at::Tensor alpha_bars_;            // the schedule's alpha-bars on the device (float64)
  GraphedUpdates<at::Tensor> graphs_;  // CUDA graphs of the update by batch rows; their output is the loss
  Ema ema_;
  diffusion::MinMax obs_norm_, act_norm_;
};

}  // namespace anvil
