#pragma once
/// @file
/// `Canvas`: a small software rasteriser for envs seen as pixels (these machines have no
/// OpenGL, and an observation of 64x64 or 96x96 needs none). RGB bytes laid out channel
/// first, [3, H, W], as an image observation is; shapes are drawn in world coordinates (x
/// right, y up) mapped onto the image by a `View`, each edge antialiased by its coverage
/// (a pixel's centre half a pixel inside the edge is fully covered, half a pixel outside not
/// at all, linear between: the signed distance to the shape, clamped). Discs, capsules (a
/// thick segment: a pendulum's rod) and convex polygons (Push-T's T, as two boxes).
/// Deterministic and independent of the CPU: a known state gives a known image.
/// Light header.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <anvil/core/error.hpp>

namespace anvil::envs::render {

/// An RGB colour.
struct Rgb {
  std::uint8_t r = 0, g = 0, b = 0;
};

/// The world rectangle an image shows: [x0, x1] x [y0, y1], y up.
struct View {
  double x0 = -1, x1 = 1, y0 = -1, y1 = 1;
};

/// A point in world coordinates.
struct Point {
  double x = 0, y = 0;
};

/// An RGB image, channel first [3, H, W], drawn in world coordinates (see file comment).
class Canvas {
 public:
  Canvas(int height, int width, View view) : h_(height), w_(width), view_(view), px_(3 * static_cast<std::size_t>(height) * width) {
    if (height < 1 || width < 1) throw ConfigError("Canvas: the image must be at least 1x1 (got " + std::to_string(height) + "x" + std::to_string(width) + ")");
    if (!(view.x1 > view.x0) || !(view.y1 > view.y0)) throw ConfigError("Canvas: the view's x1 and y1 must exceed its x0 and y0");
    sx_ = width / (view.x1 - view.x0);
    sy_ = height / (view.y1 - view.y0);
  }

  [[nodiscard]] int height() const noexcept { return h_; }
  [[nodiscard]] int width() const noexcept { return w_; }
  /// The bytes, [3, H, W].
  [[nodiscard]] std::span<const std::uint8_t> pixels() const noexcept { return px_; }
  /// Channel `c` of pixel (row, col).
  [[nodiscard]] std::uint8_t at(int c, int row, int col) const noexcept {
    return px_[(static_cast<std::size_t>(c) * h_ + row) * w_ + col];
  }

  /// Fills the whole image.
  void clear(Rgb c) {
    const std::size_t plane = static_cast<std::size_t>(h_) * w_;
    std::fill_n(px_.begin(), plane, c.r);
    std::fill_n(px_.begin() + static_cast<std::ptrdiff_t>(plane), plane, c.g);
    std::fill_n(px_.begin() + static_cast<std::ptrdiff_t>(2 * plane), plane, c.b);
  }

  /// A disc of `radius` (world units) around `centre`.
  void disc(Point centre, double radius, Rgb c) {
    const Point p = to_pixels(centre);
    const double r = radius * sx_;  // a view of equal scales keeps discs round
    fill(p.x - r, p.x + r, p.y - r, p.y + r, c, [&](double x, double y) { return std::hypot(x - p.x, y - p.y) - r; });
  }

  /// A segment from `a` to `b`, `radius` thick on each side, with round ends.
  void capsule(Point a, Point b, double radius, Rgb c) {
    const Point pa = to_pixels(a), pb = to_pixels(b);
    const double r = radius * sx_;
    const double dx = pb.x - pa.x, dy = pb.y - pa.y, len2 = dx * dx + dy * dy;
    fill(std::min(pa.x, pb.x) - r, std::max(pa.x, pb.x) + r, std::min(pa.y, pb.y) - r, std::max(pa.y, pb.y) + r, c,
         [&](double x, double y) {
           const double t = len2 > 0 ? std::clamp(((x - pa.x) * dx + (y - pa.y) * dy) / len2, 0.0, 1.0) : 0.0;
           return std::hypot(x - (pa.x + t * dx), y - (pa.y + t * dy)) - r;
         });
  }

