#include "nn/module.h"

#include <algorithm>
#include <set>
#include <sstream>

#include "nn/serialize.h"
#include "nn/utils.h"
#include "tensor/autograd.h"

namespace weft::nn {

namespace {

// Points `t` at the data of `data` (storage, layout, dtype), keeping the same
// TensorImpl so that every handle to `t` sees the change. The gradient, if
// any, is converted by the same function.
void swapData(const Tensor& t, const Tensor& data, const std::function<Tensor(const Tensor&)>& convert) {
  TensorImpl* im = t.impl();
  im->storage = data.storage();
  im->shape = data.shape();
  im->strides = data.strides();
  im->offset = data.storageOffset();
  im->dtype = data.dtype();
  if (im->grad) {
    Tensor g = convert(Tensor(im->grad));
    if (g.defined()) im->grad = g.implPtr();
  }
}

std::string joinName(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

}  // namespace

Module::Module(std::string typeName) : typeName_(std::move(typeName)) {}

Tensor Module::forward(const Tensor&) {
  WEFT_ENFORCE(false, InvalidArgumentError, typeName_,
               ": this module has no single-tensor forward(x); call the forward overload it declares");
  return Tensor();
}

// ---- registration ---------------------------------------------------------------

void Module::checkNewName(const std::string& name, const char* what) const {
  WEFT_ENFORCE(!name.empty(), InvalidArgumentError, typeName_, ": ", what, " name must not be empty");
  WEFT_ENFORCE(name.find('.') == std::string::npos, InvalidArgumentError, typeName_, ": ", what, " name '", name,
               "' must not contain '.'");
  auto taken = [&](const auto& list) {
    return std::any_of(list.begin(), list.end(), [&](const auto& e) {
      if constexpr (requires { e.name; }) {
        return e.name == name;
      } else {
        return e.first == name;
      }
    });
  };
  WEFT_ENFORCE(!taken(parameters_) && !taken(buffers_) && !taken(children_), InvalidArgumentError, typeName_,
               ": cannot register ", what, " '", name, "': the name is already used by a parameter, buffer or child");
}

Tensor Module::registerParameter(const std::string& name, Tensor tensor, bool requiresGrad) {
  checkNewName(name, "parameter");
  WEFT_ENFORCE(tensor.defined(), InvalidArgumentError, typeName_, ": parameter '", name, "' is undefined");
  WEFT_ENFORCE(tensor.isLeaf(), InvalidArgumentError, typeName_, ": parameter '", name,
               "' is the result of an op (not a leaf); register its detach()");
  tensor.requiresGrad_(requiresGrad);
  parameters_.push_back({name, tensor, true});
  return tensor;
}

Tensor Module::registerBuffer(const std::string& name, Tensor tensor, bool persistent) {
  checkNewName(name, "buffer");
  WEFT_ENFORCE(tensor.defined(), InvalidArgumentError, typeName_, ": buffer '", name, "' is undefined");
  buffers_.push_back({name, tensor, persistent});
  return tensor;
}

void Module::addChild(const std::string& name, std::shared_ptr<Module> module) {
  checkNewName(name, "submodule");
  WEFT_ENFORCE(module != nullptr, InvalidArgumentError, typeName_, ": submodule '", name, "' is null");
  WEFT_ENFORCE(module.get() != this, InvalidArgumentError, typeName_, ": a module cannot be its own child ('", name,
               "')");
  children_.emplace_back(name, std::move(module));
}

// ---- traversal ------------------------------------------------------------------

void Module::collectTensors(bool params, bool recurse, bool persistentOnly, bool dedupe, const std::string& prefix,
                            std::vector<std::pair<std::string, Tensor>>& out) const {
  for (const auto& e : params ? parameters_ : buffers_) {
    if (persistentOnly && !e.persistent) continue;
    if (dedupe && std::any_of(out.begin(), out.end(), [&](const auto& p) { return p.second.sameAs(e.tensor); })) {
      continue;
    }
    out.emplace_back(joinName(prefix, e.name), e.tensor);
  }
  if (!recurse) return;
  for (const auto& [name, child] : children_) {
    child->collectTensors(params, true, persistentOnly, dedupe, joinName(prefix, name), out);
  }
}

std::vector<std::pair<std::string, Tensor>> Module::namedParameters(bool recurse) const {
  std::vector<std::pair<std::string, Tensor>> out;
  collectTensors(true, recurse, false, true, "", out);
  return out;
}

std::vector<Tensor> Module::parameters(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& [name, t] : namedParameters(recurse)) out.push_back(t);
  return out;
}

std::vector<std::pair<std::string, Tensor>> Module::namedBuffers(bool recurse) const {
  std::vector<std::pair<std::string, Tensor>> out;
  collectTensors(false, recurse, false, true, "", out);
  return out;
}

std::vector<Tensor> Module::buffers(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& [name, t] : namedBuffers(recurse)) out.push_back(t);
  return out;
}

