//go:build unix

package main

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/go-zookeeper/zk"
	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/logging"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/etcd"
	"github.com/distlock/distlock/redis"
	"github.com/distlock/distlock/redlock"
	"github.com/distlock/distlock/sqldb"
	"github.com/distlock/distlock/zookeeper"
)

// store is a parsed --store URL. parseStore and validateKey do no I/O;
// open connects.
type store interface {
	// validateKey checks key against the store's own rules, with no I/O.
	validateKey(key string) error
	// open connects to the store within ctx and returns the backend and
	// a function that closes its clients, to call after the backend's
	// Close (distlock's Close calls it). The TTL is the locks'.
	open(ctx context.Context, ttl time.Duration) (backend.RemoteResource, func(), error)
	// String is the URL with any password hidden.
	String() string
	// proto is the store's backend as open would make it, or one over a
	// client that never connects, for checks with no I/O: the kinds of
	// lock it holds and whether it can inspect them (see supports).
	proto() backend.RemoteResource
	// holds says, for -v, what keeps a lock of TTL ttl taken through the
	// backend open made: the TTL and its renewal, or a session.
	holds(ttl time.Duration) string
}

// storeOptions are the flags that name where a store keeps its locks,
// so that a job and a Go program configured alike share them.
type storeOptions struct {
	prefix    string // --prefix: Redis, Redlock and etcd key prefix
	prefixSet bool
	table     string // --table: PostgreSQL and MySQL table
	tableSet  bool
}

// check refuses the options a store of scheme does not take: prefix and
// table say whether it takes each.
func (o storeOptions) check(scheme string, prefix, table bool) error {
	switch {
	case o.prefixSet && !prefix && scheme == "zk":
		return errors.New("--prefix: a ZooKeeper URL names the root as its path: zk://HOST:PORT/ROOT")
	case o.prefixSet && !prefix:
		return fmt.Errorf("--prefix: the %s store keeps no key prefix; --table names a SQL store's table", scheme)
	case o.tableSet && !table:
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

// supports reports, with no I/O, whether s holds locks of kind and, with
// inspect, whether it can tell who holds them: nil, or an error that says
// why not. The facade checks the same before I/O (ErrUnsupported); asking
// first keeps distlock from connecting at all.
func supports(s store, kind backend.Kind, inspect bool) error {
	res := s.proto()
	if kind != backend.KindMutex && kind != backend.KindElection { // an election is a mutex to the store
		kc, ok := res.(backend.KindChecker)
		if !ok {
			return fmt.Errorf("store %s holds mutexes only, not a %s (distlock.ErrUnsupported)", s, kindName(kind))
		}
		if err := kc.CheckKind(kind); err != nil {
			return fmt.Errorf("store %s cannot hold a %s: %w", s, kindName(kind), err)
		}
	}
	if _, ok := res.(backend.Inspector); inspect && !ok {
		return fmt.Errorf("store %s cannot tell who holds a lock (distlock.ErrUnsupported)", s)
	}
	return nil
}

// kindName names a kind of lock for messages: "mutex", "semaphore", and
// "read/write lock" for both sides of a read/write lock.
func kindName(kind backend.Kind) string {
	if kind == backend.KindRead || kind == backend.KindWrite {
		return "read/write lock"
	}
	return kind.String()
}

// defaultDialTimeout bounds connecting to etcd and ZooKeeper unless the
// URL's dial_timeout says otherwise (go-redis, pgx and the MySQL driver
// have their own, which their URL options set).
const defaultDialTimeout = 5 * time.Second

// parseStore parses a --store URL, with the options o. Every error is the
// user's: a bad URL, an unknown scheme, an option the store's client
// refuses or the store does not take.
func parseStore(raw string, o storeOptions) (store, error) {
	scheme, _, ok := strings.Cut(raw, ":")
	if !ok || scheme == "" {
		return nil, fmt.Errorf("store URL %q has no scheme: want redis://, etcd://, zk://, postgres://, mysql://, ... (see distlock --help)", raw)
	}
	var s store
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
			s, err = parseZooKeeper(raw)
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
			ue.URL = redact(ue.URL)
		}
		return nil, fmt.Errorf("store %s: %w", redact(raw), err)
	}
	return s, nil
}

