// Image demonstrations on disk (data/demo_reader.hpp): images/s read from an HDF5 file in
// robomimic's layout, by 0, 1 and 2 threads.
//
// The demonstrations are Push-T's field drawn at bench.size x bench.size RGB (the paper's
// image variant) along random walks of the pusher, beside agent_pos, written twice: gzip
// level 4 in chunks of one frame (what `diffusion_pusht --env.observation=image`
// writes, and what h5py's compression="gzip" gives) and raw (contiguous, as LIBERO's files
// are). Figures, each the median of interleaved rounds:
//  - image_demos_bytes_per_frame: the file's bytes per frame, each storage;
//  - image_demos_read_images_per_s: a whole file read into memory (read_demonstrations),
//    threads 0 (the calling thread), 1, 2, with and without resizing to bench.resize;
//  - image_demos_loader_images_per_s: a DataLoader handing out batches of bench.batch
//    windows of bench.sequence frames in a shuffled order, read from the file on demand
//    (DemoReader::read) by 0, 1 or 2 worker threads.
#include <anvil/data/loader.hpp>  // first: the header compiles on its own here (tests/CMakeLists.txt)
#include "bench_common.hpp"

#include <filesystem>
#include <unistd.h>

#include <anvil/core/random.hpp>
#include <anvil/data/demo_reader.hpp>
#include <anvil/data/demonstrations.hpp>
#include <anvil/envs/chipmunk/push_t.hpp>
#include <anvil/envs/chipmunk/push_t_view.hpp>

struct BenchConfig {
  anvil::Param<double, "seconds", "seconds per timed repeat", anvil::positive> seconds{2.0};
  anvil::Param<int, "rounds", "interleaved rounds over the settings", anvil::at_least(1)> rounds{3};
  anvil::Param<int, "demos", "demonstrations in the file", anvil::at_least(1)> demos{20};
  anvil::Param<int, "steps", "steps per demonstration", anvil::at_least(2)> steps{150};
  anvil::Param<int, "size", "image height and width", anvil::at_least(8)> size{96};
  anvil::Param<int, "resize", "the size images are resized to on read, in the resizing figure", anvil::at_least(8)> resize{84};
  anvil::Param<int, "batch", "windows per loader batch", anvil::at_least(1)> batch{64};
  anvil::Param<int, "sequence", "frames per window (Diffusion Policy's obs_horizon)", anvil::at_least(1)> sequence{2};
  anvil::Param<int, "threads", "torch intra-op threads (0: torch's default)", anvil::at_least(0)> threads{1};
};
struct Config {
  anvil::Section<"bench", BenchConfig> bench;
};

namespace {

using anvil::envs::chipmunk::PushT;

anvil::Demonstrations record(const BenchConfig& b) {
  anvil::Demonstrations d;
  d.env_name = std::string(PushT::name);
  d.act_dim = 2;
  d.layout = anvil::envs::chipmunk::push_t_image_layout(*b.size);
  d.obs_dim = d.layout.row_bytes();
  auto canvas = anvil::envs::chipmunk::push_t_canvas(*b.size);
  anvil::Rng rng(3);
  PushT env;
  for (int e = 0; e < b.demos; ++e) {
    env.reset(static_cast<std::uint64_t>(e));
    std::vector<std::uint8_t> rows;
    std::vector<float> a, r;
    std::vector<std::uint8_t> dn;
    const auto st = env.state();
    std::array<float, 2> target{static_cast<float>(st.agent_x), static_cast<float>(st.agent_y)};
    for (int t = 0; t < b.steps; ++t) {
      rows.resize(rows.size() + static_cast<std::size_t>(d.obs_dim), 0);
      anvil::envs::chipmunk::push_t_image_row(canvas, env, rows.data() + rows.size() - d.obs_dim);
      for (auto& x : target) x = std::clamp(x + static_cast<float>(rng.uniform(-20, 20)), 0.0f, static_cast<float>(PushT::kField));
      env.step(target);
      a.insert(a.end(), target.begin(), target.end());
      r.push_back(0.0f);
      dn.push_back(t == b.steps - 1);
    }
    d.add_episode_rows(rows, a, r, dn);
  }
  return d;
}

}  // namespace

