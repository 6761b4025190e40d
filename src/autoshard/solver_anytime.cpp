// The anytime method for large strategy-selection problems (see tessel/autoshard/solver.hpp
// and docs/auto-sharding.md). solve_anytime first runs penalty rounds and the Lagrangian
// relaxation, each priced problem solved by message passing (min_sum.cpp, penalties.cpp), and
// polishes its best plan that fits with the block moves
// below; only when no such plan turns up does it fall back to the two searches from the
// least-memory and the cheapest starts.
//
// State: a plan that always fits the usage limit, the usage per time segment in a
// range-add/range-max segment tree, and a Lagrangian price per time segment.
// Step ("block move"): pick a root node and grow an *induced tree* around it (a node joins
// only while exactly one of its neighbours is in the block, so the block's edges form a
// tree). With every other node fixed, the best strategies for the whole block are found
// exactly by dynamic programming over that tree: each node's table is its own cost, plus its
// price (usage x the sum of the prices of the segments where it is live), plus its edges to
// fixed neighbours, plus the best of each child's table through their edge matrix. One node
// is a greedy single-node move; a large tree changes a whole chain of layouts at once, which
// single-node moves cannot (a reshard on every edge in between). The new block is kept if the
// usage still fits at every segment (segment tree); otherwise it is undone and the segment
// where it overflowed gets a higher price, so later blocks treat memory there as dear
// (IOPDDL's winners turned memory into such penalties; here they only steer, feasibility is
// never given up). Prices decay every sweep so that memory no longer tight becomes cheap.
//
// All choices come from a seeded xorshift generator, and ties keep the current strategy: the
// same problem, seed and number of moves give the same plan.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <thread>
#include <utility>

#if defined(__linux__)
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "model.hpp"
#include "tessel/autoshard/solver.hpp"

namespace tessel::autoshard {

namespace {

using Clock = std::chrono::steady_clock;

// Range add, global max (and where) over n segments.
class MaxSegmentTree {
 public:
  explicit MaxSegmentTree(int n) : n_(std::max(n, 1)), max_(4 * n_, 0), lazy_(4 * n_, 0) {}
  void add(int lo, int hi, int64_t v) {
    if (lo < hi) add(1, 0, n_, lo, hi, v);
  }
  int64_t max() const { return max_[1]; }
  // The first segment holding the maximum.
  int argmax() const {
    int node = 1, l = 0, r = n_;
    while (r - l > 1) {
      const int mid = (l + r) / 2;
      const int64_t want = max_[node] - lazy_[node];
      if (max_[2 * node] == want) {
        node = 2 * node;
        r = mid;
      } else {
        node = 2 * node + 1;
        l = mid;
      }
    }
    return l;
  }

 private:
  void add(int node, int l, int r, int lo, int hi, int64_t v) {
    if (hi <= l || r <= lo) return;
    if (lo <= l && r <= hi) {
      max_[node] += v;
      lazy_[node] += v;
      return;
    }
    const int mid = (l + r) / 2;
    add(2 * node, l, mid, lo, hi, v);
    add(2 * node + 1, mid, r, lo, hi, v);
    max_[node] = std::max(max_[2 * node], max_[2 * node + 1]) + lazy_[node];
  }
  int n_;
  std::vector<int64_t> max_, lazy_;  // max_ includes this node's own lazy_
};

// Point add, range sum of segment prices.
class Fenwick {
 public:
  explicit Fenwick(int n) : t_(n + 1, 0.0) {}
  void add(int i, double v) {
    for (++i; i < static_cast<int>(t_.size()); i += i & -i) t_[i] += v;
  }
  double prefix(int i) const {  // sum of [0, i)
    double s = 0;
    for (; i > 0; i -= i & -i) s += t_[i];
    return s;
  }
  double range(int lo, int hi) const { return lo < hi ? prefix(hi) - prefix(lo) : 0.0; }
  void clear() { std::fill(t_.begin(), t_.end(), 0.0); }

 private:
  std::vector<double> t_;
};

class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull) {}
  uint64_t next() {  // splitmix64
    uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  uint32_t below(uint32_t n) { return static_cast<uint32_t>(next() % n); }

 private:
  uint64_t s_;
};

constexpr double kInf = static_cast<double>(kInfiniteCost);

using detail::median_price_ratio;

class AnytimeSearch {
 public:
  // least_cost_start: start from each group's cheapest strategy (repaired into the limit by
  // the moves) instead of its least usage (fits at once). start (a plan over the groups, when
  // not empty) overrides both.
  AnytimeSearch(const Problem& p, const SolveOptions& o, Clock::time_point t0, const detail::Model& m,
                const detail::Coarse& c, bool least_cost_start, Plan start = {})
      : least_cost_start_(least_cost_start), start_(std::move(start)), p_(p), o_(o), t0_(t0), m_(m), c_(c),
        n_(static_cast<int32_t>(c_.groups.size())), seg_(m_.num_segments), price_(m_.num_segments), rng_(o.seed) {
    pair_cost_.resize(c_.pairs.size());
    for (std::size_t k = 0; k < c_.pairs.size(); ++k)
      pair_cost_[k].assign(c_.pairs[k].cost.begin(), c_.pairs[k].cost.end());
    node_cost_.resize(n_);
    for (int32_t g = 0; g < n_; ++g) node_cost_[g].assign(c_.groups[g].cost.begin(), c_.groups[g].cost.end());
    in_block_.assign(n_, 0);
    block_count_.assign(n_, 0);
    slot_.assign(n_, -1);
    price_base_ = 0.1 * median_price_ratio(p_);
  }

