// The real NCCL behind the world's table of entry points (nccl_api.hpp): each method is the NCCL
// function of its name, with tessel's host types converted to NCCL's. Built with
// TESSEL_WITH_NCCL only (without it, make_nccl_world throws before any table is needed).
#ifdef TESSEL_HAVE_NCCL
#include "nccl_api.hpp"

#include <nccl.h>

#include <cstring>

#include "cuda_backend.hpp"

namespace tessel::cuda {
namespace {

static_assert(kNcclSuccess == ncclSuccess && kNcclInvalidUsage == ncclInvalidUsage &&
              kNcclRemoteError == ncclRemoteError && kNcclInProgress == ncclInProgress);
static_assert(kNcclUniqueIdBytes == sizeof(ncclUniqueId::internal));

ncclDataType_t to_nccl(NcclType t) {
  switch (t) {
    case NcclType::u8: return ncclUint8;
    case NcclType::i32: return ncclInt32;
    case NcclType::f16: return ncclFloat16;
    case NcclType::bf16: return ncclBfloat16;
    case NcclType::f32: return ncclFloat32;
  }
  return ncclUint8;
}
ncclRedOp_t to_nccl(NcclRedOp op) { return op == NcclRedOp::max ? ncclMax : ncclSum; }
ncclComm_t comm_of(NcclComm c) { return static_cast<ncclComm_t>(c); }
cudaStream_t stream_of(NcclStream s) { return static_cast<cudaStream_t>(s); }

class RealNccl final : public NcclApi {
 public:
  const char* error_string(int r) override { return ncclGetErrorString(static_cast<ncclResult_t>(r)); }
  int get_unique_id(char* id) override {
    ncclUniqueId u;
    const ncclResult_t r = ncclGetUniqueId(&u);
    std::memcpy(id, u.internal, sizeof(u.internal));
    return r;
  }
  int comm_init_all(NcclComm* comms, int n, const int* devices) override {
    static_assert(sizeof(NcclComm) == sizeof(ncclComm_t));
    return ncclCommInitAll(reinterpret_cast<ncclComm_t*>(comms), n, devices);
  }
  int comm_init_rank(NcclComm* comm, int nranks, const char* id, int rank, int device) override {
    ncclUniqueId u;
    std::memcpy(u.internal, id, sizeof(u.internal));
    DeviceGuard g(device);
    return ncclCommInitRank(reinterpret_cast<ncclComm_t*>(comm), nranks, u, rank);
  }
  int comm_split(NcclComm comm, int color, int key, NcclComm* out) override {
    return ncclCommSplit(comm_of(comm), color, key, reinterpret_cast<ncclComm_t*>(out), nullptr);
  }
  int comm_abort(NcclComm comm) override { return ncclCommAbort(comm_of(comm)); }
  int comm_get_async_error(NcclComm comm, int* async_error) override {
    ncclResult_t a = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(comm_of(comm), &a);
    *async_error = a;
    return r;
  }
  int group_start() override { return ncclGroupStart(); }
  int group_end() override { return ncclGroupEnd(); }
  int all_gather(const void* send, void* recv, std::size_t count, NcclType t, NcclComm comm, NcclStream s) override {
    return ncclAllGather(send, recv, count, to_nccl(t), comm_of(comm), stream_of(s));
  }
  int reduce_scatter(const void* send, void* recv, std::size_t recv_count, NcclType t, NcclRedOp op, NcclComm comm,
                     NcclStream s) override {
    return ncclReduceScatter(send, recv, recv_count, to_nccl(t), to_nccl(op), comm_of(comm), stream_of(s));
  }
  int all_reduce(const void* send, void* recv, std::size_t count, NcclType t, NcclRedOp op, NcclComm comm,
                 NcclStream s) override {
    return ncclAllReduce(send, recv, count, to_nccl(t), to_nccl(op), comm_of(comm), stream_of(s));
  }
  int broadcast(const void* send, void* recv, std::size_t count, NcclType t, int root, NcclComm comm,
                NcclStream s) override {
    return ncclBroadcast(send, recv, count, to_nccl(t), root, comm_of(comm), stream_of(s));
  }
  int send(const void* buf, std::size_t count, NcclType t, int peer, NcclComm comm, NcclStream s) override {
    return ncclSend(buf, count, to_nccl(t), peer, comm_of(comm), stream_of(s));
  }
  int recv(void* buf, std::size_t count, NcclType t, int peer, NcclComm comm, NcclStream s) override {
    return ncclRecv(buf, count, to_nccl(t), peer, comm_of(comm), stream_of(s));
  }
};

}  // namespace

NcclApi& real_nccl_api() {
  static RealNccl api;  // stateless
  return api;
}

}  // namespace tessel::cuda
#endif
