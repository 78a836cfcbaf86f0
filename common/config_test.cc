#include "common/config.h"
#include "common/status.h"

#include <sys/stat.h>

#include <cmath>
#include <cstdlib>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// A copy of examples/ctr/async.pbtxt. The example's BUILD does not export
// the file, so the test carries its own copy; keep the two in sync when the
// schema changes so the shipped example stays known to be valid.
constexpr char kAsyncExample[] = R"pb(
# Sparse click-through-rate model (logistic regression) on synthetic data,
# trained asynchronously by 2 workers against 2 servers.
name: "ctr-async"

cluster {
  num_servers: 2
  num_workers: 2
  num_slots: 4096
  heartbeat_interval_ms: 500
  heartbeat_timeout_ms: 5000
}

consistency {
  mode: ASYNC
}

tables {
  id: 0
  name: "ctr_sparse"
  sparse { dim: 1 }
  optimizer { adagrad { learning_rate: 0.1 initial_accumulator: 1e-6 } }
  init { kind: ZEROS }
}

tables {
  id: 1
  name: "ctr_dense"
  dense { size: 14 }
  optimizer { adagrad { learning_rate: 0.1 initial_accumulator: 1e-6 } }
  init { kind: ZEROS }
}

data {
  synthetic_ctr {
    num_train: 1000000
    num_test: 100000
    seed: 1
  }
}

training {
  batch_size: 1024
  epochs: 3
  log_interval_s: 5
  sparse_table: "ctr_sparse"
  dense_table: "ctr_dense"
}
)pb";

// The smallest config that validates: only the two required cluster sizes.
constexpr char kMinimalCluster[] = "cluster { num_servers: 1 num_workers: 1 }\n";

// Parses text that must be rejected and returns the message, after checking
// the code: every config problem is the user's, so INVALID_ARGUMENT.
std::string RejectionOf(const std::string& text,
                        const std::string& source = "job.pbtxt") {
  absl::StatusOr<JobConfig> config = ParseJobConfig(text, source);
  EXPECT_FALSE(config.ok()) << "accepted:\n" << text;
  if (config.ok()) return "";
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument)
      << config.status();
  return std::string(config.status().message());
}

// A table block for tests that only care about one part of a table.
std::string SgdSparseTable(int id, const std::string& name, int dim = 1) {
  return absl::StrCat("tables { id: ", id, " name: \"", name,
                      "\" sparse { dim: ", dim,
                      " } optimizer { sgd { learning_rate: 0.5 } } }\n");
}

TEST(ParseJobConfigTest, ShippedAsyncExampleParses) {
  absl::StatusOr<JobConfig> config =
      ParseJobConfig(kAsyncExample, "examples/ctr/async.pbtxt");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->name(), "ctr-async");
  EXPECT_EQ(config->cluster().num_servers(), 2u);
  EXPECT_EQ(config->cluster().num_workers(), 2u);
  EXPECT_EQ(config->consistency().mode(), ASYNC);
  ASSERT_EQ(config->tables_size(), 2);
  EXPECT_EQ(config->tables(0).sparse().dim(), 1u);
  EXPECT_FLOAT_EQ(config->tables(0).optimizer().adagrad().learning_rate(),
                  0.1f);
  // An explicit non-zero value is kept, not replaced by the 0.1 default.
  EXPECT_FLOAT_EQ(config->tables(0).optimizer().adagrad().initial_accumulator(),
                  1e-6f);
  EXPECT_EQ(config->tables(1).dense().size(), 14u);
  EXPECT_EQ(config->training().epochs(), 3u);
  EXPECT_EQ(config->training().dense_table(), "ctr_dense");
}

TEST(ParseJobConfigTest, FillsDocumentedDefaults) {
  const std::string text =
      absl::StrCat(kMinimalCluster,
                   "tables { id: 3 name: \"w\" dense { size: 14 }"
                   "  optimizer { adagrad { learning_rate: 0.5 } } }\n"
                   "data { synthetic_ctr {} }\n");
  absl::StatusOr<JobConfig> config = ParseJobConfig(text, "job.pbtxt");
  ASSERT_TRUE(config.ok()) << config.status();

  EXPECT_EQ(config->name(), "job");
  const ClusterConfig& cl = config->cluster();
  EXPECT_EQ(cl.num_slots(), 4096u);
  EXPECT_EQ(cl.heartbeat_interval_ms(), 500u);
  EXPECT_EQ(cl.heartbeat_timeout_ms(), 5000u);
  EXPECT_EQ(cl.request_timeout_ms(), 30000u);
  EXPECT_EQ(cl.startup_timeout_ms(), 60000u);
  EXPECT_EQ(config->consistency().mode(), ASYNC);

  const TableConfig& t = config->tables(0);
  EXPECT_EQ(t.dense().block_size(), 65536u);
  EXPECT_FLOAT_EQ(t.optimizer().adagrad().learning_rate(), 0.5f);
  EXPECT_FLOAT_EQ(t.optimizer().adagrad().initial_accumulator(), 0.1f);
  EXPECT_FLOAT_EQ(t.optimizer().adagrad().epsilon(), 1e-8f);

  const SyntheticCtrConfig& d = config->data().synthetic_ctr();
  EXPECT_EQ(d.num_train(), 1000000u);
  EXPECT_EQ(d.num_test(), 100000u);
  EXPECT_EQ(d.seed(), 1u);
  EXPECT_EQ(d.num_categorical(), 26u);
  EXPECT_EQ(d.num_numeric(), 13u);
  EXPECT_EQ(d.max_vocab(), 1000u);
  EXPECT_EQ(d.min_vocab(), 10u);
  EXPECT_FLOAT_EQ(d.zipf_exponent(), 1.1f);
  EXPECT_FLOAT_EQ(d.weight_scale(), 0.3f);
  EXPECT_FLOAT_EQ(d.bias(), -2.0f);

  EXPECT_EQ(config->training().batch_size(), 1024u);
  EXPECT_EQ(config->training().epochs(), 1u);
  EXPECT_EQ(config->training().log_interval_s(), 5u);
}

// Defaults must not invent sections the user left out: a job without data
// has no data source.
TEST(ParseJobConfigTest, DefaultsDoNotCreateAbsentOneofs) {
  absl::StatusOr<JobConfig> config = ParseJobConfig(kMinimalCluster, "j");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_FALSE(config->data().has_synthetic_ctr());
  EXPECT_EQ(config->tables_size(), 0);
}

TEST(ApplyDefaultsTest, IsIdempotent) {
  absl::StatusOr<JobConfig> config = ParseJobConfig(kAsyncExample, "a");
  ASSERT_TRUE(config.ok()) << config.status();
  JobConfig again = *config;
  ApplyDefaults(&again);
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(*config, again))
      << again.DebugString();
}

TEST(ParseJobConfigTest, UnknownFieldNamesFileLineAndColumn) {
  const std::string text =
      "name: \"x\"\n"
      "cluster {\n"
      "  num_servrs: 2\n"
      "}\n";
  const std::string message = RejectionOf(text, "job.pbtxt");
  // TextFormat counts from 0; users count from 1. The column is where the
  // tokenizer stood when it noticed (protobuf 3.21: just past the name), so
  // only its presence is pinned.
  EXPECT_THAT(message, ContainsRegex("^job\\.pbtxt:3:[0-9]+: "));
  EXPECT_THAT(message, HasSubstr("no field named \"num_servrs\""));
}

TEST(ParseJobConfigTest, UnknownEnumValueIsAParseError) {
  // The value sits on line 3 together with the closing brace, because
  // TextFormat reports the position of the token after the bad value.
  const std::string message = RejectionOf(
      absl::StrCat("name: \"x\"\n", kMinimalCluster,
                   "consistency { mode: EVENTUAL }\n"),
      "job.pbtxt");
  EXPECT_THAT(message, ContainsRegex("^job\\.pbtxt:3:[0-9]+: "));
  EXPECT_THAT(message, HasSubstr("\"EVENTUAL\""));
}

TEST(ParseJobConfigTest, WrongValueTypeIsAParseError) {
  EXPECT_THAT(RejectionOf("cluster {\n  num_servers: \"two\"\n}\n", "j.txt"),
              StartsWith("j.txt:2:"));
  // A negative number for an unsigned field.
  EXPECT_THAT(RejectionOf("cluster { num_workers: -1 }\n", "j.txt"),
              StartsWith("j.txt:1:"));
  // A message where a scalar is expected.
  EXPECT_THAT(RejectionOf("name { }\n", "j.txt"), StartsWith("j.txt:1:"));
}

