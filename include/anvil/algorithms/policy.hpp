#pragma once
/// @file
/// `load_policy`: a trained policy without its trainer, for deployment. A run writes
/// `policy.bin` in its directory with every checkpoint: the actor's shape, its weights (the
/// averaged ones when `train.ema_decay` is on), the env's action bounds, and the observation
/// normaliser's statistics when the run normalised observations (`normalize.obs`). `load_policy`
/// rebuilds the actor from that file alone and acts deterministically in env units.
/// Beside it the run writes `policy.safetensors` (`write_policy_safetensors`): the same
/// policy with its parameters named as a PyTorch module of the same architecture names
/// them (`anvil.load_policy` in Python builds that module; docs/python_module.md).

#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/module.h>
#include <torch/utils.h>

#include <cstdint>
#include <cstdio>
#include <map>
#include <set>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include <anvil/core/binary_io.hpp>
#include <anvil/core/error.hpp>
#include <anvil/core/policy_tensors.hpp>
#include <anvil/core/safetensors.hpp>
#include <anvil/core/tensor_io.hpp>
#include <anvil/nn/gaussian_actor.hpp>
#include <anvil/nn/observation_encoder.hpp>

namespace anvil {

/// The format tag of policy files.
inline constexpr const char* kPolicyFormat = "anvil Policy v2";

/// A deterministic policy loaded from a policy file (see file comment).
class Policy {
 public:
  /// Actions for observations [B, obs_dim] (or [obs_dim]), in the env's units: the mean
  /// action squashed to [-1, 1], then scaled to the action bounds. A policy that reads
  /// images takes rows of parts, uint8 [B, row_bytes] (or [row_bytes]), as its env gives them.
  [[nodiscard]] at::Tensor act(const at::Tensor& obs) const {
    torch::NoGradGuard no_grad;
    const bool single = obs.dim() == 1;
    at::Tensor o;
    if (encoder_) {  // rows of parts (images): uint8 [B, row_bytes], encoded first
      auto rows = single ? obs.unsqueeze(0) : obs;
      nn::detail::check_rows(rows, encoder_->layout(), "Policy::act");
      nn::ObsEncoder enc = encoder_;
      o = enc->forward(rows);
    } else {
      o = obs.to(at::kFloat);
      if (single) o = o.unsqueeze(0);
    }
    if (obs_mean_.defined()) o = ((o - obs_mean_) * obs_inv_std_).clamp(-obs_clip_, obs_clip_);
    nn::GaussianActor net = actor_;  // a handle to the same module (acting changes nothing)
    auto a = net->mode(o) * scale_ + offset_;
    return single ? a.squeeze(0) : a;
  }
  /// The network (for export or inspection).
  [[nodiscard]] const nn::GaussianActor& network() const noexcept { return actor_; }
  /// The image encoder the actor reads through (null for float observations).
  [[nodiscard]] const nn::ObsEncoder& encoder() const noexcept { return encoder_; }
  /// The env the policy was trained on.
  [[nodiscard]] const std::string& env_name() const noexcept { return env_; }
  [[nodiscard]] std::int64_t obs_dim() const noexcept { return obs_dim_; }
  [[nodiscard]] std::int64_t action_dim() const noexcept { return act_dim_; }

