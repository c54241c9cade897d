package etcd

import "strings"

// encodeKey maps a user key to one path segment: bytes outside
// [A-Za-z0-9-._~] become %XX (upper-case hex), like a URL path segment. The
// result never contains '/', and the mapping is invertible, so the prefix
// encodeKey(k)+"/" of one key is never a prefix of another key's: "a" and
// "a/" get "a/" and "a%2F/", a NUL byte becomes %00.
func encodeKey(key string) string {
	if encodedLen(key) == len(key) {
		return key
	}
	var b strings.Builder
	b.Grow(encodedLen(key))
	writeEncoded(&b, key)
	return b.String()
}

// encodedLen is the length of encodeKey(key).
func encodedLen(key string) int {
	n := len(key)
	for i := 0; i < len(key); i++ {
		if !unreserved(key[i]) {
			n += 2
		}
	}
	return n
}

// writeEncoded writes encodeKey(key) to b.
func writeEncoded(b *strings.Builder, key string) {
	const hex = "0123456789ABCDEF"
	for i := 0; i < len(key); i++ {
		c := key[i]
		if unreserved(c) {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hex[c>>4])
		b.WriteByte(hex[c&15])
	}
}

// decodeKey is encodeKey's inverse: ok is false for a string that
// encodeKey does not make (a byte it would escape, an escape of a byte it
// would not, lower-case hex).
func decodeKey(enc string) (key string, ok bool) {
	if strings.IndexByte(enc, '%') < 0 {
		for i := 0; i < len(enc); i++ {
			if !unreserved(enc[i]) {
				return "", false
			}
		}
		return enc, true
	}
	b := make([]byte, 0, len(enc))
	for i := 0; i < len(enc); i++ {
		c := enc[i]
		if c != '%' {
			if !unreserved(c) {
				return "", false
			}
			b = append(b, c)
			continue
		}
		if i+2 >= len(enc) {
			return "", false
		}
		hi, lo := unhex(enc[i+1]), unhex(enc[i+2])
		if hi < 0 || lo < 0 {
			return "", false
		}
		c = byte(hi<<4 | lo)
		if unreserved(c) {
			return "", false
		}
		b = append(b, c)
		i += 2
	}
	return string(b), true
}

// unhex is the value of an upper-case hex digit, or -1.
func unhex(c byte) int {
	switch {
	case '0' <= c && c <= '9':
		return int(c - '0')
	case 'A' <= c && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}

func unreserved(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
		c == '-' || c == '.' || c == '_' || c == '~'
}
