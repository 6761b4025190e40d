// tessel/ir/program_text.hpp — the text form of a Program (docs/program-ir.md): a printer and a
// parser that round-trip, so Program→Program passes have golden tests written as text.
//
//   mesh model=2
//   %x = input f32[4,8] global=f32[4,16] sharding=[{}, {model}]
//   %x.pack = copy(%x) block=[4,4] copies=[[0,0]->[0,0], [0,4]->[4,0]] : f32[8,4] ... @compute at=0
//   wait compute @comm
//   %y = all_to_all_start(%x.pack) axes={model} split_dim=0 concat_dim=0 bytes=128 : ... @comm at=128
//   done %y @comm
//   wait comm @compute
//   output %y
//   memory arena=256
//
// Law (tested): print_program(parse_program(print_program(p))) == print_program(p).
// Every mistake throws ParseError "file:line:col: message" with the line and a caret; after
// parsing, the verifier (program_verify.hpp) runs and its first error is reported at the line
// of the instruction it names.
#pragma once

#include <string>
#include <string_view>

#include "tessel/ir/program.hpp"

namespace tessel {

// The canonical text of the program (every instruction, its stream, types, shardings, and
// the memory plan when there is one).
std::string print_program(const Program& p);

struct ProgramParseOptions {
  bool verify = true;  // run verify_program on the result (errors at the instruction's line)
};

Program parse_program(std::string_view text, std::string_view filename = "<input>",
                      const ProgramParseOptions& options = {});
// Reads and parses a file; throws ParseError when it cannot be read.
Program parse_program_file(const std::string& path, const ProgramParseOptions& options = {});

}  // namespace tessel
