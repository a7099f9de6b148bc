// The update rules of the local optimizers. Each rule is written twice, in
// the same order of floating-point operations as PyTorch 1.13's
// single-tensor implementation: a fused per-element loop for contiguous CPU
// tensors (one parallel pass, no temporaries) and the same arithmetic as
// tensor ops for everything else (strided views, 16-bit dtypes). Contiguous
// CUDA float32/float64 parameters of a step are queued and updated together
// by kernels/cuda/optim.h's multi-tensor kernels, which repeat the loops'
// arithmetic.
#include "nn/optim.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <iterator>
#include <functional>
#include <optional>
#include <span>
#include <type_traits>

#include "kernels/cpu/loops.h"
#include "kernels/cuda/optim.h"
#include "kernels/cuda_call.h"
#include "nn/utils.h"
#include "tensor/ops.h"

namespace weft::nn::optim {

using kernels::cpu::kParallelGrain;
using kernels::cpu::parallelFor;

const Tensor& ParamState::at(const std::string& name) const {
  auto it = buffers.find(name);
  WEFT_ENFORCE(it != buffers.end(), NotFoundError, "ParamState: no buffer named '", name, "'");
  return it->second;
}

// ---- options ----------------------------------------------------------------------

namespace {

void checkNonNegative(const char* opt, const char* what, double v) {
  WEFT_ENFORCE(v >= 0.0, InvalidArgumentError, opt, ": invalid ", what, " ", v, " (must be >= 0)");
}

void checkBetas(const char* opt, std::pair<double, double> betas) {
  WEFT_ENFORCE(betas.first >= 0.0 && betas.first < 1.0, InvalidArgumentError, opt, ": invalid beta1 ", betas.first,
               " (must be in [0, 1))");
  WEFT_ENFORCE(betas.second >= 0.0 && betas.second < 1.0, InvalidArgumentError, opt, ": invalid beta2 ",
               betas.second, " (must be in [0, 1))");
}

void checkOptions(const SGDOptions& o) {
  WEFT_ENFORCE(!std::isnan(o.lr), InvalidArgumentError, "SGD: the learning rate is required (SGDOptions::lr)");
  checkNonNegative("SGD", "learning rate", o.lr);
  checkNonNegative("SGD", "momentum", o.momentum);
  checkNonNegative("SGD", "weight decay", o.weightDecay);
  WEFT_ENFORCE(!o.nesterov || (o.momentum > 0 && o.dampening == 0), InvalidArgumentError,
               "SGD: nesterov momentum requires momentum > 0 and zero dampening (momentum ", o.momentum,
               ", dampening ", o.dampening, ")");
}

template <class O>
void checkAdamLike(const char* opt, const O& o) {
  checkNonNegative(opt, "learning rate", o.lr);
  checkNonNegative(opt, "epsilon", o.eps);
  checkBetas(opt, o.betas);
  checkNonNegative(opt, "weight decay", o.weightDecay);
}

void checkOptions(const AdamOptions& o) { checkAdamLike("Adam", o); }
void checkOptions(const AdamWOptions& o) { checkAdamLike("AdamW", o); }

void checkOptions(const AdagradOptions& o) {
  checkNonNegative("Adagrad", "learning rate", o.lr);
  checkNonNegative("Adagrad", "lr decay", o.lrDecay);
  checkNonNegative("Adagrad", "weight decay", o.weightDecay);
  checkNonNegative("Adagrad", "initial accumulator value", o.initialAccumulatorValue);
  checkNonNegative("Adagrad", "epsilon", o.eps);
}

void checkOptions(const RMSpropOptions& o) {
  checkNonNegative("RMSprop", "learning rate", o.lr);
  checkNonNegative("RMSprop", "epsilon", o.eps);
  checkNonNegative("RMSprop", "momentum", o.momentum);
  checkNonNegative("RMSprop", "weight decay", o.weightDecay);
  checkNonNegative("RMSprop", "alpha", o.alpha);
}

// Buffers that must exist once a parameter has been updated (SGD's momentum
// buffer is re-created from the gradient when absent, as in PyTorch).
std::vector<std::string> requiredBufferNames(const OptimizerOptions& options) {
  if (std::holds_alternative<SGDOptions>(options)) return {};
  return stateBufferNames(options);
}

// Every buffer name an optimizer of this kind may hold, whatever its flags.
std::vector<std::string> knownBufferNames(const OptimizerOptions& options) {
  switch (options.index()) {
    case 0: return {"momentum_buffer"};
    case 1:
    case 2: return {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
    case 3: return {"sum"};
    default: return {"square_avg", "momentum_buffer", "grad_avg"};
  }
}

}  // namespace

const char* optimizerName(const OptimizerOptions& options) {
  static constexpr const char* kNames[] = {"SGD", "Adam", "AdamW", "Adagrad", "RMSprop"};
  return kNames[options.index()];
}

void validate(const OptimizerOptions& options) {
  std::visit([](const auto& o) { checkOptions(o); }, options);
}

double learningRate(const OptimizerOptions& options) {
  return std::visit([](const auto& o) { return o.lr; }, options);
}

OptimizerOptions withLearningRate(OptimizerOptions options, double lr) {
  std::visit([lr](auto& o) { o.lr = lr; }, options);
  validate(options);
  return options;
}

std::vector<std::string> stateBufferNames(const OptimizerOptions& options) {
  struct Names {
    std::vector<std::string> operator()(const SGDOptions& o) const {
      if (o.momentum != 0) return {"momentum_buffer"};
      return {};
    }
    std::vector<std::string> operator()(const AdamOptions& o) const { return adamLike(o.amsgrad); }
    std::vector<std::string> operator()(const AdamWOptions& o) const { return adamLike(o.amsgrad); }
    std::vector<std::string> operator()(const AdagradOptions&) const { return {"sum"}; }
    std::vector<std::string> operator()(const RMSpropOptions& o) const {
      std::vector<std::string> n{"square_avg"};
      if (o.momentum > 0) n.push_back("momentum_buffer");
      if (o.centered) n.push_back("grad_avg");
      return n;
    }
    static std::vector<std::string> adamLike(bool amsgrad) {
      std::vector<std::string> n{"exp_avg", "exp_avg_sq"};
      if (amsgrad) n.push_back("max_exp_avg_sq");
      return n;
    }
  };
  return std::visit(Names{}, options);
}

// ---- shared step machinery ----------------------------------------------------------

namespace {

void checkLists(const char* opt, const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                const std::vector<ParamState>& state) {
  WEFT_ENFORCE(grads.size() == params.size() && state.size() == params.size(), InvalidArgumentError, opt, ": ",
               params.size(), " parameters but ", grads.size(), " gradients and ", state.size(), " states");
}

void checkParamAndGrad(const char* opt, size_t i, const Tensor& p, const Tensor& g) {
  WEFT_ENFORCE(p.defined(), InvalidArgumentError, opt, ": parameter ", i, " is undefined");
  WEFT_ENFORCE(isFloating(p.dtype()), InvalidArgumentError, opt, ": parameter ", i, " has non-floating dtype ",
               dtypeName(p.dtype()));
  WEFT_ENFORCE(g.shape() == p.shape() && g.dtype() == p.dtype() && g.device() == p.device(), InvalidArgumentError,
               opt, ": gradient ", i, " (shape ", g.shape(), ", ", dtypeName(g.dtype()), ", ", g.device().str(),
               ") does not match its parameter (shape ", p.shape(), ", ", dtypeName(p.dtype()), ", ",
               p.device().str(), ")");
}

// The buffer `name` of a parameter's state, created filled with `init` when
// the parameter has not been updated yet. A buffer missing after updates
// (state loaded from elsewhere, or a flag such as amsgrad switched on midway)
// is an error rather than a silent restart.
Tensor stateBuffer(const char* opt, size_t i, ParamState& st, const std::string& name, const Tensor& p,
                   double init) {
  auto it = st.buffers.find(name);
  if (it == st.buffers.end()) {
    WEFT_ENFORCE(st.step == 0, InvalidArgumentError, opt, ": the state of parameter ", i, " has step ", st.step,
                 " but no '", name, "' buffer");
    Tensor b = full(p.shape(), init, {.dtype = p.dtype(), .device = p.device()});
    it = st.buffers.emplace(name, b).first;
  }
  const Tensor& b = it->second;
  WEFT_ENFORCE(b.defined() && b.shape() == p.shape() && b.dtype() == p.dtype() && b.device() == p.device(),
               InvalidArgumentError, opt, ": the '", name, "' buffer of parameter ", i,
               " does not match the parameter's shape ", p.shape(), ", dtype and device");
  return b;
}

// True when every defined tensor is contiguous, on the first one's device,
// of its float32/float64 dtype and element count, and no two overlap in
// memory: what the fused loops and kernels need (they are compiled assuming
// independent elements).
bool alikeAndDisjoint(std::initializer_list<Tensor> ts) {
  const Tensor& first = *ts.begin();
  if (first.dtype() != DType::Float32 && first.dtype() != DType::Float64) return false;
  for (auto a = ts.begin(); a != ts.end(); ++a) {
    if (!a->defined()) continue;
    if (a->device() != first.device() || !a->isContiguous() || a->dtype() != first.dtype() ||
        a->numel() != first.numel()) {
      return false;
    }
    const char* aBegin = static_cast<const char*>(a->rawData());
    for (auto b = ts.begin(); b != a; ++b) {
      if (!b->defined()) continue;
      const char* bBegin = static_cast<const char*>(b->rawData());
      if (aBegin < bBegin + b->nbytes() && bBegin < aBegin + a->nbytes()) return false;
    }
  }
  return true;
}

// True when the tensors can be updated by a fused CPU loop.
bool fusable(std::initializer_list<Tensor> ts) { return ts.begin()->device().isCpu() && alikeAndDisjoint(ts); }

// Parameters of one step queued for the fused CUDA kernels: contiguous,
// non-overlapping float32/float64 tensors on one device, each parameter with
// its gradient, up to three state buffers and two constants
// (kernels/cuda/optim.h's OptimTensor). Parameters on another device or of
// another dtype than those queued launch the queue first. flush() launches
// what is queued and records the writes in the version counters; a step
// flushes before it returns or rethrows, so the parameters it has accepted
// are updated exactly as the CPU loop would have updated them.
class CudaQueue {
 public:
  using Launch = std::function<void(int device, DType dtype, std::span<const kernels::cuda::OptimTensor>)>;
  explicit CudaQueue(Launch launch) : launch_(std::move(launch)) {}

