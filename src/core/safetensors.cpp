// Safetensors reading (read into memory, the whole header validated before any tensor is touched) and
// atomic writing. The format: u64 little-endian header length, a JSON header, then the data buffer.
//
// Reading trusts nothing in the file: every offset is checked against the mapped size, every
// element count against 64-bit overflow, so a lying header yields an Error, never a stray read.
// Refused as the Hugging Face reader refuses them: a tensor name given twice (JSON would keep the
// last silently) and a data buffer the tensors do not cover exactly (holes between them, bytes
// past the last). Tolerated: spaces or NULs after the JSON (nlohmann ends its input at a NUL).
// The file is read into memory at open(), not mapped: a mapped file that another process truncates
// raises SIGBUS on the next access to a lost page, a signal no check can turn into an Error. A read
// copy also sees one consistent size (a file that shrinks while being read is an Error). The cost
// is the read itself (the same page faults a mapping would take on first touch) and no sharing of
// pages between processes that open the same checkpoint.
#include "clattn/safetensors.h"
#include "clattn/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string_view>
#include <tuple>
#include <utility>

#include "clattn/error.h"
#include "clattn/input_file.h"

namespace clattn {

// The data buffer is copied with memcpy in host order, and the format is little-endian.
static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes a little-endian host");

namespace {

using json = nlohmann::json;

constexpr uint64_t kMaxHeader = 100ull << 20;  // 100 MB, as the HF reader: larger is a lie or an attack
constexpr size_t kMaxShown = 120;              // longest name or JSON value quoted in a message

struct DTypeInfo {
  DType t;
  const char* name;
  size_t size;
};
constexpr DTypeInfo kDTypes[] = {
    {DType::F32, "F32", 4},   {DType::F16, "F16", 2},   {DType::BF16, "BF16", 2},
    {DType::I32, "I32", 4},   {DType::I64, "I64", 8},   {DType::U8, "U8", 1},
    {DType::I8, "I8", 1},     {DType::F64, "F64", 8},   {DType::BOOL, "BOOL", 1},
    {DType::I16, "I16", 2},   {DType::U16, "U16", 2},   {DType::U32, "U32", 4},
    {DType::U64, "U64", 8},   {DType::F8_E4M3, "F8_E4M3", 1}, {DType::F8_E5M2, "F8_E5M2", 1}};

const DTypeInfo* find_dtype(std::string_view name) {
  for (const auto& d : kDTypes)
    if (name == d.name) return &d;
  return nullptr;
}

std::string known_dtypes() {
  std::string s;
  for (const auto& d : kDTypes) s += (s.empty() ? "" : ", ") + std::string(d.name);
  return s;
}

// A name or text from the file, cut short: a hostile header may hold a 100 MB key.
std::string clip(std::string_view s, size_t max = kMaxShown) {
  if (s.size() <= max) return std::string(s);
  return std::string(s.substr(0, max)) + "...";
}

// ": not a safetensors file", naming the target of a symlink (a shard linked to the wrong file).
std::string not_safetensors(const std::string& path) {
  std::error_code ec;
  const std::filesystem::path p(path);
  if (std::filesystem::is_symlink(p, ec)) {
    const std::filesystem::path target = std::filesystem::read_symlink(p, ec);
    if (!ec) return ": not a safetensors file (a symlink to '" + target.string() + "')";
  }
  return ": not a safetensors file";
}

// A JSON value for an error message. Never dumps a nested value: dump() recurses, and a hostile
// header can nest brackets a million deep (the parser and destructor of nlohmann are iterative).
std::string brief(const json& j) {
  if (j.is_primitive()) return clip(j.dump());
  const bool flat = j.size() <= 16 &&
                    std::all_of(j.begin(), j.end(), [](const json& x) { return x.is_primitive(); });
  if (flat) return clip(j.dump());
  return j.is_array() ? "an array of " + std::to_string(j.size())
                      : "an object of " + std::to_string(j.size()) + " keys";
}

// A JSON integer >= 0 (nlohmann stores "-0" as a signed integer, hence the second case).
std::optional<uint64_t> as_index(const json& j) {
  if (j.is_number_unsigned()) return j.get<uint64_t>();
  if (j.is_number_integer() && j.get<int64_t>() >= 0) return static_cast<uint64_t>(j.get<int64_t>());
  return std::nullopt;
}

// f16 bits -> f32 bits: rebias the exponent, renormalise subnormals, keep inf and NaN payloads.
float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu, man = h & 0x3FFu;
  uint32_t bits;
  if (exp == 0 && man == 0) {
    bits = sign;  // signed zero
  } else if (exp == 0) {
    // Subnormal: value man · 2^-24. Shift the leading 1 up to the implicit-bit position (bit 10);
    // each shift lowers the exponent by one from that of the smallest normal, 2^-14.
    const int shift = std::countl_zero(static_cast<uint16_t>(man)) - 5;  // 1..10
    const uint32_t m = (man << shift) & 0x3FFu;
    bits = sign | static_cast<uint32_t>(127 - 14 - shift) << 23 | m << 13;
  } else if (exp == 31) {
    bits = sign | 0x7F800000u | man << 13;  // inf (man 0) or NaN (payload kept, so still NaN)
  } else {
    bits = sign | (exp + 127 - 15) << 23 | man << 13;
  }
  return std::bit_cast<float>(bits);
}

// bf16 is the top half of an f32: every value, subnormal, inf and NaN maps exactly.
float bf16_to_f32(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

// Parses and checks one tensor entry of the header against a data buffer of data_size bytes.
TensorInfo parse_entry(const json& e, const std::string& where, uint64_t data_size) {
  check(e.is_object(), where, ": entry must be an object with dtype, shape and data_offsets, got ",
        brief(e));
  const auto dt = e.find("dtype"), sh = e.find("shape"), of = e.find("data_offsets");
  check(dt != e.end() && dt->is_string(), where, ": entry needs a string 'dtype', got ",
        dt == e.end() ? "none" : brief(*dt));
  check(sh != e.end() && sh->is_array(), where, ": entry needs an array 'shape', got ",
        sh == e.end() ? "none" : brief(*sh));
  check(of != e.end() && of->is_array(), where, ": entry needs an array 'data_offsets', got ",
        of == e.end() ? "none" : brief(*of));

  TensorInfo info{};
  const DTypeInfo* d = find_dtype(dt->get_ref<const std::string&>());
  check(d != nullptr, where, ": unknown dtype ", brief(*dt), " (known: ", known_dtypes(), ")");
  info.dtype = d->t;

  // numel and bytes in 64 bits, each multiplication checked: the dims come from the file.
  constexpr uint64_t kMaxI64 = std::numeric_limits<int64_t>::max();
  // The extent (product of max(d, 1)) too, the rule of clattn::Shape: an empty tensor declared
  // (0, 2^40, 2^40) has no data, but its strides would overflow.
  uint64_t numel = 1, extent = 1;
  for (const json& x : *sh) {
    const std::optional<uint64_t> v = as_index(x);
    check(v.has_value(), where, ": shape dims must be integers >= 0, got ", brief(*sh));
    check(*v <= kMaxI64 && !__builtin_mul_overflow(numel, *v, &numel) &&
              !__builtin_mul_overflow(extent, std::max<uint64_t>(*v, 1), &extent) && extent <= kMaxI64,
          where, ": shape ", brief(*sh), " overflows a 64-bit element count");
    info.shape.push_back(static_cast<int64_t>(*v));
  }
  uint64_t bytes = 0;
  check(numel <= kMaxI64 && !__builtin_mul_overflow(numel, uint64_t{d->size}, &bytes), where,
        ": shape ", brief(*sh), " of ", d->name, " overflows a 64-bit byte count");

  const std::optional<uint64_t> b = of->size() == 2 ? as_index((*of)[0]) : std::nullopt;
  const std::optional<uint64_t> en = of->size() == 2 ? as_index((*of)[1]) : std::nullopt;
  check(b.has_value() && en.has_value(), where,
        ": data_offsets must be [begin, end] with integers >= 0, got ", brief(*of));
  info.begin = *b;
  info.end = *en;
  check(info.begin <= info.end, where, ": data_offsets begin ", info.begin, " > end ", info.end);
  check(info.end <= data_size, where, ": data_offsets end ", info.end,
        " is beyond the data buffer of ", data_size, " bytes (truncated file?)");
  check(info.end - info.begin == bytes, where, ": data_offsets span ", info.end - info.begin,
        " bytes but shape ", brief(*sh), " of ", d->name, " needs ", bytes, " bytes");
  return info;
}

void parse_metadata(const json& m, const std::string& where, std::map<std::string, std::string>& out) {
  check(m.is_object(), where, ": __metadata__ must be an object of strings, got ", brief(m));
  for (auto it = m.begin(); it != m.end(); ++it) {
    check(it.value().is_string(), where, ": __metadata__ value of '", clip(it.key()),
          "' must be a string, got ", brief(it.value()));
    out[it.key()] = it.value().get<std::string>();
  }
}

// Rejects what the JSON writer cannot encode (invalid UTF-8) now, where the caller sees which name.
void check_utf8(const std::string& s, const char* what) {
  try {
    (void)json(s).dump();
  } catch (const json::exception&) {
    fail("safetensors writer: ", what, " '", clip(s), "' is not valid UTF-8 (JSON cannot hold it)");
  }
}

void check_new_name(const std::string& name, bool taken) {
  check(!name.empty(), "safetensors writer: tensor names must not be empty");
  check(name != "__metadata__", "safetensors writer: '__metadata__' is reserved, not a tensor name");
  check(!taken, "safetensors writer: tensor '", clip(name), "' added twice");
  check_utf8(name, "tensor name");
}

}  // namespace

const char* dtype_name(DType t) {
  for (const auto& d : kDTypes)
    if (d.t == t) return d.name;
  return "?";
}

size_t dtype_size(DType t) {
  for (const auto& d : kDTypes)
    if (d.t == t) return d.size;
  return 0;
}

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  SafetensorsFile f;  // owns the map once made: any failed check below unmaps it
  f.path_ = path;
  const std::string where = "safetensors '" + path + "'";
  // Never blocks on a FIFO or device; only regular files are read (clattn/input_file.h).
  uint64_t file_size = 0;
  const int fd = open_input_file(path, "safetensors", &file_size);
  const size_t size = static_cast<size_t>(file_size);
  if (size < 8) {
    ::close(fd);
    fail(where, ": file is ", size, " bytes, shorter than the 8-byte header length");
  }
  // 64-byte aligned, as a mapping would be page aligned: F32 tensors at 4-aligned offsets can be
  // used in place (mapped_f32).
  uint8_t* buf = static_cast<uint8_t*>(std::aligned_alloc(64, (size + 63) / 64 * 64));
  if (!buf) {
    ::close(fd);
    fail(where, ": cannot allocate ", size, " bytes to read it");
  }
  f.map_ = buf;
  f.map_size_ = size;
  size_t got = 0;
  while (got < size) {
    const ssize_t r = ::read(fd, buf + got, std::min<size_t>(size - got, size_t{1} << 30));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      const int err = errno;
      ::close(fd);
      fail(where, r == 0 ? ": file shrank while being read (" : ": cannot read (", got, " of ", size,
           " bytes)", r == 0 ? "" : ": ", r == 0 ? "" : std::strerror(err));
    }
    got += static_cast<size_t>(r);
  }
  ::close(fd);

  uint64_t hlen = 0;  // u64 little-endian
  for (int i = 7; i >= 0; --i) hlen = hlen << 8 | f.map_[i];
  // A file of another format (a symlink to the wrong file, a .bin checkpoint) fails here: say so
  // rather than only quote its first 8 bytes as a header length.
  check(hlen > 0 && hlen <= kMaxHeader, where, not_safetensors(path), ": header length ", hlen,
        " is absurd (a safetensors file starts with the length of its JSON header, in [1, ", kMaxHeader, "] bytes)");
  check(hlen <= size - 8, where, ": header length ", hlen, " runs past the end of the ", size,
        "-byte file (truncated?)");
  f.data_start_ = 8 + static_cast<size_t>(hlen);
  const uint64_t data_size = size - f.data_start_;

  json header;
  std::string twice;  // a top-level key given twice
  try {
    std::set<std::string> keys;
    const json::parser_callback_t cb = [&](int depth, json::parse_event_t event, json& parsed) {
      if (event == json::parse_event_t::key && depth == 1 && twice.empty() && !keys.insert(parsed.get<std::string>()).second)
        twice = parsed.get<std::string>();
      return true;
    };
    header = json::parse(f.map_ + 8, f.map_ + f.data_start_, cb);
  } catch (const json::exception& e) {
    // Clipped: nlohmann quotes the offending token, which may be the whole header.
    fail(where, ": header is not valid JSON: ", clip(e.what(), 4 * kMaxShown));
  }
  check(header.is_object(), where, ": header must be a JSON object, got ", brief(header));
  check(twice.empty(), where, ": tensor '", clip(twice), "' is named twice in the header");

  std::vector<std::tuple<uint64_t, uint64_t, const std::string*>> spans;  // (begin, end, name)
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      parse_metadata(it.value(), where, f.metadata_);
      continue;
    }
    const TensorInfo info = parse_entry(it.value(), where + ": tensor '" + clip(it.key()) + "'", data_size);
    if (info.end > info.begin) spans.emplace_back(info.begin, info.end, &it.key());
    f.infos_.emplace(it.key(), info);
  }
  // Sorted by begin, two non-empty spans overlap iff some adjacent pair does.
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i) {
    const auto& [b0, e0, n0] = spans[i - 1];
    const auto& [b1, e1, n1] = spans[i];
    check(e0 <= b1, where, ": tensors '", clip(*n0), "' [", b0, ", ", e0, ") and '", clip(*n1), "' [",
          b1, ", ", e1, ") overlap in the data buffer");
    check(e0 == b1, where, ": the data buffer has a hole of ", b1 - e0, " bytes [", e0, ", ", b1, ") between tensors '",
          clip(*n0), "' and '", clip(*n1), "'");
  }
  check(spans.empty() || std::get<0>(spans.front()) == 0, where, ": the data buffer has a hole of ",
        spans.empty() ? 0 : std::get<0>(spans.front()), " bytes before its first tensor '",
        spans.empty() ? std::string() : clip(*std::get<2>(spans.front())), "'");
  const uint64_t covered = spans.empty() ? 0 : std::get<1>(spans.back());
  check(covered == data_size, where, ": the data buffer has ", data_size - covered, " bytes past ",
        spans.empty() ? std::string("the header (no tensor holds data)") : "its last tensor '" + clip(*std::get<2>(spans.back())) + "'");
  return f;
}

