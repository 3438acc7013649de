// leashctl: operator tool for a running Leash cluster. `status` prints shards, live
// workers and clocks; `checkpoint` makes every shard write a snapshot now; `health` asks
// each shard whether it serves (for probes: exit 0 or 1 with the reason); `keygen` writes
// CURVE key pairs for --curve-keys. With --etcd (replicated shards), the shards are found
// in etcd: `status` first prints each shard's primary, backups, term and in-sync set, with
// each backup's replication lag as its primary reports it (entries, bytes and the age of the
// oldest entry it lacks), and every command talks to the primaries. Single-threaded (the
// client has its own I/O thread).
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "leash/common/cli.h"
#include "leash/common/curve_keys.h"
#include "leash/common/etcd_coordinator.h"
#include "leash/common/flags.h"
#include "leash/common/zmq_transport.h"
#include "leash/worker/client.h"

namespace {

std::string Bytes(uint64_t b) {
  char buf[32];
  if (b < 1024) {
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(b));
  } else if (b < (1u << 20)) {
    std::snprintf(buf, sizeof buf, "%.1f KiB", static_cast<double>(b) / 1024);
  } else {
    std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(b) / (1 << 20));
  }
  return buf;
}

const char* DurableLogName(leash::DurableLogMode m) {
  switch (m) {
    case leash::DurableLogMode::kWrite:
      return "write";
    case leash::DurableLogMode::kFsync:
      return "fsync";
    case leash::DurableLogMode::kOff:
      break;
  }
  return "off";
}

