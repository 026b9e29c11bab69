// Demonstrations with images (data/demonstrations.hpp, data/demo_reader.hpp, data/frames.hpp):
// frames transposed and resized to known values; image demos written gzip-compressed read
// back byte for byte, from one thread or several, whole or step by step; files written by
// h5py as robomimic and LIBERO write them (chunks of several frames, gzip with shuffle,
// uncompressed) read the same; h5py opens anvil's; what does not fit is refused naming the
// file, the dataset and (for a filter this HDF5 lacks) the filter.

#include <anvil/data/demo_reader.hpp>  // first: the header under test compiles on its own here
#include <doctest/doctest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <anvil/data/demonstrations.hpp>
#include <anvil/data/frames.hpp>
#include <anvil/data/hdf5.hpp>

#include "../skip.hpp"
#include "../temp_run_dir.hpp"

namespace {

using anvil::Demonstrations;
using anvil::Error;
using anvil::FrameReader;

// Pixel value of frame t, channel k, row y, column x: distinct across all four.
std::uint8_t pixel(int t, int k, int y, int x) { return static_cast<std::uint8_t>((31 * t + 50 * k + 7 * y + 3 * x) % 251); }

/// Two episodes (5 and 3 steps) of an image [3, 8, 6] beside 2 floats, 2-wide actions.
Demonstrations image_demos() {
  Demonstrations d;
  d.env_name = "PushT";
  d.layout.image("agentview_rgb", 3, 8, 6).vector("agent_pos", 2);
  d.obs_dim = d.layout.row_bytes();
  d.act_dim = 2;
  int step = 0;
  for (int e = 0; e < 2; ++e) {
    const int t = e == 0 ? 5 : 3;
    std::vector<std::uint8_t> rows(static_cast<std::size_t>(t * d.obs_dim), 0);
    std::vector<float> a, r;
    std::vector<std::uint8_t> dn;
    for (int i = 0; i < t; ++i, ++step) {
      std::uint8_t* row = rows.data() + i * d.obs_dim;
      for (int k = 0; k < 3; ++k)
        for (int y = 0; y < 8; ++y)
          for (int x = 0; x < 6; ++x) row[(k * 8 + y) * 6 + x] = pixel(step, k, y, x);
      const float pos[2] = {static_cast<float>(step), -0.5f * static_cast<float>(step)};
      std::memcpy(row + d.layout.parts[1].offset, pos, sizeof pos);
      a.insert(a.end(), {static_cast<float>(i), static_cast<float>(e)});
      r.push_back(0.0f);
      dn.push_back(i == t - 1);
    }
    d.add_episode_rows(rows, a, r, dn);
  }
  return d;
}

TEST_CASE("FrameReader: [H, W, C] frames become [C, H, W], resized by area averaging") {
  // 2x3 RGB frame, transposed only.
  std::vector<std::uint8_t> hwc(2 * 3 * 3), chw(hwc.size());
  for (int y = 0; y < 2; ++y)
    for (int x = 0; x < 3; ++x)
      for (int k = 0; k < 3; ++k) hwc[(y * 3 + x) * 3 + k] = static_cast<std::uint8_t>(100 * k + 10 * y + x);
  FrameReader(2, 3, 3).convert(hwc.data(), chw.data());
  for (int k = 0; k < 3; ++k)
    for (int y = 0; y < 2; ++y)
      for (int x = 0; x < 3; ++x) CHECK(chw[(k * 2 + y) * 3 + x] == 100 * k + 10 * y + x);
  std::vector<std::uint8_t> back(hwc.size());
  anvil::frame_to_hwc(chw.data(), 3, 2, 3, back.data());
  CHECK(back == hwc);

  // 4x4 grey to 2x2: each output the mean of its 2x2 block.
  const std::vector<std::uint8_t> g{0, 4, 8, 12, 16, 20, 24, 28, 40, 40, 80, 80, 40, 40, 80, 80};
  std::vector<std::uint8_t> out(4);
  FrameReader(4, 4, 1, 2, 2).convert(g.data(), out.data());
  CHECK(out == std::vector<std::uint8_t>{10, 18, 40, 80});

  // 3 to 2 along a row: output 0 covers source [0, 1.5): (1 * a + 0.5 * b) / 1.5.
  const std::vector<std::uint8_t> row{30, 90, 150};
  std::vector<std::uint8_t> two(2);
  FrameReader(1, 3, 1, 1, 2).convert(row.data(), two.data());
  CHECK(two == std::vector<std::uint8_t>{50, 130});

  // 2 to 4 (enlarging): each output inside one source pixel repeats it.
  const std::vector<std::uint8_t> pair{10, 200};
  std::vector<std::uint8_t> four(4);
  FrameReader(1, 2, 1, 1, 4).convert(pair.data(), four.data());
  CHECK(four == std::vector<std::uint8_t>{10, 10, 200, 200});
}

TEST_CASE("Demonstrations with images: written gzip-compressed, read back byte for byte by 0, 1 or 2 threads, and step by step") {
  const std::filesystem::path dir = temp_run_dir("image_demos");
  std::filesystem::create_directories(dir);
  const auto d = image_demos();
  const std::vector<std::string> keys{"agentview_rgb", "agent_pos"};
  for (const int gzip : {4, 0}) {
    CAPTURE(gzip);
    const auto path = dir / ("demos_" + std::to_string(gzip) + ".hdf5");
    anvil::write_demonstrations(path, d, {gzip});
    {
      const auto f = anvil::h5::File::open(path);
      CHECK(f.shape("data/demo_0/obs/agentview_rgb") == anvil::h5::Shape{5, 8, 6, 3});  // as robomimic stores frames
      const auto st = f.storage("data/demo_0/obs/agentview_rgb");
      CHECK(st.chunked == (gzip > 0));
      if (gzip > 0) CHECK(st.filters == std::vector<int>{1});  // deflate
    }
    for (const int threads : {0, 1, 2}) {
      CAPTURE(threads);
      const auto back = anvil::read_demonstrations(path, anvil::DemoReadOptions{.obs_keys = keys, .threads = threads});
      REQUIRE(back.byte_rows());
      CHECK(back.layout.describe() == "agentview_rgb uint8 [3,8,6], agent_pos float32 [2]");
      CHECK(back.obs_dim == d.obs_dim);
      CHECK(back.rows == d.rows);
      CHECK(back.actions == d.actions);
      CHECK(back.starts == d.starts);
      CHECK(back.env_name == "PushT");
    }
    // Steps in any order, across the two demos.
    // Every key by name when none are chosen (HDF5 lists a group's links by name).
    CHECK(anvil::read_demonstrations(path).layout.describe() == "agent_pos float32 [2], agentview_rgb uint8 [3,8,6]");
    const anvil::DemoReader reader(path, {keys});
    const std::vector<std::int64_t> ids{7, 2, 3, 4, 5, 0};
    std::vector<std::uint8_t> rows(ids.size() * static_cast<std::size_t>(d.obs_dim));
    reader.read(ids, rows.data());
    for (std::size_t i = 0; i < ids.size(); ++i)
      CHECK(std::equal(rows.begin() + static_cast<std::ptrdiff_t>(i) * d.obs_dim, rows.begin() + static_cast<std::ptrdiff_t>(i + 1) * d.obs_dim,
                       d.rows.begin() + ids[i] * d.obs_dim));
    CHECK_THROWS_WITH_AS(reader.read(std::vector<std::int64_t>{8}, rows.data()), doctest::Contains("step 8 is outside the demonstrations' 8"), Error);
  }

  // Resized on read: each frame as FrameReader makes it; the floats untouched.
  const auto path = dir / "demos_4.hdf5";
  const auto small = anvil::read_demonstrations(path, anvil::DemoReadOptions{.obs_keys = keys, .image_height = 4, .image_width = 3, .threads = 2});
  CHECK(small.layout.describe() == "agentview_rgb uint8 [3,4,3], agent_pos float32 [2]");
  const FrameReader fr(8, 6, 3, 4, 3);
  std::vector<std::uint8_t> hwc(8 * 6 * 3), want(3 * 4 * 3);
  for (std::int64_t s = 0; s < 8; ++s) {
    anvil::frame_to_hwc(d.rows.data() + s * d.obs_dim, 3, 8, 6, hwc.data());
    fr.convert(hwc.data(), want.data());
    const std::uint8_t* row = small.rows.data() + s * small.obs_dim;
    CHECK(std::equal(want.begin(), want.end(), row));
    float pos[2];
    std::memcpy(pos, row + small.layout.parts[1].offset, sizeof pos);
    CHECK(pos[0] == static_cast<float>(s));
  }
  CHECK_THROWS_WITH_AS((void)anvil::read_demonstrations(path, anvil::DemoReadOptions{.image_height = 4}), doctest::Contains("give both height and width"),
                       anvil::ConfigError);
  // Only the float part: float rows, as before images.
  const auto floats = anvil::read_demonstrations(path, {"agent_pos"});
  CHECK_FALSE(floats.byte_rows());
  CHECK(floats.obs_dim == 2);
  CHECK(floats.obs[2 * 6] == 6.0f);
}

TEST_CASE("Demonstrations with images: files as h5py writes them for robomimic and LIBERO read the same, and h5py opens anvil's") {
  const std::string python = ANVIL_H5PY_PYTHON;
  if (python.empty()) ANVIL_SKIP("no Python with h5py was found when configuring (Debian: python3-h5py)");
  const std::filesystem::path dir = temp_run_dir("image_demos_h5py");
  std::filesystem::create_directories(dir);
  // Python writes files of one demo of 10 frames [12, 10, 3] beside a 4-wide state: gzip with
  // shuffle in chunks of 4 frames and uncompressed (read with pread, inflated here), LZF (a
  // filter only h5py has), and two the library reads: chunks that split frames, and a
  // checksum filter.
  const auto script = dir / "write.py";
  std::ofstream(script) << "import sys, h5py, numpy as np\n"
                           "t, h, w = 10, 12, 10\n"
                           "tt, yy, xx, kk = np.meshgrid(np.arange(t), np.arange(h), np.arange(w), np.arange(3), indexing='ij')\n"
                           "img = ((31 * tt + 50 * kk + 7 * yy + 3 * xx) % 251).astype(np.uint8)\n"
                           "for name, kw in [('gzip', dict(compression='gzip', compression_opts=6, shuffle=True, chunks=(4, h, w, 3))),\n"
                           "                 ('raw', {}), ('lzf', dict(compression='lzf')),\n"
                           "                 ('tiles', dict(compression='gzip', chunks=(2, 6, 5, 3))),\n"
                           "                 ('fletcher', dict(fletcher32=True, chunks=(1, h, w, 3)))]:\n"
                           "    with h5py.File(sys.argv[1] + '/' + name + '.hdf5', 'w') as f:\n"
                           "        g = f.create_group('data/demo_0')\n"
                           "        g.attrs['num_samples'] = t\n"
                           "        g.create_dataset('obs/eye_in_hand_rgb', data=img, **kw)\n"
                           "        g.create_dataset('obs/joint_states', data=np.arange(t * 4, dtype=np.float64).reshape(t, 4))\n"
                           "        g.create_dataset('actions', data=np.zeros((t, 7), np.float32))\n";
  REQUIRE(std::system((python + " " + script.string() + " " + dir.string()).c_str()) == 0);
  for (const char* name : {"gzip", "raw", "tiles", "fletcher"}) {
    CAPTURE(name);
    const auto d = anvil::read_demonstrations(dir / (std::string(name) + ".hdf5"), anvil::DemoReadOptions{.threads = 2});
    REQUIRE(d.layout.describe() == "eye_in_hand_rgb uint8 [3,12,10], joint_states float32 [4]");
    CHECK(d.act_dim == 7);
    int wrong = 0;
    for (int t = 0; t < 10; ++t) {
      const std::uint8_t* row = d.rows.data() + t * d.obs_dim;
      for (int k = 0; k < 3; ++k)
        for (int y = 0; y < 12; ++y)
          for (int x = 0; x < 10; ++x) wrong += row[(k * 12 + y) * 10 + x] != pixel(t, k, y, x);
      float js[4];
      std::memcpy(js, row + d.layout.parts[1].offset, sizeof js);
      wrong += js[3] != static_cast<float>(4 * t + 3);
    }
    CHECK(wrong == 0);
  }
  CHECK_THROWS_WITH_AS((void)anvil::read_demonstrations(dir / "lzf.hdf5"),
                       doctest::Contains("data/demo_0/obs/eye_in_hand_rgb: is compressed with HDF5 filter 32000 (LZF, h5py's own), which this HDF5 library does not have"),
                       Error);

  // A damaged chunk: its bytes overwritten in the file.
  {
    const auto bad = dir / "damaged.hdf5";
    std::filesystem::copy_file(dir / "gzip.hdf5", bad);
    const auto table = anvil::h5::File::open(bad).chunk_table("data/demo_0/obs/eye_in_hand_rgb", 4);
    REQUIRE(table.size() == 3);
    REQUIRE(table[1].offset > 0);
    std::fstream io(bad, std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(table[1].offset);
    const std::string junk(static_cast<std::size_t>(table[1].bytes), 'x');
    io.write(junk.data(), static_cast<std::streamsize>(junk.size()));
    io.close();
    CHECK_THROWS_WITH_AS((void)anvil::read_demonstrations(bad),
                         doctest::Contains("data/demo_0/obs/eye_in_hand_rgb: the chunk at row 4 does not inflate to 1440 bytes (damaged file?)"), Error);
  }

  // h5py reads anvil's image demonstrations: [T, H, W, C] uint8, gzip, the same bytes.
  const auto path = dir / "anvil.hdf5";
  anvil::write_demonstrations(path, image_demos());
  const auto check = dir / "check.py";
  std::ofstream(check) << "import sys, h5py, numpy as np\n"
                          "f = h5py.File(sys.argv[1], 'r')\n"
                          "img = f['data/demo_1/obs/agentview_rgb']\n"
                          "assert img.shape == (3, 8, 6, 3) and img.dtype == np.uint8 and img.compression == 'gzip', (img.shape, img.dtype, img.compression)\n"
                          "t, y, x, k = np.meshgrid(np.arange(5, 8), np.arange(8), np.arange(6), np.arange(3), indexing='ij')\n"
                          "assert (img[:] == (31 * t + 50 * k + 7 * y + 3 * x) % 251).all()\n"
                          "assert f['data/demo_1/obs/agent_pos'][2, 0] == 7.0\n";
  CHECK(std::system((python + " " + check.string() + " " + path.string()).c_str()) == 0);
}

TEST_CASE("Demonstrations with images: what does not fit is refused, naming the file and the dataset") {
  const std::filesystem::path dir = temp_run_dir("image_demos_bad");
  std::filesystem::create_directories(dir);
  const auto p = dir / "bad.hdf5";
  const auto write = [&](std::int64_t h1, std::int64_t c1, std::int64_t rows1) {
    anvil::h5::H5Writer w(p);
    w.group("data");
    for (int e = 0; e < 2; ++e) {
      const std::string g = "data/demo_" + std::to_string(e);
      const std::int64_t h = e ? h1 : 4, c = e ? c1 : 3, t = e ? rows1 : 2;
      w.group(g);
      w.group(g + "/obs");
      w.dataset(g + "/obs/rgb", {t, h, 4, c}, std::vector<std::uint8_t>(static_cast<std::size_t>(t * h * 4 * c), 9));
      w.dataset(g + "/actions", {2, 1}, std::vector<float>{0, 0});
    }
    w.commit();
  };
  write(4, 3, 2);
  CHECK(anvil::read_demonstrations(p).rows.size() == 4 * 48);
  write(5, 3, 2);  // the second demo's frames are taller
  CHECK_THROWS_WITH_AS((void)anvil::read_demonstrations(p),
                       (p.string() + ": data/demo_1/obs/rgb: holds images [5, 4, 3]; the first demo's 'rgb' are images [4, 4, 3]").c_str(), Error);
  write(4, 6, 2);  // six channels: not an image, and too many dimensions for numbers
  CHECK_THROWS_WITH_AS((void)anvil::read_demonstrations(p), doctest::Contains("data/demo_1/obs/rgb: has shape [2, 4, 4, 6]; expected"), Error);
  write(4, 3, 3);  // one frame more than actions
  CHECK_THROWS_WITH_AS((void)anvil::read_demonstrations(p), doctest::Contains("data/demo_1/obs/rgb: has 3 rows but data/demo_1/actions has 2"), Error);
}

}  // namespace