SafetensorsFile::~SafetensorsFile() { std::free(const_cast<uint8_t*>(map_)); }

SafetensorsFile::SafetensorsFile(SafetensorsFile&& o) noexcept { *this = std::move(o); }

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& o) noexcept {
  if (this != &o) {
    std::free(const_cast<uint8_t*>(map_));
    path_ = std::move(o.path_);
    infos_ = std::move(o.infos_);
    metadata_ = std::move(o.metadata_);
    map_ = std::exchange(o.map_, nullptr);
    map_size_ = std::exchange(o.map_size_, 0);
    data_start_ = std::exchange(o.data_start_, 0);
  }
  return *this;
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> n;
  n.reserve(infos_.size());
  for (const auto& [k, v] : infos_) n.push_back(k);
  return n;
}

const TensorInfo& SafetensorsFile::info(const std::string& name) const {
  const auto it = infos_.find(name);
  if (it == infos_.end()) {
    std::string have;
    size_t shown = 0;
    for (const auto& [k, v] : infos_) {
      if (++shown > 20) {
        have += ", ... (" + std::to_string(infos_.size()) + " in all)";
        break;
      }
      have += (have.empty() ? "" : ", ") + clip(k);
    }
    fail("safetensors '", path_, "': no tensor '", name, "' (has: ", have.empty() ? "none" : have, ")");
  }
  return it->second;
}

