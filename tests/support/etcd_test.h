// Test support: the gtest fixture of tests that need a real etcd. It starts one (EtcdProcess:
// free ports, data in the test's temporary directory, killed by PID) or skips the test with
// what to install when there is no etcd executable. A derived fixture calls EtcdTest::SetUp()
// first and returns if IsSkipped(). Not thread-safe.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "support/etcd_process.h"
#include "support/process.h"

namespace leash::testing {

class EtcdTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::string why = EtcdProcess::SkipReason(); !why.empty()) GTEST_SKIP() << why;
    etcd_ = std::make_unique<EtcdProcess>(dir_.path(), etcd_host_);
  }

  TempDir dir_;
  // Where etcd listens; a fixture whose replicas run in other network namespaces sets an
  // address they can reach before EtcdTest::SetUp().
  std::string etcd_host_ = "127.0.0.1";
  std::unique_ptr<EtcdProcess> etcd_;
};

}  // namespace leash::testing