TEST(ValidateJobConfigTest, NumServersZero) {
  EXPECT_EQ(RejectionOf("cluster { num_servers: 0 num_workers: 1 }"),
            "job.pbtxt: cluster.num_servers: must be in 1..1024");
}

TEST(ValidateJobConfigTest, ClusterSizeLimits) {
  EXPECT_THAT(RejectionOf("cluster { num_servers: 1025 num_workers: 1 }"),
              HasSubstr("cluster.num_servers: "));
  EXPECT_THAT(RejectionOf("cluster { num_servers: 1 num_workers: 0 }"),
              HasSubstr("cluster.num_workers: "));
  EXPECT_THAT(RejectionOf("cluster { num_servers: 1 num_workers: 65537 }"),
              HasSubstr("cluster.num_workers: "));
  // The upper bounds themselves are allowed.
  EXPECT_TRUE(ParseJobConfig("cluster { num_servers: 1024 num_workers: 65536 }",
                             "j")
                  .ok());
}

TEST(ValidateJobConfigTest, DuplicateTableIdNamesTheSecondTable) {
  const std::string message = RejectionOf(absl::StrCat(
      kMinimalCluster, SgdSparseTable(7, "a"), SgdSparseTable(7, "b")));
  EXPECT_EQ(message, "job.pbtxt: tables[1].id: duplicate table id 7");
}

TEST(ValidateJobConfigTest, DuplicateTableName) {
  EXPECT_EQ(RejectionOf(absl::StrCat(kMinimalCluster, SgdSparseTable(1, "a"),
                                     SgdSparseTable(2, "a"))),
            "job.pbtxt: tables[1].name: duplicate table name 'a'");
}

TEST(ValidateJobConfigTest, TableIdAndNameChecks) {
  EXPECT_THAT(
      RejectionOf(absl::StrCat(kMinimalCluster, SgdSparseTable(65536, "a"))),
      HasSubstr("tables[0].id: must be < 65536"));
  EXPECT_THAT(RejectionOf(absl::StrCat(kMinimalCluster, SgdSparseTable(1, ""))),
              HasSubstr("tables[0].name: is required"));
}

TEST(ValidateJobConfigTest, SparseDimZero) {
  EXPECT_EQ(
      RejectionOf(absl::StrCat(kMinimalCluster, SgdSparseTable(0, "s", 0))),
      "job.pbtxt: tables[0].sparse.dim: must be in 1..65536");
  EXPECT_THAT(
      RejectionOf(absl::StrCat(kMinimalCluster, SgdSparseTable(0, "s", 65537))),
      HasSubstr("tables[0].sparse.dim: "));
}

TEST(ValidateJobConfigTest, DenseTableSize) {
  EXPECT_EQ(RejectionOf(absl::StrCat(
                kMinimalCluster,
                "tables { id: 0 name: \"d\" dense { size: 0 }"
                " optimizer { sgd { learning_rate: 1 } } }")),
            "job.pbtxt: tables[0].dense.size: must be in 1..2^40");
}

TEST(ValidateJobConfigTest, TableWithoutKind) {
  EXPECT_EQ(RejectionOf(absl::StrCat(
                kMinimalCluster,
                "tables { id: 0 name: \"t\""
                " optimizer { sgd { learning_rate: 1 } } }")),
            "job.pbtxt: tables[0]: set one of sparse, dense");
}

TEST(ValidateJobConfigTest, OptimizerMissing) {
  EXPECT_EQ(RejectionOf(absl::StrCat(kMinimalCluster,
                                     "tables { id: 0 name: \"t\" sparse { dim: "
                                     "4 } }")),
            "job.pbtxt: tables[0].optimizer: set one of sgd, adagrad, "
            "momentum, adam, ftrl");
}

TEST(ValidateJobConfigTest, LearningRateMustBeFinitePositive) {
  auto sgd = [](const std::string& lr) {
    return absl::StrCat(kMinimalCluster,
                        "tables { id: 0 name: \"t\" sparse { dim: 1 }"
                        " optimizer { sgd { learning_rate: ",
                        lr, " } } }");
  };
  const std::string kSgdError =
      "job.pbtxt: tables[0].optimizer.sgd.learning_rate: "
      "must be a finite number > 0";
  EXPECT_EQ(RejectionOf(sgd("-0.1")), kSgdError);
  EXPECT_EQ(RejectionOf(sgd("0")), kSgdError);
  EXPECT_EQ(RejectionOf(sgd("nan")), kSgdError);
  EXPECT_EQ(RejectionOf(sgd("inf")), kSgdError);
  EXPECT_TRUE(ParseJobConfig(sgd("1e-3"), "j").ok());

  auto adagrad = [](const std::string& body) {
    return absl::StrCat(kMinimalCluster,
                        "tables { id: 0 name: \"t\" sparse { dim: 1 }"
                        " optimizer { adagrad { ",
                        body, " } } }");
  };
  EXPECT_EQ(RejectionOf(adagrad("learning_rate: nan")),
            "job.pbtxt: tables[0].optimizer.adagrad.learning_rate: "
            "must be a finite number > 0");
  EXPECT_EQ(RejectionOf(adagrad("learning_rate: 1 initial_accumulator: -1")),
            "job.pbtxt: tables[0].optimizer.adagrad.initial_accumulator: "
            "must be >= 0");
  EXPECT_EQ(RejectionOf(adagrad("learning_rate: 1 epsilon: -1e-8")),
            "job.pbtxt: tables[0].optimizer.adagrad.epsilon: must be > 0");
}

TEST(ValidateJobConfigTest, HeartbeatTimeoutMustExceedInterval) {
  const std::string kError =
      "job.pbtxt: cluster.heartbeat_timeout_ms: must exceed "
      "cluster.heartbeat_interval_ms";
  EXPECT_EQ(RejectionOf("cluster { num_servers: 1 num_workers: 1"
                        " heartbeat_interval_ms: 100 heartbeat_timeout_ms: 100 }"),
            kError);
  EXPECT_EQ(RejectionOf("cluster { num_servers: 1 num_workers: 1"
                        " heartbeat_interval_ms: 200 heartbeat_timeout_ms: 100 }"),
            kError);
  // The check runs after defaults: a timeout below the default interval
  // (500 ms) is rejected too.
  EXPECT_EQ(RejectionOf("cluster { num_servers: 1 num_workers: 1"
                        " heartbeat_timeout_ms: 400 }"),
            kError);
  EXPECT_TRUE(ParseJobConfig("cluster { num_servers: 1 num_workers: 1"
                             " heartbeat_interval_ms: 100"
                             " heartbeat_timeout_ms: 101 }",
                             "j")
                  .ok());
}

TEST(ValidateJobConfigTest,
     IsolationHoldDefaultsToFiveTimeoutsAndFiveSecondsAtMostUnreachable) {
  auto cluster = [](const std::string& fields) -> absl::StatusOr<JobConfig> {
    return ParseJobConfig(
        absl::StrCat("cluster { num_servers: 1 num_workers: 1 ", fields, " }"),
        "j");
  };
  absl::StatusOr<JobConfig> config = cluster("");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->cluster().isolation_hold_ms(), 30000u);  // 5 x 5000 + 5000
  // Capped at scheduler_unreachable_timeout_ms (60000 by default).
  config = cluster("heartbeat_timeout_ms: 20000");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->cluster().isolation_hold_ms(), 60000u);
  config = cluster("isolation_hold_ms: 60000");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->cluster().isolation_hold_ms(), 60000u);

  EXPECT_EQ(RejectionOf("cluster { num_servers: 1 num_workers: 1"
                        " isolation_hold_ms: 60001 }"),
            "job.pbtxt: cluster.isolation_hold_ms: must be at most "
            "cluster.scheduler_unreachable_timeout_ms");
  EXPECT_EQ(RejectionOf("cluster { num_servers: 1 num_workers: 1"
                        " scheduler_unreachable_timeout_ms: 10000"
                        " isolation_hold_ms: 10001 }"),
            "job.pbtxt: cluster.isolation_hold_ms: must be at most "
            "cluster.scheduler_unreachable_timeout_ms");
}

TEST(ValidateJobConfigTest, NumSlotsAtLeastNumServers) {
  EXPECT_EQ(RejectionOf("cluster { num_servers: 4 num_workers: 1 num_slots: 3 }"),
            "job.pbtxt: cluster.num_slots: must be in num_servers..1048576");
  EXPECT_THAT(
      RejectionOf("cluster { num_servers: 1 num_workers: 1 num_slots: 1048577 }"),
      HasSubstr("cluster.num_slots: "));
  EXPECT_TRUE(
      ParseJobConfig("cluster { num_servers: 4 num_workers: 1 num_slots: 4 }", "j")
          .ok());
}

