// C++ twins of the fake quantizers (include/mqbench/fake_quantize/fake_quantize.h). Each
// forward: observe (when enabled), then one fake-quantize op (when enabled), with MQBench's
// state handling; no maths here.

#include "mqbench/fake_quantize/fake_quantize.h"

#include <torch/types.h>

#include <cmath>
#include <functional>
#include <limits>

#include "mqbench/ops/fake_quantize_ops.h"
#include "mqbench/ops/fake_quantize_mx.h"

namespace mqbench {

namespace mo = mqbench::ops;
using torch::Tensor;

namespace {

// Replaces a parameter's or buffer's data (Python's `t.data = value`), keeping its dtype.
void assign(Tensor& t, const Tensor& value) {
  torch::NoGradGuard no_grad;
  t.set_data(value.detach().to(t.scalar_type()).clone());
}

double param(const std::map<std::string, double>& p, const char* key, double fallback) {
  auto it = p.find(key);
  return it == p.end() ? fallback : it->second;
}

}  // namespace

FakeQuantizeImpl::FakeQuantizeImpl(std::shared_ptr<ObserverImpl> observer, const std::string& name)
    : torch::nn::Module(name) {
  TORCH_CHECK(observer != nullptr, name, ": the observer is null");
  fake_quant_enabled = register_buffer("fake_quant_enabled", torch::ones({1}, torch::kUInt8));
  observer_enabled = register_buffer("observer_enabled", torch::ones({1}, torch::kUInt8));
  activation_post_process = register_module("activation_post_process", observer);
  quant_min = observer->quant_min();
  quant_max = observer->quant_max();
  TORCH_CHECK(quant_min <= quant_max, "quant_min must be less than or equal to quant_max");
  ch_axis = observer->ch_axis();
  is_per_channel = observer->options().per_channel();
  is_symmetric_quant = observer->symmetric();
  pot_scale = observer->options().pot_scale;
  bitwidth = static_cast<int64_t>(std::log2(static_cast<double>(quant_max - quant_min + 1)));
}

void FakeQuantizeImpl::enable_fake_quant(bool enabled) { fake_quant_enabled.fill_(enabled ? 1 : 0); }
void FakeQuantizeImpl::enable_observer(bool enabled) { observer_enabled.fill_(enabled ? 1 : 0); }
bool FakeQuantizeImpl::fake_quant_on() const { return fake_quant_enabled.item<uint8_t>() == 1; }
bool FakeQuantizeImpl::observer_on() const { return observer_enabled.item<uint8_t>() == 1; }

std::tuple<Tensor, Tensor> FakeQuantizeImpl::calculate_qparams() {
  return activation_post_process->calculate_qparams();
}

void FakeQuantizeImpl::observe_into_buffers(const Tensor& x, Tensor& scale, Tensor& zp) {
  activation_post_process->forward(x.detach());
  auto qp = calculate_qparams();
  assign(scale, std::get<0>(qp));
  assign(zp, std::get<1>(qp));
}

void FakeQuantizeImpl::observe_into_parameters(const Tensor& x, Tensor& scale, Tensor& zp,
                                               const Tensor& eps) {
  torch::NoGradGuard no_grad;
  if (observer_on()) {
    activation_post_process->forward(x.detach());
    auto qp = calculate_qparams();
    if (ch_axis != -1 || scale.sizes() != std::get<0>(qp).sizes()) {
      assign(scale, std::get<0>(qp));
      assign(zp, std::get<1>(qp));
    } else {
      scale.copy_(std::get<0>(qp));
      zp.copy_(std::get<1>(qp));
    }
  } else {
    scale.abs_().clamp_min_(eps.item<double>());
  }
}

Tensor FakeQuantizeImpl::fixed(const Tensor& x, const Tensor& scale, const Tensor& zp) const {
  return is_per_channel
             ? mo::fake_quantize_per_channel_affine(x, scale, zp, ch_axis, quant_min, quant_max)
             : mo::fake_quantize_per_tensor_affine(x, scale, zp, quant_min, quant_max);
}

namespace {

using Params = std::map<std::string, double>;

class FixedFakeQuantize : public FakeQuantizeImpl {
 public:
  FixedFakeQuantize(std::shared_ptr<ObserverImpl> o, const std::string& name, const Params&)
      : FakeQuantizeImpl(std::move(o), name) {
    scale = register_buffer("scale", torch::ones({1}));
    zero_point = register_buffer("zero_point", torch::zeros({1}, torch::kInt));
  }
  Tensor forward(const Tensor& x) override {
    if (observer_on()) observe_into_buffers(x, scale, zero_point);
    return fake_quant_on() ? quantize(x) : x;
  }
  Tensor scale, zero_point;

