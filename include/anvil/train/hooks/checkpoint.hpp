#pragma once
/// @file
/// `Checkpoints`: a run's state on disk. A checkpoint is `checkpoint-<step, 12 digits>.ckpt`
/// in the run directory (names sort by step): a header naming the run that wrote it (its
/// algorithm, precision and every config field), then every section of the run's state
/// (core/state.hpp), then a checksum. With `run.checkpoint_buffer` the buffer goes beside it
/// in `checkpoint-<step>.buffer`, written first, so a checkpoint never names a buffer file
/// that is not there. Both are replaced atomically: a crash or a kill mid-save leaves the
/// previous checkpoint intact. The oldest beyond `run.keep_last` are deleted.
///
/// Reading checks the header against this run (the error names the first config field that
/// differs; `run.*` but `run.seed`, `parallel.*` and a loop's `steps`, `eval_interval` and
/// `eval_episodes` may differ), then reads every section and the buffer file, then the
/// checksums, and changes nothing until all of it has passed. Not a template.

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <anvil/core/binary_io.hpp>
#include <anvil/core/error.hpp>
#include <anvil/core/state.hpp>

namespace anvil {

/// A run's checkpoints (see file comment).
class Checkpoints {
 public:
  /// The format tag of checkpoint files.
  static constexpr const char* kFormat = "anvil Checkpoint v2";

  /// What a checkpoint says about the run that wrote it.
  struct Identity {
    std::string algorithm;  ///< the algorithm's config section, e.g. "sac"
    std::string precision;  ///< e.g. "fp32"
    std::string config_hash;
    std::vector<std::pair<std::string, std::string>> config;  ///< every field, `key = value`
    std::vector<std::string> acting_keys;  ///< fields that change only how the policy acts (`FieldRole::acting`)
  };
  struct Options {
    std::filesystem::path dir;  ///< where `save_at` writes (the run directory)
    int keep_last = 3;          ///< checkpoints kept by `save_at`
    bool with_buffer = false;   ///< also write the buffer beside each checkpoint
  };

  Checkpoints() = default;
  /// Checkpoints of the run `id` whose state is `state` and whose buffer is `buffer` (both
  /// must outlive this object).
  Checkpoints(Options o, Identity id, const StateSections& state, const StateSections& buffer)
      : opt_(std::move(o)), id_(std::move(id)), state_(&state), buffer_(&buffer) {}

  /// Writes a checkpoint to `file` (and the buffer beside it with `with_buffer`).
  [[gnu::cold, gnu::noinline]] void save(const std::filesystem::path& file) const {
    if (opt_.with_buffer) {
      BinaryWriter b(buffer_file(file), kBufferFileFormat);
      buffer_->write(b);
      b.commit();
    }
    BinaryWriter w(file, kFormat);
    w.string(id_.algorithm);
    w.string(id_.precision);
    w.string(id_.config_hash);
    w.value(static_cast<std::uint64_t>(id_.config.size()));
    for (const auto& [k, v] : id_.config) {
      w.string(k);
      w.string(v);
    }
    w.value(opt_.with_buffer);
    state_->write(w);
    w.commit();
  }

  /// A checkpoint at clock value `step` in the run directory; then the oldest beyond
  /// `keep_last` (and their buffers) are deleted. Returns its path.
  [[gnu::cold, gnu::noinline]] std::filesystem::path save_at(std::int64_t step) const {
    const auto file = file_for(step);
    save(file);
    auto all = in(opt_.dir);
    for (std::size_t i = 0; i + static_cast<std::size_t>(opt_.keep_last) < all.size(); ++i) {
      std::error_code ec;
      std::filesystem::remove(all[i], ec);
      std::filesystem::remove(buffer_file(all[i]), ec);
    }
    return file;
  }

