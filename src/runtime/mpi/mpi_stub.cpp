// MpiRuntime without MPI (TESSEL_WITH_MPI=OFF): the class exists so that code using it
// builds everywhere; constructing one throws, naming the build option.
#include "tessel/runtime/mpi/mpi_runtime.hpp"
#include "tessel/runtime/process_group.hpp"

#include "tessel/runtime/cpu/thread_runtime.hpp"

namespace tessel {

struct MpiRuntime::Impl {};

bool mpi_compiled() { return false; }

namespace {
[[noreturn]] void no_mpi() {
  throw RuntimeError("MpiRuntime: tessel was built without MPI (configure with -DTESSEL_WITH_MPI=ON where "
                     "find_package(MPI) finds it: apt-get install libopenmpi-dev openmpi-bin)");
}
}  // namespace

MpiRuntime::MpiRuntime(MpiRuntimeOptions) { no_mpi(); }
MpiRuntime::~MpiRuntime() = default;
int MpiRuntime::rank() const { no_mpi(); }
int MpiRuntime::world_size() const { no_mpi(); }
int MpiRuntime::local_rank() const { no_mpi(); }
double MpiRuntime::timeout_s() const { no_mpi(); }
bool MpiRuntime::failed() const { no_mpi(); }
std::string MpiRuntime::failure() const { no_mpi(); }
void MpiRuntime::abort(const std::string&) { no_mpi(); }
std::vector<int64_t> MpiRuntime::devices_for(const Mesh&) { no_mpi(); }
DeviceThreads& MpiRuntime::local() { no_mpi(); }
std::unique_ptr<CollectiveWorld> MpiRuntime::make_world(const Mesh&, const std::vector<std::vector<std::string>>&,
                                                        double) {
  no_mpi();
}
std::vector<HostTensor> MpiRuntime::allgather_shards(const Mesh&, std::vector<HostTensor>) { no_mpi(); }
std::vector<std::string> MpiRuntime::allgather_host(const std::string&) { no_mpi(); }

std::shared_ptr<ProcessGroup> mpi_process_group() {
  throw RuntimeError("mpi_process_group: tessel was built without MPI (configure with -DTESSEL_WITH_MPI=ON where "
                     "find_package(MPI) finds it), or launch with RANK, WORLD_SIZE and TESSEL_RENDEZVOUS_DIR set "
                     "for a file rendezvous instead");
}

std::shared_ptr<ProcessGroup> mpi_process_group(const std::vector<int>&, int) { return mpi_process_group(); }

void abort_job_on_error(int, double) {}  // no MPI: nothing to end but this process

}  // namespace tessel
