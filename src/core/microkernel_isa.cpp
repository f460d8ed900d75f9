// The tile kernels, compiled once per ISA (CMakeLists.txt: x86-64-v3 for avx2, x86-64-v4 for
// avx512) into namespaces clattn::mk::avx2 / ::avx512, each exporting one table of entry points;
// microkernel.cpp picks the table of the active ISA (include/clattn/cpu.h).
#include <cstring>
#include <type_traits>

#include "core/half.h"
#include "core/microkernel.h"
#include "core/simd.h"

#if !defined(CLATTN_ISA_NS)
#error "microkernel_isa.cpp is compiled once per ISA with CLATTN_ISA_NS set (CMakeLists.txt)"
#endif

namespace clattn::mk::CLATTN_ISA_NS {
namespace {

// The tiles are written in the machine's own vector width: AVX-512 has 32 registers of 16 floats,
// AVX2 (and the portable build) 16 registers of 8. A tile of MR rows x NV vectors keeps MR·NV
// accumulators, NV B vectors and one broadcast in registers: 6 x 4 on AVX-512 (29 of 32), 6 x 2
// on AVX2 (15 of 16). Written in 64-byte vectors on AVX2, the 6 x 4 tile needed 48 registers and
// spilled on every FMA (measured: full attention at 13 GFLOP/s against sgemm's 150).
// Tiles of one or two rows (a decode step's query against the cache) take kNVFew vectors per row:
// each accumulator is one FMA chain, and with two chains on AVX2 a row waited on the FMA's latency
// instead of streaming B (decode after 8192 positions with an f16 cache: see docs/performance.md).
#if defined(__AVX512F__)
typedef float vn __attribute__((vector_size(64)));
constexpr int kVN = 16;     // floats per native vector
constexpr int kNVMax = 4;   // native vectors per tile row
constexpr int kNVFew = 4;   // ... in tiles of at most 2 rows
#else
typedef float vn __attribute__((vector_size(32)));
constexpr int kVN = 8;
constexpr int kNVMax = 2;
constexpr int kNVFew = 4;
#endif
static_assert(kPanel % (kNVMax * kVN) == 0 && kPanel % (kNVFew * kVN) == 0 && kLanes % kVN == 0, "tiles must divide the panel and the padding");

inline vn load_n(const float* p) {
  vn v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}
inline void store_n(float* p, vn v) { __builtin_memcpy(p, &v, sizeof v); }
// A broadcast, which the tiles' loops turn into one vbroadcastss from memory (vn{} + x would
// cost an add and a register broadcast per element: +0.0 is not an identity for -0.0).
inline vn splat_n(float x) {
#if defined(__AVX512F__)
  return vn{x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x};
#else
  return vn{x, x, x, x, x, x, x, x};
#endif
}

// How a tile loads one native vector of its B operand: f32 as it is, or 16-bit storage (a KV
// cache's f16 or bf16) widened in registers, so the operand is read at half the bytes.
struct LoadF32 {
  using T = float;
  static vn load(const float* p) { return load_n(p); }
  static float scalar(float x) { return x; }
};
struct LoadF16 {
  using T = uint16_t;
  static vn load(const uint16_t* p) {
#if defined(__AVX512F__)
    // The zero-masked form: GCC 12's _mm512_cvtph_ps passes an undefined vector it warns about.
    return (vn)_mm512_maskz_cvtph_ps(0xffff, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
#elif defined(__F16C__)
    return (vn)_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
#else
    vn v;
    for (int j = 0; j < kVN; ++j) v[j] = half::f16_to_f32(p[j]);
    return v;
#endif
  }
  static float scalar(uint16_t h) { return half::f16_to_f32(h); }
};
struct LoadBF16 {
  using T = uint16_t;
  // bf16 is f32's upper half: zero-extend each lane to 32 bits and shift (vpmovzxwd, vpslld).
  typedef uint16_t vh __attribute__((vector_size(kVN * 2)));
  typedef uint32_t vu __attribute__((vector_size(kVN * 4)));
  static vn load(const uint16_t* p) {
    vh h;
    __builtin_memcpy(&h, p, sizeof h);
    return (vn)(__builtin_convertvector(h, vu) << 16);
  }
  static float scalar(uint16_t h) { return half::bf16_to_f32(h); }
};

// C (MR, NV·kVN) = A (MR, depth) · P (depth, NV·kVN), P a column slice of a (depth, 64) panel:
// per depth step NV loads and MR broadcasts feed MR·NV FMAs.
// bias (NV·kVN floats, or nullptr) and add (start from C) fold a linear layer's bias and residual
// into the accumulators' start.
template <int MR, int NV, class LB = LoadF32>
void abt_tile(const float* a, int64_t lda, const typename LB::T* p, int64_t depth, float* c, int64_t ldc,
              const float* bias, bool add) {
  vn acc[MR][NV];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      acc[r][v] = add ? load_n(c + r * ldc + v * kVN) : vn{};
      if (bias) acc[r][v] += load_n(bias + v * kVN);
    }
  for (int64_t d = 0; d < depth; ++d) {
    const typename LB::T* pb = p + d * kPanel;
    vn b[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) b[v] = LB::load(pb + v * kVN);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const vn ar = splat_n(a[r * lda + d]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] += ar * b[v];
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) store_n(c + r * ldc + v * kVN, acc[r][v]);
}

// C (MR, NV·kVN) = diag(s)·C + A (MR, k) · B (k, NV·kVN).
template <int MR, int NV, class LB = LoadF32>
void ab_tile(const float* a, int64_t a_rs, int64_t a_cs, const typename LB::T* b, int64_t ldb, int64_t k,
             float* c, int64_t ldc, const float* row_scale) {
  vn acc[MR][NV];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    const vn s = splat_n(row_scale ? row_scale[r] : 1.f);
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[r][v] = load_n(c + r * ldc + v * kVN) * s;
  }
  for (int64_t kk = 0; kk < k; ++kk) {
    vn bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) bv[v] = LB::load(b + kk * ldb + v * kVN);
    const float* ak = a + kk * a_cs;
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const vn ar = splat_n(ak[r * a_rs]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] += ar * bv[v];
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) store_n(c + r * ldc + v * kVN, acc[r][v]);
}

