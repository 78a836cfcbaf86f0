// Training throughput: examples per second per worker core for
// LR, FM and DLRM-lite at several batch sizes, against PyTorch's CPU build
// running the same model in the same run (tests/bench/torch_train.py, via
// --torch_json).
//
// Two figures per (model, batch size), both on synthetic Criteo-shaped data
// (26 categorical fields, 13 numeric features, default vocabularies):
//   <model>_b<B>_compute_examples_per_s: the worker's model alone on one
//     core: key deduplication, forward and backward (worker/models), no
//     communication and no optimizer.
//   <model>_b<B>_train_prefetch_examples_per_s: the same with
//     training.prefetch (the next step's pull overlaps this step's compute).
//   <model>_b<B>_train_examples_per_s: whole training steps through a
//     parameter server: an in-process scheduler and one server on loopback,
//     one worker (worker/trainer.cc, one compute thread): read the batch,
//     pull, forward/backward, push, the server's optimizer. The server and
//     the worker's I/O thread run on the machine's other core(s).
// The baseline of all three is PyTorch's examples/s for the same model and
// batch size with torch.set_num_threads(1), including its optimizer step;
// ratio is value / baseline.
//
// With a usable GPU the three figures are repeated with training.device GPU
// (gpu_<model>_b<B>_{compute,train,train_prefetch}_examples_per_s). Their
// baseline is PyTorch on the same GPU (torch_train.py --device=cuda, metric
// torch_gpu_<model>_b<B>_examples_per_s), whose step includes its optimizer
// on the GPU; null when that line is missing from --torch_json. A GPU that
// is usable but fails a measurement fails the bench: the figure would
// otherwise silently vanish.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/config.h"
#include "common/logging.h"
#include "common/model_layout.h"
#include "common/status.h"
#include "tests/testing/cluster.h"
#include "worker/compute/compute_factory.h"
#include "worker/data/dataset.h"
#include "worker/models/model.h"
#include "worker/trainer.h"

ABSL_FLAG(std::string, models, "lr,fm,dlrm", "Models to run.");
ABSL_FLAG(std::string, batch_sizes, "128,512,2048", "Batch sizes.");
ABSL_FLAG(double, seconds, 3.0, "Seconds per measurement.");
ABSL_FLAG(std::string, torch_json, "",
          "JSON lines from torch_train.py: the baselines.");

