package testserver

import (
	"context"
	"database/sql"
	"strings"
	"testing"

	_ "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
)

func TestPostgresSelect1(t *testing.T) {
	s := Postgres(t)
	if !strings.HasPrefix(s.DSN, "postgres://") {
		t.Fatalf("DSN = %q; want a postgres:// URL", s.DSN)
	}
	ctx := t.Context()
	conn, err := pgx.Connect(ctx, s.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var one int
	var db string
	if err := conn.QueryRow(ctx, "SELECT 1, current_database()").Scan(&one, &db); err != nil {
		t.Fatal(err)
	}
	if one != 1 || !strings.HasPrefix(db, "t_testpostgresselect1_") {
		t.Fatalf("SELECT 1, current_database() = %d, %q; want 1 and a fresh database", one, db)
	}
	if _, err := conn.Exec(ctx, "CREATE TABLE x (k text PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
}

func TestMariaDBSelect1(t *testing.T) {
	s := MariaDB(t)
	db, err := sql.Open("mysql", s.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var one int
	var name string
	if err := db.QueryRowContext(t.Context(), "SELECT 1, DATABASE()").Scan(&one, &name); err != nil {
		t.Fatal(err)
	}
	if one != 1 || !strings.HasPrefix(name, "t_testmariadbselect1_") {
		t.Fatalf("SELECT 1, DATABASE() = %d, %q; want 1 and a fresh database", one, name)
	}
	if _, err := db.ExecContext(t.Context(), "CREATE TABLE x (k VARCHAR(64) PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
}
