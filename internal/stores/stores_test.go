package stores

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// TestParseStore checks what each URL form becomes, with no I/O.
func TestParseStore(t *testing.T) {
	t.Run("redis", func(t *testing.T) {
		s := mustParse(t, "redis://u:pw@127.0.0.1:6390/2?dial_timeout=1s&read_timeout=2s").(*redisStore)
		if s.String() != "redis://u:xxxxx@127.0.0.1:6390/2?dial_timeout=1s&read_timeout=2s" {
			t.Errorf("name %q", s)
		}
		if s.ping != 3*time.Second {
			t.Errorf("ping bound %v; want dial + read timeout, 3s", s.ping)
		}
		o := mustParse(t, "rediss+sentinel://127.0.0.1:26379?master_name=m&addr=127.0.0.2:26379").(*redisStore)
		if o.String() != "rediss+sentinel://127.0.0.1:26379?master_name=m&addr=127.0.0.2:26379" {
			t.Errorf("name %q", o)
		}
		c := mustParse(t, "redis+cluster://127.0.0.1:7000?addr=127.0.0.1:7001").(*redisStore)
		if !strings.HasPrefix(c.String(), "redis+cluster://") {
			t.Errorf("name %q", c)
		}
	})
	t.Run("redlock", func(t *testing.T) {
		s := mustParse(t, "redlock:redis://:pw@127.0.0.1:1,redis://127.0.0.1:2,rediss://127.0.0.1:3").(*redlockStore)
		if len(s.clients) != 3 || s.res.Quorum() != 2 {
			t.Errorf("%d clients, quorum %d; want 3 and 2", len(s.clients), s.res.Quorum())
		}
		if s.String() != "redlock:redis://:xxxxx@127.0.0.1:1,redis://127.0.0.1:2,rediss://127.0.0.1:3" {
			t.Errorf("name %q", s)
		}
	})
	t.Run("etcd", func(t *testing.T) {
		s := mustParse(t, "etcd://root:pw@10.0.0.1,10.0.0.2:2479,[::1]?dial_timeout=2s").(*etcdStore)
		want := []string{"http://10.0.0.1:2379", "http://10.0.0.2:2479", "http://[::1]:2379"}
		if !slices.Equal(s.cfg.Endpoints, want) {
			t.Errorf("endpoints %q; want %q", s.cfg.Endpoints, want)
		}
		if s.cfg.Username != "root" || s.cfg.Password != "pw" || s.cfg.DialTimeout != 2*time.Second {
			t.Errorf("user %q, password %q, dial timeout %v", s.cfg.Username, s.cfg.Password, s.cfg.DialTimeout)
		}
		if s.String() != "etcd://root:xxxxx@10.0.0.1:2379,10.0.0.2:2479,[::1]:2379?dial_timeout=2s" {
			t.Errorf("name %q", s)
		}
	})
	t.Run("zookeeper", func(t *testing.T) {
		s := mustParse(t, "zk://10.0.0.1:2181,10.0.0.2/app/locks/?session_timeout=6s").(*zkStore)
		if !slices.Equal(s.servers, []string{"10.0.0.1:2181", "10.0.0.2:2181"}) || s.session != 6*time.Second || s.dial != defaultDialTimeout {
			t.Errorf("servers %q, session %v, dial %v", s.servers, s.session, s.dial)
		}
		if len(s.opts) != 1 {
			t.Errorf("%d options; want the root", len(s.opts))
		}
		if d := mustParse(t, "zookeeper://10.0.0.1").(*zkStore); d.session != 0 || len(d.opts) != 0 {
			t.Errorf("defaults: session %v (want 0: the TTL), %d options", d.session, len(d.opts))
		}
	})
	t.Run("postgres", func(t *testing.T) {
		s := mustParse(t, "postgresql://app:pw@db.example:5433/locks?sslmode=disable&connect_timeout=3").(*postgresStore)
		cc := s.cfg.ConnConfig
		if cc.Host != "db.example" || cc.Port != 5433 || cc.Database != "locks" || cc.User != "app" || cc.Password != "pw" || cc.ConnectTimeout != 3*time.Second {
			t.Errorf("config %+v", cc)
		}
		if strings.Contains(s.String(), "pw") {
			t.Errorf("name %q shows the password", s)
		}
	})
	t.Run("mysql", func(t *testing.T) {
		for _, raw := range []string{
			"mysql://app:p%40ss@db.example:3307/locks?parseTime=true",
			"mariadb://app:p@ss@tcp(db.example:3307)/locks?parseTime=true",
		} {
			s := mustParse(t, raw).(*mysqlStore)
			c := s.cfg
			if c.User != "app" || c.Passwd != "p@ss" || c.Net != "tcp" || c.Addr != "db.example:3307" || c.DBName != "locks" || !c.ParseTime || c.Timeout != defaultDialTimeout {
				t.Errorf("%s: config user %q password %q net %q addr %q db %q parseTime %v timeout %v", raw, c.User, c.Passwd, c.Net, c.Addr, c.DBName, c.ParseTime, c.Timeout)
			}
			if strings.Contains(s.String(), "p@ss") {
				t.Errorf("name %q shows the password", s)
			}
		}
		if s := mustParse(t, "mysql://root@db.example/locks").(*mysqlStore); s.cfg.Addr != "db.example:3306" {
			t.Errorf("default port: addr %q", s.cfg.Addr)
		}
	})
}

func mustParse(t *testing.T, raw string) Store {
	t.Helper()
	s, err := Parse(raw, Options{})
	if err != nil {
		t.Fatalf("Parse(%q, Options{}): %v", raw, err)
	}
	return s
}

// TestRedact hides passwords, also in URLs net/url cannot parse.
func TestRedact(t *testing.T) {
	for raw, want := range map[string]string{
		"redis://u:pw@h:1/0":             "redis://u:xxxxx@h:1/0",
		"redis://h:1":                    "redis://h:1",
		"redis://u:pw@h:port":            "redis://u:xxxxx@h:port",
		"etcd://u:pw@a:1,b":              "etcd://u:xxxxx@a:1,b",
		"mysql://u:p@w@tcp(h:1)/db?x=1":  "mysql://u:xxxxx@tcp(h:1)/db?x=1",
		"mysql://u@tcp(h:1)/db":          "mysql://u@tcp(h:1)/db",
		"zk://h1:2181,h2:2181/r":         "zk://h1:2181,h2:2181/r",
		"postgres://u:pw@h/db?x=%zz":     "postgres://u:xxxxx@h/db?x=%zz",
		"postgres://u:pw@h/d b":          "postgres://u:xxxxx@h/d%20b",
		"redlock:redis://h:1,redis://h2": "redlock:redis://h:1,redis://h2",
	} {
		if got := Redact(raw); got != want {
			t.Errorf("Redact(%q) = %q; want %q", raw, got, want)
		}
	}
}

// TestDurations: seconds or Go durations, as the URLs and the command's
// flags take them.
func TestDurations(t *testing.T) {
	for s, want := range map[string]time.Duration{"0": 0, "10": 10 * time.Second, "1.5": 1500 * time.Millisecond,
		"250ms": 250 * time.Millisecond, "1m30s": 90 * time.Second} {
		if got, err := ParseDuration(s); err != nil || got != want {
			t.Errorf("ParseDuration(%q) = %v, %v; want %v", s, got, err, want)
		}
	}
	for _, s := range []string{"", "soon", "NaN", "inf", "1e300", "10 s"} {
		if got, err := ParseDuration(s); err == nil {
			t.Errorf("ParseDuration(%q) = %v; want an error", s, got)
		}
	}
}