// redact hides the password of a URL for messages, also in a URL that
// net/url cannot parse (a host list, a MySQL DSN).
func redact(raw string) string {
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

// redisStore is one Redis deployment: a server, a Sentinel group's master
// or a Cluster. Its client is made at parse time: go-redis connects only
// on the first command.
type redisStore struct {
	name   string
	client goredis.UniversalClient
	res    *redis.Resource
	ping   time.Duration // bounds the PING of open: dial plus read timeout
}

// parseRedis parses a redis:// or rediss:// URL with the go-redis parser
// for kind: "" (one server), "sentinel" or "cluster".
func parseRedis(raw, kind string, so storeOptions) (*redisStore, error) {
	// ContextTimeoutEnabled: the facade's bounds (the wait, the
	// validity a renewal must land in) become the requests' deadlines.
	// DialerRetries 1 (unless the URL sets it): a refused connection is
	// reported as one at once, within one attempt's bound, not after
	// go-redis's 1.7s of dials (see the redis package doc). NewClient
	// and its kin fill in the default timeouts.
	var c goredis.UniversalClient
	var dial, read time.Duration
	switch kind {
	case "":
		o, err := goredis.ParseURL(raw)
		if err != nil {
			return nil, err
		}
		o.ContextTimeoutEnabled = true
		o.DialerRetries = cmp.Or(o.DialerRetries, 1)
		c = goredis.NewClient(o)
		dial, read = o.DialTimeout, o.ReadTimeout
	case "sentinel":
		o, err := goredis.ParseFailoverURL(raw)
		if err != nil {
			return nil, err
		}
		if o.MasterName == "" {
			return nil, errors.New("a Sentinel URL needs ?master_name=NAME")
		}
		o.ContextTimeoutEnabled = true
		o.DialerRetries = cmp.Or(o.DialerRetries, 1)
		c = goredis.NewFailoverClient(o)
		dial, read = o.DialTimeout, o.ReadTimeout
	case "cluster":
		o, err := goredis.ParseClusterURL(raw)
		if err != nil {
			return nil, err
		}
		o.ContextTimeoutEnabled = true
		o.DialerRetries = cmp.Or(o.DialerRetries, 1)
		c = goredis.NewClusterClient(o)
		dial, read = o.DialTimeout, o.ReadTimeout
	}
	ping := max(dial, 0) + max(read, 0)
	if ping <= 0 {
		ping = 2 * defaultDialTimeout
	}
	name := redact(raw)
	if kind != "" {
		scheme, rest, _ := strings.Cut(name, ":")
		name = scheme + "+" + kind + ":" + rest
	}
	var opts []redis.Option
	if so.prefixSet {
		opts = append(opts, redis.WithPrefix(so.prefix))
	}
	res, err := redis.New(c, opts...)
	if err != nil {
		_ = c.Close()
		return nil, err
	}
	return &redisStore{name: name, client: c, res: res, ping: ping}, nil
}

func (s *redisStore) String() string { return s.name }

func (s *redisStore) holds(ttl time.Duration) string { return spinHolds(ttl) }

func (s *redisStore) validateKey(key string) error { return s.res.ValidateKey(key) }

func (s *redisStore) proto() backend.RemoteResource { return s.res }

func (s *redisStore) open(ctx context.Context, _ time.Duration) (backend.RemoteResource, func(), error) {
	closeAll := func() { s.client.Close() }
	// A PING, so that an unreachable server is reported now, whatever the
	// wait (go-redis bounds it by its dial and read timeouts).
	ctx, cancel := context.WithTimeout(ctx, s.ping)
	defer cancel()
	if err := s.client.Ping(ctx).Err(); err != nil {
		s.res.Close()
		closeAll()
		return nil, nil, err
	}
	return s.res, closeAll, nil
}

// redlockStore is Redlock over independent Redis servers.
type redlockStore struct {
	name    string
	clients []goredis.UniversalClient
	res     *redlock.Resource
}

// parseRedlock parses the comma-separated Redis URLs after "redlock:".
func parseRedlock(list string, so storeOptions) (*redlockStore, error) {
	if !strings.HasPrefix(list, "redis") {
		return nil, errors.New("want redlock:redis://HOST1:PORT,redis://HOST2:PORT,redis://HOST3:PORT")
	}
	s := &redlockStore{}
	var names []string
	for _, raw := range strings.Split(list, ",") {
		o, err := goredis.ParseURL(raw)
		if err != nil {
			s.close()
			return nil, fmt.Errorf("node %q: %w", redact(raw), err)
		}
		o.ContextTimeoutEnabled = true               // per-node timeouts, as redlock's doc asks
		o.DialerRetries = cmp.Or(o.DialerRetries, 1) // a refused node is reported as one (redlock's doc)
		s.clients = append(s.clients, goredis.NewClient(o))
		names = append(names, redact(raw))
	}
	var opts []redlock.Option
	if so.prefixSet {
		opts = append(opts, redlock.WithPrefix(so.prefix))
	}
	res, err := redlock.New(s.clients, opts...)
	if err != nil {
		s.close()
		return nil, err
	}
	s.res, s.name = res, "redlock:"+strings.Join(names, ",")
	return s, nil
}

// close closes the Resource and the clients, when open is never called.
func (s *redlockStore) close() {
	if s.res != nil {
		s.res.Close()
	}
	s.closeClients()
}

func (s *redlockStore) closeClients() {
	for _, c := range s.clients {
		c.Close()
	}
}

func (s *redlockStore) String() string { return s.name }

func (s *redlockStore) holds(ttl time.Duration) string {
	return spinHolds(ttl) + ", on a majority of the nodes"
}

func (s *redlockStore) validateKey(key string) error { return s.res.ValidateKey(key) }

func (s *redlockStore) proto() backend.RemoteResource { return s.res }

func (s *redlockStore) open(context.Context, time.Duration) (backend.RemoteResource, func(), error) {
	return s.res, s.closeClients, nil
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
	d, err := parseDuration(v)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("option %s=%q: want a positive duration", name, v)
	}
	return d, nil
}

