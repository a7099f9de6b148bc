// Module: the unit models are built from — a tree of named parameters,
// buffers and submodules, after torch.nn.Module.
//
//   class Net : public weft::nn::Module {
//    public:
//     Net() : Module("Net") {
//       fc1_ = registerModule("fc1", std::make_shared<nn::Linear>(784, 128));
//       fc2_ = registerModule("fc2", std::make_shared<nn::Linear>(128, 10));
//     }
//     Tensor forward(const Tensor& x) override { return fc2_->forward(relu(fc1_->forward(x))); }
//
//    private:
//     std::shared_ptr<nn::Linear> fc1_, fc2_;
//   };
//
//   auto net = std::make_shared<Net>();
//   for (auto& [name, p] : net->namedParameters()) ...   // "fc1.weight", "fc1.bias", ...
//   net->eval();                                          // recursive
//   net->save("net.weft");                                // see nn/serialize.h
//   other->load("net.weft");                              // strict: every key must match
//
// Forward. `Tensor forward(const Tensor&)` is the one virtual forward: every
// module with one tensor in and one tensor out overrides it, and Sequential
// chains it. Modules with other inputs or outputs declare their own forward
// overloads as ordinary members (EmbeddingBag::forward(indices, offsets),
// LSTM::forward(input, state) -> output and state); where a natural
// single-tensor form exists they override this one too (LSTM's returns the
// output sequence from a zero state), otherwise the base raises
// InvalidArgumentError naming the module.
//
// Ownership. Modules are held by std::shared_ptr (registerModule takes one;
// namedModules() hands out shared_ptrs, the module itself included) and are
// neither copyable nor movable. A parameter or buffer is a Tensor handle
// shared by the module's table and the member the subclass keeps. Handles stay
// valid for the module's life: to(), loadStateDict() and load() change the
// tensors in place (data, dtype and device swapped inside the same tensor),
// never replace them, so an optimizer built over parameters() keeps updating
// the tensors the module computes with.
//
// Threading: concurrent forward calls are safe when forward changes no module
// state (true of every module in nn/); anything that mutates the module
// (register*, train/eval, to, zeroGrad, loading) must not overlap with any
// other use.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "tensor/tensor.h"

namespace weft::nn {

// Name -> tensor, as produced by Module::stateDict() and stored by
// nn/serialize.h. Ordered by name, so files and comparisons are deterministic.
using StateDict = std::map<std::string, Tensor>;

// What a non-strict load skipped: keys the module has that the dict lacks,
// and keys the dict has that the module does not.
struct LoadStateDictResult {
  std::vector<std::string> missingKeys;
  std::vector<std::string> unexpectedKeys;
};

class Module : public std::enable_shared_from_this<Module> {
 public:
  // `typeName` is what toString() prints ("Linear", "Net", ...).
  explicit Module(std::string typeName);
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  const std::string& typeName() const { return typeName_; }

  // The single-tensor forward (see the header comment). The base raises
  // InvalidArgumentError naming the module type.
  virtual Tensor forward(const Tensor& input);
  // forward(input) between this module's forward hooks (see "Forward hooks").
  Tensor operator()(const Tensor& input);

  // ---- forward hooks ----------------------------------------------------------
  // Run by operator() only, as torch's __call__ (a direct forward() call runs
  // none): every pre-hook, in registration order, before forward; every hook
  // after it, which may replace the output. Containers call their children
  // through operator() (Sequential, GPT's blocks), so hooks on a child run
  // when the parent's forward does. Fully sharded data parallelism gathers a
  // unit's parameters in its pre-hook and frees them in its hook. Returns an
  // id for removeForwardHook (unknown ids are ignored).
  using ForwardPreHook = std::function<void(Module& module, const Tensor& input)>;
  using ForwardHook = std::function<void(Module& module, const Tensor& input, Tensor& output)>;
  int registerForwardPreHook(ForwardPreHook hook);
  int registerForwardHook(ForwardHook hook);
  void removeForwardHook(int id);

