// The four policy concepts accept the policies anvil ships, and Trainer accepts the good
// combinations. The rejections are proven by tests/compile_fail.
#include <anvil/train/trainer_select.hpp>  // first: the header under test compiles on its own here
#include <doctest/doctest.h>

#include <anvil/anvil.hpp>

namespace {
using namespace anvil;

static_assert(Algorithm<SAC>);
static_assert(Algorithm<PPO> && OnPolicyAlgorithm<PPO> && !OnPolicyAlgorithm<SAC>);
static_assert(Buffer<RolloutBuffer> && !ReplayBuffer<RolloutBuffer>);
static_assert(TrainerRules<PPO, RolloutBuffer, SingleDevice, FP32>::ok);
static_assert(ReplayBuffer<UniformBuffer>);
static_assert(!PrioritizedReplay<UniformBuffer>);
static_assert(Parallelism<SingleDevice>);
static_assert(Precision<FP32> && Precision<TF32> && Precision<BF16> && Precision<FP16>);

// Each policy is exactly one kind.
static_assert(!Algorithm<UniformBuffer> && !Buffer<SAC> && !Parallelism<FP32> && !Precision<SingleDevice>);

// Good combinations are Trainers, not the rejected stand-in.
template <class T>
constexpr bool is_real_trainer = !std::is_same_v<T, anvil::detail::RejectedTrainer>;
static_assert(is_real_trainer<Trainer<SAC, UniformBuffer>>);
static_assert(is_real_trainer<Trainer<SAC, UniformBuffer, SingleDevice, BF16>>);
static_assert(is_real_trainer<Trainer<SAC, UniformBuffer, SingleDevice, TF32>>);
static_assert(is_real_trainer<Trainer<SAC, UniformBuffer, SingleDevice, FP16>>);
static_assert(is_real_trainer<Trainer<PPO, RolloutBuffer, SingleDevice, BF16>>);
static_assert(std::same_as<Trainer<SAC, UniformBuffer>, BasicTrainer<SAC, UniformBuffer, SingleDevice, FP32>>);

// A user network satisfies SAC's network concepts and makes a valid algorithm.
static_assert(SquashedPolicyNetwork<nn::GaussianActor> && TwinCriticNetwork<nn::TwinQ>);
}  // namespace

TEST_CASE("Concepts: the Trainer's config has one section per policy") {
  using T = Trainer<SAC, UniformBuffer>;
  T::Config c;
  const auto keys = flatten(c);
  auto has = [&](const std::string& k) {
    return std::any_of(keys.begin(), keys.end(), [&](const auto& kv) { return kv.first == k; });
  };
  CHECK(has("run.seed"));
  CHECK(has("train.update_interval"));
  CHECK(has("env.num_envs"));
  CHECK(has("sac.batch_size"));
  CHECK(has("sac.actor.hidden"));
  CHECK(has("sac.critic.hidden"));
  CHECK(has("buffer.capacity"));
  CHECK(has("precision.detect_anomaly"));
}

TEST_CASE("Concepts: FP16 on a CPU device is refused at construction with a clear error") {
  using T = Trainer<SAC, UniformBuffer, SingleDevice, FP16>;
  T::Config c;
  c.run->device = "cpu";
  try {
    T t(envs::Pendulum{}, c);
    FAIL("FP16 on the CPU must be refused");
  } catch (const DeviceError& e) {
    CHECK(std::string(e.what()) == "FP16 autocast needs a CUDA device; use BF16 on CPU (run.device is cpu)");
  }
}
