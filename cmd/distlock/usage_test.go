//go:build unix

package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestBadCommandLines runs distlock with bad flags, URLs, keys and
// commands, each URL pointing at a listener that stands for the store:
// exit status 2 (127 and 126 for a command that is not there or cannot
// run) with a message, and not one connection to the store.
func TestBadCommandLines(t *testing.T) {
	ln := listen(t)
	addr := ln.Addr().String()
	redisURL := "redis://" + addr
	redlockURL := "redlock:" + redisURL + "," + redisURL + "," + redisURL
	noExec := filepath.Join(t.TempDir(), "script")
	if err := os.WriteFile(noExec, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("k", 70_000)
	run := func(store string, rest ...string) []string {
		return append([]string{"run", "--store", store}, rest...)
	}
	cases := []struct {
		name string
		args []string
		env  []string
		code int
		want string
	}{
		{"nothing", nil, nil, 2, "usage: distlock run"},
		{"unknown command", []string{"lock", "k"}, nil, 2, `unknown command "lock"`},
		{"run alone", []string{"run"}, nil, 2, "missing KEY"},
		{"no command after --", run(redisURL, "k", "--"), nil, 2, "missing COMMAND after --"},
		{"two keys", run(redisURL, "k1", "k2", "--", "true"), nil, 2, `"k2" after KEY "k1": one KEY, then -- and COMMAND`},
		{"command without --", run(redisURL, "k", "true"), nil, 2, `"true" after KEY "k": one KEY, then -- and COMMAND`},
		{"-c and a command", run(redisURL, "-c", "true", "k", "--", "true"), nil, 2, "-c and a COMMAND after -- exclude each other"},
		{"--shell and a command", run(redisURL, "--shell", "true", "k", "--", "true"), nil, 2, "--shell and a COMMAND after -- exclude each other"},
		{"empty -c", run(redisURL, "-c", "", "k"), nil, 2, "-c: an empty command string"},
		{"-c and --shell", run(redisURL, "-c", "true", "--shell", "true", "k"), nil, 2, "-c and --shell say the same thing"},
		{"-n and --wait", run(redisURL, "-n", "--wait", "1", "k", "--", "true"), nil, 2, "--wait and -n say the same thing"},
		{"-w and --wait", run(redisURL, "-w", "1", "--wait", "1", "k", "--", "true"), nil, 2, "--wait and -w say the same thing"},
		{"-E and --conflict-exit-code", run(redisURL, "-E", "1", "--conflict-exit-code", "1", "k", "--", "true"), nil, 2, "say the same thing"},
		{"-E 256", run(redisURL, "-E", "256", "k", "--", "true"), nil, 2, "-E 256: want 0 to 255"},
		{"-s and -x", run(redisURL, "-s", "-x", "k", "--", "true"), nil, 2, "exclude each other"},
		{"-w bad", run(redisURL, "-w", "soon", "k", "--", "true"), nil, 2, `bad duration "soon"`},
		{"ttl below the minimum", run(redisURL, "--ttl", "10ms", "k", "--", "true"), nil, 2, "--ttl 10ms is below the minimum, 500ms"},
		{"long label", run(redisURL, "--label", strings.Repeat("l", 257), "k", "--", "true"), nil, 2, "--label of 257 bytes: at most 256"},
		{"table on redis", run(redisURL, "--table", "t", "k", "--", "true"), nil, 2, "--table: the Redis store keeps no table"},
		{"table on etcd", run("etcd://"+addr, "--table", "t", "k", "--", "true"), nil, 2, "--table: the etcd store keeps no table"},
		{"prefix on postgres", run("postgres://"+addr+"/db", "--prefix", "p", "k", "--", "true"), nil, 2, "--prefix: the PostgreSQL store keeps no key prefix"},
		{"prefix on mysql", run("mysql://root@"+addr+"/db", "--prefix", "p", "k", "--", "true"), nil, 2, "--prefix: the MySQL store keeps no key prefix"},
		{"prefix on zk", run("zk://"+addr, "--prefix", "/p", "k", "--", "true"), nil, 2, "names the root as its path"},
		{"bad table", run("postgres://"+addr+"/db", "--table", "locks;drop", "k", "--", "true"), nil, 2, "is not a plain identifier"},
		{"bad mysql table", run("mysql://root@"+addr+"/db", "--table", "a.b.c", "k", "--", "true"), nil, 2, "want table or schema.table"},
		{"status table on redis", []string{"status", "--store", redisURL, "--table", "t", "k"}, nil, 2, "--table: the Redis store keeps no table"},
		{"status bad table", []string{"status", "--store", "postgres://" + addr + "/db", "--table", "1t", "k"}, nil, 2, "is not a plain identifier"},
		{"empty key", run(redisURL, "", "--", "true"), nil, 2, "empty KEY"},
		{"flag after key", run(redisURL, "k", "--wait", "0", "--", "true"), nil, 2, "--wait after KEY: flags go before KEY"},
		{"unknown flag", run(redisURL, "--timeout", "1", "k", "--", "true"), nil, 2, "flag provided but not defined: -timeout"},
		{"bad wait", run(redisURL, "--wait", "soon", "k", "--", "true"), nil, 2, `bad duration "soon"`},
		{"negative wait", run(redisURL, "--wait", "-1s", "k", "--", "true"), nil, 2, `negative duration "-1s"`},
		{"zero ttl", run(redisURL, "--ttl", "0", "k", "--", "true"), nil, 2, "--ttl 0: want a duration > 0"},
		{"infinite ttl", run(redisURL, "--ttl", "inf", "k", "--", "true"), nil, 2, `bad duration "inf"`},
		{"conflict code", run(redisURL, "--conflict-exit-code", "256", "k", "--", "true"), nil, 2, "want 0 to 255"},
		{"limit 0", run(redisURL, "--limit", "0", "k", "--", "true"), nil, 2, "--limit 0: want 1 or more"},
		{"limit and shared", run(redisURL, "--limit", "2", "--shared", "k", "--", "true"), nil, 2, "exclude each other"},
		{"shared and exclusive", run(redisURL, "--shared", "--exclusive", "k", "--", "true"), nil, 2, "exclude each other"},
		{"limit and exclusive", run(redisURL, "--exclusive", "--limit", "1", "k", "--", "true"), nil, 2, "exclude each other"},
		{"elect and limit", run(redisURL, "--elect", "--limit", "2", "k", "--", "true"), nil, 2, "exclude each other"},
		{"elect, wait 0", run(redisURL, "--elect", "--wait", "0", "k", "--", "true"), nil, 2, "--elect with --wait"},
		{"elect, -n", run(redisURL, "--elect", "-n", "k", "--", "true"), nil, 2, "--elect with -n"},
		{"value without elect", run(redisURL, "--value", "v", "k", "--", "true"), nil, 2, "--value publishes a leader's value: it goes with --elect"},
		{"elect, name at the key limit", run(redisURL, "--elect", long[:65536], "--", "true"), nil, 2, "is longer than 65536"},
		{"status elect and shared", []string{"status", "--store", redisURL, "--elect", "--shared", "k"}, nil, 2, "exclude each other"},
		{"limit on redlock", run(redlockURL, "--limit", "3", "k", "--", "true"), nil, 2, "--limit: store redlock:redis://"},
		{"shared on redlock", run(redlockURL, "--shared", "k", "--", "true"), nil, 2, "redlock holds mutexes only"},
		{"exclusive on redlock", run(redlockURL, "--exclusive", "k", "--", "true"), nil, 2, "cannot hold a read/write lock"},
		{"limit, command not found", run(redisURL, "--limit", "2", "k", "--", "distlock-no-such-command"), nil, 127, "executable file not found"},
		{"shared, command not found", run(redisURL, "--shared", "k", "--", "distlock-no-such-command"), nil, 127, "executable file not found"},
		{"no store", []string{"run", "k", "--", "true"}, []string{"DISTLOCK_STORE="}, 2, "no store: give --store URL or set DISTLOCK_STORE"},
		{"store from the environment", []string{"run", "k", "--", "true"}, []string{"DISTLOCK_STORE=memory://"}, 2, "cannot lock across processes"},
		{"memory", run("memory://", "k", "--", "true"), nil, 2, "cannot lock across processes"},
		{"no scheme", run(addr, "k", "--", "true"), nil, 2, "unknown store scheme"},
		{"unknown scheme", run("consul://"+addr, "k", "--", "true"), nil, 2, `unknown store scheme "consul"`},
		{"redis option", run(redisURL+"/0?pool=3", "k", "--", "true"), nil, 2, "unexpected option: pool"},
		{"redis db", run(redisURL+"/x", "k", "--", "true"), nil, 2, "invalid database number"},
		{"redis port", run("redis://u:hunter2@127.0.0.1:port/0", "k", "--", "true"), nil, 2, "u:xxxxx@"},
		{"sentinel without master", run("redis+sentinel://"+addr, "k", "--", "true"), nil, 2, "master_name"},
		{"cluster option", run("redis+cluster://"+addr+"?db=1", "k", "--", "true"), nil, 2, "unexpected option: db"},
		{"redlock of 2", run("redlock:"+redisURL+","+redisURL, "k", "--", "true"), nil, 2, "need an odd number"},
		{"redlock form", run("redlock://"+addr+","+addr+","+addr, "k", "--", "true"), nil, 2, "want redlock:redis://"},
		{"redlock node", run("redlock:"+redisURL+","+redisURL+",http://"+addr, "k", "--", "true"), nil, 2, "invalid URL scheme"},
		{"etcd path", run("etcd://"+addr+"/locks", "k", "--", "true"), nil, 2, "an etcd URL names hosts only"},
		{"etcd port", run("etcd://127.0.0.1:2379,127.0.0.1:99999", "k", "--", "true"), nil, 2, `bad port "99999"`},
		{"etcd option", run("etcd://"+addr+"?prefix=x", "k", "--", "true"), nil, 2, `unknown option "prefix"`},
		{"etcd timeout", run("etcd://"+addr+"?dial_timeout=0", "k", "--", "true"), nil, 2, "want a positive duration"},
		{"zk root", run("zk://"+addr+"/zookeeper/locks", "k", "--", "true"), nil, 2, "/zookeeper"},
		{"zk user", run("zk://u:p@"+addr, "k", "--", "true"), nil, 2, "credentials"},
		{"zk host", run("zk://"+addr+",:2181", "k", "--", "true"), nil, 2, "no host name"},
		{"postgres", run("postgres://"+addr+"/db?sslmode=sometimes", "k", "--", "true"), nil, 2, "sslmode"},
		{"mysql database", run("mysql://root@"+addr+"/", "k", "--", "true"), nil, 2, "name one database"},
		{"mysql dsn", run("mysql://root@tcp("+addr+"/db", "k", "--", "true"), nil, 2, "invalid DSN"},
		{"mysql param", run("mysql://root@"+addr+"/db?parseTime=maybe", "k", "--", "true"), nil, 2, "parseTime"},
		{"long redis key", run(redisURL, long, "--", "true"), nil, 2, "is longer than 65536"},
		{"long redlock key", run("redlock:"+redisURL+","+redisURL+","+redisURL, long, "--", "true"), nil, 2, "is longer than"},
		{"long etcd key", run("etcd://"+addr, long, "--", "true"), nil, 2, "is longer than"},
		{"long zk key", run("zk://"+addr, long, "--", "true"), nil, 2, "is longer than"},
		{"long postgres key", run("postgres://"+addr+"/db", long, "--", "true"), nil, 2, "characters long"},
		{"long mysql key", run("mysql://root@"+addr+"/db", long, "--", "true"), nil, 2, "bytes long"},
		{"command not found", run(redisURL, "k", "--", "distlock-no-such-command"), nil, 127, "executable file not found"},
		{"command not executable", run(redisURL, "k", "--", noExec), nil, 126, "permission denied"},
		{"status alone", []string{"status"}, nil, 2, "missing KEY"},
		{"status of two keys", []string{"status", "--store", redisURL, "a", "b"}, nil, 2, "status takes one KEY"},
		{"status flag", []string{"status", "--store", redisURL, "--wait", "1", "k"}, nil, 2, "flag provided but not defined: -wait"},
		{"status memory", []string{"status", "--store", "memory://", "k"}, nil, 2, "cannot lock across processes"},
		{"status limit 0", []string{"status", "--store", redisURL, "--limit", "0", "k"}, nil, 2, "status: --limit 0: want 1 or more"},
		{"status limit and shared", []string{"status", "--store", redisURL, "--limit", "2", "--shared", "k"}, nil, 2, "exclude each other"},
		{"status flag after key", []string{"status", "--store", redisURL, "k", "--json"}, nil, 2, "status takes one KEY, flags before it"},
		{"status long key", []string{"status", "--store", redisURL, long}, nil, 2, "is longer than 65536"},
		{"status of a semaphore on redlock", []string{"status", "--store", redlockURL, "--limit", "2", "k"}, nil, 2, "redlock holds mutexes only"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, stderr := runDistlock(t, c.env, c.args...)
			if code != c.code || !strings.Contains(stderr, c.want) {
				t.Errorf("distlock %q: status %d, stderr:\n%s\nwant status %d and %q", c.args, code, stderr, c.code, c.want)
			}
			if strings.Contains(stderr, "hunter2") {
				t.Errorf("the password is in the message:\n%s", stderr)
			}
			if n := ln.connections(t); n != 0 {
				t.Errorf("distlock %q made %d connections to the store; want none", c.args, n)
			}
		})
	}
}

