// Package stores opens a lock store from a URL, for the repository's
// tools: the distlock command, the fault suite's harness, the bench and
// the examples. It is no part of the library (the root package and the
// stores' modules never import it). Its URL syntax is the command's:
// [URLHelp] lists the forms, as `distlock --help` shows them.
//
// [Parse] reads a URL with no I/O; [Store.Open] connects. Adding a store
// means one case in Parse, a type of its own here and its lines in
// URLHelp: see "Adding a store" in the backend package's doc.
package stores

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"
	"github.com/jackc/pgx/v5"
	goredis "github.com/redis/go-redis/v9"

	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/etcd"
	"github.com/distlock/distlock/redis"
	"github.com/distlock/distlock/redlock"
	"github.com/distlock/distlock/sqldb"
	"github.com/distlock/distlock/zookeeper"
)

// URLHelp lists the URL forms Parse takes, one or more lines each, for a
// command's help text (the distlock command's --help).
const URLHelp = `  redis://[USER:PASSWORD@]HOST:PORT[/DB][?OPTION=VALUE...]
  rediss://...                 one Redis server, rediss over TLS; the
                               options are go-redis's (ParseURL), such as
                               dial_timeout=3s, read_timeout=1s
  redis+sentinel://[USER:PASSWORD@]HOST:PORT[/DB]?master_name=NAME[&addr=HOST2:PORT...]
                               the master a Sentinel group names (go-redis
                               ParseFailoverURL: USER:PASSWORD are the
                               Sentinels'; password=... the master's)
  redis+cluster://[USER:PASSWORD@]HOST:PORT[?addr=HOST2:PORT...]
                               a Redis Cluster (go-redis ParseClusterURL)
  rediss+sentinel://..., rediss+cluster://...   the same over TLS
  redlock:redis://HOST1:PORT,redis://HOST2:PORT,redis://HOST3:PORT
                               Redlock over an odd number (3 or more) of
                               independent Redis servers, each a Redis URL
  etcd://[USER:PASSWORD@]HOST:PORT[,HOST:PORT...][?dial_timeout=5s]
                               an etcd cluster (port 2379 if none)
  zk://HOST:PORT[,HOST:PORT...][/ROOT][?session_timeout=D&dial_timeout=D]
                               a ZooKeeper ensemble (port 2181 if none);
                               locks live under ROOT (default /distlock);
                               the session timeout asked for is the TTL
                               unless session_timeout says otherwise
  postgres://... or postgresql://...
                               PostgreSQL, a pgx connection URL
  mysql://USER:PASSWORD@HOST:PORT/DB[?PARAM=VALUE...]
  mysql://USER:PASSWORD@tcp(HOST:PORT)/DB[?PARAM=VALUE...]
                               MySQL or MariaDB (also mariadb://): a URL, or
                               the go-sql-driver/mysql DSN after mysql://
`

// Store is a parsed store URL. Parse, ValidateKey, Proto, Holds and
// String do no I/O; Open connects.
type Store interface {
	// ValidateKey checks key against the store's own rules, with no I/O.
	ValidateKey(key string) error
	// Open connects to the store within ctx and returns the backend and
	// a function that closes its clients, to call after the backend's
	// Close (distlock's Close calls it). The TTL is the locks': a
	// ZooKeeper URL without session_timeout asks for a session of ttl.
	// A Store opens once: its Redis clients are made by Parse and closed
	// by the closer.
	Open(ctx context.Context, ttl time.Duration) (backend.RemoteResource, func(), error)
	// String is the URL with any password hidden.
	String() string
	// Proto is the store's backend as Open would make it, or one over a
	// client that never connects, for checks with no I/O: the kinds of
	// lock it holds and whether it can inspect them.
	Proto() backend.RemoteResource
	// Holds says, for messages, what keeps a lock of TTL ttl taken
	// through the backend Open made: the TTL and its renewal, or a
	// session.
	Holds(ttl time.Duration) string
}

// Options say where a store keeps its locks, beyond its URL, and let a
// tool reach into the clients Open makes. The zero value adds nothing.
type Options struct {
	// Prefix is the key prefix of a Redis, Redlock or etcd store, when
	// PrefixSet; the other stores refuse it (the command's --prefix).
	Prefix    string
	PrefixSet bool
	// Table is the lock table of a PostgreSQL or MySQL store, when
	// TableSet; the other stores refuse it (the command's --table).
	Table    string
	TableSet bool

	// Redis, Redlock, Etcd, ZooKeeper and SQL are given to the store's
	// constructor after the options the URL, Prefix and Table make; each
	// is ignored by the other stores.
	Redis     []redis.Option
	Redlock   []redlock.Option
	Etcd      []etcd.Option
	ZooKeeper []zookeeper.Option
	SQL       []sqldb.Option

	// RedisHook, if not nil, is added to every Redis client (Redis and
	// Redlock) when Parse makes it.
	RedisHook goredis.Hook
	// PostgresTracer, if not nil, traces every query of the PostgreSQL
	// pool Open makes.
	PostgresTracer pgx.QueryTracer
	// ZooKeeperConn, if not nil, is called with the ZooKeeper connection
	// Open made, once it has a session.
	ZooKeeperConn func(*zk.Conn)
}

