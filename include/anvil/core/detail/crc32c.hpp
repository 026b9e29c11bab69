#pragma once
/// @file
/// CRC-32C (Castagnoli), the checksum anvil's binary files (buffers, checkpoints) end with,
/// so a file damaged on disk or in transit is refused instead of silently loaded. It is
/// computed as the bytes stream through, at memory speed where the CPU has SSE4.2's crc32
/// instruction (chosen at run time: the build stays baseline x86-64), and with a table
/// elsewhere. Light header.

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define ANVIL_CRC32C_X86 1
#include <immintrin.h>
#endif

namespace anvil::detail {

/// A running CRC-32C: `update` with each piece, `value` at the end. Same result however
/// the bytes are split.
class Crc32c {
 public:
  void update(const void* data, std::size_t n) noexcept { crc_ = impl()(crc_, static_cast<const unsigned char*>(data), n); }
  /// The checksum of everything passed to `update` so far.
  [[nodiscard]] std::uint32_t value() const noexcept { return ~crc_; }

  /// The table-driven version, whatever the CPU (the tests compare both).
  static std::uint32_t portable(std::uint32_t crc, const unsigned char* p, std::size_t n) noexcept {
    static const auto table = [] {
      std::array<std::uint32_t, 256> t{};
      for (std::uint32_t i = 0; i < 256; ++i) {
        std::uint32_t c = i;
        for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ 0x82F63B78u : c >> 1;  // reflected polynomial
        t[i] = c;
      }
      return t;
    }();
    for (std::size_t i = 0; i < n; ++i) crc = table[(crc ^ p[i]) & 0xFFu] ^ (crc >> 8);
    return crc;
  }

 private:
  using Fn = std::uint32_t (*)(std::uint32_t, const unsigned char*, std::size_t) noexcept;

#if defined(ANVIL_CRC32C_X86)
  __attribute__((target("sse4.2"))) static std::uint32_t hardware(std::uint32_t crc, const unsigned char* p,
                                                                  std::size_t n) noexcept {
    std::uint64_t c = crc;
    for (; n >= 8; n -= 8, p += 8) {
      std::uint64_t w;
      std::memcpy(&w, p, 8);
      c = _mm_crc32_u64(c, w);
    }
    auto c32 = static_cast<std::uint32_t>(c);
    for (; n > 0; --n, ++p) c32 = _mm_crc32_u8(c32, *p);
    return c32;
  }
#endif

  static Fn impl() noexcept {
#if defined(ANVIL_CRC32C_X86)
    static const Fn f = __builtin_cpu_supports("sse4.2") ? &hardware : &portable;
    return f;
#else
    return &portable;
#endif
  }

  std::uint32_t crc_ = 0xFFFFFFFFu;
};

}  // namespace anvil::detail