  SolveResult run() {
    begin();
    advance(o_.time_limit_s, o_.max_iterations);
    return finish();
  }

  // run() in three parts, so that a search can be paused and resumed (solve_anytime's trials of
  // two starts continue the better search rather than start it again).
  void begin() {
    r_ = SolveResult{};
    r_.method = "anytime";
    least_ = detail::least_memory_plan(p_);
    least_eval_ = evaluate(p_, least_);
    if (!least_eval_.within_memory) {  // nothing fits: the least-memory plan is the least bad
      hopeless_ = true;
      return;
    }
    // Start: each group's strategy of least usage x time (or least cost) among those of
    // finite cost. It may not fit (a group cannot take every member's least usage at once,
    // and the cheapest strategies seldom fit); moves then may not raise the peak, and the
    // overflowing segment is priced up until the plan fits.
    x_.assign(n_, 0);
    for (int32_t g = 0; g < n_; ++g) x_[g] = least_cost_start_ ? least_cost_strategy(g) : least_area_strategy(g);
    if (!start_.empty()) x_ = start_;
    if (limited())
      for (int32_t g = 0; g < n_; ++g) add_usage(g, x_[g], 1);
    cur_ = total_cost();
    best_ = x_;
    best_cost_ = kInf;
    if (fits() && cur_ < kInf / 2) {
      best_cost_ = cur_;
      note_improvement(r_, 0);
    }
  }
  // Moves until the deadline (seconds since the solve began; with max_steps < 0) or until
  // max_steps moves in all, or the stop flag.
  void advance(double deadline_s, int64_t max_steps) {
    if (hopeless_) return;
    // Block sizes, drawn at random: single nodes, small trees, and trees as large as the
    // graph allows.
    const int32_t sizes[] = {1, 2, 4, 8, 16, 64, 256, 1024, n_};
    for (; max_steps < 0 || it_ < max_steps; ++it_) {
      if ((it_ & 7) == 0 && o_.stop != nullptr && o_.stop->load(std::memory_order_relaxed)) break;
      if (max_steps < 0 && (it_ & 7) == 0 && elapsed() >= deadline_s) break;
      const int32_t root = static_cast<int32_t>(rng_.below(static_cast<uint32_t>(n_)));
      const int32_t size = sizes[rng_.below(sizeof(sizes) / sizeof(sizes[0]))];
      const bool was_infinite = cur_ >= kInf / 2;
      // Every other move grows a loose block (see block_move).
      visited_ += block_move(root, std::max<int32_t>(1, size), (it_ & 1) != 0);
      // Sums near 10^18 are inexact in double: recount once the plan leaves the infinite costs.
      if (was_infinite && cur_ < kInf / 2) cur_ = total_cost();
      if (!fits()) raise_price(seg_.argmax());
      if (cur_ < best_cost_ - 0.5 && cur_ < kInf / 2 && fits()) {
        best_cost_ = cur_;
        pending_ = true;
        note_improvement(r_, it_ + 1);
      }
      if (visited_ >= n_) {  // a sweep: let prices of memory that is no longer tight fade
        visited_ = 0;
        decay_prices();
      }
    }
  }
  double best_cost() const { return best_cost_; }  // kInf: nothing that fits yet
  int64_t steps() const { return it_; }
  SolveResult finish() {
    SolveResult r = r_;
    if (hopeless_) {
      r.plan = least_;
      r.evaluation = least_eval_;
      r.status = SolveStatus::infeasible;
      r.seconds = elapsed();
      return r;
    }
    if (pending_) best_ = x_;
    r.plan = expand(best_);
    r.evaluation = evaluate(p_, r.plan);
    r.status = SolveStatus::feasible;
    if (!r.evaluation.feasible()) {
      // No group plan ever fitted: the node plan of least memory fits (checked above) and is
      // the answer when it has no infinite cost; otherwise the search found nothing.
      r.plan = least_;
      r.evaluation = least_eval_;
      r.status = least_eval_.feasible() ? SolveStatus::feasible : SolveStatus::unknown;
      if (least_eval_.feasible()) note_improvement_of(r, least_eval_.cost, it_);
    }
    r.iterations = it_;
    r.seconds = elapsed();
    return r;
  }

 private:
  bool limited() const { return p_.usage_limit.has_value(); }
  bool fits() const { return !limited() || seg_.max() <= *p_.usage_limit; }