 protected:
  virtual Tensor quantize(const Tensor& x) { return fixed(x, scale, zero_point); }
};

class DoReFaFakeQuantize : public FixedFakeQuantize {
 public:
  using FixedFakeQuantize::FixedFakeQuantize;
  Tensor forward(const Tensor& x) override {
    return FixedFakeQuantize::forward(mo::dorefa_normalize(x));
  }
};

class DSQFakeQuantize : public FixedFakeQuantize {
 public:
  DSQFakeQuantize(std::shared_ptr<ObserverImpl> o, const std::string& name, const Params& p)
      : FixedFakeQuantize(std::move(o), name, p), alpha_(param(p, "alpha", 0.4)) {}
  Tensor forward(const Tensor& x) override {
    if (is_training()) observe_into_buffers(x, scale, zero_point);  // as MQBench
    return fake_quant_on() ? quantize(x) : x;
  }

 protected:
  Tensor quantize(const Tensor& x) override {
    return is_per_channel ? mo::fake_quantize_dsq_per_channel(x, scale, zero_point, ch_axis,
                                                              quant_min, quant_max, alpha_)
                          : mo::fake_quantize_dsq_per_tensor(x, scale, zero_point, quant_min,
                                                             quant_max, alpha_);
  }
  double alpha_;
};

class LearnableFakeQuantize : public FakeQuantizeImpl {
 public:
  LearnableFakeQuantize(std::shared_ptr<ObserverImpl> o, const std::string& name, const Params& p)
      : FakeQuantizeImpl(std::move(o), name),
        use_grad_scaling_(param(p, "use_grad_scaling", 1.0) != 0.0) {
    scale = register_parameter("scale", torch::full({1}, param(p, "scale", 1.0)));
    zero_point = register_parameter("zero_point", torch::full({1}, param(p, "zero_point", 0.0)));
    eps = register_buffer("eps", torch::tensor({std::numeric_limits<float>::epsilon()}));
  }
  Tensor forward(const Tensor& x) override {
    observe_into_parameters(x, scale, zero_point, eps);
    if (!fake_quant_on()) return x;
    {
      torch::NoGradGuard no_grad;
      if (is_symmetric_quant) {
        zero_point.zero_();
      } else {
        zero_point.clamp_(static_cast<double>(quant_min), static_cast<double>(quant_max));
      }
    }
    const double n = is_per_channel ? static_cast<double>(x.numel()) / x.size(ch_axis)
                                    : static_cast<double>(x.numel());
    const double g = use_grad_scaling_ ? 1.0 / std::sqrt(n * quant_max) : 1.0;
    return is_per_channel
               ? mo::fake_quantize_learnable_per_channel_affine(x, scale, zero_point, ch_axis,
                                                                quant_min, quant_max, g)
               : mo::fake_quantize_learnable_per_tensor_affine(x, scale, zero_point, quant_min,
                                                               quant_max, g);
  }
  Tensor scale, zero_point, eps;