int PrintStatus(const std::vector<leash::ShardStats>& shard_stats, bool json) {
  const auto* stats = &shard_stats;
  if (json) {
    std::printf("{\"shards\": [");
    for (size_t i = 0; i < stats->size(); ++i) {
      const auto& s = (*stats)[i];
      std::printf(
          "%s{\"shard\": %u, \"min_clock\": %lld, \"live_workers\": %zu, \"parked_pulls\": %llu, "
          "\"pushes_applied\": %llu, \"pulls_served\": %llu, \"errors\": %llu, "
          "\"last_snapshot_clock\": %lld, "
          "\"recovered_clock\": %lld, \"snapshot_age_ms\": %lld, \"epochs_done\": %u, \"epochs\": "
          "%u, "
          "\"chunks_done\": %u, \"num_chunks\": %u, \"workers\": [",
          i ? ", " : "", s.shard, static_cast<long long>(s.min_clock), s.workers.size(),
          static_cast<unsigned long long>(s.parked_pulls),
          static_cast<unsigned long long>(s.pushes_applied),
          static_cast<unsigned long long>(s.pulls_served),
          static_cast<unsigned long long>(s.errors), static_cast<long long>(s.last_snapshot_clock),
          static_cast<long long>(s.recovered_clock), static_cast<long long>(s.snapshot_age_ms),
          s.coverage.epochs_done, s.coverage.epochs, s.coverage.chunks_done, s.coverage.num_chunks);
      for (size_t w = 0; w < s.workers.size(); ++w) {
        const auto& wk = s.workers[w];
        std::printf(
            "%s{\"id\": %llu, \"name\": \"%s\", \"clock\": %lld, \"ms_since_heartbeat\": %llu}",
            w ? ", " : "", static_cast<unsigned long long>(wk.id), wk.name.c_str(),
            static_cast<long long>(wk.clock),
            static_cast<unsigned long long>(wk.ms_since_heartbeat));
      }
      std::printf(
          "], \"backup_workers\": %u, \"stale_pushes_dropped\": %llu, \"pushes_summed\": %llu, "
          "\"clock_steps\": %llu, \"durable_log\": \"%s\", \"durable_log_bytes\": %llu, "
          "\"durable_log_failed\": %s, \"term\": %llu, \"memory_budget_bytes\": "
          "%llu, \"memory_used_bytes\": %llu, \"resident_bytes\": %llu, \"sparse_tables\": [",
          s.backup_workers, static_cast<unsigned long long>(s.stale_pushes_dropped),
          static_cast<unsigned long long>(s.pushes_summed),
          static_cast<unsigned long long>(s.clock_steps), DurableLogName(s.durable_log),
          static_cast<unsigned long long>(s.durable_log_bytes),
          s.durable_log_failed ? "true" : "false", static_cast<unsigned long long>(s.term),
          static_cast<unsigned long long>(s.memory_budget_bytes),
          static_cast<unsigned long long>(s.memory_used_bytes),
          static_cast<unsigned long long>(s.resident_bytes));
      bool first = true;
      for (const auto& t : s.tables) {
        if (t.kind != leash::TableKind::kSparse) continue;
        std::printf(
            "%s{\"name\": \"%s\", \"cols\": %u, \"rows\": %llu, \"resident_rows\": %llu, "
            "\"memory_bytes\": %llu, \"tier_hits\": %llu, \"tier_misses\": %llu, "
            "\"evictions\": %llu, \"admissions\": %llu, \"unadmitted_reads\": %llu, "
            "\"dropped_gradients\": %llu, \"expired_rows\": %llu}",
            first ? "" : ", ", t.name.c_str(), t.cols,
            static_cast<unsigned long long>(t.local_rows),
            static_cast<unsigned long long>(t.resident_rows),
            static_cast<unsigned long long>(t.memory_bytes),
            static_cast<unsigned long long>(t.tier_hits),
            static_cast<unsigned long long>(t.tier_misses),
            static_cast<unsigned long long>(t.evictions),
            static_cast<unsigned long long>(t.admissions),
            static_cast<unsigned long long>(t.unadmitted_reads),
            static_cast<unsigned long long>(t.dropped_gradients),
            static_cast<unsigned long long>(t.expired_rows));
        first = false;
      }
      std::printf("]}");
    }
    std::printf("]}\n");
    return 0;
  }
  const auto& s0 = stats->front();
  if (s0.coverage.epochs > 0) {
    std::printf(
        "job: epoch %u of %u complete, %u/%u chunks of the current epoch trained, %u leased\n",
        s0.coverage.epochs_done, s0.coverage.epochs, s0.coverage.chunks_done,
        s0.coverage.num_chunks, s0.coverage.chunks_leased);
  }
  for (const auto& s : *stats) {
    std::string snap = s.snapshot_age_ms < 0
                           ? std::string("no snapshot yet")
                           : "last snapshot at clock " + std::to_string(s.last_snapshot_clock) +
                                 ", " + std::to_string(s.snapshot_age_ms / 1000) + " s ago";
    std::printf(
        "shard %u: min clock %lld, %zu live workers, %llu parked pulls, %llu pushes, %llu pulls, "
        "%llu errors, "
        "%s%s\n",
        s.shard, static_cast<long long>(s.min_clock), s.workers.size(),
        static_cast<unsigned long long>(s.parked_pulls),
        static_cast<unsigned long long>(s.pushes_applied),
        static_cast<unsigned long long>(s.pulls_served), static_cast<unsigned long long>(s.errors),
        snap.c_str(),
        s.recovered_clock >= 0
            ? (", recovered at clock " + std::to_string(s.recovered_clock)).c_str()
            : "");
    if (s.durable_log_failed) {
      std::printf("  durable log FAILED: the shard acknowledges nothing (see its log)\n");
    } else if (s.durable_log != leash::DurableLogMode::kOff) {
      std::printf("  durable log %s, %s written since it started, term %llu%s\n",
                  DurableLogName(s.durable_log), Bytes(s.durable_log_bytes).c_str(),
                  static_cast<unsigned long long>(s.term),
                  s.replicas <= 1 ? " (one replica: a SIGKILL loses nothing acknowledged)" : "");
    }
    if (s.backup_workers > 0) {
      std::printf("  backup workers %u: %llu stale pushes dropped\n", s.backup_workers,
                  static_cast<unsigned long long>(s.stale_pushes_dropped));
    }
    if (s.clock_steps > 0 || s.pushes_summed > 0) {
      std::printf("  clock steps: %llu, on %llu weighted pushes summed\n",
                  static_cast<unsigned long long>(s.clock_steps),
                  static_cast<unsigned long long>(s.pushes_summed));
    }
    for (const auto& w : s.workers) {
      std::printf("  worker %-28s id %016llx clock %lld, heard from %llu ms ago\n", w.name.c_str(),
                  static_cast<unsigned long long>(w.id), static_cast<long long>(w.clock),
                  static_cast<unsigned long long>(w.ms_since_heartbeat));
    }
    if (s.memory_budget_bytes > 0 || s.memory_used_bytes > 0) {
      std::printf("  memory %.1f MiB used of %s; process resident %.1f MiB\n",
                  static_cast<double>(s.memory_used_bytes) / (1 << 20),
                  s.memory_budget_bytes == 0
                      ? "no budget"
                      : (std::to_string(s.memory_budget_bytes >> 20) + " MiB budget").c_str(),
                  static_cast<double>(s.resident_bytes) / (1 << 20));
    }
    for (const auto& t : s.tables) {
      if (t.kind == leash::TableKind::kSparse) {
        const uint64_t looked = t.tier_hits + t.tier_misses;
        std::printf(
            "  table %-20s sparse x %u, ~%llu rows here, %llu in memory (%.1f MiB), hit rate "
            "%.1f%%, %llu evicted, %llu admitted, %llu unadmitted reads, %llu dropped gradients, "
            "%llu expired\n",
            t.name.c_str(), t.cols, static_cast<unsigned long long>(t.local_rows),
            static_cast<unsigned long long>(t.resident_rows),
            static_cast<double>(t.memory_bytes) / (1 << 20),
            looked == 0 ? 0.0 : 100.0 * static_cast<double>(t.tier_hits) / looked,
            static_cast<unsigned long long>(t.evictions),
            static_cast<unsigned long long>(t.admissions),
            static_cast<unsigned long long>(t.unadmitted_reads),
            static_cast<unsigned long long>(t.dropped_gradients),
            static_cast<unsigned long long>(t.expired_rows));
        continue;
      }
      std::printf("  table %-20s %llu x %u, %llu rows here\n", t.name.c_str(),
                  static_cast<unsigned long long>(t.rows), t.cols,
                  static_cast<unsigned long long>(t.local_rows));
    }
  }
  return 0;
}

