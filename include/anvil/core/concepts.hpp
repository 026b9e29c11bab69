#pragma once
/// @file
/// The policy kinds as concepts, built from small named rungs so that a compiler
/// diagnostic names the missing piece, and the rules for combining them in a Trainer.
/// Besides the four kinds a Trainer is written with (Algorithm, Buffer, Parallelism,
/// Precision), a Trainer runs a Loop, chosen from the algorithm's data regime
/// (train/loops/); the rungs below named after a loop say what that loop uses.
///
/// Light header: no torch beyond the scalar types. Tensor-valued members are checked
/// through forward declarations, so including this costs almost nothing.

#include <c10/core/Device.h>

#include <concepts>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <anvil/core/param.hpp>
#include <anvil/core/state.hpp>

namespace at {
class Tensor;
}

namespace anvil {

struct EnvSpec;
struct PolicyTensors;  // core/policy_tensors.hpp (a light header would pull ATen in)
struct RunContext;
struct ReplayBatch;
struct RolloutBatch;
struct RolloutAct;
struct AgentMemory;  // core/agent_memory.hpp
struct StepBatch;
struct RolloutStep;
struct StoragePlan;
struct EpisodicLoop;  // train/loops/episodic.hpp
struct UpdateInfo;
struct PrecisionSettings;
class StepContext;

/// Tags a policy declares with `using policy_kind = anvil::AlgorithmKind;` etc. The kind
/// is declared, not guessed from members, so a type in the wrong slot is named as such.
struct AlgorithmKind {};
struct BufferKind {};
struct ParallelismKind {};
struct PrecisionKind {};
struct LoopKind {};

/// What every Buffer policy declares, in one line: `class MyBuffer : public
/// BufferPolicy<"my_section", MyBatch, MyStep> {`. Its kind, its config section, the Batch
/// it hands the algorithm, the Step it stores, and whether it holds on-policy data (a
/// rollout or episodes, cleared after each update) rather than replay.
template <FixedString Section, class BatchT, class StepT, bool OnPolicy = false>
struct BufferPolicy {
  using policy_kind = BufferKind;
  static constexpr FixedString config_section = Section;
  static constexpr bool on_policy = OnPolicy;
  using Batch = BatchT;
  using Step = StepT;
};

/// How an action is chosen: sampled for exploration, or the deterministic mode for evaluation.
enum class ActMode { explore, deterministic };

// ---------------------------------------------------------------------------------------
// Rungs shared by all kinds.

/// `P` says it is a policy of kind `Kind`.
template <class P, class Kind>
concept DeclaresKind = requires { typename P::policy_kind; } &&
                       std::same_as<typename P::policy_kind, Kind>;

/// `P` has a nested `Config` aggregate (of `Param`s), default-constructible, whose fields
/// appear under the key prefix `P::config_section` (e.g. "sac").
template <class P>
concept HasConfig = requires {
  typename P::Config;
  { P::config_section } -> std::convertible_to<std::string_view>;
} && std::is_aggregate_v<typename P::Config> && std::default_initializable<typename P::Config>;

/// `P` says whether it learns only from data of its current policy.
template <class P>
concept DeclaresDataRegime = requires {
  { P::on_policy } -> std::convertible_to<bool>;
};

// ---------------------------------------------------------------------------------------
// Algorithm: owns networks, losses and optimizers. Built from the env's spaces, its
// config and the run's context (device, seed); acts on a batch of observations (one row
// per env) and updates from a batch its buffer produces. Its `update` runs the losses
// through a `StepContext`, which owns autocast, loss scaling, gradient all-reduce and the
// optimizer step, so one algorithm serves every precision and parallelism policy.

/// `A` acts on a batch of observations.
template <class A>
concept ActsOnBatches = requires(A& a, const at::Tensor& obs, ActMode mode) {
  { a.act(obs, mode) } -> std::same_as<at::Tensor>;
};

/// `A` names the batch type it learns from and updates from it through a StepContext.
template <class A>
concept UpdatesFromBatches = requires { typename A::Batch; } &&
                             requires(A& a, const typename A::Batch& b, StepContext& ctx) {
                               { a.update(b, ctx) } -> std::same_as<UpdateInfo>;
                             };

/// `P` (a policy of any kind) can be built from the env's spaces, its config and the run's context.
template <class P>
concept ConstructibleFromSpec =
    std::constructible_from<P, const EnvSpec&, const typename P::Config&, const RunContext&>;

/// `P` saves and restores its state through the state protocol (core/state.hpp), so that
/// checkpoints hold it and, for an algorithm, every rank starts from rank 0's.
template <class P>
concept SavesState = Stateful<P>;

/// An algorithm policy (SAC, TD3, PPO, ...).
template <class A>
concept Algorithm = DeclaresKind<A, AlgorithmKind> && HasConfig<A> && DeclaresDataRegime<A> &&
                    ActsOnBatches<A> && UpdatesFromBatches<A> && ConstructibleFromSpec<A> && SavesState<A>;

/// What the off-policy loop needs of its algorithm besides `act` and `update`: how many
/// transitions to sample per update, and the discount its buffer's n-step returns use.
template <class A>
concept OffPolicyAlgorithm = Algorithm<A> && !A::on_policy && requires(const A& a) {
  { a.batch_size() } -> std::convertible_to<std::int64_t>;
  { a.discount() } -> std::convertible_to<double>;
};

/// A feed-forward policy's part of a rollout: an action with its log-probability and the
/// value of each env's observation, and values alone (to bootstrap from).
template <class A>
concept ActsForRollouts = requires(A& a, const at::Tensor& obs) {
  { a.act_for_rollout(obs) } -> std::same_as<RolloutAct>;
  { a.value(obs) } -> std::same_as<at::Tensor>;
};

/// A policy with memory (a recurrent one, `RecurrentPPO`): it acts from each env's memory
/// and writes the next one back (`AgentMemory`, held by whoever steps the envs, who marks
/// episode starts), for a rollout also giving the memory it acted from, which the rollout
/// keeps beside each step; values read the memory without moving it on. It learns from
/// sequences of `sequence_length()` steps (0: a whole rollout) unrolled from the kept
/// memory, and says how wide its memory is. `act(obs, mode)` alone acts as at an episode's
/// first step.
template <class A>
concept CarriesMemory = requires(A& a, const A& ca, const at::Tensor& obs, ActMode mode, AgentMemory& m) {
  { ca.memory_width() } -> std::convertible_to<std::int64_t>;
  { ca.sequence_length() } -> std::convertible_to<std::int64_t>;
  { a.act(obs, mode, m) } -> std::same_as<at::Tensor>;
  { a.act_for_rollout(obs, m) } -> std::same_as<RolloutAct>;
  { a.value(obs, m) } -> std::same_as<at::Tensor>;
};

/// What the on-policy loop needs of its algorithm besides `act` and `update`: its part of
/// a rollout (from the observation alone, or with memory), the schedule of its epochs and
/// whether to go on after each (PPO's KL early stop lives in `end_epoch`, which may agree
/// with the other ranks through the StepContext), where the run is (for annealing), and
/// its discount (for the rollout's advantages).
template <class A>
concept OnPolicyAlgorithm = Algorithm<A> && A::on_policy && (ActsForRollouts<A> || CarriesMemory<A>) &&
                            requires(A& a, const A& ca, double progress, StepContext& ctx) {
                              { ca.epochs() } -> std::convertible_to<int>;
                              { ca.minibatch_size() } -> std::convertible_to<std::int64_t>;
                              { a.end_epoch(ctx) } -> std::convertible_to<bool>;
                              { a.set_progress(progress) };
                              { ca.discount() } -> std::convertible_to<double>;
                            };

// Optional capabilities: a loop or hook uses them where an algorithm has them, and a
// config field that needs one is refused, naming the field, where it does not.

/// `A` keeps an exponential moving average of its policy's weights (`train.ema_decay`) and
/// can act with it (evaluation, policy.bin).
template <class A>
concept AveragesPolicy = requires(A& a, double decay) {
  { a.ema_update(decay) };
  { a.with_ema_weights([] { return 0; }) } -> std::same_as<int>;
};
/// `A` reports its learning rates by optimizer (TensorBoard `lr/<name>`).
template <class A>
concept ReportsLearningRates = requires(const A& a) {
  { a.learning_rates() } -> std::convertible_to<std::vector<std::pair<std::string, double>>>;
};
/// `A` shows each network's weights as one flat tensor (TensorBoard weight histograms).
template <class A>
concept ExposesWeights = requires(const A& a) {
  { a.flat_parameters() } -> std::convertible_to<std::vector<std::pair<std::string, at::Tensor>>>;
};
/// `A` writes its policy alone for `load_policy` (policy.bin beside each checkpoint).
template <class A>
concept ExportsPolicy = requires(const A& a, BinaryWriter& w) {
  { a.save_policy(w) };
};
/// `A` gives its acting network as named tensors (policy.safetensors beside each
/// checkpoint; `anvil.load_policy` in Python builds the module they belong to).
template <class A>
concept ExportsTensors = requires(const A& a) {
  { a.policy_tensors() } -> std::same_as<PolicyTensors>;
};
/// `A` says how it takes each network's gradients: (networks, why autograd) pairs, the why
/// empty where its hand-written passes run (the run's header and summary.json say it).
template <class A>
concept DescribesGradients = requires(const A& a) {
  { a.gradient_paths() } -> std::same_as<std::vector<std::pair<std::string, std::string>>>;
};
/// An algorithm that reads observations with images (rows of parts, `EnvSpec::layout`):
/// `static constexpr bool reads_images = true`. A Trainer refuses an env with images for
/// any other, naming both.
template <class A>
concept ReadsImages = requires { requires A::reads_images; };
/// `A` shows its acting network's parameters by the names its policy file gives them (live
/// tensors: `init.weights` copies a file's tensors into them before a run starts).
template <class A>
concept WarmStarts = requires(A& a) {
  { a.policy_parameters() } -> std::same_as<std::vector<std::pair<std::string, at::Tensor>>>;
};

// ---------------------------------------------------------------------------------------
// Buffer: preallocated storage of transitions. Takes one step of N envs in one call and
// produces the batch type its algorithms learn from. Replay buffers sample at random; a
// rollout buffer hands out its whole rollout in minibatches and is cleared each iteration.

/// `B` names the batch type it produces and reports its fill level.
template <class B>
concept ProducesBatches = requires(const B& b) {
  typename B::Batch;
  { b.size() } -> std::convertible_to<std::int64_t>;
  { b.capacity() } -> std::convertible_to<std::int64_t>;
};

/// `B` names the step type a loop hands it (`StepBatch` for replay buffers, `RolloutStep`
/// for rollouts) and stores one step of every env with `add`.
template <class B>
concept StoresSteps = requires { typename B::Step; } && requires(B& b, const typename B::Step& s) {
  { b.add(s) };
};

/// `B` is told the plan of the run before it starts (and again after a resume): envs per
/// rank, the run's length, the algorithm's discount (see `StoragePlan`).
template <class B>
concept PlansStorage = requires(B& b, const StoragePlan& plan) {
  { b.plan(plan) };
};

/// A buffer policy (UniformBuffer, PrioritizedBuffer, RolloutBuffer).
template <class B>
concept Buffer = DeclaresKind<B, BufferKind> && HasConfig<B> && DeclaresDataRegime<B> &&
                 ProducesBatches<B> && StoresSteps<B> && PlansStorage<B> && ConstructibleFromSpec<B> &&
                 SavesState<B>;

/// A replay buffer: samples a batch of `n` stored transitions at random.
template <class B>
concept ReplayBuffer = Buffer<B> && requires(B& b, std::int64_t n) {
  { b.sample(n) } -> std::same_as<typename B::Batch>;
};

/// A replay buffer that can be filled from a file `save(path)` wrote (the offline loop's
/// dataset).
template <class B>
concept LoadsDataset = ReplayBuffer<B> && requires(B& b, const std::filesystem::path& p) {
  { b.load(p) };
};

/// A buffer that reads demonstrations in their own format (HDF5), `load(train.dataset)`,
/// again at every start: only its position in them is run state, kept in every checkpoint.
template <class B>
concept ReadsDemonstrations = requires { requires B::reads_demonstrations; };

/// What the on-policy loop needs of its buffer: whether the rollout is full, the
/// advantages computed from the value after its last step, the rollout in minibatches for
/// each epoch, and clearing it for the next.
template <class B>
concept RolloutStorage = Buffer<B> && requires(B& b, const B& cb, const at::Tensor& last_value, std::int64_t n) {
  { cb.full() } -> std::convertible_to<bool>;
  { b.finish(last_value) };
  { b.minibatches(n) };
  { b.clear() };
};

/// A rollout that also keeps a recurrent policy's memory beside each step and hands out
/// sequences: shuffled minibatches of `rows` rows made of whole runs of `length`
/// consecutive steps of one env (0: the whole rollout), with the memory at each start
/// (`RolloutBatch::sequence_length`).
template <class B>
concept StoresSequences = RolloutStorage<B> && requires(const B& cb, std::int64_t rows, std::int64_t length) {
  { cb.sequences(rows, length) };
};

/// A replay buffer that also takes back priorities (e.g. |TD error|) for the sampled rows.
template <class B>
concept PrioritizedReplay = ReplayBuffer<B> &&
                            requires(B& b, const at::Tensor& index, const at::Tensor& priority) {
                              { b.update_priorities(index, priority) };
                            };

// ---------------------------------------------------------------------------------------
// Parallelism: how many processes train together and how they agree. Knows its rank and
// world size, averages gradients (and any learned scalar) across ranks, broadcasts rank 0's
// state at start, and reduces metrics for logging.

/// `P` reports where this process stands in the world.
template <class P>
concept KnowsWorld = requires(const P& p) {
  { p.rank() } -> std::convertible_to<int>;
  { p.world_size() } -> std::convertible_to<int>;
  { p.is_main() } -> std::convertible_to<bool>;
  { P::can_use_cuda } -> std::convertible_to<bool>;
};

/// `P` averages tensors across ranks in place and broadcasts rank 0's tensors.
template <class P>
concept SynchronisesTensors = requires(P& p, std::vector<at::Tensor>& ts) {
  { p.all_reduce_mean(ts) };
  { p.broadcast(ts) };
};

/// `P` sets up its processes explicitly: `P::start_ranks(cfg, device)` (called by
/// `anvil::start` from main, never by a constructor, with the run's `run.device` setting)
/// may make this process the launcher of several ranks;
/// `connect(device)` joins the world once the run's device is known; `device_index()` is
/// the CUDA device this rank uses; `describe()` is one line for the log.
template <class P>
concept SetsUpRanks = requires(P& p, const P& cp, const typename P::Config& cfg, c10::Device device) {
  { P::start_ranks(cfg, std::string_view{}) };
  { p.connect(device) };
  { cp.device_index() } -> std::convertible_to<int>;
  { cp.describe() } -> std::convertible_to<std::string>;
};

/// A parallelism policy that knows how many of its ranks share this node
/// (`world().local_world_size`), so they can share its cores.
template <class P>
concept KnowsLocalWorld = requires(const P& p) {
  { p.world().local_world_size } -> std::convertible_to<int>;
};

/// A parallelism policy (SingleDevice, DDP<N>).
template <class P>
concept Parallelism = DeclaresKind<P, ParallelismKind> && HasConfig<P> && KnowsWorld<P> &&
                      SynchronisesTensors<P> && SetsUpRanks<P>;

// ---------------------------------------------------------------------------------------
// Precision: the numeric types of a step. A type-level description the StepContext turns
// into an autocast scope and, for float16, a dynamic loss scaler.

/// `X` states its compute dtype and whether it scales losses and needs CUDA.
template <class X>
concept DescribesNumerics = requires {
  { X::name } -> std::convertible_to<std::string_view>;
  { X::autocast } -> std::convertible_to<bool>;
  { X::loss_scaling } -> std::convertible_to<bool>;
  { X::needs_cuda } -> std::convertible_to<bool>;
};

/// `X` turns its config into the settings a run applies (autocast, loss scaling, TF32,
/// cuDNN, anomaly detection), so the code that applies them is not a template.
template <class X>
concept HasSettings = requires(const typename X::Config& cfg) {
  { X::settings(cfg) } -> std::same_as<PrecisionSettings>;
};

/// A precision policy (FP32, TF32, BF16, FP16).
template <class X>
concept Precision = DeclaresKind<X, PrecisionKind> && HasConfig<X> && DescribesNumerics<X> && HasSettings<X>;

// ---------------------------------------------------------------------------------------
// Loop: the order of collect, store and update for one data regime (train/loops/). A
// loop declares its kind, its config (the `train` section) and its name; its `rules<A, B>()`
// check, with one sentence each, that the algorithm and buffer have what it uses, and its
// `Runner<A, B>` runs it.

/// A loop policy (OffPolicyLoop, OnPolicyLoop, EpisodicLoop, OfflineLoop, Staged<...>).
template <class L>
concept Loop = DeclaresKind<L, LoopKind> && HasConfig<L> && requires {
  { L::name } -> std::convertible_to<std::string_view>;
};

/// An algorithm may name the loop it trains in (`using loop = anvil::EpisodicLoop;`);
/// otherwise its data regime chooses (train/trainer.hpp, `default_loop`).
template <class A>
concept NamesItsLoop = requires { typename A::loop; } && Loop<typename A::loop>;

// ---------------------------------------------------------------------------------------
// The rules for a Trainer. Each check is guarded by the ones before it, so a bad
// combination yields exactly one sentence: what is wrong; why; what to use instead.

namespace detail {

template <class T>
constexpr int declared_kind() {
  if constexpr (DeclaresKind<T, AlgorithmKind>) return 1;
  else if constexpr (DeclaresKind<T, BufferKind>) return 2;
  else if constexpr (DeclaresKind<T, ParallelismKind>) return 3;
  else if constexpr (DeclaresKind<T, PrecisionKind>) return 4;
  else return 0;
}

template <class T>
constexpr bool on_policy_of() {
  if constexpr (DeclaresDataRegime<T>) return T::on_policy;
  else return false;
}
template <class T>
constexpr bool needs_cuda_of() {
  if constexpr (DescribesNumerics<T>) return T::needs_cuda;
  else return false;
}
template <class T>
constexpr bool can_use_cuda_of() {
  if constexpr (requires { { T::can_use_cuda } -> std::convertible_to<bool>; }) return T::can_use_cuda;
  else return true;
}

/// Whether `T` names the episodic loop as its own (`using loop = anvil::EpisodicLoop;`).
template <class T>
constexpr bool names_episodic_loop() {
  if constexpr (NamesItsLoop<T>) return std::same_as<typename T::loop, EpisodicLoop>;
  else return false;
}

template <class A, class B>
constexpr bool batches_match() {
  if constexpr (requires { typename A::Batch; typename B::Batch; })
    return std::same_as<typename A::Batch, typename B::Batch>;
  else
    return false;
}

}  // namespace detail

/// Checks a Trainer's four policies. `ok` is true when they combine; otherwise exactly one
/// static_assert fires with a sentence that says what to change.
template <class A, class B, class P, class X>
struct TrainerRules {
  static constexpr int ka = detail::declared_kind<A>(), kb = detail::declared_kind<B>(),
                       kp = detail::declared_kind<P>(), kx = detail::declared_kind<X>();
  static constexpr bool slots_ok = ka == 1 && kb == 2 && kp == 3 && kx == 4;

