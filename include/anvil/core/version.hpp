#pragma once
/// @file
/// anvil's version: the macros for preprocessor checks and `kVersion` for messages and
/// provenance. CMakeLists.txt reads its project version from here.

#include <string_view>

#define ANVIL_VERSION_MAJOR 0
#define ANVIL_VERSION_MINOR 1
#define ANVIL_VERSION_PATCH 0

#define ANVIL_DETAIL_STR2(x) #x
#define ANVIL_DETAIL_STR(x) ANVIL_DETAIL_STR2(x)

namespace anvil {
/// "MAJOR.MINOR.PATCH".
inline constexpr std::string_view kVersion =
    ANVIL_DETAIL_STR(ANVIL_VERSION_MAJOR) "." ANVIL_DETAIL_STR(ANVIL_VERSION_MINOR) "." ANVIL_DETAIL_STR(ANVIL_VERSION_PATCH);
}  // namespace anvil
