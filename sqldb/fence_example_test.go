package sqldb_test

import (
	"context"
	"errors"
	"log"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/fence"
	"github.com/distlock/distlock/sqldb"
)

// A write fenced inside its pgx transaction: the lock's token must not be
// below one the invoice has seen, or the UPDATE does not commit. (Compiled,
// not run: it needs a server.)
func ExamplePostgresFence() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app@db.internal/app")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	invoices, err := sqldb.NewPostgresFence(fence.DefaultTable)
	if err != nil {
		log.Fatal(err)
	}
	if err := invoices.CreateTable(ctx, pool); err != nil {
		log.Fatal(err)
	}
	res, err := sqldb.NewPostgres(ctx, pool)
	if err != nil {
		log.Fatal(err)
	}
	d, err := distlock.New(res)
	if err != nil {
		log.Fatal(err)
	}
	defer d.Close()

	err = d.Do(ctx, "invoice:42", time.Second, func(ctx context.Context, lk *distlock.Lock) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if err := invoices.Check(ctx, tx, "invoice:42", lk.Token()); err != nil {
				return err // BeginFunc rolls back
			}
			_, err := tx.Exec(ctx, "UPDATE invoices SET total = total + 10 WHERE id = 42")
			return err
		})
	})
	if errors.Is(err, fence.ErrStale) {
		log.Print("a newer holder wrote invoice 42: this write was dropped")
	}
}