Tensor SafetensorsFile::get_f32(const std::string& name) const {
  const TensorInfo& in = info(name);
  const std::string where = "safetensors '" + path_ + "': tensor '" + name + "'";
  check(in.dtype == DType::F32 || in.dtype == DType::F16 || in.dtype == DType::BF16, where, " is ",
        dtype_name(in.dtype), "; get_f32 reads F32, F16 or BF16");
  check(in.shape.size() <= static_cast<size_t>(kMaxRank), where, " has rank ", in.shape.size(),
        ", more than the ", kMaxRank, " a Tensor holds");
  Tensor t = Tensor::empty_like_shape(Shape(in.shape));
  // The data buffer is only byte-aligned (offsets are arbitrary), hence memcpy, never a cast.
  const uint8_t* src = map_ + data_start_ + in.begin;
  const size_t n = static_cast<size_t>(t.numel());
  float* dst = t.data();  // (numel) contiguous
  if (in.dtype == DType::F32) {
    if (n) std::memcpy(dst, src, n * 4);
  } else {
    const bool half = in.dtype == DType::F16;
    for (size_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, src + 2 * i, 2);
      dst[i] = half ? f16_to_f32(h) : bf16_to_f32(h);
    }
  }
  return t;
}

const float* SafetensorsFile::mapped_f32(const std::string& name) const {
  const TensorInfo& in = info(name);
  if (in.dtype != DType::F32) return nullptr;
  const uint8_t* src = map_ + data_start_ + in.begin;
  return reinterpret_cast<uintptr_t>(src) % alignof(float) == 0 ? reinterpret_cast<const float*>(src)
                                                                 : nullptr;
}