  static constexpr bool swapped = ka == 2 || kb == 1;
  static_assert(!swapped,
                "Trainer<Algorithm, Buffer, ...>: an Algorithm and a Buffer are in each other's "
                "slot; the order is Trainer<Algorithm, Buffer, Parallelism, Precision>, e.g. "
                "Trainer<SAC, UniformBuffer>");
  static_assert(swapped || ka != 0,
                "Trainer's first argument is not an Algorithm: an algorithm declares "
                "`using policy_kind = anvil::AlgorithmKind;`; use SAC, TD3 or PPO");
  static_assert(swapped || (ka != 3 && ka != 4),
                "Trainer's first argument is a Parallelism or Precision policy: the order is "
                "Trainer<Algorithm, Buffer, Parallelism, Precision>");
  static_assert(swapped || ka != 1 || kb == 2,
                "Trainer's second argument is not a Buffer: a buffer declares "
                "`using policy_kind = anvil::BufferKind;`; use UniformBuffer, PrioritizedBuffer "
                "or RolloutBuffer");
  static_assert(!(ka == 1 && kb == 2) || kp == 3,
                "Trainer's third argument is not a Parallelism policy: use SingleDevice or DDP<N>");
  static_assert(!(ka == 1 && kb == 2 && kp == 3) || kx == 4,
                "Trainer's fourth argument is not a Precision policy: use FP32, TF32, BF16 or FP16");