TEST(ValidateJobConfigTest, ConsistencyModesAndStaleness) {
  for (const char* ok : {"consistency { mode: ASYNC }", "consistency { mode: BSP }",
                         "consistency { mode: SSP staleness: 2 }",
                         "consistency { mode: SSP }"}) {
    auto config = ParseJobConfig(absl::StrCat(kMinimalCluster, ok), "job.pbtxt");
    EXPECT_TRUE(config.ok()) << ok << ": " << config.status();
  }
  EXPECT_EQ(RejectionOf(absl::StrCat(kMinimalCluster,
                                     "consistency { mode: BSP staleness: 2 }")),
            "job.pbtxt: consistency: staleness: is only meaningful with mode SSP");
  EXPECT_EQ(RejectionOf(absl::StrCat(kMinimalCluster,
                                     "consistency { mode: SSP staleness: 2000000 }")),
            "job.pbtxt: consistency: staleness: must be at most 1000000");
  auto config = ParseJobConfig(absl::StrCat(kMinimalCluster, "consistency { mode: BSP }"),
                               "job.pbtxt");
  ASSERT_TRUE(config.ok());
  EXPECT_EQ(config->consistency().watchdog_timeout_ms(), 10000u);
  EXPECT_EQ(config->consistency().watchdog_interval_ms(), 5000u);
}

TEST(ValidateJobConfigTest, TrainingSparseTableMustBeASparseTableOfDimOne) {
  const std::string tables = absl::StrCat(
      kMinimalCluster, SgdSparseTable(0, "wide", 8),
      "tables { id: 1 name: \"d\" dense { size: 1 }"
      " optimizer { sgd { learning_rate: 1 } } }\n");
  EXPECT_THAT(RejectionOf(absl::StrCat(tables, "training { sparse_table: \"nope\" }")),
              HasSubstr("training.sparse_table: 'nope' must name a sparse "
                        "table with dim 1 for this LR model"));
  EXPECT_THAT(RejectionOf(absl::StrCat(tables, "training { sparse_table: \"d\" }")),
              HasSubstr("training.sparse_table: 'd' "));
  EXPECT_THAT(
      RejectionOf(absl::StrCat(tables, "training { sparse_table: \"wide\" }")),
      HasSubstr("training.sparse_table: 'wide' "));
}

TEST(ValidateJobConfigTest, TrainingDenseTableMustMatchNumericFields) {
  auto job = [](int size, const std::string& dense_table) {
    return absl::StrCat(kMinimalCluster, SgdSparseTable(0, "s"),
                        "tables { id: 1 name: \"d\" dense { size: ", size,
                        " } optimizer { sgd { learning_rate: 1 } } }\n"
                        "data { synthetic_ctr { num_numeric: 5 } }\n"
                        "training { sparse_table: \"s\" dense_table: \"",
                        dense_table, "\" }\n");
  };
  // 5 numeric fields + the bias.
  EXPECT_TRUE(ParseJobConfig(job(6, "d"), "j").ok());
  EXPECT_EQ(RejectionOf(job(5, "d")),
            "job.pbtxt: training.dense_table: 'd' must name a dense table of "
            "size 6 for this LR model (or size 0, which sizes it)");
  // Size 0 is sized for the model.
  auto sized = ParseJobConfig(job(0, "d"), "j");
  ASSERT_TRUE(sized.ok()) << sized.status();
  EXPECT_EQ(sized->tables(1).dense().size(), 6u);
  EXPECT_THAT(RejectionOf(job(6, "s")),
              HasSubstr("training.dense_table: 's' must name a dense table"));
  EXPECT_THAT(RejectionOf(job(6, "missing")),
              HasSubstr("training.dense_table: 'missing' "));
}

TEST(ValidateJobConfigTest, ReportsEveryErrorInOneMessage) {
  const std::string message = RejectionOf(absl::StrCat(
      "cluster { num_servers: 0 num_workers: 0 }\n"
      "consistency { mode: BSP staleness: 3 }\n",
      SgdSparseTable(0, "s", 0)));
  EXPECT_EQ(message,
            "job.pbtxt: cluster.num_servers: must be in 1..1024; "
            "cluster.num_workers: must be in 1..65536; "
            "consistency: staleness: is only meaningful with mode SSP; "
            "tables[0].sparse.dim: must be in 1..65536");
}

TEST(ValidateJobConfigTest, SyntheticDataChecks) {
  auto data = [](const std::string& body) {
    return absl::StrCat(kMinimalCluster, "data { synthetic_ctr { ", body,
                        " } }");
  };
  EXPECT_THAT(RejectionOf(data("min_vocab: 50 max_vocab: 40")),
              HasSubstr("data.synthetic_ctr.min_vocab: "));
  EXPECT_THAT(RejectionOf(data("zipf_exponent: -1")),
              HasSubstr("data.synthetic_ctr.zipf_exponent: "));
  EXPECT_THAT(RejectionOf(data("bias: inf")),
              HasSubstr("data.synthetic_ctr.bias: "));
  EXPECT_THAT(RejectionOf(data("num_categorical: 1001")),
              HasSubstr("data.synthetic_ctr.num_categorical: "));
}

std::string WriteTempFile(const std::string& name, const std::string& text) {
  const std::string path = absl::StrCat(testing::TempDir(), "/", name);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  EXPECT_TRUE(out.good()) << "cannot write " << path;
  return path;
}

TEST(LoadJobConfigTest, MissingFileIsNotFoundAndNamesThePath) {
  const std::string path =
      absl::StrCat(testing::TempDir(), "/does_not_exist/job.pbtxt");
  absl::StatusOr<JobConfig> config = LoadJobConfig(path);
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(config.status().message()), HasSubstr(path));
}

TEST(LoadJobConfigTest, ReadsAFile) {
  const std::string path = WriteTempFile("async.pbtxt", kAsyncExample);
  absl::StatusOr<JobConfig> config = LoadJobConfig(path);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->name(), "ctr-async");
  EXPECT_EQ(config->tables_size(), 2);
  // Same result as parsing the text directly.
  absl::StatusOr<JobConfig> parsed = ParseJobConfig(kAsyncExample, path);
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(ConfigFingerprint(*config), ConfigFingerprint(*parsed));
}

TEST(LoadJobConfigTest, ErrorsNameTheFilePath) {
  const std::string bad_syntax =
      WriteTempFile("bad_syntax.pbtxt", "cluster {\n  num_servers: 1\n  oops: 2\n}\n");
  absl::StatusOr<JobConfig> config = LoadJobConfig(bad_syntax);
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(config.status().message()),
              StartsWith(bad_syntax + ":3:"));
  EXPECT_THAT(std::string(config.status().message()),
              HasSubstr("no field named \"oops\""));

  const std::string invalid =
      WriteTempFile("invalid.pbtxt", "cluster { num_servers: 0 num_workers: 1 }\n");
  config = LoadJobConfig(invalid);
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().message(),
            invalid + ": cluster.num_servers: must be in 1..1024");
}

JobConfig ParseOrDie(const std::string& text) {
  absl::StatusOr<JobConfig> config = ParseJobConfig(text, "test");
  EXPECT_TRUE(config.ok()) << config.status();
  return config.ok() ? *config : JobConfig();
}

TEST(ConfigFingerprintTest, StableAcrossParsesOfTheSameText) {
  const JobConfig a = ParseOrDie(kAsyncExample);
  const JobConfig b = ParseOrDie(kAsyncExample);
  EXPECT_EQ(ConfigFingerprint(a), ConfigFingerprint(b));
  EXPECT_EQ(ConfigFingerprint(a), ConfigFingerprint(a));
}

TEST(ConfigFingerprintTest, EqualForEqualConfigsWrittenDifferently) {
  // Field order, comments, whitespace and explicitly spelled defaults do
  // not change the loaded config, so they must not change the fingerprint:
  // processes of one job may be given differently formatted copies.
  const JobConfig a = ParseOrDie(
      "cluster { num_servers: 2 num_workers: 3 }\n"
      "tables { id: 1 name: \"t\" sparse { dim: 1 }"
      " optimizer { adagrad { learning_rate: 0.25 } } }\n");
  const JobConfig b = ParseOrDie(
      "# same job\n"
      "tables {\n  name: \"t\"\n  id: 1\n"
      "  optimizer { adagrad { epsilon: 1e-8 learning_rate: 0.25 } }\n"
      "  sparse { dim: 1 }\n}\n"
      "cluster { num_workers: 3 num_servers: 2 num_slots: 4096 }\n"
      "consistency { mode: ASYNC }\n"
      "name: \"job\"\n");
  EXPECT_EQ(ConfigFingerprint(a), ConfigFingerprint(b));
}

