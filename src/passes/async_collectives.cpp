// src/passes/async_collectives.cpp — the async-collectives pass (program_passes.hpp): each
// collective becomes a start on the `comm` stream and a done just before its first reader, with
// the waits where values cross streams, so communication overlaps the compute between them.
#include "tessel/passes/program_passes.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <set>

namespace tessel {

Program async_collectives_pass(Program prog) {
  Program& p = prog;
  const std::string comm = "comm";
  std::vector<Instr> out;
  out.reserve(p.instrs.size() + p.instrs.size() / 2);
  const std::size_t nv = p.values.size();
  std::vector<std::string> ready_on(nv);
  std::vector<int> ready_at(nv, -1);
  std::vector<bool> pending(nv, false);
  // Values in flight: start order -> value (a done anywhere, and the ones never read done at
  // the end in start order, each in O(log n)).
  std::map<int, int> started;
  std::vector<int> started_as(nv, -1);  // value -> its key in `started`
  std::map<std::pair<std::string, std::string>, int> synced;  // (waiting, waited) -> index
  std::map<std::string, int> last_on;                          // stream -> last instruction on it
  auto emit = [&](Instr in) {
    last_on[in.stream] = static_cast<int>(out.size());
    out.push_back(std::move(in));
  };
  auto wait = [&](const std::string& waited, const std::string& waiting) {
    auto it = last_on.find(waited);
    if (it == last_on.end()) return;
    auto s = synced.find({waiting, waited});
    if (s != synced.end() && s->second > it->second) return;  // nothing new on `waited`
    Instr w;
    w.kind = InstrKind::Wait;
    w.stream = waiting;
    w.wait_for = waited;
    synced[{waiting, waited}] = static_cast<int>(out.size());
    emit(std::move(w));
  };
  auto done = [&](int v) {
    Instr d;
    d.kind = InstrKind::CollectiveDone;
    d.stream = comm;
    d.in = {v};
    d.out = -1;
    pending[static_cast<std::size_t>(v)] = false;
    started.erase(started_as[static_cast<std::size_t>(v)]);
    ready_on[static_cast<std::size_t>(v)] = comm;
    ready_at[static_cast<std::size_t>(v)] = static_cast<int>(out.size());
    emit(std::move(d));
  };
  auto ready_for = [&](const Instr& in) {
    for (int v : in.in)
      if (pending[static_cast<std::size_t>(v)]) done(v);
    for (int v : in.in) {
      const std::string& t = ready_on[static_cast<std::size_t>(v)];
      if (t.empty() || t == in.stream) continue;
      auto s = synced.find({in.stream, t});
      if (s == synced.end() || s->second < ready_at[static_cast<std::size_t>(v)]) wait(t, in.stream);
    }
  };
  for (Instr& next : p.instrs) {
    Instr in = std::move(next);  // p.instrs is replaced by `out` at the end
    if (in.kind == InstrKind::Collective) {
      in.kind = InstrKind::CollectiveStart;
      in.stream = comm;
      // The collective sees (and may overwrite storage freed by) everything before it.
      for (const auto& [s, i] : last_on)
        if (s != comm) wait(s, comm);
      ready_for(in);
      const int o = in.out;
      emit(std::move(in));
      pending[static_cast<std::size_t>(o)] = true;
      started_as[static_cast<std::size_t>(o)] = static_cast<int>(out.size());
      started.emplace(static_cast<int>(out.size()), o);
      continue;
    }
    if (in.kind == InstrKind::CollectiveDone || in.kind == InstrKind::Wait) {
      throw Error("async-collectives: the program already has async collectives or waits; run the pass once, on "
                  "a program with synchronous collectives");
    }
    if (in.kind == InstrKind::CollectiveStart) throw Error("async-collectives: the program already has collective starts");
    ready_for(in);
    const int o = in.out;
    const std::vector<int> defs = in.defs();
    const std::string s = in.stream;
    const bool view = in.kind == InstrKind::View;
    const int src = view ? in.in[0] : -1;
    emit(std::move(in));
    if (view) {
      ready_on[static_cast<std::size_t>(o)] = ready_on[static_cast<std::size_t>(src)];
      ready_at[static_cast<std::size_t>(o)] = ready_at[static_cast<std::size_t>(src)];
    } else {
      for (int d : defs) {
        ready_on[static_cast<std::size_t>(d)] = s;
        ready_at[static_cast<std::size_t>(d)] = static_cast<int>(out.size()) - 1;
      }
    }
  }
  while (!started.empty()) done(started.begin()->second);
  p.instrs = std::move(out);
  p.memory = {};
  return prog;
}

}  // namespace tessel
