// CurveZMQ key files: reading, validating and generating them (see curve_keys.h).
#include "leash/common/curve_keys.h"

#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <zmq.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace leash {
namespace {

namespace fs = std::filesystem;

constexpr size_t kZ85KeyChars = 40;

std::string Trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  size_t e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

bool ValidName(const std::string& name) {
  if (name.empty() || name == "." || name == "..") return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_' || c == '.';
  });
}

// Secret keys readable by others still work, but say so.
void WarnIfShared(const std::string& secret_path) {
  struct stat st {};
  if (::stat(secret_path.c_str(), &st) == 0 && (st.st_mode & 077) != 0) {
    spdlog::warn("secret key {} is readable by other users (mode {:o}); chmod 600 it", secret_path,
                 st.st_mode & 0777);
  }
}

Result<std::string> PublicOf(const std::string& secret_z85, const std::string& path) {
  char pub[kZ85KeyChars + 1] = {0};
  if (zmq_curve_public(pub, secret_z85.c_str()) != 0) {
    return InvalidArgument("cannot derive the public key from " + path + ": " +
                           zmq_strerror(errno));
  }
  return std::string(pub);
}

Status CheckDir(const std::string& dir) {
  std::error_code ec;
  if (dir.empty())
    return InvalidArgument(
        "--curve-keys is empty; give the directory written by `leashctl keygen DIR`");
  if (!fs::is_directory(dir, ec)) {
    return InvalidArgument("CURVE keys directory '" + dir +
                           "' does not exist or is not a directory" +
                           (ec ? " (" + ec.message() + ")" : std::string()) +
                           "; create it with `leashctl keygen " + dir + "`");
  }
  return Status::Ok();
}

Status WriteFile(const std::string& path, const std::string& text, mode_t mode) {
  std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    if (!f) return IOError("cannot write " + tmp + ": " + std::strerror(errno));
    f << text;
    f.flush();
    if (!f) return IOError("cannot write " + tmp + ": " + std::strerror(errno));
  }
  if (::chmod(tmp.c_str(), mode) != 0)
    return IOError("cannot chmod " + tmp + ": " + std::strerror(errno));
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) return IOError("cannot rename " + tmp + " to " + path + ": " + ec.message());
  return Status::Ok();
}

}  // namespace

Status CurveSupported() {
  if (zmq_has("curve") == 0) {
    return Unavailable(
        "this libzmq was built without CURVE security (libsodium); --curve-keys needs a libzmq "
        "with "
        "CURVE, e.g. Debian's libzmq5");
  }
  return Status::Ok();
}

bool IsZ85Key(const std::string& z85) {
  if (z85.size() != kZ85KeyChars) return false;
  uint8_t raw[32];
  return zmq_z85_decode(raw, z85.c_str()) != nullptr;
}

Result<std::string> ReadKeyFile(const std::string& path) {
  std::ifstream f(path);
  if (!f) {
    return InvalidArgument(
        "cannot read key file " + path + ": " + std::strerror(errno) +
        " (generate keys with `leashctl keygen DIR`, and make the file readable by this user)");
  }
  std::string line, key;
  int keys = 0;
  while (std::getline(f, line)) {
    std::string t = Trim(line);
    if (t.empty() || t[0] == '#') continue;
    ++keys;
    key = t;
  }
  if (f.bad()) return InvalidArgument("cannot read key file " + path + ": " + std::strerror(errno));
  if (keys != 1 || !IsZ85Key(key)) {
    return InvalidArgument(
        "malformed key file " + path + ": expected one line with a 40-character Z85 CURVE key (" +
        std::to_string(keys) + " non-comment lines found); regenerate it with `leashctl keygen`");
  }
  return key;
}

