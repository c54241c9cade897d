package testserver

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Postgres and MariaDB speak to their servers through database/sql with
// the drivers named "pgx" and "mysql", which this package does not import:
// it imports only the standard library, so that the modules whose tests
// import it (every store's) need no SQL driver. A test binary that starts
// them registers the drivers, as sqldb's tests do:
//
//	import (
//		_ "github.com/go-sql-driver/mysql"
//		_ "github.com/jackc/pgx/v5/stdlib"
//	)
const (
	postgresDriver = "pgx"
	mariadbDriver  = "mysql"
)

// needDriver fails t, naming the import that fixes it, when the
// database/sql driver name is not registered.
func needDriver(t testing.TB, name, importPath string) {
	t.Helper()
	if !slices.Contains(sql.Drivers(), name) {
		t.Fatalf("testserver: no database/sql driver %q is registered: the test binary must import _ %q", name, importPath)
	}
}

var postgresKind = kind{
	name:    "postgres",
	envVar:  "DISTLOCK_TEST_POSTGRES",
	binary:  "PostgreSQL's initdb and postgres (on PATH or in /usr/lib/postgresql/*/bin)",
	install: "apt-get install postgresql",
	image:   "postgres:16",
}

var mariadbKind = kind{
	name:    "mariadb",
	envVar:  "DISTLOCK_TEST_MARIADB",
	binary:  "mariadbd and mariadb-install-db",
	install: "apt-get install mariadb-server",
	image:   "mariadb:11",
}

// PostgresServer is a PostgreSQL database for one test. Stop (fast
// shutdown), Kill, Pause, Resume and Restart control a server the test
// started; the data survives a restart.
type PostgresServer struct {
	// DSN is a postgres:// URL of a fresh database that belongs to the test.
	DSN string

	node
}

// Postgres starts a PostgreSQL server for t (initdb and postgres in a temp
// dir, as the postgres user when the test runs as root), creates a fresh
// database on it and stops it when t ends.
//
// DISTLOCK_TEST_POSTGRES set to a postgres:// URL of a running server makes
// it create the fresh database there instead, dropped when t ends.
func Postgres(t testing.TB) *PostgresServer {
	t.Helper()
	needDriver(t, postgresDriver, "github.com/jackc/pgx/v5/stdlib")
	binDir := postgresBinDir()
	src, env := postgresKind.choose(t, binDir != "")
	var admin string
	s := &PostgresServer{node: node{t: t, envVar: postgresKind.envVar}}
	switch src {
	case sourceEnv:
		admin = env
	case sourceDocker:
		addr := dockerRun(t, postgresKind, 5432, []string{"POSTGRES_HOST_AUTH_METHOD=trust"})
		admin = "postgres://postgres@" + addr + "/postgres?sslmode=disable"
		if err := pollReady(func() error { return postgresPing(admin) }); err != nil {
			t.Fatalf("testserver: postgres in docker: %v", err)
		}
	default:
		s.proc, admin = startPostgres(t, binDir)
		s.ready = func() error { return postgresPing(admin) }
	}
	name := databaseName(t)
	if err := sqlExec(postgresDriver, admin, 30*time.Second, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("testserver: postgres: create database: %v", err)
	}
	if src != sourceBinary {
		t.Cleanup(func() {
			if err := sqlExec(postgresDriver, admin, 30*time.Second, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
				t.Errorf("testserver: postgres: drop database %s: %v", name, err)
			}
		})
	}
	u, err := url.Parse(admin)
	if err != nil {
		t.Fatalf("testserver: postgres: %s: %v", postgresKind.envVar, err)
	}
	u.Path = "/" + name
	s.DSN = u.String()
	return s
}

// postgresBinDir finds the directory holding initdb and postgres: PATH
// first, then Debian's /usr/lib/postgresql/<version>/bin, newest version.
func postgresBinDir() string {
	if p, err := exec.LookPath("initdb"); err == nil {
		dir := filepath.Dir(p)
		if _, err := os.Stat(filepath.Join(dir, "postgres")); err == nil {
			return dir
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	slices.SortFunc(dirs, func(a, b string) int { return pgVersion(b) - pgVersion(a) })
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "postgres")); err != nil {
			continue
		}
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d
		}
	}
	return ""
}

