// tessel/runtime/communicator.hpp — collectives over one axis group of the mesh.
//
// One Communicator per (device, axis group), like an ncclComm made by ncclCommSplit: the
// group's members are ranks 0..size-1 in Mesh::group order. Buffers are flat and
// rank-major, as in NCCL: all_gather writes rank r's block at offset r*bytes; reduce_scatter
// reduces block r of every member into rank r; all_to_all sends block j to rank j. Packing a
// tensor dim into rank-major blocks is the executor's job.
//
// Every call is collective: all members must call it in the same order. A failure on any
// device aborts the whole world; every member blocked in a call then throws RuntimeError
// instead of hanging.
#pragma once

#include <cstddef>
#include <cstdint>

#include "tessel/common.hpp"

namespace tessel {

enum class ReduceOp { Sum, Max };

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // recv: size * bytes. send may alias recv + rank*bytes (in place).
  virtual void all_gather(const void* send, void* recv, std::size_t bytes) = 0;
  // send: size * count elements; recv: count elements.
  virtual void reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype,
                              ReduceOp op) = 0;
  // send, recv: count elements; may alias (in place).
  virtual void all_reduce(const void* send, void* recv, std::size_t count, DType dtype,
                          ReduceOp op) = 0;
  // send, recv: size * bytes; block j of send goes to rank j, block i of recv comes from i.
  virtual void all_to_all(const void* send, void* recv, std::size_t bytes) = 0;
  // Every member sends `bytes` to rank send_to and receives from rank recv_from (-1: none).
  // The pattern must be consistent across members (a permutation, possibly partial).
  virtual void collective_permute(const void* send, int send_to, void* recv, int recv_from,
                                  std::size_t bytes) = 0;
  virtual void send(const void* buf, std::size_t bytes, int peer) = 0;
  virtual void recv(void* buf, std::size_t bytes, int peer) = 0;
  virtual void broadcast(void* buf, std::size_t bytes, int root) = 0;
  virtual void barrier() = 0;
};

}  // namespace tessel
