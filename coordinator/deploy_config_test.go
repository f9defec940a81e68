package main

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/tandem-inference/tandem/internal/testmodel"
)

// TestShippedClusterConfigStarts runs `coordinator serve --config
// configs/cluster.yaml`, as docs/DEPLOY.md says, as a process of its own.
// Only what names this machine is given on the command line: the model
// directory, the credentials and data directories, and the ports (each
// listener keeps the host the file gives it, so the checks on addresses
// beyond loopback apply as shipped). The file once did not start: its
// metrics listened on 0.0.0.0 without a token.
func TestShippedClusterConfigStarts(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a coordinator process")
	}
	const file = "../configs/cluster.yaml"
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var shipped struct {
		Metrics struct{ Listen string }
		HTTP    struct{ Listen string }
	}
	if err := yaml.Unmarshal(b, &shipped); err != nil {
		t.Fatal(err)
	}
	// hostOf is the host of a shipped address ("" : the default's).
	hostOf := func(addr, def string) string {
		if addr == "" {
			addr = def
		}
		h, _, err := net.SplitHostPort(addr)
		if err != nil {
			t.Fatalf("%q: %v", addr, err)
		}
		return h
	}
	metricsAddr := net.JoinHostPort(hostOf(shipped.Metrics.Listen, "127.0.0.1:9464"), "0")
	httpAddr := net.JoinHostPort(hostOf(shipped.HTTP.Listen, "127.0.0.1:8000"), "0")
	dir := testmodel.Dir(t, "tiny", 1, 2)
	c := startChild(t, "coordinator serving", "serve", "--config", file, "--model", dir,
		"--embedded-credentials-dir", t.TempDir(), "--embedded-data-dir", t.TempDir(),
		"--embedded-port", fmt.Sprint(freePort(t)), "--metrics-listen", metricsAddr, "--http-listen", httpAddr)

	// Its metrics endpoint answers where the file put it.
	var url string
	for _, line := range strings.Split(c.log.String(), "\n") {
		if i := strings.Index(line, `"url":"http://`); i >= 0 && strings.Contains(line, "metrics") {
			url = strings.SplitN(line[i+len(`"url":"`):], `"`, 2)[0]
		}
	}
	if url == "" {
		t.Fatalf("no metrics address in the log:\n%s", c.log.String())
	}
	resp, err := http.Get(strings.TrimSuffix(url, "/metrics") + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/readyz: %d", resp.StatusCode)
	}
}
