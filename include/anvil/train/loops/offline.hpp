#pragma once
/// @file
/// `OfflineLoop`: learning from data already stored, without stepping the envs: each
/// iteration is one gradient update on a batch sampled from the buffer, and the clock
/// counts gradient updates (`train.steps`, `train.eval_interval`, `run.log_interval` and
/// `run.checkpoint_interval` are in updates). The data is a buffer file
/// (`train.dataset`: the `checkpoint-*.buffer` a run with `run.checkpoint_buffer` writes
/// beside each checkpoint) or, in a `Staged` run, what the stages before left in the
/// buffer. Evaluations still run episodes on the envs.
///
/// A resumed offline run continues its sampling exactly where it stopped only when the
/// checkpoint saved the buffer too (`run.checkpoint_buffer`), since the sampling state
/// lives in the buffer; otherwise it samples the dataset afresh. A buffer that reads
/// demonstrations (`DemoDataset`: `train.dataset` is an HDF5 file) keeps only its position
/// in checkpoints, so such runs always resume exactly. Algorithms that learn from windows of
/// steps (`sequence()`), normalise by the data's ranges (`fit_normalizer`) or schedule their
/// learning rate over the run (`plan_updates`) are told so before the first update. A
/// buffer that also replays online steps (`CollectiveReplay`) hands out its dataset's
/// batches here (`sample_dataset`), with the algorithm's `dataset_batch_size()` rows.

#include <cstdint>
#include <filesystem>
#include <string>
#include <tuple>

#include <anvil/core/batch.hpp>
#include <anvil/core/concepts.hpp>
#include <anvil/core/error.hpp>
#include <anvil/core/param.hpp>
#include <anvil/core/state.hpp>
#include <anvil/train/loops/loop.hpp>
#include <anvil/train/loops/loop_config.hpp>
#include <anvil/train/loops/stage.hpp>

namespace anvil {

/// A buffer that keeps its dataset apart from what it replays online (CollectiveReplay in a
/// staged run): the offline loop samples the dataset alone (`sample_dataset`, `dataset_size`).
template <class B>
concept KeepsDatasetApart = requires(B& b, const B& cb, std::int64_t n) {
  b.sample_dataset(n);
  { cb.dataset_size() } -> std::convertible_to<std::int64_t>;
};
/// An algorithm whose dataset batches count other rows than `batch_size()` does.
template <class A>
concept NamesDatasetBatch = requires(const A& a) {
  { a.dataset_batch_size() } -> std::convertible_to<std::int64_t>;
};
/// An algorithm that learns from windows of consecutive steps: `sequence()` gives the
/// observations and actions each window holds, which the buffer plans for.
template <class A>
concept LearnsFromSequences = requires(const A& a) {
  { a.sequence() } -> std::convertible_to<std::pair<std::int64_t, std::int64_t>>;
};
/// An algorithm that scales its inputs by the data's ranges (`fit_normalizer`), learned once
/// from the buffer's `ranges()` before its first update unless a checkpoint restored them.
template <class A, class B>
concept FitsDataNormalizer = requires(A& a, B& b) {
  a.fit_normalizer(b.ranges()[0], b.ranges()[1], b.ranges()[2], b.ranges()[3]);
  { a.has_normalizer() } -> std::convertible_to<bool>;
};
/// An algorithm that schedules by the run's length (e.g. a cosine learning rate): told the
/// update the stage ends at.
template <class A>
concept PlansUpdates = requires(A& a) { a.plan_updates(std::int64_t{0}); };

/// Loop policy for learning from stored data (see file comment).
struct OfflineLoop : loops::LoopTag<"offline", "offline", loops::OfflineConfig, ClockUnit::updates> {
  /// A batch of the dataset: `sample_dataset(n)` where the buffer also replays online
  /// steps (CollectiveReplay, for a staged run), else `sample(n)`.
  template <class B>
  static auto dataset_batch(B& b, std::int64_t n) {
    if constexpr (KeepsDatasetApart<B>) return b.sample_dataset(n);
    else return b.sample(n);
  }
  template <class B>
  static std::int64_t dataset_size(const B& b) {
    if constexpr (KeepsDatasetApart<B>) return b.dataset_size();
    else return b.size();
  }
  template <class A>
  static std::int64_t batch_rows(const A& a) {
    if constexpr (NamesDatasetBatch<A>) return a.dataset_batch_size();
    else return a.batch_size();
  }

  /// Runs the loop (see file comment).
  template <class A, class B>
  class Runner : public loops::Stage<Runner<A, B>, OfflineLoop, A, B> {
    using Runner::Stage::Stage, Runner::Stage::cfg_, Runner::Stage::p_, Runner::Stage::origin_;

