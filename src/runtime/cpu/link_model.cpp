// link_model.cpp — LinkModel (thread_communicator.hpp): the simulated interconnect's
// settings, read from "alpha_us=5,gbps=10" (TESSEL_LINK_MODEL) with errors that name the bad
// entry.
#include "tessel/runtime/cpu/thread_communicator.hpp"

#include <fmt/format.h>

#include <cmath>
#include <cstdlib>
#include <string>

namespace tessel {

LinkModel LinkModel::parse(const std::string& spec) {
  LinkModel m;
  std::size_t b = 0;
  bool bw = false;
  while (b < spec.size()) {
    std::size_t e = spec.find(',', b);
    const std::string part = spec.substr(b, e == std::string::npos ? std::string::npos : e - b);
    b = e == std::string::npos ? spec.size() : e + 1;
    const auto eq = part.find('=');
    const std::string key = part.substr(0, eq);
    char* end = nullptr;
    const std::string text = eq == std::string::npos ? std::string() : part.substr(eq + 1);
    const double v = text.empty() ? NAN : std::strtod(text.c_str(), &end);
    if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(v) || v < 0 || (key != "alpha_us" && key != "gbps"))
      throw RuntimeError(fmt::format("link model '{}': bad entry '{}' (expected alpha_us=MICROSECONDS,gbps=GB_PER_S, "
                                     "e.g. alpha_us=5,gbps=10)", spec, part));
    if (key == "alpha_us") m.alpha_s = v * 1e-6;
    else {
      if (v <= 0) throw RuntimeError(fmt::format("link model '{}': gbps must be > 0", spec));
      m.bandwidth = v * 1e9;
      bw = true;
    }
  }
  if (!spec.empty() && !bw) throw RuntimeError(fmt::format("link model '{}': gbps= is missing", spec));
  return m;
}

LinkModel LinkModel::from_env() {
  const char* e = std::getenv("TESSEL_LINK_MODEL");
  if (!e || !*e) return {};
  try {
    return parse(e);
  } catch (const RuntimeError& err) {
    throw RuntimeError(fmt::format("TESSEL_LINK_MODEL: {}", err.what()));
  }
}

}  // namespace tessel