std::vector<std::pair<std::string, std::shared_ptr<Module>>> Module::namedChildren() const { return children_; }

std::vector<std::shared_ptr<Module>> Module::children() const {
  std::vector<std::shared_ptr<Module>> out;
  for (const auto& [name, child] : children_) out.push_back(child);
  return out;
}

void Module::collectModules(const std::string& prefix,
                            std::vector<std::pair<std::string, std::shared_ptr<Module>>>& out,
                            std::vector<const Module*>& seen) {
  for (auto& [name, child] : children_) {
    if (std::find(seen.begin(), seen.end(), child.get()) != seen.end()) continue;
    seen.push_back(child.get());
    std::string full = joinName(prefix, name);
    out.emplace_back(full, child);
    child->collectModules(full, out, seen);
  }
}

std::vector<std::pair<std::string, std::shared_ptr<Module>>> Module::namedModules() {
  std::shared_ptr<Module> self = weak_from_this().lock();
  WEFT_ENFORCE(self != nullptr, InvalidArgumentError, typeName_,
               ": namedModules needs the module to be held by a std::shared_ptr");
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> out{{"", self}};
  std::vector<const Module*> seen{this};
  collectModules("", out, seen);
  return out;
}

std::vector<std::shared_ptr<Module>> Module::modules() {
  std::vector<std::shared_ptr<Module>> out;
  for (auto& [name, m] : namedModules()) out.push_back(m);
  return out;
}

void Module::apply(const std::function<void(Module&)>& fn) {
  for (auto& [name, child] : children_) child->apply(fn);
  fn(*this);
}

Tensor Module::namedTensor(const std::string& dottedName) const {
  size_t dot = dottedName.find('.');
  if (dot != std::string::npos) {
    std::string head = dottedName.substr(0, dot);
    for (const auto& [name, child] : children_) {
      if (name == head) return child->namedTensor(dottedName.substr(dot + 1));
    }
  } else {
    for (const auto& list : {&parameters_, &buffers_}) {
      for (const auto& e : *list) {
        if (e.name == dottedName) return e.tensor;
      }
    }
  }
  WEFT_ENFORCE(false, NotFoundError, typeName_, ": no parameter or buffer named '", dottedName, "'");
  return Tensor();
}

// ---- mode, gradients, conversion ------------------------------------------------

void Module::train(bool on) {
  training_ = on;
  for (auto& [name, child] : children_) child->train(on);
}

void Module::zeroGrad(bool setToNone) { zeroGrads(parameters(), setToNone); }

void Module::convertTensors(const std::function<Tensor(const Tensor&)>& convert) {
  NoGradGuard ng;
  std::vector<const TensorImpl*> done;
  auto visit = [&](std::vector<NamedTensor>& list) {
    for (auto& e : list) {
      if (std::find(done.begin(), done.end(), e.tensor.impl()) != done.end()) continue;
      done.push_back(e.tensor.impl());
      Tensor converted = convert(e.tensor);
      if (converted.defined() && !converted.sameAs(e.tensor)) swapData(e.tensor, converted, convert);
    }
  };
  apply([&](Module& m) {
    visit(m.parameters_);
    visit(m.buffers_);
  });
}

Module& Module::to(DType dtype) {
  WEFT_ENFORCE(isFloating(dtype), InvalidArgumentError, typeName_, ".to: only floating dtypes are accepted, got ",
               dtypeName(dtype));
  convertTensors([dtype](const Tensor& t) {
    if (!isFloating(t.dtype()) || t.dtype() == dtype) return Tensor();
    return t.detach().to(dtype);
  });
  return *this;
}

Module& Module::to(Device device) {
  convertTensors([device](const Tensor& t) {
    if (t.device() == device) return Tensor();
    return t.detach().to(device);
  });
  return *this;
}

