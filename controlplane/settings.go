package controlplane

import (
	"time"

	"github.com/tandem-inference/tandem/internal/config"
)

// Setting is one configuration key of a tandem binary (package
// internal/config resolves them: flags, TANDEM_* environment variables
// and a config file).
type Setting = config.Setting

// ClientSettings are the keys of a NATS client connection, the same in the
// coordinator and both workers.
var ClientSettings = []Setting{
	{Key: "nats.url", Default: "", Help: "NATS server URL(s), comma-separated"},
	{Key: "nats.credentials", Default: "", Help: "tandem identity file (JSON: principal, name, user, password), as `coordinator credentials` writes; default: this machine's own in <user config dir>/tandem/nats when no other credentials are given"},
	{Key: "nats.user", Default: "", Help: "NATS user (with nats.password)"},
	{Key: "nats.password", Default: "", Help: "NATS password"},
	{Key: "nats.token", Default: "", Help: "NATS token"},
	{Key: "nats.nkey_seed_file", Default: "", Help: "file with this client's nkey seed"},
	{Key: "nats.creds_file", Default: "", Help: "NATS credentials file (JWT + nkey seed, operator mode)"},
	{Key: "nats.tls.ca", Default: "", Help: "CA file that verifies the NATS server (turns TLS on)"},
	{Key: "nats.tls.cert", Default: "", Help: "client certificate file for NATS TLS"},
	{Key: "nats.tls.key", Default: "", Help: "client key file for NATS TLS"},
	{Key: "nats.connect_timeout", Default: 5 * time.Second, Help: "bound on connecting to NATS"},
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