namespace ps {
namespace {

JobConfig BenchConfig(const std::string& model, uint32_t batch) {
  JobConfig c;
  c.mutable_cluster()->set_num_servers(1);
  c.mutable_cluster()->set_num_workers(1);
  c.mutable_consistency()->set_mode(ASYNC);
  SyntheticCtrConfig* d = c.mutable_data()->mutable_synthetic_ctr();
  d->set_num_train(50000000);
  d->set_num_test(1000);
  TrainingConfig* t = c.mutable_training();
  t->set_batch_size(batch);
  t->set_log_interval_s(1000);
  t->set_device(CPU);
  t->set_threads(1);
  t->set_sparse_table("sparse");
  t->set_dense_table("dense");
  TableConfig* sparse = c.add_tables();
  sparse->set_id(0);
  sparse->set_name("sparse");
  sparse->mutable_optimizer()->mutable_adagrad()->set_learning_rate(0.05f);
  TableConfig* dense = c.add_tables();
  dense->set_id(1);
  dense->set_name("dense");
  dense->mutable_dense();
  dense->mutable_optimizer()->mutable_adam()->set_learning_rate(0.001f);
  ModelConfig* m = t->mutable_model();
  if (model == "lr") {
    m->set_kind(ModelConfig::LR);
  } else if (model == "fm") {
    m->set_kind(ModelConfig::FM);
    m->set_embedding_dim(8);
  } else {
    m->set_kind(ModelConfig::DLRM);
    m->set_embedding_dim(16);
    m->add_bottom_mlp(64);
    m->add_top_mlp(64);
  }
  ApplyDefaults(&c);
  auto layout = LayoutModel(c);
  sparse->mutable_sparse()->set_dim(layout.ok() ? layout->sparse_dim : 1);
  dense->mutable_dense()->set_size(layout.ok() ? layout->dense_size : 1);
  return c;
}

// Examples/s of the model alone (dedup + forward + backward).
absl::StatusOr<double> ComputeRate(const JobConfig& config, ComputeDevice device) {
  PS_ASSIGN_OR_RETURN(ModelLayout layout, LayoutModel(config));
  std::string why;
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Compute> compute, CreateCompute(device, 1, &why));
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, Model::Create(layout, compute.get()));
  const uint32_t batch = config.training().batch_size();
  PS_ASSIGN_OR_RETURN(auto data, data::OpenDataset(config.data(), data::Split::kTrain,
                                                   0, 1, batch, false));
  // A pool of batches read up front: reading is not what is measured here.
  std::vector<data::ExampleBatch> pool(8);
  for (auto& b : pool) PS_RETURN_IF_ERROR(data->Next(batch, &b).status());
  SparseIndexer indexer;
  SparseInput sparse;
  ModelOutput out;
  std::vector<float> rows;
  std::vector<float> dense = InitialDenseParameters(layout, 1.0f, 1);
  uint64_t examples = 0;
  const absl::Duration budget = absl::Seconds(absl::GetFlag(FLAGS_seconds));
  absl::Time start;
  for (int step = 0;; ++step) {
    if (step == 3) {
      start = absl::Now();
      examples = 0;
    }
    const data::ExampleBatch& b = pool[step % pool.size()];
    PS_RETURN_IF_ERROR(indexer.Index(layout, b, &sparse));
    rows.assign(sparse.keys.size() * layout.sparse_dim, 0.01f);
    PS_RETURN_IF_ERROR(model->Run(b, sparse, rows.data(), dense.data(), true, &out));
    examples += b.size;
    if (step > 3 && absl::Now() - start >= budget) break;
  }
  return examples / absl::ToDoubleSeconds(absl::Now() - start);
}

// Examples/s of whole training steps through one in-process server.
absl::StatusOr<double> TrainRate(JobConfig config, double compute_rate,
                                 bool prefetch) {
  config.mutable_training()->set_prefetch(prefetch);
  const uint32_t batch = config.training().batch_size();
  // Enough steps for about --seconds at a quarter of the compute rate.
  const double seconds = absl::GetFlag(FLAGS_seconds);
  const uint64_t steps = std::max<uint64_t>(
      20, static_cast<uint64_t>(compute_rate * seconds / 4 / batch));
  config.mutable_training()->set_max_steps(steps);
  PS_ASSIGN_OR_RETURN(auto cluster, testing::InProcessCluster::Start(config));
  PS_ASSIGN_OR_RETURN(auto workers, cluster->AddWorkers(1));
  testing::InProcessWorker& w = workers[0];
  PS_ASSIGN_OR_RETURN(auto trainer, Trainer::Create(config, w.kv, 0, 1));
  TrainerHooks hooks;
  hooks.on_clock = [&w](uint64_t c) { w.member->set_clock(c); };
  PS_ASSIGN_OR_RETURN(TrainResult result, trainer->Train(hooks));
  cluster->CloseWaits();
  (void)w.member->Leave(true);
  return result.seconds > 0 ? result.examples / result.seconds : 0.0;
}

std::map<std::string, double> ReadBaselines(const std::string& path) {
  std::map<std::string, double> out;
  if (path.empty()) return out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    // {"bench": "train", "metric": "torch_dlrm_b512_...", "value": 123, ...}
    const size_t m = line.find("\"metric\": \"");
    const size_t v = line.find("\"value\": ");
    if (m == std::string::npos || v == std::string::npos) continue;
    const size_t ms = m + 11, me = line.find('"', ms);
    const size_t vs = v + 9, ve = line.find_first_of(",}", vs);
    double value = 0;
    if (absl::SimpleAtod(line.substr(vs, ve - vs), &value)) {
      out[line.substr(ms, me - ms)] = value;
    }
  }
  return out;
}