func pgVersion(binDir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return v
}

// startPostgres runs initdb and postgres; it returns the process and the
// URL of its postgres database.
func startPostgres(t testing.TB, binDir string) (*process, string) {
	t.Helper()
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	logPath := filepath.Join(dir, "postgres.log")
	cred := postgresCredential(t, dir)
	if err := os.Mkdir(data, 0o700); err != nil {
		t.Fatalf("testserver: %v", err)
	}
	if cred != nil {
		if err := os.Chown(data, int(cred.Uid), int(cred.Gid)); err != nil {
			t.Fatalf("testserver: %v", err)
		}
	}
	initdb := newProcess(t, "initdb", logPath, filepath.Join(binDir, "initdb"),
		"-D", data, "-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8", "--locale=C")
	initdb.dir, initdb.cred = dir, cred
	if err := initdb.run(); err != nil {
		t.Fatalf("testserver: %v; log:\n%s", err, initdb.tail())
	}
	build := func(port int) *process {
		p := newProcess(t, "postgres "+hostPort(port), logPath, filepath.Join(binDir, "postgres"),
			"-D", data,
			"-p", strconv.Itoa(port),
			"-c", "listen_addresses=127.0.0.1",
			"-c", "unix_socket_directories=",
			// No fsync: fast, and a killed server still recovers what
			// was committed (the kernel has it); only a machine crash
			// would lose it.
			"-c", "fsync=off",
			"-c", "full_page_writes=off",
			// Room for sqldb's 12-process test, whose connections its
			// own count bounds (240): a burst past the server's limit
			// would fail attempts with "too many clients" first.
			"-c", "max_connections=300",
			// Segments in the data dir, not /dev/shm: a killed server
			// leaves nothing outside its temp dir.
			"-c", "dynamic_shared_memory_type=mmap",
			"-c", "shared_buffers=32MB",
		)
		p.dir, p.cred = dir, cred
		// SIGINT is PostgreSQL's fast shutdown: it does not wait for
		// clients to disconnect as SIGTERM (smart shutdown) does.
		p.stopSig = syscall.SIGINT
		p.afterCleanup = func() { removeSysVSegment(data) }
		return p
	}
	var admin string
	p, _ := startOnFreePort(t, build, func(_ *process, port int) error {
		admin = "postgres://postgres@" + hostPort(port) + "/postgres?sslmode=disable"
		return postgresPing(admin)
	})
	return p, admin
}

// postgresCredential returns the postgres user's credential when the test
// runs as root (PostgreSQL refuses to run as root) and opens dir and its
// parents up to the temp root for that user to traverse. It returns nil
// when the test is not root.
func postgresCredential(t testing.TB, dir string) *syscall.Credential {
	t.Helper()
	if os.Geteuid() != 0 {
		return nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		unavailable(t, inCI(), "PostgreSQL refuses to run as root and there is no postgres user: %v (apt-get install postgresql creates it)", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	allowTraverse(t, dir)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), NoSetGroups: true}
}

// allowTraverse adds search (x) permission for others to dir and to each of
// its parents below the system temp dir, which t.TempDir makes 0700.
func allowTraverse(t testing.TB, dir string) {
	t.Helper()
	root := filepath.Clean(os.TempDir())
	for d := filepath.Clean(dir); strings.HasPrefix(d, root+string(filepath.Separator)); d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			t.Fatalf("testserver: %v", err)
		}
		if err := os.Chmod(d, fi.Mode().Perm()|0o011); err != nil {
			t.Fatalf("testserver: %v", err)
		}
	}
}

