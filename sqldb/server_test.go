package sqldb

import (
	"testing"

	"github.com/distlock/distlock/internal/testserver"
)

// postgresDSN starts PostgreSQL for t (or uses DISTLOCK_TEST_POSTGRES) and
// returns the DSN of a fresh database.
func postgresDSN(t testing.TB) string { return testserver.Postgres(t).DSN }

// mariadbDSN starts MariaDB for t (or uses DISTLOCK_TEST_MARIADB) and
// returns the go-sql-driver DSN of a fresh database.
func mariadbDSN(t testing.TB) string { return testserver.MariaDB(t).DSN }
