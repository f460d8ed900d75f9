// ASCII case folding for names users type in any case (CLATTN_ISA, OPENBLAS_CORETYPE, KV cache
// types): locale-independent, so "AVX2" is avx2 whatever the process's locale says.
#pragma once

#include <cctype>
#include <string>
#include <string_view>

namespace clattn::detail {

inline std::string ascii_lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c;
  return out;
}

}  // namespace clattn::detail