  // Usage of group g's members under its strategy gs added (sign 1) or removed (-1).
  void add_usage(int32_t g, int32_t gs, int64_t sign) {
    const detail::Group& grp = c_.groups[g];
    const std::size_t k = grp.members.size();
    for (std::size_t i = 0; i < k; ++i) {
      const int32_t v = grp.members[i];
      seg_.add(m_.seg_lo[v], m_.seg_hi[v], sign * p_.nodes[v].usage[grp.assign[gs * k + i]]);
    }
  }
  // Moves group g from strategy from to strategy to in the usage tree (members that keep
  // their strategy are skipped).
  void move_usage(int32_t g, int32_t from, int32_t to) {
    const detail::Group& grp = c_.groups[g];
    const std::size_t k = grp.members.size();
    for (std::size_t i = 0; i < k; ++i) {
      const int32_t v = grp.members[i];
      const int32_t a = grp.assign[from * k + i], b = grp.assign[to * k + i];
      if (a != b) seg_.add(m_.seg_lo[v], m_.seg_hi[v], p_.nodes[v].usage[b] - p_.nodes[v].usage[a]);
    }
  }
  int32_t least_cost_strategy(int32_t g) const {
    const detail::Group& grp = c_.groups[g];
    int32_t best = 0;
    for (int32_t s = 1; s < grp.num_strategies; ++s)
      if (grp.cost[s] < grp.cost[best]) best = s;
    return best;
  }
  int32_t least_area_strategy(int32_t g) const {
    const detail::Group& grp = c_.groups[g];
    const std::size_t k = grp.members.size();
    int32_t best = -1;
    double best_area = 0;
    for (int32_t s = 0; s < grp.num_strategies; ++s) {
      double area = 0;
      for (std::size_t i = 0; i < k; ++i) {
        const int32_t v = grp.members[i];
        area += static_cast<double>(p_.nodes[v].usage[grp.assign[s * k + i]]) *
                static_cast<double>(std::max<int64_t>(0, p_.nodes[v].live.end - p_.nodes[v].live.start));
      }
      const bool finite = grp.cost[s] < kInfiniteCost;
      const bool best_finite = best >= 0 && grp.cost[best] < kInfiniteCost;
      if (best < 0 || (finite && !best_finite) ||
          (finite == best_finite && (area < best_area || (area == best_area && grp.cost[s] < grp.cost[best])))) {
        best = s;
        best_area = area;
      }
    }
    return best;
  }
  // Change of group g's priced usage from strategy from to strategy to.
  double usage_price(int32_t g, int32_t from, int32_t to) const {
    const detail::Group& grp = c_.groups[g];
    const std::size_t k = grp.members.size();
    double d = 0;
    for (std::size_t i = 0; i < k; ++i) {
      const int32_t v = grp.members[i];
      const int32_t a = grp.assign[from * k + i], b = grp.assign[to * k + i];
      if (a != b) d += node_price(v) * static_cast<double>(p_.nodes[v].usage[b] - p_.nodes[v].usage[a]);
    }
    return d;
  }
  Plan expand(const Plan& gx) const { return detail::expand_groups(p_, c_, gx); }
  double elapsed() const { return std::chrono::duration<double>(Clock::now() - t0_).count(); }

  void note_improvement_of(SolveResult& r, TotalCost cost, int64_t it) {
    TracePoint tp{elapsed(), cost, it};
    if (r.first_feasible_s < 0) r.first_feasible_s = tp.seconds;
    r.trace.push_back(tp);
    if (o_.on_improvement) o_.on_improvement(tp);
  }
  void note_improvement(SolveResult& r, int64_t it) {
    if (best_cost_ >= kInf / 2) return;  // an infinite cost is no feasible plan
    note_improvement_of(r, static_cast<TotalCost>(std::llround(best_cost_)), it);
  }

  // Prices are stored divided by price_scale_, so a global decay is one multiplication.
  double node_price(int32_t v) const {
    return price_scale_ * price_.range(m_.seg_lo[v], m_.seg_hi[v]);
  }
  void raise_price(int seg) {
    const double old = price_scale_ * price_.range(seg, seg + 1);
    price_.add(seg, (0.5 * old + price_base_) / price_scale_);
  }
  void decay_prices() {
    price_scale_ *= 0.7;
    if (price_scale_ < 1e-200) {  // everything has faded: start from zero
      price_.clear();
      price_scale_ = 1.0;
    }
  }

  // Cost of the pair edge when v takes sv and its other end takes sw.
  double edge(int32_t pair, int32_t v, int32_t sv, int32_t sw) const {
    const detail::PairEdge& e = c_.pairs[pair];
    const int32_t sb = c_.groups[e.b].num_strategies;
    return e.a == v ? pair_cost_[pair][static_cast<std::size_t>(sv) * sb + sw]
                    : pair_cost_[pair][static_cast<std::size_t>(sw) * sb + sv];
  }

  double total_cost() const {
    double c = 0;
    for (int32_t g = 0; g < n_; ++g) c += node_cost_[g][x_[g]];
    for (std::size_t k = 0; k < c_.pairs.size(); ++k) {
      const detail::PairEdge& e = c_.pairs[k];
      c += pair_cost_[k][static_cast<std::size_t>(x_[e.a]) * c_.groups[e.b].num_strategies + x_[e.b]];
    }
    return c;
  }

  // Grows an induced tree of at most max_size nodes from root, solves it exactly, applies the
  // result when it fits. Returns the block size.
  // Loose blocks take every neighbour, not only those with one edge into the block: the
  // dynamic program then runs over the BFS tree and prices the block's other edges at the
  // far end's current strategy, so its answer is a proposal, kept only when the true change
  // (with those edges at their new strategies, plus the prices of memory) is a gain. On
  // XLA's graphs, with as many cycles as nodes, induced trees stay small; loose blocks move
  // whole cycles at once.
  int32_t block_move(int32_t root, int32_t max_size, bool loose) {
    grow_block(root, max_size, loose);
    solve_block();
    apply_block(loose);
    const int32_t size = static_cast<int32_t>(block_.size());
    for (int32_t v : block_) {
      in_block_[v] = 0;
      slot_[v] = -1;
    }
    for (int32_t v : touched_) block_count_[v] = 0;
    touched_.clear();
    return size;
  }

  void join(int32_t v, int32_t parent, int32_t pair) {
    slot_[v] = static_cast<int32_t>(block_.size());
    block_.push_back(v);
    parent_.push_back(parent);
    parent_pair_.push_back(pair);
    in_block_[v] = 1;
    for (const detail::Neighbor& nb : c_.adj[v]) {
      if (block_count_[nb.node]++ == 0) touched_.push_back(nb.node);
    }
  }