// TestHelp: --help, -h and help print the usage, with the URL forms and
// the exit statuses, on stdout, and exit 0.
func TestHelp(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"-h"}, {"help"}, {"run", "--help"}, {"run", "-h"}, {"status", "--help"}} {
		p := start(t, nil, args...)
		if code := p.wait(); code != 0 {
			t.Errorf("distlock %q: status %d; want 0", args, code)
		}
		p.mu.Lock()
		out := p.stdout.String()
		p.mu.Unlock()
		for _, want := range []string{"redis://", "rediss://", "redis+sentinel://", "redis+cluster://", "redlock:redis://",
			"etcd://", "zk://", "postgres://", "mysql://", "memory://", "--conflict-exit-code", "--grace", "DISTLOCK_TOKEN",
			"Exit status of run", "Exit status of status", "--limit N", "--shared", "--exclusive", "--json", "HOST:PID",
			"-n ", "-w, --wait", "-E, --conflict-exit-code", "-s, --shared", "-x, --exclusive", "-c, --shell", "--label",
			"--prefix", "--table", "--version", "at least 500ms", "--elect", "--value V", "DISTLOCK_TERM", "DISTLOCK_ELECTION"} {
			if !strings.Contains(out, want) {
				t.Errorf("distlock %q: the help does not say %q", args, want)
			}
		}
		for _, code := range []int{exitFree, exitUsage, exitUnavailable, exitNotAcquired, exitLost, exitCannotRun, exitNotFound} {
			if !strings.Contains(out, fmt.Sprintf("\n  %d  ", code)) {
				t.Errorf("distlock %q: the help does not list exit status %d", args, code)
			}
		}
	}
}
