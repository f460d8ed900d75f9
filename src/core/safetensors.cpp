// Safetensors reading (memory-mapped, validated before any tensor is touched) and atomic writing.
// The format: u64 little-endian header length, a JSON header, then the data buffer.
#include "clattn/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "clattn/error.h"

namespace clattn {
namespace {

constexpr uint64_t kMaxHeader = 100ull << 20;  // 100 MB: anything larger is a lie or an attack

struct DTypeInfo {
  DType t;
  const char* name;
  size_t size;
};
constexpr DTypeInfo kDTypes[] = {{DType::F32, "F32", 4}, {DType::F16, "F16", 2},
                                 {DType::BF16, "BF16", 2}, {DType::I32, "I32", 4},
                                 {DType::I64, "I64", 8},   {DType::U8, "U8", 1},
                                 {DType::I8, "I8", 1},     {DType::F64, "F64", 8}};

float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu, man = h & 0x3FFu;
  uint32_t bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal: renormalise
      int e = -1;
      uint32_t m = man;
      do {
        ++e;
        m <<= 1;
      } while (!(m & 0x400u));
      bits = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (m & 0x3FFu) << 13;
    }
  } else if (exp == 31) {
    bits = sign | 0x7F800000u | man << 13;  // inf or NaN
  } else {
    bits = sign | (exp + 127 - 15) << 23 | man << 13;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

float bf16_to_float(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

}  // namespace

const char* dtype_name(DType t) {
  for (const auto& d : kDTypes)
    if (d.t == t) return d.name;
  return "?";
}

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  SafetensorsFile f;
  f.path_ = path;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  check(fd >= 0, "safetensors '", path, "': cannot open: ", std::strerror(errno));
  struct stat sb {};
  if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    ::close(fd);
    fail("safetensors '", path, "': not a regular file");
  }
  const size_t size = static_cast<size_t>(sb.st_size);
  if (size < 8) {
    ::close(fd);
    fail("safetensors '", path, "': file is ", size, " bytes, shorter than the 8-byte header length");
  }
  void* map = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  check(map != MAP_FAILED, "safetensors '", path, "': cannot map: ", std::strerror(errno));
  f.map_ = static_cast<const uint8_t*>(map);
  f.map_size_ = size;

  uint64_t hlen = 0;
  for (int i = 7; i >= 0; --i) hlen = hlen << 8 | f.map_[i];
  check(hlen > 0 && hlen <= kMaxHeader, "safetensors '", path, "': header length ", hlen,
        " is absurd (must be in [1, ", kMaxHeader, "])");
  check(hlen <= size - 8, "safetensors '", path, "': header length ", hlen,
        " runs past the end of the ", size, "-byte file (truncated?)");
  f.data_start_ = 8 + static_cast<size_t>(hlen);
  const uint64_t data_size = size - f.data_start_;

  nlohmann::json header;
  try {
    header = nlohmann::json::parse(f.map_ + 8, f.map_ + 8 + hlen);
  } catch (const nlohmann::json::exception& e) {
    fail("safetensors '", path, "': header is not valid JSON: ", e.what());
  }
  check(header.is_object(), "safetensors '", path, "': header must be a JSON object");
  std::vector<std::pair<uint64_t, std::string>> spans;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const auto& e = it.value();
    if (name == "__metadata__") {
      check(e.is_object(), "safetensors '", path, "': __metadata__ must be an object of strings");
      for (auto m = e.begin(); m != e.end(); ++m) {
        check(m.value().is_string(), "safetensors '", path, "': __metadata__ value of '", m.key(),
              "' is not a string");
        f.metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string where = "safetensors '" + path + "': tensor '" + name + "'";
    check(e.is_object(), where, ": entry must be an object");
    check(e.contains("dtype") && e["dtype"].is_string(), where, ": missing string 'dtype'");
    check(e.contains("shape") && e["shape"].is_array(), where, ": missing array 'shape'");
    check(e.contains("data_offsets") && e["data_offsets"].is_array() && e["data_offsets"].size() == 2,
          where, ": 'data_offsets' must be [begin, end]");
    TensorInfo info{};
    const std::string dt = e["dtype"].get<std::string>();
    size_t esize = 0;
    for (const auto& d : kDTypes)
      if (dt == d.name) {
        info.dtype = d.t;
        esize = d.size;
      }
    check(esize != 0, where, ": unknown dtype '", dt, "'");
    uint64_t numel = 1;
    for (const auto& x : e["shape"]) {
      check(x.is_number_integer() && x.get<int64_t>() >= 0, where, ": shape entries must be integers >= 0, got ",
            x.dump());
      const uint64_t v = x.get<uint64_t>();
      check(v == 0 || numel <= (uint64_t{1} << 62) / v, where, ": shape ", e["shape"].dump(),
            " has too many elements");
      numel *= v;
      info.shape.push_back(static_cast<int64_t>(v));
    }
    for (const auto& x : e["data_offsets"])
      check(x.is_number_integer() && x.get<int64_t>() >= 0, where,
            ": data_offsets must be integers >= 0, got ", e["data_offsets"].dump());
    info.begin = e["data_offsets"][0].get<uint64_t>();
    info.end = e["data_offsets"][1].get<uint64_t>();
    check(info.begin <= info.end, where, ": data_offsets begin ", info.begin, " > end ", info.end);
    check(info.end <= data_size, where, ": data_offsets end ", info.end,
          " is beyond the data buffer of ", data_size, " bytes (truncated file?)");
    check(info.end - info.begin == numel * esize, where, ": data_offsets span ",
          info.end - info.begin, " bytes but shape ", e["shape"].dump(), " of ", dt, " needs ",
          numel * esize);
    if (info.end > info.begin) spans.emplace_back(info.begin, name);
    f.infos_[name] = info;
  }
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i) {
    const TensorInfo& prev = f.infos_[spans[i - 1].second];
    check(prev.end <= spans[i].first, "safetensors '", path, "': tensors '", spans[i - 1].second,
          "' and '", spans[i].second, "' overlap in the data buffer");
  }
  return f;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) munmap(const_cast<uint8_t*>(map_), map_size_);
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& o) noexcept { *this = std::move(o); }

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& o) noexcept {
  if (this != &o) {
    if (map_) munmap(const_cast<uint8_t*>(map_), map_size_);
    path_ = std::move(o.path_);
    infos_ = std::move(o.infos_);
    metadata_ = std::move(o.metadata_);
    map_ = o.map_;
    map_size_ = o.map_size_;
    data_start_ = o.data_start_;
    o.map_ = nullptr;
    o.map_size_ = 0;
  }
  return *this;
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> n;
  for (const auto& [k, v] : infos_) n.push_back(k);
  return n;
}

