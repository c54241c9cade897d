//go:build unix

package main

import "github.com/distlock/distlock/internal/stores"

const shortUsage = `usage: distlock run [flags] KEY -- COMMAND [ARGS...]
       distlock run [flags] -c COMMAND-STRING KEY
       distlock run [flags] KEY
       distlock run --elect [--value V] [flags] NAME [-- COMMAND [ARGS...]]
       distlock status [flags] KEY
Run 'distlock --help' for the flags, the store URLs and the exit statuses.
`

// usage is the help text. Its exit statuses are the constants in main.go,
// and the README repeats them: change the three together.
const usage = `distlock runs a command while holding a distributed lock, on Redis,
Redlock, etcd, ZooKeeper, PostgreSQL or MySQL/MariaDB.

Usage:
  distlock run [flags] KEY -- COMMAND [ARGS...]
  distlock run [flags] -c COMMAND-STRING KEY
  distlock run [flags] KEY
  distlock run --elect [--value V] [flags] NAME [-- COMMAND [ARGS...]]
  distlock status [flags] KEY
  distlock status --elect [--json] NAME
  distlock help
  distlock --version

distlock run acquires the lock KEY, runs COMMAND while holding it,
renewing it every third of its TTL, releases it when COMMAND exits and
exits with COMMAND's status. COMMAND gets in its environment:
  DISTLOCK_KEY    KEY
  DISTLOCK_TOKEN  the fencing token: larger for every new holder of KEY on
                  the store (0 on Redlock, which has none). Have the
                  resource you protect refuse a token lower than one it has
                  seen: a holder that lost the lock cannot then do harm.
COMMAND runs in a process group of its own. SIGINT, SIGTERM, SIGHUP,
SIGQUIT, SIGUSR1 and SIGUSR2 sent to distlock are passed to that group
(from a terminal, COMMAND gets the foreground: ^C reaches it directly);
once COMMAND has exited they are ignored while distlock releases KEY
(within 10s, even when the store stopped answering).
If the lock is lost while COMMAND runs (a renewal found it gone, or the
store did not answer until its TTL ran out), the group gets SIGTERM at
once, and SIGKILL after --grace or as soon as COMMAND exits, and distlock
exits with 79. The store may hand KEY to another holder from the end of
the TTL on: fence with DISTLOCK_TOKEN. If distlock itself is killed, COMMAND
gets SIGKILL (on Linux; its own children do not) and KEY is freed when
its TTL runs out.
COMMAND comes after --: one KEY, then --, then COMMAND and its ARGS.
With -c, COMMAND-STRING runs through $SHELL -c (/bin/sh if SHELL is not
set), as flock -c does. Without a COMMAND, distlock holds KEY, renewing
it, until SIGINT, SIGTERM, SIGHUP or SIGQUIT (as etcdctl lock does without
one): it prints DISTLOCK_KEY=KEY and DISTLOCK_TOKEN=T on stdout once it
holds KEY, and releases KEY and exits 0 on the signal.

Flags of run:
  --store URL        the store (default: $DISTLOCK_STORE); the forms are below
  --prefix PREFIX    the prefix of the store's keys (Redis, Redlock, etcd),
                     as WithPrefix in Go: a job and a program with the same
                     prefix share their locks (default: the Go default,
                     "distlock:" on Redis, "/distlock/" on etcd); ZooKeeper
                     takes its root as the URL's path
  --table TABLE      the lock table (PostgreSQL, MySQL), [SCHEMA.]TABLE, as
                     WithTable in Go (default distlock_locks)
  -w, --wait DURATION
                     how long to wait for KEY while another owner holds it
                     (default: until acquired or interrupted); 0 makes one
                     attempt: connecting and the attempt are bounded by a
                     second each
  -n                 one attempt: --wait 0, like flock -n
  --ttl DURATION     the lock's lease: how long the store keeps KEY for a
                     holder that stopped renewing it, after a crash, a
                     kill -9 or a partition (default 10s, at least 500ms:
                     it is renewed every third of it, and a renewal must
                     come back well within that)
  --grace DURATION   after the lock is lost, how long COMMAND has between
                     SIGTERM and SIGKILL (default 5s)
  -E, --conflict-exit-code N
                     the exit status when KEY stayed held for the whole wait,
                     0 to 255 (default 75), like flock -E
  --limit N          a semaphore: at most N runs hold KEY at once, like
                     consul lock -n; every run of KEY must give the same N
  -s, --shared       the read side of the read/write lock KEY: runs with
                     --shared hold it together, like flock -s
  -x, --exclusive    the write side of the read/write lock KEY: excludes
                     --shared and other --exclusive runs, like flock -x; a
                     waiting --exclusive run keeps later --shared runs out
  --elect            campaign in the election KEY (the leader election of
                     distlock.Election in Go) and run COMMAND while leader:
                     one run at a time, as a singleton service under a
                     supervisor; COMMAND also gets DISTLOCK_ELECTION (KEY)
                     and DISTLOCK_TERM (the term: its DISTLOCK_TOKEN, larger
                     for every new leader); without COMMAND, distlock leads
                     until a signal. --wait bounds the campaign (0 and -n
                     are refused: a campaign waits)
  --value V          with --elect: the value the leader publishes (an
                     address, a name), which status --elect shows
  -c, --shell COMMAND-STRING
                     run COMMAND-STRING through the shell instead of a
                     COMMAND after --
  --label TEXT       the label stored with the grant, which status shows
                     (default HOST:PID, distlock's; at most 256 bytes)
  -v, --verbose      say on stderr when distlock waits, acquires (with the
                     token and what keeps the lock: its TTL, or on ZooKeeper
                     the session timeout the server granted), renews, loses
                     and releases KEY
DURATION is a number of seconds (1.5) or a Go duration (1m30s, 250ms).
A plain run (no --limit, --shared or --exclusive) takes the mutex KEY: the
lock distlock.TryLock takes in Go, so programs and jobs can share it.
--limit, --shared, --exclusive and --elect exclude each other; the mutex,
the semaphore, the read/write lock and the election of one KEY are four
distinct locks (as DistributeLock.Semaphore, RWMutex and Election in Go):
-x does not exclude a plain run. Redlock holds mutexes only (majorities cannot bound a semaphore).

distlock status [--store URL] [--prefix P | --table T] [--json]
                [--limit N | -s, --shared | -x, --exclusive] KEY
prints whether the lock KEY is held, and for each holder its label, kind,
fencing token and time left by the store's clock; it takes nothing and
writes nothing. Without a kind flag it reads the mutex KEY; --limit N
(any N: the output shows the holders' limit) the semaphore KEY; --shared or
--exclusive the read/write lock KEY, readers and writers. --json prints
one line:
  {"store": URL, "key": KEY, "kind": "mutex"|"semaphore"|"rwlock",
   "held": BOOL, "limit": N (a held semaphore's),
   "holders": [{"label": L, "kind": "mutex"|"semaphore"|"read"|"write",
                "token": T, "ttl_ms": MS (null if unknown)}]}
Every store inspects every kind it holds; Redlock mutexes only (token 0).
status --elect [--json] NAME prints the leader of the election NAME: its
label (HOST:PID of the distlock run that leads, or its --label), published
value, term and time left; --json prints one line:
  {"store": URL, "election": NAME, "led": BOOL, "label": L, "value": V,
   "term": T, "ttl_ms": MS (null if unknown)}

Store URLs (--store, or the environment variable DISTLOCK_STORE):
` + stores.URLHelp + `The in-process memory store (memory://) cannot lock across processes, so
distlock refuses it. A password in a URL is visible in the process list:
prefer DISTLOCK_STORE.

Exit status of run:
  COMMAND's   COMMAND ran, holding the lock until it exited; 128+N if a
              signal N ended it
  2           bad usage, flag, key, store URL, --prefix or --table, or a
              kind of lock the store cannot hold (--limit on Redlock):
              nothing was sent to the store; or --limit N differs from the
              limit the semaphore's holders took it with (the store said
              so; nothing was written)
  69          the store could not be reached or failed before COMMAND started
  75          KEY stayed held by another owner for the whole wait, or
              another candidate led for the whole --wait of --elect
              (--conflict-exit-code changes it)
  79          the lock was lost while COMMAND ran (or while distlock held
              it without one); COMMAND was stopped
  126         COMMAND could not be started
  127         COMMAND was not found
  128+N       distlock got signal N while it waited for KEY

Exit status of status:
  0           KEY is held (--elect: the election has a leader)
  1           KEY is free (--elect: no leader)
  2           bad usage, flag, key, store URL, --prefix or --table, or the
              store cannot tell who holds a lock of that kind (semaphores
              and read/write locks on Redlock): nothing was sent to the
              store
  69          the store could not be reached or failed
`
