#include "common.h"

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <thread>
#include <vector>

#include "clattn/threads.h"

namespace clattn::py {
namespace {

std::atomic<int> g_threads{0};

bool is_native_float32(const pb::array& a) {
  const pb::dtype dt = a.dtype();
  return dt.kind() == 'f' && dt.itemsize() == 4 && dt.attr("isnative").cast<bool>();
}

// Whether clattn can read `a` in place: strides in whole, non-negative floats, the innermost one
// unit (or irrelevant), and a 4-byte aligned pointer.
bool readable_in_place(const pb::array& a) {
  if (reinterpret_cast<uintptr_t>(a.data()) % alignof(float) != 0) return false;
  if (a.size() == 0) return true;
  for (pb::ssize_t i = 0; i < a.ndim(); ++i) {
    const pb::ssize_t s = a.strides(i);
    if (s < 0 || s % static_cast<pb::ssize_t>(sizeof(float)) != 0) return false;
  }
  const pb::ssize_t last = a.ndim() - 1;
  return a.ndim() == 0 || a.shape(last) == 1 || a.strides(last) == static_cast<pb::ssize_t>(sizeof(float));
}

using ContiguousFloat = pb::array_t<float, pb::array::c_style | pb::array::forcecast>;

}  // namespace

std::string shape_str(pb::handle array) {
  return to_str(array.attr("shape"));
}

FloatArg float_arg(pb::handle obj, const char* name, int rank, const char* layout) {
  if (obj.is_none()) throw pb::value_error(std::string(name) + " is missing (got None)");
  FloatArg r;
  if (pb::isinstance<pb::array>(obj)) {
    r.keep = pb::reinterpret_borrow<pb::array>(obj);
  } else {  // a list, a scalar, an object with __array__: NumPy's conversion, which may copy
    r.keep = pb::array::ensure(obj);
    if (!r.keep) {
      PyErr_Clear();
      throw pb::type_error(std::string(name) + " must be an array, got " +
                           to_str(pb::type::of(obj).attr("__name__")));
    }
    r.copied = true;
  }
  const pb::dtype dt = r.keep.dtype();
  if (dt.kind() != 'f')
    throw pb::type_error(std::string(name) + " must be a floating-point array (float32 is used in place, "
                         "other float types are converted to float32), got dtype " +
                         to_str(dt));
  if (r.keep.ndim() != rank)
    throw pb::value_error(std::string(name) + " must have rank " + std::to_string(rank) + " " + layout +
                          ", got shape " + shape_str(r.keep));
  if (!is_native_float32(r.keep) || !readable_in_place(r.keep)) {
    r.keep = ContiguousFloat::ensure(r.keep);
    if (!r.keep) throw pb::error_already_set();
    r.copied = true;
  }
  r.view.data = static_cast<const float*>(r.keep.data());
  r.view.shape.rank = rank;
  for (int i = 0; i < rank; ++i) {
    r.view.shape.dims[static_cast<size_t>(i)] = r.keep.shape(i);
    r.view.strides[static_cast<size_t>(i)] = r.keep.strides(i) / static_cast<pb::ssize_t>(sizeof(float));
  }
  return r;
}

View out_arg(pb::handle obj, const char* name, const Shape& shape) {
  if (!pb::isinstance<pb::array>(obj))
    throw pb::type_error(std::string(name) + " must be a NumPy float32 array of shape " + shape.str());
  auto a = pb::reinterpret_borrow<pb::array>(obj);
  if (!is_native_float32(a))
    throw pb::type_error(std::string(name) + " must be float32, got dtype " + to_str(a.dtype()));
  if (!a.writeable()) throw pb::value_error(std::string(name) + " is read-only");
  bool same = a.ndim() == shape.rank;
  for (int i = 0; same && i < shape.rank; ++i) same = a.shape(i) == shape[i];
  if (!same)
    throw pb::value_error(std::string(name) + " must have shape " + shape.str() + ", got " + shape_str(a));
  if (!readable_in_place(a))
    throw pb::value_error(std::string(name) + " must have a unit innermost stride and non-negative, "
                          "aligned strides (written in place)");
  View v;
  v.data = static_cast<float*>(a.mutable_data());
  v.shape = shape;
  for (int i = 0; i < shape.rank; ++i)
    v.strides[static_cast<size_t>(i)] = a.strides(i) / static_cast<pb::ssize_t>(sizeof(float));
  return v;
}

namespace {

// Whether two elements of v share an address: dims ordered by stride, each stride must step over
// everything the smaller ones cover (a zero stride over a dim of size > 1 never does). Exotic
// layouts that interleave dims without sharing an element are refused too: outputs are simple.
bool self_overlaps(ConstView v) {
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size) of dims of size > 1
  for (int i = 0; i < v.rank(); ++i)
    if (v.dim(i) > 1) dims.emplace_back(v.stride(i), v.dim(i));
  std::sort(dims.begin(), dims.end());
  int64_t covered = 0;  // largest offset reached by the dims before
  for (const auto& [stride, size] : dims) {
    if (stride <= covered) return true;
    covered += stride * (size - 1);
  }
  return false;
}

}  // namespace