  void grow_block(int32_t root, int32_t max_size, bool loose) {
    block_.clear();
    parent_.clear();
    parent_pair_.clear();
    join(root, -1, -1);
    for (std::size_t i = 0; i < block_.size() && static_cast<int32_t>(block_.size()) < max_size; ++i) {
      const int32_t v = block_[i];
      const auto& adj = c_.adj[v];
      if (adj.empty()) continue;
      // Start at a random neighbour so that repeated blocks around a hub differ.
      const std::size_t off = rng_.below(static_cast<uint32_t>(adj.size()));
      for (std::size_t j = 0; j < adj.size() && static_cast<int32_t>(block_.size()) < max_size; ++j) {
        const detail::Neighbor& nb = adj[(off + j) % adj.size()];
        if (!in_block_[nb.node] && (loose || block_count_[nb.node] == 1)) join(nb.node, v, nb.pair);
      }
    }
  }

  // Whether nb is block node i's parent or child in the block's tree.
  bool tree_edge(int32_t i, const detail::Neighbor& nb) const {
    const int32_t j = slot_[nb.node];
    if (j < 0) return false;
    return (parent_[i] == nb.node && parent_pair_[i] == nb.pair) ||
           (parent_[j] == block_[i] && parent_pair_[j] == nb.pair);
  }

  void solve_block() {
    const int32_t k = static_cast<int32_t>(block_.size());
    table_off_.resize(k + 1);
    table_off_[0] = 0;
    for (int32_t i = 0; i < k; ++i) table_off_[i + 1] = table_off_[i] + c_.groups[block_[i]].num_strategies;
    table_.assign(table_off_[k], 0.0);
    // Own cost + price + edges to fixed neighbours.
    for (int32_t i = 0; i < k; ++i) {
      const int32_t v = block_[i];
      const detail::Group& grp = c_.groups[v];
      const int32_t ns = grp.num_strategies;
      double* f = &table_[table_off_[i]];
      for (int32_t s = 0; s < ns; ++s) f[s] = node_cost_[v][s];
      if (limited()) {  // each member's usage at the price of its segments
        const std::size_t km = grp.members.size();
        for (std::size_t j = 0; j < km; ++j) {
          const int32_t m = grp.members[j];
          const double mu = node_price(m);
          if (mu == 0) continue;
          for (int32_t s = 0; s < ns; ++s) f[s] += mu * static_cast<double>(p_.nodes[m].usage[grp.assign[s * km + j]]);
        }
      }
      for (const detail::Neighbor& nb : c_.adj[v]) {
        if (tree_edge(i, nb)) continue;  // through the dynamic program
        for (int32_t s = 0; s < ns; ++s) f[s] += edge(nb.pair, v, s, x_[nb.node]);
      }
    }
    // Children into parents, leaves first; choice_[i][s_parent] = child's best strategy.
    choice_off_.assign(k + 1, 0);
    for (int32_t i = 1; i < k; ++i)
      choice_off_[i + 1] = choice_off_[i] + c_.groups[parent_[i]].num_strategies;
    choice_.assign(choice_off_[k], 0);
    for (int32_t i = k - 1; i >= 1; --i) {
      const int32_t c = block_[i], par = parent_[i];
      const int32_t sc = c_.groups[c].num_strategies, sp = c_.groups[par].num_strategies;
      const double* fc = &table_[table_off_[i]];
      double* fp = &table_[table_off_[slot_[par]]];
      int32_t* ch = &choice_[choice_off_[i]];
      for (int32_t s = 0; s < sp; ++s) {
        int32_t best = x_[c];
        double best_v = fc[best] + edge(parent_pair_[i], par, s, best);
        for (int32_t t = 0; t < sc; ++t) {
          const double val = fc[t] + edge(parent_pair_[i], par, s, t);
          if (val < best_v) {
            best_v = val;
            best = t;
          }
        }
        ch[s] = best;
        fp[s] += best_v;
      }
    }
    new_x_.resize(k);
    const double* fr = &table_[0];
    int32_t best = x_[block_[0]];
    for (int32_t s = 0; s < c_.groups[block_[0]].num_strategies; ++s)
      if (fr[s] < fr[best]) best = s;
    new_x_[0] = best;
    for (int32_t i = 1; i < k; ++i) new_x_[i] = choice_[choice_off_[i] + new_x_[slot_[parent_[i]]]];
  }

  void apply_block(bool loose) {
    const int32_t k = static_cast<int32_t>(block_.size());
    changed_.clear();
    for (int32_t i = 0; i < k; ++i)
      if (new_x_[i] != x_[block_[i]]) changed_.push_back(i);
    if (changed_.empty()) return;
    // True cost change: node costs, and every edge with a changed end (once).
    double delta = 0;
    for (int32_t i : changed_) {
      const int32_t v = block_[i];
      const int32_t sold = x_[v], snew = new_x_[i];
      delta += node_cost_[v][snew] - node_cost_[v][sold];
      for (const detail::Neighbor& nb : c_.adj[v]) {
        const int32_t j = slot_[nb.node];
        const bool other_changed = j >= 0 && new_x_[j] != x_[nb.node];
        if (other_changed && nb.node < v) continue;  // counted from the other end
        const int32_t wold = x_[nb.node], wnew = other_changed ? new_x_[j] : wold;
        delta += edge(nb.pair, v, snew, wnew) - edge(nb.pair, v, sold, wold);
      }
    }
    if (loose) {  // a proposal: kept only for a gain in cost plus the price of memory
      double priced = delta;
      if (limited())
        for (int32_t i : changed_) priced += usage_price(block_[i], x_[block_[i]], new_x_[i]);
      if (!(priced < -1e-9 * std::max(1.0, std::abs(cur_)))) return;
    }
    if (limited()) {
      // Kept when the peak stays within the limit, or (while the plan does not fit yet)
      // does not rise.
      const int64_t allowed = std::max(*p_.usage_limit, seg_.max());
      for (int32_t i : changed_) move_usage(block_[i], x_[block_[i]], new_x_[i]);
      if (seg_.max() > allowed) {  // does not fit: undo, and price the overflow
        const int over = seg_.argmax();
        for (int32_t i : changed_) move_usage(block_[i], new_x_[i], x_[block_[i]]);
        raise_price(over);
        return;
      }
    }
    if (delta > 0 && pending_) {  // the plan before this move is the best so far: keep it
      best_ = x_;
      pending_ = false;
    }
    for (int32_t i : changed_) x_[block_[i]] = new_x_[i];
    cur_ += delta;
  }

