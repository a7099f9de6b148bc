// What the gpt example's mesh layouts share: the job, its mesh and groups, the initial model, the
// replicas' mean loss and the sample.
#include "mesh_layout.h"

#include <string>
#include <utility>
#include <vector>

#include "collectives/init.h"
#include "common/error.h"
#include "data/text.h"
#include "kernels/cpu/parallel.h"
#include "rpc/options.h"
#include "tensor/autograd.h"
#include "tensor/ops.h"

namespace weft::examples::gpt {

collectives::ProcessGroup* MeshJob::group(const std::string& name) const {
  return mesh && mesh->has(name) ? &mesh->group(name) : nullptr;
}

collectives::SpOptions MeshJob::spOptions() const { return spOptionsOf(ulysses.get(), ring.get()); }

std::vector<collectives::MeshDim> sequenceParallelDims(const Flags& f) {
  if (f.sp <= 1) return {};
  if (const int64_t u = f.spMode == "2d" ? ulyssesSize2d(f) : 0; u > 0) {
    return {{"ring", static_cast<int>(f.sp / u)}, {"ulysses", static_cast<int>(u)}};
  }
  return {{"sp", static_cast<int>(f.sp)}};
}

void makeSpGroups(const Flags& f, collectives::Mesh& mesh, std::unique_ptr<collectives::SpGroup>& ulysses,
                  std::unique_ptr<collectives::SpGroup>& ring) {
  if (mesh.has("ring") && mesh.has("ulysses")) {
    ring = std::make_unique<collectives::SpGroup>(mesh.group("ring"));
    ulysses = std::make_unique<collectives::SpGroup>(mesh.group("ulysses"));
  } else if (f.sp > 1) {
    auto g = std::make_unique<collectives::SpGroup>(mesh.group("sp"));
    (f.spMode == "ring" ? ring : ulysses) = std::move(g);
  }
}

collectives::SpOptions spOptionsOf(collectives::SpGroup* ulysses, collectives::SpGroup* ring) {
  collectives::SpOptions o;
  o.ulysses = ulysses;
  o.ring = ring;
  o.mode = ulysses && ring ? collectives::SpMode::Hybrid
                           : (ring ? collectives::SpMode::Ring : collectives::SpMode::Ulysses);
  o.layout = collectives::RingLayout::ZigZag;
  return o;
}

std::string describeSequenceParallel(const collectives::SpOptions& o) {
  return o.mode == collectives::SpMode::Hybrid ? "2-D sequence parallelism (Ulysses x zig-zag ring)"
         : o.mode == collectives::SpMode::Ring ? "ring attention (zig-zag)"
                                               : "Ulysses sequence parallelism";
}

std::unique_ptr<collectives::ProcessGroup> joinJob(int64_t processes, const std::string& what) {
  // Checked before joining: a rank that failed after the group connected would leave the others'
  // connections to a peer already gone.
  const rpc::Options place = rpc::Options::fromEnv();
  WEFT_ENFORCE(place.worldSize == processes, InvalidArgumentError, what, " needs a job of ", processes,
               " processes (weftrun -n ", processes, "), this one has ", place.worldSize);
  return collectives::init(place);
}

MeshJob makeMeshJob(const Flags& f) {
  MeshJob job;
  const int64_t want = f.dp * f.tp * f.sp;
  job.world = joinJob(want, "--dp " + std::to_string(f.dp) + " x --tp " + std::to_string(f.tp) + " x --sp " +
                                std::to_string(f.sp));
  std::vector<collectives::MeshDim> dims;
  auto add = [&](const char* name, int64_t size) {
    if (size > 1) dims.push_back({name, static_cast<int>(size)});
  };
  add("dp", f.dp);
  for (const collectives::MeshDim& d : sequenceParallelDims(f)) dims.push_back(d);
  add("tp", f.tp);
  job.mesh = std::make_unique<collectives::Mesh>(*job.world, std::move(dims));
  makeSpGroups(f, *job.mesh, job.ulysses, job.ring);
  return job;
}

double meanOverReplicas(const MeshJob& job, double loss) {
  collectives::ProcessGroup* dp = job.group("dp");
  if (dp == nullptr) return loss;
  Tensor t = full({1}, loss, {.dtype = DType::Float64});
  dp->allReduce(t, collectives::ReduceOp::Sum).wait();
  return t.item<double>() / static_cast<double>(dp->size());
}

std::string describeMesh(const MeshJob& job) {
  return "mesh " + job.mesh->describe() + " over " + std::to_string(job.world->size()) + " processes, " +
         std::to_string(kernels::cpu::numThreads()) + " kernel threads each";
}

std::string sampleText(nn::GPT& model, const std::string& prompt, int64_t tokens, double temperature, int64_t topK,
                       Generator& gen) {
  std::vector<int64_t> ids = data::ByteTokenizer::encode(prompt);
  Tensor idx = fromVector(ids, Shape{1, static_cast<int64_t>(ids.size())});
  model.eval();
  Tensor out = model.generate(idx, tokens, temperature, topK, &gen);
  model.train();
  return data::ByteTokenizer::decode(out.toVector<int64_t>());
}

std::unique_ptr<Layout> makeMeshLayout(const Flags& flags) {
  if (flags.tp > 1) return makeTensorParallelLayout(flags);
  if (flags.sp > 1) return makeSequenceParallelLayout(flags);
  return makeDataParallelLayout(flags);
}

}  // namespace weft::examples::gpt
