// tessel/runtime/launch.hpp — who this process is in a multi-process launch, and a
// shared-file rendezvous to exchange small blobs (e.g. an ncclUniqueId) without MPI.
//
// detect_launch() reads the environment only (no MPI call), in this order:
//   Open MPI      OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK / _LOCAL_SIZE   (source "mpi")
//   MPICH/PMI    PMI_RANK / PMI_SIZE, MPI_LOCALRANKID                        (source "mpi")
//   torchrun     RANK / WORLD_SIZE / LOCAL_RANK / LOCAL_WORLD_SIZE            (source "env")
//   nothing      rank 0 of 1                                                   (source "none")
// The MPI runtime takes rank and size from MPI itself; this is what a launcher-agnostic
// runtime (NCCL bootstrapped from torchrun-style variables) starts from.
//
// file_rendezvous(): every rank writes its payload to a file in a shared directory and
// reads everybody's; see docs/runtime-mpi.md ("Rendezvous file format") for the layout.
#pragma once

#include <string>
#include <vector>

namespace tessel {

struct LaunchInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;        // rank among the processes of this node
  int local_world_size = 1;  // processes of this node
  std::string source = "none";  // "mpi", "env" (torchrun style) or "none"
  bool multi_process() const { return world_size > 1; }
};

// From the environment (above). Throws RuntimeError naming the variable when one is set but
// malformed or inconsistent (rank outside [0, world size)).
LaunchInfo detect_launch();
// True when an MPI launcher (mpirun / mpiexec / srun with PMI) started this process.
bool launched_by_mpi();

// Every rank publishes `payload` under <dir>/<key>/ and gets every rank's payload, in rank
// order. Waits up to timeout_s for the other ranks' files (RuntimeError naming the ranks
// still missing and the directory otherwise); a file written for another world size is an
// error naming it (a stale key: use a fresh key per job, e.g. the launcher's job id).
// `dir` empty: $TESSEL_RENDEZVOUS_DIR. The files are left in place (removing them is the
// launcher's job: a rank cannot know when the slowest one has read them).
std::vector<std::string> file_rendezvous(const std::string& dir, const std::string& key, int rank, int world_size,
                                         const std::string& payload, double timeout_s = 300);

}  // namespace tessel
