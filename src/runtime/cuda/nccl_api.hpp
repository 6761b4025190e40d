// src/runtime/cuda/nccl_api.hpp — the NCCL entry points the NCCL world calls, as a table
// (issue 22, "GPU readiness").
//
// The world (nccl_world.hpp, nccl_world.cpp) never calls an nccl* function directly: it calls
// an NcclApi. The default one, real_nccl_api() (nccl_api.cpp, built with TESSEL_WITH_NCCL), is
// NCCL itself; the unit tests give the world a recording fake on host memory
// (tests/unit/nccl_fake.hpp) that checks what only a multi-GPU run would otherwise show: group
// balance, send/recv pairing, in-place pointers, split colours and keys, no call after an abort.
//
// Host types only (NCCL's handles as void*, its data types and reduction ops as enums, its
// result codes as int): this header includes neither NCCL nor CUDA, so the world's host logic
// and the fake compile and run in every build, a machine without a GPU included.
#pragma once

#include <cstddef>

namespace tessel::cuda {

using NcclComm = void*;    // ncclComm_t
using NcclStream = void*;  // cudaStream_t
enum class NcclType { u8, i32, f16, bf16, f32 };
enum class NcclRedOp { sum, max };

// Values of ncclResult_t used by the world (nccl_api.cpp checks them against nccl.h).
inline constexpr int kNcclSuccess = 0;
inline constexpr int kNcclInvalidUsage = 5;
inline constexpr int kNcclRemoteError = 6;
inline constexpr int kNcclInProgress = 7;
// sizeof(ncclUniqueId::internal) (checked in nccl_api.cpp).
inline constexpr std::size_t kNcclUniqueIdBytes = 128;

std::size_t nccl_type_size(NcclType t);
const char* nccl_type_name(NcclType t);

// One method per NCCL function, with NCCL's arguments and result (an ncclResult_t). Counts are
// in elements of the type, as in NCCL.
class NcclApi {
 public:
  virtual ~NcclApi() = default;
  virtual const char* error_string(int result) = 0;                          // ncclGetErrorString
  virtual int get_unique_id(char* id) = 0;                                   // ncclGetUniqueId (kNcclUniqueIdBytes)
  virtual int comm_init_all(NcclComm* comms, int n, const int* devices) = 0;  // ncclCommInitAll
  // ncclCommInitRank with GPU `device` current for the call.
  virtual int comm_init_rank(NcclComm* comm, int nranks, const char* id, int rank, int device) = 0;
  virtual int comm_split(NcclComm comm, int color, int key, NcclComm* out) = 0;  // ncclCommSplit, no config
  virtual int comm_abort(NcclComm comm) = 0;                                     // ncclCommAbort
  virtual int comm_get_async_error(NcclComm comm, int* async_error) = 0;         // ncclCommGetAsyncError
  virtual int group_start() = 0;                                                 // ncclGroupStart
  virtual int group_end() = 0;                                                   // ncclGroupEnd
  // recv: nranks * count elements; in place when send == recv + rank * count.
  virtual int all_gather(const void* send, void* recv, std::size_t count, NcclType t, NcclComm comm,
                         NcclStream stream) = 0;
  // send: nranks * recv_count elements; in place when recv == send + rank * recv_count.
  virtual int reduce_scatter(const void* send, void* recv, std::size_t recv_count, NcclType t, NcclRedOp op,
                             NcclComm comm, NcclStream stream) = 0;
  virtual int all_reduce(const void* send, void* recv, std::size_t count, NcclType t, NcclRedOp op, NcclComm comm,
                         NcclStream stream) = 0;
  virtual int broadcast(const void* send, void* recv, std::size_t count, NcclType t, int root, NcclComm comm,
                        NcclStream stream) = 0;
  virtual int send(const void* buf, std::size_t count, NcclType t, int peer, NcclComm comm, NcclStream stream) = 0;
  virtual int recv(void* buf, std::size_t count, NcclType t, int peer, NcclComm comm, NcclStream stream) = 0;
};

// NCCL itself (stateless). Defined only in builds with TESSEL_WITH_NCCL (nccl_api.cpp).
NcclApi& real_nccl_api();

}  // namespace tessel::cuda
