// Pipeline schedules (pipeline/schedule.hpp): built by name, validated and simulated by one
// event-driven pass over the stages' orders, printed and parsed.
#include "tessel/pipeline/schedule.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <map>
#include <sstream>

#include "tessel/core/common.hpp"

namespace tessel {

namespace {

char op_letter(const PipeOp& o) { return o.forward ? 'F' : o.weight ? 'W' : 'B'; }

std::string op_text(const PipeOp& o, int64_t chunks) {
  return fmt::format("{}{}{}", op_letter(o), o.micro, chunks > 1 ? fmt::format(".{}", o.chunk) : "");
}

// The event-driven pass both validate() and simulate() use: each stage runs its ops in order,
// an op starting when its stage is free and its dependencies have ended. Throws Error naming
// the first stuck op when no stage can go on (a dependency that never runs, or a cycle).
struct Pass {
  std::vector<std::vector<double>> start;  // per stage, per op
  double end = 0;
  double busy = 0;
  std::vector<int64_t> peak;
};

Pass run_pass(const Schedule& s, double f_op, double b_op, double w_op) {
  const int64_t P = s.stages, V = s.chunks, M = s.micro;
  const int64_t VS = P * V;
  // end time of forward/backward of (virtual stage, micro); < 0: not yet run.
  std::vector<double> fend(static_cast<std::size_t>(VS * M), -1), bend(static_cast<std::size_t>(VS * M), -1);
  auto at = [&](int64_t vs, int64_t m) { return static_cast<std::size_t>(vs * M + m); };
  Pass p;
  p.start.resize(static_cast<std::size_t>(P));
  p.peak.assign(static_cast<std::size_t>(P), 0);
  std::vector<std::size_t> next(static_cast<std::size_t>(P), 0);
  std::vector<double> free_at(static_cast<std::size_t>(P), 0);
  std::vector<int64_t> in_flight(static_cast<std::size_t>(P), 0);
  std::size_t left = 0;
  for (const auto& o : s.order) left += o.size();
  while (left > 0) {
    int64_t best = -1;
    double best_t = std::numeric_limits<double>::infinity();
    for (int64_t st = 0; st < P; ++st) {
      const auto& ops = s.order[static_cast<std::size_t>(st)];
      if (next[static_cast<std::size_t>(st)] >= ops.size()) continue;
      const PipeOp& o = ops[next[static_cast<std::size_t>(st)]];
      const int64_t vs = o.chunk * P + st;
      double ready = free_at[static_cast<std::size_t>(st)];
      bool ok = true;
      auto need = [&](double t) {
        if (t < 0) ok = false;
        else ready = std::max(ready, t);
      };
      if (o.forward) {
        if (vs > 0) need(fend[at(vs - 1, o.micro)]);
      } else if (o.weight) {
        need(bend[at(vs, o.micro)]);  // its own B
      } else {
        need(fend[at(vs, o.micro)]);
        if (vs < VS - 1) need(bend[at(vs + 1, o.micro)]);
      }
      if (ok && ready < best_t) {
        best_t = ready;
        best = st;
      }
    }
    if (best < 0) {
      for (int64_t st = 0; st < P; ++st)
        if (next[static_cast<std::size_t>(st)] < s.order[static_cast<std::size_t>(st)].size())
          throw Error(fmt::format("schedule {}: stage {} cannot run {} (op {} of its order): what it needs never runs "
                                  "before it (a missing op or a cycle between the stages' orders)",
                                  schedule_kind_name(s.kind), st,
                                  op_text(s.order[static_cast<std::size_t>(st)][next[static_cast<std::size_t>(st)]], V),
                                  next[static_cast<std::size_t>(st)]));
    }
    const std::size_t bs = static_cast<std::size_t>(best);
    const PipeOp& o = s.order[bs][next[bs]];
    const double d = o.forward ? f_op : o.weight ? w_op : b_op;
    p.start[bs].push_back(best_t);
    free_at[bs] = best_t + d;
    p.busy += d;
    p.end = std::max(p.end, free_at[bs]);
    if (!o.weight) (o.forward ? fend : bend)[at(o.chunk * P + best, o.micro)] = free_at[bs];
    if (!o.weight) in_flight[bs] += o.forward ? 1 : -1;
    p.peak[bs] = std::max(p.peak[bs], in_flight[bs]);
    ++next[bs];
    --left;
  }
  return p;
}

}  // namespace

const char* schedule_kind_name(ScheduleKind k) {
  switch (k) {
    case ScheduleKind::GPipe: return "gpipe";
    case ScheduleKind::OneFOneB: return "1f1b";
    case ScheduleKind::Interleaved: return "interleaved";
    case ScheduleKind::ZeroBubbleH1: return "zb-h1";
  }
  return "?";
}

ScheduleKind parse_schedule_kind(const std::string& text) {
  for (ScheduleKind k : {ScheduleKind::GPipe, ScheduleKind::OneFOneB, ScheduleKind::Interleaved,
                         ScheduleKind::ZeroBubbleH1})
    if (text == schedule_kind_name(k)) return k;
  throw Error(fmt::format("unknown pipeline schedule '{}' (gpipe, 1f1b, interleaved or zb-h1)", text));
}

void Schedule::validate() const {
  if (stages < 1 || micro < 1 || chunks < 1)
    throw Error(fmt::format("schedule {}: stages {}, micro-batches {} and chunks {} must be >= 1",
                            schedule_kind_name(kind), stages, micro, chunks));
  if (static_cast<int64_t>(order.size()) != stages)
    throw Error(fmt::format("schedule {}: {} stage orders for {} stages", schedule_kind_name(kind), order.size(), stages));
  for (int64_t st = 0; st < stages; ++st) {
    // (0 B, 1 F, 2 W; chunk, micro) -> runs
    std::map<std::pair<int, std::pair<int64_t, int64_t>>, int> seen;
    for (const PipeOp& o : order[static_cast<std::size_t>(st)]) {
      if (o.chunk < 0 || o.chunk >= chunks || o.micro < 0 || o.micro >= micro)
        throw Error(fmt::format("schedule {}: stage {} runs {}, outside {} micro-batches and {} chunks",
                                schedule_kind_name(kind), st, op_text(o, chunks), micro, chunks));
      if (o.forward && o.weight)
        throw Error(fmt::format("schedule {}: stage {} has an op that is both a forward and a weight backward",
                                schedule_kind_name(kind), st));
      if (o.weight && !split_backward())
        throw Error(fmt::format("schedule {}: stage {} runs {}, a weight backward (W), which only a split schedule "
                                "(zb-h1) has",
                                schedule_kind_name(kind), st, op_text(o, chunks)));
      if (++seen[{o.forward ? 1 : o.weight ? 2 : 0, {o.chunk, o.micro}}] > 1)
        throw Error(fmt::format("schedule {}: stage {} runs {} twice", schedule_kind_name(kind), st, op_text(o, chunks)));
    }
    for (int f = 0; f < (split_backward() ? 3 : 2); ++f)
      for (int64_t c = 0; c < chunks; ++c)
        for (int64_t m = 0; m < micro; ++m)
          if (!seen.count({f, {c, m}})) {
            PipeOp o;
            o.forward = f == 1;
            o.weight = f == 2;
            o.chunk = c;
            o.micro = m;
            throw Error(fmt::format("schedule {}: stage {} never runs {}", schedule_kind_name(kind), st,
                                    op_text(o, chunks)));
          }
  }
  run_pass(*this, 1, 1, 1);  // every op can run: no cycle between the orders
}

Schedule make_schedule(ScheduleKind kind, int64_t P, int64_t M, int64_t V) {
  if (P < 1 || M < 1 || V < 1)
    throw Error(fmt::format("pipeline schedule {}: stages {}, micro-batches {} and chunks {} must be >= 1",
                            schedule_kind_name(kind), P, M, V));
  if (kind != ScheduleKind::Interleaved && V != 1)
    throw Error(fmt::format("pipeline schedule {}: {} chunks per stage; only the interleaved schedule has more than one",
                            schedule_kind_name(kind), V));
  if (kind == ScheduleKind::Interleaved && M % P != 0)
    throw Error(fmt::format("pipeline schedule interleaved: {} micro-batches over {} stages; the interleaved schedule "
                            "takes them in groups of the stages (give a multiple of {})",
                            M, P, P));
  Schedule s;
  s.kind = kind;
  s.stages = P;
  s.micro = M;
  s.chunks = V;
  s.order.resize(static_cast<std::size_t>(P));
  for (int64_t st = 0; st < P; ++st) {
    auto& o = s.order[static_cast<std::size_t>(st)];
    if (kind == ScheduleKind::GPipe) {
      for (int64_t m = 0; m < M; ++m) o.push_back({true, 0, m});
      for (int64_t m = M - 1; m >= 0; --m) o.push_back({false, 0, m});
      continue;
    }
    if (kind == ScheduleKind::ZeroBubbleH1) {
      // Triples (F_x, B_(x-(P-1-st)), W_(x-(P-1))), each op where its micro-batch exists.
      for (int64_t x = 0; x < M + P - 1; ++x) {
        if (x < M) o.push_back({true, 0, x});
        const int64_t b = x - (P - 1 - st), w = x - (P - 1);
        if (b >= 0 && b < M) o.push_back({false, 0, b});
        if (w >= 0 && w < M) o.push_back({false, 0, w, true});
      }
      continue;
    }
    // 1F1B (V = 1) and interleaved: the k-th forward and backward of the stage's M·V.
    const int64_t total = M * V;
    auto fwd = [&](int64_t k) {
      const int64_t within = k % (P * V);
      return PipeOp{true, within / P, (k / (P * V)) * P + within % P};
    };
    auto bwd = [&](int64_t k) {
      const int64_t within = k % (P * V);
      return PipeOp{false, V - 1 - within / P, (k / (P * V)) * P + within % P};
    };
    const int64_t warm = std::min(total, V == 1 ? P - st - 1 : (P - st - 1) * 2 + (V - 1) * P);
    int64_t f = 0, b = 0;
    for (; f < warm; ++f) o.push_back(fwd(f));
    while (f < total) {
      o.push_back(fwd(f++));
      o.push_back(bwd(b++));
    }
    while (b < total) o.push_back(bwd(b++));
  }
  s.validate();
  return s;
}

std::string Schedule::to_string() const {
  std::string out = fmt::format("schedule {} stages={} micro={} chunks={}\n", schedule_kind_name(kind), stages, micro, chunks);
  for (std::size_t st = 0; st < order.size(); ++st) {
    out += fmt::format("stage {}:", st);
    for (const PipeOp& o : order[st]) out += " " + op_text(o, chunks);
    out += "\n";
  }
  return out;
}

std::string Schedule::to_timeline() const {
  const Pass p = run_pass(*this, 1, 1, 1);
  const int64_t slots = static_cast<int64_t>(p.end + 0.5);
  std::size_t width = 1;
  for (const auto& o : order)
    for (const PipeOp& op : o) width = std::max(width, op_text(op, chunks).size());
  std::string out;
  for (std::size_t st = 0; st < order.size(); ++st) {
    std::vector<std::string> row(static_cast<std::size_t>(slots), ".");
    for (std::size_t i = 0; i < order[st].size(); ++i)
      row[static_cast<std::size_t>(p.start[st][i] + 0.5)] = op_text(order[st][i], chunks);
    std::string line = fmt::format("stage {}:", st);
    for (const std::string& c : row) line += fmt::format(" {:<{}}", c, width);
    out += line.substr(0, line.find_last_not_of(' ') + 1) + "\n";
  }
  return out;
}

Schedule parse_schedule(const std::string& text) {
  std::istringstream in(text);
  std::string line;
  Schedule s;
  int line_no = 0;
  bool header = false;
  auto fail = [&](const std::string& why) {
    throw Error(fmt::format("pipeline schedule, line {}: {} ('{}')", line_no, why, line));
  };
  while (std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    std::istringstream ls(line);
    std::string word;
    ls >> word;
    if (!header) {
      if (word != "schedule") fail("expected `schedule KIND stages=P micro=M chunks=V` first");
      std::string kind;
      ls >> kind;
      try {
        s.kind = parse_schedule_kind(kind);
      } catch (const Error& e) {
        fail(e.what());
      }
      std::string kv;
      int got = 0;
      while (ls >> kv) {
        const auto eq = kv.find('=');
        if (eq == std::string::npos) fail(fmt::format("expected key=value, got '{}'", kv));
        const std::string k = kv.substr(0, eq);
        int64_t v = 0;
        try {
          std::size_t used = 0;
          v = std::stoll(kv.substr(eq + 1), &used);
          if (used != kv.size() - eq - 1) throw std::invalid_argument("trailing");
        } catch (const std::exception&) {
          fail(fmt::format("'{}' is not a whole number", kv.substr(eq + 1)));
        }
        if (k == "stages") s.stages = v;
        else if (k == "micro") s.micro = v;
        else if (k == "chunks") s.chunks = v;
        else fail(fmt::format("unknown key '{}' (stages, micro, chunks)", k));
        ++got;
      }
      if (got != 3) fail("give stages=, micro= and chunks=");
      if (s.stages < 1 || s.stages > 1 << 16) fail("stages must be in [1, 65536]");
      header = true;
      continue;
    }
    if (word != "stage") fail("expected `stage N: ops`");
    std::string num;
    ls >> num;
    if (num.empty() || num.back() != ':') fail("expected `stage N:`");
    const std::string expect = fmt::format("{}:", s.order.size());
    if (num != expect) fail(fmt::format("expected stage {} next", s.order.size()));
    std::vector<PipeOp> ops;
    std::string tok;
    while (ls >> tok) {
      if (tok.size() < 2 || (tok[0] != 'F' && tok[0] != 'B' && tok[0] != 'W'))
        fail(fmt::format("'{}' is not F<micro>[.chunk], B<micro>[.chunk] or W<micro>[.chunk]", tok));
      PipeOp o;
      o.forward = tok[0] == 'F';
      o.weight = tok[0] == 'W';
      const std::string rest = tok.substr(1);
      const auto dot = rest.find('.');
      try {
        std::size_t used = 0;
        o.micro = std::stoll(rest.substr(0, dot), &used);
        if (used != (dot == std::string::npos ? rest.size() : dot)) throw std::invalid_argument("trailing");
        if (dot != std::string::npos) {
          o.chunk = std::stoll(rest.substr(dot + 1), &used);
          if (used != rest.size() - dot - 1) throw std::invalid_argument("trailing");
        }
      } catch (const std::exception&) {
        fail(fmt::format("'{}' is not F<micro>[.chunk], B<micro>[.chunk] or W<micro>[.chunk]", tok));
      }
      ops.push_back(o);
    }
    s.order.push_back(std::move(ops));
  }
  if (!header) throw Error("pipeline schedule: empty text (expected `schedule KIND stages=P micro=M chunks=V`)");
  s.validate();
  return s;
}

ScheduleTiming simulate(const Schedule& s, double forward_s, double backward_s) {
  if (!s.split_backward()) return simulate(s, forward_s, backward_s, 0);
  return simulate(s, forward_s, backward_s / 2, backward_s / 2);
}

ScheduleTiming simulate(const Schedule& s, double forward_s, double backward_s, double weight_s) {
  if (!(forward_s >= 0) || !(backward_s >= 0) || !(weight_s >= 0))
    throw Error(fmt::format("simulate: forward {} s, backward {} s and weight backward {} s must be >= 0", forward_s,
                            backward_s, weight_s));
  const double v = static_cast<double>(s.chunks);
  const Pass p = run_pass(s, forward_s / v, backward_s / v, weight_s / v);
  ScheduleTiming t;
  t.step_s = p.end;
  t.bubble = p.end > 0 ? 1 - p.busy / (static_cast<double>(s.stages) * p.end) : 0;
  t.peak_in_flight = p.peak;
  return t;
}

}  // namespace tessel