Result<CurveKeys> LoadCurveServerKeys(const std::string& dir) {
  LEASH_RETURN_IF_ERROR(CurveSupported());
  LEASH_RETURN_IF_ERROR(CheckDir(dir));
  CurveKeys k;
  k.dir = dir;
  k.own_name = "server";
  std::string secret_path = dir + "/server.key";
  LEASH_ASSIGN_OR_RETURN(k.own.secret_z85, ReadKeyFile(secret_path));
  LEASH_ASSIGN_OR_RETURN(k.own.public_z85, PublicOf(k.own.secret_z85, secret_path));
  WarnIfShared(secret_path);
  std::error_code ec;
  std::string pub_path = dir + "/server.pub";
  if (fs::exists(pub_path, ec)) {
    LEASH_ASSIGN_OR_RETURN(std::string pub, ReadKeyFile(pub_path));
    if (pub != k.own.public_z85) {
      return InvalidArgument(
          pub_path + " is not the public half of " + secret_path +
          "; the clients would not trust this shard. Regenerate the pair with `leashctl keygen " +
          dir + " --server` after deleting both files");
    }
  }
  std::string auth_dir = dir + "/authorized";
  if (!fs::is_directory(auth_dir, ec)) {
    return InvalidArgument("no directory " + auth_dir +
                           " of authorized client keys; create client keys with "
                           "`leashctl keygen " +
                           dir +
                           " --client NAME` (it authorizes them) or copy their .pub files there");
  }
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(auth_dir, ec)) {
    if (e.path().extension() == ".pub") files.push_back(e.path());
  }
  if (ec) return InvalidArgument("cannot list " + auth_dir + ": " + ec.message());
  std::sort(files.begin(), files.end());
  for (const auto& p : files) {
    LEASH_ASSIGN_OR_RETURN(std::string pub, ReadKeyFile(p.string()));
    k.authorized.push_back({p.stem().string(), pub});
  }
  if (k.authorized.empty()) {
    return InvalidArgument("no client keys in " + auth_dir +
                           " (*.pub): every client would be refused; run "
                           "`leashctl keygen " +
                           dir + " --client NAME` or copy the clients' .pub files there");
  }
  return k;
}

Result<CurveKeys> LoadCurveClientKeys(const std::string& dir, const std::string& client_name) {
  LEASH_RETURN_IF_ERROR(CurveSupported());
  LEASH_RETURN_IF_ERROR(CheckDir(dir));
  if (!ValidName(client_name)) {
    return InvalidArgument("bad CURVE client name '" + client_name +
                           "' (letters, digits, '-', '_', '.')");
  }
  CurveKeys k;
  k.dir = dir;
  k.own_name = client_name;
  std::string secret_path = dir + "/" + client_name + ".key";
  LEASH_ASSIGN_OR_RETURN(k.own.secret_z85, ReadKeyFile(secret_path));
  LEASH_ASSIGN_OR_RETURN(k.own.public_z85, PublicOf(k.own.secret_z85, secret_path));
  WarnIfShared(secret_path);
  LEASH_ASSIGN_OR_RETURN(k.server_public_z85, ReadKeyFile(dir + "/server.pub"));
  return k;
}

Status GenerateCurveKeyPair(const std::string& dir, const std::string& name, bool authorize,
                            bool* created) {
  LEASH_RETURN_IF_ERROR(CurveSupported());
  if (!ValidName(name))
    return InvalidArgument("bad key name '" + name + "' (letters, digits, '-', '_', '.')");
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return IOError("cannot create " + dir + ": " + ec.message());
  std::string secret_path = dir + "/" + name + ".key";
  std::string pub_path = dir + "/" + name + ".pub";
  std::string pub;
  *created = false;
  if (fs::exists(secret_path, ec)) {
    LEASH_ASSIGN_OR_RETURN(std::string secret, ReadKeyFile(secret_path));
    LEASH_ASSIGN_OR_RETURN(pub, PublicOf(secret, secret_path));
  } else {
    char pub_buf[kZ85KeyChars + 1] = {0}, secret_buf[kZ85KeyChars + 1] = {0};
    if (zmq_curve_keypair(pub_buf, secret_buf) != 0) {
      return Internal(std::string("zmq_curve_keypair failed: ") + zmq_strerror(errno));
    }
    pub = pub_buf;
    LEASH_RETURN_IF_ERROR(WriteFile(secret_path,
                                    "# Leash CURVE secret key '" + name +
                                        "': keep it private (mode 0600)\n" +
                                        std::string(secret_buf) + "\n",
                                    0600));
    *created = true;
  }
  if (!fs::exists(pub_path, ec)) {
    LEASH_RETURN_IF_ERROR(
        WriteFile(pub_path, "# Leash CURVE public key '" + name + "'\n" + pub + "\n", 0644));
  }
  if (authorize) {
    std::string auth_dir = dir + "/authorized";
    fs::create_directories(auth_dir, ec);
    if (ec) return IOError("cannot create " + auth_dir + ": " + ec.message());
    std::string auth_path = auth_dir + "/" + name + ".pub";
    if (!fs::exists(auth_path, ec)) {
      LEASH_RETURN_IF_ERROR(WriteFile(
          auth_path, "# Leash CURVE client '" + name + "', accepted by the shards\n" + pub + "\n",
          0644));
    }
  }
  return Status::Ok();
}

}  // namespace leash
