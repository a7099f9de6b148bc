// The trainers' side of the model that lives on the parameter server (main.cpp): building it
// there, the RRefs of its parameters for the DistributedOptimizer, and the dropout seed of each
// batch's forward.
//
//   RRef<ParameterServer> ps = buildModel(agent, seed, UpdateMode::Serialized, dataDir);  // trainer_1
//   dist_optim::DistributedOptimizer optimizer(agent, sgd, parameterRRefs(ps));
//   Tensor logProbs = ps.rpcSync(&ParameterServer::forward, images, batchSeed(seed, rank, iteration));
#pragma once

#include <cinttypes>
#include <cstdint>
#include <string>
#include <vector>

#include "common/error.h"
#include "rpc/agent.h"
#include "rref/rref.h"
#include "examples/common/app.h"
#include "examples/common/seed.h"

#include "server.h"

namespace weft::examples::parameter_server {

// Builds the ParameterServer on "parameter_server", checks its size and prints "<me>: built the
// model on parameter_server (N parameters), update mode M".
inline RRef<ParameterServer> buildModel(rpc::Agent& agent, uint64_t seed, UpdateMode update,
                                        const std::string& dataDir) {
  RRef<ParameterServer> ps = agent.remote<ParameterServer>("parameter_server", static_cast<int64_t>(seed),
                                                           std::string(updateModeName(update)), dataDir);
  const int64_t count = ps.rpcSync(&ParameterServer::parameterCount);
  if (count != kNetParameters) {
    throw Error("the server's model has " + std::to_string(count) + " parameters, expected " +
                std::to_string(kNetParameters));
  }
  app::say("%s: built the model on parameter_server (%" PRId64 " parameters), update mode %s\n",
           agent.name().c_str(), count, updateModeName(update));
  return ps;
}

// The RRefs of the model's 8 parameter tensors, each owned by the server.
inline std::vector<RRef<Tensor>> parameterRRefs(const RRef<ParameterServer>& ps) {
  const int64_t tensors = ps.rpcSync(&ParameterServer::parameterTensorCount);
  if (tensors != static_cast<int64_t>(kNetParameterTensors)) {
    throw Error("the server's model has " + std::to_string(tensors) + " parameter tensors, expected 8");
  }
  std::vector<RRef<Tensor>> params;
  for (int64_t i = 0; i < tensors; ++i) params.push_back(ps.remote(&ParameterServer::parameter, i));
  return params;
}

// The dropout seed of one batch, from the run's seed, the trainer and the batch.
inline int64_t batchSeed(uint64_t seed, int rank, int64_t iteration) {
  return app::nonNegative(
      app::splitmix64(seed ^ (static_cast<uint64_t>(rank) << 40) ^ static_cast<uint64_t>(iteration)));
}

}  // namespace weft::examples::parameter_server
