// ONNX tensors for the deploy passes: TensorProto <-> ConstTensor (every element type the
// passes read, raw or typed fields), the shape-against-data check of initializers, and the
// checked conversion of numbers read from a model to integers.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>
#include <type_traits>

#include "mqbench/deploy/onnx_graph.h"

namespace mqbench {
namespace deploy {
namespace {

template <typename T>
void append_raw(const std::string& raw, std::vector<double>* out) {
  const size_t n = raw.size() / sizeof(T);
  out->reserve(n);
  for (size_t i = 0; i < n; ++i) {
    T v;
    std::memcpy(&v, raw.data() + i * sizeof(T), sizeof(T));
    out->push_back(static_cast<double>(v));
  }
}

template <typename T>
std::string to_raw(const std::vector<double>& values, const std::string& name) {
  std::string raw(values.size() * sizeof(T), '\0');
  for (size_t i = 0; i < values.size(); ++i) {
    if constexpr (std::is_integral_v<T>) {
      // Values computed from the model (a bias divided by tiny scales, NaN weights) must fit:
      // converting one that does not is undefined behaviour. (2^63 and -2^63 are exact doubles.)
      const double lo = static_cast<double>(std::numeric_limits<T>::min());
      const double hi = std::is_same_v<T, int64_t> ? 9223372036854775808.0
                                                   : static_cast<double>(std::numeric_limits<T>::max()) + 1;
      if (!(values[i] >= lo && values[i] < hi)) {
        std::ostringstream shown;
        shown << values[i];
        throw DeployError("tensor '" + name + "': value " + shown.str() + " at index " +
                          std::to_string(i) + " does not fit its integer type (are the "
                          "quantization parameters of the model sane?)");
      }
    }
    const T v = static_cast<T>(values[i]);
    std::memcpy(&raw[i * sizeof(T)], &v, sizeof(T));
  }
  return raw;
}

// The element count of `t`'s shape; dims come from the file: negative or overflowing shapes are
// corrupt, not arithmetic.
int64_t shape_numel(const onnx::TensorProto& t) {
  int64_t n = 1;
  for (auto d : t.dims()) {
    if (d < 0 || (d > 0 && n > std::numeric_limits<int64_t>::max() / d)) {
      throw DeployError("tensor '" + t.name() + "' has an invalid shape (dimension " +
                        std::to_string(d) + ")");
    }
    n *= d;
  }
  return n;
}

// Bytes per element of the fixed-size ONNX types, 1 for those packed several to a byte (below);
// 0 for the others (strings, 6-bit floats).
int64_t element_size(int32_t type) {
  switch (type) {
    case onnx::TensorProto::FLOAT8E4M3FN: case onnx::TensorProto::FLOAT8E4M3FNUZ:
    case onnx::TensorProto::FLOAT8E5M2: case onnx::TensorProto::FLOAT8E5M2FNUZ:
    case onnx::TensorProto::FLOAT8E8M0:
    case onnx::TensorProto::INT4: case onnx::TensorProto::UINT4:
    case onnx::TensorProto::FLOAT4E2M1:
    case onnx::TensorProto::INT2: case onnx::TensorProto::UINT2:
      return 1;
    case onnx::TensorProto::DOUBLE: case onnx::TensorProto::INT64: case onnx::TensorProto::UINT64:
      return 8;
    case onnx::TensorProto::FLOAT: case onnx::TensorProto::INT32: case onnx::TensorProto::UINT32:
      return 4;
    case onnx::TensorProto::INT16: case onnx::TensorProto::UINT16:
    case onnx::TensorProto::FLOAT16: case onnx::TensorProto::BFLOAT16:
      return 2;
    case onnx::TensorProto::INT8: case onnx::TensorProto::UINT8: case onnx::TensorProto::BOOL:
      return 1;
    default:
      return 0;
  }
}

// Elements per byte of raw data (and per int32_data entry): ONNX packs 4-bit values two to a
// byte, 2-bit values four; every other type holds one element per unit.
int64_t elements_per_unit(int32_t type) {
  switch (type) {
    case onnx::TensorProto::INT4: case onnx::TensorProto::UINT4:
    case onnx::TensorProto::FLOAT4E2M1:
      return 2;
    case onnx::TensorProto::INT2: case onnx::TensorProto::UINT2:
      return 4;
    default:
      return 1;
  }
}

// The value of one FLOAT8E4M3FN (no infinities; S.1111.111 is NaN) or FLOAT8E5M2 (IEEE-like:
// infinities and NaNs at exponent 31) byte, as the ONNX spec defines them.
double float8_value(uint8_t b, bool e5m2) {
  const int mant_bits = e5m2 ? 2 : 3, bias = e5m2 ? 15 : 7;
  const int exp = (b & 0x7f) >> mant_bits, mant = b & ((1 << mant_bits) - 1);
  const double sign = (b & 0x80) ? -1.0 : 1.0;
  if (e5m2 && exp == 31) return mant == 0 ? sign * HUGE_VAL : std::nan("");
  if (!e5m2 && exp == 15 && mant == 7) return std::nan("");
  if (exp == 0) return sign * std::ldexp(mant, 1 - bias - mant_bits);  // subnormal
  return sign * std::ldexp((1 << mant_bits) + mant, exp - bias - mant_bits);
}

// `raw` holds float8 bytes, or 4-bit integers two to a byte (low nibble first): the ONNX
// layouts, in raw data or (one element, or one byte, per entry) in int32_data.
void append_float8(const std::string& raw, bool e5m2, std::vector<double>* out) {
  for (unsigned char b : raw) out->push_back(float8_value(b, e5m2));
}

// The eight magnitudes of FLOAT4E2M1 (bit 3 of a code is the sign; no infinities, no NaN).
constexpr double kE2M1[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};

// 4-bit elements two to a byte, low nibble first: INT4 / UINT4 integers, or FLOAT4E2M1 codes.
void append_4bit(const std::string& raw, int32_t type, int64_t numel, std::vector<double>* out) {
  for (int64_t i = 0; i < numel && i / 2 < static_cast<int64_t>(raw.size()); ++i) {
    int v = (static_cast<unsigned char>(raw[i / 2]) >> (4 * (i % 2))) & 0xf;
    if (type == onnx::TensorProto::FLOAT4E2M1) {
      out->push_back((v & 8 ? -1.0 : 1.0) * kE2M1[v & 7]);
      continue;
    }
    if (type == onnx::TensorProto::INT4 && v >= 8) v -= 16;
    out->push_back(v);
  }
}

// The bytes of int32_data entries (float8 and 4-bit types keep one byte per entry there).
std::string int32_bytes(const onnx::TensorProto& t) {
  std::string bytes;
  for (auto v : t.int32_data()) bytes.push_back(static_cast<char>(v & 0xff));
  return bytes;
}

// The float8 byte whose value is exactly `v`: the deploy passes write float8 zero points, which
// ONNX requires to be exact (a value with no exact encoding is refused, naming the tensor).
uint8_t float8_byte(double v, bool e5m2, const std::string& name) {
  // value -> byte, built once per type (weights of millions of elements are written this way)
  static const auto table = [](bool e5) {
    std::vector<std::pair<double, uint8_t>> t;
    for (int b = 0; b < 256; ++b) {
      const double x = float8_value(static_cast<uint8_t>(b), e5);
      if (!std::isnan(x) && !(x == 0 && (b & 0x80))) t.emplace_back(x, static_cast<uint8_t>(b));
    }
    std::sort(t.begin(), t.end());
    return t;
  };
  static const std::vector<std::pair<double, uint8_t>> e4m3 = table(false), e5m2_t = table(true);
  const auto& t = e5m2 ? e5m2_t : e4m3;
  const auto it = std::lower_bound(t.begin(), t.end(), std::make_pair(v, uint8_t{0}));
  if (it != t.end() && it->first == v) {
    return std::signbit(v) && v == 0 ? static_cast<uint8_t>(0x80) : it->second;
  }
  std::ostringstream shown;
  shown << v;
  throw DeployError("tensor '" + name + "': " + shown.str() + " has no exact " +
                    (e5m2 ? "FLOAT8E5M2" : "FLOAT8E4M3FN") + " encoding");
}

}  // namespace

// An initializer whose shape disagrees with the data it holds (a truncated file, a hand-edited
// shape): every pass that walks its dims would read past the data.
void check_tensor_data(const onnx::TensorProto& t) {
  const int64_t numel = shape_numel(t);
  if (t.data_location() == onnx::TensorProto::EXTERNAL) return;  // refused when read
  const int64_t size = element_size(t.data_type());
  const int64_t per = elements_per_unit(t.data_type());
  int64_t held = -1;  // units held (bytes / size, or typed entries); -1 unknown, -2 partial
  if (t.has_raw_data()) {
    if (size > 0) held = static_cast<int64_t>(t.raw_data().size()) / size;
    if (size > 0 && static_cast<int64_t>(t.raw_data().size()) % size != 0) held = -2;
  } else if (size > 0 || t.data_type() == onnx::TensorProto::STRING) {
    held = std::max({t.float_data_size(), t.double_data_size(), t.int64_data_size(),
                     t.int32_data_size(), t.uint64_data_size(), t.string_data_size()});
  }
  // A packed type holds ceil(numel / per) units, its last one maybe with padding; any other
  // count is refused, one unit per element included (held * per: the elements they would pack).
  if (held >= 0 && per > 1) held = held == numel / per + (numel % per != 0) ? numel : held * per;
  if (held != -1 && held != numel) {
    throw DeployError("initializer '" + t.name() + "' has a shape of " + std::to_string(numel) +
                      " elements but holds " + (held < 0 ? std::string("a partial element") :
                                                 std::to_string(held)) +
                      " (truncated or corrupt ONNX file?)");
  }
}

ConstTensor to_const(const onnx::TensorProto& t) {
  ConstTensor c;
  c.dims.assign(t.dims().begin(), t.dims().end());
  c.elem_type = t.data_type();
  if (t.data_location() == onnx::TensorProto::EXTERNAL) {
    throw DeployError("tensor '" + t.name() + "' keeps its data in an external file, which the "
                      "deploy passes do not read; export without external data");
  }
  const std::string& raw = t.raw_data();
  const bool has_raw = t.has_raw_data();
  switch (t.data_type()) {
    case onnx::TensorProto::FLOAT:
      if (has_raw) append_raw<float>(raw, &c.values);
      else c.values.assign(t.float_data().begin(), t.float_data().end());
      break;
    case onnx::TensorProto::DOUBLE:
      if (has_raw) append_raw<double>(raw, &c.values);
      else c.values.assign(t.double_data().begin(), t.double_data().end());
      break;
    case onnx::TensorProto::INT64:
      if (has_raw) append_raw<int64_t>(raw, &c.values);
      else for (auto v : t.int64_data()) c.values.push_back(static_cast<double>(v));
      break;
    case onnx::TensorProto::INT32:
      if (has_raw) append_raw<int32_t>(raw, &c.values);
      else c.values.assign(t.int32_data().begin(), t.int32_data().end());
      break;
    case onnx::TensorProto::INT16:
      if (has_raw) append_raw<int16_t>(raw, &c.values);
      else c.values.assign(t.int32_data().begin(), t.int32_data().end());
      break;
    case onnx::TensorProto::INT8:
      if (has_raw) append_raw<int8_t>(raw, &c.values);
      else c.values.assign(t.int32_data().begin(), t.int32_data().end());
      break;
    case onnx::TensorProto::UINT8:
    case onnx::TensorProto::BOOL:
      if (has_raw) append_raw<uint8_t>(raw, &c.values);
      else c.values.assign(t.int32_data().begin(), t.int32_data().end());
      break;
    case onnx::TensorProto::FLOAT8E4M3FN:
    case onnx::TensorProto::FLOAT8E5M2:
      append_float8(has_raw ? raw : int32_bytes(t), t.data_type() == onnx::TensorProto::FLOAT8E5M2,
                    &c.values);
      break;
    case onnx::TensorProto::INT4:
    case onnx::TensorProto::UINT4:
    case onnx::TensorProto::FLOAT4E2M1:
      append_4bit(has_raw ? raw : int32_bytes(t), t.data_type(), shape_numel(t), &c.values);
      break;
    default:
      throw DeployError("tensor '" + t.name() + "' has ONNX data type " +
                        std::to_string(t.data_type()) + ", which the deploy passes do not read");
  }
  const int64_t expected = shape_numel(t);
  if (expected != c.numel()) {
    throw DeployError("tensor '" + t.name() + "' holds " + std::to_string(c.numel()) +
                      " values but its shape has " + std::to_string(expected) +
                      " (truncated or corrupt ONNX file?)");
  }
  return c;
}

onnx::TensorProto make_tensor(const std::string& name, int32_t elem_type,
                              const std::vector<int64_t>& dims, const std::vector<double>& values) {
  onnx::TensorProto t;
  t.set_name(name);
  t.set_data_type(elem_type);
  for (auto d : dims) t.add_dims(d);
  switch (elem_type) {
    case onnx::TensorProto::FLOAT: t.set_raw_data(to_raw<float>(values, name)); break;
    case onnx::TensorProto::DOUBLE: t.set_raw_data(to_raw<double>(values, name)); break;
    case onnx::TensorProto::INT64: t.set_raw_data(to_raw<int64_t>(values, name)); break;
    case onnx::TensorProto::INT32: t.set_raw_data(to_raw<int32_t>(values, name)); break;
    case onnx::TensorProto::INT8: t.set_raw_data(to_raw<int8_t>(values, name)); break;
    case onnx::TensorProto::UINT8: t.set_raw_data(to_raw<uint8_t>(values, name)); break;
    case onnx::TensorProto::INT4:
    case onnx::TensorProto::UINT4: {  // two to a byte, low nibble first
      const bool is_signed = elem_type == onnx::TensorProto::INT4;
      std::string raw((values.size() + 1) / 2, '\0');
      for (size_t i = 0; i < values.size(); ++i) {
        const double v = values[i];
        if (!(v == std::nearbyint(v) && v >= (is_signed ? -8 : 0) && v <= (is_signed ? 7 : 15))) {
          std::ostringstream shown;
          shown << v;
          throw DeployError("tensor '" + name + "': value " + shown.str() + " at index " +
                            std::to_string(i) + " is not a " +
                            (is_signed ? "4-bit" : "4-bit unsigned") + " integer");
        }
        const int nibble = static_cast<int>(v) & 0xf;
        const auto byte = static_cast<unsigned char>(raw[i / 2]);
        raw[i / 2] = static_cast<char>(byte | (nibble << (4 * (i % 2))));
      }
      t.set_raw_data(raw);
      break;
    }
    case onnx::TensorProto::FLOAT4E2M1: {  // exact E2M1 values, two to a byte
      std::string raw((values.size() + 1) / 2, '\0');
      for (size_t i = 0; i < values.size(); ++i) {
        const double a = std::fabs(values[i]);
        const auto code = std::find(std::begin(kE2M1), std::end(kE2M1), a) - std::begin(kE2M1);
        if (code == 8) {
          std::ostringstream shown;
          shown << values[i];
          throw DeployError("tensor '" + name + "': value " + shown.str() + " at index " +
                            std::to_string(i) + " has no exact FLOAT4E2M1 encoding");
        }
        const int nibble = static_cast<int>(code) | (std::signbit(values[i]) ? 8 : 0);
        const auto byte = static_cast<unsigned char>(raw[i / 2]);
        raw[i / 2] = static_cast<char>(byte | (nibble << (4 * (i % 2))));
      }
      t.set_raw_data(raw);
      break;
    }
    case onnx::TensorProto::FLOAT8E4M3FN:
    case onnx::TensorProto::FLOAT8E5M2: {
      std::string raw;
      for (double v : values) raw.push_back(static_cast<char>(
          float8_byte(v, elem_type == onnx::TensorProto::FLOAT8E5M2, name)));
      t.set_raw_data(raw);
      break;
    }
    default:
      throw DeployError("make_tensor: unsupported ONNX data type " + std::to_string(elem_type));
  }
  return t;
}

int64_t checked_int64(double v, const std::string& what) {
  // 2^63 is exact in a double; every double below it converts without overflow.
  constexpr double kLimit = 9223372036854775808.0;
  if (!std::isfinite(v) || std::nearbyint(v) >= kLimit || std::nearbyint(v) < -kLimit) {
    std::ostringstream shown;
    shown << v;
    throw DeployError(what + ": " + shown.str() + " is not a 64-bit integer");
  }
  return static_cast<int64_t>(std::nearbyint(v));
}

}  // namespace deploy
}  // namespace mqbench
