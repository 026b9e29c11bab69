// A user network plugged into SAC: `BasicSAC<LayerNormActor, TwinQ>` trains Pendulum with an
// actor whose hidden layers are layer-normalised, without touching SAC. The actor brings its
// own config section (`sac.actor.width`, `sac.actor.depth`); `--help` lists them.
#include <anvil/anvil.hpp>

// An actor SAC can use (the SquashedPolicyNetwork concept): built from (obs_dim, act_dim,
// Config); sample(obs, noise) gives a tanh-squashed reparameterised action and its
// log-density; mode(obs) the deterministic action; cloneable.
class LayerNormActorImpl : public torch::nn::Cloneable<LayerNormActorImpl> {
 public:
  struct Config {
    anvil::Param<int, "width", "width of each hidden layer", anvil::at_least(1)> width{256};
    anvil::Param<int, "depth", "hidden layers, each Linear -> LayerNorm -> ReLU", anvil::in_range(1, 8)> depth{2};
  };

  LayerNormActorImpl(std::int64_t obs_dim, std::int64_t act_dim, const Config& cfg)
      : obs_dim_(obs_dim), act_dim_(act_dim), cfg_(cfg) {
    reset();
  }
  void reset() override {
    body_ = register_module("body", torch::nn::Sequential());
    std::int64_t in = obs_dim_;
    for (int i = 0; i < cfg_.depth; ++i) {
      body_->push_back(torch::nn::Linear(in, *cfg_.width));
      body_->push_back(torch::nn::LayerNorm(torch::nn::LayerNormOptions({*cfg_.width})));
      body_->push_back(torch::nn::ReLU());
      in = cfg_.width;
    }
    head_ = register_module("head", torch::nn::Linear(in, 2 * act_dim_));
  }

  anvil::nn::PolicySample sample(const at::Tensor& obs, const at::Tensor& noise) {
    auto [mean, log_std] = gaussian(obs);
    auto u = mean + noise * log_std.exp();
    // log N(u) minus the log-Jacobian of tanh, in its stable form.
    auto log_prob = (-0.5 * noise.square() - log_std - 0.5 * std::log(2 * M_PI)).sum(-1) -
                    (2.0 * (std::log(2.0) - u - torch::softplus(-2.0 * u))).sum(-1);
    return {u.tanh(), log_prob};
  }
  at::Tensor mode(const at::Tensor& obs) { return gaussian(obs).first.tanh(); }

 private:
  std::pair<at::Tensor, at::Tensor> gaussian(const at::Tensor& obs) {
    auto out = head_->forward(body_->forward(obs));
    return {out.narrow(-1, 0, act_dim_), out.narrow(-1, act_dim_, act_dim_).clamp(-5.0, 2.0)};
  }

  std::int64_t obs_dim_, act_dim_;
  Config cfg_;
  torch::nn::Sequential body_{nullptr};
  torch::nn::Linear head_{nullptr};
};
TORCH_MODULE(LayerNormActor);

int main(int argc, char** argv) {
  using MySAC = anvil::BasicSAC<LayerNormActor, anvil::nn::TwinQ>;
  using Trainer = anvil::Trainer<MySAC, anvil::UniformBuffer>;

  Trainer::Config defaults;
  defaults.train->steps = 20'000;
  defaults.train->eval_interval = 2'000;
  defaults.algorithm->actor_lr = 1e-3;
  defaults.algorithm->critic_lr = 1e-3;
  defaults.algorithm->alpha_lr = 1e-3;

  // anvil::start answers --help and bad input (exit 0 / 2) and, for DDP, launches the ranks.
  Trainer trainer(anvil::envs::Pendulum{}, anvil::start<Trainer>(argc, argv, defaults));
  trainer.fit();
}
