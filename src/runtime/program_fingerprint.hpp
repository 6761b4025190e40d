// program_fingerprint.hpp (private) — SPMD needs the same program and mesh on every process.
// At load each process tells the others what it loaded (check_same_program): tessel's version,
// the mesh, every input and output (name, global type, sharding) and a hash of the whole
// lowered program's text. A mismatch is refused on every process, naming the ranks and the
// first line that differs, before any communicator is split: otherwise ranks with different
// programs deadlock in a split or exchange buffers of different sizes.
#pragma once

#include <string>

#include "tessel/core/mesh.hpp"
#include "tessel/ir/program.hpp"
#include "tessel/runtime/runtime.hpp"

namespace tessel::detail {

// One line per fact, in a fixed order (so two fingerprints compare line by line).
std::string program_fingerprint(const Mesh& mesh, const Program& lowered);
// Exchanges fingerprints (Runtime::allgather_host: the runtime's deadline, naming a process
// that does not come) and throws RuntimeError on every process when one differs from rank 0's.
// A single-process runtime checks nothing.
void check_same_program(Runtime& rt, const Mesh& mesh, const Program& lowered);

}  // namespace tessel::detail