std::vector<int32_t> SafetensorsFile::get_i32(const std::string& name) const {
  const TensorInfo& in = info(name);
  const std::string where = "safetensors '" + path_ + "': tensor '" + name + "'";
  check(in.dtype == DType::I32 || in.dtype == DType::I64, where, " is ", dtype_name(in.dtype),
        "; get_i32 reads I32 (or I64 whose values fit)");
  const uint8_t* src = map_ + data_start_ + in.begin;
  const size_t n = (in.end - in.begin) / dtype_size(in.dtype);
  std::vector<int32_t> out(n);  // (numel) flattened
  if (in.dtype == DType::I32) {
    if (n) std::memcpy(out.data(), src, n * 4);
    return out;
  }
  for (size_t i = 0; i < n; ++i) {
    int64_t v;
    std::memcpy(&v, src + 8 * i, 8);
    check(v >= std::numeric_limits<int32_t>::min() && v <= std::numeric_limits<int32_t>::max(),
          where, " (I64): value ", v, " at flat index ", i, " does not fit in int32");
    out[i] = static_cast<int32_t>(v);
  }
  return out;
}

void SafetensorsWriter::add(const std::string& name, ConstView t) {
  check_new_name(name, entries_.count(name) != 0);
  for (int i = 0; i < t.rank(); ++i)
    check(t.dim(i) >= 0, "safetensors writer: tensor '", name, "' has a negative dim: ", t.shape);
  const size_t n = static_cast<size_t>(t.numel());
  check(n == 0 || t.data != nullptr, "safetensors writer: tensor '", name, "' of shape ",
        t.shape, " has no data (an empty view)");
  Entry e{DType::F32, std::vector<int64_t>(t.shape.dims.begin(), t.shape.dims.begin() + t.rank()), {}};
  e.bytes.resize(n * 4);  // (numel) F32, row-major
  if (n && t.contiguous()) {
    std::memcpy(e.bytes.data(), t.data, n * 4);
  } else if (n) {
    const Tensor c = Tensor::from(t);
    std::memcpy(e.bytes.data(), c.data(), n * 4);
  }
  entries_.emplace(name, std::move(e));
}