// etcdStore is an etcd cluster.
type etcdStore struct {
	name string
	cfg  clientv3.Config
	opts []etcd.Option
}

func parseEtcd(raw string, so storeOptions) (*etcdStore, error) {
	h, err := parseHostList(raw, 2379, "dial_timeout")
	if err != nil {
		return nil, err
	}
	if p := strings.Trim(h.path, "/"); p != "" {
		return nil, fmt.Errorf("unexpected path %q: an etcd URL names hosts only (--prefix sets the keys' prefix)", h.path)
	}
	dial, err := h.duration("dial_timeout", defaultDialTimeout)
	if err != nil {
		return nil, err
	}
	cfg := clientv3.Config{DialTimeout: dial, Logger: zap.NewNop()}
	for _, host := range h.hosts {
		cfg.Endpoints = append(cfg.Endpoints, "http://"+host)
	}
	if h.user != nil {
		cfg.Username = h.user.Username()
		cfg.Password, _ = h.user.Password()
	}
	s := &etcdStore{name: h.name, cfg: cfg}
	if so.prefixSet {
		s.opts = append(s.opts, etcd.WithPrefix(so.prefix))
	}
	return s, nil
}

func (s *etcdStore) String() string { return s.name }

// validateKey asks the etcd store's own ValidateKey, on a Resource over a
// client that was never connected: it checks the key's length only.
func (s *etcdStore) validateKey(key string) error { return etcdProto().ValidateKey(key) }

// proto is a Resource over a client that was never connected.
func (s *etcdStore) proto() backend.RemoteResource { return etcdProto() }

// etcdProto is a Resource over a client that was never connected (New
// fails only for a nil client or option).
func etcdProto() *etcd.Resource {
	r, _ := etcd.New(new(clientv3.Client))
	return r
}

// holds: distlock renews its locks (WithAutoRenew), which etcd keeps on
// a lease shared by the locks of one TTL and kept alive by the client.
func (s *etcdStore) holds(ttl time.Duration) string {
	secs := (ttl + time.Second - 1) / time.Second * time.Second
	return fmt.Sprintf("TTL %v (etcd leases count whole seconds): a lease the client keeps alive every third of it", secs)
}

func (s *etcdStore) open(ctx context.Context, _ time.Duration) (backend.RemoteResource, func(), error) {
	c, err := clientv3.New(s.cfg)
	if err != nil {
		return nil, nil, err
	}
	// The client connects on its first request: make one that needs a
	// quorum (a linearizable read of nothing), so that an unreachable
	// cluster is reported now, whatever the wait. It waits for a
	// connection (WaitForReady), so that gRPC's error says why none came
	// (a refused connection, say), not only that the time ran out.
	bound := within(ctx, s.cfg.DialTimeout)
	pctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	req := &pb.RangeRequest{Key: []byte(etcd.DefaultPrefix), CountOnly: true}
	if _, err := clientv3.RetryKVClient(c).Range(pctx, req, grpc.WaitForReady(true)); err != nil {
		c.Close()
		return nil, nil, fmt.Errorf("reading from %s within %v: %w", strings.Join(s.cfg.Endpoints, ","), bound, err)
	}
	res, err := etcd.New(c, s.opts...)
	if err != nil {
		c.Close()
		return nil, nil, err
	}
	return res, func() { c.Close() }, nil
}

// zkStore is a ZooKeeper ensemble.
type zkStore struct {
	name    string
	servers []string
	opts    []zookeeper.Option
	session time.Duration // 0: the TTL
	dial    time.Duration
	granted time.Duration // the session timeout the server granted, once open
}