  bool least_cost_start_;
  Plan start_;
  const Problem& p_;
  const SolveOptions& o_;
  Clock::time_point t0_;
  const detail::Model& m_;
  const detail::Coarse& c_;  // the search runs over its groups
  int32_t n_;
  std::vector<std::vector<double>> node_cost_, pair_cost_;
  MaxSegmentTree seg_;
  Fenwick price_;
  double price_scale_ = 1.0, price_base_ = 1.0;
  Rng rng_;
  Plan x_, best_;
  double cur_ = 0, best_cost_ = 0;
  bool pending_ = false;  // x_ is better than best_ (copied lazily, before it gets worse)
  SolveResult r_;          // the trace so far (begin .. finish)
  Plan least_;
  Evaluation least_eval_;
  bool hopeless_ = false;  // not even the least-memory plan fits
  int64_t it_ = 0, visited_ = 0;
  // The current block.
  std::vector<int32_t> block_, parent_, parent_pair_, touched_, changed_, new_x_;
  std::vector<char> in_block_;
  std::vector<int32_t> block_count_, slot_;
  std::vector<double> table_;
  std::vector<int32_t> table_off_, choice_off_, choice_;
};

// The dual's search for BoundThread: along each ray of `prices` (the last first) a golden section,
// then the dual's own subgradient ascent from the best prices towards `upper` (a plan's coarse
// cost). `best` is raised as values come (out_of_time may read it).
void search_dual(const Problem& problem, const detail::Model& model, const detail::Coarse& coarse,
                 const std::vector<std::vector<double>>& prices, double upper,
                 const std::function<bool()>& out_of_time, long double& best) {
  // The relaxation's prices steer plans towards the limit, not the dual to its
  // maximum, and often overshoot it (IOPDDL G: a dual of -4.2e4 at its last prices):
  // along each ray of prices the dual is concave, searched by golden section over the
  // scale in [0, 1.5] (five steps after the scale 1).
  std::vector<double> best_prices;  // where the best value so far was found
  for (auto it = prices.rbegin(); it != prices.rend() && !out_of_time(); ++it) {
    auto dual = [&](double scale) {
      // (nothing more once the search has ended: each value builds the priced problem first)
      if (out_of_time()) return -std::numeric_limits<long double>::infinity();
      const long double d = detail::lagrangian_bound(problem, model, coarse, *it, scale, 1 << 20, out_of_time);
      if (d > best) {
        best = d;
        best_prices = *it;
        for (double& x : best_prices) x *= scale;
      }
      return d;
    };
    constexpr double kGolden = 0.6180339887498949;
    dual(1.0);
    if (it == prices.rbegin()) dual(0.0);  // the problem without its limit: a bound at once
    double lo = 0.0, hi = 1.5;
    double x1 = hi - kGolden * (hi - lo), x2 = lo + kGolden * (hi - lo);
    long double f1 = dual(x1), f2 = dual(x2);
    for (int step = 0; step < 5 && !out_of_time(); ++step) {
      if (f1 < f2) {
        lo = x1, x1 = x2, f1 = f2;
        x2 = lo + kGolden * (hi - lo);
        f2 = dual(x2);
      } else {
        hi = x2, x2 = x1, f2 = f1;
        x1 = hi - kGolden * (hi - lo);
        f1 = dual(x1);
      }
    }
  }
  // Then the dual's own ascent from the best prices: a subgradient step towards each
  // segment's usage over the limit in the plan the reparametrisation decodes, the step
  // Polyak's (the gap to the relaxation's best plan over the subgradient's length),
  // halved after 5 steps without a better value.
  const double limit = static_cast<double>(*problem.usage_limit);
  std::vector<double> lambda = best_prices;
  double theta = 1.0;
  int since_better = 0;
  Plan decoded;
  while (!lambda.empty() && theta > 1e-3 && !out_of_time()) {
    const long double d =
        detail::lagrangian_bound(problem, model, coarse, lambda, 1.0, 1 << 20, out_of_time, &decoded);
    if (out_of_time() || decoded.empty()) break;
    if (d > best) {
      best = d;
      since_better = 0;
    } else if (++since_better >= 5) {
      theta /= 2;
      since_better = 0;
    }
    const std::vector<double> usage = detail::segment_usage(problem, model, coarse, decoded);
    double norm = 0;
    for (std::size_t t = 0; t < usage.size(); ++t) {
      const double g = usage[t] - limit;
      if (g > 0 || lambda[t] > 0) norm += g * g;  // (the projection drops the rest)
    }
    if (norm <= 0 || !(upper > static_cast<double>(d))) break;
    const double step = theta * (upper - static_cast<double>(d)) / norm;
    for (std::size_t t = 0; t < usage.size(); ++t) lambda[t] = std::max(0.0, lambda[t] + step * (usage[t] - limit));
  }
}

// The Lagrangian dual's bound under a usage limit (detail::lagrangian_bound at the prices each
// step size of the relaxation ended at, the last first), computed beside the block moves on a
// thread of its own, once it has a first bound at the lowest priority (nice 19 on Linux: it takes
// a core the search leaves idle and little of a busy one). After the golden sections, the dual's
// own subgradient ascent from the best prices, towards `upper` (a plan's coarse cost). It stops at `deadline_s` or
// finish(), after the sweep it is in. Not run with a step budget (SolveOptions::bound_under_limit).
class BoundThread {
 public:
  BoundThread(const Problem& problem, const detail::Model& model, const detail::Coarse& coarse,
              std::vector<std::vector<double>> prices, double upper, Clock::time_point t0, double deadline_s,
              const std::atomic<bool>* stop)
      : thread_([this, &problem, &model, &coarse, prices = std::move(prices), upper, t0, deadline_s, stop] {
          // At the normal priority until it has a bound above zero, or for 10% of the limit, so
          // that a bound comes even where the search and CBC keep every core busy (IOPDDL D at 5 s
          // on 2 cores printed none in 2 runs of 3 at nice 19 throughout: a value took 1.1 s there
          // against 0.03 s at the normal priority, and at prices from a short relaxation the first
          // values are below zero); then at nice 19.
          const auto thread_start = Clock::now();
          long double best = -std::numeric_limits<long double>::infinity();
          bool lowered = false;
          auto lower_priority = [&] {
            if (lowered || (best <= 0 && std::chrono::duration<double>(Clock::now() - thread_start).count() <
                                             0.1 * deadline_s / 0.97))
              return;
            lowered = true;
#if defined(__linux__)
            setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), 19);  // (best effort)
#endif
          };
          auto out_of_time = [&] {
            lower_priority();
            if (done_.load(std::memory_order_relaxed)) return true;
            if (stop != nullptr && stop->load(std::memory_order_relaxed)) return true;
            return std::chrono::duration<double>(Clock::now() - t0).count() >= deadline_s;
          };
          search_dual(problem, model, coarse, prices, upper, out_of_time, best);
          best_ = best;
        }) {}
  BoundThread(const BoundThread&) = delete;
  BoundThread& operator=(const BoundThread&) = delete;
  ~BoundThread() { finish(); }
  // Stops the sweeps and returns the best bound (-inf: none).
  long double finish() {
    done_ = true;
    if (thread_.joinable()) thread_.join();
    return best_;
  }

 private:
  std::atomic<bool> done_{false};
  long double best_ = -std::numeric_limits<long double>::infinity();
  std::thread thread_;  // last: starts after the members it uses
};

}  // namespace