// Open parses raw with o and connects within ctx: [Parse] then
// [Store.Open].
func Open(ctx context.Context, raw string, ttl time.Duration, o Options) (backend.RemoteResource, func(), error) {
	s, err := Parse(raw, o)
	if err != nil {
		return nil, nil, err
	}
	res, closeClients, err := s.Open(ctx, ttl)
	if err != nil {
		return nil, nil, fmt.Errorf("store %s: %w", s, err)
	}
	return res, closeClients, nil
}

// ParseDuration parses a number of seconds ("10", "1.5") or a Go duration
// ("1m30s", "250ms").
func ParseDuration(s string) (time.Duration, error) {
	if secs, err := strconv.ParseFloat(s, 64); err == nil {
		if math.IsNaN(secs) || math.IsInf(secs, 0) || math.Abs(secs) > float64(math.MaxInt64/int64(time.Second)) {
			return 0, fmt.Errorf("bad duration %q", s)
		}
		return time.Duration(secs * float64(time.Second)), nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("bad duration %q: want seconds (1.5) or a Go duration (1m30s)", s)
	}
	return d, nil
}

// check refuses the options a store of scheme does not take: prefix and
// table say whether it takes each.
func (o Options) check(scheme string, prefix, table bool) error {
	switch {
	case o.PrefixSet && !prefix && scheme == "zk":
		return errors.New("--prefix: a ZooKeeper URL names the root as its path: zk://HOST:PORT/ROOT")
	case o.PrefixSet && !prefix:
		return fmt.Errorf("--prefix: the %s store keeps no key prefix; --table names a SQL store's table", scheme)
	case o.TableSet && !table:
		return fmt.Errorf("--table: the %s store keeps no table; --prefix names its keys' prefix", scheme)
	}
	return nil
}

// within is d, or less when ctx ends sooner: the bound a wait of d under
// ctx has, for messages.
func within(ctx context.Context, d time.Duration) time.Duration {
	if dl, ok := ctx.Deadline(); ok {
		if left := time.Until(dl).Round(time.Millisecond); left < d {
			return max(left, 0)
		}
	}
	return d
}

// spinHolds is holds for the stores the facade renews.
func spinHolds(ttl time.Duration) string {
	return fmt.Sprintf("TTL %v, renewed every third of it", ttl)
}

// defaultDialTimeout bounds connecting to etcd and ZooKeeper unless the
// URL's dial_timeout says otherwise (go-redis, pgx and the MySQL driver
// have their own, which their URL options set).
const defaultDialTimeout = 5 * time.Second

// Parse parses a store URL, with the options o. It does no I/O but
// make the Redis clients (go-redis connects on the first command). Every error is the
// user's: a bad URL, an unknown scheme, an option the store's client
// refuses or the store does not take.
func Parse(raw string, o Options) (Store, error) {
	scheme, _, ok := strings.Cut(raw, ":")
	if !ok || scheme == "" {
		return nil, fmt.Errorf("store URL %q has no scheme: want redis://, etcd://, zk://, postgres://, mysql://, ... (see distlock --help)", raw)
	}
	var s Store
	var err error
	switch strings.ToLower(scheme) {
	case "redis", "rediss":
		if err = o.check("Redis", true, false); err == nil {
			s, err = parseRedis(raw, "", o)
		}
	case "redis+sentinel", "rediss+sentinel", "redis+cluster", "rediss+cluster":
		base, kind, _ := strings.Cut(strings.ToLower(scheme), "+")
		if err = o.check("Redis", true, false); err == nil {
			s, err = parseRedis(base+raw[len(scheme):], kind, o)
		}
	case "redlock":
		if err = o.check("Redlock", true, false); err == nil {
			s, err = parseRedlock(raw[len(scheme)+1:], o)
		}
	case "etcd":
		if err = o.check("etcd", true, false); err == nil {
			s, err = parseEtcd(raw, o)
		}
	case "zk", "zookeeper":
		if err = o.check("zk", false, false); err == nil {
			s, err = parseZooKeeper(raw, o)
		}
	case "postgres", "postgresql":
		if err = o.check("PostgreSQL", false, true); err == nil {
			s, err = parsePostgres(raw, o)
		}
	case "mysql", "mariadb":
		if err = o.check("MySQL", false, true); err == nil {
			s, err = parseMySQL(raw, scheme, o)
		}
	case "memory", "mem":
		return nil, errors.New("the memory store keeps its locks inside one process, so it cannot lock across processes: give a Redis, etcd, ZooKeeper, PostgreSQL or MySQL URL (see distlock --help)")
	default:
		return nil, fmt.Errorf("unknown store scheme %q: want redis://, rediss://, redis+sentinel://, redis+cluster://, redlock:, etcd://, zk://, postgres://, mysql:// (see distlock --help)", scheme)
	}
	if err != nil {
		// net/url's errors quote the URL, password and all.
		var ue *url.Error
		if errors.As(err, &ue) {
			ue.URL = Redact(ue.URL)
		}
		return nil, fmt.Errorf("store %s: %w", Redact(raw), err)
	}
	return s, nil
}

