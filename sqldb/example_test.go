package sqldb_test

import (
	"context"
	"database/sql"
	"log"
	"time"

	_ "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/sqldb"
)

// A lock over PostgreSQL. The pool stays the application's; Close on the
// DistributeLock stops only the LISTEN connection the backend opened.
// (Compiled, not run: it needs a server.)
func ExampleNewPostgres() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app@db.example/app")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	res, err := sqldb.NewPostgres(ctx, pool, sqldb.WithTable("app_locks"))
	if err != nil {
		log.Fatal(err) // the table could not be checked or created
	}
	d, err := distlock.New(res, distlock.WithDefaultTTL(30*time.Second), distlock.WithAutoRenew())
	if err != nil {
		log.Fatal(err)
	}
	defer d.Close()

	err = d.Do(ctx, "invoice:2026-11", 5*time.Second, func(ctx context.Context, lk *distlock.Lock) error {
		// Pass lk.Token() to whatever the lock protects, so that it can
		// refuse a stale holder's writes.
		return nil
	})
	if err != nil {
		log.Print(err)
	}
}

// A lock over MySQL or MariaDB; any DSN works (no parseTime needed).
// (Compiled, not run: it needs a server.)
func ExampleNewMySQL() {
	ctx := context.Background()
	db, err := sql.Open("mysql", "app:secret@tcp(db.example:3306)/app")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()

	res, err := sqldb.NewMySQL(ctx, db)
	if err != nil {
		log.Fatal(err)
	}
	d, err := distlock.New(res)
	if err != nil {
		log.Fatal(err)
	}
	defer d.Close() // closes the backend's prepared statements, not db

	lk, err := d.TryLock(ctx, "nightly-report", 0)
	if err != nil {
		log.Print(err) // distlock.ErrNotAcquired: another process runs it
		return
	}
	defer lk.Unlock(ctx)
}
