// C++ twins of the observers (include/mqbench/observer/observer.h). Each forward is one
// observer op; the maths live in src/ops/ (schemas in observer.cpp, CPU kernels in
// cpu/observer_cpu.cpp).

#include "mqbench/observer/observer.h"

#include <torch/types.h>

#include <array>
#include <cmath>
#include <functional>
#include <limits>
#include <map>

#include "mqbench/ops/fake_quantize_ops.h"
#include "mqbench/ops/observer_ops.h"

namespace mqbench {

namespace mo = mqbench::ops;
using torch::Tensor;
using TT = std::tuple<Tensor, Tensor>;

ObserverImpl::ObserverImpl(ObserverOptions options, const std::string& name)
    : torch::nn::Module(name), options_(std::move(options)) {
  TORCH_CHECK(options_.quant_min.has_value() == options_.quant_max.has_value(), name,
              ": give both quant_min and quant_max, or neither");
  std::tie(quant_min_, quant_max_) = options_.range();
  TORCH_CHECK(quant_min_ <= 0 && 0 <= quant_max_ && quant_min_ < quant_max_, name,
              ": the range [", quant_min_, ", ", quant_max_, "] must include 0 and be non-empty");
  eps = register_buffer("eps", torch::tensor({std::numeric_limits<float>::epsilon()}));
  min_val = register_buffer("min_val", torch::tensor(std::numeric_limits<float>::infinity()));
  max_val = register_buffer("max_val", torch::tensor(-std::numeric_limits<float>::infinity()));
}

Tensor ObserverImpl::prepare(const Tensor& x) const {
  return x.numel() == 0 ? Tensor() : x.detach().to(min_val.scalar_type());
}

int64_t ObserverImpl::symmetric_zero_point() const {
  if (options_.dtype != "quint8") return 0;
  return options_.quant_min ? (quant_min_ + quant_max_) / 2 : 128;
}

double ObserverImpl::option(const char* key, double fallback) const {
  auto it = options_.extra.find(key);
  return it == options_.extra.end() ? fallback : it->second;
}

TT ObserverImpl::range_qparams(const Tensor& mn, const Tensor& mx) const {
  return mo::observer_calculate_qparams(mn, mx, quant_min_, quant_max_, symmetric(),
                                        symmetric_zero_point(), eps);
}

TT ObserverImpl::finish(Tensor scale, Tensor zp) const {
  if (options_.pot_scale) scale = mo::pot_quantization(scale);
  return {scale, zp};
}

TT ObserverImpl::calculate_qparams() {
  auto r = range_qparams(min_val, max_val);
  return finish(std::get<0>(r), std::get<1>(r));
}

void ObserverImpl::set_range(const TT& range) {
  // Replace the buffers' contents in place, so the module's buffer table stays valid.
  min_val.set_(std::get<0>(range).to(min_val.scalar_type()).clone());
  max_val.set_(std::get<1>(range).to(max_val.scalar_type()).clone());
}

TT ObserverImpl::batch_range(const Tensor& x) { return mo::observer_min_max(x, ch_axis()); }

void ObserverImpl::update(const TT& cur) {
  set_range(mo::observer_running_min_max(min_val, max_val, std::get<0>(cur), std::get<1>(cur)));
}

void ObserverImpl::ema_update(const TT& cur) {
  set_range(mo::observer_ema_min_max(min_val, max_val, std::get<0>(cur), std::get<1>(cur),
                                     option("ema_ratio", 0.9)));
}

Tensor ObserverImpl::forward(const Tensor& x_orig) {
  auto x = prepare(x_orig);
  if (!x.defined()) return x_orig;
  update(batch_range(x));
  return x;
}

namespace {

class MinMaxObserver : public ObserverImpl {
 public:
  using ObserverImpl::ObserverImpl;
};

class EMAMinMaxObserver : public ObserverImpl {
 public:
  using ObserverImpl::ObserverImpl;

 protected:
  void update(const TT& cur) override { ema_update(cur); }
};

class EMAQuantileObserver : public EMAMinMaxObserver {
 public:
  EMAQuantileObserver(ObserverOptions o, const std::string& name) : EMAMinMaxObserver(o, name) {
    TORCH_CHECK(ch_axis() == -1, "Quantile observer only support in per-tensor scheme.");
    const double bins = option("bins", 2048), threshold = option("threshold", 0.99999);
    // Checked here, before the cast: a double outside int64's range does not convert.
    TORCH_CHECK_VALUE(bins >= 1 && bins <= static_cast<double>(kMaxQuantileBins) &&
                          bins == std::floor(bins),
                      "EMAQuantileObserver: bins must be an integer in [1, ", kMaxQuantileBins,
                      "], got ", bins);
    TORCH_CHECK_VALUE(threshold > 0.0 && threshold <= 1.0,
                      "EMAQuantileObserver: threshold must be in (0, 1], got ", threshold);
    bins_ = static_cast<int64_t>(bins);
    threshold_ = threshold;
  }

 protected:
  TT batch_range(const Tensor& x) override {
    return mo::observer_quantile_range(x, threshold_, bins_);
  }

 private:
  int64_t bins_;
  double threshold_;
};

class ClipStdObserver : public ObserverImpl {
 public:
  using ObserverImpl::ObserverImpl;

 protected:
  TT batch_range(const Tensor& x) override {
    return mo::observer_clip_std_range(x, ch_axis(), option("std_scale", 2.6));
  }
  void update(const TT& cur) override { set_range(cur); }  // the current batch only
};

class MSEObserver : public ObserverImpl {
 public:
  using ObserverImpl::ObserverImpl;

