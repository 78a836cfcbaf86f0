// Scores a data file with a saved model (training.export_path).
//
//   predict --model=model.bin --data='test-*.txt' --out=scores.txt
//
// The data's format is the one the model was trained on (Criteo, libsvm,
// Fashion-MNIST: --data is then the directory of the idx files; synthetic:
// the job's test split, --data not used). --out gets one line per example:
// the click probability, or the class probabilities of an MLP. A JSON
// summary (examples, and AUC / log loss / accuracy against the file's
// labels) goes to stdout. Keys the model never saw get their table's
// initial values, as the servers would answer.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/config.h"
#include "common/initializer.h"
#include "common/logging.h"
#include "common/model_layout.h"
#include "common/status.h"
#include "worker/compute/compute_factory.h"
#include "worker/data/dataset.h"
#include "worker/evaluation.h"
#include "worker/model_file.h"
#include "worker/models/model.h"

ABSL_FLAG(std::string, model, "", "Saved model file. Required.");
ABSL_FLAG(std::string, data, "",
          "Data to score: files or globs, comma-separated (Criteo, libsvm), "
          "or the idx directory (Fashion-MNIST).");
ABSL_FLAG(std::string, out, "", "Write one score line per example here.");
ABSL_FLAG(std::string, log_level, "info", "trace|debug|info|warn|error");