 private:
  friend Policy load_policy(const std::filesystem::path& path);
  friend void write_policy_safetensors(const Policy& p, const std::filesystem::path& file);
  nn::GaussianActor actor_{nullptr};
  nn::ObsEncoder encoder_{nullptr};
  at::Tensor scale_, offset_;
  at::Tensor obs_mean_, obs_inv_std_;  ///< the run's observation normaliser (undefined: none)
  double obs_clip_ = 0;
  std::string env_;
  std::int64_t obs_dim_ = 0, act_dim_ = 0;
};

/// What a policy file holds beside the network: the env's name and action bounds, and the
/// observation normaliser of a run that normalised observations.
struct PolicyFileParts {
  std::string env;
  at::Tensor action_scale, action_offset;  ///< [act_dim]: env units = squashed action * scale + offset
  at::Tensor action_low, action_high;      ///< [act_dim]: where an unbounded action is clipped first (+-1 or +-inf)
  at::Tensor obs_mean, obs_inv_std;        ///< [obs_dim] (undefined: the run did not normalise)
  double obs_clip = 0;
};

/// Writes a policy file (see file comment) atomically: `write_network` writes the network's
/// part (an algorithm's `save_policy`), which `load_policy` below reads back.
inline void write_policy(const std::filesystem::path& file, const PolicyFileParts& parts,
                         const std::function<void(BinaryWriter&)>& write_network) {
  BinaryWriter w(file, kPolicyFormat);
  w.string(parts.env);
  write_network(w);
  write_tensor(w, parts.action_scale);
  write_tensor(w, parts.action_offset);
  const bool normalised = parts.obs_mean.defined();
  w.value(normalised);  // the policy acts on observations normalised as in training
  if (normalised) {
    write_tensor(w, parts.obs_mean);
    write_tensor(w, parts.obs_inv_std);
    w.value(parts.obs_clip);
  }
  w.commit();
}

/// The kind of network a policy file holds ("GaussianActor", or another algorithm's), read
/// from its head alone.
[[nodiscard]] inline std::string policy_kind(const std::filesystem::path& path) {
  BinaryReader r(path, kPolicyFormat);
  (void)r.string("env name");
  return r.string("actor kind");
}

/// Whether `load_policy` reads policy files of this kind (`policy_kind`): SAC's Gaussian
/// actors, plain, through an image encoder, or with an output head per task.
[[nodiscard]] inline bool loadable_policy_kind(std::string_view kind) {
  return kind == "GaussianActor" || kind == "EncodedGaussianActor" || kind == "MultiHeadGaussianActor";
}

/// Reads a policy file written by a run (see file comment); a missing, truncated, corrupted
/// or foreign file gets an error naming it and the field at fault.
inline Policy load_policy(const std::filesystem::path& path) {
  BinaryReader r(path, kPolicyFormat);
  Policy p;
  p.env_ = r.string("env name");
  const auto kind = r.string("actor kind");
  if (!loadable_policy_kind(kind)) r.fail("actor kind", "'" + kind + "' is not one this build knows");
  if (kind == "EncodedGaussianActor") p.encoder_ = nn::read_encoder(r);
  nn::GaussianActorImpl::Config cfg;
  if (kind == "MultiHeadGaussianActor") {  // an output head per task, picked by the observation's one-hot
    cfg.heads = r.value<int>("head count");
    if (cfg.heads < 2 || cfg.heads > (1 << 16)) r.fail("head count", "is out of range (2 to 65536)");
  }
  p.obs_dim_ = r.value<std::int64_t>("observation size");
  if (p.obs_dim_ < cfg.heads) r.fail("head count", "is larger than the observation size");
  if (p.encoder_ && p.obs_dim_ != p.encoder_->output_size())
    r.fail("observation size", std::to_string(p.obs_dim_) + " is not the encoder's " + std::to_string(p.encoder_->output_size()) + " features");
  p.act_dim_ = r.value<std::int64_t>("action size");
  if (p.obs_dim_ < 1 || p.act_dim_ < 1) r.fail("observation or action size", "is not positive");
  const auto layers = r.value<std::uint64_t>("hidden layer count");
  if (layers < 1 || layers > 64) r.fail("hidden layer count", "is out of range");
  std::vector<int> hidden;
  for (std::uint64_t i = 0; i < layers; ++i) hidden.push_back(r.value<int>("hidden layer widths"));
  for (int h : hidden)
    if (h < 1 || h > (1 << 20)) r.fail("hidden layer widths", "contain a width out of range (1 to 1048576)");
  if (p.obs_dim_ > (1 << 24) || p.act_dim_ > (1 << 24)) r.fail("observation or action size", "is implausibly large");
  // The weights these sizes imply must be in the file before a network of them is built (a
  // flipped bit in a width must not allocate gigabytes).
  std::int64_t weights = 0, in = p.obs_dim_;
  for (int h : hidden) weights += in * h, in = h;
  weights += in * p.act_dim_ * cfg.heads;
  r.expect_available(weights * static_cast<std::int64_t>(sizeof(float)), "hidden layer widths");
  cfg.hidden = hidden;
  const int activation = r.value<int>("activation");
  if (activation < 0 || activation >= static_cast<int>(enum_names(nn::Activation{}).size()))
    r.fail("activation", "is not a known activation");
  cfg.activation = static_cast<nn::Activation>(activation);
  cfg.log_std_min = r.value<double>("log_std_min");
  cfg.log_std_max = r.value<double>("log_std_max");
  {
    // Building the network draws initial weights (overwritten below) from torch's CPU
    // generator: its state is put back, so loading a policy changes no random stream (a run
    // writes policy.safetensors from policy.bin at each checkpoint, and resumes bitwise).
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    const auto state = gen.get_state();
    p.actor_ = nn::GaussianActor(p.obs_dim_, p.act_dim_, cfg);
    gen.set_state(state);
  }
  std::vector<at::Tensor> params = p.actor_->parameters();
  std::int64_t n = 0;
  for (const auto& t : params) n += t.numel();
  const auto flat = read_tensor(r, "actor parameters", at::empty({n}));
  const auto like = at::empty({p.act_dim_});
  p.scale_ = read_tensor(r, "action scale", like);
  p.offset_ = read_tensor(r, "action offset", like);
  if (r.value<bool>("observation normaliser flag")) {
    const auto obs_like = at::empty({p.obs_dim_});
    p.obs_mean_ = read_tensor(r, "observation mean", obs_like);
    p.obs_inv_std_ = read_tensor(r, "observation scale", obs_like);
    p.obs_clip_ = r.value<double>("observation clip");
    if (!(p.obs_clip_ > 0)) r.fail("observation clip", "is not positive");
  }
  r.finish();
  torch::NoGradGuard no_grad;
  std::int64_t off = 0;
  for (auto& t : params) {
    t.copy_(flat.narrow(0, off, t.numel()).view(t.sizes()));
    off += t.numel();
  }
  p.actor_->eval();
  return p;
}

namespace detail {
inline std::string shape_text(at::IntArrayRef sizes) {
  std::string s = "[";
  for (std::size_t i = 0; i < sizes.size(); ++i) s += (i ? ", " : "") + std::to_string(sizes[i]);
  return s + "]";
}
}  // namespace detail

/// Writes an algorithm's acting network `p` as safetensors to `file` (atomic) with what the
/// run adds: the env's name; for continuous actions `action_scale` and `action_offset` (env
/// units = action * scale + offset) and, when `p.clips_actions`, `action_low` and
/// `action_high` (the clip before that); and `obs_mean`, `obs_inv_std` (metadata `obs_clip`)
/// for a run that normalised observations. The metadata says how to rebuild the module
/// (format "anvil policy 1", kind, sizes). Non-finite weights are refused, naming the tensor,
/// and nothing is written.
inline void write_policy_tensors(const std::filesystem::path& file, PolicyTensors p, const PolicyFileParts& parts) {
  for (const auto& [name, t] : p.tensors)
    if (!t.isfinite().all().item<bool>())
      throw Error(file.string() + ": not written: tensor '" + name + "' of the " + p.kind + " holds NaN or infinite values");
  p.meta["format"] = "anvil policy 1";
  p.meta["kind"] = p.kind;
  p.meta["env"] = parts.env;
  if (parts.action_scale.defined()) {
    p.tensors.emplace_back("action_scale", parts.action_scale.to(at::kFloat));
    p.tensors.emplace_back("action_offset", parts.action_offset.to(at::kFloat));
    if (p.clips_actions) {
      p.tensors.emplace_back("action_low", parts.action_low.to(at::kFloat));
      p.tensors.emplace_back("action_high", parts.action_high.to(at::kFloat));
    }
  }
  if (parts.obs_mean.defined()) {
    p.tensors.emplace_back("obs_mean", parts.obs_mean.to(at::kFloat));
    p.tensors.emplace_back("obs_inv_std", parts.obs_inv_std.to(at::kFloat));
    p.meta["obs_clip"] = exact_text(parts.obs_clip);
  }
  safetensors::write(file, p.tensors, p.meta);
}

/// Writes `p` as safetensors to `file` (atomic, `write_policy_tensors`): the actor's
/// parameters under their module names (`net.fc0.weight`, `net.fc0.bias`, ..., the names a
/// PyTorch module with a `net` of Linear layers `fc0`, `fc1`, ... has), `action_scale` and
/// `action_offset` (env units = tanh(mean) * scale + offset), and `obs_mean`, `obs_inv_std`
/// for a run that normalised observations; the metadata holds the sizes, activation and
/// log-std bounds.
inline void write_policy_safetensors(const Policy& p, const std::filesystem::path& file) {
  PolicyTensors t{"GaussianActor", {}, {}, false};
  add_module_tensors(t, "", *p.network());
  std::map<std::string, std::string> encoder_meta;
  if (p.encoder_) {
    nn::add_encoder_tensors(t, *p.encoder_);
    encoder_meta = t.meta;
  }
  const auto& cfg = p.network()->config();
  std::string hidden;
  for (const int h : *cfg.hidden) hidden += (hidden.empty() ? "" : ",") + std::to_string(h);
  t.meta = {{"obs_dim", std::to_string(p.obs_dim_)},
            {"action_dim", std::to_string(p.act_dim_)},
            {"hidden", hidden},
            {"activation", std::string(nn::enum_names(*cfg.activation)[static_cast<std::size_t>(*cfg.activation)])},
            {"log_std_min", exact_text(*cfg.log_std_min)},
            {"log_std_max", exact_text(*cfg.log_std_max)}};
  if (cfg.heads > 1) t.meta["heads"] = std::to_string(*cfg.heads);  // the observation's last `heads` numbers pick one
  t.meta.insert(encoder_meta.begin(), encoder_meta.end());
  write_policy_tensors(file, std::move(t),
                       PolicyFileParts{p.env_, p.scale_, p.offset_, {}, {}, p.obs_mean_, p.obs_inv_std_, p.obs_clip_});
}

/// `init.weights`: copies the tensors of the safetensors `file` into `params`, an
/// algorithm's acting network by the names its policy.safetensors gives them (`WarmStarts`),
/// so a run starts from a policy written by anvil or by PyTorch (`save_file(model.state_dict())`
/// of a module of the same architecture). Every parameter must be in the file with its shape
/// and a floating-point dtype, and every tensor of the file must be a parameter, except what
/// a policy file holds beside the network (action bounds, the observation normaliser), which
/// is left. A file that is not safetensors (a `torch.save` pickle: LibTorch 1.13's unpickler
/// reads no state_dict) or that does not fit is refused with every tensor at fault named, and
/// nothing is copied. `network` names the network in messages ("the sac actor"). Returns
/// the run header's line.
inline std::string warm_start(const std::filesystem::path& file, const std::vector<std::pair<std::string, at::Tensor>>& params,
                              const std::string& network) {
  {
    std::ifstream in(file, std::ios::binary);
    char head[4] = {};
    if (in.read(head, 4) && ((head[0] == 'P' && head[1] == 'K') || static_cast<unsigned char>(head[0]) == 0x80))
      throw ConfigError("init.weights: " + file.string() +
                        " is a torch.save file (a zip or pickle); anvil reads safetensors (LibTorch's unpickler reads no "
                        "state_dict). In Python: anvil.safetensors.save(path, {k: v.numpy() for k, v in "
                        "state_dict.items()})");
  }
  safetensors::File f;
  try {
    f = safetensors::read(file);
  } catch (const Error& e) {
    throw ConfigError(std::string("init.weights: ") + e.what());
  }
  std::map<std::string, const at::Tensor*> given;
  for (const auto& [name, t] : f.tensors) given[name] = &t;
  const auto beside = [](const std::string& n) {  // what policy files hold beside a network
    return n == "action_scale" || n == "action_offset" || n == "action_low" || n == "action_high" || n == "obs_mean" ||
           n == "obs_inv_std" || n == "chunk_low" || n == "chunk_high" || n.starts_with("norm.") || n.starts_with("schedule.");
  };
  std::vector<std::string> faults;
  std::set<std::string> used;
  for (const auto& [name, p] : params) {
    const auto it = given.find(name);
    if (it == given.end()) {
      faults.push_back("missing '" + name + "' " + detail::shape_text(p.sizes()));
      continue;
    }
    if (!used.insert(name).second) continue;  // a second copy of a network (SAC's target encoder): checked once
    const at::Tensor& t = *it->second;
    if (t.sizes() != p.sizes())
      faults.push_back("'" + name + "' is " + detail::shape_text(t.sizes()) + " in the file, " + detail::shape_text(p.sizes()) + " in " + network);
    else if (!at::isFloatingType(t.scalar_type()))
      faults.push_back("'" + name + "' is " + std::string(c10::toString(t.scalar_type())) + ", not floating point");
    else if (!t.isfinite().all().item<bool>())
      faults.push_back("'" + name + "' holds NaN or infinite values");
  }
  std::vector<std::string> left;
  for (const auto& [name, t] : given) {
    if (used.contains(name)) continue;
    if (beside(name)) left.push_back(name);
    else faults.push_back("unexpected '" + name + "' " + detail::shape_text(t->sizes()));
  }
  if (!faults.empty()) {
    std::string m = "init.weights: " + file.string() + " does not fit " + network + " (" + std::to_string(params.size()) +
                    " parameters):";
    for (const auto& x : faults) m += "\n  " + x;
    throw ConfigError(m);
  }
  {
    torch::NoGradGuard no_grad;
    for (const auto& [name, p] : params) {
      at::Tensor dst = p;
      dst.copy_(f.at(name));
    }
  }
  std::string line = "init.weights: " + network + " starts from " + file.string() + " (" + std::to_string(params.size()) +
                     " tensors";
  if (!left.empty()) {
    line += "; left as the run sets them: ";
    for (std::size_t i = 0; i < left.size(); ++i) line += (i ? ", " : "") + left[i];
  }
  return line + ")";
}

}  // namespace anvil