// Y (M, R) = X (M, k) · W (R, k)ᵀ for M <= 2 rows of X and R = 4 rows of W: every W element is
// loaded once and feeds M FMAs, so the loop runs at the speed W streams from memory. 4·M
// accumulators, 4 W loads and M X loads stay in registers (14 of AVX2's 16 at M = 2). LW loads W:
// f32, or a linear layer's 16-bit weights widened in registers (half the bytes streamed); the
// sums run in the f32 kernel's order over the widened values. pf: R rows (stride ldw) of W that
// the loads prefetch, the next tile's (or this one's, at the end of W).
template <int M, int R, class LW = LoadF32>
void rows_dot_tile(const float* x, int64_t ldx, const typename LW::T* w, int64_t ldw, int64_t k, float* out,
                   int64_t ldo, const typename LW::T* pf = nullptr) {
  vn acc[M][R];
#pragma GCC unroll 8
  for (int i = 0; i < M; ++i)
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) acc[i][r] = vn{};
  const int64_t kb = k / kVN * kVN;
  for (int64_t e = 0; e < kb; e += kVN) {
    vn wv[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) wv[r] = LW::load(w + r * ldw + e);
    // The next R rows' line at this column: a row of a linear layer's weight is a few lines (2 KB
    // at k = 512 in f32, half that in 16 bits), too short a stream for the hardware prefetcher
    // to reach full speed on its own.
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) simd::prefetch_line(reinterpret_cast<const float*>(pf + r * ldw + e), false);
#pragma GCC unroll 2
    for (int i = 0; i < M; ++i) {
      const vn xv = load_n(x + i * ldx + e);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) acc[i][r] += xv * wv[r];
    }
  }
  for (int i = 0; i < M; ++i)
    for (int r = 0; r < R; ++r) {
      float s = 0;
      for (int j = 0; j < kVN; ++j) s += acc[i][r][j];
      for (int64_t e = kb; e < k; ++e) s += x[i * ldx + e] * LW::scalar(w[r * ldw + e]);
      out[i * ldo + r] = s;
    }
}