// ---- forward hooks ---------------------------------------------------------------

Tensor Module::operator()(const Tensor& input) {
  if (forwardPreHooks_.empty() && forwardHooks_.empty()) return forward(input);
  // Copies: a hook may remove hooks.
  const auto pre = forwardPreHooks_;
  for (const auto& [id, hook] : pre) hook(*this, input);
  Tensor output = forward(input);
  const auto post = forwardHooks_;
  for (const auto& [id, hook] : post) hook(*this, input, output);
  return output;
}

int Module::registerForwardPreHook(ForwardPreHook hook) {
  const int id = nextHookId_++;
  forwardPreHooks_.emplace(id, std::move(hook));
  return id;
}

int Module::registerForwardHook(ForwardHook hook) {
  const int id = nextHookId_++;
  forwardHooks_.emplace(id, std::move(hook));
  return id;
}

void Module::removeForwardHook(int id) {
  forwardPreHooks_.erase(id);
  forwardHooks_.erase(id);
}

// ---- state ----------------------------------------------------------------------

StateDict Module::stateDict() const {
  std::vector<std::pair<std::string, Tensor>> entries;
  collectTensors(true, true, false, false, "", entries);
  collectTensors(false, true, true, false, "", entries);
  StateDict out;
  for (auto& [name, t] : entries) out.emplace(name, t.detach());
  return out;
}

LoadStateDictResult Module::loadStateDict(const StateDict& dict, bool strict) {
  std::vector<std::pair<std::string, Tensor>> entries;
  collectTensors(true, true, false, false, "", entries);
  collectTensors(false, true, true, false, "", entries);

  LoadStateDictResult result;
  std::vector<std::string> mismatches;
  std::set<std::string> known;
  for (const auto& [name, t] : entries) {
    known.insert(name);
    auto it = dict.find(name);
    if (it == dict.end()) {
      result.missingKeys.push_back(name);
      continue;
    }
    const Tensor& src = it->second;
    if (!src.defined()) {
      mismatches.push_back(detail::concat("'", name, "' is undefined in the state dict"));
    } else if (src.shape() != t.shape()) {
      mismatches.push_back(detail::concat("size mismatch for '", name, "': the state dict has shape ", src.shape(),
                                          ", the module has shape ", t.shape()));
    }
  }
  for (const auto& [name, t] : dict) {
    if (!known.count(name)) result.unexpectedKeys.push_back(name);
  }

  bool keyErrors = strict && (!result.missingKeys.empty() || !result.unexpectedKeys.empty());
  if (keyErrors || !mismatches.empty()) {
    std::ostringstream os;
    os << "loadStateDict: error(s) loading a state dict into " << typeName_ << ":";
    if (strict && !result.missingKeys.empty()) os << "\n  missing key(s): " << detail::concat(result.missingKeys);
    if (strict && !result.unexpectedKeys.empty()) {
      os << "\n  unexpected key(s): " << detail::concat(result.unexpectedKeys);
    }
    for (const auto& m : mismatches) os << "\n  " << m;
    throw InvalidArgumentError(os.str());
  }

  NoGradGuard ng;
  for (auto& [name, t] : entries) {
    auto it = dict.find(name);
    if (it == dict.end()) continue;
    Tensor src = it->second;
    // copy_ converts dtypes on the host; convert first so a CUDA target gets
    // a same-dtype copy.
    if (src.dtype() != t.dtype() && src.device().isCpu()) src = src.to(t.dtype());
    t.copy_(src);
  }
  return result;
}

void Module::save(const std::string& path) const { saveStateDict(stateDict(), path); }

LoadStateDictResult Module::load(const std::string& path, bool strict) {
  return loadStateDict(loadStateDictFile(path), strict);
}

// ---- printing -------------------------------------------------------------------

void Module::printTo(std::ostream& os, int indent) const {
  os << typeName_ << "(" << extraRepr();
  if (children_.empty()) {
    os << ")";
    return;
  }
  os << "\n";
  for (const auto& [name, child] : children_) {
    os << std::string(indent + 2, ' ') << "(" << name << "): ";
    child->printTo(os, indent + 2);
    os << "\n";
  }
  os << std::string(indent, ' ') << ")";
}

std::string Module::toString() const {
  std::ostringstream os;
  printTo(os, 0);
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Module& m) { return os << m.toString(); }

}  // namespace weft::nn
