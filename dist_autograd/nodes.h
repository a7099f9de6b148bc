// The graph nodes of distributed autograd, internal to dist_autograd/ (not part of the public
// API): SendNode and RecvNode, the two ends of a recorded message in the local autograd graphs
// of its sender and its receiver (dist_autograd/dist_autograd.h, "Recording" and "Backward").
// dist_autograd.cpp makes them when it records a message and starts the passes that run them;
// the context they belong to (ContextState) is its own, and what a recv node needs of it is
// declared at the end of this file.
//
// Threads: a send node is made on the thread encoding the recorded call or result (its context's
// mutex_ held); a recv node on the loop thread when the frame arrives, and its tensors are linked
// to it by whichever thread decodes them (under linkMutex_). apply() runs on the thread running
// the context's pass (its runMutex_ held).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tensor/autograd.h"

namespace weft::dist_autograd {

class ContextState;

// The sender's end of a recorded message: its inputs are the tensors the message carried that
// require grad; its gradients arrive in a backward request and flow on unchanged.
class SendNode final : public Node {
 public:
  SendNode(int64_t messageId, const std::vector<Tensor>& tensors);
  std::string name() const override;
  std::vector<Tensor> apply(std::vector<Tensor> gradOutputs) override;
  void release() override { released_ = true; }

 private:
  int64_t messageId_;
  bool released_ = false;
};

// The receiver's end: the grad function of the tensors a recorded message brought. Running it
// sends their gradients back to the sender's send node.
class RecvNode final : public Node {
 public:
  RecvNode(std::weak_ptr<ContextState> ctx, int peer, int64_t messageId, uint32_t slots);
  std::string name() const override;
  // Makes t output `slot` of this node (the tensor codec, through FrameLink).
  void link(Tensor& t, uint32_t slot);
  std::vector<Tensor> apply(std::vector<Tensor> gradOutputs) override;
  void release() override { released_ = true; }

 private:
  std::weak_ptr<ContextState> ctx_;
  int peer_;
  int64_t messageId_;
  std::mutex linkMutex_;
  std::vector<bool> linked_;
  bool released_ = false;
};

// ---- what a recv node needs of its context (defined in dist_autograd.cpp) ----

int64_t contextIdOf(const ContextState& ctx);
// The context whose pass this thread is running (its runMutex_ held), or null.
ContextState* passOnThisThread();
// Sends the gradients a recv node computed back to its sender, as a backward request of ctx's
// running pass (runMutex_ held), which waits for the answer.
void sendGradients(ContextState& ctx, int peer, int64_t messageId, std::vector<Tensor> grads);

}  // namespace weft::dist_autograd