int Status(leash::Client& client, bool json) {
  auto stats = client.Stats();
  if (!stats.ok()) {
    std::fprintf(stderr, "leashctl: %s\n", stats.status().ToString().c_str());
    return 1;
  }
  return PrintStatus(*stats, json);
}

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) >= 0x20) out += c;
  }
  return out + "\"";
}

std::string ReplicaJson(const leash::ReplicaAddress& a) {
  return "{\"replica\": " + std::to_string(a.replica) +
         ", \"endpoint\": " + JsonString(a.endpoint) +
         ", \"boot_id\": " + std::to_string(a.boot_id) +
         ", \"answers\": " + (a.answers ? "true" : "false") + "}";
}

// What the primary that answered `stats` says of replica `r`'s lag, or null when the stats
// are not a replicated primary's (none, or from another primary than the view's).
const leash::ShardStats::Backup* LagOf(const leash::ShardStats* stats, uint32_t r) {
  if (stats == nullptr || stats->replicas < 2) return nullptr;
  for (const auto& b : stats->backups) {
    if (b.replica == r) return &b;
  }
  return nullptr;
}

std::string LagJson(const leash::ShardStats& st, const leash::ShardStats::Backup& b) {
  const uint64_t behind_commit =
      st.commit_index > b.match_index ? st.commit_index - b.match_index : 0;
  return "{\"replica\": " + std::to_string(b.replica) +
         ", \"in_sync\": " + (b.in_sync ? "true" : "false") +
         ", \"match_index\": " + std::to_string(b.match_index) +
         ", \"entries_behind\": " + std::to_string(b.entries_behind) +
         ", \"entries_behind_commit\": " + std::to_string(behind_commit) +
         ", \"bytes_behind\": " + std::to_string(b.bytes_behind) +
         ", \"ms_behind\": " + std::to_string(b.ms_behind) +
         ", \"ms_since_ack\": " + std::to_string(b.ms_since_ack) + "}";
}

