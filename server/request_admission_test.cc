// Admission's decisions, directly: no server, no sockets.
#include "server/request_admission.h"

#include <atomic>
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/metrics.h"
#include "common/status.h"
#include "proto/config.pb.h"
#include "proto/data_plane.pb.h"
#include "zmq.hpp"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

using ::testing::HasSubstr;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

class AdmissionTest : public ::testing::Test {
protected:
  // An Admission over this fixture's counters and clock.
  std::unique_ptr<Admission> Make(const DataPlaneConfig &config,
                                  size_t max_standalone_senders = 4096) {
    return std::make_unique<Admission>(
        config, max_standalone_senders, &clock_,
        Admission::Counters{&held_bytes_, &limit_refusals_,
                            &unknown_sender_refusals_, &nonfinite_values_,
                            &nonfinite_pushes_rejected_});
  }

  static RequestHeader Header(uint64_t sender, Op op = PUSH,
                              uint64_t num_keys = 1) {
    RequestHeader h;
    h.set_sender_node_id(sender);
    h.set_op(op);
    h.set_num_keys(num_keys);
    return h;
  }

  static std::vector<zmq::message_t> Frames(std::vector<size_t> sizes) {
    std::vector<zmq::message_t> frames;
    for (size_t n : sizes)
      frames.emplace_back(n);
    return frames;
  }

  FakeClock clock_;
  std::atomic<uint64_t> held_bytes_{0};
  std::atomic<uint64_t> limit_refusals_{0};
  std::atomic<uint64_t> unknown_sender_refusals_{0};
  std::atomic<uint64_t> nonfinite_values_{0};
  std::atomic<uint64_t> nonfinite_pushes_rejected_{0};
  const Admission::WorkerRanks no_workers_;
};

TEST_F(AdmissionTest, LimitsTakeTheirDefaults) {
  DataPlaneConfig config;
  config.mutable_limits()->set_max_held_bytes(5 << 20);
  auto admission = Make(config);
  EXPECT_EQ(admission->limits().max_held_bytes(), 5 << 20);
  EXPECT_GT(admission->limits().max_message_bytes(), 0);
  EXPECT_GT(admission->limits().max_keys_per_message(), 0u);
}

TEST_F(AdmissionTest, MessageOverMaxMessageBytesRefused) {
  DataPlaneConfig config;
  config.mutable_limits()->set_max_message_bytes(1000);
  auto admission = Make(config);
  EXPECT_TRUE(
      admission->AdmitRequest(1000, Header(0), false, no_workers_, 1).ok());
  const absl::Status s =
      admission->AdmitRequest(1001, Header(0), false, no_workers_, 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(s.message()), HasSubstr("max_message_bytes 1000"));
  EXPECT_EQ(limit_refusals_.load(), 1u);
}

TEST_F(AdmissionTest, TooManyKeysRefused) {
  DataPlaneConfig config;
  config.mutable_limits()->set_max_keys_per_message(8);
  auto admission = Make(config);
  EXPECT_TRUE(
      admission->AdmitRequest(10, Header(0, PULL, 8), false, no_workers_, 1)
          .ok());
  const absl::Status s =
      admission->AdmitRequest(10, Header(0, PULL, 9), false, no_workers_, 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(s.message()), HasSubstr("max_keys_per_message 8"));
  EXPECT_EQ(limit_refusals_.load(), 1u);
}

TEST_F(AdmissionTest, StandaloneServerBoundsItsSenders) {
  auto admission = Make(DataPlaneConfig(), /*max_standalone_senders=*/2);
  EXPECT_TRUE(
      admission->AdmitRequest(10, Header(1), true, no_workers_, 0).ok());
  EXPECT_TRUE(
      admission->AdmitRequest(10, Header(2), true, no_workers_, 0).ok());
  const absl::Status s =
      admission->AdmitRequest(10, Header(3), true, no_workers_, 0);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(s.message()), HasSubstr("node 3 refused"));
  EXPECT_EQ(limit_refusals_.load(), 1u);
  // Senders admitted before stay admitted; tools (node 0) and STATS keep
  // no state and always pass.
  EXPECT_TRUE(
      admission->AdmitRequest(10, Header(1), true, no_workers_, 0).ok());
  EXPECT_TRUE(
      admission->AdmitRequest(10, Header(0), true, no_workers_, 0).ok());
  EXPECT_TRUE(
      admission->AdmitRequest(10, Header(4, STATS), true, no_workers_, 0).ok());
  EXPECT_EQ(limit_refusals_.load(), 1u);
}

TEST_F(AdmissionTest, SenderOutsideTheViewIsUnavailable) {
  auto admission = Make(DataPlaneConfig());
  const Admission::WorkerRanks workers = {{11, 0}, {12, 1}};
  EXPECT_TRUE(admission->AdmitRequest(10, Header(12), false, workers, 7).ok());
  const absl::Status s =
      admission->AdmitRequest(10, Header(13), false, workers, 7);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(s.message()), HasSubstr("sender node 13"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("epoch 7"));
  EXPECT_EQ(unknown_sender_refusals_.load(), 1u);
  EXPECT_EQ(limit_refusals_.load(), 0u);
}

TEST_F(AdmissionTest, FramesBytesSumsEveryFrame) {
  EXPECT_EQ(Admission::FramesBytes(Frames({3, 0, 40})), 43u);
  EXPECT_EQ(Admission::FramesBytes({}), 0u);
}

