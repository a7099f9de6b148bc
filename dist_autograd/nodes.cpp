// SendNode and RecvNode (dist_autograd/nodes.h): the two ends of a recorded message in the local
// autograd graphs. Threads as nodes.h says.
#include "dist_autograd/nodes.h"

#include "common/error.h"
#include "dist_autograd/ids.h"

namespace weft::dist_autograd {

// ---- SendNode -----------------------------------------------------------------------------------

SendNode::SendNode(int64_t messageId, const std::vector<Tensor>& tensors) : messageId_(messageId) {
  auto& edges = mutableNextEdges();
  auto& metas = mutableOutputs();
  edges.reserve(tensors.size());
  metas.reserve(tensors.size());
  for (const Tensor& t : tensors) {
    edges.push_back(gradientEdge(t));
    metas.push_back({t.shape(), t.dtype(), t.device()});
  }
}

std::string SendNode::name() const { return "SendRpcBackward(message " + idString(messageId_) + ")"; }

std::vector<Tensor> SendNode::apply(std::vector<Tensor> gradOutputs) {
  WEFT_ENFORCE(!released_, StateError, "backward through the graph a second time (node ", name(),
               "): the first backward freed it; pass retainGraph=true to that first backward to run it again");
  return gradOutputs;
}

// ---- RecvNode -----------------------------------------------------------------------------------

RecvNode::RecvNode(std::weak_ptr<ContextState> ctx, int peer, int64_t messageId, uint32_t slots)
    : ctx_(std::move(ctx)), peer_(peer), messageId_(messageId), linked_(slots, false) {
  mutableOutputs().resize(slots);
}

std::string RecvNode::name() const {
  return "RecvRpcBackward(message " + idString(messageId_) + " from rank " + std::to_string(peer_) + ")";
}

void RecvNode::link(Tensor& t, uint32_t slot) {
  if (slot >= linked_.size()) {
    throw ProtocolError("a tensor names gradient slot " + std::to_string(slot) + " of a message that has " +
                        std::to_string(linked_.size()));
  }
  std::lock_guard<std::mutex> lock(linkMutex_);
  if (!linked_[slot]) {
    mutableOutputs()[slot] = {t.shape(), t.dtype(), t.device()};
    linked_[slot] = true;
  } else if (mutableOutputs()[slot].shape != t.shape() || mutableOutputs()[slot].dtype != t.dtype()) {
    throw ProtocolError("two tensors of different shapes name gradient slot " + std::to_string(slot));
  }
  TensorImpl* im = t.impl();
  im->gradFn = shared_from_this();
  im->outputNr = slot;
  im->requiresGrad = true;
}

std::vector<Tensor> RecvNode::apply(std::vector<Tensor> gradOutputs) {
  WEFT_ENFORCE(!released_, StateError, "backward through the graph a second time (node ", name(),
               "): the first backward freed it; pass retainGraph=true to that first backward to run it again");
  auto ctx = ctx_.lock();
  WEFT_ENFORCE(ctx != nullptr, StateError, name(), ": its distributed autograd context was released");
  ContextState* pass = passOnThisThread();
  WEFT_ENFORCE(pass == ctx.get(), StateError, name(), ": reached by ",
               pass != nullptr ? "a backward pass of context " + idString(contextIdOf(*pass))
                               : std::string("a local backward"),
               "; a tensor received in distributed autograd context ", idString(contextIdOf(*ctx)),
               " takes part only in that context's backward()");
  for (size_t i = 0; i < gradOutputs.size(); ++i) {
    if (!linked_[i]) gradOutputs[i] = Tensor();  // never decoded: the sender gets no gradient for it
  }
  sendGradients(*ctx, peer_, messageId_, std::move(gradOutputs));
  return {};
}

}  // namespace weft::dist_autograd