int main(int argc, char** argv) {
  const auto cfg = bench::start<Config>(argc, argv);
  const auto& b = *cfg.bench;
  const auto dir = std::filesystem::temp_directory_path() / ("anvil_bench_image_demos_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto demos = record(b);
  const std::int64_t frames = demos.steps();
  const std::string image = "3x" + std::to_string(*b.size) + "x" + std::to_string(*b.size);
  struct Storage {
    std::string name;
    int gzip;
    std::filesystem::path path;
  };
  std::vector<Storage> storages{{"gzip4_chunk1", 4, dir / "gzip.hdf5"}, {"raw_contiguous", 0, dir / "raw.hdf5"}};
  for (const auto& s : storages) {
    anvil::write_demonstrations(s.path, demos, {s.gzip});
    bench::emit("image_demos_bytes_per_frame", static_cast<double>(std::filesystem::file_size(s.path)) / static_cast<double>(frames), "bytes",
                {{"storage", s.name}, {"image", image}, {"frames", static_cast<long>(frames)}, {"raw_bytes_per_frame", static_cast<long>(3 * *b.size * *b.size)}});
  }
  const std::vector<std::string> keys{"image", "agent_pos"};

  // Whole files into memory, interleaved rounds.
  struct Read {
    const Storage* storage;
    int threads, resize;
    std::vector<double> rates;
  };
  std::vector<Read> reads;
  for (const auto& s : storages)
    for (const int t : {0, 1, 2})
      for (const int rs : {0, *b.resize}) reads.push_back({&s, t, rs, {}});
  // Loader batches, read on demand.
  struct Load {
    const Storage* storage;
    int workers;
    std::vector<double> rates;
  };
  std::vector<Load> loads;
  for (const auto& s : storages)
    for (const int w : {0, 1, 2}) loads.push_back({&s, w, {}});

  for (int round = 0; round < b.rounds; ++round) {
    for (auto& r : reads) {
      const anvil::DemoReadOptions o{keys, r.resize, r.resize, r.threads};
      const double calls = bench::median_rate([&] { (void)anvil::read_demonstrations(r.storage->path, o); }, b.seconds, 1, round ? 0 : 1);
      r.rates.push_back(calls * static_cast<double>(frames));
    }
    for (auto& l : loads) {
      const anvil::DemoReader reader(l.storage->path, {keys});
      // Windows of `sequence` frames inside one demonstration.
      std::vector<std::int64_t> starts;
      for (std::int64_t e = 0; e < demos.episodes(); ++e)
        for (std::int64_t t = demos.starts[static_cast<std::size_t>(e)]; t + b.sequence <= demos.starts[static_cast<std::size_t>(e + 1)]; ++t)
          starts.push_back(t);
      anvil::DataLoader::Options lo;
      lo.batch = b.batch;
      lo.sequence = b.sequence;
      lo.workers = l.workers;
      lo.prefetch = 4;
      lo.seed = static_cast<std::uint64_t>(round);
      const std::int64_t rb = reader.row_bytes();
      anvil::DataLoader loader(
          starts,
          [&reader, rb](std::span<const std::int64_t> ids, std::vector<at::Tensor>& fields, const at::TensorOptions&) {
            auto rows = at::empty({static_cast<std::int64_t>(ids.size()), rb}, at::TensorOptions().dtype(at::kByte));
            reader.read(ids, rows.data_ptr<std::uint8_t>());
            fields = {rows};
          },
          lo);
      const double batches = bench::median_rate([&] { (void)loader.next(); }, b.seconds, 1, round ? 2 : 4);
      l.rates.push_back(batches * static_cast<double>(b.batch * b.sequence));
    }
  }
  for (const auto& r : reads)
    bench::emit("image_demos_read_images_per_s", bench::median(r.rates), "images/s",
                {{"storage", r.storage->name}, {"threads", r.threads}, {"image", image},
                 {"resize", r.resize ? std::to_string(r.resize) + "x" + std::to_string(r.resize) : std::string("none")},
                 {"frames", static_cast<long>(frames)}, {"rounds", *b.rounds}});
  for (const auto& l : loads)
    bench::emit("image_demos_loader_images_per_s", bench::median(l.rates), "images/s",
                {{"storage", l.storage->name}, {"workers", l.workers}, {"image", image}, {"batch", *b.batch}, {"sequence", *b.sequence},
                 {"frames", static_cast<long>(frames)}, {"rounds", *b.rounds}});
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return 0;
}