 private:
  bool use_grad_scaling_;
};

class NNIEFakeQuantize : public FakeQuantizeImpl {
 public:
  NNIEFakeQuantize(std::shared_ptr<ObserverImpl> o, const std::string& name, const Params&)
      : FakeQuantizeImpl(std::move(o), name) {
    data_max = register_buffer("data_max",
                               torch::tensor(-std::numeric_limits<float>::infinity()));
  }
  Tensor forward(const Tensor& x) override {
    if (observer_on()) activation_post_process->forward(x.detach());
    {
      torch::NoGradGuard no_grad;
      const auto& app = *activation_post_process;
      auto observed = torch::maximum(-app.min_val, app.max_val).max().to(data_max.scalar_type());
      data_max.copy_(torch::maximum(data_max, observed));
    }
    if (!fake_quant_on()) return x;
    const double m = data_max.item<double>();
    TORCH_CHECK(std::isfinite(m) && m > 0, "NNIEFakeQuantize: data_max is ", m,
                "; calibrate with the observer enabled on non-zero data before quantizing");
    return mo::fake_quantize_nnie(x, data_max);
  }
  Tensor data_max;
};

class PACTFakeQuantize : public FakeQuantizeImpl {
 public:
  PACTFakeQuantize(std::shared_ptr<ObserverImpl> o, const std::string& name, const Params& p)
      : FakeQuantizeImpl(std::move(o), name) {
    const double a = param(p, "alpha", 6.0);
    alpha = register_parameter("alpha", torch::full({1}, a));
    if (!is_symmetric_quant) n_alpha = register_parameter("n_alpha", torch::full({1}, -a));
    scale = register_buffer("scale", torch::ones({1}));
    zero_point = register_buffer("zero_point", torch::zeros({1}, torch::kInt));
  }
  Tensor forward(const Tensor& x) override {
    const bool clip = observer_on();
    Tensor lower;
    if (clip) {
      auto& app = *activation_post_process;
      app.forward(x.detach());
      if (x.numel() > 0 && x.detach().min().item<double>() < 0) {
        lower = is_symmetric_quant ? -alpha : n_alpha;
      }
      torch::NoGradGuard no_grad;
      app.max_val.set_data(alpha.detach().reshape({}).to(app.max_val.scalar_type()).clone());
      app.min_val.set_data(lower.defined()
                               ? lower.detach().reshape({}).to(app.min_val.scalar_type()).clone()
                               : torch::zeros_like(app.max_val));
      auto qp = calculate_qparams();
      assign(scale, std::get<0>(qp));
      assign(zero_point, std::get<1>(qp));
    }
    const auto no_lower = torch::full_like(alpha, -std::numeric_limits<double>::infinity());
    if (fake_quant_on()) {
      return clip ? mo::fake_quantize_pact(x, alpha, lower.defined() ? lower : no_lower, scale,
                                           zero_point, quant_min, quant_max)
                  : fixed(x, scale, zero_point);
    }
    if (!clip) return x;
    auto y = torch::minimum(x, alpha);
    return lower.defined() ? torch::maximum(y, lower) : y;
  }
  Tensor alpha, n_alpha, scale, zero_point;
};

class TqtFakeQuantize : public FakeQuantizeImpl {
 public:
  TqtFakeQuantize(std::shared_ptr<ObserverImpl> o, const std::string& name, const Params& p)
      : FakeQuantizeImpl(std::move(o), name) {
    scale = register_buffer("scale", torch::full({1}, param(p, "scale", 1.0)));
    zero_point = register_buffer("zero_point", torch::full({1}, param(p, "zero_point", 0.0)));
    eps = register_buffer("eps", torch::tensor({std::numeric_limits<float>::epsilon()}));
  }
  void set_quant_type(const std::string& t) {
    TORCH_CHECK(t == "input" || t == "tensor" || t == "param", "TqtFakeQuantize.set_quant_type: '",
                t, "' is not one of ['input', 'tensor', 'param']");
    activation_post_process->set_quant_type(t);
    mth_ = t == "param" ? 3 : 2;
  }
  Tensor forward(const Tensor& x) override {
    observe_into_parameters(x, scale, zero_point, eps);
    if (!fake_quant_on()) return x;
    TORCH_CHECK(is_symmetric_quant && !is_per_channel,
                "TqtFakeQuantize supports symmetric per-tensor quantization only");
    TORCH_CHECK(mth_ != 0, "Invalid method None encoding!");
    zero_point.zero_();
    return mo::fake_quantize_tqt(x, scale, zero_point, quant_min, quant_max, mth_);
  }
  Tensor scale, zero_point, eps;

