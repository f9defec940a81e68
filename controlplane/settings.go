package controlplane

import "time"

// Setting is one configuration key of a tandem binary: its default (which
// also gives its type) and what it means. Binaries read settings through
// viper: a config file, TANDEM_* environment variables and flags.
type Setting struct {
	Key     string
	Default any
	Help    string
}

// ClientSettings are the keys of a NATS client connection, the same in the
// coordinator and both workers.
var ClientSettings = []Setting{
	{"nats.url", "", "NATS server URL(s), comma-separated"},
	{"nats.credentials", "", "tandem identity file (JSON: principal, name, user, password), as `coordinator credentials` writes; default: this machine's own in <user config dir>/tandem/nats when no other credentials are given"},
	{"nats.user", "", "NATS user (with nats.password)"},
	{"nats.password", "", "NATS password"},
	{"nats.token", "", "NATS token"},
	{"nats.nkey_seed_file", "", "file with this client's nkey seed"},
	{"nats.creds_file", "", "NATS credentials file (JWT + nkey seed, operator mode)"},
	{"nats.tls.ca", "", "CA file that verifies the NATS server (turns TLS on)"},
	{"nats.tls.cert", "", "client certificate file for NATS TLS"},
	{"nats.tls.key", "", "client key file for NATS TLS"},
	{"nats.connect_timeout", 5 * time.Second, "bound on connecting to NATS"},
}

// OptionsFromSettings builds connection Options from ClientSettings' keys,
// read with the given getters (e.g. a viper's GetString and GetDuration).
func OptionsFromSettings(str func(key string) string, dur func(key string) time.Duration) Options {
	o := Options{URL: str("nats.url"), IdentityFile: str("nats.credentials"), User: str("nats.user"), Password: str("nats.password"), Token: str("nats.token"),
		NKeySeedFile: str("nats.nkey_seed_file"), CredsFile: str("nats.creds_file"), ConnectTimeout: dur("nats.connect_timeout")}
	if ca, cert, key := str("nats.tls.ca"), str("nats.tls.cert"), str("nats.tls.key"); ca != "" || cert != "" || key != "" {
		o.TLS = &TLSFiles{CA: ca, Cert: cert, Key: key}
	}
	return o
}
