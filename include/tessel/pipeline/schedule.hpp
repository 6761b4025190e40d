// tessel/pipeline/schedule.hpp — pipeline schedules as objects: which stage runs which
// micro-batch's forward or backward of which model chunk, in what order (issue 39 item 2).
// A schedule is built by name (GPipe, 1F1B, interleaved 1F1B), checked (every forward and
// backward once, each after what it depends on), printed as a table of time slots × stages
// and parsed back, and simulated: the step time and the bubble for given forward and backward
// times, and the activations each stage holds at its peak.
//
//   tessel::Schedule s = tessel::make_schedule(tessel::ScheduleKind::OneFOneB, /*stages=*/4,
//                                              /*micro=*/8);
//   std::puts(s.to_string().c_str());          // the table; parse_schedule reads it back
//   tessel::ScheduleTiming t = tessel::simulate(s, /*forward_s=*/1, /*backward_s=*/2);
//   // t.step_s == (8 + 3) * 3; t.bubble == 3 / 11.0; t.peak_in_flight[0] == 4
//
// Stages are numbered 0..P-1 from the model's input; with v chunks per stage (interleaved), the
// model is cut into P·v virtual stages and chunk c of stage s is virtual stage c·P + s
// (Narayanan et al. 2021, Megatron-LM's interleaved schedule). A forward of (virtual stage,
// micro-batch) needs the forward of the virtual stage before it; a backward needs the backward
// of the virtual stage after it and its own forward.
//
// Zero bubble (ZB-H1, Qi et al. 2024): the backward is split in two, B (the gradient of the
// stage's inputs, which the stage before waits for) and W (the gradient of its weights, which
// nobody waits for), and the W's are placed where 1F1B leaves a stage idle. A W needs its own
// B. With equal F, B and W times the bubble is a third of 1F1B's.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tessel {

enum class ScheduleKind { GPipe, OneFOneB, Interleaved, ZeroBubbleH1 };
const char* schedule_kind_name(ScheduleKind k);      // "gpipe", "1f1b", "interleaved", "zb-h1"
ScheduleKind parse_schedule_kind(const std::string& text);  // Error naming the text and the choices

struct PipeOp {
  bool forward = true;
  int64_t chunk = 0;  // 0..chunks-1
  int64_t micro = 0;  // 0..micro-1
  // A split backward's second half (forward false): W, the weights' gradient. With forward false
  // and weight false the op is the whole backward, or in a split schedule its first half B.
  bool weight = false;
  bool operator==(const PipeOp& o) const {
    return forward == o.forward && chunk == o.chunk && micro == o.micro && weight == o.weight;
  }
};

struct Schedule {
  ScheduleKind kind = ScheduleKind::GPipe;
  int64_t stages = 1, micro = 1, chunks = 1;
  // Per stage, the ops it runs, in order.
  std::vector<std::vector<PipeOp>> order;
  // The backward split into B and W (ZeroBubbleH1): every backward op then has a W op after it.
  bool split_backward() const { return kind == ScheduleKind::ZeroBubbleH1; }

  // Throws Error naming the stage and op when an op is missing, repeated, out of range, or
  // runs before what it depends on could (a cycle: no order of the stages runs it).
  void validate() const;
  // The table: a header line `schedule 1f1b stages=4 micro=8 chunks=1`, then one line per
  // stage `stage 0: F0 F1 F2 F3 B0 F4 B1 ...` (F/B/W, micro-batch, and `.c` with the chunk
  // when chunks > 1: `F3.1`).
  std::string to_string() const;
  // A picture in time: one row per stage, one column per time slot of the simulation with
  // unit forward and backward times (B and W a unit each), `F3`/`B3`/`W3` or `.` when idle.
  std::string to_timeline() const;
};

// GPipe: every forward, then every backward (in reverse micro-batch order). 1F1B: stage s
// runs min(P - s - 1, M) forwards, then alternates one forward and one backward, then the
// remaining backwards (PipeDream-Flush). Interleaved: 1F1B over v chunks per stage, the
// micro-batches in groups of P (M a multiple of P: Error otherwise), stage s warming up with
// (P - s - 1)·2 + (v - 1)·P forwards. ZeroBubbleH1: stage s runs, for x = 0, 1, ..., M + P - 2,
// F_x, then B_(x - (P - 1 - s)), then W_(x - (P - 1)), each where its micro-batch is in 0..M-1:
// 1F1B's forwards and input backwards, with stage s's weight backwards s micro-batches behind
// its B's (so the last stages, which wait longest in the cool-down, do their W's there). Error
// for stages, micro or chunks < 1, or chunks > 1 with another kind than interleaved.
Schedule make_schedule(ScheduleKind kind, int64_t stages, int64_t micro, int64_t chunks = 1);
// Reads to_string()'s text; Error naming the line on anything else. The result is validated.
Schedule parse_schedule(const std::string& text);

struct ScheduleTiming {
  double step_s = 0;    // the last op's end
  double bubble = 0;    // the share of stage-time idle: 1 - busy / (stages · step_s)
  // Per stage: the most micro-batch chunks forwarded and not yet backwarded (in a split
  // schedule: whose B has not run: the activations 1F1B counts).
  std::vector<int64_t> peak_in_flight;
};
// Each op starts when its stage is free and its dependencies are done; a chunk's forward takes
// forward_s / chunks, its backward backward_s / chunks (a stage's work split evenly over its
// chunks); transfers between stages take no time. A split schedule's B and W take half of
// backward_s each; the overload gives them apart (weight_s: W's; backward_s: B's).
ScheduleTiming simulate(const Schedule& s, double forward_s, double backward_s);
ScheduleTiming simulate(const Schedule& s, double forward_s, double backward_s, double weight_s);

}  // namespace tessel