void SafetensorsWriter::add_i32(const std::string& name, const std::vector<int64_t>& shape,
                                std::span<const int32_t> values) {
  check_new_name(name, entries_.count(name) != 0);
  uint64_t n = 1;
  for (int64_t d : shape) {
    check(d >= 0, "safetensors writer: tensor '", name, "' shape dims must be >= 0, got ", d);
    check(!__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n), "safetensors writer: tensor '",
          name, "' shape overflows a 64-bit element count");
  }
  check(n == values.size(), "safetensors writer: tensor '", name, "' has ", values.size(),
        " values for a shape of ", n, " elements");
  Entry e{DType::I32, shape, {}};
  e.bytes.resize(values.size() * 4);  // (numel) I32
  if (!values.empty()) std::memcpy(e.bytes.data(), values.data(), e.bytes.size());
  entries_.emplace(name, std::move(e));
}

void SafetensorsWriter::set_metadata(const std::string& key, const std::string& value) {
  check_utf8(key, "metadata key");
  check_utf8(value, "metadata value");
  metadata_[key] = value;  // setting a key again replaces its value
}

void SafetensorsWriter::write(const std::string& path) const {
  json header = json::object();
  uint64_t off = 0;
  for (const auto& [name, e] : entries_) {  // std::map: sorted names, contiguous offsets
    json entry = json::object();
    entry["dtype"] = dtype_name(e.dtype);
    entry["shape"] = e.shape;
    entry["data_offsets"] = json::array({off, off + e.bytes.size()});
    header[name] = std::move(entry);
    off += e.bytes.size();
  }
  if (!metadata_.empty()) header["__metadata__"] = metadata_;
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // the data buffer starts 8-byte aligned, as HF writes it

  AtomicFile tmp(path);  // exclusive temporary, fsync, rename: never a half file, never a followed link
  uint8_t len[8];  // u64 little-endian
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(static_cast<uint64_t>(h.size()) >> (8 * i));
  tmp.write(len, 8);
  tmp.write(h.data(), h.size());
  for (const auto& [name, e] : entries_) tmp.write(e.bytes.data(), e.bytes.size());
  tmp.commit();
}

}  // namespace clattn
