// The pipeline runner's links between stages (stage_links.hpp): a mailbox, and host messages
// between the processes of an mpirun job.
#include "stage_links.hpp"

#include <fmt/format.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "tessel/core/common.hpp"

namespace tessel::detail {

namespace {

// Messages between the stages' processes use this tag (the pool runtime's are below 16 + 2 ·
// segments; a pipeline and a pool do not share a process group).
constexpr int kStageTag = 12001;

void put_i64(std::string& out, int64_t v) { out.append(reinterpret_cast<const char*>(&v), sizeof v); }
void put_str(std::string& out, const std::string& s) {
  put_i64(out, static_cast<int64_t>(s.size()));
  out += s;
}

struct Reader {
  const std::string& b;
  const std::string& what;
  std::size_t at = 0;
  void need(std::size_t n) {
    if (b.size() - at < n)
      throw Error(fmt::format("{}: a message of {} bytes ends early (at byte {}, {} more needed)", what, b.size(), at,
                              n));
  }
  int64_t i64() {
    need(sizeof(int64_t));
    int64_t v = 0;
    std::memcpy(&v, b.data() + at, sizeof v);
    at += sizeof v;
    return v;
  }
  std::string str() {
    const int64_t n = i64();
    if (n < 0) throw Error(fmt::format("{}: a string of {} bytes in a message", what, n));
    need(static_cast<std::size_t>(n));
    std::string s = b.substr(at, static_cast<std::size_t>(n));
    at += static_cast<std::size_t>(n);
    return s;
  }
};

}  // namespace

std::string pack_hosts(const Hosts& values) {
  std::string out;
  put_i64(out, static_cast<int64_t>(values.size()));
  for (const auto& [name, t] : values) {
    put_str(out, name);
    put_str(out, dtype_name(t.dtype()));
    put_i64(out, static_cast<int64_t>(t.shape().size()));
    for (int64_t d : t.shape()) put_i64(out, d);
    put_str(out, std::string(static_cast<const char*>(t.data()), t.bytes()));
  }
  return out;
}

Hosts unpack_hosts(const std::string& bytes, const std::string& what) {
  Hosts out;
  if (bytes.empty()) return out;  // a process that speaks for no stage
  Reader r{bytes, what};
  const int64_t n = r.i64();
  for (int64_t i = 0; i < n; ++i) {
    std::string name = r.str();
    const DType dt = parse_dtype(r.str());
    const int64_t rank = r.i64();
    if (rank < 0 || rank > 16) throw Error(fmt::format("{}: value '{}' of rank {} in a message", what, name, rank));
    Shape shape;
    for (int64_t d = 0; d < rank; ++d) shape.push_back(r.i64());
    HostTensor t(dt, shape);
    const std::string data = r.str();
    if (data.size() != t.bytes())
      throw Error(fmt::format("{}: value '{}' ({}) carries {} bytes, not {}", what, name, type_str(dt, shape),
                              data.size(), t.bytes()));
    std::memcpy(t.data(), data.data(), data.size());
    out.emplace(std::move(name), std::move(t));
  }
  return out;
}

std::string pack_doubles(const std::vector<double>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(double));
}

std::vector<double> unpack_doubles(const std::string& bytes, const std::string& what) {
  if (bytes.size() % sizeof(double) != 0)
    throw Error(fmt::format("{}: {} bytes are not a list of numbers", what, bytes.size()));
  std::vector<double> v(bytes.size() / sizeof(double));
  std::memcpy(v.data(), bytes.data(), bytes.size());
  return v;
}

std::vector<std::string> StagePlacement::gather(const std::string& mine) const {
  if (!processes) return {mine};
  return processes->allgather(mine);
}

StageLinks::StageLinks(StagePlacement where, double timeout_s) : where_(std::move(where)), timeout_s_(timeout_s) {}

