// DurableLog (durable_log.h) on a real directory: records read back as written, a record cut
// short at the end dropped, damage before the end refused, files begun beside a snapshot and
// made current (or dropped) with it.
#include "durable_log.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "support/files.h"

namespace leash::server {
namespace {

namespace fs = std::filesystem;

Message Msg(std::initializer_list<std::string> frames) {
  Message m;
  for (const std::string& f : frames) m.push_back(Frame::Copy(f));
  return m;
}

std::vector<std::string> Frames(const Message& m) {
  std::vector<std::string> out;
  for (const Frame& f : m) out.emplace_back(f.view());
  return out;
}

class DurableLogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           ("durable_log_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::unique_ptr<DurableLog> Open(DurableLog::Sync sync = DurableLog::Sync::kWrite) {
    auto log = DurableLog::Open(dir_.string(), sync);
    EXPECT_TRUE(log.ok()) << log.status();
    return log.ok() ? std::move(*log) : nullptr;
  }
  fs::path dir_;
};

TEST_F(DurableLogTest, RecordsReadBackInOrderWithTheirFramesAndFlags) {
  for (auto sync : {DurableLog::Sync::kWrite, DurableLog::Sync::kFsync}) {
    fs::remove_all(dir_);
    auto log = Open(sync);
    ASSERT_TRUE(log);
    const DurableSnapshotId id{7, 1234};
    ASSERT_TRUE(log->Begin(id, true, Msg({"base", ""})).ok());
    ASSERT_TRUE(log->Commit().ok());
    std::string big(3 << 20, '\0');
    std::mt19937 rng(1);
    for (char& c : big) c = static_cast<char>(rng());
    ASSERT_TRUE(log->Append(false, Msg({"head", big, "x"})).ok());
    ASSERT_TRUE(log->Append(true, Msg({"second"})).ok());
    EXPECT_EQ(log->records_written(), 3u);
    // One fdatasync for both appends (kFsync), none again with nothing new, none in kWrite.
    ASSERT_TRUE(log->MakeDurable().ok());
    ASSERT_TRUE(log->MakeDurable().ok());
    EXPECT_EQ(log->syncs(), sync == DurableLog::Sync::kFsync ? 1u : 0u);
    EXPECT_GE(log->sync_seconds(), 0);
    auto read = log->Read(id);
    ASSERT_TRUE(read.ok()) << read.status();
    ASSERT_EQ(read->size(), 3u);
    EXPECT_TRUE((*read)[0].could_lead);
    EXPECT_EQ(Frames((*read)[0].append), (std::vector<std::string>{"base", ""}));
    EXPECT_FALSE((*read)[1].could_lead);
    EXPECT_EQ(Frames((*read)[1].append), (std::vector<std::string>{"head", big, "x"}));
    EXPECT_TRUE((*read)[2].could_lead);
    EXPECT_EQ(Frames((*read)[2].append), (std::vector<std::string>{"second"}));
    EXPECT_EQ(log->current_bytes(), fs::file_size(dir_ / "log-7-1234"));
  }
}

TEST_F(DurableLogTest, ARecordCutShortAtTheEndIsDroppedAndTheRestKept) {
  auto log = Open();
  ASSERT_TRUE(log->Begin({1, 5}, true, Msg({"base"})).ok());
  ASSERT_TRUE(log->Commit().ok());
  ASSERT_TRUE(log->Append(true, Msg({"one", std::string(1000, 'a')})).ok());
  const uint64_t before_last = log->current_bytes();
  ASSERT_TRUE(log->Append(true, Msg({"two", std::string(1000, 'b')})).ok());
  log.reset();
  // Lengths the last record could have been cut to by a process killed in its write,
  // shortest last (the file is cut further each time).
  const fs::path file = dir_ / "log-1-5";
  const uint64_t full = fs::file_size(file);
  for (uint64_t cut : {full - 1, before_last + 40, before_last + 23, before_last + 1}) {
    fs::resize_file(file, cut);
    auto read = Open()->Read({1, 5});
    ASSERT_TRUE(read.ok()) << cut << ": " << read.status();
    ASSERT_EQ(read->size(), 2u) << cut;
    EXPECT_EQ(Frames((*read)[1].append)[0], "one");
  }
}

TEST_F(DurableLogTest, ARecordThatDoesNotVerifyEndsTheLog) {
  auto log = Open();
  ASSERT_TRUE(log->Begin({1, 5}, true, Msg({"base-header"})).ok());
  ASSERT_TRUE(log->Commit().ok());
  const uint64_t second = log->current_bytes();
  ASSERT_TRUE(log->Append(true, Msg({"one"})).ok());
  ASSERT_TRUE(log->Append(true, Msg({"two"})).ok());
  log.reset();
  const fs::path file = dir_ / "log-1-5";
  // A bit flipped in the second record's header frame (covered by its checksum), in its
  // flags, in its trailer: the log ends before it (never acknowledged, or damaged).
  for (uint64_t at : {second + 40 + 8 + 1, second + 4, second + 40 + 8 + 3 + 5}) {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(at));
    char c = 0;
    f.read(&c, 1);
    f.seekp(static_cast<std::streamoff>(at));
    const char flipped = static_cast<char>(c ^ 0x10);
    f.write(&flipped, 1);
    f.close();
    auto read = Open()->Read({1, 5});
    ASSERT_TRUE(read.ok()) << at << ": " << read.status();
    EXPECT_EQ(read->size(), 1u) << at;
    std::fstream g(file, std::ios::in | std::ios::out | std::ios::binary);  // flipped back
    g.seekp(static_cast<std::streamoff>(at));
    g.write(&c, 1);
  }
  auto read = Open()->Read({1, 5});
  ASSERT_TRUE(read.ok());
  EXPECT_EQ(read->size(), 3u);
}

