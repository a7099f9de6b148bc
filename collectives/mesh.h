// Mesh: the ranks of a process group arranged as named dimensions, the one
// description of a parallel layout that every parallel wrapper reads
// (tensor parallelism, collectives/tensor_parallel.h; DDP over the "dp"
// dimension's group).
//
//   auto world = collectives::init();                       // 4 processes
//   collectives::Mesh mesh(*world, {{"dp", 2}, {"tp", 2}});  // collective: every rank calls it alike
//   int dp = mesh.coordinate("dp");                        // this rank's place along "dp"
//   collectives::ProcessGroup& tp = mesh.group("tp");     // the ranks that differ only in "tp"
//   mesh.rankAt({1, 0});                                   // the world rank at dp 1, tp 0
//
// Layout. Ranks are laid out in row-major order over the dimensions as
// given, the last dimension varying fastest (PyTorch's DeviceMesh over
// arange(world).view(sizes)): with {{"dp", 2}, {"tp", 2}}, world ranks 0 and
// 1 form the tp group of dp 0, ranks 0 and 2 the dp group of tp 0. Listing
// the dimensions in another order is another layout: the innermost
// dimension's groups are the ranks with neighbouring numbers (a node's, under
// weftrun), which is where the dimension with the most traffic (tp) belongs.
//
// Construction is collective over `world`: every rank of it constructs a Mesh
// with the same dimensions, in the same order relative to its other
// collectives. The ranks first exchange their descriptions (one
// allGatherObject), so that a mismatch fails every rank alike, then create
// one sub-group per dimension and coordinate (world.newGroup, each rank
// calling it for every group in the same order) and keep the ones they
// belong to. A dimension of size 1 has a group of this rank alone.
//
// Errors (thrown by the constructor, on every rank alike):
//  - InvalidArgumentError when the ranks passed different meshes, naming
//    both ("Mesh: rank 0 passed {dp: 2, tp: 2}, rank 3 passed {tp: 2, dp:
//    2}"); for no dimensions, an empty or repeated name, a size below 1, or
//    sizes whose product is not the world's size (naming the mesh and the
//    world size);
//  - those of the world's collectives and newGroup (TimeoutError naming the
//    ranks that did not construct the mesh, DisconnectedError, StateError).
// The accessors throw NotFoundError for a dimension name the mesh does not
// have (naming it and the mesh); rankAt throws InvalidArgumentError for
// coordinates of the wrong length and IndexError for one out of range.
//
// Lifetimes and threads: `world` must outlive the Mesh; the groups belong to
// it. A Mesh is immutable after construction; its groups obey
// process_group.h (issue each group's collectives from one thread).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "collectives/process_group.h"

namespace weft::collectives {

struct MeshDim {
  std::string name;
  int size = 1;
};

class Mesh {
 public:
  Mesh(ProcessGroup& world, std::vector<MeshDim> dims);
  ~Mesh();
  Mesh(const Mesh&) = delete;
  Mesh& operator=(const Mesh&) = delete;

  ProcessGroup& world() const { return world_; }
  const std::vector<MeshDim>& dims() const { return dims_; }
  int ndim() const { return static_cast<int>(dims_.size()); }
  // The index of dimension `name` in dims().
  int dimIndex(const std::string& name) const;
  bool has(const std::string& name) const;
  int size(const std::string& name) const;
  // This rank's coordinate along `name`, in [0, size(name)).
  int coordinate(const std::string& name) const;
  // This rank's coordinates, one per dimension, in dims() order.
  const std::vector<int>& coordinates() const { return coordinates_; }
  // The world rank at `coordinates` (one per dimension, in dims() order).
  int rankAt(const std::vector<int>& coordinates) const;
  // The group of the ranks that share this rank's coordinates in every other
  // dimension; its rank i is the one at coordinate i along `name`.
  ProcessGroup& group(const std::string& name) const;
  // The world ranks of group(name), in its rank order.
  std::vector<int> groupRanks(const std::string& name) const;
  // "{dp: 2, tp: 2}".
  std::string describe() const;
  static std::string describe(const std::vector<MeshDim>& dims);

 private:
  ProcessGroup& world_;
  std::vector<MeshDim> dims_;
  std::vector<int> coordinates_;
  std::vector<std::unique_ptr<ProcessGroup>> groups_;  // one per dimension
};

}  // namespace weft::collectives