TEST(ConfigFingerprintTest, ChangesWhenAnyFieldChanges) {
  const JobConfig base = ParseOrDie(kAsyncExample);
  const uint64_t base_fp = ConfigFingerprint(base);
  const std::vector<std::pair<std::string, std::function<void(JobConfig*)>>>
      changes = {
          {"name", [](JobConfig* c) { c->set_name("other"); }},
          {"num_workers",
           [](JobConfig* c) { c->mutable_cluster()->set_num_workers(3); }},
          {"num_slots",
           [](JobConfig* c) { c->mutable_cluster()->set_num_slots(4095); }},
          {"heartbeat_timeout_ms",
           [](JobConfig* c) {
             c->mutable_cluster()->set_heartbeat_timeout_ms(5001);
           }},
          {"learning_rate",
           [](JobConfig* c) {
             c->mutable_tables(0)
                 ->mutable_optimizer()
                 ->mutable_adagrad()
                 ->set_learning_rate(0.2f);
           }},
          {"learning_rate by one ulp",
           [](JobConfig* c) {
             auto* a = c->mutable_tables(1)->mutable_optimizer()->mutable_adagrad();
             a->set_learning_rate(std::nextafter(a->learning_rate(), 1.0f));
           }},
          {"table id", [](JobConfig* c) { c->mutable_tables(1)->set_id(2); }},
          {"init seed",
           [](JobConfig* c) { c->mutable_tables(0)->mutable_init()->set_seed(9); }},
          {"table order",
           [](JobConfig* c) { c->mutable_tables()->SwapElements(0, 1); }},
          {"data seed",
           [](JobConfig* c) {
             c->mutable_data()->mutable_synthetic_ctr()->set_seed(2);
           }},
          {"epochs",
           [](JobConfig* c) { c->mutable_training()->set_epochs(4); }},
      };
  for (const auto& [what, change] : changes) {
    JobConfig changed = base;
    change(&changed);
    EXPECT_NE(ConfigFingerprint(changed), base_fp) << what;
  }
}

// A one-table job whose table uses the given optimizer block.
std::string JobWithOptimizer(const std::string& optimizer) {
  return absl::StrCat(kMinimalCluster,
                      "tables { id: 0 name: \"t\" sparse { dim: 1 }"
                      " optimizer { ",
                      optimizer, " } }");
}

TEST(ParseJobConfigTest, NewOptimizersGetDocumentedDefaults) {
  absl::StatusOr<JobConfig> momentum =
      ParseJobConfig(JobWithOptimizer("momentum { learning_rate: 0.5 }"), "j");
  ASSERT_TRUE(momentum.ok()) << momentum.status();
  const MomentumConfig& m = momentum->tables(0).optimizer().momentum();
  EXPECT_FLOAT_EQ(m.learning_rate(), 0.5f);
  EXPECT_FLOAT_EQ(m.momentum(), 0.9f);
  EXPECT_FALSE(m.nesterov());

  absl::StatusOr<JobConfig> adam =
      ParseJobConfig(JobWithOptimizer("adam { learning_rate: 0.001 }"), "j");
  ASSERT_TRUE(adam.ok()) << adam.status();
  const AdamConfig& a = adam->tables(0).optimizer().adam();
  EXPECT_FLOAT_EQ(a.learning_rate(), 0.001f);
  EXPECT_FLOAT_EQ(a.beta1(), 0.9f);
  EXPECT_FLOAT_EQ(a.beta2(), 0.999f);
  EXPECT_FLOAT_EQ(a.epsilon(), 1e-8f);

  // Every FTRL field has a default, so an empty block is a valid config.
  absl::StatusOr<JobConfig> ftrl = ParseJobConfig(JobWithOptimizer("ftrl {}"),
                                                  "j");
  ASSERT_TRUE(ftrl.ok()) << ftrl.status();
  const FtrlConfig& f = ftrl->tables(0).optimizer().ftrl();
  EXPECT_FLOAT_EQ(f.alpha(), 0.05f);
  EXPECT_FLOAT_EQ(f.beta(), 1.0f);
  EXPECT_EQ(f.l1(), 0.0f);
  EXPECT_EQ(f.l2(), 0.0f);
}

TEST(ParseJobConfigTest, NewOptimizersKeepExplicitValues) {
  absl::StatusOr<JobConfig> momentum = ParseJobConfig(
      JobWithOptimizer(
          "momentum { learning_rate: 0.5 momentum: 0.5 nesterov: true }"),
      "j");
  ASSERT_TRUE(momentum.ok()) << momentum.status();
  const MomentumConfig& m = momentum->tables(0).optimizer().momentum();
  EXPECT_FLOAT_EQ(m.momentum(), 0.5f);
  EXPECT_TRUE(m.nesterov());

  absl::StatusOr<JobConfig> adam = ParseJobConfig(
      JobWithOptimizer("adam { learning_rate: 0.01 beta1: 0.5 beta2: 0.75"
                       " epsilon: 1e-6 }"),
      "j");
  ASSERT_TRUE(adam.ok()) << adam.status();
  const AdamConfig& a = adam->tables(0).optimizer().adam();
  EXPECT_FLOAT_EQ(a.beta1(), 0.5f);
  EXPECT_FLOAT_EQ(a.beta2(), 0.75f);
  EXPECT_FLOAT_EQ(a.epsilon(), 1e-6f);

  absl::StatusOr<JobConfig> ftrl = ParseJobConfig(
      JobWithOptimizer("ftrl { alpha: 0.1 beta: 2 l1: 0.5 l2: 0.25 }"), "j");
  ASSERT_TRUE(ftrl.ok()) << ftrl.status();
  const FtrlConfig& f = ftrl->tables(0).optimizer().ftrl();
  EXPECT_FLOAT_EQ(f.alpha(), 0.1f);
  EXPECT_FLOAT_EQ(f.beta(), 2.0f);
  EXPECT_FLOAT_EQ(f.l1(), 0.5f);
  EXPECT_FLOAT_EQ(f.l2(), 0.25f);
}

TEST(ValidateJobConfigTest, NewOptimizerHyperParametersAreChecked) {
  const std::string kPrefix = "job.pbtxt: tables[0].optimizer.";
  const struct {
    const char* block;
    const char* error;
  } cases[] = {
      {"momentum { }", "momentum.learning_rate: must be a finite number > 0"},
      {"momentum { learning_rate: -1 }",
       "momentum.learning_rate: must be a finite number > 0"},
      {"momentum { learning_rate: inf }",
       "momentum.learning_rate: must be a finite number > 0"},
      {"momentum { learning_rate: 1 momentum: 1 }",
       "momentum.momentum: must be in [0, 1)"},
      {"momentum { learning_rate: 1 momentum: -0.5 }",
       "momentum.momentum: must be in [0, 1)"},
      {"momentum { learning_rate: 1 momentum: nan }",
       "momentum.momentum: must be in [0, 1)"},
      {"adam { }", "adam.learning_rate: must be a finite number > 0"},
      {"adam { learning_rate: nan }",
       "adam.learning_rate: must be a finite number > 0"},
      {"adam { learning_rate: 1 beta1: 1 }", "adam.beta1: must be in [0, 1)"},
      {"adam { learning_rate: 1 beta1: -0.1 }",
       "adam.beta1: must be in [0, 1)"},
      {"adam { learning_rate: 1 beta2: 1.5 }", "adam.beta2: must be in [0, 1)"},
      {"adam { learning_rate: 1 beta2: nan }", "adam.beta2: must be in [0, 1)"},
      {"adam { learning_rate: 1 epsilon: -1e-8 }",
       "adam.epsilon: must be > 0"},
      {"adam { learning_rate: 1 epsilon: inf }", "adam.epsilon: must be > 0"},
      {"ftrl { alpha: -0.05 }", "ftrl.alpha: must be a finite number > 0"},
      {"ftrl { alpha: inf }", "ftrl.alpha: must be a finite number > 0"},
      {"ftrl { beta: -1 }", "ftrl.beta: must be a finite number > 0"},
      {"ftrl { beta: nan }", "ftrl.beta: must be a finite number > 0"},
      {"ftrl { l1: -0.1 }", "ftrl.l1: must be >= 0"},
      {"ftrl { l1: inf }", "ftrl.l1: must be >= 0"},
      {"ftrl { l2: -0.1 }", "ftrl.l2: must be >= 0"},
      {"ftrl { l2: nan }", "ftrl.l2: must be >= 0"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.block);
    EXPECT_EQ(RejectionOf(JobWithOptimizer(c.block)),
              absl::StrCat(kPrefix, c.error));
  }
  // Every problem is reported in one pass.
  EXPECT_EQ(RejectionOf(JobWithOptimizer(
                "adam { learning_rate: 1 beta1: 2 beta2: -1 }")),
            absl::StrCat(kPrefix, "adam.beta1: must be in [0, 1); ",
                         "tables[0].optimizer.adam.beta2: must be in [0, 1)"));
}

