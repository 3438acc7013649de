// Tests of Status and Result.
#include "leash/common/status.h"

#include <gtest/gtest.h>

namespace leash {
namespace {

Result<int> Half(int x) {
  if (x % 2 != 0) return InvalidArgument(std::to_string(x) + " is odd");
  return x / 2;
}

Result<int> Quarter(int x) {
  LEASH_ASSIGN_OR_RETURN(int h, Half(x));
  LEASH_ASSIGN_OR_RETURN(int q, Half(h));
  return q;
}

TEST(StatusTest, OkByDefaultAndPrintsCodeAndMessage) {
  EXPECT_TRUE(Status().ok());
  Status s = NotFound("unknown table 7");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.ToString(), "NotFound: unknown table 7");
  EXPECT_EQ(s.WithContext("shard 1").ToString(), "NotFound: shard 1: unknown table 7");
  EXPECT_EQ(Status().WithContext("x"), Status());
}

TEST(StatusTest, ResultPropagatesErrorsThroughAssignOrReturn) {
  EXPECT_EQ(*Quarter(8), 2);
  Result<int> r = Quarter(6);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "3 is odd");
}

TEST(StatusTest, ResultFromOkStatusBecomesInternalError) {
  Result<int> r{Status::Ok()};
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInternal);
}

}  // namespace
}  // namespace leash
