// CurveZMQ keys on disk: the layout of a keys directory, loading it for a shard or a
// client, and generating key pairs (leashctl keygen). Keys are Z85 text files of 40
// characters; secret files are written with mode 0600. Uses libzmq (zmq_curve_keypair,
// zmq_z85_decode), so it lives in the leash_zmq adapter library. Thread-compatible.
//
// Layout of a keys directory DIR (one per cluster):
//   DIR/server.key, DIR/server.pub   the shards' key pair (every shard uses the same one)
//   DIR/NAME.key, DIR/NAME.pub        a client key pair (default NAME: "client", shared by
//                                     every worker and leashctl; or one per worker)
//   DIR/authorized/*.pub              the client public keys the shards accept
// A shard reads server.key and authorized/; a client reads NAME.key and server.pub.
#pragma once

#include <string>
#include <vector>

#include "leash/common/status.h"

namespace leash {

inline constexpr char kDefaultCurveClient[] = "client";

// A key pair in Z85 (40 characters each).
struct CurveKeyPair {
  std::string public_z85;
  std::string secret_z85;
};

struct AuthorizedKey {
  std::string name;  // the file it came from, e.g. "w0" for authorized/w0.pub
  std::string public_z85;
};

// What one process needs: a shard (own = the server pair, authorized filled) or a client
// (own = its pair, server_public_z85 filled).
struct CurveKeys {
  std::string dir;
  std::string own_name;  // "server" or the client's NAME
  CurveKeyPair own;
  std::string server_public_z85;          // clients only
  std::vector<AuthorizedKey> authorized;  // shards only
};

// Unavailable with what to do if this libzmq was built without CURVE (libsodium).
Status CurveSupported();

// True if `z85` is 40 Z85 characters that decode to a 32-byte key.
bool IsZ85Key(const std::string& z85);

// Reads a key file: '#' comment lines and blank lines are skipped, exactly one line must
// be a Z85 key. InvalidArgument naming the file if it is missing, unreadable or holds
// anything else.
Result<std::string> ReadKeyFile(const std::string& path);

// Loads DIR/server.key (its public half derived from it; DIR/server.pub, if present, must
// match) and every DIR/authorized/*.pub. InvalidArgument naming the file and saying what
// to run if anything is missing or malformed, or if no client key is authorized.
Result<CurveKeys> LoadCurveServerKeys(const std::string& dir);

// Loads DIR/<client_name>.key and DIR/server.pub. InvalidArgument naming the file if
// either is missing or malformed.
Result<CurveKeys> LoadCurveClientKeys(const std::string& dir, const std::string& client_name);

// Writes DIR/<name>.key (mode 0600) and DIR/<name>.pub with a fresh key pair, creating
// DIR; with `authorize`, also copies the public key to DIR/authorized/<name>.pub. An
// existing pair is kept (returns false in *created); AlreadyExists is never returned, so
// running keygen twice is harmless. `name` may hold letters, digits, '-', '_' and '.'.
Status GenerateCurveKeyPair(const std::string& dir, const std::string& name, bool authorize,
                            bool* created);

}  // namespace leash