TEST(ValidateJobConfigTest, FtrlTablesMustStartFromZero) {
  const std::string table =
      "tables { id: 0 name: \"w\" sparse { dim: 1 } optimizer { ftrl { } } ";
  EXPECT_TRUE(ParseJobConfig(absl::StrCat(kMinimalCluster, table, "}"), "job.pbtxt").ok());
  EXPECT_TRUE(ParseJobConfig(absl::StrCat(kMinimalCluster, table, "init { kind: ZEROS } }"),
                             "job.pbtxt")
                  .ok());
  EXPECT_EQ(RejectionOf(absl::StrCat(kMinimalCluster, table,
                                     "init { kind: UNIFORM scale: 0.1 } }")),
            "job.pbtxt: tables[0].init: FTRL starts from zero weights; use init "
            "{ kind: ZEROS }");
}

// ------------------------------------------------- Learning-rate schedule

// A one-table job (sparse or dense) whose optimizer block is sgd plus
// `extra` (schedule, staleness_aware).
std::string JobWithSchedule(const std::string& extra) {
  return JobWithOptimizer(absl::StrCat("sgd { learning_rate: 0.5 } ", extra));
}

TEST(ParseJobConfigTest, ScheduleKeepsValuesAndDefaultsDecayRate) {
  absl::StatusOr<JobConfig> full = ParseJobConfig(
      JobWithSchedule("schedule { warmup_steps: 100 decay_steps: 1000"
                      " decay_rate: 0.5 } staleness_aware: true"),
      "j");
  ASSERT_TRUE(full.ok()) << full.status();
  const OptimizerConfig& opt = full->tables(0).optimizer();
  ASSERT_TRUE(opt.has_schedule());
  EXPECT_EQ(opt.schedule().warmup_steps(), 100u);
  EXPECT_EQ(opt.schedule().decay_steps(), 1000u);
  EXPECT_FLOAT_EQ(opt.schedule().decay_rate(), 0.5f);
  EXPECT_TRUE(opt.staleness_aware());

  // decay_rate left out under decay_steps: the documented 0.1.
  absl::StatusOr<JobConfig> decay =
      ParseJobConfig(JobWithSchedule("schedule { decay_steps: 10 }"), "j");
  ASSERT_TRUE(decay.ok()) << decay.status();
  EXPECT_FLOAT_EQ(decay->tables(0).optimizer().schedule().decay_rate(), 0.1f);
  EXPECT_EQ(decay->tables(0).optimizer().schedule().warmup_steps(), 0u);
  EXPECT_FALSE(decay->tables(0).optimizer().staleness_aware());

  // Warm-up alone: no decay, so no decay_rate is invented.
  absl::StatusOr<JobConfig> warmup =
      ParseJobConfig(JobWithSchedule("schedule { warmup_steps: 8 }"), "j");
  ASSERT_TRUE(warmup.ok()) << warmup.status();
  EXPECT_TRUE(warmup->tables(0).optimizer().has_schedule());
  EXPECT_EQ(warmup->tables(0).optimizer().schedule().warmup_steps(), 8u);
  EXPECT_EQ(warmup->tables(0).optimizer().schedule().decay_rate(), 0.0f);

  // The boundary values are valid.
  absl::StatusOr<JobConfig> edges = ParseJobConfig(
      JobWithSchedule("schedule { warmup_steps: 1099511627776"
                      " decay_steps: 1099511627776 decay_rate: 1 }"),
      "j");
  ASSERT_TRUE(edges.ok()) << edges.status();
  EXPECT_EQ(edges->tables(0).optimizer().schedule().warmup_steps(),
            uint64_t{1} << 40);
  EXPECT_FLOAT_EQ(edges->tables(0).optimizer().schedule().decay_rate(), 1.0f);
  EXPECT_TRUE(
      ParseJobConfig(
          JobWithSchedule("schedule { decay_steps: 1 decay_rate: 1e-30 }"),
          "j")
          .ok());
}

TEST(ParseJobConfigTest, EmptyScheduleBlockIsNoSchedule) {
  const JobConfig without = ParseOrDie(JobWithSchedule(""));
  for (const char* block : {"schedule { }", "schedule { warmup_steps: 0 }",
                            "schedule { warmup_steps: 0 decay_steps: 0 }"}) {
    SCOPED_TRACE(block);
    const JobConfig with = ParseOrDie(JobWithSchedule(block));
    EXPECT_FALSE(with.tables(0).optimizer().has_schedule());
    EXPECT_EQ(ConfigFingerprint(with), ConfigFingerprint(without));
    EXPECT_TRUE(
        google::protobuf::util::MessageDifferencer::Equals(with, without))
        << with.DebugString();
  }
  // Defaults do not invent a schedule either.
  EXPECT_FALSE(without.tables(0).optimizer().has_schedule());
}

TEST(ApplyDefaultsTest, ScheduleAndSparseDefaultsAreIdempotent) {
  JobConfig config;
  ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(
      absl::StrCat(kMinimalCluster,
                   "tables { id: 0 name: \"s\""
                   " sparse { dim: 1 admit_after_pushes: 3 }"
                   " optimizer { adam { learning_rate: 0.01 }"
                   " schedule { decay_steps: 7 } } }"
                   "tables { id: 1 name: \"d\" dense { size: 4 }"
                   " optimizer { sgd { learning_rate: 1 } schedule { } } }"),
      &config));
  ApplyDefaults(&config);
  EXPECT_FLOAT_EQ(config.tables(0).optimizer().schedule().decay_rate(), 0.1f);
  EXPECT_EQ(config.tables(0).sparse().admission_sketch_width(), 262144u);
  EXPECT_FALSE(config.tables(1).optimizer().has_schedule());
  JobConfig again = config;
  ApplyDefaults(&again);
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(config, again))
      << again.DebugString();
  EXPECT_TRUE(ValidateJobConfig(config).ok()) << ValidateJobConfig(config);
}

TEST(ValidateJobConfigTest, ScheduleErrorsNameTheField) {
  const std::string kPrefix = "job.pbtxt: tables[0].optimizer.schedule.";
  const struct {
    const char* block;
    const char* error;
  } cases[] = {
      {"schedule { decay_steps: 10 decay_rate: 1.5 }",
       "decay_rate: must be in (0, 1]"},
      {"schedule { decay_steps: 10 decay_rate: 1.0000001 }",
       "decay_rate: must be in (0, 1]"},
      {"schedule { decay_steps: 10 decay_rate: -0.5 }",
       "decay_rate: must be in (0, 1]"},
      {"schedule { decay_steps: 10 decay_rate: nan }",
       "decay_rate: must be in (0, 1]"},
      {"schedule { decay_steps: 10 decay_rate: inf }",
       "decay_rate: must be in (0, 1]"},
      {"schedule { decay_rate: 0.5 }",
       "decay_rate: needs schedule.decay_steps > 0"},
      {"schedule { warmup_steps: 100 decay_rate: 0.5 }",
       "decay_rate: needs schedule.decay_steps > 0"},
      {"schedule { warmup_steps: 1099511627777 }",
       "warmup_steps: must be at most 2^40"},
      {"schedule { warmup_steps: 18446744073709551615 }",
       "warmup_steps: must be at most 2^40"},
      {"schedule { decay_steps: 1099511627777 }",
       "decay_steps: must be at most 2^40"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.block);
    EXPECT_EQ(RejectionOf(JobWithSchedule(c.block)),
              absl::StrCat(kPrefix, c.error));
  }
  // Every problem in one pass, each with its path; a dense table's
  // schedule is checked too, under its own index.
  EXPECT_EQ(
      RejectionOf(absl::StrCat(
          kMinimalCluster,
          "tables { id: 0 name: \"s\" sparse { dim: 1 } optimizer {"
          " sgd { learning_rate: 1 } schedule { decay_rate: 2 } } }\n"
          "tables { id: 1 name: \"d\" dense { size: 4 } optimizer {"
          " sgd { learning_rate: 1 } schedule { warmup_steps: 1099511627777"
          " decay_steps: 1099511627777 decay_rate: 0.5 } } }\n")),
      "job.pbtxt: tables[0].optimizer.schedule.decay_rate: needs "
      "schedule.decay_steps > 0; "
      "tables[1].optimizer.schedule.warmup_steps: must be at most 2^40; "
      "tables[1].optimizer.schedule.decay_steps: must be at most 2^40");
}

