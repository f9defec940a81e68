// Package config is the one configuration layer of tandem's binaries (the
// coordinator, both workers and bench): settings that are at once a flag
// (pflag), an environment variable TANDEM_<PROCESS>_<KEY> and a key of a
// strict config file, resolved flag > environment > file > default; the
// byte-size grammar; and the logger every binary builds from its
// log.level and log.format.
//
// A setting's key is lower case, dotted where a file nests it
// (nats.url: `nats: {url: ...}` in YAML). Its flag replaces the dots and
// underscores with dashes (--nats-url, --memory-budget); its environment
// variable upper-cases the process and the key and replaces dots and
// dashes with underscores (TANDEM_PREFILL_WORKER_MEMORY_BUDGET).
package config

import (
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"github.com/spf13/viper"
)

// Setting is one configuration key: its default (whose type is the flag's:
// string, int, int64, float64, bool, time.Duration or []string) and what
// it means.
type Setting struct {
	Key     string
	Default any
	Help    string
	// Old is a former spelling of the key. Its flag still works, as a
	// deprecated alias that names the new one; in a file it is refused
	// with the new name.
	Old string
	// Bytes marks a string setting that holds a byte size: Load refuses a
	// value outside the grammar, naming the key, before anything starts.
	Bytes bool
	// Repeat makes a []string flag take each occurrence as one value,
	// commas included (--prompt 1,2,3 --prompt 4); otherwise it is split
	// at commas.
	Repeat bool
}

// FlagName is key's flag: dots and underscores become dashes.
func FlagName(key string) string {
	return strings.NewReplacer(".", "-", "_", "-").Replace(key)
}

// EnvName is key's environment variable for process, e.g.
// EnvName("prefill-worker", "memory_budget") is
// TANDEM_PREFILL_WORKER_MEMORY_BUDGET.
func EnvName(process, key string) string {
	return envPrefix(process) + "_" + strings.ToUpper(strings.NewReplacer(".", "_", "-", "_").Replace(key))
}

func envPrefix(process string) string {
	return "TANDEM_" + strings.ToUpper(strings.NewReplacer(".", "_", "-", "_").Replace(process))
}

// Help is what --help says about where settings come from, for process.
func Help(process string) string {
	return wrap(fmt.Sprintf("Configuration: each setting is a flag, an environment variable and a key of "+
		"the --config file (YAML, JSON or TOML by its extension; dotted keys nest: nats: {url: ...}). "+
		"A flag wins over the environment, the environment over the file, the file over the default. "+
		"The environment variables are %s_<KEY>, the key upper-cased with dots and dashes as underscores: "+
		"--nats-url is %s. A file's unknown key is an error that names the nearest valid one.",
		envPrefix(process), EnvName(process, "nats.url")), 76) + "\n\n" + BytesHelp()
}

// BytesHelp is the byte-size grammar as a --help paragraph.
func BytesHelp() string { return wrap("Byte sizes: "+BytesGrammar+".", 76) }

// wrap breaks text into lines of at most width bytes at spaces.
func wrap(text string, width int) string {
	var b strings.Builder
	n := 0
	for i, w := range strings.Fields(text) {
		if i > 0 && n+1+len(w) > width {
			b.WriteByte('\n')
			n = 0
		} else if i > 0 {
			b.WriteByte(' ')
			n++
		}
		b.WriteString(w)
		n += len(w)
	}
	return b.String()
}

// AddFlags defines a flag for each setting, and a deprecated alias for
// each former spelling.
func AddFlags(fs *pflag.FlagSet, sets ...[]Setting) {
	for _, ss := range sets {
		for _, s := range ss {
			name := FlagName(s.Key)
			switch d := s.Default.(type) {
			case string:
				fs.String(name, d, s.Help)
			case int:
				fs.Int(name, d, s.Help)
			case int64:
				fs.Int64(name, d, s.Help)
			case float64:
				fs.Float64(name, d, s.Help)
			case bool:
				fs.Bool(name, d, s.Help)
			case time.Duration:
				fs.Duration(name, d, s.Help)
			case []string:
				if s.Repeat {
					fs.StringArray(name, d, s.Help)
				} else {
					fs.StringSlice(name, d, s.Help)
				}
			default:
				panic(fmt.Sprintf("config: setting %s: unsupported default %T", s.Key, d))
			}
			if s.Old != "" {
				Alias(fs, s.Old, s.Key)
			}
		}
	}
}

// Alias defines --old (a key or a flag name) as a hidden, deprecated
// spelling of the flag of key: given, it sets that flag as if it were
// given itself, and prints to stderr that it is deprecated, naming the new
// flag (stderr even under cobra, which prints pflag's own notices to a
// command's standard output). Where both are given, the later one on the
// command line wins.
func Alias(fs *pflag.FlagSet, old, key string) {
	cur := fs.Lookup(FlagName(key))
	name := FlagName(old)
	fs.AddFlag(&pflag.Flag{Name: name, Usage: "old spelling of --" + cur.Name, Hidden: true,
		Value: &alias{fs: fs, old: name, cur: cur}, NoOptDefVal: cur.NoOptDefVal})
}

// aliasNotices is where aliases print their notice (tests replace it).
var aliasNotices io.Writer = os.Stderr

