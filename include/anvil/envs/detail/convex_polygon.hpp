#pragma once
/// @file
/// Convex polygons in the plane: area, rigid transform and intersection (Sutherland-Hodgman
/// clipping), enough to measure how much of a goal region a pushed block covers (Push-T's
/// reward). Light header: no torch, no physics engine.

#include <array>
#include <cmath>
#include <cstddef>
#include <vector>

namespace anvil::envs::detail {

/// A point or vector in the plane, in double.
struct Vec2 {
  double x = 0.0;
  double y = 0.0;
};

/// A convex polygon's vertices in order (either orientation); at most a few dozen.
using Polygon = std::vector<Vec2>;

/// The signed area (shoelace formula): positive when the vertices run counter-clockwise.
[[nodiscard]] inline double signed_area(const Polygon& p) noexcept {
  double a = 0.0;
  const std::size_t n = p.size();
  for (std::size_t i = 0; i < n; ++i) {
    const Vec2& u = p[i];
    const Vec2& v = p[(i + 1) % n];
    a += u.x * v.y - v.x * u.y;
  }
  return 0.5 * a;
}

/// The area, whatever the orientation.
[[nodiscard]] inline double area(const Polygon& p) noexcept { return std::abs(signed_area(p)); }

/// A rigid pose: rotate by `angle` (radians, counter-clockwise) about the origin, then
/// move by (x, y); a body's local-to-world map.
struct Pose2 {
  double x = 0.0;
  double y = 0.0;
  double angle = 0.0;

  [[nodiscard]] Vec2 apply(Vec2 p) const noexcept {
    const double c = std::cos(angle), s = std::sin(angle);
    return {x + c * p.x - s * p.y, y + s * p.x + c * p.y};
  }
  [[nodiscard]] Polygon apply(const Polygon& poly) const {
    Polygon out;
    out.reserve(poly.size());
    for (const Vec2& p : poly) out.push_back(apply(p));
    return out;
  }
};

/// The intersection of two convex polygons (empty when they do not overlap): `subject`
/// clipped by each edge of `clip` in turn (Sutherland-Hodgman). Both may run either way.
[[nodiscard]] inline Polygon intersect(const Polygon& subject, const Polygon& clip) {
  if (subject.size() < 3 || clip.size() < 3) return {};
  const double orient = signed_area(clip) >= 0.0 ? 1.0 : -1.0;
  Polygon out = subject;
  Polygon in;
  const std::size_t n = clip.size();
  for (std::size_t e = 0; e < n && !out.empty(); ++e) {
    const Vec2 a = clip[e];
    const Vec2 b = clip[(e + 1) % n];
    // Inside: on the left of a->b for a counter-clockwise clip polygon.
    const auto side = [&](Vec2 p) { return orient * ((b.x - a.x) * (p.y - a.y) - (b.y - a.y) * (p.x - a.x)); };
    in.swap(out);
    out.clear();
    const std::size_t m = in.size();
    for (std::size_t i = 0; i < m; ++i) {
      const Vec2 p = in[i];
      const Vec2 q = in[(i + 1) % m];
      const double sp = side(p), sq = side(q);
      if (sp >= 0.0) out.push_back(p);
      if ((sp >= 0.0) != (sq >= 0.0)) {
        const double t = sp / (sp - sq);
        out.push_back({p.x + t * (q.x - p.x), p.y + t * (q.y - p.y)});
      }
    }
  }
  return out.size() >= 3 ? out : Polygon{};
}

/// The area two unions of convex pieces share, where the pieces of each union do not
/// overlap one another (they may share edges): the sum over pairs of pieces.
[[nodiscard]] inline double overlap_area(const std::vector<Polygon>& a, const std::vector<Polygon>& b) {
  double s = 0.0;
  for (const Polygon& p : a)
    for (const Polygon& q : b) s += area(intersect(p, q));
  return s;
}

}  // namespace anvil::envs::detail