void StageLinks::begin_step(int64_t step) {
  std::lock_guard<std::mutex> l(mu_);
  step_ = step;
  failed_ = false;
  reason_.clear();
  for (auto it = box_.begin(); it != box_.end();) it = std::get<0>(it->first) < step ? box_.erase(it) : std::next(it);
}

void StageLinks::put(int kind, int64_t vs, int64_t m, Hosts values) {
  const int64_t stage = vs % where_.stages;
  if (where_.local(stage)) {
    {
      std::lock_guard<std::mutex> l(mu_);
      box_[{step_, kind, vs, m}] = std::move(values);
    }
    cv_.notify_all();
    return;
  }
  std::string msg = "V";
  put_i64(msg, step_);
  put_i64(msg, kind);
  put_i64(msg, vs);
  put_i64(msg, m);
  msg += pack_hosts(values);
  where_.processes->send(where_.peer(stage), kStageTag, msg);
}

void StageLinks::poll_locked() {
  while (std::optional<ProcessGroup::Message> msg = where_.processes->try_recv(kStageTag)) {
    const std::string what = fmt::format("pipeline: a message from process {}", msg->rank);
    if (!msg->bytes.empty() && msg->bytes[0] == 'A') {
      // An abort of this step (a failed earlier step's, read only now, is left behind).
      const std::string body = msg->bytes.substr(1);
      Reader r{body, what};
      const int64_t step = r.i64();
      if (step < step_) continue;
      if (!failed_) reason_ = body.substr(r.at);
      failed_ = true;
      continue;
    }
    if (msg->bytes.empty() || msg->bytes[0] != 'V') throw Error(fmt::format("{}: not a stage's values", what));
    const std::string body = msg->bytes.substr(1);
    Reader r{body, what};
    const int64_t step = r.i64();
    const int kind = static_cast<int>(r.i64());
    const int64_t vs = r.i64(), m = r.i64();
    if (step < step_) continue;  // a failed step's leftovers
    box_[{step, kind, vs, m}] = unpack_hosts(body.substr(r.at), what);
  }
}

Hosts StageLinks::take(int kind, int64_t vs, int64_t m) {
  const Key key{step_, kind, vs, m};
  const auto start = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> l(mu_);
  for (;;) {
    if (where_.processes) poll_locked();
    if (failed_)
      throw Error(fmt::format("pipeline: stopped: another stage failed{}", reason_.empty() ? "" : ": " + reason_));
    auto it = box_.find(key);
    if (it != box_.end()) {
      Hosts v = std::move(it->second);
      box_.erase(it);
      return v;
    }
    if (!where_.processes) {
      cv_.wait(l);
      continue;
    }
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (timeout_s_ > 0 && waited > timeout_s_) {
      const int64_t from = kind == 0 ? vs - 1 : vs + 1;
      throw Error(fmt::format("pipeline: waited {:.0f} s for the {} of micro-batch {} from virtual stage {} (process "
                              "{}), in vain: is that process alive? (PipelineOptions::timeout_s)",
                              waited, kind == 0 ? "activations" : "gradients", m, from,
                              where_.peer(from % where_.stages)));
    }
    l.unlock();
    std::this_thread::sleep_for(std::chrono::microseconds(50));
    l.lock();
  }
}

void StageLinks::fail(const std::string& reason) {
  bool first = false;
  int64_t step = 0;
  {
    std::lock_guard<std::mutex> l(mu_);
    step = step_;
    first = !failed_;
    if (first) reason_ = reason;
    failed_ = true;
  }
  cv_.notify_all();
  if (first && where_.processes) {
    // Every other process's stage is told (a process waiting for this one's values stops), with
    // the step, so a later step does not read it as its own.
    std::string msg = "A";
    put_i64(msg, step);
    msg += reason;
    for (int r = 0; r < where_.processes->size(); ++r)
      if (r != where_.processes->rank()) where_.processes->send(r, kStageTag, msg);
  }
}

}  // namespace tessel::detail
