// The parameter server's side of examples/parameter_server: the model (Net) and the remote class
// that holds it (ParameterServer). Every program of the job includes this header, so any of them
// can own a ParameterServer; the job builds exactly one, on rank 0 ("parameter_server"), through
// Agent::remote from trainer_1:
//
//   RRef<ParameterServer> ps = agent.remote<ParameterServer>("parameter_server", seed, "serialized", dataDir);
//   RRef<Tensor> w = ps.remote(&ParameterServer::parameter, 0);   // the parameter itself, owned there
//   ps.rpcSync(&ParameterServer::lockForward);                       // serialized mode only
//   Tensor logProbs = ps.rpcSync(&ParameterServer::forward, images, dropoutSeed);
//   ...  backward in the distributed autograd context
//   ps.rpcSync(&ParameterServer::beginUpdate, true);                 // true: releases lockForward's hold
//   optimizer.step(ctx);
//   ps.rpcSync(&ParameterServer::endUpdate);
//   double accuracy = ps.rpcSync(&ParameterServer::testAccuracy);     // eval mode, dropout off
//
// Update modes (the choice between them, and why one is needed, is in README.md):
//  - Serialized: a trainer takes the UpdateLock shared before its forward (lockForward) and keeps
//    it through its backward; beginUpdate(true) gives it back and takes it exclusively for the
//    optimizer step. No weight changes between a forward and the backward that uses the tensors
//    that forward saved, on any trainer.
//  - Snapshot: forward copies the weights under a short shared hold (a differentiable clone, so
//    the gradients still reach the parameters themselves) and computes on the copy; a step
//    (beginUpdate(false) .. endUpdate) holds the lock exclusively only while it writes. Trainers
//    compute on weights that other trainers' steps may have changed since: asynchronous SGD.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/future.h"
#include "data/dataset.h"
#include "nn/conv.h"
#include "nn/linear.h"
#include "nn/module.h"
#include "rref/remote_class.h"
#include "tensor/generator.h"
#include "tensor/tensor.h"

#include "update_lock.h"

namespace weft::examples::parameter_server {

// The normalisation of the reference program (MNIST's mean and std, applied to Fashion-MNIST).
inline constexpr double kMean = 0.1307;
inline constexpr double kStd = 0.3081;
// Parameters of Net: 320 + 18,496 + 1,179,776 + 1,290.
inline constexpr int64_t kNetParameters = 1'199'882;
inline constexpr size_t kNetParameterTensors = 8;

enum class UpdateMode { Serialized, Snapshot };
// "serialized" / "snapshot".
const char* updateModeName(UpdateMode mode);
// InvalidArgumentError naming the value and the choices otherwise.
UpdateMode parseUpdateMode(const std::string& name);

// Input [N, 1, 28, 28] -> log-probabilities [N, 10]:
//   Conv 1->32 3x3, ReLU, Conv 32->64 3x3, MaxPool 2, Dropout 0.25, Flatten (9216),
//   Linear 9216->128, ReLU, Dropout 0.5, Linear 128->10, LogSoftmax.
// Parameters, in parameters() order: conv1.weight, conv1.bias, conv2.weight, conv2.bias,
// fc1.weight, fc1.bias, fc2.weight, fc2.bias, initialised as PyTorch does, from Generator(seed).
class Net : public nn::Module {
 public:
  explicit Net(uint64_t seed);

  // Eval mode (no dropout), with the module's own parameters.
  Tensor forward(const Tensor& x) override;
  // The same computation with `params` (8 tensors shaped as parameters()) in place of the
  // module's. Dropout is applied when `dropout` is not null, with masks drawn from it.
  static Tensor forwardWith(const std::vector<Tensor>& params, const Tensor& x, Generator* dropout);

 private:
  std::shared_ptr<nn::Conv2d> conv1_, conv2_;
  std::shared_ptr<nn::Linear> fc1_, fc2_;
};

// The model and the state around it on the server. Built remotely; methods run on the server's
// handler threads, concurrently for several trainers.
class ParameterServer {
 public:
  // seed: the model's initialisation; mode: "serialized" or "snapshot"; dataDir: where the
  // Fashion-MNIST test split is read from (at once: a missing file fails the constructor).
  ParameterServer(int64_t seed, std::string mode, std::string dataDir);

  // Parameter `index` of Net (0..7, parameters() order): the tensor itself, so that
  // ps.remote(&ParameterServer::parameter, i) is an RRef holding it on the server, which a
  // DistributedOptimizer updates in place. IndexError outside 0..7.
  Tensor parameter(int64_t index);
  // Number of parameter tensors (8) and of scalar parameters (kNetParameters).
  int64_t parameterTensorCount();
  int64_t parameterCount();
  // "serialized" or "snapshot".
  std::string updateMode();

  // Serialized mode: takes the lock shared for a forward and the backward that follows
  // (completes when granted). StateError in snapshot mode.
  Future<void> lockForward();
  // Takes the lock exclusively for an optimizer step, after giving back the caller's shared hold
  // when `holdsForwardLock` (serialized mode). Completes when granted.
  Future<void> beginUpdate(bool holdsForwardLock);
  // Gives the exclusive hold back.
  void endUpdate();

  // Training-mode forward of a batch [N, 1, 28, 28]; dropout masks come from
  // Generator(dropoutSeed), so a run is reproducible whatever the server's threads do.
  Tensor forward(Tensor images, int64_t dropoutSeed);
  // Fraction of the Fashion-MNIST test split classified correctly, in eval mode (dropout off),
  // under a shared hold.
  double testAccuracy();
  // Forwards served so far.
  int64_t forwardCount();

 private:
  UpdateMode mode_;
  std::shared_ptr<Net> net_;
  std::vector<Tensor> params_;
  data::TensorDataset test_;
  UpdateLock lock_;
  std::atomic<int64_t> forwards_{0};
};
WEFT_REMOTE_CLASS(ParameterServer, WEFT_CONSTRUCTORS((int64_t, std::string, std::string)), parameter,
                  parameterTensorCount, parameterCount, updateMode, lockForward, beginUpdate, endUpdate, forward, testAccuracy,
                  forwardCount);

}  // namespace weft::examples::parameter_server
