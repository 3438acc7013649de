// Tests of the secure-by-default rule: endpoints other hosts can reach need CURVE keys or
// --insecure, loopback and ipc:// need neither, and the refusal names both fixes.
#include "leash/common/endpoint.h"

#include <gtest/gtest.h>

namespace leash {
namespace {

TEST(CheckSecureEndpointsTest, ReachableEndpointWithoutKeysIsRefusedNamingBothFixes) {
  Status st = CheckSecureEndpoints({"tcp://127.0.0.1:7000", "tcp://10.0.0.2:7000"}, "", false,
                                   "--servers", "connect to");
  ASSERT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("refusing to connect to tcp://10.0.0.2:7000 (--servers) without "
                              "CURVE keys"),
            std::string::npos)
      << st;
  EXPECT_NE(st.message().find("--curve-keys DIR"), std::string::npos) << st;
  EXPECT_NE(st.message().find("--insecure"), std::string::npos) << st;
}

TEST(CheckSecureEndpointsTest, KeysInsecureOrLoopbackAreAccepted) {
  EXPECT_TRUE(
      CheckSecureEndpoints({"tcp://0.0.0.0:7000"}, "/keys", false, "--bind", "listen on").ok());
  EXPECT_TRUE(CheckSecureEndpoints({"tcp://0.0.0.0:7000"}, "", true, "--bind", "listen on").ok());
  EXPECT_TRUE(CheckSecureEndpoints(
                  {"tcp://127.0.0.1:7000", "tcp://localhost:1", "ipc:///tmp/s", "tcp://[::1]:7000"},
                  "", false, "--servers", "connect to")
                  .ok());
  EXPECT_TRUE(CheckSecureEndpoints({}, "", false, "--servers", "connect to").ok());
}

}  // namespace
}  // namespace leash