std::string LagText(const leash::ShardStats& st, const leash::ShardStats::Backup& b) {
  std::string t = "lag " + std::to_string(b.entries_behind) + " entries (holds " +
                  std::to_string(b.match_index) + " of " + std::to_string(st.log_index) +
                  ", commit " + std::to_string(st.commit_index) + "), " + Bytes(b.bytes_behind) +
                  ", oldest missing entry " + std::to_string(b.ms_behind) + " ms old; ";
  t += b.ms_since_ack < 0 ? std::string("no acknowledgement this term")
                          : "last ack " + std::to_string(b.ms_since_ack) + " ms ago";
  return t;
}

// leashctl --etcd ... status: the replication view of every shard, as etcd holds it, with
// each backup's lag as the shard's primary reports it (`stats`, in shard order; null or
// shorter when the primaries could not be asked).
void PrintReplication(const leash::ClusterView& view, const std::string& job, bool json,
                      const std::vector<leash::ShardStats>* stats) {
  if (json) {
    std::printf("\"job\": %s, \"etcd_revision\": %lld, \"replicas\": %u, \"replication\": [",
                JsonString(job).c_str(), static_cast<long long>(view.revision), view.replicas);
  } else {
    std::printf("job '%s' in etcd: %u shards x %u replicas (etcd revision %lld)\n", job.c_str(),
                view.num_shards, view.replicas, static_cast<long long>(view.revision));
  }
  for (const leash::ShardView& s : view.shards) {
    auto in_sync = [&](uint32_t r) {
      return std::binary_search(s.in_sync.begin(), s.in_sync.end(), r);
    };
    // The primary's own report, if it is the primary etcd names.
    const leash::ShardStats* st = nullptr;
    if (stats != nullptr && s.shard < stats->size() && s.primary &&
        (*stats)[s.shard].replicas > 1 && (*stats)[s.shard].replica == s.primary->replica) {
      st = &(*stats)[s.shard];
    }
    std::vector<leash::ReplicaAddress> backups;
    for (const auto& a : s.live) {
      if (!s.primary || a.replica != s.primary->replica) backups.push_back(a);
    }
    std::string set;
    for (uint32_t r : s.in_sync) set += (set.empty() ? "" : ",") + std::to_string(r);
    if (json) {
      std::printf("%s{\"shard\": %u, \"term\": %llu, \"primary\": %s, \"backups\": [",
                  s.shard == 0 ? "" : ", ", s.shard, static_cast<unsigned long long>(s.term),
                  s.primary ? ReplicaJson(*s.primary).c_str() : "null");
      for (size_t i = 0; i < backups.size(); ++i) {
        std::printf("%s%s", i ? ", " : "", ReplicaJson(backups[i]).c_str());
      }
      std::printf("], \"in_sync\": [%s]", set.c_str());
      if (st == nullptr) {
        std::printf(", \"log_index\": null, \"commit_index\": null, \"lag\": null}");
        continue;
      }
      std::printf(
          ", \"log_index\": %llu, \"commit_index\": %llu, \"durable_log\": \"%s\", "
          "\"durable_log_bytes\": %llu, \"durable_log_failed\": %s, \"lag\": [",
          static_cast<unsigned long long>(st->log_index),
          static_cast<unsigned long long>(st->commit_index), DurableLogName(st->durable_log),
          static_cast<unsigned long long>(st->durable_log_bytes),
          st->durable_log_failed ? "true" : "false");
      for (size_t i = 0; i < st->backups.size(); ++i) {
        std::printf("%s%s", i ? ", " : "", LagJson(*st, st->backups[i]).c_str());
      }
      std::printf("]}");
      continue;
    }
    if (s.primary) {
      std::printf("shard %u: term %llu, primary replica %u at %s", s.shard,
                  static_cast<unsigned long long>(s.term), s.primary->replica,
                  s.primary->endpoint.c_str());
    } else {
      std::printf("shard %u: no primary (an election is due)", s.shard);
    }
    std::printf("; in sync: %s", set.empty() ? "any (nothing acknowledged yet)" : set.c_str());
    if (st != nullptr) {
      std::printf("; log %llu, commit %llu", static_cast<unsigned long long>(st->log_index),
                  static_cast<unsigned long long>(st->commit_index));
      if (st->durable_log_failed) {
        std::printf("; its durable log FAILED (it acknowledges nothing: see its log)");
      } else if (st->durable_log != leash::DurableLogMode::kOff) {
        std::printf("; durable log %s, %s written", DurableLogName(st->durable_log),
                    Bytes(st->durable_log_bytes).c_str());
      }
    }
    std::printf("\n");
    if (backups.empty()) std::printf("  no live backup\n");
    for (const auto& b : backups) {
      std::printf("  %s replica %u at %s, %s", s.primary ? "backup" : "live", b.replica,
                  b.endpoint.c_str(),
                  s.in_sync.empty()    ? "may lead"
                  : in_sync(b.replica) ? "in sync"
                                       : "catching up (cannot lead)");
      // A backup that answers the workers' pushes and clocks itself while it is the only one
      // in sync (leash-server --backup-answers).
      if (b.answers) {
        std::printf("; %s", s.primary && s.in_sync.size() == 2 && in_sync(b.replica)
                                ? "answers pushes and clocks"
                                : "would answer pushes and clocks as the only backup in sync");
      }
      if (const auto* lag = LagOf(st, b.replica)) {
        std::printf("; %s", LagText(*st, *lag).c_str());
      } else if (s.primary) {
        std::printf("; lag unknown (the primary did not report it)");
      }
      std::printf("\n");
    }
    // Replicas the primary ships its log to that are not registered in etcd (down).
    if (st != nullptr) {
      for (const auto& lag : st->backups) {
        bool live = std::any_of(backups.begin(), backups.end(),
                                [&](const auto& a) { return a.replica == lag.replica; });
        if (!live) {
          std::printf("  replica %u not registered in etcd (down?); %s\n", lag.replica,
                      LagText(*st, lag).c_str());
        }
      }
    }
  }
  if (json) std::printf("], ");
}