template <class LW>
void rows_dot_t(int64_t m, int64_t n, int64_t k, float alpha, const float* x, int64_t ldx, const typename LW::T* w,
                int64_t ldw, float beta, float* y, int64_t ldy) {
  for (int64_t i0 = 0; i0 < m; i0 += 2) {
    const int64_t mi = m - i0 < 2 ? m - i0 : 2;
    const float* xi = x + i0 * ldx;
    float* yi = y + i0 * ldy;
    for (int64_t r0 = 0; r0 < n; r0 += 4) {
      float t[2][4];  // (mi, 4) dot products of this group of W rows
      const typename LW::T* wr = w + r0 * ldw;
      if (n - r0 >= 4) {
        const typename LW::T* pf = n - r0 >= 8 ? wr + 4 * ldw : wr;  // never past W
        if (mi == 2) rows_dot_tile<2, 4, LW>(xi, ldx, wr, ldw, k, &t[0][0], 4, pf);
        else rows_dot_tile<1, 4, LW>(xi, ldx, wr, ldw, k, &t[0][0], 4, pf);
      } else {
        for (int64_t r = 0; r < n - r0; ++r) {
          const typename LW::T* wrr = wr + r * ldw;
          if (mi == 2) rows_dot_tile<2, 1, LW>(xi, ldx, wrr, ldw, k, &t[0][r], 4, wrr);
          else rows_dot_tile<1, 1, LW>(xi, ldx, wrr, ldw, k, &t[0][r], 4, wrr);
        }
      }
      const int64_t nr = n - r0 < 4 ? n - r0 : 4;
      for (int64_t i = 0; i < mi; ++i)
        for (int64_t r = 0; r < nr; ++r) {
          float& o = yi[i * ldy + r0 + r];
          // beta = 0 overwrites: what was there (even NaN) is not read, as BLAS specifies.
          o = beta == 0.f ? alpha * t[i][r] : beta * o + alpha * t[i][r];
        }
    }
  }
}

constexpr int kMR = 6;

template <class LB>
using AbtFn = void (*)(const float*, int64_t, const typename LB::T*, int64_t, float*, int64_t, const float*, bool);
template <class LB>
constexpr AbtFn<LB> kAbt[kMR + 1] = {nullptr,
                                     abt_tile<1, kNVMax, LB>, abt_tile<2, kNVMax, LB>, abt_tile<3, kNVMax, LB>,
                                     abt_tile<4, kNVMax, LB>, abt_tile<5, kNVMax, LB>, abt_tile<6, kNVMax, LB>};

template <class LB>
using AbFn = void (*)(const float*, int64_t, int64_t, const typename LB::T*, int64_t, int64_t, float*,
                      int64_t, const float*);
template <int MR, class LB>
constexpr AbFn<LB> ab_for(int nv) {
  return nv == 1 ? ab_tile<MR, 1, LB> : nv == 2 ? ab_tile<MR, 2, LB> : nv == 3 ? ab_tile<MR, 3, LB> : ab_tile<MR, 4, LB>;
}
template <class LB>
AbFn<LB> ab_dispatch(int mr, int nv) {
  switch (mr) {
    case 1: return ab_for<1, LB>(nv);
    case 2: return ab_for<2, LB>(nv);
    case 3: return ab_for<3, LB>(nv);
    case 4: return ab_for<4, LB>(nv);
    case 5: return ab_for<5, LB>(nv);
    default: return ab_for<6, LB>(nv);
  }
}

