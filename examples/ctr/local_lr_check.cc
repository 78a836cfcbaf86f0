// Single-process sanity check of the synthetic CTR data: trains logistic
// regression with per-coordinate Adagrad on the train split (no parameter
// server) and reports, after each epoch, test AUC and log loss next to the
// oracle's (the generating model's true logits). It shows whether the data
// are learnable to near the oracle with the hyperparameters the distributed
// job uses, and how fast the generator is.
//
// The update mirrors server/optimizer.cc's Adagrad
// (acc += g^2; w -= lr * g / (sqrt(acc) + eps)), with weights starting at 0
// and accumulators at --initial_accumulator. A step's gradient for a weight
// is the SUM over the batch of the per-example gradients (what a worker
// pushes when it adds up its examples' gradients per key); --mean_gradient
// divides by the batch size instead.
//
// Usage: local_lr_check [--lr=0.05] [--epochs=3] [--num_train=...] ...
// Config flags left at 0 take ps::ApplyDefaults' defaults. Exit status 1 on
// a bad config.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/config.h"
#include "common/status.h"
#include "proto/config.pb.h"
#include "worker/data/synthetic_ctr.h"
#include "worker/metrics.h"

ABSL_FLAG(double, lr, 0.05, "Adagrad learning rate");
ABSL_FLAG(double, initial_accumulator, 0.1, "Adagrad initial accumulator");
ABSL_FLAG(double, epsilon, 1e-8, "Adagrad epsilon");
ABSL_FLAG(uint32_t, epochs, 3, "passes over the train split");
ABSL_FLAG(uint32_t, batch_size, 1024, "examples per step");
ABSL_FLAG(bool, mean_gradient, false,
          "divide batch gradients by the batch size instead of summing");

// SyntheticCtrConfig overrides; 0 keeps the default from ps::ApplyDefaults.
ABSL_FLAG(uint64_t, num_train, 0, "train examples");
ABSL_FLAG(uint64_t, num_test, 0, "test examples");
ABSL_FLAG(uint64_t, seed, 0, "generator seed");
ABSL_FLAG(uint32_t, num_categorical, 0, "categorical fields");
ABSL_FLAG(uint32_t, num_numeric, 0, "numeric fields");
ABSL_FLAG(uint32_t, max_vocab, 0, "largest vocabulary");
ABSL_FLAG(uint32_t, min_vocab, 0, "smallest vocabulary");
ABSL_FLAG(double, zipf_exponent, 0, "Zipf exponent");
ABSL_FLAG(double, weight_scale, 0, "std of the true weights");
ABSL_FLAG(double, bias, 0,
          "true bias (0 means the default: proto3 cannot tell)");
ABSL_FLAG(uint32_t, interaction_rank, 0,
          "latent dimension of the true pairwise interactions (0: none)");
ABSL_FLAG(double, interaction_scale, 0,
          "std of the true latent factors (0: the default, 0.1)");

namespace ps::ctr {
namespace {

struct Param {
  float w = 0;
  float acc = 0;
};

class LogisticRegression {
 public:
  LogisticRegression(uint32_t num_numeric, float lr, float init_acc, float eps)
      : lr_(lr), init_acc_(init_acc), eps_(eps), dense_(num_numeric + 1) {
    for (Param& p : dense_) p.acc = init_acc;
  }

  // Logits of the batch's examples with the current weights. Unseen keys
  // count as weight 0 (and are not inserted).
  void Predict(const Batch& b, uint32_t nf, uint32_t nn,
               std::vector<float>* logits) const {
    logits->resize(b.size);
    for (size_t e = 0; e < b.size; ++e) {
      double z = dense_[nn].w;  // bias
      for (uint32_t f = 0; f < nf; ++f) {
        auto it = sparse_.find(b.keys[e * nf + f]);
        if (it != sparse_.end()) z += it->second.w;
      }
      for (uint32_t j = 0; j < nn; ++j) {
        z += dense_[j].w * b.numeric[e * nn + j];
      }
      (*logits)[e] = static_cast<float>(z);
    }
  }

  // One step: gradients of the batch's log loss at the current weights,
  // then one Adagrad update per touched weight.
  void Step(const Batch& b, uint32_t nf, uint32_t nn, bool mean) {
    Predict(b, nf, nn, &logits_);
    const float scale = mean ? 1.0f / b.size : 1.0f;
    grad_.clear();
    dense_grad_.assign(nn + 1, 0.0);
    for (size_t e = 0; e < b.size; ++e) {
      const double p = 1.0 / (1.0 + std::exp(-static_cast<double>(logits_[e])));
      const double g = (p - b.labels[e]) * scale;
      for (uint32_t f = 0; f < nf; ++f) grad_[b.keys[e * nf + f]] += g;
      for (uint32_t j = 0; j < nn; ++j) {
        dense_grad_[j] += g * b.numeric[e * nn + j];
      }
      dense_grad_[nn] += g;
    }
    for (const auto& [key, g] : grad_) {
      auto [it, inserted] = sparse_.try_emplace(key);
      if (inserted) it->second.acc = init_acc_;
      Apply(static_cast<float>(g), &it->second);
    }
    for (uint32_t j = 0; j <= nn; ++j) {
      Apply(static_cast<float>(dense_grad_[j]), &dense_[j]);
    }
  }

  size_t num_sparse() const { return sparse_.size(); }

 private:
  void Apply(float g, Param* p) const {
    p->acc += g * g;
    p->w -= lr_ * g / (std::sqrt(p->acc) + eps_);
  }