// leashctl health: each shard in --servers on a connection of its own, so that every one
// gets its own verdict. A shard is healthy when it answers a Stats request within the
// timeout: it is listening, has recovered its snapshot (a shard binds only after that)
// and its request loop runs. 0 when all are; 1, naming each that is not and why.
int Health(const std::vector<std::string>& servers, const leash::ZmqOptions& zo,
           int64_t timeout_s) {
  leash::ZmqContext ctx;
  int unhealthy = 0;
  for (const std::string& endpoint : servers) {
    auto fail = [&](const std::string& why) {
      std::fprintf(stderr, "leashctl health: %s: NOT SERVING: %s\n", endpoint.c_str(), why.c_str());
      ++unhealthy;
    };
    auto transport = leash::ConnectZmqClient(ctx, {endpoint}, zo);
    if (!transport.ok()) {
      fail(transport.status().ToString());
      continue;
    }
    leash::ClientOptions co;
    co.register_worker = false;
    co.connect_timeout_ms = timeout_s * 1000;
    co.name = "leashctl-health";
    auto client = leash::Client::Connect(std::move(*transport), co);
    if (!client.ok()) {
      if (client.status().code() == leash::StatusCode::kUnavailable &&
          client.status().message().find("did not answer") != std::string::npos) {
        fail("unreachable: no answer within " + std::to_string(timeout_s) +
             " s; the shard is not running, is still recovering its snapshot (it listens only "
             "once recovered), or the address is wrong");
      } else {
        fail(client.status().ToString());
      }
      continue;
    }
    auto stats = (*client)->Stats();
    if (!stats.ok() || stats->size() != 1) {
      fail(stats.ok() ? "no status in the reply" : stats.status().ToString());
      continue;
    }
    const leash::ShardStats& st = stats->front();
    std::printf("%s: serving: shard %u of %u, min clock %lld, %zu live workers, %s\n",
                endpoint.c_str(), st.shard, st.num_shards, static_cast<long long>(st.min_clock),
                st.workers.size(),
                st.recovered_clock >= 0
                    ? ("recovered at clock " + std::to_string(st.recovered_clock)).c_str()
                    : "fresh start");
  }
  return unhealthy == 0 ? 0 : 1;
}

