package safety

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/distlock/distlock/internal/testserver"
	"github.com/distlock/distlock/safety/harness"
)

// server is a store process the soak can fault; nil for none.
type server interface {
	Pause()
	Resume()
	Kill()
	Start()
}

// testRandomMix runs four workers for soak x 20s while faults strike at
// random (seeded) moments: a worker frozen for 1-4 expiries, the server
// frozen for 1-3 expiries or killed and started again. It checks what must
// hold under every fault: no stale write accepted, no overlap the token
// did not catch, no orphan. Only under make soak (see TestSoakMix).
func testRandomMix(t *testing.T, tg target, srv server) {
	r := harness.NewRun(t)
	key := uniqueKey(t)
	var ws []*harness.Worker
	for i := range 4 {
		ws = append(ws, r.Worker(mixConfig(tg, key, i)))
	}
	rnd := rand.New(rand.NewPCG(seed, 0x50a4))
	between := func(lo, hi time.Duration) time.Duration { return lo + time.Duration(rnd.Int64N(int64(hi-lo))) }
	end := time.Now().Add(time.Duration(soak) * 20 * time.Second)
	faults := 0
	for time.Now().Before(end) {
		time.Sleep(between(tg.expiry, 4*tg.expiry)) // the time between faults
		faults++
		switch f := rnd.IntN(3); {
		case f == 0 || srv == nil:
			w := ws[rnd.IntN(len(ws))]
			r.Note("SIGSTOP " + w.Name)
			w.Pause()
			time.Sleep(between(tg.expiry, 4*tg.expiry))
			w.Resume()
			r.Note("SIGCONT " + w.Name)
		case f == 1:
			r.Note("SIGSTOP server")
			srv.Pause()
			time.Sleep(between(tg.expiry, 3*tg.expiry))
			srv.Resume()
			r.Note("SIGCONT server")
		default:
			r.Note("SIGKILL server")
			srv.Kill()
			srv.Start()
			r.Note("server restarted")
		}
	}
	stopAll(t, tg, ws...)
	res := harness.Check(t, tg.name, fmt.Sprintf("randomized mix, %d faults", faults), r.History())
	res.Orphans = orphans(t, tg, key)
	res.Log(t)
	assertSafe(t, res)
	if res.Orphans != 0 {
		t.Errorf("%d orphans; want 0", res.Orphans)
	}
}

func TestSoakMix(t *testing.T) {
	if soak == 1 {
		t.Skip("the randomized mix runs under make soak (DISTLOCK_SAFETY_SOAK > 1)")
	}
	t.Run("redis", func(t *testing.T) {
		srv := testserver.Redis(t)
		tg, _ := redisTarget(t, srv.Addr)
		testRandomMix(t, tg, srv)
	})
	t.Run("etcd", func(t *testing.T) {
		srv := testserver.Etcd(t)
		tg, _ := etcdTarget(t, srv.Endpoints)
		testRandomMix(t, tg, nil) // in-process server: worker pauses only
	})
	t.Run("zookeeper", func(t *testing.T) {
		srv := testserver.ZooKeeper(t)
		testRandomMix(t, zkTarget(t, []string{srv.Addr}), srv)
	})
	t.Run("postgres", func(t *testing.T) {
		srv := testserver.Postgres(t)
		testRandomMix(t, pgTarget(t, srv), srv)
	})
	t.Run("mariadb", func(t *testing.T) {
		srv := testserver.MariaDB(t)
		testRandomMix(t, mariaTarget(t, srv), srv)
	})
}