  const float lr_, init_acc_, eps_;
  absl::flat_hash_map<uint64_t, Param> sparse_;
  std::vector<Param> dense_;  // numeric weights, then the bias
  // Scratch, kept to avoid reallocation.
  std::vector<float> logits_;
  absl::flat_hash_map<uint64_t, double> grad_;
  std::vector<double> dense_grad_;
};

double Mean(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += x;
  return v.empty() ? 0 : s / v.size();
}

std::vector<float> Sigmoid(const std::vector<float>& z) {
  std::vector<float> p(z.size());
  for (size_t i = 0; i < z.size(); ++i) p[i] = 1.0f / (1.0f + std::exp(-z[i]));
  return p;
}

int Run() {
  JobConfig job;
  SyntheticCtrConfig* c = job.mutable_data()->mutable_synthetic_ctr();
  c->set_num_train(absl::GetFlag(FLAGS_num_train));
  c->set_num_test(absl::GetFlag(FLAGS_num_test));
  c->set_seed(absl::GetFlag(FLAGS_seed));
  c->set_num_categorical(absl::GetFlag(FLAGS_num_categorical));
  c->set_num_numeric(absl::GetFlag(FLAGS_num_numeric));
  c->set_max_vocab(absl::GetFlag(FLAGS_max_vocab));
  c->set_min_vocab(absl::GetFlag(FLAGS_min_vocab));
  c->set_zipf_exponent(absl::GetFlag(FLAGS_zipf_exponent));
  c->set_weight_scale(absl::GetFlag(FLAGS_weight_scale));
  c->set_bias(absl::GetFlag(FLAGS_bias));
  c->set_interaction_rank(absl::GetFlag(FLAGS_interaction_rank));
  c->set_interaction_scale(absl::GetFlag(FLAGS_interaction_scale));
  ApplyDefaults(&job);
  absl::PrintF("config: %s\n", c->ShortDebugString());

  absl::Time t0 = absl::Now();
  auto gen_or = SyntheticCtr::Create(*c);
  if (!gen_or.ok()) {
    absl::FPrintF(stderr, "bad config: %s\n", gen_or.status().ToString());
    return 1;
  }
  const SyntheticCtr& gen = *gen_or;
  const uint32_t nf = gen.num_categorical(), nn = gen.num_numeric();
  const uint32_t bs = absl::GetFlag(FLAGS_batch_size);
  if (bs == 0) {
    absl::FPrintF(stderr, "--batch_size must be > 0\n");
    return 1;
  }
  absl::PrintF("create: %.1f ms\n",
               absl::ToDoubleMilliseconds(absl::Now() - t0));

  // Generation speed and train click rate: one pass over the train split.
  Batch batch;
  double clicks = 0;
  t0 = absl::Now();
  const uint64_t n_train = gen.size(Split::kTrain);
  for (uint64_t b = 0; b < n_train; b += bs) {
    const uint64_t n = std::min<uint64_t>(bs, n_train - b);
    if (absl::Status s = gen.Fill(Split::kTrain, b, n, &batch); !s.ok()) {
      absl::FPrintF(stderr, "%s\n", s.ToString());
      return 1;
    }
    for (size_t e = 0; e < batch.size; ++e) clicks += batch.labels[e];
  }
  const double gen_s = absl::ToDoubleSeconds(absl::Now() - t0);
  absl::PrintF(
      "generate train: %d examples in %.3f s (%.2f M examples/s, one core); "
      "click rate %.4f\n",
      n_train, gen_s, n_train / gen_s / 1e6,
      clicks / std::max<uint64_t>(n_train, 1));

  // Test split once, kept in memory.
  Batch test;
  if (absl::Status s = gen.Fill(Split::kTest, 0, gen.size(Split::kTest), &test);
      !s.ok()) {
    absl::FPrintF(stderr, "%s\n", s.ToString());
    return 1;
  }
  const double oracle_auc = Auc(test.true_logits, test.labels);
  const double oracle_ll = LogLoss(Sigmoid(test.true_logits), test.labels);
  absl::PrintF(
      "test: %d examples, click rate %.4f, oracle AUC %.4f, oracle "
      "logloss %.4f\n",
      test.size, Mean(test.labels), oracle_auc, oracle_ll);

  LogisticRegression model(nn, absl::GetFlag(FLAGS_lr),
                           absl::GetFlag(FLAGS_initial_accumulator),
                           absl::GetFlag(FLAGS_epsilon));
  std::vector<float> logits;
  const bool mean = absl::GetFlag(FLAGS_mean_gradient);
  for (uint32_t epoch = 1; epoch <= absl::GetFlag(FLAGS_epochs); ++epoch) {
    t0 = absl::Now();
    for (uint64_t b = 0; b < n_train; b += bs) {
      const uint64_t n = std::min<uint64_t>(bs, n_train - b);
      if (absl::Status s = gen.Fill(Split::kTrain, b, n, &batch); !s.ok()) {
        absl::FPrintF(stderr, "%s\n", s.ToString());
        return 1;
      }
      model.Step(batch, nf, nn, mean);
    }
    const double train_s = absl::ToDoubleSeconds(absl::Now() - t0);
    model.Predict(test, nf, nn, &logits);
    const double auc = Auc(logits, test.labels);
    const double ll = LogLoss(Sigmoid(logits), test.labels);
    absl::PrintF(
        "epoch %d: test AUC %.4f  logloss %.4f  | oracle AUC %.4f  logloss "
        "%.4f  | AUC gap %.4f  logloss gap %.4f  (%d keys, %.1f s)\n",
        epoch, auc, ll, oracle_auc, oracle_ll, oracle_auc - auc, ll - oracle_ll,
        model.num_sparse(), train_s);
  }
  return 0;
}

}  // namespace
}  // namespace ps::ctr

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return ps::ctr::Run();
}
