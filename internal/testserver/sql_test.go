package testserver

import (
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	_ "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib" // Postgres reaches its server through database/sql
)

func TestMySQLWithDB(t *testing.T) {
	tests := []struct{ dsn, want string }{
		{"root@tcp(127.0.0.1:3306)/", "root@tcp(127.0.0.1:3306)/t_x"},
		{"root@tcp(127.0.0.1:3306)/old", "root@tcp(127.0.0.1:3306)/t_x"},
		{"u:p/w@tcp(h:1)/?parseTime=true", "u:p/w@tcp(h:1)/t_x?parseTime=true"},
		{"/", "/t_x"},
	}
	for _, tt := range tests {
		if got, err := mysqlWithDB(tt.dsn, "t_x"); err != nil || got != tt.want {
			t.Errorf("mysqlWithDB(%q) = %q, %v; want %q", tt.dsn, got, err, tt.want)
		}
	}
	if _, err := mysqlWithDB("root@tcp(h:1)", "t_x"); err == nil {
		t.Error("mysqlWithDB without '/': want an error")
	}
}

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

// TestMariaDBLeavesSharedTmpAlone: a MariaDB server started by the tests
// does not delete other servers' internal temporary tables. A server
// deletes every "#sql*" file in its tmpdir when it starts; with the
// shared /tmp, servers started side by side (the packages of make test)
// deleted each other's, which failed their statements ("Error on delete
// of '/tmp/#sql-temptable-....MAI'").
func TestMariaDBLeavesSharedTmpAlone(t *testing.T) {
	probe := filepath.Join(os.TempDir(), "#sql-temptable-probe-"+strconv.FormatInt(time.Now().UnixNano(), 16)+".MAI")
	if err := os.WriteFile(probe, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(probe) })
	s := MariaDB(t)
	if err := mariadbPing(s.DSN); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(probe); err != nil {
		t.Errorf("a file like another server's temporary table, %s, is gone after a server started: %v", probe, err)
	}
}

func TestPostgresRestartKeepsData(t *testing.T) {
	s := Postgres(t)
	ctx := t.Context()
	exec := func(q string) error {
		conn, err := pgx.Connect(ctx, s.DSN)
		if err != nil {
			return err
		}
		defer conn.Close(context.Background())
		_, err = conn.Exec(ctx, q)
		return err
	}
	if err := exec("CREATE TABLE x (k text PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	s.Kill()
	if err := exec("SELECT 1"); err == nil {
		t.Fatal("SELECT 1 answered after Kill")
	}
	s.Restart() // crash recovery
	if err := exec("INSERT INTO x VALUES ('a')"); err != nil {
		t.Fatalf("insert after restart: %v", err)
	}
}

func TestMariaDBRestartKeepsData(t *testing.T) {
	s := MariaDB(t)
	db, err := sql.Open("mysql", s.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := t.Context()
	if _, err := db.ExecContext(ctx, "CREATE TABLE x (k VARCHAR(64) PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, "INSERT INTO x VALUES ('a')"); err != nil {
		t.Fatal(err)
	}
	s.Kill()
	s.Restart()
	var n int
	if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM x").Scan(&n); err != nil || n != 1 {
		t.Fatalf("SELECT COUNT(*) after Kill and Restart = %d, %v; want 1", n, err)
	}
}

func TestPostgresKilledLeavesNoSharedMemory(t *testing.T) {
	id := -1
	t.Run("kill", func(t *testing.T) {
		s := Postgres(t)
		data := filepath.Join(filepath.Dir(s.proc.log), "data")
		s.Kill()
		b, err := os.ReadFile(filepath.Join(data, "postmaster.pid"))
		if err != nil {
			t.Fatalf("a killed postgres left no postmaster.pid: %v", err)
		}
		lines := strings.Split(string(b), "\n")
		if len(lines) < 7 {
			t.Fatalf("postmaster.pid has %d lines; want 7 or more", len(lines))
		}
		f := strings.Fields(lines[6])
		if len(f) != 2 {
			t.Fatalf("postmaster.pid line 7 = %q; want \"key id\"", lines[6])
		}
		if id, err = strconv.Atoi(f[1]); err != nil {
			t.Fatal(err)
		}
		if !sysVSegmentExists(id) {
			t.Fatalf("segment %d named by postmaster.pid does not exist", id)
		}
	})
	if id >= 0 && sysVSegmentExists(id) {
		t.Fatalf("shared memory segment %d of the killed postgres is left behind", id)
	}
}

func sysVSegmentExists(id int) bool {
	var buf [512]byte // larger than struct shmid_ds
	const ipcStat = 2
	_, _, errno := syscall.Syscall(syscall.SYS_SHMCTL, uintptr(id), ipcStat, uintptr(unsafe.Pointer(&buf[0])))
	return errno == 0
}