  // True when every defined tensor is a contiguous CUDA tensor on the first
  // one's device, of its float32/float64 dtype and element count, and no two
  // overlap.
  static bool accepts(std::initializer_list<Tensor> ts) {
    return ts.begin()->device().isCuda() && alikeAndDisjoint(ts);
  }

  void add(const Tensor& p, const Tensor& g, std::initializer_list<Tensor> buffers, double s0, double s1) {
    if (!entries_.empty() && (p.device().index != device_ || p.dtype() != dtype_)) flush();
    device_ = p.device().index;
    dtype_ = p.dtype();
    kernels::cuda::OptimTensor t;
    t.param = p.rawData();
    t.grad = g.rawData();
    int slot = 0;
    for (const Tensor& b : buffers) {
      t.state[slot++] = b.defined() ? b.rawData() : nullptr;
      if (b.defined()) written_.push_back(b);
    }
    t.numel = p.numel();
    t.scalar[0] = s0;
    t.scalar[1] = s1;
    entries_.push_back(t);
    written_.push_back(p);
    read_.push_back(g);
  }

  void flush() {
    if (entries_.empty()) return;
    std::vector<kernels::cuda::OptimTensor> entries = std::move(entries_);
    std::vector<Tensor> written = std::move(written_);
    entries_.clear();
    written_.clear();
    read_.clear();
    launch_(device_, dtype_, entries);
    for (const Tensor& t : written) t.storage()->bumpVersion();
  }

