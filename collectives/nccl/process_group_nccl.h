// The nccl backend: the ProcessGroup of CUDA tensors, over NCCL, with the
// rendezvous of NCCL's unique id through weft's store. Built when weft is
// configured with CUDA and NCCL is found (the macro WEFT_HAVE_NCCL is then
// defined for users of weft::collectives); the gloo backend
// (gloo/process_group_gloo.h) serves CPU tensors. This header is the whole of
// its interface: createNcclGroup and NcclOptions; the group is used through
// ProcessGroup (collectives/process_group.h). Its internals live in
// collectives/nccl/detail/.
//
//   rpc::StoreClient store(rpc::StoreClient::configFor(opt));   // rank 0 serves the store
//   const int device = opt.effectiveLocalRank();
//   auto pg = collectives::createNcclGroup(store, opt.rank, opt.worldSize,
//                                          {.timeout = std::chrono::seconds(60), .device = device});
//   Tensor g = ones({1024}).to(Device::cuda(device));
//   pg->allReduce(g, ReduceOp::Avg).wait();                  // g now holds the average on every rank
//   std::vector<Tensor> parts;                               // allocated on the group's device
//   pg->allGather(parts, g).wait();
//
// Rendezvous. createNcclGroup is collective over the group's ranks: rank 0
// creates an ncclUniqueId and puts it (hex) under "weft/pg-nccl/<name>/id" in
// the store; the others read it from there. Each rank then builds the group's
// one NCCL communicator on its device, bounded by NcclOptions::timeout: a rank
// that never joins is a TimeoutError naming the ranks that have not posted
// "weft/pg-nccl/<name>/joined/<rank>". Sub-groups (newGroup) rendezvous the
// same way under "weft/pg-nccl/<name>/sub<k>[r0,r1,...]/" with a
// communicator of their own.
//
// Device. NcclOptions::device is the CUDA device of this rank (-1, the default:
// rank % the number of visible devices). Every tensor passed must be a
// contiguous tensor on that device; outputs allocated for the caller
// (allGather, gather) are put there too.
//
// Streams and synchronisation. weft issues its CUDA work on the default
// stream; the group owns a stream of its own (non-blocking: it never
// synchronises implicitly with the default stream). Each call records a CUDA
// event on the default stream of the group's device at the time of the call,
// and the op's NCCL kernels wait for that event on the group's stream: they
// see everything the caller issued before the call. A second event recorded
// after the op on the group's stream completes the Work. Callers see the
// results after Work::wait() (or once isCompleted() is true); until then
// they must neither read nor write the tensors passed, on the host or the
// device. The Work keeps the tensors alive until the op has finished.
//
// Ordering. Collectives and point-to-point transfers are launched, in the
// order of the calls, by the group's thread on the group's stream, so they
// run one after the other (a transfer does not overlap a collective, unlike
// in the gloo backend). Every rank issues its ops in a matching order: a
// send on one rank must meet its receive on the peer in the same position
// relative to the ops both ranks share, or both wait until the timeout.
//
// Point to point. NCCL has no tags: the tag must be 0 (InvalidArgumentError
// otherwise) and transfers between two ranks match in issue order. A receive
// names its one source; irecvFrom with several sources (and so irecvAny /
// recvAny in a group of more than two ranks) is an InvalidArgumentError:
// NCCL cannot receive from whichever rank sends first. A single-source
// irecvFrom is irecv.
//
// Operations. allReduce, reduce and reduceScatter reduce float32, float64,
// int64, float16 and bfloat16 (avg: floating dtypes; it is ncclAvg, or with an
// NCCL older than 2.10 a sum divided by size() on the host after the op).
// allToAll, gather and scatter are grouped ncclSend/ncclRecv calls (a rank's
// own chunk is a device copy); barrier is an allreduce of one element on the
// device. Ops of 0 bytes launch nothing and complete at once (in order).
//
// Errors. Bad arguments throw InvalidArgumentError at the call, naming the op
// and the argument, as the gloo backend does; a CPU tensor says to use the
// gloo backend. From Work::wait():
//  - TimeoutError: the op had not completed NcclOptions::timeout after it was
//    launched; names the op, its sequence number and the group. The
//    communicator is then aborted (ncclCommAbort) and the group is unusable.
//  - DisconnectedError / Error: NCCL reported an asynchronous error (a
//    remote rank failed, or an internal error); the communicator is aborted.
//  - StateError: the group is unusable after an earlier failure, or was
//    destroyed while the op was queued.
// Calls are not compared across ranks (no call checking as in gloo): ranks
// that call different collectives, or the same with different sizes, wait
// until the timeout or produce wrong results.
//
// Destruction. Destroying the group fails queued ops with StateError, waits
// (bounded by the timeout) for launched ones, then destroys the communicator
// (aborts it when an op did not finish).
//
// Verification. This backend is compiled and linked against NCCL in this
// project's CUDA builds; its tests (tests/collectives/process_group_nccl_gpu_test.cpp,
// a 1-rank group running every op) have not yet been run on a GPU here:
// without a device they skip.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "collectives/process_group.h"
#include "rpc/store.h"

namespace weft::collectives {

struct NcclOptions {
  // Bound of rendezvous and of each op from its launch; must be > 0.
  std::chrono::milliseconds timeout{std::chrono::minutes(30)};
  // Names the group in the store and in messages; unique among the nccl
  // groups built on one store ([A-Za-z0-9_.-], 1 to 64 characters).
  std::string name = "default";
  // This rank's CUDA device; -1: rank % the number of visible devices.
  int device = -1;
};

// This rank's group of `size` ranks, once every rank has joined (see
// "Rendezvous"). `store` must outlive the group. InvalidArgumentError for a
// bad rank, size or option; Error when no CUDA device is visible.
std::unique_ptr<ProcessGroup> createNcclGroup(rpc::StoreClient& store, int rank, int size, NcclOptions options = {});

}  // namespace weft::collectives