TEST_F(AdmissionTest, HeldBytesOverMaxHeldBytesRefused) {
  DataPlaneConfig config;
  config.mutable_limits()->set_max_held_bytes(100);
  auto admission = Make(config);
  held_bytes_ = 90;
  EXPECT_TRUE(admission->MayHold(10));
  EXPECT_FALSE(admission->MayHold(11));
  EXPECT_TRUE(
      admission->RoomToHold(Frames({4, 6}), "pushes wait for a checkpoint")
          .ok());
  EXPECT_EQ(limit_refusals_.load(), 0u);
  const absl::Status s =
      admission->RoomToHold(Frames({5, 6}), "pushes wait for a checkpoint");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("90 bytes of pushes wait for a checkpoint"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("max_held_bytes 100"));
  EXPECT_EQ(limit_refusals_.load(), 1u);
  held_bytes_ = 0;
  EXPECT_TRUE(admission->RoomToHold(Frames({5, 6}), "requests wait").ok());
}

TEST_F(AdmissionTest, NonFiniteGradientRejectedByDefault) {
  metrics::Registry registry;
  auto admission = Make(DataPlaneConfig());
  metrics::CounterFamily *family =
      registry.AddCounterFamily("nonfinite", "help", {"worker", "action"});
  admission->set_nonfinite_family(family);
  const Admission::WorkerRanks workers = {{11, 3}};
  std::vector<float> values = {1.0f, kNaN, 2.0f, kInf};
  const absl::Status s = admission->PolicePushValues(
      Header(11), false, workers, false, values.data(), values.size());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("gradient 1 is not finite"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("2 of 4 values"));
  EXPECT_EQ(nonfinite_values_.load(), 2u);
  EXPECT_EQ(nonfinite_pushes_rejected_.load(), 1u);
  EXPECT_EQ(family->With({"3", "rejected"})->value(), 2u);
  // A refused push's values are left as they came.
  EXPECT_EQ(values[0], 1.0f);
  EXPECT_TRUE(std::isnan(values[1]));
  // The log is throttled, not the counting.
  clock_.Advance(absl::Milliseconds(10));
  EXPECT_FALSE(admission
                   ->PolicePushValues(Header(11), false, workers, false,
                                      values.data(), 4)
                   .ok());
  EXPECT_EQ(nonfinite_pushes_rejected_.load(), 2u);
  EXPECT_EQ(family->With({"3", "rejected"})->value(), 4u);
}

TEST_F(AdmissionTest, NonFiniteGradientClippedUnderClipPolicy) {
  metrics::Registry registry;
  DataPlaneConfig config;
  config.mutable_gradients()->set_nonfinite(GradientPolicy::CLIP);
  config.mutable_gradients()->set_clip_value(1.5f);
  auto admission = Make(config);
  metrics::CounterFamily *family =
      registry.AddCounterFamily("nonfinite", "help", {"worker", "action"});
  admission->set_nonfinite_family(family);
  std::vector<float> values = {kNaN, kInf, -kInf, 5.0f, -0.5f};
  // A sender the view does not know is labelled "other" (bounded labels).
  ASSERT_TRUE(admission
                  ->PolicePushValues(Header(99), false, no_workers_, false,
                                     values.data(), values.size())
                  .ok());
  EXPECT_EQ(values, (std::vector<float>{0.0f, 1.5f, -1.5f, 1.5f, -0.5f}));
  EXPECT_EQ(nonfinite_values_.load(), 3u);
  EXPECT_EQ(nonfinite_pushes_rejected_.load(), 0u);
  EXPECT_EQ(family->With({"other", "clipped"})->value(), 3u);
}

TEST_F(AdmissionTest, ClipPolicyWithoutClipValueRejects) {
  DataPlaneConfig config;
  config.mutable_gradients()->set_nonfinite(GradientPolicy::CLIP);
  auto admission = Make(config);
  std::vector<float> values = {kNaN};
  EXPECT_EQ(admission
                ->PolicePushValues(Header(0), true, no_workers_, false,
                                   values.data(), 1)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(nonfinite_pushes_rejected_.load(), 1u);
}

TEST_F(AdmissionTest, AssignIsNeverClipped) {
  DataPlaneConfig config;
  config.mutable_gradients()->set_nonfinite(GradientPolicy::CLIP);
  config.mutable_gradients()->set_clip_value(1.0f);
  auto admission = Make(config);
  std::vector<float> values = {5.0f, -7.0f};
  ASSERT_TRUE(admission
                  ->PolicePushValues(Header(0, ASSIGN), true, no_workers_, true,
                                     values.data(), 2)
                  .ok());
  EXPECT_EQ(values, (std::vector<float>{5.0f, -7.0f}));
  // Non-finite ASSIGN values are refused whatever the policy.
  values = {kInf, 1.0f};
  const absl::Status s = admission->PolicePushValues(
      Header(0, ASSIGN), true, no_workers_, true, values.data(), 2);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("ASSIGN value 0"));
}

TEST_F(AdmissionTest, FinitePushClippedByValue) {
  DataPlaneConfig config;
  config.mutable_gradients()->set_clip_value(2.0f);
  auto admission = Make(config);
  std::vector<float> values = {3.0f, -2.5f, 1.0f};
  ASSERT_TRUE(admission
                  ->PolicePushValues(Header(0), true, no_workers_, false,
                                     values.data(), 3)
                  .ok());
  EXPECT_EQ(values, (std::vector<float>{2.0f, -2.0f, 1.0f}));
  EXPECT_EQ(nonfinite_values_.load(), 0u);
}

} // namespace
} // namespace ps
