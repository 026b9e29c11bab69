// Image encoders (nn/image_encoders.hpp, nn/resnet18_gn.hpp), spatial softmax and image
// augmentation: parameter counts against the published architectures, output shapes, the
// keypoint of a known map, uint8 pixels against the same floats, gradients under FP32 and
// BF16 autocast, clones that do not alias, and each augmentation against the windows it
// should cut.
#include <anvil/nn/image_encoders.hpp>  // first: the header under test compiles on its own here
#include <doctest/doctest.h>

#include <torch/nn/modules/batchnorm.h>
#include <torch/types.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>

#include <anvil/core/autocast.hpp>
#include <anvil/nn/image_augment.hpp>
#include <anvil/nn/resnet18_gn.hpp>

using namespace anvil;

namespace {

std::int64_t count(const torch::nn::Module& m) {
  std::int64_t n = 0;
  for (const auto& p : m.parameters()) n += p.numel();
  return n;
}

at::Tensor pixels(std::int64_t b, std::int64_t c, std::int64_t h, std::int64_t w, std::uint64_t seed) {
  auto g = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randint(256, {b, c, h, w}, g, at::TensorOptions().dtype(at::kByte));
}

// Every parameter received a finite gradient, and at least one a non-zero one.
void check_gradients(torch::nn::Module& m) {
  double total = 0;
  for (const auto& p : m.parameters()) {
    REQUIRE(p.grad().defined());
    CHECK(at::isfinite(p.grad()).all().item<bool>());
    total += p.grad().abs().sum().item<double>();
  }
  CHECK(total > 0);
}

}  // namespace

TEST_CASE("NatureCnn: DQN's layers (1,684,128 parameters at 4x84x84) and 512 features") {
  torch::manual_seed(0);
  nn::NatureCnn net(nn::ImageShape{4, 84, 84});
  // conv 4->32 8x8: 8,224; 32->64 4x4: 32,832; 64->64 3x3: 36,928; 3136->512: 1,606,144.
  CHECK(count(*net) == 1684128);
  const auto y = net->forward(pixels(5, 4, 84, 84, 1));
  CHECK((y.sizes() == at::IntArrayRef{5, 512}));
  CHECK((y >= 0).all().item<bool>());  // ReLU features
  CHECK_THROWS_WITH_AS(nn::NatureCnn(nn::ImageShape{3, 32, 32}), doctest::Contains("too small"), ConfigError);
}

TEST_CASE("ResNet18Gn: ResNet-18's trunk (11,176,512 parameters), GroupNorm of 16 channels, a 3x3 map at 84x84") {
  torch::manual_seed(0);
  nn::ResNet18Gn net(nn::ImageShape{3, 84, 84});
  std::int64_t trunk = count(*net->stem) + count(*net->stem_norm);
  for (const auto& b : net->blocks) trunk += count(*b);
  CHECK(trunk == 11176512);  // ResNet-18's 11,689,512 less its 1000-class layer (513,000)
  // Head: 1x1 conv 512 -> 32 keypoints (16,416) and Linear(64, 64) (4,160).
  CHECK(count(*net) == 11176512 + 16416 + 4160);
  for (const auto& m : net->modules(/*include_self=*/false)) {
    CHECK(m->as<torch::nn::BatchNorm2dImpl>() == nullptr);
    if (const auto* gn = m->as<torch::nn::GroupNormImpl>()) CHECK(gn->options.num_channels() == 16 * gn->options.num_groups());
  }
  CHECK((net->map_size() == std::pair<std::int64_t, std::int64_t>{3, 3}));
  const auto x = pixels(2, 3, 84, 84, 2);
  CHECK((net->trunk(x).sizes() == at::IntArrayRef{2, 512, 3, 3}));
  CHECK((net->forward(x).sizes() == at::IntArrayRef{2, 64}));
  // Two frames stacked: only the stem's input channels change.
  nn::ResNet18Gn six(nn::ImageShape{6, 96, 96});
  CHECK(count(*six) - count(*net) == 3 * 64 * 7 * 7);
}

TEST_CASE("SmallCnn: GroupNorm and spatial-softmax features of the configured size, and a width that must split into groups") {
  torch::manual_seed(0);
  nn::SmallCnn net(nn::ImageShape{9, 84, 84}, nn::SmallCnnImpl::Options{.width = 32, .groups = 8, .keypoints = 32, .features = 50});
  const auto y = net->forward(pixels(3, 9, 84, 84, 3));
  CHECK((y.sizes() == at::IntArrayRef{3, 50}));
  CHECK(at::isfinite(y).all().item<bool>());
  CHECK_THROWS_WITH_AS(nn::SmallCnn(nn::ImageShape{3, 64, 64}, nn::SmallCnnImpl::Options{.width = 30, .groups = 8}), doctest::Contains("not a multiple"), ConfigError);
}