// removeSysVSegment removes the small System V shared memory segment of a
// server that was killed and never started again: postmaster.pid, left
// behind by a server that did not shut down, names it on its 7th line
// ("key id"). A cleanly stopped server has removed both.
func removeSysVSegment(data string) {
	b, err := os.ReadFile(filepath.Join(data, "postmaster.pid"))
	if err != nil {
		return
	}
	lines := strings.Split(string(b), "\n")
	if len(lines) < 7 {
		return
	}
	f := strings.Fields(lines[6])
	if len(f) != 2 {
		return
	}
	id, err := strconv.Atoi(f[1])
	if err != nil {
		return
	}
	const ipcRMID = 0
	_, _, _ = syscall.Syscall(syscall.SYS_SHMCTL, uintptr(id), ipcRMID, 0)
}

func postgresPing(dsn string) error { return sqlExec(postgresDriver, dsn, 5*time.Second, "SELECT 1") }

// MariaDBServer is a MariaDB database for one test. Stop, Kill, Pause,
// Resume and Restart control a server the test started; the data survives
// a restart.
type MariaDBServer struct {
	// DSN is a go-sql-driver/mysql DSN, user:pass@tcp(127.0.0.1:port)/db,
	// of a fresh database that belongs to the test.
	DSN string

	node
}

// MariaDB starts a MariaDB server for t (mariadb-install-db and mariadbd
// in a temp dir), creates a fresh database on it and stops it when t ends.
//
// DISTLOCK_TEST_MARIADB set to a go-sql-driver DSN of a running server
// (user:pass@tcp(host:port)/) makes it create the fresh database there
// instead, dropped when t ends.
func MariaDB(t testing.TB) *MariaDBServer {
	t.Helper()
	needDriver(t, mariadbDriver, "github.com/go-sql-driver/mysql")
	mariadbd, err1 := lookPathOr("mariadbd", "/usr/sbin/mariadbd")
	installDB, err2 := lookPathOr("mariadb-install-db", "/usr/bin/mariadb-install-db")
	src, env := mariadbKind.choose(t, err1 == nil && err2 == nil)
	var admin string
	s := &MariaDBServer{node: node{t: t, envVar: mariadbKind.envVar}}
	switch src {
	case sourceEnv:
		admin = env
	case sourceDocker:
		addr := dockerRun(t, mariadbKind, 3306, []string{"MARIADB_ALLOW_EMPTY_ROOT_PASSWORD=1"})
		admin = "root@tcp(" + addr + ")/"
		if err := pollReady(func() error { return mariadbPing(admin) }); err != nil {
			t.Fatalf("testserver: mariadb in docker: %v", err)
		}
	default:
		s.proc, admin = startMariaDB(t, mariadbd, installDB)
		s.ready = func() error { return mariadbPing(admin) }
	}
	name := databaseName(t)
	dsn, err := mysqlWithDB(admin, name)
	if err != nil {
		t.Fatalf("testserver: mariadb: %s: %v", mariadbKind.envVar, err)
	}
	if err := mariadbExec(admin, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("testserver: mariadb: create database: %v", err)
	}
	if src != sourceBinary {
		t.Cleanup(func() {
			if err := mariadbExec(admin, "DROP DATABASE IF EXISTS "+name); err != nil {
				t.Errorf("testserver: mariadb: drop database %s: %v", name, err)
			}
		})
	}
	s.DSN = dsn
	return s
}

func lookPathOr(name, fallback string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	// sbin is not on every user's PATH.
	if _, err := os.Stat(fallback); err != nil {
		return "", err
	}
	return fallback, nil
}

