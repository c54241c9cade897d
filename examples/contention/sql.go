package main

import (
	"context"
	"database/sql"

	_ "github.com/go-sql-driver/mysql" // the MySQL/MariaDB driver
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/sqldb"
)

func init() {
	openers["postgres"] = func(_ context.Context, a addrs) (store, error) {
		return &postgresStore{dsn: a.postgres}, nil
	}
	openers["mysql"] = func(_ context.Context, a addrs) (store, error) {
		return &mysqlStore{dsn: a.mysql}, nil
	}
}

// postgresStore is one PostgreSQL database; each instance gets its own pool.
type postgresStore struct{ dsn string }

func (s *postgresStore) resource(ctx context.Context, notify bool) (backend.RemoteResource, func() error, error) {
	pool, err := pgxpool.New(ctx, s.dsn)
	if err != nil {
		return nil, nil, err
	}
	res, err := sqldb.NewPostgres(ctx, pool)
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	closeAll := func() error { pool.Close(); return nil }
	if !notify {
		return spinOnly{res}, closeAll, nil
	}
	return res, closeAll, nil
}

func (s *postgresStore) commands(context.Context) (map[string]uint64, error) { return nil, nil }

func (s *postgresStore) close() error { return nil }

// mysqlStore is one MySQL or MariaDB database; each instance gets its own
// connection pool.
type mysqlStore struct{ dsn string }

func (s *mysqlStore) resource(ctx context.Context, _ bool) (backend.RemoteResource, func() error, error) {
	db, err := sql.Open("mysql", s.dsn)
	if err != nil {
		return nil, nil, err
	}
	res, err := sqldb.NewMySQL(ctx, db)
	if err != nil {
		db.Close()
		return nil, nil, err
	}
	return res, db.Close, nil
}

func (s *mysqlStore) commands(context.Context) (map[string]uint64, error) { return nil, nil }

func (s *mysqlStore) close() error { return nil }