// leashctl keygen DIR [--server] [--client NAME,...]: the server pair and client pairs,
// each client authorized; with neither flag, the server pair and the shared "client".
int Keygen(const std::string& dir, bool server, const std::string& clients) {
  std::vector<std::string> names = leash::SplitList(clients);
  if (!server && names.empty()) {
    server = true;
    names = {leash::kDefaultCurveClient};
  }
  auto make = [&](const std::string& name, bool authorize) {
    bool created = false;
    leash::Status st = leash::GenerateCurveKeyPair(dir, name, authorize, &created);
    if (!st.ok()) {
      std::fprintf(stderr, "leashctl keygen: %s\n", st.ToString().c_str());
      return false;
    }
    std::printf(
        "%s %s/%s.key and %s.pub%s\n", created ? "wrote" : "kept existing", dir.c_str(),
        name.c_str(), name.c_str(),
        authorize ? (", authorized in " + dir + "/authorized/" + name + ".pub").c_str() : "");
    return true;
  };
  if (server && !make("server", false)) return 1;
  for (const auto& n : names) {
    if (n == "server") {
      std::fprintf(stderr,
                   "leashctl keygen: 'server' is the shards' key pair, not a client name\n");
      return 2;
    }
    if (!make(n, true)) return 1;
  }
  return 0;
}