// startMariaDB runs mariadb-install-db and mariadbd; it returns the process
// and a DSN for its root user without a database.
func startMariaDB(t testing.TB, mariadbd, installDB string) (*process, string) {
	t.Helper()
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	logPath := filepath.Join(dir, "mariadb.log")
	sock := filepath.Join(dir, "mariadb.sock")
	if len(sock) > 100 { // sun_path holds 108 bytes
		short, err := os.MkdirTemp("", "mdb")
		if err != nil {
			t.Fatalf("testserver: %v", err)
		}
		t.Cleanup(func() { os.RemoveAll(short) })
		sock = filepath.Join(short, "s")
	}
	// A temporary directory of its own: a MariaDB server deletes every
	// "#sql*" file in its tmpdir when it starts, so servers sharing /tmp
	// delete each other's internal temporary tables (a running one then
	// fails a statement with "Error on delete of '/tmp/#sql-temptable-...
	// .MAI'", or dies), which tests starting servers side by side do.
	tmp := filepath.Join(dir, "tmp")
	if err := os.Mkdir(tmp, 0o755); err != nil {
		t.Fatalf("testserver: %v", err)
	}
	userArgs := []string{"--tmpdir=" + tmp}
	if os.Geteuid() == 0 {
		userArgs = append(userArgs, "--user=root")
	}
	tuning := []string{
		"--innodb-buffer-pool-size=32M",
		"--innodb-log-file-size=16M",
		"--innodb-flush-log-at-trx-commit=2", // written at commit: survives Kill

		"--innodb-doublewrite=0",
		"--skip-name-resolve",
		"--performance-schema=OFF",
	}
	args := append([]string{installDB, "--no-defaults", "--datadir=" + data,
		"--auth-root-authentication-method=normal", "--skip-test-db"}, userArgs...)
	install := newProcess(t, "mariadb-install-db", logPath, append(args, tuning...)...)
	install.dir = dir
	if err := install.run(); err != nil {
		t.Fatalf("testserver: %v; log:\n%s", err, install.tail())
	}
	build := func(port int) *process {
		args := append([]string{mariadbd, "--no-defaults",
			"--datadir=" + data,
			"--port=" + strconv.Itoa(port),
			"--bind-address=127.0.0.1",
			"--socket=" + sock,
			"--pid-file=" + filepath.Join(dir, "mariadb.pid"),
			"--max-connections=200",
			"--skip-log-bin",
		}, userArgs...)
		p := newProcess(t, "mariadbd "+hostPort(port), logPath, append(args, tuning...)...)
		p.dir = dir
		return p
	}
	var admin string
	p, _ := startOnFreePort(t, build, func(_ *process, port int) error {
		admin = "root@tcp(" + hostPort(port) + ")/"
		return mariadbPing(admin)
	})
	return p, admin
}

func mariadbPing(dsn string) error { return mariadbExec(dsn, "SELECT 1") }

func mariadbExec(dsn, query string) error { return sqlExec(mariadbDriver, dsn, 10*time.Second, query) }

// sqlExec runs query on a connection of its own to dsn, within timeout.
func sqlExec(driver, dsn string, timeout time.Duration, query string) error {
	db, err := sql.Open(driver, dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	_, err = db.ExecContext(ctx, query)
	return err
}

// mysqlWithDB returns the go-sql-driver/mysql DSN
// [user[:password]@][net[(addr)]]/[dbname][?params] with dbname set to db.
// The driver takes the last '/' as the start of the database name, and so
// does this.
func mysqlWithDB(dsn, db string) (string, error) {
	i := strings.LastIndexByte(dsn, '/')
	if i < 0 {
		return "", fmt.Errorf("DSN %q has no '/' before the database name", dsn)
	}
	params := ""
	if j := strings.IndexByte(dsn[i:], '?'); j >= 0 {
		params = dsn[i+j:]
	}
	return dsn[:i+1] + db + params, nil
}

// databaseName makes a fresh database name from the test's name: lower
// case letters, digits and underscores, with a random suffix.
func databaseName(t testing.TB) string {
	var b strings.Builder
	b.WriteString("t_")
	for _, r := range strings.ToLower(t.Name()) {
		if b.Len() >= 40 {
			break
		}
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	return fmt.Sprintf("%s_%s", b.String(), hex.EncodeToString(rnd[:]))
}

// pollReady polls ready until it succeeds or startTimeout passes.
func pollReady(ready func() error) error {
	deadline := time.Now().Add(startTimeout)
	for {
		err := ready()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(100 * time.Millisecond) // polling with a deadline
	}
}