TEST_CASE("SpatialSoftmax: a map peaked at one position gives that position's coordinates") {
  // Keypoints = channels: no projection, each channel is its own keypoint.
  nn::SpatialSoftmax pool(2, 5, 7, 2);
  CHECK(!pool->project);
  auto map = at::zeros({1, 2, 5, 7});
  map.index_put_({0, 0, 1, 6}, 50.0);  // row 1 of 5, column 6 of 7: x = 1, y = -0.5
  map.index_put_({0, 1, 4, 0}, 50.0);  // row 4, column 0: x = -1, y = 1
  const auto k = pool->forward(map);
  REQUIRE((k.sizes() == at::IntArrayRef{1, 4}));
  CHECK(k[0][0].item<double>() == doctest::Approx(1.0).epsilon(1e-6));
  CHECK(k[0][1].item<double>() == doctest::Approx(-0.5).epsilon(1e-6));
  CHECK(k[0][2].item<double>() == doctest::Approx(-1.0).epsilon(1e-6));
  CHECK(k[0][3].item<double>() == doctest::Approx(1.0).epsilon(1e-6));
  // A flat map: the centre.
  const auto flat = pool->forward(at::zeros({1, 2, 5, 7}));
  CHECK(flat.abs().max().item<double>() < 1e-6);
}

TEST_CASE("Image encoders: uint8 pixels give what their floats in [0, 1] give") {
  torch::manual_seed(0);
  nn::SmallCnn small(nn::ImageShape{3, 48, 48});
  nn::ResNet18Gn resnet(nn::ImageShape{3, 64, 64});
  nn::NatureCnn nature(nn::ImageShape{3, 48, 48});
  const auto bytes = pixels(2, 3, 48, 48, 4), big = pixels(2, 3, 64, 64, 5);
  CHECK(at::equal(small->forward(bytes), small->forward(bytes.to(at::kFloat) / 255.0)));
  CHECK(at::equal(nature->forward(bytes), nature->forward(bytes.to(at::kFloat) / 255.0)));
  CHECK(at::equal(resnet->forward(big), resnet->forward(big.to(at::kFloat) / 255.0)));
}

TEST_CASE("Image encoders: every parameter gets a finite gradient, in float32 and under BF16 autocast") {
  torch::manual_seed(0);
  for (const bool bf16 : {false, true}) {
    CAPTURE(bf16);
    nn::SmallCnn small(nn::ImageShape{6, 64, 64});
    nn::ResNet18Gn resnet(nn::ImageShape{3, 64, 64});
    nn::NatureCnn nature(nn::ImageShape{3, 64, 64});
    {
      std::optional<AutocastGuard> guard;
      guard.emplace(at::kCPU, bf16, at::kBFloat16);
      const auto loss = small->forward(pixels(4, 6, 64, 64, 6)).square().mean() +
                        resnet->forward(pixels(4, 3, 64, 64, 7)).square().mean() +
                        nature->forward(pixels(4, 3, 64, 64, 8)).mean();
      loss.backward();
    }
    check_gradients(*small);
    check_gradients(*resnet);
    check_gradients(*nature);
  }
}

TEST_CASE("Image encoders: a clone is a deep copy (a target encoder does not alias its source)") {
  torch::manual_seed(0);
  nn::ResNet18Gn net(nn::ImageShape{3, 64, 64});
  auto copy = std::dynamic_pointer_cast<nn::ResNet18GnImpl>(net->clone());
  const auto x = pixels(1, 3, 64, 64, 9);
  CHECK(at::equal(net->forward(x), copy->forward(x)));
  {
    at::NoGradGuard no_grad;
    for (auto& p : copy->parameters()) p.add_(0.01);
  }
  CHECK(!at::equal(net->forward(x), copy->forward(x)));
  nn::SmallCnn small(nn::ImageShape{3, 32, 32});
  auto small_copy = std::dynamic_pointer_cast<nn::SmallCnnImpl>(small->clone());
  {
    at::NoGradGuard no_grad;
    for (auto& p : small_copy->parameters()) p.zero_();
  }
  CHECK(count(*small_copy) == count(*small));
  CHECK(small->forward(pixels(1, 3, 32, 32, 10)).abs().sum().item<double>() > 0);
}