func parseZooKeeper(raw string) (*zkStore, error) {
	h, err := parseHostList(raw, 2181, "session_timeout", "dial_timeout")
	if err != nil {
		return nil, err
	}
	if h.user != nil {
		return nil, errors.New("ZooKeeper credentials in the URL are not supported")
	}
	s := &zkStore{name: h.name, servers: h.hosts}
	if s.session, err = h.duration("session_timeout", 0); err != nil {
		return nil, err
	}
	if s.dial, err = h.duration("dial_timeout", defaultDialTimeout); err != nil {
		return nil, err
	}
	if root := strings.TrimSuffix(h.path, "/"); root != "" {
		s.opts = append(s.opts, zookeeper.WithRoot(root))
	}
	if _, err := s.protoRes(); err != nil { // a bad root
		return nil, err
	}
	return s, nil
}

// protoRes is a Resource over a connection that was never opened.
func (s *zkStore) protoRes() (*zookeeper.Resource, error) {
	return zookeeper.New(new(zk.Conn), s.opts...)
}

func (s *zkStore) String() string { return s.name }

// validateKey asks the ZooKeeper store's own ValidateKey, on a Resource
// over a connection that was never opened: it checks the key and the root.
func (s *zkStore) validateKey(key string) error {
	r, err := s.protoRes()
	if err != nil {
		return err
	}
	return r.ValidateKey(key)
}

// proto is a Resource over a connection that was never opened (parseZooKeeper
// checked that New takes the options).
func (s *zkStore) proto() backend.RemoteResource {
	r, _ := s.protoRes()
	return r
}

// holds: on ZooKeeper a lock distlock renews lives as long as the
// session, whose timeout the server keeps within its bounds (by default
// 4s to 40s) whatever was asked.
func (s *zkStore) holds(ttl time.Duration) string {
	asked := cmp.Or(s.session, ttl)
	if s.granted == 0 {
		return fmt.Sprintf("as long as the session, asked to time out after %v", asked)
	}
	return fmt.Sprintf("as long as the session, which times out %v after the server last heard from distlock (asked: %v; the server keeps it within its bounds)", s.granted, asked)
}

func (s *zkStore) open(ctx context.Context, ttl time.Duration) (backend.RemoteResource, func(), error) {
	session := cmp.Or(s.session, ttl)
	// go-zookeeper tells only its log why it cannot connect, and what
	// session timeout the server granted: listen to it.
	zl := &zkLog{session: make(chan time.Duration, 1)}
	conn, events, err := zk.Connect(s.servers, session, zk.WithLogger(zl))
	if err != nil {
		return nil, nil, err
	}
	go func() {
		for range events { // the resource watches the connection itself
		}
	}()
	// The resource needs a session: wait for one, within the dial timeout.
	bound := within(ctx, s.dial)
	ctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	select {
	case s.granted = <-zl.session:
	case <-ctx.Done():
		conn.Close()
		if last := zl.lastError(); last != "" {
			return nil, nil, fmt.Errorf("no session with %s within %v: %s", strings.Join(s.servers, ","), bound, last)
		}
		return nil, nil, fmt.Errorf("no session with %s within %v: %w", strings.Join(s.servers, ","), bound, context.Cause(ctx))
	}
	res, err := zookeeper.New(conn, s.opts...)
	if err != nil {
		conn.Close()
		return nil, nil, err
	}
	return res, conn.Close, nil
}

// zkLog is go-zookeeper's logger: it keeps the last failure to connect,
// and sends the session timeout the server granted on session.
type zkLog struct {
	mu      sync.Mutex
	last    string
	session chan time.Duration // buffered 1
}

func (l *zkLog) Printf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	switch {
	case strings.HasPrefix(format, "authenticated:"):
		var id int64
		var ms int32
		if _, err := fmt.Sscanf(msg, "authenticated: id=%d, timeout=%d", &id, &ms); err == nil {
			select {
			case l.session <- time.Duration(ms) * time.Millisecond:
			default: // a later session: the first one is what open waits for
			}
		}
	case strings.HasPrefix(format, "failed to connect"):
		l.mu.Lock()
		l.last = msg
		l.mu.Unlock()
	}
}

func (l *zkLog) lastError() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.last
}

// postgresStore is a PostgreSQL database.
type postgresStore struct {
	name string
	cfg  *pgxpool.Config
	opts []sqldb.Option
}

func parsePostgres(raw string, so storeOptions) (*postgresStore, error) {
	cfg, err := pgxpool.ParseConfig(raw)
	if err != nil {
		return nil, err
	}
	return &postgresStore{name: redact(raw), cfg: cfg, opts: so.sqlOptions()}, nil
}