const TensorInfo& SafetensorsFile::info(const std::string& name) const {
  auto it = infos_.find(name);
  if (it == infos_.end()) {
    std::string have;
    for (const auto& [k, v] : infos_) have += (have.empty() ? "" : ", ") + k;
    fail("safetensors '", path_, "': no tensor '", name, "' (has: ", have.empty() ? "none" : have, ")");
  }
  return it->second;
}

Tensor SafetensorsFile::get_f32(const std::string& name) const {
  const TensorInfo& in = info(name);
  check(in.shape.size() <= static_cast<size_t>(kMaxRank), "safetensors '", path_, "': tensor '",
        name, "' has rank ", in.shape.size(), " > ", kMaxRank);
  Tensor t = Tensor::empty_like_shape(Shape(in.shape));
  const uint8_t* src = map_ + data_start_ + in.begin;
  const int64_t n = t.numel();
  switch (in.dtype) {
    case DType::F32:
      std::memcpy(t.data(), src, static_cast<size_t>(n) * 4);
      break;
    case DType::F16:
    case DType::BF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        t.data()[i] = in.dtype == DType::F16 ? half_to_float(h) : bf16_to_float(h);
      }
      break;
    default:
      fail("safetensors '", path_, "': tensor '", name, "' is ", dtype_name(in.dtype),
           "; expected F32, F16 or BF16");
  }
  return t;
}