   public:
    /// At the stage's start and after a resume: the buffer learns the plan, and the dataset
    /// is read (once, when the run is built; a resume that restores a saved buffer replaces it).
    void prepare() {
      p_.collector.envs().set_discount(p_.algorithm.discount());
      StoragePlan plan{p_.collector.num_envs(), 0, p_.algorithm.discount()};
      if constexpr (LearnsFromSequences<A>) std::tie(plan.sequence_obs, plan.sequence_actions) = p_.algorithm.sequence();
      p_.buffer.plan(plan);
      if (!loaded_ && !cfg_.dataset->empty()) {
        if (!std::filesystem::exists(*cfg_.dataset))
          throw ConfigError("train.dataset: no file at '" + *cfg_.dataset + "'");
        if constexpr (ReadsDemonstrations<B>) {
          p_.buffer.load(*cfg_.dataset);  // demonstrations in their own format (HDF5)
        } else {
          StateSections data;
          data.add(std::string(B::config_section.view()), p_.buffer);
          BinaryReader r(*cfg_.dataset, kBufferFileFormat);
          auto apply = data.read(r);
          r.finish();
          apply();
        }
      }
      loaded_ = true;
      // An algorithm that scales its inputs by the data's ranges learns them once, before its
      // first update (a restored one keeps its checkpoint's).
      if constexpr (FitsDataNormalizer<A, B>)
        if (!p_.algorithm.has_normalizer() && dataset_size(p_.buffer) > 0) {
          const auto r = p_.buffer.ranges();
          p_.algorithm.fit_normalizer(r[0], r[1], r[2], r[3]);
        }
      if constexpr (PlansUpdates<A>) p_.algorithm.plan_updates(origin_ + cfg_.steps);
    }

    /// One iteration: one update on a batch sampled from the buffer.
    void iterate(std::int64_t /*quiet_until*/ = INT64_MAX) {
      const std::int64_t n = batch_rows(p_.algorithm);
      if (dataset_size(p_.buffer) < n)
        throw ConfigError("train.dataset: the buffer holds " + std::to_string(dataset_size(p_.buffer)) +
                          " transitions, fewer than one batch (" + std::string(A::config_section.view()) +
                          ".batch_size = " + std::to_string(n) + "); give a buffer file with more");
      decltype(dataset_batch(p_.buffer, n)) batch;
      {
        ScopedPhase ph(p_.times, Phase::sample);
        batch = dataset_batch(p_.buffer, n);
      }
      const auto info = loops::update_once(p_, batch, cfg_.update->ema_decay);
      if constexpr (PrioritizedReplay<B>)
        if (info.td_error.defined()) p_.buffer.update_priorities(batch.index, info.td_error);
    }

    void at_log_row() {}  // no env steps: no new normaliser statistics

    /// What the timing verdict suggests, in this loop's knobs and its algorithm's: an offline
    /// run is meant to spend its time in updates.
    [[nodiscard]] BottleneckAdvice advice(const AdviceKeys& k) const {
      const std::string batch = k.find("batch_size");
      BottleneckAdvice a;
      a.learn = "as an offline run should; add ranks to go faster";
      a.comm = loops::either(batch.empty() ? "" : "a larger " + batch + " (fewer all-reduces per sample)", " or ", "fewer ranks");
      a.sample = batch.empty() ? "" : "a larger " + batch + " (fewer, larger draws from the dataset)";
      a.side = loops::side_advice(k);
      return a;
    }

   private:
    bool loaded_ = false;
  };

  /// What this loop needs of the algorithm and the buffer, one sentence each (see loops/loop.hpp).
  template <class A, class B>
  static constexpr bool rules() {
    ANVIL_LOOP_RULE(OffPolicyAlgorithm<A>,
                    "offline loop samples batch_size() stored transitions per update; the Algorithm lacks "
                    "batch_size() or discount() (see anvil::OffPolicyAlgorithm)")
    ANVIL_LOOP_RULE(LoadsDataset<B>,
                    "offline loop samples random batches from data it loads from a file; the Buffer lacks "
                    "sample(n) or load(path) (see anvil::LoadsDataset)")
    ANVIL_LOOP_RULE((requires(A& a, B& b, StepContext& c) { a.update(dataset_batch(b, 1), c); }),
                    "offline loop hands the Algorithm the Buffer's batches (sample_dataset(n) where the "
                    "Buffer also replays, else sample(n)), but the Algorithm has no update for them")
    return true;
  }
};

}  // namespace anvil
