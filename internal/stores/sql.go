package stores

import (
	"context"
	"database/sql"
	"errors"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/sqldb"
)

// postgresStore is a PostgreSQL database.
type postgresStore struct {
	name string
	cfg  *pgxpool.Config
	opts []sqldb.Option
}

func parsePostgres(raw string, so Options) (*postgresStore, error) {
	cfg, err := pgxpool.ParseConfig(raw)
	if err != nil {
		return nil, err
	}
	if so.PostgresTracer != nil {
		cfg.ConnConfig.Tracer = so.PostgresTracer
	}
	return &postgresStore{name: Redact(raw), cfg: cfg, opts: so.sqlOptions()}, nil
}

// sqlOptions are the SQL stores' options: Table, then SQL.
func (o Options) sqlOptions() []sqldb.Option {
	var opts []sqldb.Option
	if o.TableSet {
		opts = append(opts, sqldb.WithTable(o.Table))
	}
	return append(opts, o.SQL...)
}

func (s *postgresStore) String() string { return s.name }

func (s *postgresStore) Holds(ttl time.Duration) string { return spinHolds(ttl) }

// ValidateKey asks the PostgreSQL store's own ValidateKey, which reads
// nothing of the store.
func (s *postgresStore) ValidateKey(key string) error { return new(sqldb.Postgres).ValidateKey(key) }

// Proto is a zero Postgres: it answers CheckKind without its database.
func (s *postgresStore) Proto() backend.RemoteResource { return new(sqldb.Postgres) }

func (s *postgresStore) Open(ctx context.Context, _ time.Duration) (backend.RemoteResource, func(), error) {
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
func parseMySQL(raw, scheme string, so Options) (*mysqlStore, error) {
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

func (s *mysqlStore) Holds(ttl time.Duration) string { return spinHolds(ttl) }

// ValidateKey asks the MySQL store's own ValidateKey, which reads nothing
// of the store.
func (s *mysqlStore) ValidateKey(key string) error { return new(sqldb.MySQL).ValidateKey(key) }

// Proto is a zero MySQL: it answers CheckKind without its database.
func (s *mysqlStore) Proto() backend.RemoteResource { return new(sqldb.MySQL) }

func (s *mysqlStore) Open(ctx context.Context, _ time.Duration) (backend.RemoteResource, func(), error) {
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