TEST(ValidateOptimizerTest, ScheduleWithoutDefaults) {
  // Called directly (as Optimizer::Create does), no defaults are filled:
  // decay_steps with decay_rate 0 is an error there, under the given path.
  OptimizerConfig opt;
  opt.mutable_sgd()->set_learning_rate(0.5f);
  opt.mutable_schedule()->set_decay_steps(10);
  EXPECT_EQ(ValidateOptimizer(opt).message(),
            "optimizer.schedule.decay_rate: must be in (0, 1]");
  EXPECT_EQ(ValidateOptimizer(opt, "tables[3].optimizer").message(),
            "tables[3].optimizer.schedule.decay_rate: must be in (0, 1]");
  opt.mutable_schedule()->set_decay_rate(0.25f);
  EXPECT_TRUE(ValidateOptimizer(opt).ok());
  opt.set_staleness_aware(true);
  EXPECT_TRUE(ValidateOptimizer(opt).ok());
}

// ----------------------------------------------------- Sparse table limits

// A one-table job with a sparse table of dim 1 and the given extra fields.
std::string JobWithSparse(const std::string& fields) {
  return absl::StrCat(kMinimalCluster,
                      "tables { id: 0 name: \"s\" sparse { dim: 1 ", fields,
                      " } optimizer { sgd { learning_rate: 0.5 } } }");
}

TEST(ParseJobConfigTest, SparseTableWithEveryNewFieldParses) {
  for (const char* policy : {"EVICT_LRU", "EVICT_LFU", "EVICT_NONE"}) {
    SCOPED_TRACE(policy);
    absl::StatusOr<JobConfig> config = ParseJobConfig(
        JobWithSparse(absl::StrCat(
            "admit_after_pushes: 3 admission_sketch_width: 4096"
            " ttl_steps: 1000 ttl_seconds: 3600"
            " memory_budget_bytes: 67108864 eviction: ",
            policy)),
        "j");
    ASSERT_TRUE(config.ok()) << config.status();
    const SparseTableConfig& s = config->tables(0).sparse();
    EXPECT_EQ(s.dim(), 1u);
    EXPECT_EQ(s.admit_after_pushes(), 3u);
    EXPECT_EQ(s.admission_sketch_width(), 4096u);
    EXPECT_EQ(s.ttl_steps(), 1000u);
    EXPECT_EQ(s.ttl_seconds(), 3600u);
    EXPECT_EQ(s.memory_budget_bytes(), uint64_t{64} << 20);
  }
  absl::StatusOr<JobConfig> lfu =
      ParseJobConfig(JobWithSparse("memory_budget_bytes: 1048576"
                                   " eviction: EVICT_LFU"),
                     "j");
  ASSERT_TRUE(lfu.ok()) << lfu.status();
  EXPECT_EQ(lfu->tables(0).sparse().eviction(), EVICT_LFU);
  EXPECT_EQ(lfu->tables(0).sparse().memory_budget_bytes(), 1048576u);
}

TEST(ParseJobConfigTest, AdmissionSketchWidthDefault) {
  auto width = [](const std::string& fields) -> uint32_t {
    const JobConfig config = ParseOrDie(JobWithSparse(fields));
    return config.tables_size() == 1
               ? config.tables(0).sparse().admission_sketch_width()
               : 12345;
  };
  // Filled only when admission is on (admit_after_pushes > 1).
  EXPECT_EQ(width(""), 0u);
  EXPECT_EQ(width("admit_after_pushes: 1"), 0u);
  EXPECT_EQ(width("admit_after_pushes: 2"), 262144u);
  EXPECT_EQ(width("admit_after_pushes: 65535"), 262144u);
  // An explicit width is kept, with admission on or off.
  EXPECT_EQ(width("admit_after_pushes: 2 admission_sketch_width: 1024"), 1024u);
  EXPECT_EQ(width("admission_sketch_width: 268435456"), 268435456u);
  EXPECT_EQ(width("admit_after_pushes: 1 admission_sketch_width: 2048"), 2048u);
}

TEST(ValidateJobConfigTest, SparseTableLimitsNameTheField) {
  const std::string kPrefix = "job.pbtxt: tables[0].sparse.";
  const struct {
    const char* fields;
    const char* error;
  } cases[] = {
      {"admit_after_pushes: 65536",
       "admit_after_pushes: must be at most 65535"},
      {"admit_after_pushes: 4294967295",
       "admit_after_pushes: must be at most 65535"},
      {"admission_sketch_width: 1",
       "admission_sketch_width: must be in 1024..2^28"},
      {"admission_sketch_width: 1023",
       "admission_sketch_width: must be in 1024..2^28"},
      {"admit_after_pushes: 2 admission_sketch_width: 1023",
       "admission_sketch_width: must be in 1024..2^28"},
      {"admission_sketch_width: 268435457",
       "admission_sketch_width: must be in 1024..2^28"},
      {"ttl_steps: 4611686018427387905", "ttl_steps: must be at most 2^62"},
      {"ttl_seconds: 2147483649", "ttl_seconds: must be at most 2^31"},
      {"memory_budget_bytes: 1",
       "memory_budget_bytes: must be 0 (no budget) or >= 1 MiB"},
      {"memory_budget_bytes: 1048575",
       "memory_budget_bytes: must be 0 (no budget) or >= 1 MiB"},
      {"eviction: EVICT_LRU",
       "eviction: evicts only under memory_budget_bytes; set it"},
      {"eviction: EVICT_LFU memory_budget_bytes: 0",
       "eviction: evicts only under memory_budget_bytes; set it"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.fields);
    EXPECT_EQ(RejectionOf(JobWithSparse(c.fields)),
              absl::StrCat(kPrefix, c.error));
  }
  // The boundaries themselves are valid.
  for (const char* ok :
       {"admit_after_pushes: 65535", "admit_after_pushes: 0",
        "admission_sketch_width: 1024", "admission_sketch_width: 268435456",
        "ttl_steps: 4611686018427387904", "ttl_seconds: 2147483648",
        "ttl_steps: 1 ttl_seconds: 1", "memory_budget_bytes: 1048576",
        "memory_budget_bytes: 0 eviction: EVICT_NONE",
        "memory_budget_bytes: 1099511627776 eviction: EVICT_NONE"}) {
    SCOPED_TRACE(ok);
    absl::StatusOr<JobConfig> config = ParseJobConfig(JobWithSparse(ok), "j");
    EXPECT_TRUE(config.ok()) << config.status();
  }
}

TEST(ValidateJobConfigTest, DiskTierNeedsABudgetAnEvictionAndADirectory) {
  const std::string kPrefix = "job.pbtxt: tables[0].sparse.";
  const std::string kTier = " disk_tier { dir: \"/var/tmp/t\" }";
  const struct {
    std::string fields;
    std::string error;
  } cases[] = {
      {"memory_budget_bytes: 4194304 eviction: EVICT_LRU disk_tier { }",
       "disk_tier.dir: is required"},
      {"eviction: EVICT_NONE" + kTier,
       "disk_tier: needs memory_budget_bytes (rows beyond it go to disk); "
       "tables[0].sparse.disk_tier: needs eviction EVICT_LRU or EVICT_LFU "
       "(it picks the rows that go to disk)"},
      {"memory_budget_bytes: 4194304 eviction: EVICT_NONE" + kTier,
       "disk_tier: needs eviction EVICT_LRU or EVICT_LFU (it picks the rows "
       "that go to disk)"},
      {"memory_budget_bytes: 4194304 eviction: EVICT_LRU disk_tier { dir: "
       "\"/t\" memory_bytes: 2097153 }",
       "disk_tier.memory_bytes: must be 0 (1/8 of memory_budget_bytes) or 256 "
       "KiB..half of memory_budget_bytes"},
      {"memory_budget_bytes: 4194304 eviction: EVICT_LRU disk_tier { dir: "
       "\"/t\" memory_bytes: 1000 }",
       "disk_tier.memory_bytes: must be 0 (1/8 of memory_budget_bytes) or 256 "
       "KiB..half of memory_budget_bytes"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.fields);
    EXPECT_EQ(RejectionOf(JobWithSparse(c.fields)), kPrefix + c.error);
  }
  const std::string ok =
      "memory_budget_bytes: 4194304 eviction: EVICT_LFU disk_tier { dir: "
      "\"/t\" memory_bytes: 2097152 max_disk_bytes: 1000000000 }";
  absl::StatusOr<JobConfig> config = ParseJobConfig(JobWithSparse(ok), "j");
  EXPECT_TRUE(config.ok()) << config.status();
  auto with_cluster = [&](const std::string& cluster) {
    return absl::StrCat("cluster { num_servers: 2 num_workers: 1 ", cluster,
                        " } tables { id: 0 name: \"s\" sparse { dim: 1 ", ok,
                        " } optimizer { sgd { learning_rate: 0.5 } } }");
  };
  // Backup copies and slot moves carry the cold rows.
  for (const char* cluster : {"replication: 2", "elastic { }"}) {
    absl::StatusOr<JobConfig> parsed =
        ParseJobConfig(with_cluster(cluster), "j");
    EXPECT_TRUE(parsed.ok()) << cluster << ": " << parsed.status();
  }
}

