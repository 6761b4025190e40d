// tessel/ir/program_verify.hpp — the invariants of a Program (IR v2), checked: what every pass
// must preserve and what the executor relies on.
//
//   - every value is defined once, before it is used; outputs are defined;
//   - a started collective is read only after its done (on the stream that started it), every
//     start has exactly one done and every done a start;
//   - stream discipline: a value made ready on stream T is read on stream S != T only after a
//     `wait T @S` placed after it (events are the only edges between streams);
//   - shapes and dtypes: kernels agree with the op registry's shape functions on local shapes,
//     collectives with their axis group, copies and views stay within their operands, and
//     each value's local shape is its global shape under its sharding;
//   - the memory plan: every planned value inside the arena, and two values whose bytes
//     overlap are never live at once (liveness counts a buffer as busy on a stream until the
//     other streams have waited past its last use there).
//
// Errors are ProgramError naming the instruction (#index and the value it defines).
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "tessel/core/common.hpp"
#include "tessel/ir/program.hpp"

namespace tessel {

class ProgramError : public Error {
 public:
  ProgramError(int instr, const std::string& msg) : Error(msg), instr_(instr) {}
  int instruction() const { return instr_; }  // -1: not about one instruction

 private:
  int instr_;
};

void verify_program(const Program& p);

// "#7 (%h = einsum)", for messages.
std::string describe_instr(const Program& p, int i);

// Liveness of every value's storage, for the memory plan and its check. A value is defined at
// `first` (-1: inputs) on `def_stream`, and its storage is accessed on each stream up to an
// index (a started collective uses its operand and result until its done; views count as
// their source). `last` is the latest access (instrs.size() for outputs).
//
// Two values may share bytes when the later one's definition comes after every access of the
// earlier one, and, for an access on another stream than the one the later value is written
// on, a `wait <that stream> @<its stream>` lies between the access and the definition: the
// writer is ordered after every use of the old contents (write-after-read across streams).
struct Liveness {
  std::vector<int> first, last;
  std::vector<int> root;  // per value: the value whose storage it uses (itself unless a view)
  std::vector<std::string> def_stream;                          // per root
  std::vector<std::vector<std::pair<std::string, int>>> access;  // per root: (stream, last index)
  std::map<std::pair<std::string, std::string>, std::vector<int>> waits;  // (waiting, waited) -> indices
  bool may_share(int a, int b) const;
};
Liveness compute_liveness(const Program& p);

}  // namespace tessel