template <class LB>
void gemm_abt_t(int64_t m, int64_t npanels, int64_t depth, const float* a, int64_t lda,
                const typename LB::T* bpanels, float* c, int64_t ldc, const float* bias = nullptr, bool add = false) {
  for (int64_t p = 0; p < npanels; ++p) {
    const typename LB::T* bp = bpanels + p * depth * kPanel;
    const float* bpp = bias ? bias + p * kPanel : nullptr;
    for (int64_t r0 = 0; r0 < m; r0 += kMR) {
      const int mr = static_cast<int>(m - r0 < kMR ? m - r0 : kMR);
      float* cr = c + r0 * ldc + p * kPanel;
      if (mr <= 2) {
        for (int64_t c0 = 0; c0 < kPanel; c0 += kNVFew * kVN)
          (mr == 1 ? abt_tile<1, kNVFew, LB> : abt_tile<2, kNVFew, LB>)(a + r0 * lda, lda, bp + c0, depth, cr + c0, ldc,
                                                                      bpp ? bpp + c0 : nullptr, add);
        continue;
      }
      for (int64_t c0 = 0; c0 < kPanel; c0 += kNVMax * kVN)
        kAbt<LB>[mr](a + r0 * lda, lda, bp + c0, depth, cr + c0, ldc, bpp ? bpp + c0 : nullptr, add);
    }
  }
}

template <class LB>
void gemm_ab_t(int64_t m, int64_t n, int64_t k, const float* a, int64_t a_rs, int64_t a_cs,
               const typename LB::T* b, int64_t ldb, float* c, int64_t ldc, const float* row_scale) {
  const int nvmax = m <= 2 ? kNVFew : kNVMax;
  // When C is wider than one tile, each column strip reads all of A again: in blocks of 64 along
  // k, the block of A (m, 64) and of B (64, n) stay in L1 for every strip instead of A coming
  // from L2 once per strip (the forward's P·V on AVX2, 4 strips of 16: `BM_Ab` 83 -> 91 GFLOP/s
  // on one Zen 3 core). The sums keep their order: a block's accumulators start from C as stored.
  const int64_t kblock = n > nvmax * kVN && m > 2 ? 64 : k > 0 ? k : 1;  // k = 0 still scales C once
  for (int64_t k0 = 0; k0 == 0 || k0 < k; k0 += kblock) {
    const int64_t kc = k - k0 < kblock ? k - k0 : kblock;
    const float* ab = a + k0 * a_cs;
    const typename LB::T* bb = b + k0 * ldb;
    for (int64_t r0 = 0; r0 < m; r0 += kMR) {
      const int mr = static_cast<int>(m - r0 < kMR ? m - r0 : kMR);
      for (int64_t c0 = 0; c0 < n; c0 += nvmax * kVN) {
        const int nv = static_cast<int>((n - c0) / kVN < nvmax ? (n - c0) / kVN : nvmax);
        ab_dispatch<LB>(mr, nv)(ab + r0 * a_rs, a_rs, a_cs, bb + c0, ldb, kc, c + r0 * ldc + c0, ldc,
                                row_scale && k0 == 0 ? row_scale + r0 : nullptr);
      }
    }
  }
}

}  // namespace

void pack_rows(const float* src, int64_t rows, int64_t cols, int64_t rs, float* dst,
               int64_t rows_pad, int64_t cols_pad, float scale = 1.f);

void gemm_abt(int64_t m, int64_t npanels, int64_t depth, const float* a, int64_t lda,
              const float* bpanels, float* c, int64_t ldc) {
  gemm_abt_t<LoadF32>(m, npanels, depth, a, lda, bpanels, c, ldc);
}

void gemm_abt_add(int64_t m, int64_t npanels, int64_t depth, const float* a, int64_t lda, const float* bpanels,
                  float* c, int64_t ldc, const float* bias, bool add) {
  gemm_abt_t<LoadF32>(m, npanels, depth, a, lda, bpanels, c, ldc, bias, add);
}