TEST(ValidateJobConfigTest, SparseTableErrorsAllReportedWithTableIndex) {
  const std::string message = RejectionOf(absl::StrCat(
      kMinimalCluster, SgdSparseTable(0, "ok"),
      "tables { id: 1 name: \"bad\" sparse { dim: 1 admit_after_pushes: 70000"
      " admission_sketch_width: 100 memory_budget_bytes: 1000"
      " eviction: EVICT_LRU } optimizer { sgd { learning_rate: 1 } } }"));
  EXPECT_EQ(message,
            "job.pbtxt: tables[1].sparse.admit_after_pushes: must be at most "
            "65535; "
            "tables[1].sparse.admission_sketch_width: must be in 1024..2^28; "
            "tables[1].sparse.memory_budget_bytes: must be 0 (no budget) or "
            ">= 1 MiB");
}

TEST(ValidateSparseTableTest, DirectCallsUseThePath) {
  SparseTableConfig sparse;
  sparse.set_dim(4);
  EXPECT_TRUE(ValidateSparseTable(sparse).ok());
  sparse.set_eviction(EVICT_LFU);
  EXPECT_EQ(ValidateSparseTable(sparse).message(),
            "sparse.eviction: evicts only under memory_budget_bytes; set it");
  EXPECT_EQ(ValidateSparseTable(sparse, "tables[2].sparse").message(),
            "tables[2].sparse.eviction: evicts only under "
            "memory_budget_bytes; set it");
  sparse.set_memory_budget_bytes(uint64_t{1} << 20);
  EXPECT_TRUE(ValidateSparseTable(sparse).ok());
  // An enum value outside the three policies (a newer peer's, or a
  // hand-built message) is rejected.
  sparse.set_eviction(static_cast<EvictionPolicy>(7));
  EXPECT_EQ(ValidateSparseTable(sparse).message(),
            "sparse.eviction: must be EVICT_NONE, EVICT_LRU or EVICT_LFU");
  // No defaults are applied here: dim 0 is an error, and a width of 0
  // with admission on is left to ApplyDefaults (0 is valid).
  SparseTableConfig bare;
  EXPECT_EQ(ValidateSparseTable(bare).message(),
            "sparse.dim: must be in 1..65536");
  bare.set_dim(1);
  bare.set_admit_after_pushes(5);
  EXPECT_TRUE(ValidateSparseTable(bare).ok());
}

TEST(ConfigFingerprintTest, ChangesWithScheduleAndSparseFields) {
  const JobConfig base = ParseOrDie(JobWithSparse(
      "admit_after_pushes: 2 ttl_steps: 10 ttl_seconds: 60"
      " memory_budget_bytes: 2097152 eviction: EVICT_LRU"));
  const uint64_t base_fp = ConfigFingerprint(base);
  const std::vector<std::pair<std::string, std::function<void(JobConfig*)>>>
      changes = {
          {"warmup_steps",
           [](JobConfig* c) {
             c->mutable_tables(0)
                 ->mutable_optimizer()
                 ->mutable_schedule()
                 ->set_warmup_steps(1);
           }},
          {"staleness_aware",
           [](JobConfig* c) {
             c->mutable_tables(0)->mutable_optimizer()->set_staleness_aware(
                 true);
           }},
          {"admit_after_pushes",
           [](JobConfig* c) {
             c->mutable_tables(0)->mutable_sparse()->set_admit_after_pushes(3);
           }},
          {"admission_sketch_width",
           [](JobConfig* c) {
             c->mutable_tables(0)->mutable_sparse()->set_admission_sketch_width(
                 1024);
           }},
          {"ttl_steps",
           [](JobConfig* c) {
             c->mutable_tables(0)->mutable_sparse()->set_ttl_steps(11);
           }},
          {"ttl_seconds",
           [](JobConfig* c) {
             c->mutable_tables(0)->mutable_sparse()->set_ttl_seconds(61);
           }},
          {"memory_budget_bytes",
           [](JobConfig* c) {
             c->mutable_tables(0)->mutable_sparse()->set_memory_budget_bytes(
                 2097153);
           }},
          {"eviction",
           [](JobConfig* c) {
             c->mutable_tables(0)->mutable_sparse()->set_eviction(EVICT_LFU);
           }},
      };
  for (const auto& [what, change] : changes) {
    JobConfig changed = base;
    change(&changed);
    EXPECT_NE(ConfigFingerprint(changed), base_fp) << what;
  }
}

// ------------------------------------------------------------ data plane

TEST(ParseJobConfigTest, DataPlaneDefaults) {
  // Absent block: key-list caching on at 16 MiB, float32 both ways.
  const JobConfig config = ParseOrDie(kMinimalCluster);
  EXPECT_EQ(config.data_plane().key_cache_bytes(), int64_t{16} << 20);
  EXPECT_EQ(config.data_plane().push_values(), FLOAT32);
  EXPECT_EQ(config.data_plane().pull_values(), FLOAT32);
  // An explicit 0 and explicit UNSPECIFIED mean the default too.
  const JobConfig zero = ParseOrDie(absl::StrCat(
      kMinimalCluster,
      "data_plane { key_cache_bytes: 0 push_values: VALUE_ENCODING_UNSPECIFIED }\n"));
  EXPECT_EQ(zero.data_plane().key_cache_bytes(), int64_t{16} << 20);
  EXPECT_EQ(zero.data_plane().push_values(), FLOAT32);
  // Explicit values are kept: off, the limits, and the half-width encodings.
  const JobConfig off = ParseOrDie(absl::StrCat(
      kMinimalCluster,
      "data_plane { key_cache_bytes: -1 push_values: FLOAT16 pull_values: BFLOAT16 }\n"));
  EXPECT_EQ(off.data_plane().key_cache_bytes(), -1);
  EXPECT_EQ(off.data_plane().push_values(), FLOAT16);
  EXPECT_EQ(off.data_plane().pull_values(), BFLOAT16);
  for (const char* bytes : {"1", "8", "1073741824"}) {
    SCOPED_TRACE(bytes);
    const JobConfig kept = ParseOrDie(absl::StrCat(
        kMinimalCluster, "data_plane { key_cache_bytes: ", bytes, " }\n"));
    EXPECT_EQ(std::to_string(kept.data_plane().key_cache_bytes()), bytes);
  }
  // Defaults are idempotent with a data plane block too.
  JobConfig again = off;
  ApplyDefaults(&again);
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(off, again));
  // The data plane is part of the fingerprint (servers and workers must
  // agree on it).
  EXPECT_NE(ConfigFingerprint(config), ConfigFingerprint(off));
}