  // ---- registration ---------------------------------------------------------
  // Names are non-empty, contain no '.', and are unique across this module's
  // parameters, buffers and children; otherwise InvalidArgumentError.
  //
  // A parameter must be a defined leaf tensor (detach() a computed one); it is
  // stored as given — the same handle, not a copy — with requiresGrad set as
  // asked. Returns the stored handle.
  Tensor registerParameter(const std::string& name, Tensor tensor, bool requiresGrad = true);
  // A buffer is state that is not trained (running statistics, masks). A
  // persistent buffer appears in stateDict(); a non-persistent one does not.
  Tensor registerBuffer(const std::string& name, Tensor tensor, bool persistent = true);
  template <class M>
  std::shared_ptr<M> registerModule(const std::string& name, std::shared_ptr<M> module) {
    addChild(name, module);
    return module;
  }

  // ---- traversal ------------------------------------------------------------
  // Registration order, depth first, dotted names ("layer1.0.weight"). A
  // tensor or module reachable under several names is listed once, under the
  // first; stateDict() lists every name.
  std::vector<Tensor> parameters(bool recurse = true) const;
  std::vector<std::pair<std::string, Tensor>> namedParameters(bool recurse = true) const;
  std::vector<Tensor> buffers(bool recurse = true) const;
  std::vector<std::pair<std::string, Tensor>> namedBuffers(bool recurse = true) const;
  std::vector<std::shared_ptr<Module>> children() const;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> namedChildren() const;
  // This module (named "") and every descendant. Needs the module to be held
  // by a std::shared_ptr; InvalidArgumentError otherwise.
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> namedModules();
  std::vector<std::shared_ptr<Module>> modules();
  // Calls fn on every descendant, then on this module (as torch's apply).
  void apply(const std::function<void(Module&)>& fn);
  // The parameter or buffer registered under a dotted name ("fc1.weight");
  // NotFoundError when there is none.
  Tensor namedTensor(const std::string& dottedName) const;

  // ---- mode -----------------------------------------------------------------
  // Sets training mode on this module and every descendant.
  void train(bool on = true);
  void eval() { train(false); }
  bool isTraining() const { return training_; }

  // Gradients of every parameter: zeroed in place where defined (PyTorch
  // 1.13's default), or dropped when setToNone.
  void zeroGrad(bool setToNone = false);

  // Converts every floating parameter and buffer (and defined gradients) to
  // `dtype` in place; integer buffers are left alone. `dtype` must be
  // floating. Returns *this.
  Module& to(DType dtype);
  // Moves every parameter, buffer and defined gradient to `device` in place.
  Module& to(Device device);

  // ---- state ----------------------------------------------------------------
  // Every parameter and persistent buffer under its dotted name, detached
  // (sharing storage with the module: clone() to snapshot).
  StateDict stateDict() const;
  // Copies values from `dict` into the module's tensors (converting dtype and
  // device as needed). Every problem is checked before anything is copied,
  // and all are reported in one InvalidArgumentError that names the module
  // type and each key: shape mismatches always, and when `strict` the missing
  // and unexpected keys too (otherwise they are returned).
  LoadStateDictResult loadStateDict(const StateDict& dict, bool strict = true);
  // stateDict() written to / read from a weft state file (nn/serialize.h).
  void save(const std::string& path) const;
  LoadStateDictResult load(const std::string& path, bool strict = true);

  // PyTorch-style tree: "Net(\n  (fc1): Linear(in_features=784, ...)\n)".
  std::string toString() const;

 protected:
  // The arguments shown inside the parentheses by toString().
  virtual std::string extraRepr() const { return ""; }

 private:
  struct NamedTensor {
    std::string name;
    Tensor tensor;
    bool persistent = true;
  };

  void checkNewName(const std::string& name, const char* what) const;
  void addChild(const std::string& name, std::shared_ptr<Module> module);
  void collectTensors(bool params, bool recurse, bool persistentOnly, bool dedupe, const std::string& prefix,
                      std::vector<std::pair<std::string, Tensor>>& out) const;
  void collectModules(const std::string& prefix, std::vector<std::pair<std::string, std::shared_ptr<Module>>>& out,
                      std::vector<const Module*>& seen);
  void printTo(std::ostream& os, int indent) const;
  // Replaces the data of every parameter and buffer for which `convert`
  // returns a defined tensor.
  void convertTensors(const std::function<Tensor(const Tensor&)>& convert);

  std::string typeName_;
  bool training_ = true;
  int nextHookId_ = 0;
  std::map<int, ForwardPreHook> forwardPreHooks_;
  std::map<int, ForwardHook> forwardHooks_;
  std::vector<NamedTensor> parameters_;
  std::vector<NamedTensor> buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
};

std::ostream& operator<<(std::ostream& os, const Module& m);

}  // namespace weft::nn
