// thread_world.cpp — ThreadWorld: the world of the thread communicators of one mesh. It
// creates the shared state of each axis group on the first request for one of its members'
// communicators, hands out the communicators (thread_communicator.cpp), and aborts: marks the
// world failed and wakes every member blocked in a collective of any of its groups.
#include "tessel/runtime/cpu/thread_communicator.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "../spin.hpp"
#include "thread_group_state.hpp"

namespace tessel {

ThreadWorld::ThreadWorld(const Mesh& mesh, ThreadWorldOptions options)
    : mesh_(mesh), options_(options) {
  if (std::isnan(options_.timeout_seconds) || options_.timeout_seconds < 0)
    throw RuntimeError(fmt::format("tessel: ThreadWorldOptions::timeout_seconds must be >= 0 "
                                   "(0 or inf: no timeout), got {}", options_.timeout_seconds));
  // Automatic: one thread per device is the caller's usual set-up (ThreadRuntime passes its own
  // budget, counting its stream workers too).
  spin_us_ = detail::spin_budget_us(options_.spin_us, mesh_.num_devices());
}

ThreadWorld::~ThreadWorld() = default;

void ThreadWorld::set_spin_us(int spin_us) {
  if (spin_us < 0) throw RuntimeError(fmt::format("ThreadWorld::set_spin_us: {} us is negative", spin_us));
  if (spin_us > 1000000)
    throw RuntimeError(fmt::format("ThreadWorld::set_spin_us: {} us is outside [0, 1000000]", spin_us));
  std::lock_guard<std::mutex> lk(mutex_);
  spin_us_ = spin_us;
}

std::unique_ptr<Communicator> ThreadWorld::communicator(int64_t position,
                                                        const std::vector<std::string>& axes) {
  check_not_aborted("communicator");
  if (position < 0 || position >= mesh_.num_devices())
    throw MeshError("tessel: ThreadWorld::communicator: position " + std::to_string(position) +
                    " is not a device of mesh " + mesh_.to_string() + " (0.." +
                    std::to_string(mesh_.num_devices() - 1) + ")");
  // Throws MeshError naming an unknown or repeated axis.
  std::vector<int64_t> members = mesh_.group(position, axes);
  const auto it = std::find(members.begin(), members.end(), position);
  if (it == members.end())
    throw MeshError("tessel: ThreadWorld::communicator: mesh group of device " +
                    std::to_string(position) + " does not contain it");
  const int rank = static_cast<int>(it - members.begin());
  std::shared_ptr<detail::ThreadGroupState> state;
  int spin_us = 0;
  {
    std::lock_guard<std::mutex> lk(mutex_);
    spin_us = spin_us_;  // set_spin_us may change it
    auto key = std::make_pair(axes, members);
    auto found = groups_.find(key);
    if (found == groups_.end())
      found = groups_
                  .emplace(std::move(key),
                           std::make_shared<detail::ThreadGroupState>(axes, members))
                  .first;
    state = found->second;
  }
  return detail::make_thread_communicator(this, std::move(state), rank, spin_us, options_.link_model);
}

void ThreadWorld::abort(std::string reason) {
  std::vector<std::shared_ptr<detail::ThreadGroupState>> groups;
  {
    std::lock_guard<std::mutex> lk(mutex_);
    if (!aborted_.load(std::memory_order_relaxed)) {
      reason_ = std::move(reason);
      aborted_.store(true, std::memory_order_release);
    }
    groups.reserve(groups_.size());
    for (auto& kv : groups_) groups.push_back(kv.second);
  }
  // Lock each group's mutex once so a member between its predicate check and its wait
  // cannot miss the notification.
  for (auto& g : groups) {
    { std::lock_guard<std::mutex> lk(g->mu); }
    g->cv.notify_all();
  }
}

std::string ThreadWorld::abort_reason() const {
  std::lock_guard<std::mutex> lk(mutex_);
  return reason_;
}

void ThreadWorld::check_not_aborted(const char* what) const {
  if (aborted())
    throw RuntimeError(std::string("tessel: ") + what + ": the thread world of mesh " +
                       mesh_.to_string() + " was aborted: " + abort_reason());
}

}  // namespace tessel