// sqlOptions is --table as the SQL stores' option.
func (o storeOptions) sqlOptions() []sqldb.Option {
	if !o.tableSet {
		return nil
	}
	return []sqldb.Option{sqldb.WithTable(o.table)}
}

func (s *postgresStore) String() string { return s.name }

func (s *postgresStore) holds(ttl time.Duration) string { return spinHolds(ttl) }

// validateKey asks the PostgreSQL store's own ValidateKey, which reads
// nothing of the store.
func (s *postgresStore) validateKey(key string) error { return new(sqldb.Postgres).ValidateKey(key) }

// proto is a zero Postgres: it answers CheckKind without its database.
func (s *postgresStore) proto() backend.RemoteResource { return new(sqldb.Postgres) }

func (s *postgresStore) open(ctx context.Context, _ time.Duration) (backend.RemoteResource, func(), error) {
	pool, err := pgxpool.NewWithConfig(ctx, s.cfg)
	if err != nil {
		return nil, nil, err
	}
	res, err := sqldb.NewPostgres(ctx, pool, s.opts...)
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return res, pool.Close, nil
}

// mysqlStore is a MySQL or MariaDB database.
type mysqlStore struct {
	name string
	cfg  *mysql.Config
	opts []sqldb.Option
}

// parseMySQL parses mysql://USER:PASSWORD@HOST:PORT/DB?PARAMS, or the
// driver's DSN after mysql:// (it has a "(": tcp(HOST:PORT)).
func parseMySQL(raw, scheme string, so storeOptions) (*mysqlStore, error) {
	rest := raw[len(scheme)+1:]
	if !strings.HasPrefix(rest, "//") {
		return nil, errors.New("want mysql://USER:PASSWORD@HOST:PORT/DB")
	}
	rest = rest[2:]
	var cfg *mysql.Config
	if strings.Contains(rest, "(") {
		c, err := mysql.ParseDSN(rest)
		if err != nil {
			return nil, err
		}
		cfg = c
	} else {
		u, err := url.Parse(raw)
		if err != nil {
			return nil, err
		}
		// The driver parses the parameters; the URL gives the rest.
		c, err := mysql.ParseDSN("/?" + u.RawQuery)
		if err != nil {
			return nil, err
		}
		cfg = c
		if u.User != nil {
			cfg.User = u.User.Username()
			cfg.Passwd, _ = u.User.Password()
		}
		if u.Host == "" {
			return nil, errors.New("no host: want mysql://USER:PASSWORD@HOST:PORT/DB")
		}
		cfg.Net, cfg.Addr = "tcp", u.Host
		if u.Port() == "" {
			cfg.Addr = net.JoinHostPort(u.Hostname(), "3306")
		}
		cfg.DBName = strings.TrimPrefix(u.Path, "/")
	}
	if cfg.DBName == "" || strings.Contains(cfg.DBName, "/") {
		return nil, errors.New("name one database: mysql://USER:PASSWORD@HOST:PORT/DB (the lock table lives there)")
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = defaultDialTimeout
	}
	shown := *cfg
	if shown.Passwd != "" {
		shown.Passwd = "xxxxx"
	}
	return &mysqlStore{name: scheme + "://" + shown.FormatDSN(), cfg: cfg, opts: so.sqlOptions()}, nil
}

func (s *mysqlStore) String() string { return s.name }

func (s *mysqlStore) holds(ttl time.Duration) string { return spinHolds(ttl) }

// validateKey asks the MySQL store's own ValidateKey, which reads nothing
// of the store.
func (s *mysqlStore) validateKey(key string) error { return new(sqldb.MySQL).ValidateKey(key) }

// proto is a zero MySQL: it answers CheckKind without its database.
func (s *mysqlStore) proto() backend.RemoteResource { return new(sqldb.MySQL) }

func (s *mysqlStore) open(ctx context.Context, _ time.Duration) (backend.RemoteResource, func(), error) {
	conn, err := mysql.NewConnector(s.cfg)
	if err != nil {
		return nil, nil, err
	}
	db := sql.OpenDB(conn)
	res, err := sqldb.NewMySQL(ctx, db, s.opts...)
	if err != nil {
		db.Close()
		return nil, nil, err
	}
	return res, func() { db.Close() }, nil
}

func init() {
	// The clients log failed dials and broken connections on stderr;
	// distlock reports the errors that matter itself.
	_ = mysql.SetLogger(log.New(io.Discard, "", 0))
	goredis.SetLogger(&logging.VoidLogger{})
}
