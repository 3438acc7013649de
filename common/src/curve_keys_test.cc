// Tests of CURVE key files: generating a keys directory, loading it for a shard and a
// client, and the errors for missing or malformed files.
#include "leash/common/curve_keys.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace leash {
namespace {

namespace fs = std::filesystem;

class KeysDir {
 public:
  KeysDir() {
    std::string tmpl = (fs::temp_directory_path() / "leash-keys-XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data());
  }
  ~KeysDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

void Write(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::trunc);
  f << text;
}

Status Generate(const std::string& dir, const std::string& name, bool authorize) {
  bool created = false;
  return GenerateCurveKeyPair(dir, name, authorize, &created);
}

TEST(CurveKeysTest, KeygenWritesAPairTheShardAndTheClientLoad) {
  ASSERT_TRUE(CurveSupported().ok()) << CurveSupported();
  KeysDir d;
  std::string dir = d.path() + "/keys";
  ASSERT_TRUE(Generate(dir, "server", false).ok());
  ASSERT_TRUE(Generate(dir, "client", true).ok());
  ASSERT_TRUE(Generate(dir, "w0", true).ok());

  struct stat st {};
  ASSERT_EQ(::stat((dir + "/server.key").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  ASSERT_EQ(::stat((dir + "/client.key").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);

  auto server = LoadCurveServerKeys(dir);
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_EQ(server->authorized.size(), 2u);
  EXPECT_EQ(server->authorized[0].name, "client");
  EXPECT_EQ(server->authorized[1].name, "w0");

  auto client = LoadCurveClientKeys(dir, "w0");
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_EQ(client->server_public_z85, server->own.public_z85);
  EXPECT_EQ(client->own.public_z85, server->authorized[1].public_z85);
  EXPECT_TRUE(IsZ85Key(client->own.secret_z85));
  EXPECT_NE(client->own.secret_z85, server->own.secret_z85);
}

TEST(CurveKeysTest, KeygenKeepsExistingKeys) {
  KeysDir d;
  bool created = false;
  ASSERT_TRUE(GenerateCurveKeyPair(d.path(), "server", false, &created).ok());
  EXPECT_TRUE(created);
  auto first = ReadKeyFile(d.path() + "/server.key");
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(GenerateCurveKeyPair(d.path(), "server", false, &created).ok());
  EXPECT_FALSE(created);
  EXPECT_EQ(*ReadKeyFile(d.path() + "/server.key"), *first);
}

TEST(CurveKeysTest, MissingDirectoryNamesItAndSaysWhatToRun) {
  auto k = LoadCurveServerKeys("/nonexistent/leash-keys");
  ASSERT_FALSE(k.ok());
  EXPECT_EQ(k.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(k.status().message().find("/nonexistent/leash-keys"), std::string::npos) << k.status();
  EXPECT_NE(k.status().message().find("leashctl keygen"), std::string::npos) << k.status();
}

TEST(CurveKeysTest, MissingKeyFileIsNamed) {
  KeysDir d;
  ASSERT_TRUE(Generate(d.path(), "client", true).ok());  // no server pair
  auto server = LoadCurveServerKeys(d.path());
  ASSERT_FALSE(server.ok());
  EXPECT_NE(server.status().message().find(d.path() + "/server.key"), std::string::npos)
      << server.status();
  auto client = LoadCurveClientKeys(d.path(), "w9");
  ASSERT_FALSE(client.ok());
  EXPECT_NE(client.status().message().find(d.path() + "/w9.key"), std::string::npos)
      << client.status();
  auto no_server_pub = LoadCurveClientKeys(d.path(), "client");
  ASSERT_FALSE(no_server_pub.ok());
  EXPECT_NE(no_server_pub.status().message().find("server.pub"), std::string::npos)
      << no_server_pub.status();
}

TEST(CurveKeysTest, MalformedKeyFilesAreRefusedWithTheirName) {
  KeysDir d;
  ASSERT_TRUE(Generate(d.path(), "server", false).ok());
  ASSERT_TRUE(Generate(d.path(), "client", true).ok());
  std::string bad = d.path() + "/authorized/bad.pub";
  for (const std::string& text :
       {std::string("not a key\n"), std::string(""), std::string("# only a comment\n"),
        std::string(39, 'a') + "\n", std::string(40, '"') + "\n"}) {
    Write(bad, text);
    auto k = LoadCurveServerKeys(d.path());
    ASSERT_FALSE(k.ok()) << "accepted: '" << text << "'";
    EXPECT_EQ(k.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(k.status().message().find(bad), std::string::npos) << k.status();
  }
  // Two keys in one file are refused too.
  auto good = ReadKeyFile(d.path() + "/client.pub");
  ASSERT_TRUE(good.ok());
  Write(bad, *good + "\n" + *good + "\n");
  EXPECT_FALSE(LoadCurveServerKeys(d.path()).ok());
}

TEST(CurveKeysTest, MismatchedServerPublicKeyIsRefused) {
  KeysDir d;
  ASSERT_TRUE(Generate(d.path(), "server", false).ok());
  ASSERT_TRUE(Generate(d.path(), "client", true).ok());
  auto other = ReadKeyFile(d.path() + "/client.pub");
  Write(d.path() + "/server.pub", *other + "\n");
  auto k = LoadCurveServerKeys(d.path());
  ASSERT_FALSE(k.ok());
  EXPECT_NE(k.status().message().find("not the public half"), std::string::npos) << k.status();
}

TEST(CurveKeysTest, NoAuthorizedClientsIsAnError) {
  KeysDir d;
  ASSERT_TRUE(Generate(d.path(), "server", false).ok());
  auto k = LoadCurveServerKeys(d.path());
  ASSERT_FALSE(k.ok());
  EXPECT_NE(k.status().message().find("authorized"), std::string::npos) << k.status();
  fs::create_directories(d.path() + "/authorized");
  k = LoadCurveServerKeys(d.path());
  ASSERT_FALSE(k.ok());
  EXPECT_NE(k.status().message().find("no client keys"), std::string::npos) << k.status();
}

TEST(CurveKeysTest, BadNamesAreRefused) {
  KeysDir d;
  EXPECT_FALSE(Generate(d.path(), "../evil", true).ok());
  EXPECT_FALSE(Generate(d.path(), "", true).ok());
  EXPECT_FALSE(LoadCurveClientKeys(d.path(), "a/b").ok());
}

}  // namespace
}  // namespace leash