  static constexpr bool a_ok = slots_ok && Algorithm<A>;
  static_assert(!slots_ok || Algorithm<A>,
                "Trainer: the Algorithm declares AlgorithmKind but does not satisfy "
                "anvil::Algorithm; the notes below name the missing member");
  static constexpr bool b_ok = a_ok && Buffer<B>;
  static_assert(!a_ok || Buffer<B>,
                "Trainer: the Buffer declares BufferKind but does not satisfy anvil::Buffer; the "
                "notes below name the missing member");
  static constexpr bool p_ok = b_ok && Parallelism<P>;
  static_assert(!b_ok || Parallelism<P>,
                "Trainer: the Parallelism policy does not satisfy anvil::Parallelism; the notes "
                "below name the missing member");
  static constexpr bool x_ok = p_ok && Precision<X>;
  static_assert(!p_ok || Precision<X>,
                "Trainer: the Precision policy does not satisfy anvil::Precision; the notes below "
                "name the missing member");

  static constexpr bool a_on = detail::on_policy_of<A>(), b_on = detail::on_policy_of<B>();
  static constexpr bool regime_ok = !x_ok || a_on == b_on;
  static constexpr bool a_episodic = detail::names_episodic_loop<A>();
  static_assert(!x_ok || !a_on || b_on || a_episodic,
                "Trainer: the Algorithm is on-policy (it learns only from fresh rollouts of its "
                "current policy) but the Buffer replays old transitions; use RolloutBuffer");
  static_assert(!x_ok || !a_on || b_on || !a_episodic,
                "Trainer: the Algorithm learns from whole episodes of its current policy (the episodic "
                "loop, e.g. COMA) but the Buffer replays old transitions; use EpisodeBuffer");
  static_assert(!x_ok || a_on || !b_on,
                "Trainer: the Algorithm is off-policy (it samples past transitions at random) but "
                "a RolloutBuffer keeps only the current rollout and clears it; use UniformBuffer "
                "or PrioritizedBuffer");

  static constexpr bool batch_ok = !(x_ok && regime_ok) || detail::batches_match<A, B>();
  static_assert(batch_ok,
                "Trainer: the Buffer's Batch type is not the Batch the Algorithm's update takes; "
                "pick a buffer whose batches the algorithm learns from");

  static constexpr bool device_ok = !(x_ok && regime_ok && batch_ok) ||
                                    !detail::needs_cuda_of<X>() || detail::can_use_cuda_of<P>();
  static_assert(device_ok,
                "Trainer: this Precision autocasts to float16, which needs CUDA, but the "
                "Parallelism policy keeps every tensor on the CPU; use BF16 on CPU");

  static constexpr bool ok = x_ok && regime_ok && batch_ok && device_ok;
};

}  // namespace anvil