 private:
  int64_t mth_ = 0;
};

class AdaRoundFakeQuantize : public FixedFakeQuantize {
 public:
  using FixedFakeQuantize::FixedFakeQuantize;
  void init(const Tensor& weight) {
    adaround_ = true;
    enable_observer(false);
    enable_fake_quant(true);
    auto s = scale;
    if (is_per_channel) {
      std::vector<int64_t> shape(weight.dim(), 1);
      shape[ch_axis] = weight.size(ch_axis);
      s = s.reshape(shape);
    }
    torch::NoGradGuard no_grad;
    const auto v = weight.detach() / s;
    const auto rest = v - torch::floor(v);
    // h(alpha) = rest: alpha = -log((zeta - gamma) / (rest - gamma) - 1), gamma -0.1, zeta 1.1
    alpha = register_parameter("alpha", -torch::log(1.2 / (rest + 0.1) - 1));
  }
  Tensor forward(const Tensor& x) override {
    if (!adaround_) return FixedFakeQuantize::forward(x);
    if (observer_on()) observe_into_buffers(x, scale, zero_point);
    if (!fake_quant_on()) return x;
    return is_per_channel
               ? mo::fake_quantize_adaround_per_channel(x, scale.detach(), zero_point, alpha,
                                                        ch_axis, quant_min, quant_max, false)
               : mo::fake_quantize_adaround_per_tensor(x, scale.detach(), zero_point, alpha,
                                                       quant_min, quant_max, false);
  }
  Tensor alpha;

 private:
  bool adaround_ = false;
};

class QDropFakeQuantize : public FakeQuantizeImpl {
 public:
  QDropFakeQuantize(std::shared_ptr<ObserverImpl> o, const std::string& name, const Params&)
      : FakeQuantizeImpl(std::move(o), name) {
    scale = register_parameter("scale", torch::ones({1}));
    zero_point = register_buffer("zero_point", torch::zeros({1}, torch::kInt));
  }
  Tensor forward(const Tensor& x) override {
    if (observer_on()) observe_into_buffers(x, scale, zero_point);  // scale is a Parameter here
    if (!fake_quant_on()) return x;
    return is_per_channel ? mo::fake_quantize_qdrop_per_channel(x, scale, zero_point, ch_axis,
                                                                quant_min, quant_max, prob)
                          : mo::fake_quantize_qdrop_per_tensor(x, scale, zero_point, quant_min,
                                                               quant_max, prob);
  }
  Tensor scale, zero_point;
  double prob = 1.0;
};

// ---- the format twins (docs/formats.md, docs/formats-mx.md): get_qconfig picks them for a
// scheme's dtype, as prepare_by_platform's FORMAT_FAKEQUANTIZE does in Python ----------------

// The observer's format (ObserverOptions::format, from QuantizeScheme::dtype), one of `allowed`.
std::string format_of(const ObserverImpl& o, const std::string& name,
                      std::initializer_list<const char*> allowed) {
  std::string valid;
  for (const char* a : allowed) {
    if (o.options().format == a) return a;
    valid += (valid.empty() ? "'" : ", '") + std::string(a) + "'";
  }
  TORCH_CHECK(false, name, ": the observer's format is '", o.options().format, "'; this fake "
              "quantizer runs ", valid, " (QuantizeScheme::dtype)");
}

c10::optional<int64_t> channel_axis(const FakeQuantizeImpl& fq) {
  return fq.is_per_channel ? c10::optional<int64_t>(fq.ch_axis) : c10::nullopt;
}

// The blocks' axis for axis = -2 (Python's None): the input channels as layers lay them out,
// axis 1 of a 4-d or 5-d tensor, else the last (mqbench.fake_quantize.mx.block_axis).
int64_t block_axis(int64_t axis, const Tensor& x) {
  if (axis != -2) return axis;
  return x.dim() == 4 || x.dim() == 5 ? 1 : -1;
}

class FP8FakeQuantize : public FakeQuantizeImpl {
 public:
  FP8FakeQuantize(std::shared_ptr<ObserverImpl> o, const std::string& name, const Params&)
      : FakeQuantizeImpl(std::move(o), name),
        format(format_of(*activation_post_process, name, {"fp8_e4m3", "fp8_e5m2"})) {
    scale = register_buffer("scale", torch::ones({1}));
    zero_point = register_buffer("zero_point", torch::zeros({1}, torch::kInt));
    bitwidth = 8;
  }
  Tensor forward(const Tensor& x) override {
    if (observer_on()) observe_into_buffers(x, scale, zero_point);  // amax / the format's max
    return fake_quant_on() ? mo::fake_quantize_fp8(x, scale, channel_axis(*this), format) : x;
  }
  Tensor scale, zero_point;
  const std::string format;
};

class LearnableFP8FakeQuantize : public FakeQuantizeImpl {
 public:
  LearnableFP8FakeQuantize(std::shared_ptr<ObserverImpl> o, const std::string& name,
                           const Params& p)
      : FakeQuantizeImpl(std::move(o), name),
        format(format_of(*activation_post_process, name, {"fp8_e4m3", "fp8_e5m2"})),
        use_grad_scaling_(param(p, "use_grad_scaling", 1.0) != 0.0) {
    scale = register_parameter("scale", torch::full({1}, param(p, "scale", 1.0)));
    zero_point = register_buffer("zero_point", torch::zeros({1}));
    eps = register_buffer("eps", torch::tensor({std::numeric_limits<float>::epsilon()}));
    bitwidth = 8;
  }
  Tensor forward(const Tensor& x) override {
    observe_into_parameters(x, scale, zero_point, eps);
    if (!fake_quant_on()) return x;
    // LSQ's 1 / sqrt(n * quant_max), n = elements per scale (quant_max: 448 or 57344)
    const double n = is_per_channel ? static_cast<double>(x.numel()) / x.size(ch_axis)
                                    : static_cast<double>(x.numel());
    const double g = use_grad_scaling_ ? 1.0 / std::sqrt(n * quant_max) : 1.0;
    return mo::fake_quantize_learnable_fp8(x, scale, channel_axis(*this), format, g);
  }
  Tensor scale, zero_point, eps;
  const std::string format;