TEST(ValidateJobConfigTest, DataPlaneErrorsNameTheField) {
  EXPECT_EQ(RejectionOf(absl::StrCat(kMinimalCluster,
                                     "data_plane { key_cache_bytes: -2 }\n")),
            "job.pbtxt: data_plane.key_cache_bytes: must be -1 (off) or "
            "1..1073741824");
  EXPECT_THAT(RejectionOf(absl::StrCat(
                  kMinimalCluster, "data_plane { key_cache_bytes: -9223372036854775808 }\n")),
              HasSubstr("data_plane.key_cache_bytes: "));
  EXPECT_THAT(RejectionOf(absl::StrCat(kMinimalCluster,
                                       "data_plane { key_cache_bytes: 1073741825 }\n")),
              HasSubstr("data_plane.key_cache_bytes: "));
  EXPECT_THAT(RejectionOf(absl::StrCat(
                  kMinimalCluster, "data_plane { key_cache_bytes: 9223372036854775807 }\n")),
              HasSubstr("data_plane.key_cache_bytes: "));
  EXPECT_THAT(RejectionOf(absl::StrCat(kMinimalCluster,
                                       "data_plane { push_values: FLOAT64 }\n")),
              HasSubstr("\"FLOAT64\""));

  // Configs built in code skip the parser: an encoding outside the enum,
  // and fields left at 0 (defaults not applied), are refused by validation.
  JobConfig config = ParseOrDie(kMinimalCluster);
  ASSERT_TRUE(ValidateJobConfig(config).ok());
  JobConfig bad = config;
  bad.mutable_data_plane()->set_push_values(static_cast<ValueEncoding>(7));
  EXPECT_THAT(std::string(ValidateJobConfig(bad).message()),
              HasSubstr("data_plane.push_values: must be FLOAT32, FLOAT16 or BFLOAT16"));
  bad = config;
  bad.mutable_data_plane()->set_pull_values(static_cast<ValueEncoding>(-1));
  EXPECT_THAT(std::string(ValidateJobConfig(bad).message()),
              HasSubstr("data_plane.pull_values: "));
  bad = config;
  bad.mutable_data_plane()->set_push_values(VALUE_ENCODING_UNSPECIFIED);
  EXPECT_THAT(std::string(ValidateJobConfig(bad).message()),
              HasSubstr("data_plane.push_values: "));
  bad = config;
  bad.mutable_data_plane()->set_key_cache_bytes(0);
  const absl::Status zero = ValidateJobConfig(bad);
  EXPECT_EQ(zero.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(zero.message()), HasSubstr("data_plane.key_cache_bytes: "));
  // Both encodings wrong and the budget wrong: every error in one message.
  bad.mutable_data_plane()->set_push_values(static_cast<ValueEncoding>(4));
  bad.mutable_data_plane()->set_pull_values(static_cast<ValueEncoding>(4));
  const std::string all(ValidateJobConfig(bad).message());
  EXPECT_THAT(all, HasSubstr("data_plane.key_cache_bytes: "));
  EXPECT_THAT(all, HasSubstr("data_plane.push_values: "));
  EXPECT_THAT(all, HasSubstr("data_plane.pull_values: "));
}

}  // namespace
}  // namespace ps

namespace ps {
namespace {

TEST(ValidateJobConfigTest, ElasticMoveWorkShare) {
  constexpr char kElastic[] =
      "cluster { num_servers: 2 num_workers: 1 elastic { %s } }\n";
  auto parsed = ParseJobConfig(absl::StrFormat(kElastic, ""), "job.pbtxt");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->cluster().elastic().move_work_share(), 0.25);
  parsed = ParseJobConfig(absl::StrFormat(kElastic, "move_work_share: 1"),
                          "job.pbtxt");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->cluster().elastic().move_work_share(), 1.0);
  for (const char* bad : {"move_work_share: 1.5", "move_work_share: -0.1",
                          "move_work_share: nan", "move_work_share: inf"}) {
    EXPECT_EQ(RejectionOf(absl::StrFormat(kElastic, bad)),
              "job.pbtxt: cluster.elastic.move_work_share: must be in (0, 1]")
        << bad;
  }
}

TEST(ValidateJobConfigTest, ModelsAreCheckedAgainstDataAndTables) {
  auto job = [](const std::string& model, int dim, const std::string& data) {
    return absl::StrCat(kMinimalCluster, SgdSparseTable(0, "s", dim),
                        "tables { id: 1 name: \"d\" dense { size: 0 }"
                        " optimizer { sgd { learning_rate: 1 } } }\n",
                        data, "training { sparse_table: \"s\" dense_table: \"d\"",
                        " model { ", model, " } }\n");
  };
  const std::string synthetic = "data { synthetic_ctr { num_numeric: 13 } }\n";
  // DLRM: bottom 13 -> 64 -> 16, 27 vectors: top 16 + 351 -> 64 -> 1.
  auto dlrm = ParseJobConfig(job("kind: DLRM", 16, synthetic), "j");
  ASSERT_TRUE(dlrm.ok()) << dlrm.status();
  EXPECT_EQ(dlrm->tables(1).dense().size(),
            (13 * 64 + 64) + (64 * 16 + 16) + (367 * 64 + 64) + (64 + 1));
  EXPECT_THAT(RejectionOf(job("kind: DLRM", 8, synthetic)),
              HasSubstr("sparse table with dim 16 for this DLRM model"));
  EXPECT_THAT(RejectionOf(job("kind: FM embedding_dim: 4", 4, synthetic)),
              HasSubstr("dim 5 for this FM model"));
  EXPECT_THAT(RejectionOf(job("kind: DLRM bottom_mlp: 0", 16, synthetic)),
              HasSubstr("bottom_mlp: layer widths must be in 1..65536"));
  // libsvm data has one field and no dense features: nothing to interact.
  EXPECT_THAT(
      RejectionOf(job("kind: DLRM", 16,
                      "data { files { format: LIBSVM train_files: \"x\" } }\n")),
      HasSubstr("DLRM needs at least two vectors"));
  // Click models on a 10-class data set.
  EXPECT_THAT(RejectionOf(job("kind: LR", 1, "data { fashion_mnist {} }\n")),
              HasSubstr("use kind: MLP"));
  EXPECT_THAT(RejectionOf(job("kind: MLP num_classes: 3", 1,
                              "data { fashion_mnist {} }\n")),
              HasSubstr("num_classes: 3 but the data has 10 classes"));
  EXPECT_THAT(RejectionOf(job("kind: LR", 1,
                              "data { files { train_files: \"x\" } }\n")),
              HasSubstr("data.files.format: set CRITEO or LIBSVM"));
  EXPECT_THAT(RejectionOf(job("kind: LR", 1,
                              "data { files { format: CRITEO } }\n")),
              HasSubstr("data.files.train_files"));
  EXPECT_THAT(RejectionOf(job("kind: LR", 1,
                              "data { synthetic_ctr { interaction_rank: 65 } }\n")),
              HasSubstr("interaction_rank: must be at most 64"));
  EXPECT_THAT(RejectionOf(absl::StrCat(
                  kMinimalCluster,
                  "tables { id: 0 name: \"f\" sparse { dim: 1 } optimizer { "
                  "ftrl { alpha: 0.1 } scale_with_workers: true } }\n")),
              HasSubstr("scale_with_workers: does not apply to FTRL"));
}

// Security files are checked where the config is loaded: all or none,
// readable, and a secret key not readable by every user.
TEST(ConfigTest, SecurityFiles) {
  const std::string dir = std::getenv("TEST_TMPDIR");
  const auto write = [&](const std::string& name, int mode) {
    const std::string path = dir + "/" + name;
    std::ofstream(path) << "x\n";
    chmod(path.c_str(), mode);
    return path;
  };
  const std::string ca = write("ca.pem", 0644);
  const std::string cert = write("job.pem", 0644);
  const std::string key = write("job.key", 0600);
  const std::string open_key = write("open.key", 0644);
  const auto parse = [&](const std::string& security) {
    return ParseJobConfig(absl::StrCat(kAsyncExample, "security { ", security, " }"),
                          "s")
        .status();
  };
  const std::string tls = absl::StrCat("tls { ca_cert_file: '", ca,
                                       "' cert_file: '", cert, "' key_file: '");
  EXPECT_TRUE(parse(absl::StrCat(tls, key, "' }")).ok())
      << parse(absl::StrCat(tls, key, "' }"));
  EXPECT_THAT(parse(absl::StrCat("tls { ca_cert_file: '", ca, "' }")).message(),
              HasSubstr("security.tls: ca_cert_file, cert_file and key_file are all "
                        "required"));
  EXPECT_THAT(parse(absl::StrCat(tls, dir, "/missing.key' }")).message(),
              HasSubstr("security.tls.key_file: '" + dir +
                        "/missing.key' cannot be read: No such file"));
  EXPECT_THAT(parse(absl::StrCat(tls, open_key, "' }")).message(),
              HasSubstr("security.tls.key_file: '" + open_key +
                        "' is readable by every user"));
  EXPECT_THAT(parse(absl::StrCat("curve { public_key_file: '", ca, "' }")).message(),
              HasSubstr("security.curve: public_key_file and secret_key_file are "
                        "both required"));
  EXPECT_THAT(parse(absl::StrCat("curve { public_key_file: '", ca,
                                 "' secret_key_file: '", open_key, "' }"))
                  .message(),
              HasSubstr("security.curve.secret_key_file: '" + open_key +
                        "' is readable by every user"));
}

}  // namespace
}  // namespace ps