void check_output_alone(const char* name, ConstView view, pb::handle out,
                        std::initializer_list<std::pair<const char*, pb::handle>> others) {
  if (view.numel() == 0 || view.data == nullptr) return;
  if (self_overlaps(view))
    throw pb::value_error(std::string(name) + " overlaps itself (a zero stride, or rows closer than their length): "
                          "an output written in place needs one element per address");
  const pb::object shares = pb::module_::import("numpy").attr("shares_memory");
  for (const auto& [other_name, other] : others) {
    if (!other || other.is_none()) continue;
    if (shares(out, other).cast<bool>())
      throw pb::value_error(std::string(name) + " overlaps the memory of " + other_name +
                            ", which the call reads: give an output array of its own");
  }
}

pb::array_t<int32_t> int_arg(pb::handle obj, const char* name) {
  if (obj.is_none()) return pb::array_t<int32_t>();
  pb::array a = pb::array::ensure(obj);
  if (!a) {
    PyErr_Clear();
    throw pb::type_error(std::string(name) + " must be a sequence of integers");
  }
  const char kind = a.dtype().kind();
  if (kind != 'i' && kind != 'u')
    throw pb::type_error(std::string(name) + " must hold integers, got dtype " + to_str(a.dtype()));
  if (a.ndim() != 1)
    throw pb::value_error(std::string(name) + " must be 1-D (one length per batch item), got shape " + shape_str(a));
  // Range-checked through int64 (uint64 values beyond it are refused as well).
  auto wide = pb::array_t<int64_t, pb::array::c_style | pb::array::forcecast>::ensure(a);
  if (kind == 'u' && a.dtype().itemsize() == 8) {
    auto u = pb::array_t<uint64_t, pb::array::c_style | pb::array::forcecast>::ensure(a);
    for (pb::ssize_t i = 0; i < u.size(); ++i)
      if (u.data()[i] > static_cast<uint64_t>(std::numeric_limits<int32_t>::max()))
        throw pb::value_error(std::string(name) + "[" + std::to_string(i) + "] = " + std::to_string(u.data()[i]) +
                              " does not fit in int32");
  }
  pb::array_t<int32_t> out(a.size());
  for (pb::ssize_t i = 0; i < a.size(); ++i) {
    const int64_t x = wide.data()[i];
    if (x < std::numeric_limits<int32_t>::min() || x > std::numeric_limits<int32_t>::max())
      throw pb::value_error(std::string(name) + "[" + std::to_string(i) + "] = " + std::to_string(x) +
                            " does not fit in int32");
    out.mutable_data()[i] = static_cast<int32_t>(x);
  }
  return out;
}

std::span<const int32_t> span_of(const pb::array_t<int32_t>& a) {
  if (!a || a.size() == 0) return {};
  return {a.data(), static_cast<size_t>(a.size())};
}

pb::array_t<float> new_array(const Shape& shape, bool zero) {
  std::vector<pb::ssize_t> dims(shape.dims.begin(), shape.dims.begin() + shape.rank);
  pb::array_t<float> a(dims);
  if (zero && a.size() > 0) std::memset(a.mutable_data(), 0, sizeof(float) * static_cast<size_t>(a.size()));
  return a;
}

pb::array to_numpy(Tensor&& t) {
  if (t.numel() == 0) return new_array(t.shape(), false);  // no storage to hand over
  auto* owner = new Tensor(std::move(t));
  pb::capsule cap(owner, [](void* p) { delete static_cast<Tensor*>(p); });
  const Shape& s = owner->shape();
  std::vector<pb::ssize_t> dims(s.dims.begin(), s.dims.begin() + s.rank);
  return pb::array_t<float>(dims, owner->data(), cap);
}

int initial_threads() {
  if (const char* s = std::getenv("OMP_NUM_THREADS"); s && *s) {
    char* end = nullptr;
    const long n = std::strtol(s, &end, 10);  // "4" or the first level of "4,2"
    if (end != s && n >= 1 && n <= 4096) return static_cast<int>(n);
  }
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

std::string utf8_safe(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  const auto* u = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  for (size_t i = 0; i < n;) {
    const unsigned char c = u[i];
    size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    bool ok = len > 0 && i + len <= n;
    for (size_t k = 1; ok && k < len; ++k) ok = (u[i + k] & 0xC0) == 0x80;
    if (ok && len == 2) ok = c >= 0xC2;                                            // overlong
    if (ok && len == 3) {
      const unsigned cp = ((c & 0xFu) << 12) | ((u[i + 1] & 0x3Fu) << 6) | (u[i + 2] & 0x3Fu);
      ok = cp >= 0x800 && (cp < 0xD800 || cp > 0xDFFF);                             // overlong, surrogate
    }
    if (ok && len == 4) {
      const unsigned cp = ((c & 0x7u) << 18) | ((u[i + 1] & 0x3Fu) << 12) | ((u[i + 2] & 0x3Fu) << 6) | (u[i + 3] & 0x3Fu);
      ok = cp >= 0x10000 && cp <= 0x10FFFF;
    }
    if (ok) {
      out.append(s, i, len);
      i += len;
    } else {
      static const char* hex = "0123456789abcdef";
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 0xF];
      ++i;
    }
  }
  return out;
}

void throw_value_error(const std::string& what) { throw pb::value_error(utf8_safe(what)); }

void set_default_threads(int n) { g_threads.store(n); }
int default_threads() { return g_threads.load(); }

void apply_threads() {
  const int n = g_threads.load();
  if (n > 0 && max_threads() != n) set_threads(n);
}

}  // namespace clattn::py