TEST_CASE("random_shift: each image is its border-repeated padding cut at an offset of up to 2 pad, as bytes or floats") {
  const auto images = pixels(16, 3, 20, 24, 11);
  auto g = at::make_generator<at::CPUGeneratorImpl>(42);
  const auto shifted = nn::random_shift(images, 4, g);
  CHECK(shifted.sizes() == images.sizes());
  CHECK((shifted.scalar_type() == at::kByte));
  // The same offsets drawn again, and each window cut by hand from a replicate-padded float copy.
  auto again = at::make_generator<at::CPUGeneratorImpl>(42);
  const auto top = at::randint(9, {16}, again, at::TensorOptions().dtype(at::kLong));
  const auto left = at::randint(9, {16}, again, at::TensorOptions().dtype(at::kLong));
  const auto padded = at::replication_pad2d(images.to(at::kFloat), {4, 4, 4, 4});
  int moved = 0;
  for (int i = 0; i < 16; ++i) {
    const auto t = top[i].item<std::int64_t>(), l = left[i].item<std::int64_t>();
    const auto want = padded[i].narrow(1, t, 20).narrow(2, l, 24);
    CHECK(at::equal(shifted[i].to(at::kFloat), want));
    moved += (t != 4 || l != 4);
  }
  CHECK(moved > 8);  // most images do move
  CHECK(at::equal(nn::random_shift(images, 0), images));
  // Floats shift to the same values as the bytes they came from.
  auto g2 = at::make_generator<at::CPUGeneratorImpl>(42);
  CHECK(at::equal(nn::random_shift(images.to(at::kFloat), 4, g2), shifted.to(at::kFloat)));
  CHECK_THROWS_WITH_AS(nn::random_shift(images, -1), doctest::Contains("pad"), ConfigError);
}

TEST_CASE("random_crop and center_crop: windows of the images, random when training, centred when acting") {
  const auto images = pixels(8, 3, 96, 96, 12);
  auto g = at::make_generator<at::CPUGeneratorImpl>(7);
  const auto crops = nn::random_crop(images, 84, 84, g);
  CHECK((crops.sizes() == at::IntArrayRef{8, 3, 84, 84}));
  auto again = at::make_generator<at::CPUGeneratorImpl>(7);
  const auto top = at::randint(13, {8}, again, at::TensorOptions().dtype(at::kLong));
  const auto left = at::randint(13, {8}, again, at::TensorOptions().dtype(at::kLong));
  for (int i = 0; i < 8; ++i)
    CHECK(at::equal(crops[i], images[i].narrow(1, top[i].item<std::int64_t>(), 84).narrow(2, left[i].item<std::int64_t>(), 84)));
  CHECK(at::equal(nn::center_crop(images, 84, 84), images.narrow(2, 6, 84).narrow(3, 6, 84)));
  CHECK_THROWS_WITH_AS(nn::random_crop(images, 100, 84), doctest::Contains("crop of 96x96"), ConfigError);
}

// ---- ObsEncoder: observations as rows of parts (an image beside numbers) ----

#include <anvil/nn/gaussian_actor.hpp>
#include <anvil/nn/observation_encoder.hpp>
#include <anvil/nn/twin_q.hpp>

namespace {
// Rows of the layout [image uint8 [3, 16, 16] | state float32 [2]]: the image random, the
// state (i, -i) for row i.
at::Tensor rows_of(const ObsLayout& layout, std::int64_t b, std::uint64_t seed) {
  auto rows = at::zeros({b, layout.row_bytes()}, at::kByte);
  const auto& img = *layout.find("image");
  const auto& st = *layout.find("state");
  rows.narrow(1, img.offset, img.bytes()).copy_(pixels(b, 3, 16, 16, seed).reshape({b, -1}));
  for (std::int64_t i = 0; i < b; ++i) {
    const float v[2] = {static_cast<float>(i), -static_cast<float>(i)};
    std::memcpy(rows.data_ptr<std::uint8_t>() + i * layout.row_bytes() + st.offset, v, sizeof v);
  }
  return rows;
}
}  // namespace

