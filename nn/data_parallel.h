// DataParallel: one process trains a module on R replicas at once, each
// running a slice of the batch, after torch.nn.DataParallel.
//
//   auto net = std::make_shared<Net>();
//   auto dp = std::make_shared<nn::DataParallel>(net, [] { return std::make_shared<Net>(); }, 2);
//   nn::optim::SGD opt(net->parameters(), {.lr = 0.1});
//   Tensor loss = crossEntropy(dp->forward(x), y);  // x: [batch, ...]
//   loss.backward();                                // gradients land in net's parameters
//   opt.step();
//   // CUDA: the module on devices[0], one replica per device, outputs on devices[0]
//   nn::DataParallel gpus(net, makeNet, {Device::cuda(0), Device::cuda(1)});
//
// It is superseded by collectives::DistributedDataParallel (one process per
// replica): here the scatter, the replication and the gather run on one
// coordinating thread every step, and the whole backward pass runs on the
// calling thread, one replica's nodes after another. README.md,
// "DataParallel (one process)", has the measurements.
//
// A forward is four steps:
//  - scatter: the input is split along dim 0 as torch's scatter does, by
//    chunk(input, R): slices of ceil(B / R) rows, the last one smaller. When
//    that makes fewer than R slices (B = 5, R = 4: 2, 2, 1) only that many
//    replicas run. On CUDA each slice is copied to its replica's device.
//  - replicate: replica 0 is the module itself; replicas 1..R-1 are built
//    once by the factory and re-bound at every forward, as torch replicates
//    at every step. Each replica parameter becomes a differentiable alias of
//    the module's parameter (on the CPU it shares the parameter's storage, on
//    another device it is a copy), so backward sends every replica's gradient
//    into the module's parameters: .grad, autograd::grad, DDP's hooks and
//    distributed autograd see them as they see any other use of a parameter,
//    and an optimizer over module->parameters() steps them. Buffers are copied
//    from the module into every replica; in-place buffer updates (running
//    statistics) of replica 0 are the module's, those of the other replicas
//    are lost (torch's rule). Each replica's submodules take the training
//    mode of the module's.
//  - run: replica 0 on the calling thread, the others on a thread each,
//    started by the forward and joined before it returns. The caller's grad
//    mode and autocast scope apply on every replica's thread. On the CPU each
//    replica's kernels run on its own thread alone (kernels::cpu::ThreadLimit
//    of 1): the kernel pool serves one job at a time, so without the limit
//    the replica holding the pool would add numThreads() - 1 workers to the R
//    replica threads while the other replicas ran alone; with it, R replicas
//    are R busy threads. With R below the CPU count the forward leaves CPUs
//    idle; the backward pass, on the calling thread, has the whole pool.
//  - gather: the replicas' outputs are concatenated along dim 0, on the
//    module's device (differentiable).
//
// DataParallel is a Module whose only child is the module, named "module"
// (parameters and state dicts read "module.fc1.weight", as torch's), so
// train()/eval() reach the module, and parameters() are the module's.
//
// Errors (InvalidArgumentError, naming the problem): R < 1; R > 1 without a
// factory; a replica whose submodule, parameter or buffer names or shapes
// differ from the module's (naming the first difference); CUDA devices that
// are repeated, absent or not CUDA, or a module not on devices[0]; an input
// with no dim 0 or with fewer rows than replicas; an input on a CUDA device
// for CPU replicas (replicas on devices take it from the CPU or any device);
// an output that is a scalar. An exception thrown by a replica's
// forward is rethrown by forward() once every replica has stopped (the
// lowest replica's first).
//
// Threading: forward() from one thread at a time, and no other use of the
// module (optimizer steps, loading, to()) while it runs. The module's forward
// runs concurrently on R threads over different modules that share parameter
// storage: it must not write to its parameters.
#pragma once

#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "nn/module.h"

namespace weft::nn {

// Builds a module with the same structure as the one being replicated (its
// values do not matter: they are replaced at every forward).
using ReplicaFactory = std::function<std::shared_ptr<Module>()>;

// Seconds the coordinating thread spent in each step of the last forward.
struct DataParallelTimes {
  double scatter = 0;    // splitting the input (and copying it to devices)
  double replicate = 0;  // re-binding the replicas' parameters, buffers, modes
  double run = 0;        // the replicas' forwards, until the last one joined
  double gather = 0;     // concatenating the outputs
  double coordinator() const { return scatter + replicate + gather; }
};

class DataParallel : public Module {
 public:
  // `replicas` replicas on the CPU, each a thread; the module's parameters
  // must be on the CPU.
  DataParallel(std::shared_ptr<Module> module, ReplicaFactory factory, int replicas);
  // One replica per device of `devices` (distinct CUDA devices; the module on
  // devices[0]). A single device runs the module alone.
  DataParallel(std::shared_ptr<Module> module, ReplicaFactory factory, std::vector<Device> devices);

  // Scatters `input` along dim 0, runs the replicas and gathers their
  // outputs (see the header comment).
  Tensor forward(const Tensor& input) override;

  const std::shared_ptr<Module>& module() const { return module_; }
  int replicas() const { return static_cast<int>(replicas_.size()); }
  const std::vector<Device>& devices() const { return devices_; }
  const DataParallelTimes& lastForwardTimes() const { return times_; }

 protected:
  std::string extraRepr() const override;

 private:
  struct Replica {
    std::shared_ptr<Module> module;
    Device device;
    // (replica's tensor, module's tensor), in the module's traversal order.
    std::vector<std::pair<Tensor, Tensor>> parameters;
    std::vector<std::pair<Tensor, Tensor>> buffers;
    // (replica's submodule, module's submodule), parents before children.
    std::vector<std::pair<Module*, Module*>> submodules;
  };

  void build(const ReplicaFactory& factory);
  void replicate(Replica& r);

  std::shared_ptr<Module> module_;
  std::vector<Device> devices_;
  std::vector<Replica> replicas_;  // [0] is the module itself
  DataParallelTimes times_;
};

}  // namespace weft::nn
