// fuzz/fuzz_program_text.cpp — libFuzzer target for the Program text form (docs/program-ir.md).
// Input: program text. Laws checked on every input that parses (and so verifies):
//   * print(parse(print(p))) == print(p), and the re-parsed program verifies again;
//   * a partitioner-form program (no streams, starts or waits yet) lowers through the default
//     pipeline to a program that verifies and round-trips too.
// Errors (tessel::Error: parse errors and verifier errors) are fine answers; anything else —
// another exception, a crash, a sanitizer report — is a bug.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_util.hpp"
#include "tessel/passes/program_passes.hpp"
#include "tessel/ir/program_text.hpp"
#include "tessel/ir/program_verify.hpp"

using tessel_fuzz::law_broken;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  if (size > 8192) return 0;
  const std::string text(reinterpret_cast<const char*>(data), size);
  tessel::Program p;
  try {
    p = tessel::parse_program(text, "fuzz.pir");
  } catch (const tessel::Error&) {
    return 0;
  }
  // Bound the work: the shapes of a parsed program may be huge; the laws are structural.
  const std::string once = tessel::print_program(p);
  tessel::Program back;
  try {
    back = tessel::parse_program(once, "printed.pir");
  } catch (const tessel::Error& e) {
    law_broken("a printed program parses", std::string(e.what()) + "\n" + once);
  }
  if (tessel::print_program(back) != once) law_broken("print(parse(print(p))) == print(p)", once);
  bool lowerable = true;
  for (const tessel::Instr& in : p.instrs)
    if (in.kind == tessel::InstrKind::CollectiveStart || in.kind == tessel::InstrKind::CollectiveDone ||
        in.kind == tessel::InstrKind::Wait || in.kind == tessel::InstrKind::Copy ||
        in.kind == tessel::InstrKind::View || in.stream != "compute")
      lowerable = false;
  if (p.memory.planned) lowerable = false;
  if (lowerable) {
    try {
      tessel::Program low = tessel::lower_program(p, /*verify=*/true);
      const std::string lt = tessel::print_program(low);
      if (tessel::print_program(tessel::parse_program(lt, "lowered.pir")) != lt)
        law_broken("a lowered program round-trips", lt);
    } catch (const tessel::Error&) {
      // A pass may refuse a program it cannot lower (e.g. no ring for a permute): fine.
    }
  }
  return 0;
}