  // Runs body(queue) and flushes, also when body throws.
  template <class Body>
  void run(Body&& body) {
    try {
      body();
    } catch (...) {
      flush();
      throw;
    }
    flush();
  }

 private:
  Launch launch_;
  int device_ = -1;
  DType dtype_ = DType::Float32;
  std::vector<kernels::cuda::OptimTensor> entries_;
  std::vector<Tensor> written_;  // parameters and buffers of the queued entries
  std::vector<Tensor> read_;     // their gradients, alive until the launch
};

// Records the raw writes of a fused loop in the tensors' version counters.
void bumpVersions(std::initializer_list<Tensor> ts) {
  for (const Tensor& t : ts) {
    if (t.defined()) t.storage()->bumpVersion();
  }
}

template <class T>
T* ptr(const Tensor& t) {
  return t.defined() ? t.data<T>() : nullptr;
}

// Calls fn(std::bool_constant<flags>...) so that a fused loop is compiled
// once per combination of its options: branch-free inside, vectorisable.
template <class F>
void withFlags(F&& fn) {
  fn();
}
template <class F, class... Rest>
void withFlags(F&& fn, bool flag, Rest... rest) {
  if (flag) {
    withFlags([&](auto... more) { fn(std::true_type{}, more...); }, rest...);
  } else {
    withFlags([&](auto... more) { fn(std::false_type{}, more...); }, rest...);
  }
}

// Runs range(begin, end) over [0, n) in parallel. Each fused rule's range
// function takes its pointers and constants by value, so that the compiler
// knows the loop's stores cannot change them and keeps them in registers.
template <class Range>
void fusedLoop(int64_t n, const Range& range) {
  parallelFor(n, kParallelGrain, [&](int64_t b, int64_t e) { range(b, e); });
}

// The gradient as the update sees it: negated when maximizing, plus the L2
// penalty weightDecay·p when asked (tensor-op path).
Tensor effectiveGrad(const Tensor& p, const Tensor& g, bool maximize, double weightDecay) {
  Tensor d = maximize ? neg(g) : g;
  if (weightDecay != 0) d = add(d, p, weightDecay);
  return d;
}

}  // namespace

// ---- SGD ------------------------------------------------------------------------------

namespace {

template <class T>
struct SGDConstants {
  T weightDecay, momentum, keep, negLr;
};

template <class T, bool kMaximize, bool kDecay, bool kMomentum, bool kNesterov, bool kFreshBuffer>
void sgdRange(int64_t b, int64_t e, T* p, const T* g, T* buf, SGDConstants<T> c) {
#pragma GCC ivdep
  for (int64_t i = b; i < e; ++i) {
    T d = kMaximize ? -g[i] : g[i];
    if constexpr (kDecay) d = d + c.weightDecay * p[i];
    if constexpr (kMomentum) {
      T bi = kFreshBuffer ? d : buf[i] * c.momentum + c.keep * d;
      buf[i] = bi;
      d = kNesterov ? d + c.momentum * bi : bi;
    }
    p[i] = p[i] + c.negLr * d;
  }
}

}  // namespace

void sgd(const std::vector<Tensor>& params, const std::vector<Tensor>& grads, std::vector<ParamState>& state,
         const SGDOptions& o) {
  checkOptions(o);
  checkLists("SGD", params, grads, state);
  NoGradGuard ng;
  CudaQueue cuda([&o](int device, DType dtype, std::span<const kernels::cuda::OptimTensor> ts) {
    const kernels::cuda::SgdStepOptions k{o.lr, o.momentum, o.dampening, o.weightDecay, o.nesterov, o.maximize};
    WEFT_CUDA_CALL(device, sgdStep(dtype, ts, k));
  });
  cuda.run([&] {
    for (size_t i = 0; i < params.size(); ++i) {
      if (!grads[i].defined()) continue;
      Tensor p = params[i];
      const Tensor& g = grads[i];
      checkParamAndGrad("SGD", i, p, g);
      ParamState& st = state[i];
      Tensor buf;
      bool fresh = false;
      if (o.momentum != 0) {
        auto it = st.buffers.find("momentum_buffer");
        fresh = it == st.buffers.end();
        buf = fresh ? emptyLike(p) : it->second;
        WEFT_ENFORCE(buf.defined() && buf.shape() == p.shape() && buf.dtype() == p.dtype() &&
                         buf.device() == p.device(),
                     InvalidArgumentError, "SGD: the 'momentum_buffer' buffer of parameter ", i,
                     " does not match the parameter");
      }
      st.step += 1;
      if (fusable({p, g, buf})) {
        WEFT_DISPATCH_FLOATING(p.dtype(), "SGD", [&]<class T>() {
          withFlags(
              [&](auto maximize, auto decay, auto momentum, auto nesterov, auto freshBuffer) {
                SGDConstants<T> c{static_cast<T>(o.weightDecay), static_cast<T>(o.momentum),
                                  static_cast<T>(1.0 - o.dampening), static_cast<T>(-o.lr)};
                T *pp = p.data<T>(), *bp = ptr<T>(buf);
                const T* gp = g.data<T>();
                fusedLoop(p.numel(), [&](int64_t b, int64_t e) {
                  sgdRange<T, maximize, decay, momentum, nesterov, freshBuffer>(b, e, pp, gp, bp, c);
                });
              },
              o.maximize, o.weightDecay != 0, buf.defined(), o.nesterov, fresh);
        });
        bumpVersions({p, buf});
      } else if (CudaQueue::accepts({p, g, buf})) {
        cuda.add(p, g, {buf}, fresh ? 1.0 : 0.0, 0.0);
      } else {
        Tensor d = effectiveGrad(p, g, o.maximize, o.weightDecay);
        if (buf.defined()) {
          if (fresh) {
            buf.copy_(d);
          } else {
            buf.mul_(o.momentum).add_(d, 1.0 - o.dampening);
          }
          d = o.nesterov ? add(d, buf, o.momentum) : buf;
        }
        p.add_(d, -o.lr);
      }
      if (fresh) st.buffers["momentum_buffer"] = buf;
    }
  });
}

// ---- Adam and AdamW ------------------------------------------------------------------

namespace {

struct AdamRule {
  const char* name;
  double lr;
  std::pair<double, double> betas;
  double eps;
  double weightDecay;
  bool amsgrad;
  bool maximize;
  bool decoupled;  // AdamW: decay the parameter, not the gradient
};

template <class T>
struct AdamConstants {
  T beta1, beta2, oneMinusBeta1, oneMinusBeta2, weightDecay, decay, eps, bc2Sqrt, negStepSize;
};

template <class T, bool kMaximize, bool kDecoupled, bool kDecay, bool kAmsgrad>
void adamRange(int64_t b, int64_t e, T* p, const T* g, T* m, T* v, T* vmax, AdamConstants<T> c) {
#pragma GCC ivdep
  for (int64_t i = b; i < e; ++i) {
    T d = kMaximize ? -g[i] : g[i];
    T pi = p[i];
    if constexpr (kDecoupled) {
      pi = pi * c.decay;
    } else if constexpr (kDecay) {
      d = d + c.weightDecay * pi;
    }
    T mi = m[i] * c.beta1 + c.oneMinusBeta1 * d;
    T vi = v[i] * c.beta2 + (c.oneMinusBeta2 * d) * d;
    m[i] = mi;
    v[i] = vi;
    if constexpr (kAmsgrad) {
      vi = std::max(vmax[i], vi);
      vmax[i] = vi;
    }
    T denom = std::sqrt(vi) / c.bc2Sqrt + c.eps;
    p[i] = pi + (c.negStepSize * mi) / denom;
  }
}

void adamSteps(const AdamRule& r, const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
               std::vector<ParamState>& state) {
  checkLists(r.name, params, grads, state);
  NoGradGuard ng;
  CudaQueue cuda([&r](int device, DType dtype, std::span<const kernels::cuda::OptimTensor> ts) {
    const kernels::cuda::AdamStepOptions k{r.lr,          r.betas.first, r.betas.second, r.eps,
                                           r.weightDecay, r.amsgrad,     r.maximize,     r.decoupled};
    WEFT_CUDA_CALL(device, adamStep(dtype, ts, k));
  });
  cuda.run([&] {
    for (size_t i = 0; i < params.size(); ++i) {
      if (!grads[i].defined()) continue;
      Tensor p = params[i];
      const Tensor& g = grads[i];
      checkParamAndGrad(r.name, i, p, g);
      ParamState& st = state[i];
      Tensor m = stateBuffer(r.name, i, st, "exp_avg", p, 0.0);
      Tensor v = stateBuffer(r.name, i, st, "exp_avg_sq", p, 0.0);
      Tensor vmax = r.amsgrad ? stateBuffer(r.name, i, st, "max_exp_avg_sq", p, 0.0) : Tensor();
      st.step += 1;
      double stepD = static_cast<double>(st.step);
      double bc1 = 1.0 - std::pow(r.betas.first, stepD);
      double bc2 = 1.0 - std::pow(r.betas.second, stepD);
      double stepSize = r.lr / bc1;
      double bc2Sqrt = std::sqrt(bc2);
      if (fusable({p, g, m, v, vmax})) {
        WEFT_DISPATCH_FLOATING(p.dtype(), r.name, [&]<class T>() {
          withFlags(
              [&](auto maximize, auto decoupled, auto decay, auto amsgrad) {
                AdamConstants<T> c{static_cast<T>(r.betas.first),         static_cast<T>(r.betas.second),
                                   static_cast<T>(1.0 - r.betas.first),   static_cast<T>(1.0 - r.betas.second),
                                   static_cast<T>(r.weightDecay),         static_cast<T>(1.0 - r.lr * r.weightDecay),
                                   static_cast<T>(r.eps),                 static_cast<T>(bc2Sqrt),
                                   static_cast<T>(-stepSize)};
                T *pp = p.data<T>(), *mp = m.data<T>(), *vp = v.data<T>(), *xp = ptr<T>(vmax);
                const T* gp = g.data<T>();
                fusedLoop(p.numel(), [&](int64_t b, int64_t e) {
                  adamRange<T, maximize, decoupled, decay, amsgrad>(b, e, pp, gp, mp, vp, xp, c);
                });
              },
              r.maximize, r.decoupled, r.weightDecay != 0, r.amsgrad);
        });
        bumpVersions({p, m, v, vmax});
        continue;
      }
      if (CudaQueue::accepts({p, g, m, v, vmax})) {
        cuda.add(p, g, {m, v, vmax}, -stepSize, bc2Sqrt);
        continue;
      }
      Tensor d = r.maximize ? neg(g) : g;
      if (r.decoupled) {
        p.mul_(1.0 - r.lr * r.weightDecay);
      } else if (r.weightDecay != 0) {
        d = add(d, p, r.weightDecay);
      }
      m.mul_(r.betas.first).add_(d, 1.0 - r.betas.first);
      v.mul_(r.betas.second).addcmul_(d, d, 1.0 - r.betas.second);
      Tensor denom;
      if (r.amsgrad) {
        vmax.copy_(maximum(vmax, v));
        denom = add(sqrt(vmax) / bc2Sqrt, r.eps);
      } else {
        denom = add(sqrt(v) / bc2Sqrt, r.eps);
      }
      p.addcdiv_(m, denom, -stepSize);
    }
  });
}

}  // namespace

void adam(const std::vector<Tensor>& params, const std::vector<Tensor>& grads, std::vector<ParamState>& state,
          const AdamOptions& o) {
  checkOptions(o);
  adamSteps({"Adam", o.lr, o.betas, o.eps, o.weightDecay, o.amsgrad, o.maximize, false}, params, grads, state);
}

void adamw(const std::vector<Tensor>& params, const std::vector<Tensor>& grads, std::vector<ParamState>& state,
           const AdamWOptions& o) {
  checkOptions(o);
  adamSteps({"AdamW", o.lr, o.betas, o.eps, o.weightDecay, o.amsgrad, o.maximize, true}, params, grads, state);
}

// ---- Adagrad ----------------------------------------------------------------------------

namespace {

template <class T>
struct AdagradConstants {
  T weightDecay, eps, negClr;
};

template <class T, bool kMaximize, bool kDecay>
void adagradRange(int64_t b, int64_t e, T* p, const T* g, T* sum, AdagradConstants<T> c) {
#pragma GCC ivdep
  for (int64_t i = b; i < e; ++i) {
    T d = kMaximize ? -g[i] : g[i];
    if constexpr (kDecay) d = d + c.weightDecay * p[i];
    T s = sum[i] + d * d;
    sum[i] = s;
    p[i] = p[i] + (c.negClr * d) / (std::sqrt(s) + c.eps);
  }
}

}  // namespace

void adagrad(const std::vector<Tensor>& params, const std::vector<Tensor>& grads, std::vector<ParamState>& state,
             const AdagradOptions& o) {
  checkOptions(o);
  checkLists("Adagrad", params, grads, state);
  NoGradGuard ng;
  CudaQueue cuda([&o](int device, DType dtype, std::span<const kernels::cuda::OptimTensor> ts) {
    const kernels::cuda::AdagradStepOptions k{o.weightDecay, o.eps, o.maximize};
    WEFT_CUDA_CALL(device, adagradStep(dtype, ts, k));
  });
  cuda.run([&] {
    for (size_t i = 0; i < params.size(); ++i) {
      if (!grads[i].defined()) continue;
      Tensor p = params[i];
      const Tensor& g = grads[i];
      checkParamAndGrad("Adagrad", i, p, g);
      ParamState& st = state[i];
      Tensor sum = stateBuffer("Adagrad", i, st, "sum", p, o.initialAccumulatorValue);
      st.step += 1;
      double clr = o.lr / (1.0 + static_cast<double>(st.step - 1) * o.lrDecay);
      if (fusable({p, g, sum})) {
        WEFT_DISPATCH_FLOATING(p.dtype(), "Adagrad", [&]<class T>() {
          withFlags(
              [&](auto maximize, auto decay) {
                AdagradConstants<T> c{static_cast<T>(o.weightDecay), static_cast<T>(o.eps), static_cast<T>(-clr)};
                T *pp = p.data<T>(), *sp = sum.data<T>();
                const T* gp = g.data<T>();
                fusedLoop(p.numel(),
                          [&](int64_t b, int64_t e) { adagradRange<T, maximize, decay>(b, e, pp, gp, sp, c); });
              },
              o.maximize, o.weightDecay != 0);
        });
        bumpVersions({p, sum});
        continue;
      }
      if (CudaQueue::accepts({p, g, sum})) {
        cuda.add(p, g, {sum}, -clr, 0.0);
        continue;
      }
      Tensor d = effectiveGrad(p, g, o.maximize, o.weightDecay);
      sum.addcmul_(d, d, 1.0);
      p.addcdiv_(d, add(sqrt(sum), o.eps), -clr);
    }
  });
}

// ---- RMSprop ----------------------------------------------------------------------------

namespace {

template <class T>
struct RMSpropConstants {
  T weightDecay, alpha, oneMinusAlpha, eps, momentum, negLr;
};

template <class T, bool kMaximize, bool kDecay, bool kCentered, bool kMomentum>
void rmspropRange(int64_t b, int64_t e, T* p, const T* g, T* sq, T* buf, T* gavg, RMSpropConstants<T> c) {
#pragma GCC ivdep
  for (int64_t i = b; i < e; ++i) {
    T d = kMaximize ? -g[i] : g[i];
    if constexpr (kDecay) d = d + c.weightDecay * p[i];
    T s = sq[i] * c.alpha + (c.oneMinusAlpha * d) * d;
    sq[i] = s;
    T avg;
    if constexpr (kCentered) {
      T ga = gavg[i] * c.alpha + c.oneMinusAlpha * d;
      gavg[i] = ga;
      avg = std::sqrt(s + (-ga) * ga);
    } else {
      avg = std::sqrt(s);
    }
    avg = avg + c.eps;
    if constexpr (kMomentum) {
      T bi = buf[i] * c.momentum + d / avg;
      buf[i] = bi;
      p[i] = p[i] + c.negLr * bi;
    } else {
      p[i] = p[i] + (c.negLr * d) / avg;
    }
  }
}

}  // namespace

void rmsprop(const std::vector<Tensor>& params, const std::vector<Tensor>& grads, std::vector<ParamState>& state,
             const RMSpropOptions& o) {
  checkOptions(o);
  checkLists("RMSprop", params, grads, state);
  NoGradGuard ng;
  CudaQueue cuda([&o](int device, DType dtype, std::span<const kernels::cuda::OptimTensor> ts) {
    const kernels::cuda::RmspropStepOptions k{o.lr, o.alpha, o.eps, o.weightDecay, o.momentum, o.centered, o.maximize};
    WEFT_CUDA_CALL(device, rmspropStep(dtype, ts, k));
  });
  cuda.run([&] {
    for (size_t i = 0; i < params.size(); ++i) {
      if (!grads[i].defined()) continue;
      Tensor p = params[i];
      const Tensor& g = grads[i];
      checkParamAndGrad("RMSprop", i, p, g);
      ParamState& st = state[i];
      Tensor sq = stateBuffer("RMSprop", i, st, "square_avg", p, 0.0);
      Tensor buf = o.momentum > 0 ? stateBuffer("RMSprop", i, st, "momentum_buffer", p, 0.0) : Tensor();
      Tensor gavg = o.centered ? stateBuffer("RMSprop", i, st, "grad_avg", p, 0.0) : Tensor();
      st.step += 1;
      if (fusable({p, g, sq, buf, gavg})) {
        WEFT_DISPATCH_FLOATING(p.dtype(), "RMSprop", [&]<class T>() {
          withFlags(
              [&](auto maximize, auto decay, auto centered, auto momentum) {
                RMSpropConstants<T> c{static_cast<T>(o.weightDecay), static_cast<T>(o.alpha),
                                      static_cast<T>(1.0 - o.alpha),  static_cast<T>(o.eps),
                                      static_cast<T>(o.momentum),     static_cast<T>(-o.lr)};
                T *pp = p.data<T>(), *sp = sq.data<T>(), *bp = ptr<T>(buf), *ap = ptr<T>(gavg);
                const T* gp = g.data<T>();
                fusedLoop(p.numel(), [&](int64_t b, int64_t e) {
                  rmspropRange<T, maximize, decay, centered, momentum>(b, e, pp, gp, sp, bp, ap, c);
                });
              },
              o.maximize, o.weightDecay != 0, gavg.defined(), buf.defined());
        });
        bumpVersions({p, sq, buf, gavg});
        continue;
      }
      if (CudaQueue::accepts({p, g, sq, buf, gavg})) {
        cuda.add(p, g, {sq, buf, gavg}, 0.0, 0.0);
        continue;
      }
      Tensor d = effectiveGrad(p, g, o.maximize, o.weightDecay);
      sq.mul_(o.alpha).addcmul_(d, d, 1.0 - o.alpha);
      Tensor avg;
      if (gavg.defined()) {
        gavg.mul_(o.alpha).add_(d, 1.0 - o.alpha);
        avg = sqrt(sub(sq, mul(gavg, gavg)));
      } else {
        avg = sqrt(sq);
      }
      avg = add(avg, o.eps);
      if (buf.defined()) {
        buf.mul_(o.momentum).addcdiv_(d, avg, 1.0);
        p.add_(buf, -o.lr);
      } else {
        p.addcdiv_(d, avg, -o.lr);
      }
    }
  });
}

void step(const OptimizerOptions& options, const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
          std::vector<ParamState>& state) {
  struct Step {
    const std::vector<Tensor>& params;
    const std::vector<Tensor>& grads;
    std::vector<ParamState>& state;
    void operator()(const SGDOptions& o) const { sgd(params, grads, state, o); }
    void operator()(const AdamOptions& o) const { adam(params, grads, state, o); }
    void operator()(const AdamWOptions& o) const { adamw(params, grads, state, o); }
    void operator()(const AdagradOptions& o) const { adagrad(params, grads, state, o); }
    void operator()(const RMSpropOptions& o) const { rmsprop(params, grads, state, o); }
  };
  std::visit(Step{params, grads, state}, options);
}

// ---- parameter groups ----------------------------------------------------------------------

OptimizerOptions withWeightDecay(OptimizerOptions options, double weightDecay) {
  std::visit([weightDecay](auto& o) { o.weightDecay = weightDecay; }, options);
  validate(options);
  return options;
}

std::vector<ParamGroup> decayGroups(const std::vector<std::pair<std::string, Tensor>>& named,
                                    const OptimizerOptions& base) {
  std::vector<ParamGroup> groups{{{}, base}, {{}, withWeightDecay(base, 0.0)}};
  for (const auto& [name, p] : named) {
    WEFT_ENFORCE(p.defined(), InvalidArgumentError, "decayGroups: parameter '", name, "' is undefined");
    if (!p.requiresGrad()) continue;
    groups[p.dim() >= 2 ? 0 : 1].params.push_back(p);
  }
  return groups;
}

// ---- Optimizer ---------------------------------------------------------------------------

Optimizer::Optimizer(std::vector<Tensor> params, OptimizerOptions options)
    : Optimizer(std::vector<ParamGroup>{ParamGroup{std::move(params), std::move(options)}}) {}

Optimizer::Optimizer(std::vector<ParamGroup> groups) : groups_(std::move(groups)) {
  WEFT_ENFORCE(!groups_.empty(), InvalidArgumentError, "Optimizer: got no parameter group");
  const char* opt = optimizerName(groups_.front().options);
  for (size_t g = 0; g < groups_.size(); ++g) {
    WEFT_ENFORCE(groups_[g].options.index() == groups_.front().options.index(), InvalidArgumentError, opt,
                 ": group ", g, " has ", optimizerName(groups_[g].options), " options");
    validate(groups_[g].options);
    for (const Tensor& p : groups_[g].params) params_.push_back(p);
  }
  WEFT_ENFORCE(!params_.empty(), InvalidArgumentError, opt, ": got an empty parameter list");
  for (size_t i = 0; i < params_.size(); ++i) {
    WEFT_ENFORCE(params_[i].defined(), InvalidArgumentError, opt, ": parameter ", i, " is undefined");
    WEFT_ENFORCE(isFloating(params_[i].dtype()), InvalidArgumentError, opt, ": parameter ", i,
                 " has non-floating dtype ", dtypeName(params_[i].dtype()));
    for (size_t j = 0; j < i; ++j) {
      WEFT_ENFORCE(!params_[j].sameAs(params_[i]), InvalidArgumentError, opt, ": parameter ", i,
                   " is the same tensor as parameter ", j);
    }
  }
  state_.resize(params_.size());
}

void Optimizer::step() {
  std::vector<Tensor> grads;
  grads.reserve(params_.size());
  for (const Tensor& p : params_) grads.push_back(p.grad());
  step(grads);
}

void Optimizer::step(const std::vector<Tensor>& grads) {
  WEFT_ENFORCE(grads.size() == params_.size(), InvalidArgumentError, name(), ": ", params_.size(),
               " parameters but ", grads.size(), " gradients");
  size_t offset = 0;
  for (const ParamGroup& group : groups_) {
    const size_t n = group.params.size();
    const auto begin = static_cast<std::ptrdiff_t>(offset);
    const auto end = static_cast<std::ptrdiff_t>(offset + n);
    std::vector<Tensor> groupGrads(grads.begin() + begin, grads.begin() + end);
    // The group's slice of the state, moved out and back (handles only).
    std::vector<ParamState> groupState(std::make_move_iterator(state_.begin() + begin),
                                       std::make_move_iterator(state_.begin() + end));
    struct MoveBack {
      std::vector<ParamState>& from;
      std::vector<ParamState>& to;
      std::ptrdiff_t at;
      ~MoveBack() { std::move(from.begin(), from.end(), to.begin() + at); }
    } moveBack{groupState, state_, begin};
    optim::step(group.options, group.params, groupGrads, groupState);
    offset += n;
  }
}

void Optimizer::zeroGrad(bool setToNone) { zeroGrads(params_, setToNone); }

size_t Optimizer::checkGroup(const char* what, size_t group) const {
  WEFT_ENFORCE(group < groups_.size(), InvalidArgumentError, name(), ".", what, ": group ", group,
               " out of range (the optimizer has ", groups_.size(), ")");
  return group;
}

void Optimizer::setOptions(OptimizerOptions options) {
  for (size_t g = 0; g < groups_.size(); ++g) {
    WEFT_ENFORCE(options.index() == groups_[g].options.index(), InvalidArgumentError, "setOptions: ", name(),
                 " cannot take ", optimizerName(options), " options");
  }
  validate(options);
  for (ParamGroup& group : groups_) group.options = options;
}

void Optimizer::setOptions(size_t group, OptimizerOptions options) {
  ParamGroup& g = groups_[checkGroup("setOptions", group)];
  WEFT_ENFORCE(options.index() == g.options.index(), InvalidArgumentError, "setOptions: ", name(), " cannot take ",
               optimizerName(options), " options");
  validate(options);
  g.options = std::move(options);
}

double Optimizer::lr(size_t group) const { return learningRate(groups_[checkGroup("lr", group)].options); }

void Optimizer::setLr(double lr) {
  std::vector<OptimizerOptions> updated;
  for (const ParamGroup& group : groups_) updated.push_back(withLearningRate(group.options, lr));
  for (size_t g = 0; g < groups_.size(); ++g) groups_[g].options = std::move(updated[g]);
}

void Optimizer::setLr(size_t group, double lr) {
  ParamGroup& g = groups_[checkGroup("setLr", group)];
  g.options = withLearningRate(g.options, lr);
}

StateDict Optimizer::stateDict() const {
  StateDict out;
  for (size_t i = 0; i < state_.size(); ++i) {
    const ParamState& st = state_[i];
    if (st.step == 0 && st.buffers.empty()) continue;
    std::string prefix = weft::detail::concat("state.", i, ".");
    out.emplace(prefix + "step", scalarTensor(static_cast<double>(st.step), DType::Int64));
    for (const auto& [name, buf] : st.buffers) out.emplace(prefix + name, buf.detach());
  }
  for (size_t g = 0; g < groups_.size(); ++g) {
    std::string prefix = weft::detail::concat("param_groups.", g, ".");
    out.emplace(prefix + "params", scalarTensor(static_cast<double>(groups_[g].params.size()), DType::Int64));
    out.emplace(prefix + "lr", scalarTensor(learningRate(groups_[g].options), DType::Float64));
  }
  return out;
}

namespace {

// "<prefix><index>.<name>": the index and the name; nothing when malformed.
std::optional<std::pair<size_t, std::string>> parseIndexedKey(const std::string& key, const std::string& prefix) {
  if (key.rfind(prefix, 0) != 0) return std::nullopt;
  const size_t from = prefix.size();
  const size_t dot = key.find('.', from);
  if (dot == std::string::npos || dot == from) return std::nullopt;
  size_t index = 0;
  auto [end, ec] = std::from_chars(key.data() + from, key.data() + dot, index);
  if (ec != std::errc() || end != key.data() + dot) return std::nullopt;
  return std::make_pair(index, key.substr(dot + 1));
}

}  // namespace

void Optimizer::loadStateDict(const StateDict& dict) {
  const char* opt = optimizerName(options());
  std::vector<std::string> known = knownBufferNames(options());
  std::vector<ParamState> loaded(params_.size());
  std::vector<bool> hasStep(params_.size(), false);
  std::vector<std::optional<double>> groupSizes(groups_.size());
  std::vector<std::optional<double>> groupLrs(groups_.size());
  bool anyGroup = false;
  for (const auto& [key, value] : dict) {
    if (auto g = parseIndexedKey(key, "param_groups.")) {
      const auto& [group, field] = *g;
      WEFT_ENFORCE(group < groups_.size(), InvalidArgumentError, opt, ".loadStateDict: key '", key,
                   "' refers to group ", group, " but the optimizer has ", groups_.size());
      WEFT_ENFORCE(field == "params" || field == "lr", InvalidArgumentError, opt,
                   ".loadStateDict: unexpected group entry '", key, "'");
      WEFT_ENFORCE(value.defined() && value.numel() == 1, InvalidArgumentError, opt, ".loadStateDict: '", key,
                   "' must hold one value");
      (field == "params" ? groupSizes : groupLrs)[group] = value.to(Device::cpu()).item<double>();
      anyGroup = true;
      continue;
    }
    auto parsed = parseIndexedKey(key, "state.");
    WEFT_ENFORCE(parsed.has_value(), InvalidArgumentError, opt, ".loadStateDict: malformed key '", key,
                 "' (expected state.<index>.<name> or param_groups.<index>.<name>)");
    const size_t index = parsed->first;
    WEFT_ENFORCE(index < params_.size(), InvalidArgumentError, opt, ".loadStateDict: key '", key,
                 "' refers to parameter ", index, " but the optimizer has ", params_.size());
    WEFT_ENFORCE(value.defined(), InvalidArgumentError, opt, ".loadStateDict: '", key, "' is undefined");
    const std::string& name = parsed->second;
    const Tensor& p = params_[index];
    if (name == "step") {
      WEFT_ENFORCE(value.numel() == 1, InvalidArgumentError, opt, ".loadStateDict: '", key,
                   "' must hold one value, got shape ", value.shape());
      double s = value.to(Device::cpu()).item<double>();
      WEFT_ENFORCE(s >= 0 && s == std::floor(s) && s < 9.0e15, InvalidArgumentError, opt, ".loadStateDict: '", key,
                   "' is not a valid step count: ", s);
      loaded[index].step = static_cast<int64_t>(s);
      hasStep[index] = true;
      continue;
    }
    WEFT_ENFORCE(std::find(known.begin(), known.end(), name) != known.end(), InvalidArgumentError, opt,
                 ".loadStateDict: unexpected state buffer '", key, "'");
    WEFT_ENFORCE(value.shape() == p.shape(), InvalidArgumentError, opt, ".loadStateDict: '", key, "' has shape ",
                 value.shape(), " but parameter ", index, " has shape ", p.shape());
    loaded[index].buffers.emplace(name, value);
  }
  std::vector<std::string> required = requiredBufferNames(options());
  for (size_t i = 0; i < loaded.size(); ++i) {
    WEFT_ENFORCE(hasStep[i] || loaded[i].buffers.empty(), InvalidArgumentError, opt,
                 ".loadStateDict: parameter ", i, " has buffers but no 'state.", i, ".step'");
    if (loaded[i].step == 0) continue;
    for (const auto& name : required) {
      WEFT_ENFORCE(loaded[i].buffers.count(name), InvalidArgumentError, opt, ".loadStateDict: parameter ", i,
                   " has step ", loaded[i].step, " but no 'state.", i, ".", name, "'");
    }
  }
  std::vector<OptimizerOptions> groupOptions;
  for (const ParamGroup& group : groups_) groupOptions.push_back(group.options);
  if (anyGroup) {
    for (size_t g = 0; g < groups_.size(); ++g) {
      WEFT_ENFORCE(groupSizes[g].has_value() && groupLrs[g].has_value(), InvalidArgumentError, opt,
                   ".loadStateDict: no 'param_groups.", g, ".params' and 'param_groups.", g,
                   ".lr' (the dict has groups but not as many as the optimizer's ", groups_.size(), ")");
      WEFT_ENFORCE(*groupSizes[g] == static_cast<double>(groups_[g].params.size()), InvalidArgumentError, opt,
                   ".loadStateDict: group ", g, " held ", *groupSizes[g], " parameters, this optimizer's has ",
                   groups_[g].params.size());
      groupOptions[g] = withLearningRate(groupOptions[g], *groupLrs[g]);
    }
  }
  // Copies, so the optimizer never shares buffers with the dict's owner.
  for (size_t i = 0; i < loaded.size(); ++i) {
    const Tensor& p = params_[i];
    for (auto& [name, buf] : loaded[i].buffers) {
      Tensor b = buf.dtype() == p.dtype() ? buf : buf.to(p.dtype());
      buf = b.device() == p.device() ? b.clone() : b.contiguous().to(p.device());
    }
  }
  state_ = std::move(loaded);
  for (size_t g = 0; g < groups_.size(); ++g) groups_[g].options = std::move(groupOptions[g]);
}

}  // namespace weft::nn::optim