namespace ps {
namespace {

// Points the config's test data at --data (files or globs, or the idx
// directory); a model trained on synthetic data has no --data to take.
absl::Status SetTestData(const std::string& data, DataConfig* d) {
  if (d->has_files()) {
    d->mutable_files()->clear_test_files();
    for (absl::string_view f : absl::StrSplit(data, ',', absl::SkipEmpty())) {
      d->mutable_files()->add_test_files(std::string(f));
    }
  } else if (d->has_fashion_mnist()) {
    d->mutable_fashion_mnist()->set_dir(data);
  } else {
    return absl::InvalidArgumentError(
        "--data: this model was trained on synthetic data; leave --data "
        "out to score its test split");
  }
  return absl::OkStatus();
}

// The saved model's sparse rows for `keys` into `rows` (keys.size() x
// sparse_dim), keys it never saw with `table`'s initial values as the
// servers would answer; returns how many keys were unseen.
uint64_t SavedRows(const SavedModel& saved,
                   const absl::flat_hash_map<uint64_t, uint32_t>& row_of,
                   const TableConfig& table, uint32_t sparse_dim,
                   absl::Span<const uint64_t> keys, std::vector<float>* rows) {
  uint64_t unseen = 0;
  rows->resize(keys.size() * sparse_dim);
  for (size_t i = 0; i < keys.size(); ++i) {
    float* row = &(*rows)[i * sparse_dim];
    auto it = row_of.find(keys[i]);
    if (it != row_of.end()) {
      std::copy_n(&saved.rows[size_t{it->second} * sparse_dim], sparse_dim,
                  row);
    } else {
      ++unseen;
      InitializeValues(table.init(), table.id(), keys[i], 0, sparse_dim, row);
    }
  }
  return unseen;
}

// The JSON summary line on stdout.
void PrintSummary(const EvalResult& eval, const data::ReadStats& stats,
                  uint64_t unseen) {
  auto number = [](double v) {
    return std::isfinite(v) ? absl::StrFormat("%.5f", v) : std::string("null");
  };
  std::cout << absl::StrCat("{\"examples\":", eval.examples,
                            ",\"bad_lines\":", stats.bad_lines,
                            ",\"unseen_keys\":", unseen,
                            ",\"auc\":", number(eval.auc),
                            ",\"logloss\":", number(eval.logloss),
                            ",\"accuracy\":", number(eval.accuracy), "}")
            << std::endl;
}

absl::Status Predict(const std::string& model_path, const std::string& data,
                     const std::string& out_path) {
  auto log = GetLogger("predict");
  PS_ASSIGN_OR_RETURN(SavedModel saved, LoadModel(model_path));
  JobConfig config = saved.config;
  if (!data.empty()) {
    PS_RETURN_IF_ERROR(SetTestData(data, config.mutable_data()));
  }
  PS_ASSIGN_OR_RETURN(ModelLayout layout, LayoutModel(config));
  if (saved.dense.size() != layout.dense_size ||
      (layout.sparse_dim > 0 && saved.sparse_dim != layout.sparse_dim)) {
    return absl::DataLossError(absl::StrCat(
        model_path, ": parameter sizes do not match the saved config"));
  }
  const TableConfig* sparse_table = nullptr;
  if (layout.sparse_dim > 0) {
    PS_ASSIGN_OR_RETURN(sparse_table,
                        FindTable(config, config.training().sparse_table()));
  }
  absl::flat_hash_map<uint64_t, uint32_t> row_of;
  row_of.reserve(saved.keys.size());
  for (size_t i = 0; i < saved.keys.size(); ++i) row_of[saved.keys[i]] = i;

  std::string why_cpu;
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Compute> compute,
                      CreateCompute(CPU, 1, &why_cpu));
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Model> model,
                      Model::Create(layout, compute.get()));
  PS_ASSIGN_OR_RETURN(
      std::unique_ptr<data::Dataset> dataset,
      data::OpenDataset(config.data(), data::Split::kTest, 0, 1, 8192, false));
  std::FILE* out = nullptr;
  if (!out_path.empty()) {
    out = std::fopen(out_path.c_str(), "w");
    if (out == nullptr) {
      return absl::UnavailableError(absl::StrCat("cannot write ", out_path));
    }
  }
  const bool binary = layout.kind != ModelConfig::MLP;
  const int classes = binary ? 1 : static_cast<int>(layout.top.back().out);
  data::ExampleBatch batch;
  SparseIndexer indexer;
  SparseInput sparse;
  ModelOutput output;
  std::vector<float> rows;
  EvalAccumulator scores(classes);
  uint64_t unseen = 0;
  while (true) {
    PS_ASSIGN_OR_RETURN(size_t n, dataset->Next(8192, &batch));
    if (n == 0) break;
    PS_RETURN_IF_ERROR(indexer.Index(layout, batch, &sparse));
    if (sparse_table != nullptr) {
      unseen += SavedRows(saved, row_of, *sparse_table, layout.sparse_dim,
                          sparse.keys, &rows);
    }
    PS_RETURN_IF_ERROR(model->Run(batch, sparse, rows.data(),
                                  saved.dense.data(), false, &output));
    scores.Add(batch, output);
    for (size_t i = 0; out != nullptr && i < n; ++i) {
      const float* p = &output.probs[i * classes];
      for (int c = 0; c < classes; ++c) {
        std::fprintf(out, c + 1 < classes ? "%.6g " : "%.6g\n", p[c]);
      }
    }
  }
  if (out != nullptr && std::fclose(out) != 0) {
    return absl::UnavailableError(absl::StrCat("cannot write ", out_path));
  }
  const data::ReadStats stats = dataset->stats();
  for (const std::string& r : dataset->bad_line_reports()) log->warn("{}", r);
  PrintSummary(scores.Result(), stats, unseen);
  return absl::OkStatus();
}

}  // namespace
}  // namespace ps

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (absl::Status s = ps::SetLogLevel(absl::GetFlag(FLAGS_log_level));
      !s.ok()) {
    std::cerr << "predict: " << s.message() << "\n";
    return 2;
  }
  const std::string model = absl::GetFlag(FLAGS_model);
  if (model.empty()) {
    std::cerr << "predict: --model is required\n";
    return 2;
  }
  absl::Status s =
      ps::Predict(model, absl::GetFlag(FLAGS_data), absl::GetFlag(FLAGS_out));
  if (!s.ok()) {
    std::cerr << "predict: " << s << "\n";
    return 1;
  }
  return 0;
}