// Each file is written over the one before the current (the spare): what is left of the
// older file past the new records is never read as records of the new one.
TEST_F(DurableLogTest, ASpareFileIsWrittenOverAndItsOlderBytesAreNotRead) {
  for (auto sync : {DurableLog::Sync::kWrite, DurableLog::Sync::kFsync}) {
    fs::remove_all(dir_);
    auto log = Open(sync);
    ASSERT_TRUE(log->Begin({1, 1}, true, Msg({"base 1"})).ok());
    ASSERT_TRUE(log->Commit().ok());
    for (int i = 0; i < 5; ++i)
      ASSERT_TRUE(log->Append(true, Msg({"old", std::string(100000, 'o')})).ok());
    ASSERT_TRUE(log->Begin({2, 2}, true, Msg({"base 2"})).ok());
    ASSERT_TRUE(log->Commit().ok());
    EXPECT_TRUE(fs::exists(dir_ / "spare"));
    ASSERT_TRUE(log->Begin({3, 3}, true, Msg({"base 3"})).ok());  // over file 1
    ASSERT_TRUE(log->Commit().ok());
    ASSERT_TRUE(log->Append(false, Msg({"new", std::string(1000, 'n')})).ok());
    EXPECT_GT(fs::file_size(dir_ / "log-3-3"), log->current_bytes()) << "the spare was reused";
    auto read = log->Read({3, 3});
    ASSERT_TRUE(read.ok()) << read.status();
    ASSERT_EQ(read->size(), 2u);
    EXPECT_EQ(Frames((*read)[0].append)[0], "base 3");
    EXPECT_EQ(Frames((*read)[1].append)[0], "new");
    // A record written over older bytes by a process killed in its write: its trailer (the
    // last bytes written) is the older file's, so the log ends before it.
    const uint64_t last = log->current_bytes();
    ASSERT_TRUE(log->Append(true, Msg({"cut", std::string(1000, 'c')})).ok());
    {
      std::fstream f(dir_ / "log-3-3", std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(static_cast<std::streamoff>(log->current_bytes() - 16));
      f.write("oooooooooooooooo", 16);
    }
    read = log->Read({3, 3});
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_EQ(read->size(), 2u) << last;
  }
}

TEST_F(DurableLogTest, AFileBegunIsCurrentOnceItsSnapshotIsSavedAndOnlyThen) {
  auto log = Open();
  EXPECT_EQ(log->Append(true, Msg({"x"})).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(log->Begin({}, false, Msg({"empty"})).ok());
  ASSERT_TRUE(log->Commit().ok());
  ASSERT_TRUE(log->Append(false, Msg({"a"})).ok());
  // A snapshot whose save fails: its file goes, appends stay on the current one.
  ASSERT_TRUE(log->Begin({2, 20}, true, Msg({"at 2"})).ok());
  EXPECT_TRUE(fs::exists(dir_ / "log-2-20.new"));
  log->Abort();
  EXPECT_FALSE(fs::exists(dir_ / "log-2-20.new"));
  ASSERT_TRUE(log->Append(false, Msg({"b"})).ok());
  // Killed after the snapshot was saved, before its file was made current: that file is
  // the one read for the snapshot.
  ASSERT_TRUE(log->Begin({3, 30}, true, Msg({"at 3"})).ok());
  {
    auto read = Open()->Read({3, 30});
    ASSERT_TRUE(read.ok()) << read.status();
    ASSERT_EQ(read->size(), 1u);
    EXPECT_EQ(Frames((*read)[0].append)[0], "at 3");
  }
  ASSERT_TRUE(log->Commit().ok());
  ASSERT_TRUE(log->Append(true, Msg({"c"})).ok());
  EXPECT_EQ(testing::FilesNamed(dir_, "log-").size(), 1u) << "older files are deleted";
  EXPECT_EQ(log->Read({}).status().code(), StatusCode::kNotFound);
  auto read = log->Read({3, 30});
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_EQ(read->size(), 2u);
  EXPECT_EQ(Frames((*read)[1].append)[0], "c");
}

TEST_F(DurableLogTest, ADirectoryThatCannotBeMadeIsAClearError) {
  fs::create_directories(dir_);
  std::ofstream(dir_ / "file") << "x";
  auto log = DurableLog::Open((dir_ / "file" / "log").string(), DurableLog::Sync::kWrite);
  ASSERT_FALSE(log.ok());
  EXPECT_NE(log.status().message().find("durable log directory"), std::string::npos)
      << log.status();
}

}  // namespace
}  // namespace leash::server