void Print(const std::string& metric, double value, double baseline) {
  std::printf(
      "{\"bench\":\"train\",\"metric\":\"%s\",\"value\":%.0f,\"unit\":"
      "\"examples/s\",\"baseline\":%s,\"ratio\":%s}\n",
      metric.c_str(), value,
      baseline > 0 ? absl::StrFormat("%.0f", baseline).c_str() : "null",
      baseline > 0 ? absl::StrFormat("%.2f", value / baseline).c_str() : "null");
  std::fflush(stdout);
}

// The three figures of one (model, batch size) on `device`: compute alone,
// whole steps, whole steps with prefetch. GPU figures are named gpu_*.
// Appends the summary's fields for them.
absl::Status MeasureOn(JobConfig config, ComputeDevice device, const std::string& name,
                       double baseline, std::vector<std::string>* summary) {
  config.mutable_training()->set_device(device);
  const std::string n = device == GPU ? "gpu_" + name : name;
  PS_ASSIGN_OR_RETURN(const double compute, ComputeRate(config, device));
  Print(n + "_compute_examples_per_s", compute, baseline);
  PS_ASSIGN_OR_RETURN(const double train, TrainRate(config, compute, /*prefetch=*/false));
  PS_ASSIGN_OR_RETURN(const double prefetch, TrainRate(config, compute, /*prefetch=*/true));
  Print(n + "_train_examples_per_s", train, baseline);
  Print(n + "_train_prefetch_examples_per_s", prefetch, baseline);
  summary->push_back(absl::StrFormat(
      "\"%s_train\":%.0f,\"%s_train_prefetch\":%.0f,\"%s_compute\":%.0f%s", n, train, n,
      prefetch, n, compute,
      baseline > 0 ? absl::StrFormat(",\"%s_torch\":%.0f", n, baseline) : ""));
  return absl::OkStatus();
}

int Main() {
  const auto baselines = ReadBaselines(absl::GetFlag(FLAGS_torch_json));
  std::string why;
  const bool gpu = GpuAvailable(&why);
  if (!gpu) std::fprintf(stderr, "# no GPU figures: %s\n", why.c_str());
  std::vector<std::string> summary;
  for (absl::string_view model : absl::StrSplit(absl::GetFlag(FLAGS_models), ',')) {
    for (absl::string_view b : absl::StrSplit(absl::GetFlag(FLAGS_batch_sizes), ',')) {
      uint32_t batch = 0;
      if (!absl::SimpleAtoi(b, &batch) || batch == 0) {
        std::fprintf(stderr, "train_bench: bad batch size '%s'\n", std::string(b).c_str());
        return 2;
      }
      const std::string name = absl::StrCat(model, "_b", batch);
      const JobConfig config = BenchConfig(std::string(model), batch);
      auto it = baselines.find(absl::StrCat("torch_", name, "_examples_per_s_per_core"));
      const double baseline = it == baselines.end() ? 0 : it->second;
      if (absl::Status s = MeasureOn(config, CPU, name, baseline, &summary); !s.ok()) {
        std::fprintf(stderr, "train_bench: %s\n", s.ToString().c_str());
        return 1;
      }
      if (gpu) {
        auto git = baselines.find(absl::StrCat("torch_gpu_", name, "_examples_per_s"));
        const double gpu_baseline = git == baselines.end() ? 0 : git->second;
        if (absl::Status s = MeasureOn(config, GPU, name, gpu_baseline, &summary); !s.ok()) {
          std::fprintf(stderr, "train_bench: GPU: %s\n", s.ToString().c_str());
          return 1;
        }
      }
    }
  }
  std::printf("{\"bench\":\"train\",\"summary\":{%s}}\n",
              absl::StrJoin(summary, ",").c_str());
  return 0;
}

}  // namespace
}  // namespace ps

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  (void)ps::SetLogLevel("warn");
  return ps::Main();
}
