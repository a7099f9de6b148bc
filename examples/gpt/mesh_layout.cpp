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
#include "tensor/autograd.h"
#include "tensor/ops.h"

namespace weft::examples::gpt {

collectives::ProcessGroup* MeshJob::group(const std::string& name) const {
  return mesh && mesh->has(name) ? &mesh->group(name) : nullptr;
}

collectives::SpOptions MeshJob::spOptions() const {
  collectives::SpOptions o;
  o.ulysses = ulysses.get();
  o.ring = ring.get();
  o.mode = ulysses && ring ? collectives::SpMode::Hybrid
                           : (ring ? collectives::SpMode::Ring : collectives::SpMode::Ulysses);
  o.layout = collectives::RingLayout::ZigZag;
  return o;
}

MeshJob makeMeshJob(const Flags& f) {
  MeshJob job;
  job.world = collectives::init();
  const int64_t want = f.dp * f.tp * f.sp;
  WEFT_ENFORCE(job.world->size() == want, InvalidArgumentError, "--dp ", f.dp, " x --tp ", f.tp, " x --sp ",
               f.sp, " needs a job of ", want, " processes (weftrun -n ", want, "), this one has ",
               job.world->size());
  std::vector<collectives::MeshDim> dims;
  auto add = [&](const char* name, int64_t size) {
    if (size > 1) dims.push_back({name, static_cast<int>(size)});
  };
  add("dp", f.dp);
  const int64_t u = f.sp > 1 && f.spMode == "2d" ? ulyssesSize2d(f) : 0;
  if (u > 0) {
    add("ring", f.sp / u);
    add("ulysses", u);
  } else {
    add("sp", f.sp);
  }
  add("tp", f.tp);
  job.mesh = std::make_unique<collectives::Mesh>(*job.world, std::move(dims));
  if (u > 0) {
    job.ring = std::make_unique<collectives::SpGroup>(job.mesh->group("ring"));
    job.ulysses = std::make_unique<collectives::SpGroup>(job.mesh->group("ulysses"));
  } else if (f.sp > 1) {
    auto g = std::make_unique<collectives::SpGroup>(job.mesh->group("sp"));
    (f.spMode == "ring" ? job.ring : job.ulysses) = std::move(g);
  }
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