  /// A convex polygon, its corners in order (either way round).
  void polygon(std::span<const Point> corners, Rgb c) {
    if (corners.size() < 3) throw ConfigError("Canvas::polygon: needs 3 corners at least");
    std::vector<Point> p;
    p.reserve(corners.size());
    for (const auto& q : corners) p.push_back(to_pixels(q));
    double area = 0;
    for (std::size_t i = 0; i < p.size(); ++i) {
      const auto& u = p[i];
      const auto& v = p[(i + 1) % p.size()];
      area += u.x * v.y - v.x * u.y;
    }
    const double side = area > 0 ? 1.0 : -1.0;  // image rows grow down: orientation flips; either works
    // Each edge's outward unit normal and offset, once: d(x, y) = n . (x, y) - c.
    struct Edge {
      double nx, ny, c;
    };
    std::vector<Edge> edges;
    edges.reserve(p.size());
    double x0 = p[0].x, x1 = p[0].x, y0 = p[0].y, y1 = p[0].y;
    for (std::size_t i = 0; i < p.size(); ++i) {
      const auto& u = p[i];
      const auto& v = p[(i + 1) % p.size()];
      const double ex = v.x - u.x, ey = v.y - u.y, len = std::hypot(ex, ey);
      x0 = std::min(x0, u.x), x1 = std::max(x1, u.x), y0 = std::min(y0, u.y), y1 = std::max(y1, u.y);
      if (len == 0) continue;
      const double nx = side * ey / len, ny = -side * ex / len;
      edges.push_back({nx, ny, nx * u.x + ny * u.y});
    }
    fill(x0, x1, y0, y1, c, [&](double x, double y) {
      // Inside: every edge's outward distance is negative; the largest is the distance to
      // the nearest edge (exact inside, and near the edges outside, which is all the
      // antialiasing reads).
      double d = -1e300;
      for (const auto& e : edges) d = std::max(d, e.nx * x + e.ny * y - e.c);
      return d;
    });
  }

  /// World -> pixel coordinates (column, row as real numbers; pixel (r, c) has its centre at
  /// (c + 0.5, r + 0.5)).
  [[nodiscard]] Point to_pixels(Point q) const noexcept { return {(q.x - view_.x0) * sx_, (view_.y1 - q.y) * sy_}; }

 private:
  // Blends colour `c` into every pixel of the box whose coverage by the shape of signed
  // distance `sdf` (in pixels, negative inside) is positive.
  template <class Sdf>
  void fill(double x0, double x1, double y0, double y1, Rgb c, Sdf&& sdf) {
    const int c0 = std::max(0, static_cast<int>(std::floor(x0 - 1))), c1 = std::min(w_ - 1, static_cast<int>(std::ceil(x1 + 1)));
    const int r0 = std::max(0, static_cast<int>(std::floor(y0 - 1))), r1 = std::min(h_ - 1, static_cast<int>(std::ceil(y1 + 1)));
    const std::size_t plane = static_cast<std::size_t>(h_) * w_;
    const std::array<std::uint8_t, 3> rgb{c.r, c.g, c.b};
    for (int row = r0; row <= r1; ++row)
      for (int col = c0; col <= c1; ++col) {
        const double cover = std::clamp(0.5 - sdf(col + 0.5, row + 0.5), 0.0, 1.0);
        if (cover <= 0) continue;
        const std::size_t i = static_cast<std::size_t>(row) * w_ + col;
        for (int k = 0; k < 3; ++k) {
          auto& v = px_[k * plane + i];
          v = static_cast<std::uint8_t>(std::lround(v + (rgb[k] - v) * cover));
        }
      }
  }

  int h_, w_;
  View view_;
  double sx_ = 1, sy_ = 1;
  std::vector<std::uint8_t> px_;
};

}  // namespace anvil::envs::render
