// Layer state buffers and the key/value cache of decoding.
#include <algorithm>
#include <cstring>

#include "attention/validate.h"
#include "clattn/attention.h"
#include "clattn/kv_cache.h"
#include "core/microkernel.h"

namespace clattn {

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

KVCache::KVCache(int64_t batch, int64_t kv_heads, int64_t capacity, int64_t dk, int64_t dv,
                 int64_t query_heads)
    : B_(batch), Hkv_(kv_heads), Hq_(query_heads), cap_(mk::round_up(std::max<int64_t>(capacity, 1), mk::kPanel)),
      Dk_(dk), Dv_(dv), Dkp_(mk::round_up(dk, mk::kLanes)), Dvp_(mk::round_up(dv, mk::kLanes)) {
  check(batch >= 1 && kv_heads >= 1 && capacity >= 0 && dk >= 1 && dv >= 1,
        "KVCache: batch, kv_heads, dk, dv must be >= 1 and capacity >= 0, got batch ", batch,
        ", kv_heads ", kv_heads, ", capacity ", capacity, ", dk ", dk, ", dv ", dv);
  check(query_heads == 0 || (query_heads >= kv_heads && query_heads % kv_heads == 0),
        "KVCache: query_heads must be 0 (no queries kept) or a multiple of kv_heads ", kv_heads,
        ", got ", query_heads);
  check(capacity <= (int64_t{1} << 31), "KVCache: capacity ", capacity, " is above 2^31 positions");
  krow_ = Tensor(Shape{B_, Hkv_, cap_, Dkp_});
  kpan_ = Tensor(Shape{B_, Hkv_, cap_ / mk::kPanel, Dk_, mk::kPanel});
  vrow_ = Tensor(Shape{B_, Hkv_, cap_, Dvp_});
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
  for (int64_t b = 0; b < B_; ++b)
    for (int64_t hk = 0; hk < Hkv_; ++hk)
      for (int64_t t = 0; t < T; ++t) {
        const int64_t j = size_ + t;
        const float* kr = k.ptr(b, hk, t);
        std::memcpy(krow_.data() + ((b * Hkv_ + hk) * cap_ + j) * Dkp_, kr,
                    sizeof(float) * static_cast<size_t>(Dk_));
        std::memcpy(vrow_.data() + ((b * Hkv_ + hk) * cap_ + j) * Dvp_, v.ptr(b, hk, t),
                    sizeof(float) * static_cast<size_t>(Dv_));
        // Panel j/64, column j%64 of each of the Dk rows.
        float* pan = kpan_.data() + (b * Hkv_ + hk) * cap_ * Dk_ + (j / mk::kPanel) * Dk_ * mk::kPanel +
                     j % mk::kPanel;
        for (int64_t e = 0; e < Dk_; ++e) pan[e * mk::kPanel] = kr[e];
      }
  size_ += T;
}

void KVCache::truncate(int64_t n) {
  check(n >= 0 && n <= size_, "KVCache::truncate: n must be in [0, ", size_, "], got ", n);
  size_ = n;
  derived_.reset();
}

size_t KVCache::bytes() const {
  return sizeof(float) * static_cast<size_t>(krow_.numel() + kpan_.numel() + vrow_.numel() + qrow_.numel()) +
         (derived_ ? derived_->bytes() : 0);
}

ConstView KVCache::queries() const {
  check(Hq_ > 0, "KVCache::queries: this cache keeps no queries (construct it with query_heads)");
  ConstView v{qrow_.data(), Shape{B_, Hq_, size_, Dk_}, {}};
  v.strides = {Hq_ * cap_ * Dkp_, cap_ * Dkp_, Dkp_, 1};
  return v;
}

ConstView KVCache::keys() const {
  ConstView v{krow_.data(), Shape{B_, Hkv_, size_, Dk_}, {}};
  v.strides = {Hkv_ * cap_ * Dkp_, cap_ * Dkp_, Dkp_, 1};
  return v;
}
ConstView KVCache::values() const {
  ConstView v{vrow_.data(), Shape{B_, Hkv_, size_, Dv_}, {}};
  v.strides = {Hkv_ * cap_ * Dvp_, cap_ * Dvp_, Dvp_, 1};
  return v;
}
const float* KVCache::key_panels(int64_t b, int64_t hk) const {
  return kpan_.data() + (b * Hkv_ + hk) * cap_ * Dk_;
}
const float* KVCache::value_rows(int64_t b, int64_t hk) const {
  return vrow_.data() + (b * Hkv_ + hk) * cap_ * Dvp_;
}

}  // namespace clattn