void gemm_ab(int64_t m, int64_t n, int64_t k, const float* a, int64_t a_rs, int64_t a_cs,
             const float* b, int64_t ldb, float* c, int64_t ldc, const float* row_scale) {
  gemm_ab_t<LoadF32>(m, n, k, a, a_rs, a_cs, b, ldb, c, ldc, row_scale);
}

void gemm_abt16(Half f, int64_t m, int64_t npanels, int64_t depth, const float* a, int64_t lda,
                const uint16_t* bpanels, float* c, int64_t ldc) {
  if (f == Half::f16) gemm_abt_t<LoadF16>(m, npanels, depth, a, lda, bpanels, c, ldc);
  else gemm_abt_t<LoadBF16>(m, npanels, depth, a, lda, bpanels, c, ldc);
}

void gemm_ab16(Half f, int64_t m, int64_t n, int64_t k, const float* a, int64_t a_rs, int64_t a_cs,
               const uint16_t* b, int64_t ldb, float* c, int64_t ldc, const float* row_scale) {
  if (f == Half::f16) gemm_ab_t<LoadF16>(m, n, k, a, a_rs, a_cs, b, ldb, c, ldc, row_scale);
  else gemm_ab_t<LoadBF16>(m, n, k, a, a_rs, a_cs, b, ldb, c, ldc, row_scale);
}

// Rounds to nearest even; values past f16's range become ±inf (callers check magnitudes first).
void to_half(Half f, const float* src, int64_t n, uint16_t* dst) {
  int64_t i = 0;
#if defined(__F16C__)
  if (f == Half::f16)
    for (; i + 8 <= n; i += 8)
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
#endif
  for (; i < n; ++i) dst[i] = f == Half::f16 ? half::f32_to_f16(src[i]) : half::f32_to_bf16(src[i]);
}

void rows_dot(int64_t m, int64_t n, int64_t k, float alpha, const float* x, int64_t ldx, const float* w,
              int64_t ldw, float beta, float* y, int64_t ldy) {
  rows_dot_t<LoadF32>(m, n, k, alpha, x, ldx, w, ldw, beta, y, ldy);
}

void rows_dot16(Half f, int64_t m, int64_t n, int64_t k, float alpha, const float* x, int64_t ldx, const uint16_t* w,
                int64_t ldw, float beta, float* y, int64_t ldy) {
  if (f == Half::f16) rows_dot_t<LoadF16>(m, n, k, alpha, x, ldx, w, ldw, beta, y, ldy);
  else rows_dot_t<LoadBF16>(m, n, k, alpha, x, ldx, w, ldw, beta, y, ldy);
}

// Rows of a 16-bit matrix widened to f32: dst (rows, cols) with row stride ldd.
void widen_rows(Half f, const uint16_t* src, int64_t rows, int64_t cols, int64_t lds, float* dst, int64_t ldd) {
  const int64_t cb = cols / kVN * kVN;
  for (int64_t r = 0; r < rows; ++r) {
    const uint16_t* s = src + r * lds;
    float* d = dst + r * ldd;
    if (f == Half::f16) {
      for (int64_t e = 0; e < cb; e += kVN) store_n(d + e, LoadF16::load(s + e));
      for (int64_t e = cb; e < cols; ++e) d[e] = LoadF16::scalar(s[e]);
    } else {
      for (int64_t e = 0; e < cb; e += kVN) store_n(d + e, LoadBF16::load(s + e));
      for (int64_t e = cb; e < cols; ++e) d[e] = LoadBF16::scalar(s[e]);
    }
  }
}