int Run(int argc, char** argv) {
  std::string servers = "tcp://127.0.0.1:7000";
  int64_t timeout_s = 10;
  bool json = false;
  std::string curve_keys;
  std::string curve_client = leash::kDefaultCurveClient;
  bool keygen_server = false;
  std::string keygen_clients;
  std::string etcd;
  std::string job = leash::EtcdOptions{}.job;
  leash::CommandLine cli(
      "leashctl",
      "Operates a Leash cluster.\n\ncommands:\n  status      shards, live workers, clocks, parked "
      "pulls, snapshots\n  checkpoint  make every shard write a snapshot now\n  health      "
      "exit 0 if every shard answers within --timeout (serving), else 1 naming each that does "
      "not and why: for readiness and liveness probes\n  keygen DIR  "
      "write CURVE key pairs into DIR (--server: the shards' pair; --client a,b: client pairs, "
      "authorized; neither: server and the shared 'client'); existing keys are kept",
      /*job_section=*/"", /*default_log_level=*/"warn");
  leash::Flags& flags = cli.flags();
  flags.List("servers", &servers, "comma-separated shard endpoints in shard order");
  flags.Int("timeout", &timeout_s, "seconds to wait for the shards");
  flags.Bool("json", &json, "print status as JSON");
  flags.String("curve-keys", &curve_keys,
               "CURVE keys directory: talk to CURVE shards with DIR/<curve-client>.key");
  flags.String("curve-client", &curve_client,
               "name of the key pair in --curve-keys to use (DIR/NAME.key)");
  flags.List("etcd", &etcd,
             "replicated shards: etcd client URLs (http://host:2379,...); the shards' primaries "
             "are found there instead of in --servers, and status prints the replication view");
  flags.String("job", &job, "with --etcd: the job's name in etcd (its keys are /leash/JOB/)");
  flags.Bool("server", &keygen_server, "keygen: write the shards' key pair DIR/server.key");
  flags.String("client", &keygen_clients,
               "keygen: comma-separated client key pairs to write and authorize");
  auto command = [&]() -> leash::Status {
    const auto& pos = cli.positional();
    bool keygen = !pos.empty() && pos[0] == "keygen";
    if (pos.size() != (keygen ? 2u : 1u)) {
      return leash::InvalidArgument(
          "expected one command: status, checkpoint, health or keygen DIR; see leashctl --help");
    }
    if (!keygen && pos[0] != "status" && pos[0] != "checkpoint" && pos[0] != "health") {
      return leash::InvalidArgument("unknown command '" + pos[0] +
                                    "' (use status, checkpoint, health or keygen)");
    }
    if (timeout_s < 1) {
      return leash::InvalidArgument("bad value for --timeout: " + std::to_string(timeout_s) +
                                    " (need a whole number of seconds >= 1)");
    }
    return leash::Status::Ok();
  };
  if (auto code = leash::RunPrologue(cli, argc, argv, "leashctl", command)) return *code;
  const std::string& cmd = cli.positional()[0];
  if (cmd == "keygen") return Keygen(cli.positional()[1], keygen_server, keygen_clients);
  leash::ZmqOptions zo;
  if (!curve_keys.empty()) {
    auto keys = leash::LoadCurveClientKeys(curve_keys, curve_client);
    if (!keys.ok()) {
      std::fprintf(stderr, "leashctl: --curve-keys: %s\n", keys.status().message().c_str());
      return 2;
    }
    zo.curve = std::move(*keys);
  }
  std::optional<leash::ClusterView> etcd_view;  // status with --etcd: printed with the stats
  if (!etcd.empty()) {
    leash::EtcdOptions eo;
    auto endpoints = leash::ParseEtcdEndpoints(etcd);
    if (!endpoints.ok()) {
      std::fprintf(stderr, "leashctl: --etcd: %s\n", endpoints.status().message().c_str());
      return 2;
    }
    eo.endpoints = std::move(*endpoints);
    eo.job = job;
    eo.request_timeout = std::chrono::seconds(std::min<int64_t>(timeout_s, 5));
    auto directory = leash::NewEtcdShardDirectory(eo);
    auto view = directory.ok() ? (*directory)->View() : directory.status();
    if (!view.ok()) {
      std::fprintf(stderr, "leashctl: %s\n", view.status().ToString().c_str());
      return 1;
    }
    std::vector<std::string> primaries;
    for (const auto& s : view->shards) {
      if (s.primary) primaries.push_back(s.primary->endpoint);
    }
    if (primaries.size() != view->shards.size()) {
      if (cmd == "status") {
        if (json) std::printf("{");
        PrintReplication(*view, job, json, nullptr);
        if (json) std::printf("\"status\": null}\n");
        std::fprintf(stderr,
                     "leashctl: not every shard has a primary now, so the shards' own status "
                     "is left out\n");
        return 0;
      }
      std::fprintf(stderr, "leashctl %s: not every shard of job '%s' has a primary now\n",
                   cmd.c_str(), job.c_str());
      return 1;
    }
    servers.clear();
    for (const auto& p : primaries) servers += (servers.empty() ? "" : ",") + p;
    if (cmd == "status") etcd_view = std::move(*view);
  }
  if (cmd == "health") return Health(leash::SplitList(servers), zo, timeout_s);
  leash::ZmqContext ctx;
  // With --etcd, status prints the replication view first (with the primaries' lag reports),
  // then the shards' own status; a primary that cannot be asked leaves the lag unknown.
  auto replication_failed = [&](const std::string& why, int rc) {
    if (etcd_view) {
      if (json) std::printf("{");
      PrintReplication(*etcd_view, job, json, nullptr);
      if (json) std::printf("\"status\": null}\n");
    }
    std::fprintf(stderr, "leashctl: %s\n", why.c_str());
    return rc;
  };
  auto transport = leash::ConnectZmqClient(ctx, leash::SplitList(servers), zo);
  if (!transport.ok()) return replication_failed(transport.status().ToString(), 2);
  leash::ClientOptions co;
  co.register_worker = false;
  co.connect_timeout_ms = timeout_s * 1000;
  co.name = "leashctl";
  auto client = leash::Client::Connect(std::move(*transport), co);
  if (!client.ok()) return replication_failed(client.status().ToString(), 1);
  if (cmd == "status") {
    if (!etcd_view) return Status(**client, json);
    auto stats = (*client)->Stats();
    if (!stats.ok()) return replication_failed(stats.status().ToString(), 1);
    if (json) std::printf("{");
    PrintReplication(*etcd_view, job, json, &*stats);
    if (json) std::printf("\"status\": ");
    int rc = PrintStatus(*stats, json);
    if (json) std::printf("}\n");
    return rc;
  }
  auto clocks = (*client)->Checkpoint();
  if (!clocks.ok()) {
    std::fprintf(stderr, "leashctl: checkpoint failed: %s\n", clocks.status().ToString().c_str());
    return 1;
  }
  for (size_t i = 0; i < clocks->size(); ++i) {
    std::printf("shard %zu: snapshot written at clock %lld\n", i,
                static_cast<long long>((*clocks)[i]));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return Run(argc, argv); }
