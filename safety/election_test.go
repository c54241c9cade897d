package safety

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/internal/testserver"
	"github.com/distlock/distlock/safety/harness"
	"github.com/distlock/distlock/safety/history"
)

// electionTarget is tg's store with workers that campaign in an election
// (the key is its name) instead of taking a mutex: the leader writes to
// the fenced register with its term and increments the counter, as a
// mutex's holder does, so the suite's checks (overlaps, stale writes,
// lost increments, term order, porcupine) judge the elections.
func electionTarget(tg target) target {
	tg.name += " election"
	tg.lock = "election"
	leftovers := tg.leftovers
	tg.leftovers = func(ctx context.Context, key string) ([]string, error) {
		return leftovers(ctx, backend.ElectionPrefix+key)
	}
	return tg
}

// TestRedisElection runs the election's fault rows on Redis: leader
// killed, leader paused past its TTL, server killed and restarted empty,
// leader partitioned.
func TestRedisElection(t *testing.T) {
	srv := testserver.Redis(t)
	base, _ := redisTarget(t, srv.Addr)
	tg := electionTarget(base)
	t.Run("LeaderKilled", func(t *testing.T) { testLeaderKilled(t, tg) })
	t.Run("LeaderPause", func(t *testing.T) { testHolderPause(t, tg) })
	t.Run("ServerKillRestart", func(t *testing.T) { testRedisServerKill(t, tg, srv) })
	t.Run("Partition", func(t *testing.T) { testPartition(t, tg) })
}

// TestEtcdElection runs the election's fault rows on etcd: leader killed,
// leader paused past its TTL, leader partitioned.
func TestEtcdElection(t *testing.T) {
	srv := testserver.Etcd(t)
	base, _ := etcdTarget(t, srv.Endpoints)
	tg := electionTarget(base)
	t.Run("LeaderKilled", func(t *testing.T) { testLeaderKilled(t, tg) })
	t.Run("LeaderPause", func(t *testing.T) { testHolderPause(t, tg) })
	t.Run("Partition", func(t *testing.T) { testPartition(t, tg) })
}

// TestZooKeeperElection runs the election's fault rows on ZooKeeper:
// leader killed, leader paused past its session, server paused, leader
// partitioned.
func TestZooKeeperElection(t *testing.T) {
	srv := testserver.ZooKeeper(t)
	tg := electionTarget(zkTarget(t, []string{srv.Addr}))
	t.Run("LeaderKilled", func(t *testing.T) { testLeaderKilled(t, tg) })
	t.Run("LeaderPause", func(t *testing.T) { testHolderPause(t, tg) })
	t.Run("ServerPause", func(t *testing.T) { testServerPause(t, tg, srv) })
	t.Run("Partition", func(t *testing.T) { testPartition(t, tg) })
}

// TestPostgresElection and TestMariaDBElection run the election's fault
// rows on the SQL stores: leader killed, leader paused past its TTL,
// server killed and restarted.
func TestPostgresElection(t *testing.T) {
	srv := testserver.Postgres(t)
	tg := electionTarget(pgTarget(t, srv))
	t.Run("LeaderKilled", func(t *testing.T) { testLeaderKilled(t, tg) })
	t.Run("LeaderPause", func(t *testing.T) { testHolderPause(t, tg) })
	t.Run("ServerKillRestart", func(t *testing.T) { testSQLServerKill(t, tg, srv) })
}

func TestMariaDBElection(t *testing.T) {
	srv := testserver.MariaDB(t)
	tg := electionTarget(mariaTarget(t, srv))
	t.Run("LeaderKilled", func(t *testing.T) { testLeaderKilled(t, tg) })
	t.Run("LeaderPause", func(t *testing.T) { testHolderPause(t, tg) })
	t.Run("ServerKillRestart", func(t *testing.T) { testSQLServerKill(t, tg, srv) })
}

// TestRedlockElection runs the leader-killed row on Redlock, which makes
// no tokens: every term is 0, no write can be fenced, and the row checks
// that two leaders never overlap.
func TestRedlockElection(t *testing.T) {
	tg := electionTarget(redlockTarget(t, testserver.RedisNodes(t, 5)))
	t.Run("LeaderKilled", func(t *testing.T) { testLeaderKilled(t, tg) })
}

// testLeaderKilled kills the leader's process (SIGKILL: no release, no
// resignation) while two candidates wait: the store frees the leadership
// when its TTL (or session) runs out, and a candidate is elected then,
// woken by its spin or the store's watch. The killed leader holds nothing
// from the kill on (a dead process writes nothing): its holding ends
// there. Recovery is from the kill to the new leader's election.
func testLeaderKilled(t *testing.T, tg target) {
	r := harness.NewRun(t)
	key := uniqueKey(t)
	lcfg := mixConfig(tg, key, 0)
	// Cycles 0: a campaign that fails (a cold connection, a store error)
	// is followed by another; the first leadership lasts until the kill.
	lcfg.Name, lcfg.Cycles, lcfg.Ops, lcfg.Hold = "leader", 0, 10000, 10000*tg.ttl/4
	leader := r.Worker(lcfg)
	line, err := leader.WaitLine("acquired", 0, 60*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(line) // "acquired <owner> <token>"
	if len(f) != 3 {
		t.Fatalf("leader said %q", line)
	}
	owner := f[1]
	if f[2] != "0" { // a term to write with (Redlock has none)
		waitUntil(t, 30*time.Second, "the leader's first write", func() bool { return accepted(r, owner, 0) })
	}
	ws := startMix(r, tg, key, 2)
	for _, w := range ws {
		if _, err := w.WaitLine("ready", 0, 60*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	killAt := r.Note("SIGKILL leader")
	leader.Kill()
	waitAcquisitions(t, tg, 1, ws...)
	waitAcquisitions(t, tg, 5*soak, ws...)
	stopAll(t, tg, ws...)

	evs := append(r.History(), history.Event{Kind: history.Lost, Proc: "leader", Owner: owner, At: killAt})
	res := harness.Check(t, tg.name, "leader SIGKILL (no resignation)", evs)
	res.Orphans = orphans(t, tg, key)
	if first, ok := firstAcquisitionAfter(evs, killAt); ok {
		res.Recovery = time.Duration(first.Return - killAt)
	}
	res.Notes = fmt.Sprintf("recovery from the kill; the store frees the leadership after %v", tg.expiry)
	res.Log(t)
	assertSafe(t, res)
	assertNoOverlap(t, res)
	if res.Orphans != 0 {
		t.Errorf("%d orphans; want 0", res.Orphans)
	}
}