TEST_CASE("ObsEncoder: an image part's features beside the float parts read in place, from one row of bytes") {
  torch::manual_seed(1);
  ObsLayout layout;
  layout.image("image", 3, 16, 16).vector("state", 2);
  CHECK(layout.find("state")->offset == 3 * 16 * 16);
  CHECK(layout.row_bytes() == 3 * 16 * 16 + 8);
  CHECK(layout.describe() == "image uint8 [3,16,16], state float32 [2]");
  nn::ObsEncoder enc(layout, nn::EncoderKind::small, 10);
  CHECK(enc->output_size() == 12);
  const auto rows = rows_of(layout, 4, 3);
  const auto f = enc->forward(rows);
  REQUIRE(f.size(0) == 4);
  REQUIRE(f.size(1) == 12);
  for (std::int64_t i = 0; i < 4; ++i) {
    CHECK(f[i][10].item<float>() == static_cast<float>(i));
    CHECK(f[i][11].item<float>() == -static_cast<float>(i));
  }
  // the image's features are SmallCnn's of the image part
  nn::SmallCnn cnn = std::dynamic_pointer_cast<nn::SmallCnnImpl>(enc->named_children()["image"]);
  REQUIRE(cnn);
  CHECK(at::allclose(f.narrow(1, 0, 10), cnn->forward(nn::detail::part_of(rows, layout.parts[0]))));
  CHECK_THROWS_WITH_AS(enc->forward(rows.to(at::kFloat)), doctest::Contains("uint8 [B, 776]"), Error);
  CHECK_THROWS_WITH_AS(nn::ObsEncoder(ObsLayout{}.vector("state", 3), nn::EncoderKind::small, 8),
                       doctest::Contains("no image part"), ConfigError);
}

TEST_CASE("augment_images: each image part shifted, the float parts untouched") {
  ObsLayout layout;
  layout.image("image", 3, 16, 16).vector("state", 2);
  const auto rows = rows_of(layout, 8, 5);
  const auto out = nn::augment_images(rows, layout, [](const at::Tensor& img) { return nn::random_shift(img, 2); });
  const auto& st = *layout.find("state");
  CHECK(at::equal(out.narrow(1, st.offset, 8), rows.narrow(1, st.offset, 8)));
  CHECK(!at::equal(out.narrow(1, 0, st.offset), rows.narrow(1, 0, st.offset)));
  const auto flipped = nn::augment_images(rows, layout, [](const at::Tensor& img) { return img.flip(3); });
  CHECK(at::equal(nn::detail::part_of(flipped, layout.parts[0]), nn::detail::part_of(rows, layout.parts[0]).flip(3)));
}

TEST_CASE("Shared encoder: the critic's loss trains it, the actor's does not reach it, and the target critic has its own copy") {
  torch::manual_seed(2);
  ObsLayout layout;
  layout.image("image", 3, 16, 16).vector("state", 2);
  nn::ObsEncoder enc(layout, nn::EncoderKind::small, 8);
  nn::GaussianActor actor(enc->output_size(), 1, nn::GaussianActorConfig{});
  nn::TwinQ critic(enc->output_size(), 1, nn::TwinQConfig{});
  const auto before = critic->parameters().size();
  critic->set_encoder(enc);
  actor->share_encoder(enc);
  CHECK(critic->parameters().size() == before + enc->parameters().size());
  CHECK(actor->parameters().size() == actor->net()->parameters().size());  // not the actor's
  CHECK(nn::GaussianActorTape::unsupported(*actor) == "input comes through a convolutional encoder (images)");
  const auto rows = rows_of(layout, 4, 7);
  // the actor's loss: no gradient reaches the encoder
  actor->sample(rows).action.sum().backward();
  for (const auto& p : enc->parameters()) CHECK(!(p.grad().defined() && p.grad().abs().sum().item<double>() > 0));
  // the critic's loss: every encoder parameter gets one
  auto [q1, q2] = critic->forward(rows, at::zeros({4, 1}));
  (q1 + q2).sum().backward();
  check_gradients(*enc);
  // the target: a clone with the same outputs and its own encoder
  auto target = std::dynamic_pointer_cast<nn::TwinQImpl>(critic->clone());
  CHECK(at::allclose(target->forward(rows, at::zeros({4, 1})).first, critic->forward(rows, at::zeros({4, 1})).first));
  REQUIRE(target->encoder());
  CHECK(target->encoder().get() != critic->encoder().get());
  {
    at::NoGradGuard no_grad;
    for (auto& p : target->encoder()->parameters()) p.add_(0.05);
  }
  CHECK(!at::allclose(target->forward(rows, at::zeros({4, 1})).first, critic->forward(rows, at::zeros({4, 1})).first));
}
