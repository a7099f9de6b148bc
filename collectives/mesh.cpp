#include "collectives/mesh.h"

#include <set>
#include <utility>

#include "collectives/object_collectives.h"
#include "common/error.h"

namespace weft::collectives {

namespace {

// Checks a mesh every rank agreed on: names, sizes, product.
void checkDims(const std::vector<MeshDim>& dims, int worldSize) {
  const std::string mesh = Mesh::describe(dims);
  WEFT_ENFORCE(!dims.empty(), InvalidArgumentError, "Mesh: at least one dimension is needed");
  std::set<std::string> seen;
  long long product = 1;
  for (const MeshDim& d : dims) {
    WEFT_ENFORCE(!d.name.empty(), InvalidArgumentError, "Mesh ", mesh, ": a dimension has an empty name");
    WEFT_ENFORCE(seen.insert(d.name).second, InvalidArgumentError, "Mesh ", mesh, ": dimension '", d.name,
                 "' appears twice");
    WEFT_ENFORCE(d.size >= 1, InvalidArgumentError, "Mesh ", mesh, ": dimension '", d.name,
                 "' must have a size of at least 1, got ", d.size);
    product *= d.size;
    WEFT_ENFORCE(product <= worldSize, InvalidArgumentError, "Mesh ", mesh,
                 ": the sizes multiply past the world size ", worldSize);
  }
  WEFT_ENFORCE(product == worldSize, InvalidArgumentError, "Mesh ", mesh, ": the sizes multiply to ", product,
               ", but the world has ", worldSize, " ranks");
}

}  // namespace

std::string Mesh::describe(const std::vector<MeshDim>& dims) {
  std::string s = "{";
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i) s += ", ";
    s += dims[i].name + ": " + std::to_string(dims[i].size);
  }
  return s + "}";
}

std::string Mesh::describe() const { return describe(dims_); }

Mesh::Mesh(ProcessGroup& world, std::vector<MeshDim> dims) : world_(world), dims_(std::move(dims)) {
  // Agree first, so that a rank with another mesh fails every rank alike
  // instead of leaving the others waiting in newGroup.
  const std::string mine = describe(dims_);
  const std::vector<std::string> all = allGatherObject(world_, mine);
  for (int r = 0; r < world_.size(); ++r) {
    const std::string& theirs = all[static_cast<size_t>(r)];
    WEFT_ENFORCE(theirs == all[0], InvalidArgumentError, "Mesh: the ranks passed different meshes: rank 0 passed ",
                 all[0], ", rank ", r, " passed ", theirs);
  }
  checkDims(dims_, world_.size());

  const int n = ndim();
  coordinates_.assign(static_cast<size_t>(n), 0);
  int rest = world_.rank();
  for (int d = n - 1; d >= 0; --d) {
    coordinates_[static_cast<size_t>(d)] = rest % dims_[static_cast<size_t>(d)].size;
    rest /= dims_[static_cast<size_t>(d)].size;
  }
  // For each dimension, every group along it in the order of the world rank
  // of its first member: the same newGroup sequence on every rank.
  groups_.resize(static_cast<size_t>(n));
  for (int d = 0; d < n; ++d) {
    const int size = dims_[static_cast<size_t>(d)].size;
    for (int first = 0; first < world_.size(); ++first) {
      std::vector<int> c(static_cast<size_t>(n), 0);
      int r = first;
      for (int e = n - 1; e >= 0; --e) {
        c[static_cast<size_t>(e)] = r % dims_[static_cast<size_t>(e)].size;
        r /= dims_[static_cast<size_t>(e)].size;
      }
      if (c[static_cast<size_t>(d)] != 0) continue;
      std::vector<int> ranks;
      for (int i = 0; i < size; ++i) {
        c[static_cast<size_t>(d)] = i;
        ranks.push_back(rankAt(c));
      }
      auto g = world_.newGroup(ranks);
      if (g) groups_[static_cast<size_t>(d)] = std::move(g);
    }
    WEFT_CHECK(groups_[static_cast<size_t>(d)] != nullptr) << "Mesh: no group along " << dims_[static_cast<size_t>(d)].name;
  }
}

Mesh::~Mesh() = default;

int Mesh::dimIndex(const std::string& name) const {
  for (size_t i = 0; i < dims_.size(); ++i) {
    if (dims_[i].name == name) return static_cast<int>(i);
  }
  throw NotFoundError("Mesh " + describe() + ": no dimension named '" + name + "'");
}

bool Mesh::has(const std::string& name) const {
  for (const MeshDim& d : dims_) {
    if (d.name == name) return true;
  }
  return false;
}

int Mesh::size(const std::string& name) const { return dims_[static_cast<size_t>(dimIndex(name))].size; }

int Mesh::coordinate(const std::string& name) const { return coordinates_[static_cast<size_t>(dimIndex(name))]; }

int Mesh::rankAt(const std::vector<int>& coordinates) const {
  WEFT_ENFORCE(coordinates.size() == dims_.size(), InvalidArgumentError, "Mesh ", describe(), ": rankAt takes ",
               dims_.size(), " coordinates, got ", coordinates.size());
  int rank = 0;
  for (size_t d = 0; d < dims_.size(); ++d) {
    WEFT_ENFORCE(coordinates[d] >= 0 && coordinates[d] < dims_[d].size, IndexError, "Mesh ", describe(),
                 ": coordinate ", coordinates[d], " along '", dims_[d].name, "' is outside [0, ", dims_[d].size, ")");
    rank = rank * dims_[d].size + coordinates[d];
  }
  return rank;
}

ProcessGroup& Mesh::group(const std::string& name) const { return *groups_[static_cast<size_t>(dimIndex(name))]; }

std::vector<int> Mesh::groupRanks(const std::string& name) const {
  const int d = dimIndex(name);
  std::vector<int> c = coordinates_;
  std::vector<int> ranks;
  for (int i = 0; i < dims_[static_cast<size_t>(d)].size; ++i) {
    c[static_cast<size_t>(d)] = i;
    ranks.push_back(rankAt(c));
  }
  return ranks;
}

}  // namespace weft::collectives
