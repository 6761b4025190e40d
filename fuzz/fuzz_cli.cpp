// fuzz/fuzz_cli.cpp — libFuzzer target for the example binaries' argument parsing
// (tessel/cli.hpp) and the --links format (CostModel::parse_links). The input is split at NUL
// bytes into argv[1..]. A UsageError is a fine answer; every other exception is a bug. Laws:
// a parsed tolerance is finite and >= 0, a parsed device >= 0, parsed links are finite with
// bw > 0 and alpha >= 0.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_util.hpp"
#include "tessel/cli.hpp"
#include "tessel/core/cost.hpp"

using tessel_fuzz::law_broken;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  if (size > 2048) return 0;
  std::vector<std::string> args(1);
  for (std::size_t i = 0; i < size; ++i) {
    if (data[i] == 0) args.emplace_back();
    else args.back() += static_cast<char>(data[i]);
  }
  try {
    const tessel::cli::ExplainOptions o = tessel::cli::parse_explain_args(args);
    if (!o.help) {
      if (!std::isfinite(o.tolerance) || o.tolerance < 0) law_broken("tolerance is finite and >= 0", "");
      if (o.device < 0) law_broken("device >= 0", "");
      if (o.file.empty()) law_broken("a FILE was given", "");
    }
  } catch (const tessel::UsageError&) {
  }
  // Every argument as a --links spec.
  for (const std::string& a : args) {
    tessel::CostModel cm;
    try {
      cm.parse_links(a);
    } catch (const tessel::Error&) {
      continue;
    }
    for (const auto& kv : cm.links)
      if (!std::isfinite(kv.second.bandwidth) || kv.second.bandwidth <= 0 ||
          !std::isfinite(kv.second.alpha_s) || kv.second.alpha_s < 0)
        law_broken("parsed links are finite with bw > 0 and alpha >= 0", a);
  }
  return 0;
}
