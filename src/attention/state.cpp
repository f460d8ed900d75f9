// Layer state buffers and the key/value cache of decoding.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "attention/validate.h"
#include "clattn/attention.h"
#include "clattn/kv_cache.h"
#include "core/ascii.h"
#include "core/microkernel.h"

namespace clattn {
namespace {
// The largest finite value of each 16-bit storage: f16's 65504, bf16's 0x7f7f.
constexpr float kF16Max = 65504.f, kBF16Max = 3.38953139e38f;

// Where position j's column starts in the key panels of one head (cap/64, Dk, 64) that begin at
// `head * cap * dk`: its element e lies e * 64 further on.
int64_t panel_column(int64_t head, int64_t j, int64_t cap, int64_t dk) {
  return head * cap * dk + (j / mk::kPanel) * dk * mk::kPanel + j % mk::kPanel;
}
void spread(const float* row, int64_t d, float* col) {  // row (d) -> col (d at stride 64)
  for (int64_t e = 0; e < d; ++e) col[e * mk::kPanel] = row[e];
}
// A key row narrowed into a 16-bit panel column, through a stack buffer of 256 (to_half converts
// contiguous runs).
void spread16(mk::Half f, const float* row, int64_t d, uint16_t* col) {
  uint16_t kh[256];
  for (int64_t e0 = 0; e0 < d; e0 += 256) {
    const int64_t n = std::min<int64_t>(256, d - e0);
    mk::to_half(f, row + e0, n, kh);
    for (int64_t e = 0; e < n; ++e) col[(e0 + e) * mk::kPanel] = kh[e];
  }
}
void gather16(mk::Half f, const uint16_t* col, int64_t d, float* row) {  // spread16's inverse
  uint16_t kh[256];
  for (int64_t e0 = 0; e0 < d; e0 += 256) {
    const int64_t n = std::min<int64_t>(256, d - e0);
    for (int64_t e = 0; e < n; ++e) kh[e] = col[(e0 + e) * mk::kPanel];
    mk::widen_rows(f, kh, 1, n, n, row + e0, n);
  }
}
}  // namespace

Tensor* AttentionState::find(std::string_view name) {
  for (auto& [n, t] : buffers)
    if (n == name) return &t;
  return nullptr;
}
const Tensor* AttentionState::find(std::string_view name) const {
  for (const auto& [n, t] : buffers)
    if (n == name) return &t;
  return nullptr;
}
Tensor& AttentionState::add(std::string name, const Shape& shape) {
  if (Tensor* t = find(name)) {
    *t = Tensor(shape);
    return *t;
  }
  buffers.emplace_back(std::move(name), Tensor(shape));
  return buffers.back().second;
}

const char* kv_cache_type_name(KVCacheType t) {
  switch (t) {
    case KVCacheType::f16: return "f16";
    case KVCacheType::bf16: return "bf16";
    default: return "f32";
  }
}

KVCacheType parse_kv_cache_type(std::string_view s) {
  const std::string low = detail::ascii_lower(s);
  for (KVCacheType t : {KVCacheType::f32, KVCacheType::f16, KVCacheType::bf16})
    if (low == kv_cache_type_name(t)) return t;
  throw Error(detail::concat("KV cache type must be f32, f16 or bf16, got \"", s, "\""));
}

KVCache::KVCache(int64_t batch, int64_t kv_heads, int64_t capacity, int64_t dk, int64_t dv,
                 int64_t query_heads, KVCacheType type)
    : B_(batch), Hkv_(kv_heads), Hq_(query_heads), cap_(mk::round_up(std::max<int64_t>(capacity, 1), mk::kPanel)),
      Dk_(dk), Dv_(dv), Dkp_(mk::round_up(dk, mk::kLanes)), Dvp_(mk::round_up(dv, mk::kLanes)), type_(type) {
  check(batch >= 1 && kv_heads >= 1 && capacity >= 0 && dk >= 1 && dv >= 1,
        "KVCache: batch, kv_heads, dk, dv must be >= 1 and capacity >= 0, got batch ", batch,
        ", kv_heads ", kv_heads, ", capacity ", capacity, ", dk ", dk, ", dv ", dv);
  check(query_heads == 0 || (query_heads >= kv_heads && query_heads % kv_heads == 0),
        "KVCache: query_heads must be 0 (no queries kept) or a multiple of kv_heads ", kv_heads,
        ", got ", query_heads);
  check(capacity <= (int64_t{1} << 31), "KVCache: capacity ", capacity, " is above 2^31 positions");
  if (type == KVCacheType::f32) {
    krow_ = Tensor(Shape{B_, Hkv_, cap_, Dkp_});
    kpan_ = Tensor(Shape{B_, Hkv_, cap_ / mk::kPanel, Dk_, mk::kPanel});
    vrow_ = Tensor(Shape{B_, Hkv_, cap_, Dvp_});
  } else {
    kpan16_.assign(static_cast<size_t>(B_ * Hkv_ * cap_ * Dk_), 0);   // (B, Hkv, cap/64, Dk, 64)
    vrow16_.assign(static_cast<size_t>(B_ * Hkv_ * cap_ * Dvp_), 0);  // (B, Hkv, cap, Dvp)
    // K rows too where the attention gathers keys by index (causal clustered's T_j): a row is two
    // cache lines, its column of the panels 64 (one per element).
    if (Hq_ > 0) krow16_.assign(static_cast<size_t>(B_ * Hkv_ * cap_ * Dkp_), 0);  // (B, Hkv, cap, Dkp)
  }
  if (Hq_ > 0) qrow_ = Tensor(Shape{B_, Hq_, cap_, Dkp_});
  kmax_.assign(static_cast<size_t>(cap_), 0.f);
  vmax_.assign(static_cast<size_t>(cap_), 0.f);
  if (Hq_ > 0) qmax_.assign(static_cast<size_t>(cap_), 0.f);
}

void KVCache::append(ConstView k, ConstView v, ConstView q) {
  check(k.rank() == 4 && v.rank() == 4, "KVCache::append: k and v must be (B, Hkv, T, D), got k ",
        k.shape, ", v ", v.shape);
  const int64_t T = k.dim(2);
  check(k.dim(0) == B_ && k.dim(1) == Hkv_ && k.dim(3) == Dk_ && v.dim(0) == B_ &&
            v.dim(1) == Hkv_ && v.dim(2) == T && v.dim(3) == Dv_,
        "KVCache::append: the cache holds (B, Hkv) = (", B_, ", ", Hkv_, "), Dk = ", Dk_,
        ", Dv = ", Dv_, "; got k ", k.shape, ", v ", v.shape);
  check(T == 0 || (k.stride(3) == 1 && v.stride(3) == 1),
        "KVCache::append: k and v must have unit stride in their last dim");
  check(size_ + T <= cap_, "KVCache::append: ", T, " new positions overflow the capacity ", cap_,
        " (", size_, " held)");
  if (Hq_ > 0)
    check(q.rank() == 4 && q.dim(0) == B_ && q.dim(1) == Hq_ && q.dim(2) == T && q.dim(3) == Dk_ &&
              (T == 0 || q.stride(3) == 1),
          "KVCache::append: this cache keeps queries: q must be (B, H, T, Dk) = (", B_, ", ", Hq_, ", ", T,
          ", ", Dk_, ") with unit last stride, got ", q.shape);
  else
    check(q.data == nullptr, "KVCache::append: q given to a cache that keeps no queries (construct it "
          "with query_heads)");
  if (T == 0) return;
  // One pass finds non-finite values and the magnitudes the overflow rule reads in decode steps.
  const float new_k = static_cast<float>(finite_max_abs(k, "k", "KVCache::append"));
  const float new_v = static_cast<float>(finite_max_abs(v, "v", "KVCache::append"));
  const float new_q = Hq_ > 0 ? static_cast<float>(finite_max_abs(q, "q", "KVCache::append")) : 0.f;
  if (type_ != KVCacheType::f32) {
    const bool f16 = type_ == KVCacheType::f16;
    const float top = f16 ? kF16Max : kBF16Max;
    check(new_k <= top && new_v <= top, "KVCache::append: |k| reaches ", new_k, " and |v| ", new_v, ", past ",
          kv_cache_type_name(type_), "'s largest finite value ", f16 ? "65504: use a bf16 or f32 cache" : "3.39e38: use an f32 cache");
  }
  for (int64_t t = 0; t < T; ++t) {
    const size_t j = static_cast<size_t>(size_ + t);
    kmax_[j] = std::max(new_k, size_ > 0 ? kmax_[static_cast<size_t>(size_ - 1)] : 0.f);
    vmax_[j] = std::max(new_v, size_ > 0 ? vmax_[static_cast<size_t>(size_ - 1)] : 0.f);
    if (Hq_ > 0) qmax_[j] = std::max(new_q, size_ > 0 ? qmax_[static_cast<size_t>(size_ - 1)] : 0.f);
  }
  if (Hq_ > 0) {
    for (int64_t b = 0; b < B_; ++b)
      for (int64_t h = 0; h < Hq_; ++h)
        for (int64_t t = 0; t < T; ++t)
          std::memcpy(qrow_.data() + ((b * Hq_ + h) * cap_ + size_ + t) * Dkp_, q.ptr(b, h, t),
                      sizeof(float) * static_cast<size_t>(Dk_));
  }
  if (type_ != KVCacheType::f32) {
    append16(k, v, T);
    size_ += T;
    return;
  }
  for (int64_t b = 0; b < B_; ++b)
    for (int64_t hk = 0; hk < Hkv_; ++hk)
      for (int64_t t = 0; t < T; ++t) {
        const int64_t j = size_ + t;
        const float* kr = k.ptr(b, hk, t);
        std::memcpy(krow_.data() + ((b * Hkv_ + hk) * cap_ + j) * Dkp_, kr,
                    sizeof(float) * static_cast<size_t>(Dk_));
        std::memcpy(vrow_.data() + ((b * Hkv_ + hk) * cap_ + j) * Dvp_, v.ptr(b, hk, t),
                    sizeof(float) * static_cast<size_t>(Dv_));
        spread(kr, Dk_, kpan_.data() + panel_column(b * Hkv_ + hk, j, cap_, Dk_));
      }
  size_ += T;
}

void KVCache::append16(ConstView k, ConstView v, int64_t T) {
  const mk::Half f = type_ == KVCacheType::f16 ? mk::Half::f16 : mk::Half::bf16;
  for (int64_t b = 0; b < B_; ++b)
    for (int64_t hk = 0; hk < Hkv_; ++hk)
      for (int64_t t = 0; t < T; ++t) {
        const int64_t j = size_ + t, head = b * Hkv_ + hk;
        mk::to_half(f, v.ptr(b, hk, t), Dv_, vrow16_.data() + (head * cap_ + j) * Dvp_);
        const float* kr = k.ptr(b, hk, t);
        if (!krow16_.empty()) mk::to_half(f, kr, Dk_, krow16_.data() + (head * cap_ + j) * Dkp_);
        spread16(f, kr, Dk_, kpan16_.data() + panel_column(head, j, cap_, Dk_));
      }
}

void KVCache::truncate(int64_t n) {
  check(n >= 0 && n <= size_, "KVCache::truncate: n must be in [0, ", size_, "], got ", n);
  size_ = n;
  derived_.reset();
}

void KVCache::drop(int64_t first, int64_t count, const RowRotation& rotate) {
  check(first >= 0 && count >= 0 && first + count <= size_, "KVCache::drop: positions [", first, ", ", first + count,
        ") must lie within the ", size_, " held");
  if (count == 0) return;
  const int64_t from = first + count, moved = size_ - from, now = size_ - count;
  const bool half = type_ != KVCacheType::f32;
  const mk::Half f = type_ == KVCacheType::f16 ? mk::Half::f16 : mk::Half::bf16;
  // Largest |k| and |q| over the heads of each moved position, after the rotation.
  std::vector<float> kmov(static_cast<size_t>(moved), 0.f), qmov(static_cast<size_t>(moved), 0.f);
  auto row_max = [](const float* rows, int64_t n, int64_t ld, int64_t d, std::vector<float>& into) {
    for (int64_t t = 0; t < n; ++t)
      for (int64_t e = 0; e < d; ++e) into[static_cast<size_t>(t)] = std::max(into[static_cast<size_t>(t)], std::fabs(rows[t * ld + e]));
  };
  std::vector<float> wide;  // (moved, Dkp): a 16-bit cache's moved keys of one head, widened
  if (half) wide.assign(static_cast<size_t>(std::max<int64_t>(moved, 1) * Dkp_), 0.f);
  for (int64_t b = 0; b < B_; ++b)
    for (int64_t hk = 0; hk < Hkv_; ++hk) {
      const int64_t head = b * Hkv_ + hk;
      float* rows = nullptr;  // (moved, Dkp): the moved keys in f32, at their new positions
      if (!half) {
        rows = krow_.data() + (head * cap_ + first) * Dkp_;
        std::memmove(rows, rows + count * Dkp_, sizeof(float) * static_cast<size_t>(moved * Dkp_));
        float* vr = vrow_.data() + head * cap_ * Dvp_;
        std::memmove(vr + first * Dvp_, vr + from * Dvp_, sizeof(float) * static_cast<size_t>(moved * Dvp_));
      } else {
        rows = wide.data();
        for (int64_t t = 0; t < moved; ++t)
          gather16(f, kpan16_.data() + panel_column(head, from + t, cap_, Dk_), Dk_, rows + t * Dkp_);
        uint16_t* vr = vrow16_.data() + head * cap_ * Dvp_;
        std::memmove(vr + first * Dvp_, vr + from * Dvp_, sizeof(uint16_t) * static_cast<size_t>(moved * Dvp_));
      }
      if (rotate && moved > 0) rotate(rows, moved, Dkp_);
      row_max(rows, moved, Dkp_, Dk_, kmov);
      // The panels (and a 16-bit cache's K rows) from the moved rows; columns past the new size
      // zero again.
      for (int64_t t = 0; t < moved; ++t) {
        const int64_t j = first + t;
        const float* kr = rows + t * Dkp_;
        if (!half) {
          spread(kr, Dk_, kpan_.data() + panel_column(head, j, cap_, Dk_));
          continue;
        }
        spread16(f, kr, Dk_, kpan16_.data() + panel_column(head, j, cap_, Dk_));
        if (!krow16_.empty()) mk::to_half(f, kr, Dk_, krow16_.data() + (head * cap_ + j) * Dkp_);
      }
      for (int64_t j = now; j < size_; ++j)
        for (int64_t e = 0; e < Dk_; ++e) {
          const int64_t at = panel_column(head, j, cap_, Dk_) + e * mk::kPanel;
          if (half)
            kpan16_[static_cast<size_t>(at)] = 0;
          else
            kpan_.data()[at] = 0.f;
        }
    }
  if (Hq_ > 0)
    for (int64_t b = 0; b < B_; ++b)
      for (int64_t h = 0; h < Hq_; ++h) {
        float* rows = qrow_.data() + ((b * Hq_ + h) * cap_ + first) * Dkp_;
        std::memmove(rows, rows + count * Dkp_, sizeof(float) * static_cast<size_t>(moved * Dkp_));
        if (rotate && moved > 0) rotate(rows, moved, Dkp_);
        row_max(rows, moved, Dkp_, Dk_, qmov);
      }
  // Prefix maxima of the new layout: those before `first` hold; a moved position's V bound is its
  // old prefix bound (values are not rotated), its K and Q bounds are measured.
  for (int64_t t = 0; t < moved; ++t) {
    const size_t j = static_cast<size_t>(first + t), prev = j - 1;
    const bool head = first + t == 0;
    kmax_[j] = std::max(kmov[static_cast<size_t>(t)], head ? 0.f : kmax_[prev]);
    vmax_[j] = vmax_[j + static_cast<size_t>(count)];
    if (Hq_ > 0) qmax_[j] = std::max(qmov[static_cast<size_t>(t)], head ? 0.f : qmax_[prev]);
  }
  size_ = now;
  derived_.reset();
}

size_t KVCache::bytes() const {
  return sizeof(float) * static_cast<size_t>(krow_.numel() + kpan_.numel() + vrow_.numel() + qrow_.numel()) +
         sizeof(uint16_t) * (kpan16_.size() + vrow16_.size() + krow16_.size()) + (derived_ ? derived_->bytes() : 0);
}

ConstView KVCache::queries() const {
  check(Hq_ > 0, "KVCache::queries: this cache keeps no queries (construct it with query_heads)");
  ConstView v{qrow_.data(), Shape{B_, Hq_, size_, Dk_}, {}};
  v.strides = {Hq_ * cap_ * Dkp_, cap_ * Dkp_, Dkp_, 1};
  return v;
}

ConstView KVCache::keys() const {
  ConstView v{type_ == KVCacheType::f32 ? krow_.data() : nullptr, Shape{B_, Hkv_, size_, Dk_}, {}};
  v.strides = {Hkv_ * cap_ * Dkp_, cap_ * Dkp_, Dkp_, 1};
  return v;
}
ConstView KVCache::values() const {
  ConstView v{type_ == KVCacheType::f32 ? vrow_.data() : nullptr, Shape{B_, Hkv_, size_, Dv_}, {}};
  v.strides = {Hkv_ * cap_ * Dvp_, cap_ * Dvp_, Dvp_, 1};
  return v;
}
const float* KVCache::key_panels(int64_t b, int64_t hk) const {
  check(type_ == KVCacheType::f32, "KVCache::key_panels: this cache holds ", kv_cache_type_name(type_), " (key_panels16)");
  return kpan_.data() + (b * Hkv_ + hk) * cap_ * Dk_;
}
const float* KVCache::value_rows(int64_t b, int64_t hk) const {
  check(type_ == KVCacheType::f32, "KVCache::value_rows: this cache holds ", kv_cache_type_name(type_), " (value_rows16)");
  return vrow_.data() + (b * Hkv_ + hk) * cap_ * Dvp_;
}
const uint16_t* KVCache::key_panels16(int64_t b, int64_t hk) const {
  check(type_ != KVCacheType::f32, "KVCache::key_panels16: this cache holds f32 (key_panels)");
  return kpan16_.data() + (b * Hkv_ + hk) * cap_ * Dk_;
}
const uint16_t* KVCache::key_rows16(int64_t b, int64_t hk) const {
  check(!krow16_.empty(), "KVCache::key_rows16: only a 16-bit cache that keeps queries holds key rows");
  return krow16_.data() + (b * Hkv_ + hk) * cap_ * Dkp_;
}
const uint16_t* KVCache::value_rows16(int64_t b, int64_t hk) const {
  check(type_ != KVCacheType::f32, "KVCache::value_rows16: this cache holds f32 (value_rows)");
  return vrow16_.data() + (b * Hkv_ + hk) * cap_ * Dvp_;
}

}  // namespace clattn