const char* status_name(SolveStatus s) {
  switch (s) {
    case SolveStatus::optimal: return "optimal";
    case SolveStatus::feasible: return "feasible";
    case SolveStatus::infeasible: return "infeasible";
    case SolveStatus::unknown: return "unknown";
  }
  return "?";
}

namespace detail {

SolveResult search_from(const Problem& problem, const SolveOptions& options, const Model& model, const Coarse& coarse,
                        const Plan& group_plan) {
  return AnytimeSearch(problem, options, Clock::now(), model, coarse, true, group_plan).run();
}

}  // namespace detail

SolveResult solve_anytime(const Problem& problem, const SolveOptions& options) {
  const auto t0 = Clock::now();
  if (problem.nodes.empty()) {
    SolveResult r;
    r.method = "anytime";
    r.status = SolveStatus::feasible;
    r.evaluation = evaluate(problem, r.plan);
    return r;
  }
  const detail::Model model = detail::build_model(problem);
  const detail::Coarse coarse = detail::build_coarse(problem, model);
  auto elapsed = [&] { return std::chrono::duration<double>(Clock::now() - t0).count(); };
  // First, the Lagrangian relaxation of the limit solved by min-sum message passing
  // (detail::lagrangian_min_sum): on IOPDDL its plans are far cheaper than the local search's
  // (P: 1.02x the optimum in 2 s against 1.44x in 240 s), because message passing moves
  // whole chains of layouts together where a move over a tree cannot. It gets at most 30% of
  // the time; with a step budget it runs its fixed iteration count.
  SolveResult lag;
  lag.method = "anytime";
  {
    const double lag_deadline = 0.3 * options.time_limit_s;
    auto out_of_time = [&] {
      if (options.stop != nullptr && options.stop->load(std::memory_order_relaxed)) return true;
      return options.max_iterations < 0 && elapsed() >= lag_deadline;
    };
    auto on_improvement = [&](double cost, int64_t iteration) {
      const TracePoint tp{elapsed(), static_cast<TotalCost>(std::llround(cost)), iteration};
      if (lag.first_feasible_s < 0) lag.first_feasible_s = tp.seconds;
      lag.trace.push_back(tp);
      if (options.on_improvement) options.on_improvement(tp);
    };
    const detail::LagrangianResult lr =
        detail::lagrangian_min_sum(problem, model, coarse, {0.5, 0.1, 0.03}, 150, 2, median_price_ratio(problem),
                                   out_of_time, on_improvement);
    lag.iterations = 0;  // message passing is not counted in block moves
    // The relaxation's lower bound on the optimum, on the original costs: the coarse problem's
    // costs differ from a plan's own by a constant (what folding moved out of the groups),
    // taken from the best plan. Its plan is optimal where the bound reaches its cost. (Under a
    // limit the bound is the Lagrangian dual's, from BoundThread below.)
    double bound = -1;
    long double coarse_bound = lr.lower_bound;
    if (!problem.usage_limit && !lr.best.empty() && std::isfinite(static_cast<double>(coarse_bound)) &&
        coarse_bound < static_cast<long double>(lr.best_cost) - 0.5L) {
      // Without a limit, min-sum diffusion tightens the bound while a gap is left: until 60% of
      // the time (a fixed count of sweeps with a step budget, for the same answer every run).
      const std::vector<std::vector<double>> truth = detail::group_costs(coarse);
      const double diffusion_deadline = 0.6 * options.time_limit_s;
      auto diffusion_out_of_time = [&] {
        if (options.stop != nullptr && options.stop->load(std::memory_order_relaxed)) return true;
        return options.max_iterations < 0 && elapsed() >= diffusion_deadline;
      };
      const detail::MinSum ms(coarse);
      coarse_bound = std::max(coarse_bound, ms.diffusion_bound(truth, options.max_iterations < 0 ? 1 << 20 : 200,
                                                               1e-9L * static_cast<long double>(lr.best_cost),
                                                               static_cast<long double>(lr.best_cost),
                                                               diffusion_out_of_time));
    }
    if (!lr.best.empty() && std::isfinite(static_cast<double>(coarse_bound))) {
      Plan nodes = detail::expand_groups(problem, coarse, lr.best);
      const Evaluation e = evaluate(problem, nodes);
      const long double lb =
          coarse_bound + (static_cast<long double>(e.cost) - static_cast<long double>(lr.best_cost));
      // (costs are integers: the bound rounds up, after a margin for the rounding of the sums)
      if (e.feasible() && lb > 0) bound = static_cast<double>(std::ceil(lb - 0.4L - 1e-12L * std::fabs(lb)));
      if (e.feasible() && bound >= 0 && e.cost <= static_cast<TotalCost>(bound)) {
        SolveResult r;  // proven: nothing to polish
        r.plan = std::move(nodes);
        r.evaluation = e;
        r.status = SolveStatus::optimal;
        r.method = "anytime (its relaxation's bound proves the plan optimal)";
        r.lower_bound = static_cast<double>(e.cost);
        r.trace = lag.trace;
        r.first_feasible_s = lag.first_feasible_s;
        r.seconds = elapsed();
        return r;
      }
    }
    // Under a limit, the dual's bound, computed beside the polishing (it stops at 97% of the
    // limit, or when the polishing ends, after the sweep it is in).
    std::unique_ptr<BoundThread> dual_bound;
    if (problem.usage_limit && options.bound_under_limit && options.max_iterations < 0 && !lr.best.empty() &&
        !lr.final_prices.empty() && !coarse.clamped)
      dual_bound = std::make_unique<BoundThread>(problem, model, coarse, lr.final_prices, lr.best_cost, t0,
                                                 0.97 * options.time_limit_s, options.stop);
    if (!lr.best.empty()) {
      // Polish with the block moves from the relaxation's plan, for the rest of the time. When
      // the penalty rounds and the prices each found a plan that fits, and they differ, both
      // are polished for a tenth of what is left and the better search goes on for the rest:
      // the cheaper start is not always the better one (on IOPDDL K the penalty rounds' plan,
      // 3.12e9, polished to 2.32e9 in 180 s, where the prices' 3.41e9 reaches 2.23e9), and a
      // search started again from the winner's plan lost its state (K 2.1% higher).
      TotalCost reported = lag.trace.back().cost;
      std::vector<TracePoint> trace = lag.trace;  // and each better plan of the polishing searches
      auto polish_options = [&](double deadline_s, int64_t steps) {
        SolveOptions po = options;
        po.time_limit_s = deadline_s;
        po.max_iterations = steps;
        po.on_improvement = [&](const TracePoint& tp) {
          if (tp.cost >= reported) return;
          reported = tp.cost;
          trace.push_back(tp);
          if (options.on_improvement) options.on_improvement(tp);
        };
        return po;
      };
      std::vector<const Plan*> starts;
      if (!lr.price_best.empty()) starts.push_back(&lr.price_best);
      if (!lr.penalty_best.empty() && lr.penalty_best != lr.price_best) starts.push_back(&lr.penalty_best);
      if (starts.empty()) starts.push_back(&lr.best);
      SolveResult r;
      if (starts.size() == 1) {
        r = AnytimeSearch(problem, polish_options(options.time_limit_s, options.max_iterations), t0, model, coarse,
                          false, *starts[0])
                .run();
      } else {
        // Each start's search runs for a tenth of what is left (or of the steps), then the
        // better one goes on from where it stopped for the rest.
        const int64_t trial_steps = options.max_iterations < 0 ? -1 : options.max_iterations / 10;
        const SolveOptions po = polish_options(options.time_limit_s, options.max_iterations);
        AnytimeSearch a(problem, po, t0, model, coarse, false, *starts[0]);
        AnytimeSearch b(problem, po, t0, model, coarse, false, *starts[1]);
        a.begin();
        a.advance(elapsed() + 0.1 * std::max(0.0, options.time_limit_s - elapsed()), trial_steps);
        b.begin();
        b.advance(elapsed() + 0.1 * std::max(0.0, options.time_limit_s - elapsed()), trial_steps);
        AnytimeSearch& better = b.best_cost() < a.best_cost() ? b : a;
        const AnytimeSearch& other = &better == &a ? b : a;
        better.advance(options.time_limit_s,
                       options.max_iterations < 0 ? -1 : options.max_iterations - trial_steps);
        r = better.finish();
        r.iterations += other.steps();
      }
      r.trace = std::move(trace);
      r.first_feasible_s = lag.first_feasible_s;
      if (dual_bound) {  // on the coarse costs: the constant of the relaxation's best plan
        const long double coarse_dual = dual_bound->finish();
        const TotalCost cost = evaluate(problem, detail::expand_groups(problem, coarse, lr.best)).cost;
        const long double lb = coarse_dual + (static_cast<long double>(cost) - static_cast<long double>(lr.best_cost));
        const long double rounded = std::ceil(lb - 0.4L - 1e-12L * std::fabs(lb));
        if (std::isfinite(static_cast<double>(rounded)) && rounded > 0) bound = std::max(bound, static_cast<double>(rounded));
      }
      r.seconds = elapsed();
      if (bound >= 0) {
        r.lower_bound = bound;
        if (r.evaluation.feasible() && r.evaluation.cost <= static_cast<TotalCost>(bound)) {
          r.status = SolveStatus::optimal;
          r.method = "anytime (its relaxation's bound proves the plan optimal)";
        }
      }
      return r;
    }
  }
  // No plan of the relaxation fitted: two searches in turn, the better plan kept. The least-usage start fits at once, so a
  // feasible plan is known within a fraction of a second; but it is the most sharded plan
  // and its reshards trap the moves far from good plans (5x the optimum on IOPDDL B). The
  // cheapest start is usually over the limit and is repaired by the moves, ending much
  // lower where the repair succeeds (2.1x on B, 1.5x rather than 2.1x on K), yet on some
  // graphs (IOPDDL N) it never fits. The first gets a quarter of the time or steps.
  SolveOptions first_options = options;
  first_options.time_limit_s = 0.25 * options.time_limit_s;
  if (options.max_iterations >= 0) first_options.max_iterations = options.max_iterations / 4;
  SolveResult a = AnytimeSearch(problem, first_options, t0, model, coarse, false).run();
  if (a.status == SolveStatus::infeasible && !a.evaluation.within_memory && a.iterations == 0) return a;
  SolveOptions second_options = options;
  if (options.max_iterations >= 0) second_options.max_iterations = options.max_iterations - first_options.max_iterations;
  const TotalCost first_best = a.evaluation.feasible() ? a.evaluation.cost : -1;
  second_options.on_improvement = [&](const TracePoint& tp) {
    if ((first_best < 0 || tp.cost < first_best) && options.on_improvement) options.on_improvement(tp);
  };
  SolveResult b = AnytimeSearch(problem, second_options, t0, model, coarse, true).run();
  const bool b_better = b.evaluation.feasible() && (!a.evaluation.feasible() || b.evaluation.cost < a.evaluation.cost);
  SolveResult r = b_better ? b : a;
  r.trace = a.trace;
  for (const TracePoint& tp : b.trace)
    if (r.trace.empty() || tp.cost < r.trace.back().cost) r.trace.push_back({tp.seconds, tp.cost, tp.iteration + a.iterations});
  r.first_feasible_s = a.first_feasible_s >= 0 ? a.first_feasible_s : b.first_feasible_s;
  r.iterations = a.iterations + b.iterations;
  r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return r;
}

