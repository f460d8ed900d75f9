#include <ostream>
#include "clattn/tensor.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <sstream>

#include <sys/mman.h>

namespace clattn {

std::ostream& operator<<(std::ostream& os, const Shape& s) { return os << s.str(); }

// The one size rule of every shape (see tensor.h): the product of max(d, 1) over the dims fits
// in int64. It bounds every contiguous stride as well as numel, also when a zero dim makes the
// tensor empty (a file may declare (0, 2^40, 2^40): no data, but strides of 2^80).
void Shape::check_extent() const {
  int64_t extent = 1;
  for (int i = 0; i < rank; ++i) {
    const int64_t d = dims[static_cast<size_t>(i)];
    check(!__builtin_mul_overflow(extent, d > 1 ? d : 1, &extent), "tensor: shape ", *this,
          " is too large: its sizes overflow a 64-bit element count");
  }
}

Shape::Shape(std::initializer_list<int64_t> d) {
  check(d.size() <= static_cast<size_t>(kMaxRank), "tensor: rank must be <= ", kMaxRank, ", got ",
        d.size());
  for (int64_t x : d) dims[static_cast<size_t>(rank++)] = x;
  check_extent();
}

Shape::Shape(const std::vector<int64_t>& d) {
  check(d.size() <= static_cast<size_t>(kMaxRank), "tensor: rank must be <= ", kMaxRank, ", got ",
        d.size());
  for (int64_t x : d) dims[static_cast<size_t>(rank++)] = x;
  check_extent();
}

int64_t Shape::numel() const {
  // Checked: dims is public, so a shape may have been edited after construction.
  int64_t n = 1;
  for (int i = 0; i < rank; ++i)
    if (__builtin_mul_overflow(n, dims[static_cast<size_t>(i)], &n)) [[unlikely]]
      fail("tensor: shape ", *this, " overflows a 64-bit element count");
  return n;
}

bool Shape::operator==(const Shape& o) const {
  if (rank != o.rank) return false;
  for (int i = 0; i < rank; ++i)
    if (dims[static_cast<size_t>(i)] != o.dims[static_cast<size_t>(i)]) return false;
  return true;
}

std::string Shape::str() const {
  std::ostringstream os;
  os << "(";
  for (int i = 0; i < rank; ++i) os << (i ? ", " : "") << dims[static_cast<size_t>(i)];
  os << ")";
  return os.str();
}

std::array<int64_t, kMaxRank> contiguous_strides(const Shape& s) {
  std::array<int64_t, kMaxRank> st{};
  int64_t acc = 1;
  for (int i = s.rank - 1; i >= 0; --i) {
    st[static_cast<size_t>(i)] = acc;
    if (__builtin_mul_overflow(acc, s[i], &acc)) [[unlikely]]
      fail("tensor: shape ", s, " overflows 64-bit strides");
  }
  return st;
}

View make_view(float* data, const Shape& s) { return View{data, s, contiguous_strides(s)}; }
ConstView make_view(const float* data, const Shape& s) {
  return ConstView{data, s, contiguous_strides(s)};
}

// Buffers of 2 MB and more are 2 MB aligned and advised onto transparent huge pages: the first
// touch of fresh 4 KB pages costs ~0.7 s/GB on the machines we run on (a fault and a clear per
// page), with huge pages ~0.14 s/GB; random row gathers over long sequences also stop missing
// the TLB. The rounding wastes at most half of a buffer at exactly 2 MB, ~nothing beyond.
float* aligned_alloc_floats(size_t n) {
  constexpr size_t kHuge = size_t{2} << 20;
  size_t want = 0;
  check(!__builtin_mul_overflow(n, sizeof(float), &want), "tensor: ", n,
        " floats do not fit in the address space");
  want = std::max<size_t>(want, 1);
  const size_t align = want >= kHuge ? kHuge : 64;
  const size_t bytes = (want + align - 1) / align * align;
  void* p = std::aligned_alloc(align, bytes);
  if (!p) throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
  if (align == kHuge) madvise(p, bytes, MADV_HUGEPAGE);  // advice only: failure leaves ordinary pages
#endif
  return static_cast<float*>(p);
}

void aligned_free_floats(float* p) { std::free(p); }

void Tensor::Free::operator()(float* p) const { aligned_free_floats(p); }

Tensor::Tensor(const Shape& s) {
  resize(s);
  fill(0.f);
}

Tensor Tensor::empty_like_shape(const Shape& s) {
  Tensor t;
  t.resize(s);
  return t;
}

void Tensor::resize(const Shape& s) {
  for (int i = 0; i < s.rank; ++i) check(s[i] >= 0, "tensor: dims must be >= 0, got ", s);
  const int64_t n = s.numel();
  if (n > capacity_ || !storage_) {
    storage_.reset(aligned_alloc_floats(static_cast<size_t>(n)));
    capacity_ = n;
  }
  data_ = storage_.get();
  shape_ = s;
}

void Tensor::fill(float x) {
  const int64_t n = numel();
  for (int64_t i = 0; i < n; ++i) data_[i] = x;
}

Tensor Tensor::from(ConstView v) {
  Tensor t = empty_like_shape(v.shape);
  const int r = v.rank();
  const int64_t n = v.numel();
  std::array<int64_t, kMaxRank> idx{};
  for (int64_t e = 0; e < n; ++e) {
    int64_t off = 0;
    for (int i = 0; i < r; ++i) off += idx[static_cast<size_t>(i)] * v.stride(i);
    t.data_[e] = v.data[off];
    for (int i = r - 1; i >= 0; --i) {
      if (++idx[static_cast<size_t>(i)] < v.dim(i)) break;
      idx[static_cast<size_t>(i)] = 0;
    }
  }
  return t;
}

float* Workspace::floats(size_t n) {
  if (n > capacity_ || !buf_) {
    buf_.reset(aligned_alloc_floats(n));
    capacity_ = n;
  }
  return buf_.get();
}

}  // namespace clattn
