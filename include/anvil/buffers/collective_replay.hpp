#pragma once
/// @file
/// `CollectiveReplay`: the storage of a staged distill-then-student run
/// (`Staged<OfflineLoop, OffPolicyLoop>` with `CollectiveStudent`): a collective dataset
/// (`CollectiveDataset`, read in the first stage through `sample_dataset`) and a replay
/// buffer (`UniformBuffer`, filled and sampled in the second). Both are in every checkpoint:
/// the dataset's loader position and the replay's transitions. Needs `anvil::hdf5`.

#include <array>
#include <cstdint>
#include <filesystem>

#include <anvil/buffers/collective_dataset.hpp>
#include <anvil/buffers/uniform_buffer.hpp>
#include <anvil/core/batch.hpp>
#include <anvil/core/concepts.hpp>
#include <anvil/core/context.hpp>
#include <anvil/core/param.hpp>
#include <anvil/core/spaces.hpp>
#include <anvil/core/state.hpp>

namespace anvil {

class CollectiveReplay : public BufferPolicy<"collective_replay", ReplayBatch, StepBatch> {
 public:
  static constexpr bool reads_demonstrations = true;  ///< the offline stage calls load(train.offline.dataset)

  struct Config {
    Section<"dataset", CollectiveDataset::Config> dataset;
    Section<"replay", UniformBuffer::Config> replay;
  };

  CollectiveReplay(const EnvSpec& spec, const Config& cfg, const RunContext& ctx) : dataset_(spec, *cfg.dataset, ctx), replay_(spec, *cfg.replay, ctx) {}

  void plan(const StoragePlan& p) {
    dataset_.plan(p);
    replay_.plan(p);
  }
  void load(const std::filesystem::path& path) { dataset_.load(path); }
  void add(const StepBatch& s) { replay_.add(s); }
  ReplayBatch sample(std::int64_t n) { return replay_.sample(n); }
  CollectiveBatch sample_dataset(std::int64_t n) { return dataset_.sample(n); }
  [[nodiscard]] std::int64_t dataset_size() const noexcept { return dataset_.size(); }
  /// The dataset's state ranges (for the collective's normaliser).
  [[nodiscard]] std::array<at::Tensor, 4> ranges() const { return dataset_.ranges(); }
  [[nodiscard]] std::int64_t size() const noexcept { return replay_.size(); }
  [[nodiscard]] std::int64_t capacity() const noexcept { return replay_.capacity(); }
  [[nodiscard]] CollectiveDataset& dataset() noexcept { return dataset_; }
  [[nodiscard]] UniformBuffer& replay() noexcept { return replay_; }

  struct Saved {
    CollectiveDataset::Saved dataset;
    UniformBuffer::Saved replay;
  };
  void save(BinaryWriter& w) const {
    dataset_.save(w);
    replay_.save(w);
  }
  [[nodiscard]] Saved read(BinaryReader& r) const { return {dataset_.read(r), replay_.read(r)}; }
  void restore(Saved&& s) {
    dataset_.restore(s.dataset);
    replay_.restore(std::move(s.replay));
  }

 private:
  CollectiveDataset dataset_;
  UniformBuffer replay_;
};

static_assert(ReplayBuffer<CollectiveReplay>);

}  // namespace anvil