std::vector<int32_t> SafetensorsFile::get_i32(const std::string& name) const {
  const TensorInfo& in = info(name);
  const uint8_t* src = map_ + data_start_ + in.begin;
  const size_t n = in.end - in.begin;
  std::vector<int32_t> out;
  if (in.dtype == DType::I32) {
    out.resize(n / 4);
    std::memcpy(out.data(), src, n);
  } else if (in.dtype == DType::I64) {
    out.resize(n / 8);
    for (size_t i = 0; i < out.size(); ++i) {
      int64_t v;
      std::memcpy(&v, src + 8 * i, 8);
      check(v >= INT32_MIN && v <= INT32_MAX, "safetensors '", path_, "': tensor '", name,
            "' value ", v, " at ", i, " does not fit in int32");
      out[i] = static_cast<int32_t>(v);
    }
  } else {
    fail("safetensors '", path_, "': tensor '", name, "' is ", dtype_name(in.dtype),
         "; expected I32 (or I64)");
  }
  return out;
}

void SafetensorsWriter::add(const std::string& name, ConstView t) {
  check(!name.empty(), "safetensors writer: tensor names must not be empty");
  check(name != "__metadata__" && !entries_.count(name), "safetensors writer: tensor '", name,
        "' added twice (or reserved name)");
  Tensor c = Tensor::from(t);
  Entry e{DType::F32, {}, {}};
  for (int i = 0; i < t.rank(); ++i) e.shape.push_back(t.dim(i));
  e.bytes.resize(static_cast<size_t>(c.numel()) * 4);
  if (c.numel()) std::memcpy(e.bytes.data(), c.data(), e.bytes.size());
  entries_[name] = std::move(e);
}

void SafetensorsWriter::add_i32(const std::string& name, const std::vector<int64_t>& shape,
                                std::span<const int32_t> values) {
  check(!name.empty(), "safetensors writer: tensor names must not be empty");
  check(name != "__metadata__" && !entries_.count(name), "safetensors writer: tensor '", name,
        "' added twice (or reserved name)");
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  check(n == static_cast<int64_t>(values.size()), "safetensors writer: tensor '", name, "' has ",
        values.size(), " values for a shape of ", n, " elements");
  Entry e{DType::I32, shape, {}};
  e.bytes.resize(values.size() * 4);
  if (!values.empty()) std::memcpy(e.bytes.data(), values.data(), e.bytes.size());
  entries_[name] = std::move(e);
}

void SafetensorsWriter::set_metadata(const std::string& key, const std::string& value) {
  metadata_[key] = value;
}

void SafetensorsWriter::write(const std::string& path) const {
  nlohmann::json header = nlohmann::json::object();
  uint64_t off = 0;
  for (const auto& [name, e] : entries_) {
    header[name] = {{"dtype", dtype_name(e.dtype)}, {"shape", e.shape},
                    {"data_offsets", {off, off + e.bytes.size()}}};
    off += e.bytes.size();
  }
  if (!metadata_.empty()) header["__metadata__"] = metadata_;
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // data buffer starts 8-byte aligned, as HF writes it
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  check(fd >= 0, "safetensors '", path, "': cannot create '", tmp, "': ", std::strerror(errno));
  auto put = [&](const void* p, size_t n) {
    const auto* c = static_cast<const uint8_t*>(p);
    while (n > 0) {
      const ssize_t w = ::write(fd, c, n);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        const int err = errno;
        ::close(fd);
        ::unlink(tmp.c_str());
        fail("safetensors '", path, "': write failed: ", std::strerror(err));
      }
      c += w;
      n -= static_cast<size_t>(w);
    }
  };
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(static_cast<uint64_t>(h.size()) >> (8 * i));
  put(len, 8);
  put(h.data(), h.size());
  for (const auto& [name, e] : entries_) put(e.bytes.data(), e.bytes.size());
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    fail("safetensors '", path, "': cannot flush: ", std::strerror(err));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    fail("safetensors '", path, "': cannot rename into place: ", std::strerror(err));
  }
}

}  // namespace clattn
