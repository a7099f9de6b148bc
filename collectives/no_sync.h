// The guard that DistributedDataParallel::noSync(),
// ShardedDataParallel::noSync() and FullyShardedDataParallel::noSync() return
// (each class names it NoSyncGuard): gradient synchronisation stays off for
// its lifetime, and its end restores the setting it found (so guards nest).
// Movable, not copyable; a moved-from guard restores nothing.
//
//   {
//     auto pause = ddp.noSync();   // DistributedDataParallel::NoSyncGuard
//     loss(ddp.forward(x0)).backward();
//   }                              // synchronisation as it was before
#pragma once

#include <utility>

namespace weft::collectives {

// Owner: a class with a private `void setSync(bool)` that befriends this
// template and makes guards in its noSync().
template <class Owner>
class NoSyncScope {
 public:
  ~NoSyncScope() {
    if (owner_ != nullptr) owner_->setSync(previous_);
  }
  NoSyncScope(NoSyncScope&& other) noexcept
      : owner_(std::exchange(other.owner_, nullptr)), previous_(other.previous_) {}
  NoSyncScope(const NoSyncScope&) = delete;
  NoSyncScope& operator=(const NoSyncScope&) = delete;
  NoSyncScope& operator=(NoSyncScope&&) = delete;

 private:
  friend Owner;
  NoSyncScope(Owner* owner, bool previous) : owner_(owner), previous_(previous) {}
  Owner* owner_;
  bool previous_;
};

}  // namespace weft::collectives