SolveResult solve(const Problem& problem, const SolveOptions& options) {
  const auto t0 = Clock::now();
  if (exact_program_size(problem) > options.exact_max_variables) return solve_anytime(problem, options);
  // Small enough for the integer program: a short anytime run first (a feasible plan within
  // a fraction of the limit, and the answer should CBC run out of time), then CBC.
  SolveOptions quick = options;
  quick.time_limit_s = std::min(5.0, 0.1 * options.time_limit_s);
  SolveResult first = solve_anytime(problem, quick);
  if (first.status == SolveStatus::optimal) return first;  // its relaxation's bound proved it
  const double used = std::chrono::duration<double>(Clock::now() - t0).count();
  SolveOptions rest = options;
  // CBC checks its clock between nodes of its search: keep a margin for the last one.
  rest.time_limit_s = 0.85 * (options.time_limit_s - used);
  if (rest.time_limit_s < 0.5) return first;
  SolveResult exact = solve_exact(problem, rest);
  const double offset = used;
  const bool exact_better = exact.evaluation.feasible() &&
                            (!first.evaluation.feasible() || exact.evaluation.cost <= first.evaluation.cost);
  SolveResult r = exact_better ? exact : first;
  r.method = exact_better ? "anytime, then exact (CBC)" : "anytime (CBC found nothing better)";
  if (exact_better && exact.status != SolveStatus::optimal) r.status = SolveStatus::feasible;
  r.trace = first.trace;
  r.first_feasible_s = first.first_feasible_s >= 0 ? first.first_feasible_s : -1;
  if (exact_better) {
    const TracePoint tp{offset + exact.seconds, exact.evaluation.cost, first.iterations};
    r.trace.push_back(tp);
    if (r.first_feasible_s < 0) r.first_feasible_s = tp.seconds;
    if (options.on_improvement) options.on_improvement(tp);
  }
  r.iterations = first.iterations;
  r.lower_bound = std::max(first.lower_bound, exact.lower_bound);  // both proven; the greater holds
  r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return r;
}

}  // namespace tessel::autoshard