// Redact hides the password of a URL for messages, also in a URL that
// net/url cannot parse (a host list, a MySQL DSN).
func Redact(raw string) string {
	if u, err := url.Parse(raw); err == nil {
		if _, ok := u.User.Password(); ok {
			return u.Redacted()
		}
		return raw
	}
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return raw
	}
	at := strings.LastIndex(rest, "@")
	if at < 0 {
		return raw
	}
	user, _, hasPassword := strings.Cut(rest[:at], ":")
	if !hasPassword {
		return raw
	}
	return scheme + "://" + user + ":xxxxx" + rest[at:]
}

// hostList is a URL whose host is a comma-separated list, as etcd:// and
// zk:// take: SCHEME://[USER:PASSWORD@]HOST[:PORT][,HOST[:PORT]...][/PATH][?QUERY].
// net/url cannot parse it (it reads the port after the last colon).
type hostList struct {
	name  string // the URL with the password hidden
	user  *url.Userinfo
	hosts []string // HOST:PORT
	path  string
	query url.Values
}

// parseHostList parses raw, giving each host without a port the default.
// Query parameters other than allowed are refused.
func parseHostList(raw string, defaultPort int, allowed ...string) (*hostList, error) {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return nil, errors.New("want SCHEME://HOST:PORT[,HOST:PORT...]")
	}
	authority, tail := rest, ""
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		authority, tail = rest[:i], rest[i:]
	}
	// The path and query, parsed by net/url behind a placeholder host.
	u, err := url.Parse("x://h" + tail)
	if err != nil {
		return nil, errors.New("bad path or query")
	}
	if u.Fragment != "" {
		return nil, errors.New("unexpected #fragment")
	}
	h := &hostList{path: u.Path, query: u.Query()}
	hosts := authority
	if at := strings.LastIndex(authority, "@"); at >= 0 {
		hosts = authority[at+1:]
		ui, err := url.Parse("x://" + authority[:at+1] + "h")
		if err != nil || ui.User == nil {
			return nil, errors.New("bad USER:PASSWORD@ (percent-encode its special characters)")
		}
		h.user = ui.User
	}
	if hosts == "" {
		return nil, errors.New("no host: want SCHEME://HOST:PORT[,HOST:PORT...]")
	}
	for _, host := range strings.Split(hosts, ",") {
		if !strings.Contains(host, ":") || strings.HasSuffix(host, "]") {
			host = net.JoinHostPort(strings.Trim(host, "[]"), strconv.Itoa(defaultPort))
		}
		name, port, err := net.SplitHostPort(host)
		if err != nil {
			return nil, fmt.Errorf("host %q: %v", host, err)
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return nil, fmt.Errorf("host %q: bad port %q", host, port)
		}
		if name == "" {
			return nil, fmt.Errorf("host %q: no host name", host)
		}
		h.hosts = append(h.hosts, host)
	}
	for k := range h.query {
		ok := false
		for _, a := range allowed {
			ok = ok || k == a
		}
		if !ok {
			return nil, fmt.Errorf("unknown option %q: want %s", k, strings.Join(allowed, ", "))
		}
	}
	h.name = scheme + "://"
	if h.user != nil {
		h.name += h.user.Username()
		if _, ok := h.user.Password(); ok {
			h.name += ":xxxxx"
		}
		h.name += "@"
	}
	h.name += strings.Join(h.hosts, ",") + tail
	return h, nil
}

// duration reads the duration option name, def when absent.
func (h *hostList) duration(name string, def time.Duration) (time.Duration, error) {
	v := h.query.Get(name)
	if v == "" {
		return def, nil
	}
	d, err := ParseDuration(v)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("option %s=%q: want a positive duration", name, v)
	}
	return d, nil
}
