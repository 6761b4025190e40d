// pipeline_trainer (pipeline/trainer.hpp): a TrainerEngine over a PipelineTrainer, and the
// Trainer built on it.
#include "tessel/pipeline/trainer.hpp"

#include <fmt/format.h>

#include <exception>

#include "tessel/pipeline/schedule.hpp"

namespace tessel {

namespace {

class PipelineEngine final : public TrainerEngine {
 public:
  PipelineEngine(std::vector<PipelineStage> stages, const std::vector<Mesh>& meshes, std::vector<Runtime*> runtimes,
                 const std::map<std::string, HostTensor>& params, const PipelineOptions& o)
      : o_(o), meshes_(meshes), tr_(std::move(stages), meshes, std::move(runtimes), params, o) {}

  std::string describe() const override {
    std::vector<std::string> shapes;
    for (const Mesh& m : meshes_) shapes.push_back(m.to_string());
    bool alike = true;
    for (const std::string& s : shapes) alike = alike && s == shapes[0];
    return fmt::format("a pipeline of {} stages{} on {} ({}, {} micro-batches, ZeRO {} within each stage{})",
                       meshes_.size(), o_.chunks > 1 ? fmt::format(" x {} chunks", o_.chunks) : "",
                       alike ? "meshes " + shapes[0] : fmt::format("meshes {}", fmt::join(shapes, ", ")),
                       schedule_kind_name(o_.schedule), o_.micro, o_.zero,
                       o_.processes ? fmt::format(", {} processes", o_.processes->size()) : "");
  }
  int64_t micro_batches() const override { return o_.micro; }
  Step step(const std::vector<std::map<std::string, HostTensor>>& micro, double lr, int64_t t) override {
    const PipelineStepReport r = tr_.step(micro, lr, t);
    Step s;
    s.loss = r.loss;
    s.grad_norm = r.grad_norm;
    s.applied = r.applied;
    s.bubble = r.bubble;
    s.peak_in_flight = r.peak_in_flight;
    return s;
  }
  double evaluate(const std::map<std::string, HostTensor>& batch) override { return tr_.evaluate(batch); }
  std::map<std::string, HostTensor> state() const override { return tr_.state(); }
  HostTensor param(const std::string& name) const override { return tr_.params().at(name); }
  void set_state(const std::map<std::string, HostTensor>& values) override { tr_.set_state(values); }
  std::map<std::string, Sharding> state_shardings() const override { return tr_.state_shardings(); }
  SaveStats save(CheckpointDir& dir, int64_t step, const SaveOptions& options) override {
    const std::map<std::string, HostTensor> st = tr_.state();  // collective
    const bool writer = !o_.processes || o_.processes->rank() == 0;
    SaveStats stats;
    std::string error;
    if (writer) {
      try {
        dir.save(step, st, meshes_[0], {}, options);
        for (const auto& [n, h] : st) {
          stats.bytes_written += static_cast<int64_t>(h.bytes());
          ++stats.blocks_written;
        }
      } catch (const std::exception& e) {
        error = e.what();
      }
    }
    if (o_.processes) {  // the others wait until it is committed, and learn of a failure
      stats.processes = o_.processes->size();
      const std::string e0 = o_.processes->allgather(error)[0];
      if (!e0.empty()) throw Error(fmt::format("Trainer::save_checkpoint (rank 0 writes a pipeline's state): {}", e0));
    }
    if (!error.empty()) throw Error(error);
    return stats;
  }

 private:
  PipelineOptions o_;
  std::vector<Mesh> meshes_;
  PipelineTrainer tr_;
};

// The trainer's options into the pipeline's, refusing what a pipeline does not run.
PipelineOptions merged(const TrainerOptions& t, PipelineOptions p) {
  if (t.auto_shard)
    throw Error("pipeline_trainer: TrainerOptions::auto_shard plans one program; plan the stages with "
                "StageCutOptions::auto_shard (choose_stage_cuts), make them with stages_with_layouts and give them to "
                "pipeline_trainer's overload taking stages");
  if (t.train.remat == RematPolicy::einsums)
    throw Error("pipeline_trainer: TrainOptions::remat = einsums is not supported within pipeline stages (none: each "
                "stage keeps the activations its backward reads; all: each stage's backward recomputes its forward)");
  if (t.train.zero < 0 || t.train.zero > 3)
    throw Error(fmt::format("pipeline_trainer: TrainOptions::zero = {}: ZeRO 0 to 3 within each stage", t.train.zero));
  p.adamw = t.train.adamw;
  p.zero = t.train.zero;
  p.data_axis = t.train.data_axis;
  p.remat = t.train.remat;
  return p;
}

// Every parameter a zero-filled placeholder of its type (the engine is made before init()).
std::map<std::string, HostTensor> placeholders(const std::vector<Tensor>& params) {
  std::map<std::string, HostTensor> out;
  for (const Tensor& p : params) out.emplace(p.name(), HostTensor(p.value().dtype, p.value().shape));
  return out;
}

}  // namespace

Trainer pipeline_trainer(const Graph& model, Tensor loss, const std::vector<Tensor>& params,
                         std::vector<PipelineStage> stages, const std::vector<Mesh>& stage_meshes,
                         std::vector<Runtime*> runtimes, TrainerOptions options, PipelineOptions pipeline) {
  const PipelineOptions po = merged(options, std::move(pipeline));
  auto engine = std::make_unique<PipelineEngine>(std::move(stages), stage_meshes, std::move(runtimes),
                                                 placeholders(params), po);
  return Trainer(model, loss, params, std::move(engine), std::move(options));
}

Trainer pipeline_trainer(const Graph& model, Tensor loss, const std::vector<Tensor>& params,
                         const std::vector<Tensor>& cuts, const Mesh& mesh, std::vector<Runtime*> runtimes,
                         TrainerOptions options, PipelineOptions pipeline) {
  const int pipe = mesh.axis_index("pipe");
  if (pipe < 0)
    throw Error(fmt::format("pipeline_trainer: mesh {} has no 'pipe' axis (e.g. pipe=2,data=2: the stages, each on "
                            "the other axes)",
                            mesh.to_string()));
  const int64_t P = mesh.axis_size("pipe");
  if (static_cast<int64_t>(runtimes.size()) != P)
    throw Error(fmt::format("pipeline_trainer: {} runtimes for pipe={} of mesh {} (give one per stage)",
                            runtimes.size(), P, mesh.to_string()));
  if (static_cast<int64_t>(cuts.size()) != P * pipeline.chunks - 1)
    throw Error(fmt::format("pipeline_trainer: {} cuts for {} stages{}: give {} values to cut at",
                            cuts.size(), P,
                            pipeline.chunks > 1 ? fmt::format(" of {} chunks", pipeline.chunks) : std::string(),
                            P * pipeline.chunks - 1));
  std::vector<MeshAxis> axes;
  for (const MeshAxis& x : mesh.axes())
    if (x.name != "pipe") axes.push_back(x);
  if (axes.empty()) axes.push_back(MeshAxis{"data", 1});
  const Mesh stage_mesh(axes);
  merged(options, pipeline);  // refused before the stages are cut
  std::vector<PipelineStage> stages = split_stages(model, loss, params, cuts);
  const std::vector<Mesh> meshes(runtimes.size(), stage_mesh);
  return pipeline_trainer(model, loss, params, std::move(stages), meshes, std::move(runtimes), std::move(options),
                          std::move(pipeline));
}

}  // namespace tessel