void pack_panels(const float* src, int64_t rows, int64_t cols, int64_t rs, float* dst) {
  const int64_t np = (rows + kPanel - 1) / kPanel;
  for (int64_t p = 0; p < np; ++p) {
    float* d = dst + p * cols * kPanel;  // (cols, 64)
    const int64_t j0 = p * kPanel, nj = rows - j0 < kPanel ? rows - j0 : kPanel;
    if (nj < kPanel) std::memset(d, 0, sizeof(float) * static_cast<size_t>(cols * kPanel));
    // Whole blocks go through a register transpose, 16 x 16 with AVX-512 and 8 x 8 in 8-lane
    // registers on AVX2 (16-lane shuffles are assembled lane by lane there); the edges element
    // by element.
#if defined(__AVX2__) && !defined(__AVX512F__)
    constexpr int64_t kT = 8;
#else
    constexpr int64_t kT = kLanes;
#endif
    const int64_t jb = nj / kT * kT, eb = cols / kT * kT;
    for (int64_t j = 0; j < jb; j += kT)
      for (int64_t e = 0; e < eb; e += kT) {
#if defined(__AVX2__) && !defined(__AVX512F__)
        simd::vh r[8];
        for (int x = 0; x < 8; ++x) std::memcpy(&r[x], src + (j0 + j + x) * rs + e, sizeof r[x]);
        simd::transpose8(r);
        for (int x = 0; x < 8; ++x) std::memcpy(d + (e + x) * kPanel + j, &r[x], sizeof r[x]);
#else
        simd::vf r[16];
        for (int x = 0; x < 16; ++x) r[x] = simd::load(src + (j0 + j + x) * rs + e);
        simd::transpose16(r);
        for (int x = 0; x < 16; ++x) simd::store(d + (e + x) * kPanel + j, r[x]);
#endif
      }
    for (int64_t j = 0; j < nj; ++j) {
      const float* s = src + (j0 + j) * rs;
      for (int64_t e = j < jb ? eb : 0; e < cols; ++e) d[e * kPanel + j] = s[e];
    }
  }
}

RowsOperand rows_operand(const float* src, int64_t rows, int64_t cols, int64_t rs, float* scratch) {
  if (cols % kLanes == 0) return RowsOperand{src, rs};
  const int64_t cp = round_up(cols, kLanes);
  pack_rows(src, rows, cols, rs, scratch, rows, cp);
  return RowsOperand{scratch, cp};
}

void pack_transposed(const float* src, int64_t rows, int64_t cols, int64_t rs, float* dst,
                     int64_t rows_pad) {
  for (int64_t e = 0; e < cols; ++e) {
    float* d = dst + e * rows_pad;
    for (int64_t j = 0; j < rows; ++j) d[j] = src[j * rs + e];
    for (int64_t j = rows; j < rows_pad; ++j) d[j] = 0.f;
  }
}

void pack_rows(const float* src, int64_t rows, int64_t cols, int64_t rs, float* dst,
               int64_t rows_pad, int64_t cols_pad, float scale) {
  for (int64_t j = 0; j < rows; ++j) simd::copy_row(dst + j * cols_pad, src + j * rs, cols, cols_pad, scale);
  if (rows_pad > rows)
    std::memset(dst + rows * cols_pad, 0, sizeof(float) * static_cast<size_t>((rows_pad - rows) * cols_pad));
}

// The row passes, defined in rows_isa.cpp in this namespace.
float row_max(const float* row, int64_t width);
float exp2_row(float* row, int64_t width, float sub);
void exp2_rows_shifted(float* s, int64_t rows, int64_t ld, int64_t width, const float* m, const float* l2);
void prob_row(float* row, int64_t width, float lse2);
void grad_scores_rows(float* ds, const float* p, int64_t rows, int64_t ld, int64_t width, const float* di,
                      float scale);
float online_softmax_row(float* row, int64_t width, float& m, float& l);
void softmax_rows(float* s, int64_t rows, int64_t kw, int64_t k, float* lse2);
float softmax_row_extra(float* row, int64_t kw, float extra, float& p_extra);

extern const Kernels kTable = {gemm_abt,   gemm_abt_add, gemm_ab,   pack_panels, pack_transposed, rows_operand, pack_rows,
                               rows_dot,   gemm_abt16, gemm_ab16, to_half,   rows_dot16,      widen_rows,
                               row_max,    exp2_row,  exp2_rows_shifted, prob_row, grad_scores_rows,
                               online_softmax_row, softmax_rows, softmax_row_extra};

}  // namespace clattn::mk::CLATTN_ISA_NS