  /// Reads and checks `file` (and its buffer file when it has one) against this run (see
  /// file comment); the returned function applies it.
  [[gnu::cold, gnu::noinline]] [[nodiscard]] StateSections::Apply read(const std::filesystem::path& file) const {
    if (!std::filesystem::exists(file)) throw Error("run.resume: no checkpoint at '" + file.string() + "'");
    BinaryReader r(file, kFormat);
    const auto algorithm = r.string("algorithm");
    if (algorithm != id_.algorithm)
      throw Error("'" + file.string() + "' was written by a " + algorithm + " run; this run is " + id_.algorithm);
    const auto precision = r.string("precision");
    if (precision != id_.precision)
      throw Error("'" + file.string() + "' was written by a run in " + precision + " precision; this run is " +
                  id_.precision + " (resume needs the same precision)");
    (void)r.string("config hash");  // for people and tools reading the file; the fields are compared below
    const auto n = r.value<std::uint64_t>("config");
    if (n > 100'000) r.fail("config", "has an implausible number of fields");
    std::map<std::string, std::string> saved;
    for (std::uint64_t i = 0; i < n; ++i) {
      auto k = r.string("config key");
      saved[k] = r.string("config value");
    }
    for (const auto& [k, v] : id_.config) {
      if (may_differ(k) || std::ranges::find(id_.acting_keys, k) != id_.acting_keys.end()) continue;
      if (auto it = saved.find(k); it != saved.end() && it->second != v)
        throw Error("'" + file.string() + "' was written by a run with " + k + " = " + it->second + "; this run has " +
                    k + " = " + v +
                    " (a resumed run needs the same algorithm, networks, buffer, envs and precision)");
    }
    const bool with_buffer = r.value<bool>("buffer flag");
    auto apply = state_->read(r);
    r.finish();
    StateSections::Apply apply_buffer;
    if (with_buffer) {
      const auto bfile = buffer_file(file);
      if (!std::filesystem::exists(bfile))
        throw Error("'" + file.string() + "' was saved with its buffer, but '" + bfile.string() + "' is missing");
      BinaryReader b(bfile, kBufferFileFormat);
      apply_buffer = buffer_->read(b);
      b.finish();
    }
    return [apply = std::move(apply), apply_buffer = std::move(apply_buffer)] {
      apply();
      if (apply_buffer) apply_buffer();
    };
  }

  /// What `file` says of the run that wrote it, from its header alone (e.g. the precision an
  /// evaluation of the run must use); an Error naming the file when it is not a checkpoint.
  [[nodiscard]] static Identity identity(const std::filesystem::path& file) {
    if (!std::filesystem::exists(file)) throw Error("no checkpoint at '" + file.string() + "'");
    BinaryReader r(file, kFormat);
    Identity id;
    id.algorithm = r.string("algorithm");
    id.precision = r.string("precision");
    id.config_hash = r.string("config hash");
    const auto n = r.value<std::uint64_t>("config");
    if (n > 100'000) r.fail("config", "has an implausible number of fields");
    for (std::uint64_t i = 0; i < n; ++i) {
      auto k = r.string("config key");
      id.config.emplace_back(std::move(k), r.string("config value"));
    }
    return id;
  }
  /// The latest checkpoint in `dir` (empty when it holds none).
  [[nodiscard]] static std::filesystem::path latest(const std::filesystem::path& dir) {
    const auto all = in(dir);
    return all.empty() ? std::filesystem::path() : all.back();
  }

  /// The checkpoint `run.resume` names: a path as it is, or "auto": the latest in the run
  /// directory (empty when there is none).
  [[nodiscard]] std::filesystem::path resolve(const std::string& resume) const {
    return resume == "auto" ? latest(opt_.dir) : std::filesystem::path(resume);
  }

  /// The checkpoint file for clock value `step` in the run directory.
  [[nodiscard]] std::filesystem::path file_for(std::int64_t step) const {
    char name[64];
    std::snprintf(name, sizeof name, "checkpoint-%012lld.ckpt", static_cast<long long>(step));
    return opt_.dir / name;
  }
  /// The checkpoints in `dir`, oldest first.
  [[nodiscard]] static std::vector<std::filesystem::path> in(const std::filesystem::path& dir) {
    std::vector<std::filesystem::path> found;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
      const auto name = e.path().filename().string();
      if (name.rfind("checkpoint-", 0) == 0 && e.path().extension() == ".ckpt") found.push_back(e.path());
    }
    std::sort(found.begin(), found.end());
    return found;
  }
  /// The buffer file beside `checkpoint`.
  [[nodiscard]] static std::filesystem::path buffer_file(std::filesystem::path checkpoint) {
    return checkpoint.replace_extension(".buffer");
  }
  [[nodiscard]] const Options& options() const noexcept { return opt_; }
  /// Where `save_at` writes and `resolve("auto")` looks (the run directory, once known).
  void set_dir(std::filesystem::path dir) { opt_.dir = std::move(dir); }

 private:
  // Fields a resumed run may change, besides the acting ones (`FieldRole::acting`): where and
  // how it runs, and how long and how often it evaluates (a loop's own `steps`,
  // `eval_interval`, `eval_episodes`, at any depth).
  static bool may_differ(const std::string& key) {
    if (key == "run.seed") return false;  // another seed is another run
    if (key.rfind("run.", 0) == 0 || key.rfind("parallel.", 0) == 0 || key.rfind("init.", 0) == 0) return true;
    if (key.rfind("train.", 0) != 0) return false;
    const auto leaf = key.substr(key.rfind('.') + 1);
    return leaf == "steps" || leaf == "eval_interval" || leaf == "eval_episodes";
  }

  Options opt_;
  Identity id_;
  const StateSections* state_ = nullptr;
  const StateSections* buffer_ = nullptr;
};

}  // namespace anvil