 private:
  bool use_grad_scaling_;
};

// MX: each block's scale comes from the block; the observer runs (its range informs only).
class MXFakeQuantize : public FakeQuantizeImpl {
 public:
  MXFakeQuantize(std::shared_ptr<ObserverImpl> o, const std::string& name, const Params& p)
      : FakeQuantizeImpl(std::move(o), name),
        format(format_of(*activation_post_process, name,
                         {"mxfp8_e4m3", "mxfp6_e3m2", "mxfp6_e2m3", "mxfp4"})),
        block_size(static_cast<int64_t>(param(p, "block_size", 32))),
        axis(static_cast<int64_t>(param(p, "axis", -2))) {
    bitwidth = format == "mxfp4" ? 4 : format.rfind("mxfp6", 0) == 0 ? 6 : 8;
  }
  Tensor forward(const Tensor& x) override {
    if (observer_on()) activation_post_process->forward(x.detach());
    return fake_quant_on() ? mo::fake_quantize_mx(x, format, block_size, block_axis(axis, x))
                           : x;
  }
  const std::string format;
  const int64_t block_size, axis;  // axis -2: the input channels (block_axis)
};

// NVFP4: the per-tensor amax (buffer `amax`) from the observer, refreshed on each observed call.
class NVFP4FakeQuantize : public FakeQuantizeImpl {
 public:
  NVFP4FakeQuantize(std::shared_ptr<ObserverImpl> o, const std::string& name, const Params& p)
      : FakeQuantizeImpl(std::move(o), name),
        format(format_of(*activation_post_process, name, {"nvfp4"})),
        block_size(static_cast<int64_t>(param(p, "block_size", 16))),
        axis(static_cast<int64_t>(param(p, "axis", -2))) {
    TORCH_CHECK(!is_per_channel, name, ": the NVFP4 global scale is per tensor; use a "
                "per-tensor observer (QuantizeScheme dtype 'nvfp4')");
    amax = register_buffer("amax", torch::tensor(-std::numeric_limits<float>::infinity()));
    bitwidth = 4;
  }
  Tensor forward(const Tensor& x) override {
    if (observer_on()) {
      activation_post_process->forward(x.detach());
      torch::NoGradGuard no_grad;
      const auto& app = *activation_post_process;
      amax.copy_(torch::maximum(-app.min_val, app.max_val).reshape({}));
    }
    return fake_quant_on()
               ? mo::fake_quantize_nvfp4(x, amax, block_size, block_axis(axis, x))
               : x;
  }
  Tensor amax;
  const std::string format;
  const int64_t block_size, axis;
};

using Factory = std::function<std::shared_ptr<FakeQuantizeImpl>(std::shared_ptr<ObserverImpl>,
                                                                const Params&)>;

struct Entry {
  std::string name;
  std::vector<std::string> params;
  Factory make;
};

template <typename T>
Entry entry(const char* name, std::vector<std::string> params) {
  return {name, std::move(params), [name](std::shared_ptr<ObserverImpl> o, const Params& p) {
            return std::make_shared<T>(std::move(o), name, p);
          }};
}

const std::vector<Entry>& entries() {
  static const std::vector<Entry> e{
      entry<FixedFakeQuantize>("FixedFakeQuantize", {}),
      entry<LearnableFakeQuantize>("LearnableFakeQuantize",
                                   {"scale", "zero_point", "use_grad_scaling"}),
      entry<NNIEFakeQuantize>("NNIEFakeQuantize", {}),
      entry<DoReFaFakeQuantize>("DoReFaFakeQuantize", {}),
      entry<DSQFakeQuantize>("DSQFakeQuantize", {"alpha"}),
      entry<PACTFakeQuantize>("PACTFakeQuantize", {"alpha"}),
      entry<TqtFakeQuantize>("TqtFakeQuantize", {"scale", "zero_point"}),
      entry<AdaRoundFakeQuantize>("AdaRoundFakeQuantize", {}),
      entry<QDropFakeQuantize>("QDropFakeQuantize", {}),
      entry<FP8FakeQuantize>("FP8FakeQuantize", {}),
      entry<LearnableFP8FakeQuantize>("LearnableFP8FakeQuantize", {"scale", "use_grad_scaling"}),
      entry<MXFakeQuantize>("MXFakeQuantize", {"block_size", "axis"}),
      entry<NVFP4FakeQuantize>("NVFP4FakeQuantize", {"block_size", "axis"}),
  };
  return e;
}

template <typename T>
T& as(FakeQuantizeImpl& fq, const char* what, const char* expected) {
  auto* p = dynamic_cast<T*>(&fq);
  TORCH_CHECK(p != nullptr, what, " needs a ", expected, ", got ", fq.name());
  return *p;
}

}  // namespace

std::vector<std::string> cpp_fake_quantize_names() {
  std::vector<std::string> out;
  for (const auto& e : entries()) out.push_back(e.name);
  return out;
}

std::shared_ptr<FakeQuantizeImpl> make_fake_quantize(const std::string& name,
                                                     std::shared_ptr<ObserverImpl> observer,
                                                     const Params& params) {
  for (const auto& e : entries()) {
    if (e.name != name) continue;
    for (const auto& kv : params) {
      bool known = false;
      std::string valid;
      for (const auto& p : e.params) {
        known |= p == kv.first;
        valid += (valid.empty() ? "" : ", ") + p;
      }
      TORCH_CHECK(known, name, ": unknown parameter '", kv.first, "'; valid parameters: ",
                  valid.empty() ? "none" : valid);
    }
    return e.make(std::move(observer), params);
  }
  std::string valid;
  for (const auto& n : cpp_fake_quantize_names()) valid += (valid.empty() ? "" : ", ") + n;
  TORCH_CHECK(false, "unknown fake quantizer '", name, "'; valid names: ", valid);
}

void set_quant_type(FakeQuantizeImpl& fq, const std::string& quant_type) {
  as<TqtFakeQuantize>(fq, "set_quant_type", "TqtFakeQuantize").set_quant_type(quant_type);
}

void adaround_init(FakeQuantizeImpl& fq, const Tensor& weight) {
  as<AdaRoundFakeQuantize>(fq, "adaround_init", "AdaRoundFakeQuantize").init(weight);
}

void set_qdrop_prob(FakeQuantizeImpl& fq, double prob) {
  TORCH_CHECK(prob >= 0 && prob <= 1, "set_qdrop_prob: prob must be in [0, 1], got ", prob);
  as<QDropFakeQuantize>(fq, "set_qdrop_prob", "QDropFakeQuantize").prob = prob;
}

}  // namespace mqbench
