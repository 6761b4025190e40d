// The Trainer's checkpoints: its device state written and read through a CheckpointDir (the
// one implementation gpt_train and the planner's pool use; tessel/train/trainer.hpp).
#include <fmt/format.h>

#include "tessel/checkpoint/checkpoint.hpp"
#include "tessel/train/trainer.hpp"

namespace tessel {

SaveStats Trainer::save_checkpoint(CheckpointDir& dir, const SaveOptions& options) {
  if (engine()) return engine()->save(dir, steps_done(), options);  // through the host
  return dir.save(steps_done(), device_state(), program(), options);
}

void Trainer::restore_checkpoint(const CheckpointDir& dir, int64_t step, const RestoreOptions& options,
                                 ReadStats* stats) {
  const Manifest m = dir.manifest(step);  // Error naming the folder and the committed steps
  if (engine()) {  // the state read whole on the host, set through the engine
    std::map<std::string, HostTensor> values;
    for (const std::string& p : param_names())
      for (const std::string& name : {p, "adam.m." + p, "adam.v." + p}) {
        if (!m.find(name))
          throw Error(fmt::format("Trainer::restore_checkpoint: step {} of {} has no '{}', a value of this trainer's "
                                  "state; was it saved by a trainer of the same model?",
                                  step, dir.path(), name));
        values[name] = dir.read(step, name, stats);
      }
    set_state(TrainState{step, std::move(values)});
    return;
  }
  std::map<std::string, ShardedArray> state;
  for (const auto& [name, sharding] : state_shardings()) {
    if (!m.find(name)) {
      std::vector<std::string> names;
      for (const CheckpointArray& a : m.arrays) names.push_back(a.name);
      throw Error(fmt::format("Trainer::restore_checkpoint: step {} of {} has no '{}', a value of this trainer's state "
                              "(it holds: {}); was it saved by a trainer of the same model?",
                              step, dir.path(), name, fmt::join(names, ", ")));
    }
    state[name] = dir.restore_to_device(step, name, program(), name, stats, options);
  }
  set_device_state(step, std::move(state));
}

}  // namespace tessel
