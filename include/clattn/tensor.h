// Float32 tensors: shape + strides (in elements), owning (Tensor) or borrowed (View, ConstView).
// Owning storage is 64-byte aligned so SIMD kernels and per-thread scratch never share a line.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "clattn/error.h"

namespace clattn {

inline constexpr int kMaxRank = 6;

// Sizes are checked once, here: constructing a Shape throws clattn::Error when the product of
// max(d, 1) over its dims overflows int64, so numel, every contiguous stride and every offset
// below them fit in 64 bits, empty shapes included. Negative dims are left to the validators,
// which name the argument (Tensor refuses them too).
struct Shape {
  std::array<int64_t, kMaxRank> dims{};
  int rank = 0;

  Shape() = default;
  Shape(std::initializer_list<int64_t> d);
  explicit Shape(const std::vector<int64_t>& d);
  int64_t operator[](int i) const { return dims[static_cast<size_t>(i)]; }
  int64_t numel() const;
  bool operator==(const Shape& o) const;
  std::string str() const;  // "(1, 8, 64, 64)"
  void check_extent() const;  // throws unless the product of max(d, 1) fits in int64
};
// Streams str(): pass a Shape itself to check(), so it is formatted only when the check fails.
std::ostream& operator<<(std::ostream& os, const Shape& s);

template <class T>
struct BasicView {
  T* data = nullptr;
  Shape shape;
  std::array<int64_t, kMaxRank> strides{};  // in elements

  bool empty() const { return data == nullptr; }
  int rank() const { return shape.rank; }
  int64_t dim(int i) const { return shape[i]; }
  int64_t stride(int i) const { return strides[static_cast<size_t>(i)]; }
  int64_t numel() const { return shape.numel(); }
  bool contiguous() const {
    int64_t s = 1;
    for (int i = shape.rank - 1; i >= 0; --i) {
      if (shape[i] != 1 && strides[static_cast<size_t>(i)] != s) return false;
      s *= shape[i];
    }
    return true;
  }
  // Element pointer for a full index (no bounds check: callers validated shapes up front).
  template <class... I>
  T* ptr(I... idx) const {
    const int64_t ix[] = {static_cast<int64_t>(idx)...};
    int64_t off = 0;
    for (size_t i = 0; i < sizeof...(I); ++i) off += ix[i] * strides[i];
    return data + off;
  }
  operator BasicView<const T>() const requires(!std::is_const_v<T>) {
    return BasicView<const T>{data, shape, strides};
  }
};

using View = BasicView<float>;
using ConstView = BasicView<const float>;

// Contiguous row-major strides for a shape.
std::array<int64_t, kMaxRank> contiguous_strides(const Shape& s);

// A view over contiguous memory.
View make_view(float* data, const Shape& s);
ConstView make_view(const float* data, const Shape& s);

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(const Shape& s);                  // zero-filled
  static Tensor empty_like_shape(const Shape& s);   // uninitialised
  static Tensor from(ConstView v);                  // contiguous copy of any view

  const Shape& shape() const { return shape_; }
  int64_t dim(int i) const { return shape_[i]; }
  int rank() const { return shape_.rank; }
  int64_t numel() const { return shape_.numel(); }
  bool defined() const { return data_ != nullptr; }
  float* data() { return data_; }
  const float* data() const { return data_; }
  View view() { return make_view(data_, shape_); }
  ConstView view() const { return make_view(static_cast<const float*>(data_), shape_); }
  ConstView cview() const { return view(); }
  operator View() { return view(); }
  operator ConstView() const { return view(); }
  void fill(float x);
  // Reshape in place when the element count is unchanged; otherwise reallocate. Reuses storage
  // whose capacity suffices, so workspaces sized once are never touched fresh again.
  void resize(const Shape& s);
  size_t bytes() const { return static_cast<size_t>(capacity_) * sizeof(float); }  // storage held

 private:
  struct Free { void operator()(float* p) const; };
  std::unique_ptr<float[], Free> storage_;
  int64_t capacity_ = 0;
  float* data_ = nullptr;
  Shape shape_;
};

// 64-byte aligned allocation of n floats (uninitialised) and its matching free.
float* aligned_alloc_floats(size_t n);
void aligned_free_floats(float* p);

// Aligned, uninitialised scratch that only grows: the workspace idiom of kernels.
class Workspace {
 public:
  float* floats(size_t n);  // pointer to at least n floats, valid until the next call
  const float* data() const { return buf_.get(); }  // what the last floats() returned
  size_t capacity() const { return capacity_; }
  size_t bytes() const { return capacity_ * sizeof(float); }
 private:
  struct Free { void operator()(float* p) const { aligned_free_floats(p); } };
  std::unique_ptr<float[], Free> buf_;
  size_t capacity_ = 0;
};

// Bytes held by workspaces and vectors: what a kernel's workspace reports to its Scratch.
inline size_t held_bytes() { return 0; }
template <class T, class... R>
size_t held_bytes(const T& x, const R&... rest) {
  if constexpr (requires { x.capacity(); x.data(); })
    return x.capacity() * sizeof(*x.data()) + held_bytes(rest...);
  else
    return x.bytes() + held_bytes(rest...);
}

}  // namespace clattn