// alias is a deprecated flag's value: it sets the flag it stands for.
type alias struct {
	fs  *pflag.FlagSet
	old string
	cur *pflag.Flag
}

func (a *alias) String() string { return a.cur.Value.String() }
func (a *alias) Type() string   { return a.cur.Value.Type() }
func (a *alias) Set(v string) error {
	fmt.Fprintf(aliasNotices, "Flag --%s has been deprecated, use --%s instead\n", a.old, a.cur.Name)
	return a.fs.Set(a.cur.Name, v)
}

// Load resolves the settings of a process whose flags fs has parsed:
// flags given on the command line, then TANDEM_<PROCESS>_<KEY>
// environment variables, then file (when not empty; strict: an unknown key
// is an error naming the nearest valid one), then the defaults.
func Load(fs *pflag.FlagSet, process, file string, sets ...[]Setting) (*viper.Viper, error) {
	v := viper.New()
	var known, sizes []string
	var renamed = map[string]string{}
	for _, ss := range sets {
		for _, s := range ss {
			if s.Bytes {
				sizes = append(sizes, s.Key)
			}
			v.SetDefault(s.Key, s.Default)
			known = append(known, s.Key)
			if s.Old != "" {
				renamed[s.Old] = s.Key
			}
			if f := fs.Lookup(FlagName(s.Key)); f != nil {
				if err := v.BindPFlag(s.Key, f); err != nil {
					return nil, err
				}
			}
		}
	}
	v.SetEnvPrefix(envPrefix(process))
	v.SetEnvKeyReplacer(strings.NewReplacer(".", "_", "-", "_"))
	v.AutomaticEnv()
	if file != "" {
		fv, err := readFile(file, known, renamed)
		if err != nil {
			return nil, err
		}
		if err := v.MergeConfigMap(fv.AllSettings()); err != nil {
			return nil, fmt.Errorf("config %s: %w", file, err)
		}
	}
	for _, k := range sizes {
		if _, err := ParseBytes(v.GetString(k)); err != nil {
			return nil, fmt.Errorf("%s (--%s): %w", k, FlagName(k), err)
		}
	}
	return v, nil
}

// ReadFile reads a config file (YAML, JSON or TOML, by its extension)
// whose keys must all be among known: an unknown key is an error that
// names it, the file and the nearest known key.
func ReadFile(path string, known []string) (*viper.Viper, error) {
	return readFile(path, known, nil)
}

func readFile(path string, known []string, renamed map[string]string) (*viper.Viper, error) {
	v := viper.New()
	v.SetConfigFile(path)
	if err := v.ReadInConfig(); err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	if err := checkKeys("config "+path, v.AllKeys(), known, renamed); err != nil {
		return nil, err
	}
	return v, nil
}

// CheckKeys returns an error, prefixed with where, for the first of got
// (in sorted order) not in known, with the nearest known key.
func CheckKeys(where string, got, known []string) error {
	return checkKeys(where, got, known, nil)
}

func checkKeys(where string, got, known []string, renamed map[string]string) error {
	got = slices.Clone(got)
	sort.Strings(got)
	for _, k := range got {
		k = strings.ToLower(k)
		if slices.Contains(known, k) {
			continue
		}
		if n, ok := renamed[k]; ok {
			return fmt.Errorf("%s: key %q was renamed %q", where, k, n)
		}
		if n := Nearest(k, known); n != "" {
			return fmt.Errorf("%s: unknown key %q (did you mean %s?)", where, k, n)
		}
		return fmt.Errorf("%s: unknown key %q (valid keys: %s)", where, k, strings.Join(sorted(known), ", "))
	}
	return nil
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	sort.Strings(s)
	return s
}

// Nearest is the key of known closest to key by edit distance, or "" when
// none is close enough to be a likely typo (more than a third of key's
// length, at least 2, away).
func Nearest(key string, known []string) string {
	best, bestD := "", max(2, len(key)/3)+1
	for _, k := range sorted(known) {
		if d := distance(key, k); d < bestD {
			best, bestD = k, d
		}
	}
	return best
}

// distance is the Levenshtein distance between a and b, in bytes.
func distance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// ParseArgs parses args into fs for a command that has flags but no
// config file (bench's subcommands): flags given, then for the others
// TANDEM_<PROCESS>_<FLAG> environment variables, then the defaults.
// --help prints fs.Usage to stdout and returns pflag.ErrHelp; a parse
// error is returned (not printed), with a pointer to --help.
func ParseArgs(fs *pflag.FlagSet, process string, args []string, stdout, stderr io.Writer) error {
	var buf strings.Builder
	fs.SetOutput(&buf)
	err := fs.Parse(args)
	fs.SetOutput(stderr)
	switch {
	case errors.Is(err, pflag.ErrHelp):
		io.WriteString(stdout, buf.String())
		return err
	case err != nil:
		return fmt.Errorf("%w (see --help)", err)
	}
	var envErr error
	fs.VisitAll(func(f *pflag.Flag) {
		if _, isAlias := f.Value.(*alias); f.Changed || isAlias || envErr != nil {
			return
		}
		name := EnvName(process, f.Name)
		if val, ok := os.LookupEnv(name); ok && val != "" {
			if err := fs.Set(f.Name, val); err != nil {
				envErr = fmt.Errorf("%s: %w", name, err)
			}
		}
	})
	return envErr
}