 protected:
  TT batch_range(const Tensor& x) override {
    return mo::observer_mse_range(x, ch_axis(), quant_min_, quant_max_, symmetric(),
                                  symmetric_zero_point(), eps, option("p", 2.0),
                                  ch_axis() == -1 ? 95 : 80);
  }
};

class EMAMSEObserver : public MSEObserver {
 public:
  using MSEObserver::MSEObserver;

 protected:
  void update(const TT& cur) override { ema_update(cur); }
};

class MinMaxFloorObserver : public ObserverImpl {
 public:
  using ObserverImpl::ObserverImpl;
  Tensor forward(const Tensor& x_orig) override {
    auto x = prepare(x_orig);
    if (!x.defined()) return x_orig;
    set_range(mo::observer_min_max(x, -1));
    last_ = x;
    return x;
  }
  TT calculate_qparams() override {
    TORCH_CHECK(!quant_type_.empty(), "You should set the observer type before forward!");
    if (!last_.defined()) return ObserverImpl::calculate_qparams();
    return pot_qparams(vote(search()));
  }

 protected:
  int64_t search() const {
    return mo::observer_pot_exponent(last_, min_val, max_val, quant_min_, quant_max_,
                                     quant_type_ == "input" ? 1 : 5,
                                     quant_type_ == "param" ? 3 : 2);
  }
  virtual int64_t vote(int64_t e) { return e; }
  TT pot_qparams(int64_t e) const {
    auto scale = torch::full({1}, std::ldexp(1.0, static_cast<int>(-e)), min_val.options());
    Tensor zp = torch::zeros({1}, torch::kInt);
    const double m = min_val.item<double>();
    if (!symmetric() && std::isfinite(m) && m >= 0) {
      zp = quant_min_ - torch::round(min_val.reshape({1}) / scale);
    }
    return {scale, zp};
  }
  Tensor last_;
};

class PoTModeObserver : public MinMaxFloorObserver {
 public:
  using MinMaxFloorObserver::MinMaxFloorObserver;

 protected:
  int64_t vote(int64_t e) override {
    counter_[std::min<int64_t>(std::max<int64_t>(e, -7), 12) + 7] += 1;
    int64_t best = 0;
    for (int64_t i = 1; i < 20; ++i) {
      if (counter_[i] > counter_[best]) best = i;
    }
    return best - 7;
  }
  std::array<int64_t, 20> counter_{};
};

class LSQObserver : public ObserverImpl {
 public:
  using ObserverImpl::ObserverImpl;
  Tensor forward(const Tensor& x_orig) override {
    auto x = prepare(x_orig);
    if (!x.defined()) return x_orig;
    auto m = mo::observer_moments(x, ch_axis());
    mean_ = std::get<0>(m);
    std_ = std::get<1>(m);
    norm_ = std::get<2>(m);
    set_range(ch_axis() == -1 ? TT{std::get<3>(m), std::get<4>(m)} : mo::observer_min_max(x, -1));
    return x;
  }
  TT calculate_qparams() override {
    if (!norm_.defined()) return ObserverImpl::calculate_qparams();
    return mo::observer_lsq_qparams(norm_, min_val, quant_min_, quant_max_, symmetric(),
                                    options_.pot_scale, eps);
  }

 protected:
  Tensor mean_, std_, norm_;
};

class LSQPlusObserver : public LSQObserver {
 public:
  using LSQObserver::LSQObserver;
  TT calculate_qparams() override {
    if (!mean_.defined()) return ObserverImpl::calculate_qparams();
    return mo::observer_lsq_plus_qparams(mean_, std_, min_val, quant_min_, quant_max_,
                                         symmetric(), options_.pot_scale, eps);
  }
};

using Factory = std::function<std::shared_ptr<ObserverImpl>(const ObserverOptions&)>;

template <typename T>
Factory factory(const char* name) {
  return [name](const ObserverOptions& o) { return std::make_shared<T>(o, name); };
}

const std::vector<std::pair<std::string, Factory>>& factories() {
  static const std::vector<std::pair<std::string, Factory>> f{
      {"MinMaxObserver", factory<MinMaxObserver>("MinMaxObserver")},
      {"EMAMinMaxObserver", factory<EMAMinMaxObserver>("EMAMinMaxObserver")},
      {"MinMaxFloorObserver", factory<MinMaxFloorObserver>("MinMaxFloorObserver")},
      {"PoTModeObserver", factory<PoTModeObserver>("PoTModeObserver")},
      {"EMAQuantileObserver", factory<EMAQuantileObserver>("EMAQuantileObserver")},
      {"ClipStdObserver", factory<ClipStdObserver>("ClipStdObserver")},
      {"LSQObserver", factory<LSQObserver>("LSQObserver")},
      {"LSQPlusObserver", factory<LSQPlusObserver>("LSQPlusObserver")},
      {"MSEObserver", factory<MSEObserver>("MSEObserver")},
      {"EMAMSEObserver", factory<EMAMSEObserver>("EMAMSEObserver")},
  };
  return f;
}

}  // namespace

std::vector<std::string> cpp_observer_names() {
  std::vector<std::string> out;
  for (const auto& f : factories()) out.push_back(f.first);
  return out;
}

std::shared_ptr<ObserverImpl> make_observer(const std::string& name,
                                            const ObserverOptions& options) {
  for (const auto& f : factories()) {
    if (f.first == name) return f.second(options);
  }
  std::string valid;
  for (const auto& n : cpp_observer_names()) valid += (valid.empty() ? "" : ", ") + n;
  TORCH_CHECK(false, "unknown observer '", name, "'; valid names: ", valid);
}

}  // namespace mqbench
