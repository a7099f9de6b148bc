#include "nn/data_parallel.h"

#include <chrono>
#include <exception>
#include <sstream>
#include <string>
#include <thread>

#include "kernels/cpu/parallel.h"
#include "kernels/device.h"
#include "tensor/autocast.h"
#include "tensor/autograd.h"
#include "tensor/ops.h"

namespace weft::nn {
namespace {

using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// Points `t` at the data of `data` (storage, layout, dtype) and clears its
// history, keeping the same TensorImpl so the module's member handles follow.
void rebind(const Tensor& t, const Tensor& data) {
  TensorImpl* im = t.impl();
  im->storage = data.storage();
  im->offset = data.storageOffset();
  im->shape = data.shape();
  im->strides = data.strides();
  im->dtype = data.dtype();
  im->requiresGrad = false;
  im->grad.reset();
  im->gradFn.reset();
  im->outputNr = 0;
  im->accumulator.reset();
}

// The first difference between two name -> shape lists, or "".
std::string firstDifference(const char* what, const std::vector<std::pair<std::string, Tensor>>& module,
                            const std::vector<std::pair<std::string, Tensor>>& replica) {
  std::ostringstream os;
  for (size_t i = 0; i < module.size() || i < replica.size(); ++i) {
    if (i >= replica.size()) {
      os << "the replica lacks " << what << " '" << module[i].first << "'";
    } else if (i >= module.size()) {
      os << "the replica has an extra " << what << " '" << replica[i].first << "'";
    } else if (module[i].first != replica[i].first) {
      os << what << " " << i << " is '" << module[i].first << "' in the module but '" << replica[i].first
         << "' in the replica";
    } else if (module[i].second.shape() != replica[i].second.shape()) {
      os << what << " '" << module[i].first << "' has shape ";
      weft::detail::appendPart(os, module[i].second.shape());
      os << " in the module but ";
      weft::detail::appendPart(os, replica[i].second.shape());
      os << " in the replica";
    } else {
      continue;
    }
    return os.str();
  }
  return "";
}

}  // namespace

DataParallel::DataParallel(std::shared_ptr<Module> module, ReplicaFactory factory, int replicas)
    : Module("DataParallel"), module_(std::move(module)) {
  WEFT_ENFORCE(module_ != nullptr, InvalidArgumentError, "DataParallel: the module is null");
  WEFT_ENFORCE(replicas >= 1, InvalidArgumentError, "DataParallel: the replica count must be at least 1, got ",
               replicas);
  for (const auto& [name, p] : module_->namedParameters())
    WEFT_ENFORCE(p.device().isCpu(), InvalidArgumentError, "DataParallel: CPU replicas need the module on the CPU, but '",
                 name, "' is on ", p.device().str(), " (pass the devices instead)");
  devices_.assign(static_cast<size_t>(replicas), Device::cpu());
  build(factory);
}

DataParallel::DataParallel(std::shared_ptr<Module> module, ReplicaFactory factory, std::vector<Device> devices)
    : Module("DataParallel"), module_(std::move(module)), devices_(std::move(devices)) {
  WEFT_ENFORCE(module_ != nullptr, InvalidArgumentError, "DataParallel: the module is null");
  WEFT_ENFORCE(!devices_.empty(), InvalidArgumentError, "DataParallel: the replica count must be at least 1, got 0");
  const int available = kernels::cudaDeviceCount();
  for (size_t i = 0; i < devices_.size(); ++i) {
    const Device d = devices_[i];
    WEFT_ENFORCE(d.isCuda() || devices_.size() == 1, InvalidArgumentError,
                 "DataParallel: replicas on devices must be on CUDA devices, got ", d.str(),
                 " (pass a replica count for CPU replicas)");
    WEFT_ENFORCE(d.isCpu() || d.index < available, InvalidArgumentError, "DataParallel: device ", d.str(),
                 " does not exist (", available, " CUDA devices)");
    for (size_t j = 0; j < i; ++j)
      WEFT_ENFORCE(devices_[j] != d, InvalidArgumentError, "DataParallel: device ", d.str(), " is listed twice");
  }
  for (const auto& [name, p] : module_->namedParameters())
    WEFT_ENFORCE(p.device() == devices_[0], InvalidArgumentError, "DataParallel: the module must be on devices[0] (",
                 devices_[0].str(), "), but '", name, "' is on ", p.device().str());
  build(factory);
}

void DataParallel::build(const ReplicaFactory& factory) {
  registerModule("module", module_);
  WEFT_ENFORCE(devices_.size() == 1 || factory, InvalidArgumentError, "DataParallel: ", devices_.size(),
               " replicas need a replica factory");
  replicas_.resize(devices_.size());
  replicas_[0].module = module_;
  replicas_[0].device = devices_[0];
  const auto moduleParameters = module_->namedParameters();
  const auto moduleBuffers = module_->namedBuffers();
  const auto moduleSubmodules = module_->namedModules();
  for (size_t r = 1; r < replicas_.size(); ++r) {
    Replica& rep = replicas_[r];
    rep.module = factory();
    WEFT_ENFORCE(rep.module != nullptr, InvalidArgumentError, "DataParallel: the replica factory returned null");
    WEFT_ENFORCE(rep.module.get() != module_.get(), InvalidArgumentError,
                 "DataParallel: the replica factory returned the module itself; it must build a new one");
    rep.device = devices_[r];
    const auto parameters = rep.module->namedParameters();
    const auto buffers = rep.module->namedBuffers();
    const auto submodules = rep.module->namedModules();
    std::string diff = firstDifference("parameter", moduleParameters, parameters);
    if (diff.empty()) diff = firstDifference("buffer", moduleBuffers, buffers);
    for (size_t i = 0; diff.empty() && i < moduleSubmodules.size(); ++i) {
      if (i >= submodules.size() || submodules[i].first != moduleSubmodules[i].first)
        diff = "submodule '" + moduleSubmodules[i].first + "' has no counterpart in the replica";
    }
    if (diff.empty() && submodules.size() > moduleSubmodules.size())
      diff = "the replica has an extra submodule '" + submodules[moduleSubmodules.size()].first + "'";
    WEFT_ENFORCE(diff.empty(), InvalidArgumentError, "DataParallel: replica ", r, " (", rep.module->typeName(),
                 ") does not match the module (", module_->typeName(), "): ", diff);
    for (size_t i = 0; i < parameters.size(); ++i)
      rep.parameters.emplace_back(parameters[i].second, moduleParameters[i].second);
    for (size_t i = 0; i < buffers.size(); ++i) rep.buffers.emplace_back(buffers[i].second, moduleBuffers[i].second);
    for (size_t i = 0; i < submodules.size(); ++i)
      rep.submodules.emplace_back(submodules[i].second.get(), moduleSubmodules[i].second.get());
  }
}

void DataParallel::replicate(Replica& r) {
  // A replica parameter becomes a differentiable alias of the module's: its
  // gradient flows along a "Replicate" edge into the module's parameter (as
  // torch's Broadcast), rather than into a .grad of its own.
  for (auto& [mine, source] : r.parameters) {
    Tensor data;
    if (source.device() == r.device) {
      data = source;
    } else {
      NoGradGuard ng;
      data = source.detach().to(r.device);
    }
    rebind(mine, data);
    const Device from = source.device();
    const Device to = r.device;
    recordOp("Replicate", {source}, {mine},
             [from, to](const std::vector<Tensor>& g) { return std::vector<Tensor>{from == to ? g[0] : g[0].to(from)}; });
  }
  {
    NoGradGuard ng;
    for (auto& [mine, source] : r.buffers) {
      rebind(mine, source.device() == r.device ? source.clone() : source.detach().to(r.device));
    }
  }
  // Parents come first, and train() is recursive: a child whose mode differs
  // from its parent's is set after its parent.
  for (auto& [mine, source] : r.submodules) {
    if (mine->isTraining() != source->isTraining()) mine->train(source->isTraining());
  }
}

Tensor DataParallel::forward(const Tensor& input) {
  const int r = replicas();
  WEFT_ENFORCE(input.defined(), InvalidArgumentError, "DataParallel: the input is undefined");
  WEFT_ENFORCE(input.dim() >= 1, InvalidArgumentError,
               "DataParallel: the input must have a batch dimension (dim 0), got a scalar of shape ", input.shape());
  WEFT_ENFORCE(input.size(0) >= r, InvalidArgumentError, "DataParallel: a batch of ", input.size(0),
               " rows (input shape ", input.shape(), ") cannot be split over ", r, " replicas");
  const Device home = devices_[0];
  WEFT_ENFORCE(input.device() == home || (home.isCuda() && (input.device().isCpu() || input.device().isCuda())),
               InvalidArgumentError, "DataParallel: the input is on ", input.device().str(), ", the module on ",
               home.str());
  times_ = DataParallelTimes{};

  auto t0 = Clock::now();
  std::vector<Tensor> slices = r == 1 ? std::vector<Tensor>{input} : chunk(input, r, 0);
  const size_t n = slices.size();  // may be fewer than r, as with torch's scatter
  for (size_t i = 0; i < n; ++i) {
    if (slices[i].device() != replicas_[i].device) slices[i] = slices[i].to(replicas_[i].device);
  }
  times_.scatter = secondsSince(t0);

  t0 = Clock::now();
  for (size_t i = 1; i < n; ++i) replicate(replicas_[i]);
  times_.replicate = secondsSince(t0);

  t0 = Clock::now();
  std::vector<Tensor> outputs(n);
  std::vector<std::exception_ptr> errors(n);
  const bool gradEnabled = GradMode::enabled();
  const bool autocastEnabled = autocast::isEnabled();
  const DType autocastDType = autocast::dtype();
  auto runReplica = [&outputs, &errors, &slices, this, gradEnabled, autocastEnabled, autocastDType](size_t i) {
    try {
      GradMode::setEnabled(gradEnabled);
      autocast::Scope amp(autocastDType, autocastEnabled);
      std::unique_ptr<kernels::cpu::ThreadLimit> alone;
      if (replicas_.size() > 1) alone = std::make_unique<kernels::cpu::ThreadLimit>(1);
      outputs[i] = (*replicas_[i].module)(slices[i]);  // through operator(): forward hooks run
    } catch (...) {
      errors[i] = std::current_exception();
    }
  };
  {
    std::vector<std::thread> threads;
    threads.reserve(n - 1);
    try {
      for (size_t i = 1; i < n; ++i) threads.emplace_back(runReplica, i);
    } catch (...) {
      // No thread could be started (std::system_error): those running
      // reference this frame, so they finish before the error leaves it.
      for (auto& t : threads) t.join();
      throw;
    }
    runReplica(0);
    for (auto& t : threads) t.join();
  }
  times_.run = secondsSince(t0);
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }

  t0 = Clock::now();
  for (size_t i = 0; i < n; ++i) {
    WEFT_ENFORCE(outputs[i].defined() && outputs[i].dim() >= 1, InvalidArgumentError,
                 "DataParallel: replica ", i, " returned ", outputs[i].defined() ? "a scalar" : "an undefined tensor",
                 "; outputs are gathered along dim 0");
    if (outputs[i].device() != home) outputs[i] = outputs[i].to(home);
  }
  Tensor out = n == 1 ? outputs[0] : cat(outputs, 0);
  times_.gather = secondsSince(t0);
  return out;
}

std::string DataParallel::extraRepr() const {
  std::ostringstream os;
  os << "replicas=" << replicas_.size() << ", devices=[";
  for (size_t i = 0; i < devices_.size(); ++i) os << (i ? ", " : "") << devices_[i].str();
  os << "]";
  return os.str();
}

}  // namespace weft::nn
