// tessel/runtime/communicator.hpp — collectives over one axis group of the mesh, enqueued on
// a stream.
//
// One Communicator per (device, axis group), like an ncclComm made by ncclCommSplit: the
// group's members are ranks 0..size-1 in Mesh::group order. Buffers are flat and
// rank-major, as in NCCL: all_gather writes rank r's block at offset r*bytes; reduce_scatter
// reduces block r of every member into rank r; all_to_all sends block j to rank j. Packing a
// tensor dim into rank-major blocks is done by the caller with Backend::copy_block.
//
// Stream order (as NCCL): every call is *enqueued* on the given stream and runs when the
// stream reaches it; the pointers are device pointers (Buffer::data()) that must stay valid
// until then. The call returns at once on an asynchronous stream; errors surface from
// Stream::synchronize (or from the call itself on an eager stream). A communicator is used
// from one stream at a time, and every member must issue the same calls in the same order.
//
// group_start()/group_end() (ncclGroupStart/End): the calls in between are issued as one
// unit, so that sends and receives that would deadlock one by one (two members sending to
// each other first) complete: every send of the group is posted before any receive waits.
//
// abort(reason): fails every collective of the world this communicator belongs to, blocked
// or later, with a RuntimeError naming the reason (ncclCommAbort); used to cancel a run and
// to stop the other devices when one fails.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "tessel/core/common.hpp"

namespace tessel {

class Stream;

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // recv: size * bytes. send may alias recv + rank*bytes (in place).
  virtual void all_gather(const void* send, void* recv, std::size_t bytes, Stream& s) = 0;
  // send: size * count elements; recv: count elements.
  virtual void reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype,
                              ReduceOp op, Stream& s) = 0;
  // send, recv: count elements; may alias (in place).
  virtual void all_reduce(const void* send, void* recv, std::size_t count, DType dtype,
                          ReduceOp op, Stream& s) = 0;
  // send, recv: size * bytes; block j of send goes to rank j, block i of recv comes from i.
  virtual void all_to_all(const void* send, void* recv, std::size_t bytes, Stream& s) = 0;
  // Every member sends `bytes` to rank send_to and receives from rank recv_from (-1: none).
  // The pattern must be consistent across members (a permutation, possibly partial).
  virtual void collective_permute(const void* send, int send_to, void* recv, int recv_from,
                                  std::size_t bytes, Stream& s) = 0;
  virtual void send(const void* buf, std::size_t bytes, int peer, Stream& s) = 0;
  virtual void recv(void* buf, std::size_t bytes, int peer, Stream& s) = 0;
  virtual void broadcast(void* buf, std::size_t bytes, int root, Stream& s) = 0;
  virtual void barrier(Stream& s) = 0;

  // Calls between group_start and group_end are issued together (see above); groups do not
  // nest. group_end enqueues them on the stream of the calls (all on one stream).
  // Whether collective_permute calls between group_start and group_end run concurrently (on
  // separate links), so that the executor may issue the two permutes of a bidirectional ring
  // step as one group. False unless the communicator says so.
  virtual bool groups_permutes() const { return false; }
  virtual void group_start() = 0;
  virtual void group_end() = 0;
  // Fails every pending and later call of every member of this communicator's world.
  virtual void abort(const std::string& reason) = 0;
};

}  // namespace tessel
