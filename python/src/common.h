// Shared by the binding files: NumPy arrays in and out of clattn's views, and the error rules.
//
// Arrays in: float32 arrays whose innermost stride is one element (C-contiguous or any view of
// rows, as the C++ contract allows) are used in place, without a copy. Other floating dtypes
// (float64, float16, longdouble) are converted to a float32 copy, and so are layouts the
// contract cannot read (a transposed last dim, negative or unaligned strides); the copy is
// recorded so that callers and tests can see it. Integer, bool, complex and object arrays are
// refused with a TypeError: converting them would hide a mistake.
//
// Errors: bad specs, shapes, lengths and values are ValueError; everything else clattn throws
// is RuntimeError, with clattn's message unchanged (see module.cpp for the translator).
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <initializer_list>
#include <utility>
#include <span>
#include <string>
#include <vector>

#include "clattn/error.h"
#include "clattn/tensor.h"

namespace clattn::py {

namespace pb = pybind11;

// A float32 array and the clattn view over it. `keep` owns the memory the view reads: the
// caller's array itself, or the converted copy.
struct FloatArg {
  pb::array keep;
  ConstView view;
  bool copied = false;
};

// `obj` as a float32 array of `rank` dims ("q", rank 4, "(B, H, N, D)" name the rule in errors).
FloatArg float_arg(pb::handle obj, const char* name, int rank, const char* layout);

// A writable float32 array of exactly `shape` with a unit innermost stride (an output the
// caller gave), as a view; ValueError otherwise.
View out_arg(pb::handle obj, const char* name, const Shape& shape);

// An output written in place must not overlap itself (a zero stride, rows closer than their
// length) nor share memory with any array the call reads (numpy.shares_memory, exact: slices of
// one buffer that interleave without sharing an element are fine): ValueError naming both.
// `others` are (name, array) pairs; None entries are skipped.
void check_output_alone(const char* name, ConstView view, pb::handle out,
                        std::initializer_list<std::pair<const char*, pb::handle>> others);

// Lengths: None -> empty; otherwise a 1-D integer sequence converted to int32 (ValueError for
// values outside int32 or non-integers).
pb::array_t<int32_t> int_arg(pb::handle obj, const char* name);
std::span<const int32_t> span_of(const pb::array_t<int32_t>& a);

// A new C-contiguous float32 array of `shape`, zero-filled when asked (gradients accumulate).
pb::array_t<float> new_array(const Shape& shape, bool zero);

// An owning Tensor handed to NumPy without a copy (the array owns it through a capsule).
pb::array to_numpy(Tensor&& t);
// The same for a vector of ints, reshaped to `dims` (their product its size).
template <class T>
pb::array_t<T> to_numpy(std::vector<T>&& v, std::vector<pb::ssize_t> dims) {
  auto* owner = new std::vector<T>(std::move(v));
  pb::capsule cap(owner, [](void* p) { delete static_cast<std::vector<T>*>(p); });
  return pb::array_t<T>(std::move(dims), owner->data(), cap);
}

// str(obj) as a std::string.
inline std::string to_str(pb::handle obj) { return pb::str(obj).cast<std::string>(); }

// "(2, 3)".
std::string shape_str(pb::handle array);

// The threads every kernel call runs on (0: OpenMP's default). omp_set_num_threads only sets the
// calling thread's value, and Python may call from any thread: each call applies it itself.
void apply_threads();
void set_default_threads(int n);  // clattn.set_num_threads
int default_threads();
// The team clattn starts with: OMP_NUM_THREADS when set (its first level), else the processors
// this process may run on. Not the importing thread's OpenMP setting: importing torch (or any
// torch op) lowers that to torch's own thread count, which is not clattn's.
int initial_threads();

// `s` with every byte that is not part of valid UTF-8 written as \xNN: clattn's messages quote
// file contents (tensor names, tokens) verbatim, and Python turns a message that is not UTF-8
// into an empty one.
std::string utf8_safe(const std::string& s);
// ValueError with clattn's message, made UTF-8-safe.
[[noreturn]] void throw_value_error(const std::string& what);
// f(), with clattn's errors raised as ValueError: for calls whose every refusal is a bad argument.
template <class F>
auto value_errors(F&& f) {
  try {
    return f();
  } catch (const Error& e) {
    throw_value_error(e.what());
  }
}

}  // namespace clattn::py
