#include "common/durable_file.h"

#include <sys/stat.h>

#include <fstream>
#include <sstream>
#include <string>

#include "gtest/gtest.h"

namespace ps {
namespace {

enum class Step { kCreate, kAppend, kSync, kClose, kRename, kSyncDir, kNone };

std::string StepName(Step step) {
  switch (step) {
    case Step::kCreate:
      return "create";
    case Step::kAppend:
      return "append";
    case Step::kSync:
      return "sync";
    case Step::kClose:
      return "close";
    case Step::kRename:
      return "rename";
    case Step::kSyncDir:
      return "syncdir";
    case Step::kNone:
      return "none";
  }
  return "?";
}

absl::Status Injected(Step step) {
  return absl::InternalError("injected failure of " + StepName(step));
}

// The POSIX env, with one step made to fail (after doing nothing).
class FaultyEnv final : public FileEnv {
 public:
  explicit FaultyEnv(Step fail) : fail_(fail) {}

  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(
      const std::string& path) override {
    if (fail_ == Step::kCreate) return Injected(fail_);
    PS_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file,
                        FileEnv::Default()->NewWritableFile(path));
    return std::unique_ptr<WritableFile>(new File(std::move(file), fail_));
  }
  absl::Status RenameFile(const std::string& from,
                          const std::string& to) override {
    if (fail_ == Step::kRename) return Injected(fail_);
    return FileEnv::Default()->RenameFile(from, to);
  }
  absl::Status RemoveFile(const std::string& path) override {
    return FileEnv::Default()->RemoveFile(path);
  }
  absl::Status SyncDir(const std::string& dir) override {
    if (fail_ == Step::kSyncDir) return Injected(fail_);
    return FileEnv::Default()->SyncDir(dir);
  }
  absl::Status CreateDirs(const std::string& dir) override {
    return FileEnv::Default()->CreateDirs(dir);
  }

 private:
  class File final : public WritableFile {
   public:
    File(std::unique_ptr<WritableFile> file, Step fail)
        : file_(std::move(file)), fail_(fail) {}
    absl::Status Append(absl::string_view data) override {
      // Half of it reaches the file, as when a disk fills up.
      if (fail_ == Step::kAppend) {
        file_->Append(data.substr(0, data.size() / 2)).IgnoreError();
        return Injected(fail_);
      }
      return file_->Append(data);
    }
    absl::Status Sync() override {
      if (fail_ == Step::kSync) return Injected(fail_);
      return file_->Sync();
    }
    absl::Status Close() override {
      absl::Status closed = file_->Close();
      if (fail_ == Step::kClose) return Injected(fail_);
      return closed;
    }

   private:
    std::unique_ptr<WritableFile> file_;
    const Step fail_;
  };

  const Step fail_;
};

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

class DurableFileTest : public ::testing::TestWithParam<Step> {
 protected:
  void SetUp() override {
    dir_ =
        std::string(::testing::TempDir()) + "/durable_" + StepName(GetParam());
    ASSERT_TRUE(FileEnv::Default()->CreateDirs(dir_).ok());
    path_ = dir_ + "/file";
    ASSERT_TRUE(
        WriteStringDurably(*FileEnv::Default(), dir_, path_, "previous").ok());
  }

  std::string dir_;
  std::string path_;
};

TEST_P(DurableFileTest, EachStepsFailureIsAnErrorAndNeverLeavesAMix) {
  const Step step = GetParam();
  FaultyEnv env(step);
  const absl::Status written = WriteStringDurably(
      env, dir_, path_, "the new content, longer than the old");
  EXPECT_FALSE(Exists(path_ + ".tmp")) << "a temporary file left behind";
  if (step == Step::kNone) {
    EXPECT_TRUE(written.ok()) << written;
    EXPECT_EQ(ReadAll(path_), "the new content, longer than the old");
    return;
  }
  ASSERT_FALSE(written.ok())
      << "the failure of " << StepName(step) << " was not reported";
  EXPECT_NE(written.message().find(StepName(step)), std::string::npos)
      << written;
  if (step == Step::kSyncDir) {
    // After the rename: the new file, whole; the error says it may not
    // survive a crash.
    EXPECT_EQ(ReadAll(path_), "the new content, longer than the old");
  } else {
    EXPECT_EQ(ReadAll(path_), "previous");
  }
}

INSTANTIATE_TEST_SUITE_P(Steps, DurableFileTest,
                         ::testing::Values(Step::kCreate, Step::kAppend,
                                           Step::kSync, Step::kClose,
                                           Step::kRename, Step::kSyncDir,
                                           Step::kNone),
                         [](const auto& info) { return StepName(info.param); });

TEST(DurableFileUnsyncedTest, SkipsBothFsyncs) {
  const std::string dir =
      std::string(::testing::TempDir()) + "/durable_unsynced";
  ASSERT_TRUE(FileEnv::Default()->CreateDirs(dir).ok());
  DurableWriteOptions unsynced;
  unsynced.sync = false;
  for (Step step : {Step::kSync, Step::kSyncDir}) {
    FaultyEnv env(step);
    EXPECT_TRUE(WriteStringDurably(env, dir, dir + "/f", "x", unsynced).ok());
  }
  EXPECT_EQ(ReadAll(dir + "/f"), "x");
}

TEST(DurableFileDirsTest, CreatesParentsAndReportsAFileInTheWay) {
  const std::string base = std::string(::testing::TempDir()) + "/durable_dirs";
  EXPECT_TRUE(FileEnv::Default()->CreateDirs(base + "/a/b/c").ok());
  EXPECT_TRUE(Exists(base + "/a/b/c"));
  EXPECT_TRUE(
      FileEnv::Default()->CreateDirs(base + "/a/b/c").ok());  // exists: OK
  ASSERT_TRUE(
      WriteStringDurably(*FileEnv::Default(), base, base + "/file", "x").ok());
  EXPECT_FALSE(FileEnv::Default()->CreateDirs(base + "/file/sub").ok());
}

}  // namespace
}  // namespace ps
