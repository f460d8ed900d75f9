// The extension module clattn._clattn; the package python/clattn/__init__.py re-exports it.
// Attention: attention.cpp; models: model.cpp; training: train.cpp; NumPy conversion rules: common.h.
#include <pybind11/stl.h>
#include <pybind11/stl/filesystem.h>

#include <filesystem>

#include <string>

#include "clattn/cpu.h"
#include "clattn/error.h"
#include "clattn/threads.h"
#include "clattn/safetensors.h"
#include "common.h"

namespace clattn::py {

void bind_attention(pb::module_& m);
void bind_model(pb::module_& m);
void bind_train(pb::module_& m);
void bind_tokenizer(pb::module_& m);
void bind_draws(pb::module_& m);  // draws.cpp
void bind_plan(pb::module_& m);   // plan.cpp
std::string blas_library();  // blas.cpp

namespace {

pb::dict read_safetensors(const std::filesystem::path& file) {
  const std::string path = file.string();
  std::vector<std::pair<std::string, pb::object>> items;
  SafetensorsFile f = [&] {
    pb::gil_scoped_release nogil;
    return SafetensorsFile::open(path);
  }();
  pb::dict d;
  for (const std::string& name : f.names()) {
    const TensorInfo& info = f.info(name);
    std::vector<pb::ssize_t> shape(info.shape.begin(), info.shape.end());
    switch (info.dtype) {
      case DType::F32:
      case DType::F16:
      case DType::BF16: {
        Tensor t = f.get_f32(name);
        pb::array_t<float> a(shape);
        if (a.size() > 0) std::copy(t.data(), t.data() + t.numel(), a.mutable_data());
        d[pb::str(name)] = a;
        break;
      }
      case DType::I32:
      case DType::I64: {
        std::vector<int32_t> v = f.get_i32(name);
        pb::array_t<int32_t> a(shape);
        if (a.size() > 0) std::copy(v.begin(), v.end(), a.mutable_data());
        d[pb::str(name)] = a;
        break;
      }
      default:
        throw pb::value_error("read_safetensors: '" + path + "': tensor '" + name + "' has dtype " +
                              dtype_name(info.dtype) + "; only F32, F16, BF16 (as float32) and I32, I64 (as int32) are read");
    }
  }
  return d;
}

void write_safetensors(const std::filesystem::path& path, const pb::dict& tensors, const std::map<std::string, std::string>& meta) {
  SafetensorsWriter w;
  for (auto [key, value] : tensors) {
    const std::string name = to_str(key);
    pb::array a = pb::array::ensure(value);
    if (!a) throw pb::type_error("write_safetensors: '" + name + "' is not an array");
    const char kind = a.dtype().kind();
    if (kind == 'i' || kind == 'u') {
      pb::array_t<int32_t> v = int_arg(a.attr("reshape")(-1), name.c_str());
      std::vector<int64_t> shape(a.shape(), a.shape() + a.ndim());
      w.add_i32(name, shape, span_of(v));
    } else {
      if (a.ndim() > kMaxRank) throw pb::value_error("write_safetensors: '" + name + "' has rank above 6");
      auto c = pb::array_t<float, pb::array::c_style | pb::array::forcecast>::ensure(a);
      if (!c) throw pb::type_error("write_safetensors: '" + name + "' cannot be converted to float32");
      Shape s;
      s.rank = static_cast<int>(c.ndim());
      for (int i = 0; i < s.rank; ++i) s.dims[static_cast<size_t>(i)] = c.shape(i);
      w.add(name, make_view(c.data(), s));
    }
  }
  for (const auto& [k, v] : meta) w.set_metadata(k, v);
  pb::gil_scoped_release nogil;
  w.write(path.string());
}

}  // namespace
}  // namespace clattn::py

PYBIND11_MODULE(_clattn, m) {
  namespace pb = pybind11;
  using namespace clattn::py;
  m.doc() = "clattn: clustered and other efficient attention on NumPy arrays (C++ library binding)";
  m.attr("__version__") = CLATTN_VERSION;
  set_default_threads(initial_threads());
  // clattn's own errors that no binding turned into ValueError are RuntimeError, as pybind11
  // makes them, but with their message made UTF-8-safe (it may quote a file's bytes).
  pb::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const clattn::Error& e) {
      PyErr_SetString(PyExc_RuntimeError, utf8_safe(e.what()).c_str());
    }
  });
  bind_attention(m);
  bind_tokenizer(m);
  bind_model(m);
  bind_train(m);
  bind_draws(m);
  bind_plan(m);

  m.def("set_num_threads", [](int n) {
          if (n < 1) throw pb::value_error("set_num_threads: n must be >= 1, got " + std::to_string(n));
          set_default_threads(n);
          clattn::set_threads(n);
        }, pb::arg("n"),
        "Threads of every clattn kernel, whichever Python thread calls it (OpenMP's own setting is per thread)");
  m.def("get_num_threads", [] {
          const int n = default_threads();
          return n > 0 ? n : clattn::max_threads();
        });
  m.def("read_safetensors", &read_safetensors, pb::arg("path"),
        "Tensors of a safetensors file as a dict of NumPy arrays (float32, or int32 for integer tensors)");
  m.def("write_safetensors", &write_safetensors, pb::arg("path"), pb::arg("tensors"),
        pb::arg("metadata") = std::map<std::string, std::string>{},
        "Write a dict of arrays (floats as F32, integers as I32) atomically");
  m.def("_blas_library", &blas_library, "The file of the OpenBLAS whose cblas_sgemm clattn calls");
  m.def("config", [] {
          const clattn::CpuFeatures& f = clattn::cpu_features();
          const clattn::GemmBackend& g = clattn::gemm_backend();
          pb::dict d;
          d["version"] = CLATTN_VERSION;
          d["cpu"] = f.model_name;
          d["cpu_vendor"] = f.vendor;
          d["cpu_family"] = f.family;
          d["cpu_model"] = f.model;
          d["cpu_flags"] = f.flags();
          // A refused CLATTN_ISA leaves the other facts to report: "none" and the reason.
          try {
            d["isa"] = clattn::isa_name(clattn::active_isa());
          } catch (const clattn::Error& e) {
            d["isa"] = "none";
            d["isa_error"] = std::string(e.what());
          }
          d["isas_supported"] = clattn::supported_isas();
          d["gemm"] = g.name;
          d["gemm_library"] = g.library;
          d["gemm_kernel"] = g.kernel;
          d["gemm_kernel_detected"] = g.detected;
          d["gemm_kernel_reason"] = g.reason;
          d["gemm_verified"] = g.verified;
          d["gemm_products"] = g.products;
          const int n = default_threads();
          d["threads"] = n > 0 ? n : clattn::max_threads();
          return d;
        },
        "The machine facts clattn runs with: CPU (model, family/model, features), the ISA of its kernels, "
        "the GEMM backend with its kernel and the reason for it, and the threads (as `clattn --version` prints)");
  m.attr("_openblas_expected") = CLATTN_OPENBLAS_PATH;
}
