package stores

// testserver.Postgres reaches its server through database/sql: register
// pgx's driver for it in this test binary (go-sql-driver/mysql registers
// itself through this package's own import).
import _ "github.com/jackc/pgx/v5/stdlib"
